"""The engine of the simulated asynchronous methods: their state and :func:`simulate`.

:func:`simulate` builds an ``easgd.core.base.Algorithm`` from a method's pure rules
(:class:`AsyncRules`); one call of its ``step`` is one slot of the time model
(docs/guides/algorithms.md, "Simulated asynchrony"). The same rules run one event at a
time in ``easgd.asynchrony.log.replay`` and on real workers (``easgd.runtimes``).

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Algorithms 1 and 2.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from optax.tree_utils import tree_where, tree_zeros_like

from easgd.asynchrony.schedule import ExchangeSchedule, exchange_order, served_order, slot_table
from easgd.core import elastic
from easgd.core.base import Algorithm, Communication, worker_key
from easgd.core.elastic import WORKER_AXES

Params = Any


class AsyncWorker(NamedTuple):
  """Per-worker state of a simulated asynchronous method.

  Attributes:
    params: x^i.
    opt_state: the local optimizer's state.
    buffer: EAMSGD: the velocity v^i; DOWNPOUR: the accumulated update u;
      EASGD: ``()``.
    clock: int32 scalar, the worker's local step count t^i.
    model_state: the model's state (e.g. BatchNorm statistics), ``()``
      without (``easgd.core.momentum.loss_and_grad``).
  """

  params: Params
  opt_state: Any
  buffer: Any
  clock: jax.Array
  model_state: Any = ()


class AsyncShared(NamedTuple):
  """The master's state, identical on every device.

  Attributes:
    center: the center x~.
    master: method-specific master state (DOWNPOUR family: velocity or the
      running average), ``()`` for EASGD/EAMSGD.
    history: ``staleness > 0``: a ring [staleness + 1, ...] of the last centers
      (entry c mod (s + 1) holds the center after c master updates); else ``()``.
    master_clock: int32 scalar, the number of master updates (exchanges served).
    step: int32 scalar, trainer steps (slots) taken; tick = step // K.
  """

  center: Params
  master: Any
  history: Any
  master_clock: jax.Array
  step: jax.Array


def _tree_index(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


def _tree_pick(tree, i):
  """Entry ``i`` (an int32 scalar in [0, n), traced) of every leaf [n, ...] of ``tree``,
  by n - 1 selects rather than a dynamic index: the same values (nothing is
  computed), without the gather a dynamic index becomes under a vmap over
  configurations (slow on XLA:CPU)."""

  def pick(x):
    out = x[0]
    for j in range(1, x.shape[0]):
      out = jnp.where(i == j, x[j], out)
    return out

  return jax.tree.map(pick, tree)


def _gather(tree, index, num_workers, axis_name):
  """Every worker's value, [p, ...] in worker order, identical on all workers.

  One all-reduce (one ``psum`` of all the leaves: one variadic op) of a
  zero-padded buffer (exact: all other entries add zeros), in
  ``easgd.core.elastic.reduction_dtype`` (float32 for bfloat16 values): p
  times the tree's bytes in that dtype; none for a single worker.
  """
  reduce_over = elastic.reduce_axis(num_workers, axis_name)

  def pad(x):  # a select, not a scatter (slow on XLA:CPU under a vmap); the same values
    rows = jnp.arange(num_workers).reshape((num_workers,) + (1,) * x.ndim)
    return jnp.where(rows == index, x[None], jnp.zeros((), x.dtype))

  return elastic.worker_sum(jax.tree.map(pad, tree), reduce_over)


DUE_FLAG_BYTES = 4
"""Bytes of one worker's ``due`` flag in the slot's gather (int32)."""
SLOT_ALL_REDUCES = 2
"""All-reduces of one slot's program (:func:`_slot_step_fn`, p > 1): the
messages' gather and the due flags' gather (XLA keeps the two: they differ in
type; ``tests/test_mesh.py`` reads the compiled programs)."""


def _slot_communication(num_workers: int) -> Callable:
  r"""``program_communication(num_steps, param_bytes)`` of :func:`simulate`.

  Every slot (one call of the step, one global step) gathers every worker's
  message and its due flag, whether or not it is due (:func:`_gather`):

  .. math::

     N = 2\,n, \qquad B = n\,p\,(P + 4)

  (n slots, p workers, P = ``param_bytes``: the message has the parameters'
  shapes and is reduced in ``easgd.core.elastic.reduction_dtype``, checked
  when the step is traced); zero for p = 1 (no collective).
  """

  def communication(num_steps, param_bytes):
    n = int(num_steps)
    if num_workers == 1:
      return Communication(0, 0)
    return Communication(
        SLOT_ALL_REDUCES * n, n * num_workers * (int(param_bytes) + DUE_FLAG_BYTES)
    )

  return communication


MasterRule = Callable[..., tuple]
"""``rule(center, master, message, read, master_clock) -> (center, master, reply)``:
one exchange served by the master. ``read`` is the center the worker reads
before the update (stale by ``staleness``); ``reply`` is a params-like tree
sent back, or None to send the center read after the update (a fetch)."""


class AsyncRules(NamedTuple):
  """The pure rules an asynchronous method is built from (``Algorithm.async_rules``).

  :func:`simulate` runs them in one SPMD program per slot; :func:`replay` runs
  them one event at a time in the order of an exchange log; the real runtimes
  (``easgd.runtimes.threads``, ``easgd.runtimes.ray_actors``) run them on threads or Ray
  actors. All three call these same functions (none of them uses a
  collective or an axis name).

  Attributes:
    local_step: ``local_step(worker, batch, key) -> (loss, proposal, message,
      due)``: the worker's local computation at its snapshot (see
      :func:`simulate`); ``key`` is this worker's key for this local step.
    master_rule: see :data:`MasterRule`.
    finish: ``finish(worker, proposal, reply, exchanged) -> worker`` (the clock
      is not advanced); ``reply`` is zeros (center-like) without an exchange.
    init_buffer, init_opt_state: ``f(params)`` for the worker state.
    init_master: ``init_master(center)``, the master's extra state.
    center: ``center(shared) -> params``, the evaluated model.
    exchange_at: "step_start" (EASGD, EAMSGD) or "step_end" (DOWNPOUR push).
    due: the host-side schedule ``due(t) -> bool``: whether the local step at
      clock t exchanges (``easgd.core.base.every_tau_steps``); also accepts
      the traced int32 clock.
    hyperparameters: the method's own hyperparameters (without the simulated
      schedule's fields).
  """

  local_step: Callable
  master_rule: MasterRule
  finish: Callable
  init_buffer: Callable
  init_opt_state: Callable
  init_master: Callable
  center: Callable
  exchange_at: str
  due: Callable
  hyperparameters: dict


def _read_center(history, clock, s: int):
  """The center after max(clock - s, 0) master updates, from the ring ``history``."""
  return _tree_index(history, (clock + 1) % (s + 1))


def _init_fn(
    s: int, init_opt_state: Callable, init_buffer: Callable, init_master: Callable
) -> Callable:
  """``init(params, model_state=()) -> (AsyncWorker, AsyncShared)`` of :func:`simulate`.

  The center (and its ring of the last ``s + 1`` centers, staleness ``s > 0``)
  is held in ``easgd.core.elastic.reduction_dtype`` (float32 for bfloat16).
  """

  def init(params, model_state=()):
    center = elastic.to_reduction_dtype(params)  # float32 for bfloat16 params
    history = jax.tree.map(lambda x: jnp.stack([x] * (s + 1)), center) if s else ()
    return (
        AsyncWorker(
            params,
            init_opt_state(params),
            init_buffer(params),
            jnp.zeros((), jnp.int32),
            model_state,
        ),
        AsyncShared(
            center, init_master(center), history, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
        ),
    )

  return init


def _serve_fn(master_rule: MasterRule, s: int) -> Callable:
  """``serve(shared, messages, due, order) -> ((center, master, history, clock), replies)``.

  The master serves the due exchanges one at a time in ``order`` (a
  ``lax.scan``); each reads the center ``s`` updates late (the ring) and gets
  the rule's reply, or the center read after its update (a fetch); a worker
  that is not due gets zeros.
  """

  def serve(shared, messages, due, order):
    def body(carry, w):
      center, master, history, clock = carry

      def apply(_):
        before = _read_center(history, clock, s) if s else center
        new_center, new_master, reply = master_rule(
            center, master, _tree_pick(messages, w), before, clock
        )
        new_history = history
        if s:
          new_history = jax.tree.map(
              lambda h, c: h.at[(clock + 1) % (s + 1)].set(c), history, new_center
          )
        if reply is None:
          reply = _read_center(new_history, clock + 1, s) if s else new_center
        return (new_center, new_master, new_history, clock + 1), reply

      def skip(_):
        return carry, tree_zeros_like(center)

      return lax.cond(due[w], apply, skip, None)

    init = (shared.center, shared.master, shared.history, shared.master_clock)
    return lax.scan(body, init, order)

  return serve


def _slot_step_fn(
    schedule: ExchangeSchedule,
    table,
    local_step: Callable,
    finish: Callable,
    serve: Callable,
    axis_name,
) -> Callable:
  """``step(worker, shared, batch, key) -> (worker, shared, loss)``: one slot.

  The slot's active workers take ``local_step``; every worker's message and
  due flag are gathered (two all-reduces, :func:`_slot_communication`; the
  message must have the parameters' bytes in the reduction dtype, else
  ValueError when traced) and the due ones served (``serve``, :func:`_serve_fn`)
  in :func:`served_order`; each worker finishes with its own reply.
  """
  p, big_k = schedule.num_workers, schedule.slots_per_tick

  def step(worker, shared, batch, key):
    index = elastic.worker_index(axis_name)
    tick, slot = shared.step // big_k, shared.step % big_k
    active = jnp.asarray(table.active)[slot, index]
    loss, proposal, message, due = local_step(
        worker, batch, worker_key(key, shared.step, axis_name)
    )
    if elastic.reduced_bytes(message) != elastic.reduced_bytes(worker.params):
      raise ValueError(
          f"the message of {elastic.reduced_bytes(message)} bytes must have the "
          f"parameters' {elastic.reduced_bytes(worker.params)} bytes (in the reduction "
          "dtype): simulate's program_communication counts p copies of the parameters"
      )
    due = jnp.logical_and(due, active)
    messages = _gather(message, index, p, axis_name)
    all_due = _gather(due.astype(jnp.int32), index, p, axis_name) > 0
    order = served_order(exchange_order(schedule, key, tick), jnp.asarray(table.rank)[slot])
    (center, master, history, clock), replies = serve(shared, messages, all_due, order)
    reply = _tree_index(replies, jnp.argmax(order == index))
    new = finish(worker, proposal, reply, due)
    new = tree_where(active, new._replace(clock=worker.clock + 1), worker)
    return (new, AsyncShared(center, master, history, clock, shared.step + 1), loss)

  return step


def simulate(
    name: str,
    *,
    schedule: ExchangeSchedule,
    local_step: Callable,
    master_rule: MasterRule,
    finish: Callable,
    init_buffer: Callable,
    init_opt_state: Callable,
    init_master: Callable,
    center: Callable,
    communication: Callable,
    hyperparameters: dict,
    exchange_at: str = "step_start",
    axis_name=WORKER_AXES,
    due: Callable | None = None,
) -> Algorithm:
  """Builds a simulated asynchronous algorithm from its local and master rules.

  One call of ``step`` is one slot (module docstring): the workers active in
  the slot (``slot_table(speeds, exchange_at).active``) run ``local_step``;
  the due exchanges are served by ``master_rule`` in :func:`served_order`
  (time, then the tick's order); each worker applies ``finish`` with its
  reply.

  Args:
    name: the algorithm's name.
    schedule: the exchange schedule (order, speeds, staleness).
    local_step: ``local_step(worker, batch, key) -> (loss, proposal, message,
      due)``: the worker's local computation at its snapshot; ``message`` (a
      params-like tree) goes to the master when ``due`` (bool scalar): the
      snapshot for "step_start", the state after the step for "step_end".
    master_rule: see :data:`MasterRule`.
    finish: ``finish(worker, proposal, reply, exchanged) -> worker`` (without
      the clock); ``reply`` is zeros when the worker did not exchange.
    init_buffer, init_opt_state: ``f(params)`` for the worker state.
    init_master: ``init_master(center)``, the master's extra state, from the
      initial center (in ``easgd.core.elastic.reduction_dtype``: float32 for
      bfloat16 parameters, like the center, its history and the messages).
    center: ``center(shared) -> params``, the evaluated model.
    communication: ``communication(num_steps, param_bytes)``: what a real
      asynchronous run sends (the exchanges). The program's own traffic,
      every worker's message every slot, is set as the algorithm's
      ``program_communication`` (:func:`_slot_communication`).
    hyperparameters: for logs; the schedule's fields are added. Must hold
      ``tau`` (and ``push_timing`` for "step_end") for :func:`exchange_log`.
    exchange_at: "step_start" (Algorithms 1-2) or "step_end" (DOWNPOUR push):
      where in a local step the exchange happens, which decides the slot of
      each step and the serving order (:func:`slot_table`).
    axis_name: mapped axis enumerating all workers.
    due: the host-side schedule ``due(t) -> bool`` of the local step at clock
      t (the same test ``local_step`` makes on the device); given, the
      rules are exposed as ``Algorithm.async_rules`` (:class:`AsyncRules`) for
      :func:`replay` and the real runtimes. None: not exposed.

  Returns:
    An :class:`~easgd.core.base.Algorithm`; its hyperparameters gain
    ``exchange_order``, ``worker_speeds``, ``staleness``, ``slots_per_tick`` and
    ``exchange_at``.

  Raises:
    HyperparameterError: unknown ``exchange_at``.
  """
  table = slot_table(schedule.worker_speeds, exchange_at)
  init = _init_fn(schedule.staleness, init_opt_state, init_buffer, init_master)
  step = _slot_step_fn(
      schedule, table, local_step, finish, _serve_fn(master_rule, schedule.staleness), axis_name
  )

  rules = (
      None
      if due is None
      else AsyncRules(
          local_step,
          master_rule,
          finish,
          init_buffer,
          init_opt_state,
          init_master,
          center,
          exchange_at,
          due,
          dict(hyperparameters),
      )
  )
  return Algorithm(
      name=name,
      init=init,
      step=step,
      center=center,
      worker_params=lambda worker, shared: worker.params,
      communication=communication,
      hyperparameters=dict(
          hyperparameters,
          exchange_order=schedule.order,
          worker_speeds=list(schedule.worker_speeds),
          staleness=schedule.staleness,
          slots_per_tick=schedule.slots_per_tick,
          exchange_at=exchange_at,
      ),
      async_rules=rules,
      program_communication=_slot_communication(schedule.num_workers),
  )
