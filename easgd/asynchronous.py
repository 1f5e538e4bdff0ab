"""Asynchronous EASGD and EAMSGD, simulated deterministically inside SPMD code.

The paper's experiments run Algorithms 1 and 2 asynchronously: each worker has
its own clock t^i and, whenever tau divides t^i, exchanges with the center held
by a master, one worker at a time. This module reproduces that sequence of
events deterministically inside the same per-worker SPMD program as the
synchronous algorithms (``easgd.workers``: pmap over devices of vmap over
workers), so a run is reproducible per seed and identical for every layout.

What is modelled
  * Simulated time is counted in ticks. Worker i takes k_i local steps per
    tick (its speed, an integer >= 1); its m-th local step of a tick
    (m = 0 .. k_i - 1) runs from time m / k_i to (m + 1) / k_i of the tick.
    With K = max_i k_i, one tick is K slots and one call of ``Algorithm.step``
    (one trainer step, one mini-batch per worker) is one slot: slot j of a
    tick covers times j / K to (j + 1) / K. With all speeds 1, a step is a
    tick and every worker takes one local step in it.
  * Each exchange happens at the time the paper's loop reaches it (source:
    the paper's Algorithms 1-2 and the authors' DOWNPOUR loop, below):
      - EASGD / EAMSGD (``exchange_at="step_start"``): at the START of the
        local step whose clock tau divides (Algorithm 1: the exchange comes
        before the gradient). The step is computed in the slot holding its
        start, slot floor(m K / k_i), with that slot's mini-batch.
      - DOWNPOUR family (``exchange_at="step_end"``): at the END of the local
        step, after its gradient (the authors' ``optim-downpour.lua`` sends
        the accumulated update after ``opfunc``). The step is computed in the
        slot holding its end, slot ceil((m + 1) K / k_i) - 1, with that slot's
        mini-batch, so the worker's next step (which starts at that end, from
        the center it fetched) is computed in a later slot.
    In the other slots the worker is idle (its mini-batch of that slot is
    not used, its state and clock do not change).
  * In a slot, every active worker computes its local step at its own
    snapshot (a local gradient depends only on the worker's own state). Then
    the exchanges that are due are served by the master one at a time in the
    order of their times; exchanges at the same time are served in the
    tick's exchange order. Each reads the center as left by the exchanges
    before it (minus ``staleness``, below), and the master applies its update
    before serving the next worker. The served sequence is computed
    identically on every device with a ``lax.scan`` over
    :func:`served_order`, from the workers' messages gathered by one
    all-reduce. With equal speeds every exchange of a slot has the same time,
    so the tick's order alone decides.
  * Exchange order of a tick, for exchanges at the same time:
    ``"round_robin"`` (worker 0, 1, ..., p-1: with speeds 1 and tau = 1 one
    tick is p consecutive steps of the round-robin scheme of eq. (12)-(13)),
    or ``"random"`` (a fresh uniform permutation every tick, drawn from the
    run's key, so the same seed gives the same order).
  * Staleness s >= 0, counted in master updates: a worker reads the center as
    it was s master updates before the current one (clamped at the initial
    center). The master still adds the resulting difference to its CURRENT
    center, so the force stays symmetric. s = 0 reads the current center.
  * Worker speeds are fixed for the run: given as a list, or drawn once from
    a uniform distribution on {1, ..., max_speed} with the run's seed
    (:func:`draw_worker_speeds`).
  * The realised exchange sequence (slot, worker, its local clock, the
    center version it read) is a deterministic function of the schedule,
    tau, the run's key and the number of trainer steps: :func:`exchange_log`
    returns it from the same tables and helpers the device program uses, and
    :func:`write_exchange_log` writes it next to a run (JSON lines), so any
    run can be replayed by an independent reference.

What is not modelled
  * No real concurrency: nothing runs at the same time as anything else, and
    there are no network delays other than ``staleness``, no message loss,
    no variation of a worker's speed over time. An exchange takes no time.
    Wall-clock time of the simulation says nothing about an asynchronous
    cluster; use simulated time (:func:`simulated_time`, in ticks).
  * In the authors' code the EASGD worker's difference reaches the master
    while the worker computes its gradient, and a DOWNPOUR fetch may race
    with its own push ("expect inconsistent read", ``pserver.lua``). Here
    (as in the paper's Algorithm 1) the exchange is atomic: the master's
    update is applied when the exchange is served, and a DOWNPOUR fetch
    reads the center after the worker's own push.
  * Idle slots still compute the worker's gradient (it is discarded): the
    simulation costs K gradient evaluations per worker per tick. The loss
    ``step`` returns for an idle worker is its loss on the unused batch at its
    unchanged parameters. Gathering the snapshots for the master costs one
    all-reduce of p parameter copies per slot (simulation overhead, not the
    communication of the modelled method, which ``communication`` counts).
  * Gradients of one slot are evaluated in parallel on their snapshots; this
    equals the sequential order of events because a local gradient only
    depends on the worker's own state.

The same engine serves the DOWNPOUR family (``easgd.baselines``), whose
workers push an accumulated update and fetch the center after their push
(:func:`async_push`).

Array hyperparameters (``easgd.algorithms``): learning_rate, alpha/beta and
the momentum delta may be JAX arrays, taken unchecked (they may be traced);
tau and the schedule stay Python values, from which the exchange table, the
exchange log and the communication count are built on the host.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Algorithms 1 and 2, eq. (12)-(13).
  The authors' code: github.com/sixin-zh/mpiT (commit c359666),
  ``asyncsgd/optim-eamsgd.lua``, ``asyncsgd/optim-downpour.lua``,
  ``asyncsgd/pserver.lua``.
"""

from __future__ import annotations

import json
import numbers
from fractions import Fraction
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax.tree_utils import tree_where, tree_zeros_like
from jax import lax

from easgd import elastic, momentum as momentum_lib
from easgd.algorithms import (Algorithm, Communication, LossFn, local_optimizer,
                              every_tau_steps, reset_optimizer_state, worker_key)
from easgd.elastic import WORKER_AXES

Params = Any

EXCHANGE_ORDERS = ("round_robin", "random")
"""Exchange orders within a tick."""

ORDER_STREAM = 0x7FFFFFFF
"""``fold_in`` index of the exchange-order key: a step count never reaches it,
so it never coincides with the ``fold_in(key, step)`` of ``worker_key``."""


class ExchangeSchedule(NamedTuple):
  """When and in which order the workers exchange with the center.

  Attributes:
    order: "round_robin" or "random" (module docstring).
    worker_speeds: local steps per tick of each worker (integers >= 1).
    staleness: master updates by which the center a worker reads is late.
  """
  order: str
  worker_speeds: tuple[int, ...]
  staleness: int

  @property
  def num_workers(self) -> int:
    return len(self.worker_speeds)

  @property
  def slots_per_tick(self) -> int:
    """K = max_i k_i: trainer steps per tick."""
    return max(self.worker_speeds)


def _is_int(value, low) -> bool:
  return (not isinstance(value, bool) and isinstance(value, numbers.Integral)
          and value >= low)


def exchange_schedule(num_workers: int, order: str = "round_robin",
                      worker_speeds: Sequence[int] | None = None,
                      staleness: int = 0) -> ExchangeSchedule:
  """Validates and builds an :class:`ExchangeSchedule`.

  Args:
    num_workers: number of workers p, >= 1.
    order: "round_robin" (workers 0..p-1 every tick) or "random" (a fresh
      permutation per tick).
    worker_speeds: local steps per tick of each worker, p integers >= 1 (an
      integral float such as 2.0 is accepted); None = all 1.
    staleness: master updates by which the center read at an exchange is
      late, an integer >= 0.

  Returns:
    The schedule.

  Raises:
    HyperparameterError: unknown order, wrong number of speeds, a speed that
      is not an integer >= 1, or a negative staleness.
  """
  if not _is_int(num_workers, 1):
    raise elastic.HyperparameterError(
        f"num_workers must be an integer >= 1, got {num_workers!r}")
  if order not in EXCHANGE_ORDERS:
    raise elastic.HyperparameterError(
        f"unknown exchange order {order!r}; allowed: {', '.join(EXCHANGE_ORDERS)}")
  if worker_speeds is None or len(worker_speeds) == 0:
    worker_speeds = (1,) * num_workers
  if len(worker_speeds) != num_workers:
    raise elastic.HyperparameterError(
        f"worker_speeds has {len(worker_speeds)} entries, expected one per "
        f"worker (num_workers={num_workers})")
  speeds = []
  for k in worker_speeds:
    if isinstance(k, numbers.Real) and not isinstance(k, bool) and float(k).is_integer():
      k = int(k)
    if not _is_int(k, 1):
      raise elastic.HyperparameterError(
          f"worker_speeds entries are local steps per tick, integers >= 1; got {k!r}")
    speeds.append(k)
  if not _is_int(staleness, 0):
    raise elastic.HyperparameterError(
        f"staleness (in master updates) must be an integer >= 0, got {staleness!r}")
  return ExchangeSchedule(order, tuple(speeds), int(staleness))


def draw_worker_speeds(num_workers: int, max_speed: int, seed: int
                       ) -> tuple[int, ...]:
  """Speeds drawn once, uniformly on {1, ..., max_speed}, from ``seed``.

  Args:
    num_workers: p.
    max_speed: the largest speed, an integer >= 1.
    seed: a non-negative integer (the run's seed); the draw is
      ``numpy.random.default_rng((seed, 1))``, independent of other streams.

  Returns:
    p integers.

  Raises:
    HyperparameterError: max_speed not an integer >= 1.
  """
  if not _is_int(max_speed, 1):
    raise elastic.HyperparameterError(
        f"max_worker_speed must be an integer >= 1, got {max_speed!r}")
  rng = np.random.default_rng((int(seed), 1))
  return tuple(int(k) for k in rng.integers(1, max_speed + 1, size=num_workers))


def resolve_worker_speeds(num_workers: int, worker_speeds: Sequence[float] = (),
                          max_worker_speed: int | None = None, seed: int = 0
                          ) -> tuple[int, ...]:
  """The speeds a config asks for: the list, else drawn, else all 1."""
  if worker_speeds:
    return exchange_schedule(num_workers, worker_speeds=worker_speeds).worker_speeds
  if max_worker_speed is not None:
    return draw_worker_speeds(num_workers, max_worker_speed, seed)
  return (1,) * num_workers


EXCHANGE_POINTS = ("step_start", "step_end")
"""Where in a local step its exchange happens: "step_start" (Algorithms 1-2,
EASGD / EAMSGD) or "step_end" (after the gradient: the DOWNPOUR push)."""


def _check_exchange_at(exchange_at) -> str:
  if exchange_at not in EXCHANGE_POINTS:
    raise elastic.HyperparameterError(
        f"unknown exchange_at {exchange_at!r}; allowed: {', '.join(EXCHANGE_POINTS)}")
  return exchange_at


class SlotTable(NamedTuple):
  """Where the local steps of one tick fall, for one exchange point.

  Attributes:
    active: bool [K, p]: worker i computes one local step in slot j of every
      tick (each worker has exactly k_i active slots per tick).
    time: object [K, p]: ``fractions.Fraction``, the time of that step's
      exchange point within the tick, in ticks (start m / k_i or end
      (m + 1) / k_i of the m-th step); None where inactive.
    rank: int32 [K, p]: the rank of ``time`` among the distinct times of
      the tick (0 = earliest); 0 where inactive. Exchanges of one slot are
      served in increasing rank (:func:`served_order`).
  """
  active: np.ndarray
  time: np.ndarray
  rank: np.ndarray


def slot_table(worker_speeds: Sequence[int], exchange_at: str = "step_start"
               ) -> SlotTable:
  """The slots of a tick in which each worker computes its local steps.

  Worker i's m-th step of a tick (m = 0 .. k_i - 1) runs from m / k_i to
  (m + 1) / k_i of the tick; slot j covers j / K to (j + 1) / K, K = max k_i.

      "step_start": exchange point m / k_i;        slot floor(m K / k_i)
      "step_end":   exchange point (m + 1) / k_i;  slot ceil((m + 1) K / k_i) - 1

  i.e. the step is computed (and its exchange served) in the slot that holds
  its exchange point, a slot end counting as part of the slot it ends. Since
  K / k_i >= 1 the k_i slots of a worker are distinct.

  Args:
    worker_speeds: k_i, p integers >= 1 (a validated schedule's speeds).
    exchange_at: "step_start" or "step_end".

  Returns:
    A :class:`SlotTable`.

  Raises:
    HyperparameterError: unknown ``exchange_at``.

  References:
    Algorithm 1 of the paper (exchange before the gradient); the authors'
    ``asyncsgd/optim-downpour.lua`` (push after the gradient).
  """
  _check_exchange_at(exchange_at)
  speeds = [int(k) for k in worker_speeds]
  big_k, p = max(speeds), len(speeds)
  active = np.zeros((big_k, p), bool)
  time = np.full((big_k, p), None, object)
  for i, k in enumerate(speeds):
    for m in range(k):
      if exchange_at == "step_start":
        j, t = (m * big_k) // k, Fraction(m, k)
      else:
        j, t = -(-(m + 1) * big_k // k) - 1, Fraction(m + 1, k)
      active[j, i], time[j, i] = True, t
  ranks = {t: r for r, t in enumerate(sorted({t for t in time.flat if t is not None}))}
  rank = np.array([[ranks.get(t, 0) for t in row] for row in time], np.int32)
  return SlotTable(active, time, rank)


def active_slots(worker_speeds: Sequence[int]) -> np.ndarray:
  """bool [K, p]: worker i starts a local step in slot j of every tick.

  Slot j holds worker i's m-th step when floor(m K / k_i) = j (the
  "step_start" table of :func:`slot_table`, used by EASGD and EAMSGD); each
  worker has exactly k_i active slots per tick, slot 0 always among them.

  Args:
    worker_speeds: k_i, p integers >= 1.

  Returns:
    bool [K, p], K = max k_i.
  """
  return slot_table(worker_speeds, "step_start").active


def local_steps_done(schedule: ExchangeSchedule, num_steps: int,
                     exchange_at: str = "step_start") -> np.ndarray:
  """Local steps each worker has computed after ``num_steps`` trainer steps.

  With "step_start" these are the steps started before slot ``num_steps``,
  ceil(num_steps k_i / K); with "step_end" the steps ended by its start,
  floor(num_steps k_i / K) (:func:`slot_table`).

  Args:
    schedule: the exchange schedule.
    num_steps: trainer steps (slots), an integer >= 0.
    exchange_at: "step_start" (EASGD, EAMSGD) or "step_end" (DOWNPOUR family).

  Returns:
    int [p].

  Raises:
    HyperparameterError: unknown ``exchange_at``.
  """
  table = slot_table(schedule.worker_speeds, exchange_at).active
  ticks, rest = divmod(int(num_steps), schedule.slots_per_tick)
  return ticks * np.asarray(schedule.worker_speeds) + table[:rest].sum(0)


def simulated_time(num_steps, schedule: ExchangeSchedule) -> float:
  """Simulated time, in ticks, after ``num_steps`` trainer steps (slots)."""
  return num_steps / schedule.slots_per_tick


def exchange_order(schedule: ExchangeSchedule, key: jax.Array, tick) -> jax.Array:
  """int32 [p]: the order in which exchanges of tick ``tick`` are served.

  Args:
    schedule: the schedule.
    key: the run's base key (the ``key`` given to ``Algorithm.step``).
    tick: the tick (int or traced int32 scalar).

  Returns:
    ``arange(p)`` for "round_robin"; for "random" the permutation
    ``jax.random.permutation(fold_in(fold_in(key, ORDER_STREAM), tick), p)``.
  """
  p = schedule.num_workers
  if schedule.order == "round_robin":
    return jnp.arange(p, dtype=jnp.int32)
  order_key = jax.random.fold_in(jax.random.fold_in(key, ORDER_STREAM), tick)
  return jax.random.permutation(order_key, p).astype(jnp.int32)


def served_order(order: jax.Array, ranks: jax.Array) -> jax.Array:
  """int32 [p]: the workers of one slot in the order the master serves them.

  The tick's exchange order, stably re-sorted by the time rank of each
  worker's exchange in the slot: earlier exchanges first, exchanges at the
  same time in the tick's order. With equal speeds all ranks of a slot are
  equal and this is ``order`` itself. Workers without an exchange in the slot
  keep a place in the sequence but are skipped by the master.

  Args:
    order: int32 [p], a permutation of the workers (:func:`exchange_order`).
    ranks: int [p], each worker's time rank in this slot
      (``slot_table(...).rank[slot]``).

  Returns:
    int32 [p], a permutation of the workers.
  """
  order = jnp.asarray(order, jnp.int32)
  position = jnp.arange(order.shape[0], dtype=jnp.int32)
  return order[jnp.lexsort((position, jnp.asarray(ranks, jnp.int32)[order]))]


class AsyncWorker(NamedTuple):
  """Per-worker state of a simulated asynchronous method.

  Attributes:
    params: x^i.
    opt_state: the local optimizer's state.
    buffer: EAMSGD: the velocity v^i; DOWNPOUR: the accumulated update u;
      EASGD: ``()``.
    clock: int32 scalar, the worker's local step count t^i.
    model_state: the model's state (e.g. BatchNorm statistics), ``()``
      without (``easgd.momentum.loss_and_grad``).
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


def _gather(tree, index, num_workers, axis_name):
  """Every worker's value, [p, ...] in worker order, identical on all workers.

  One all-reduce of a zero-padded buffer (exact: all other entries add zeros),
  in ``easgd.elastic.reduction_dtype`` (float32 for bfloat16 values); none
  for a single worker.
  """
  reduce_over = elastic.reduce_axis(num_workers, axis_name)

  def gather(x):
    buf = jnp.zeros((num_workers,) + x.shape, x.dtype).at[index].set(x)
    return elastic.worker_sum(buf, reduce_over)
  return jax.tree.map(gather, tree)


MasterRule = Callable[..., tuple]
"""``rule(center, master, message, read, master_clock) -> (center, master, reply)``:
one exchange served by the master. ``read`` is the center the worker reads
before the update (stale by ``staleness``); ``reply`` is a params-like tree
sent back, or None to send the center read after the update (a fetch)."""


class AsyncRules(NamedTuple):
  """The pure rules an asynchronous method is built from (``Algorithm.async_rules``).

  :func:`simulate` runs them in one SPMD program per slot; :func:`replay` runs
  them one event at a time in the order of an exchange log; the real runtimes
  (``easgd.async_threads``, ``easgd.async_ray``) run them on threads or Ray
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
      clock t exchanges (``easgd.algorithms.every_tau_steps``); also accepts
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


def simulate(name: str, *, schedule: ExchangeSchedule, local_step: Callable,
             master_rule: MasterRule, finish: Callable, init_buffer: Callable,
             init_opt_state: Callable, init_master: Callable, center: Callable,
             communication: Callable, hyperparameters: dict,
             exchange_at: str = "step_start",
             axis_name=WORKER_AXES, due: Callable | None = None) -> Algorithm:
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
      initial center (in ``easgd.elastic.reduction_dtype``: float32 for
      bfloat16 parameters, like the center, its history and the messages).
    center: ``center(shared) -> params``, the evaluated model.
    communication: ``communication(num_steps, param_bytes)``.
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
    An :class:`~easgd.algorithms.Algorithm`; its hyperparameters gain
    ``exchange_order``, ``worker_speeds``, ``staleness``, ``slots_per_tick`` and
    ``exchange_at``.

  Raises:
    HyperparameterError: unknown ``exchange_at``.
  """
  p, big_k, s = schedule.num_workers, schedule.slots_per_tick, schedule.staleness
  table = slot_table(schedule.worker_speeds, exchange_at)

  def init(params, model_state=()):
    center = elastic.to_reduction_dtype(params)  # float32 for bfloat16 params
    history = (jax.tree.map(lambda x: jnp.stack([x] * (s + 1)), center)
               if s else ())
    return (AsyncWorker(params, init_opt_state(params), init_buffer(params),
                        jnp.zeros((), jnp.int32), model_state),
            AsyncShared(center, init_master(center), history,
                        jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)))

  def read(history, clock):  # the center after max(clock - s, 0) updates
    return _tree_index(history, (clock + 1) % (s + 1))

  def serve(shared, messages, due, order):
    def body(carry, w):
      center, master, history, clock = carry

      def apply(_):
        before = read(history, clock) if s else center
        new_center, new_master, reply = master_rule(
            center, master, _tree_index(messages, w), before, clock)
        new_history = history
        if s:
          new_history = jax.tree.map(
              lambda h, c: h.at[(clock + 1) % (s + 1)].set(c), history, new_center)
        if reply is None:
          reply = read(new_history, clock + 1) if s else new_center
        return (new_center, new_master, new_history, clock + 1), reply

      def skip(_):
        return carry, tree_zeros_like(center)
      return lax.cond(due[w], apply, skip, None)

    init = (shared.center, shared.master, shared.history, shared.master_clock)
    return lax.scan(body, init, order)

  def step(worker, shared, batch, key):
    index = elastic.worker_index(axis_name)
    tick, slot = shared.step // big_k, shared.step % big_k
    active = jnp.asarray(table.active)[slot, index]
    loss, proposal, message, due = local_step(
        worker, batch, worker_key(key, shared.step, axis_name))
    due = jnp.logical_and(due, active)
    messages = _gather(message, index, p, axis_name)
    all_due = _gather(due.astype(jnp.int32), index, p, axis_name) > 0
    order = served_order(exchange_order(schedule, key, tick),
                         jnp.asarray(table.rank)[slot])
    (center, master, history, clock), replies = serve(shared, messages, all_due,
                                                      order)
    reply = _tree_index(replies, jnp.argmax(order == index))
    new = finish(worker, proposal, reply, due)
    new = tree_where(active, new._replace(clock=worker.clock + 1), worker)
    return (new, AsyncShared(center, master, history, clock, shared.step + 1),
            loss)

  rules = None if due is None else AsyncRules(
      local_step, master_rule, finish, init_buffer, init_opt_state, init_master,
      center, exchange_at, due, dict(hyperparameters))
  return Algorithm(
      name=name, init=init, step=step, center=center,
      worker_params=lambda worker, shared: worker.params,
      communication=communication,
      hyperparameters=dict(hyperparameters, exchange_order=schedule.order,
                           worker_speeds=list(schedule.worker_speeds),
                           staleness=schedule.staleness,
                           slots_per_tick=schedule.slots_per_tick,
                           exchange_at=exchange_at),
      async_rules=rules)


def mean_exchanges(schedule: ExchangeSchedule, num_steps: int, tau: int,
                   exchange_at: str = "step_start", offset: int = 0) -> int:
  """Exchanges per worker over ``num_steps`` trainer steps, mean over workers.

  A worker's local step with clock t exchanges when tau divides t + offset
  (``easgd.algorithms.every_tau_steps``): offset 0 gives t = 0, tau, 2 tau,
  ... (Algorithm 1; the authors' DOWNPOUR), offset 1 gives t = tau - 1,
  2 tau - 1, ... Of n computed steps (:func:`local_steps_done`) that is
  floor((n + offset - 1) / tau) - floor((offset - 1) / tau).

  Args:
    schedule: the exchange schedule.
    num_steps: trainer steps (slots), an integer >= 0.
    tau: the period in local steps, >= 1.
    exchange_at: "step_start" or "step_end" (which steps the slots hold).
    offset: 0 or 1 (above).

  Returns:
    The mean over workers, rounded to the nearest integer.

  Raises:
    HyperparameterError: unknown ``exchange_at``.
  """
  n = local_steps_done(schedule, num_steps, exchange_at)
  counts = (n + offset - 1) // tau - (offset - 1) // tau
  return int(round(float(np.mean(counts))))


def _resolve_schedule(schedule, num_workers):
  if schedule is None:
    return exchange_schedule(num_workers)
  if not isinstance(schedule, ExchangeSchedule):
    raise TypeError(f"schedule must be an ExchangeSchedule (see exchange_schedule), "
                    f"got {type(schedule).__name__}")
  if schedule.num_workers != num_workers:
    raise elastic.HyperparameterError(
        f"schedule is for {schedule.num_workers} workers, num_workers={num_workers}")
  return schedule


def _async_elastic(name, loss_fn, optimizer, *, num_workers, tau, alpha, beta,
                   learning_rate, schedule, momentum, reset_opt_state, axis_name):
  tau = elastic.check_tau(tau)
  alpha = elastic.resolve_alpha(num_workers, alpha, beta)
  optimizer = local_optimizer(optimizer, learning_rate)
  schedule = _resolve_schedule(schedule, num_workers)

  exchange_due = every_tau_steps(tau, offset=0)  # Algorithm 1: tau | t^i

  def local_step(worker, batch, key):
    due = exchange_due(worker.clock)
    opt_state = worker.opt_state
    if reset_opt_state:
      opt_state = reset_optimizer_state(optimizer, opt_state, worker.params, due)
    loss, step, opt_state, model_state = momentum_lib.nesterov_velocity(
        loss_fn, optimizer, momentum, worker.params, worker.buffer, opt_state,
        batch, key, model_state=worker.model_state)
    return loss, (step, opt_state, model_state), worker.params, due

  def master_rule(center, master, x, read, clock):
    del clock
    diff = elastic.elastic_difference(x, read, alpha)  # alpha (x - x~_read)
    return elastic.tree_add(center, diff), master, diff

  def finish(worker, proposal, diff, exchanged):
    del exchanged  # diff is zero when the worker did not exchange
    step, opt_state, model_state = proposal
    params = elastic.cast_like(  # diff in float32 for bfloat16 parameters
        elastic.tree_add(elastic.tree_sub(worker.params, diff), step), worker.params)
    return worker._replace(params=params, opt_state=opt_state,
                           buffer=() if momentum is None else step,
                           model_state=model_state)

  def communication(num_steps, param_bytes):
    n = mean_exchanges(schedule, num_steps, tau, "step_start", offset=0)
    return Communication(n, n * int(param_bytes))

  hyper = dict(num_workers=int(num_workers), tau=tau, alpha=alpha,
               beta=alpha * num_workers, reset_opt_state=bool(reset_opt_state))
  if momentum is not None:
    hyper["momentum"] = momentum
  return simulate(
      name, schedule=schedule, local_step=local_step, master_rule=master_rule,
      finish=finish,
      init_buffer=(lambda params: ()) if momentum is None else
      (lambda params: tree_zeros_like(params)),
      init_opt_state=optimizer.init, init_master=lambda params: (),
      center=lambda shared: shared.center, communication=communication,
      hyperparameters=hyper, exchange_at="step_start", axis_name=axis_name,
      due=exchange_due)


def async_easgd(loss_fn: LossFn, optimizer: optax.GradientTransformation | None = None,
                *, num_workers: int, tau: int = 1, alpha: float | None = None,
                beta: float | None = None, learning_rate: float | None = None,
                schedule: ExchangeSchedule | None = None,
                reset_opt_state: bool = False, axis_name=WORKER_AXES) -> Algorithm:
  """Asynchronous EASGD (Algorithm 1), simulated with an exchange schedule.

  Each local step of worker i, in the order of events of the schedule
  (module docstring):

      x = x^i                                                  (snapshot)
      if tau divides t^i:                      (served one worker at a time)
        d = alpha (x - x~_read)          x~_read: the center, ``staleness`` late
        x^i <- x^i - d;    x~ <- x~ + d                        (the master)
      x^i <- x^i + u,   u = optimizer step at the snapshot (SGD: -eta g^i(x))
      t^i <- t^i + 1

  With the round-robin order, speeds 1 and tau = 1 one tick is p steps of
  the round-robin scheme of eq. (12)-(13).

  Conventions and their sources:
    * Exchange at local clocks t = 0, tau, 2 tau, ... at the START of the
      step, before its gradient, and the gradient at the pre-exchange
      snapshot: the paper's Algorithm 1 (and the authors'
      ``optim-eamsgd.lua``: ``pversion % su == 0``, center received before
      ``localupdate``).
    * The exchange is served at that time among the other workers'
      exchanges (module docstring): with unequal speeds an earlier step start
      is served first; exchanges at the same time follow the tick's order.
    * The master's update is applied when the exchange is served (paper,
      Algorithm 1). In the authors' code the difference is sent without
      waiting and reaches the master during the gradient computation; not
      modelled (no network delay other than ``staleness``).

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the local optimizer (receives the worker's own params, state
      per worker); default ``optax.sgd(learning_rate)``.
    num_workers: p.
    tau: communication period, in the worker's local steps (>= 1).
    alpha: moving rate; or give ``beta`` = num_workers * alpha.
    beta: center moving rate (paper: 0.9).
    learning_rate: eta of the default SGD optimizer.
    schedule: an :class:`ExchangeSchedule`; default round-robin, speeds 1,
      staleness 0.
    reset_opt_state: re-initialise the optimizer state at each of the worker's
      exchanges (schedules keep their position).
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.algorithms.Algorithm` named ``"async_easgd"``. Its
    ``communication`` counts the worker's exchanges (each sends one
    parameter-sized message and receives one), mean over workers.

  Raises:
    HyperparameterError: tau, alpha/beta, learning_rate or the schedule invalid.
    TypeError: optimizer or schedule of the wrong type.

  References:
    Zhang, Choromanska, LeCun (2015), Algorithm 1; eq. (12)-(13).
    github.com/sixin-zh/mpiT (commit c359666), ``asyncsgd/optim-eamsgd.lua``.
  """
  return _async_elastic("async_easgd", loss_fn, optimizer, num_workers=num_workers,
                        tau=tau, alpha=alpha, beta=beta, learning_rate=learning_rate,
                        schedule=schedule, momentum=None,
                        reset_opt_state=reset_opt_state, axis_name=axis_name)


def async_eamsgd(loss_fn: LossFn, optimizer: optax.GradientTransformation | None = None,
                 *, num_workers: int, momentum: float, tau: int = 1,
                 alpha: float | None = None, beta: float | None = None,
                 learning_rate: float | None = None,
                 schedule: ExchangeSchedule | None = None,
                 reset_opt_state: bool = False, axis_name=WORKER_AXES) -> Algorithm:
  """Asynchronous EAMSGD (Algorithm 2), simulated with an exchange schedule.

      x = x^i                                                  (snapshot)
      if tau divides t^i:
        d = alpha (x - x~_read);   x^i <- x^i - d;   x~ <- x~ + d
      v^i <- delta v^i + u,   u = optimizer step at x + delta v^i
                              (SGD: u = -eta g^i(x + delta v^i))
      x^i <- x^i + v^i;   t^i <- t^i + 1

  The velocity is local (never communicated, pulled or reset); momentum = 0
  gives :func:`async_easgd`. Exchange times, serving order and the atomic
  exchange follow the conventions (and sources) of :func:`async_easgd`; the
  look-ahead gradient at the pre-exchange snapshot is the paper's Algorithm 2
  (and the authors' ``optim-eamsgd.lua``, ``localupdate``).

  Args:
    loss_fn, optimizer, num_workers, tau, alpha, beta, learning_rate,
    schedule, reset_opt_state, axis_name: as :func:`async_easgd` (the optimizer
      receives the look-ahead point as params, see ``easgd.momentum``).
    momentum: delta in [0, 1) (paper: 0.99).

  Returns:
    An :class:`~easgd.algorithms.Algorithm` named ``"async_eamsgd"``.

  Raises:
    HyperparameterError: as :func:`async_easgd`, or momentum outside [0, 1).
    TypeError: optimizer or schedule of the wrong type.

  References:
    Zhang, Choromanska, LeCun (2015), Algorithm 2 and eq. (7).
    github.com/sixin-zh/mpiT (commit c359666), ``asyncsgd/optim-eamsgd.lua``.
  """
  return _async_elastic("async_eamsgd", loss_fn, optimizer, num_workers=num_workers,
                        tau=tau, alpha=alpha, beta=beta, learning_rate=learning_rate,
                        schedule=schedule,
                        momentum=momentum_lib.check_momentum(momentum),
                        reset_opt_state=reset_opt_state, axis_name=axis_name)


PUSH_TIMINGS = ("authors", "full_period")
"""After which local steps a DOWNPOUR-type worker pushes (:func:`async_push`)."""


def check_push_timing(push_timing) -> str:
  """Checks a DOWNPOUR push timing; returns it.

  Args:
    push_timing: "authors" (push after local steps 0, tau, 2 tau, ...) or
      "full_period" (after steps tau - 1, 2 tau - 1, ...).

  Returns:
    ``push_timing``.

  Raises:
    HyperparameterError: any other value.
  """
  if not isinstance(push_timing, str) or push_timing not in PUSH_TIMINGS:
    raise elastic.HyperparameterError(
        f"unknown push_timing {push_timing!r}; allowed: {', '.join(PUSH_TIMINGS)}")
  return push_timing


def push_offset(push_timing: str) -> int:
  """The ``every_tau_steps`` offset of a push timing.

  Args:
    push_timing: "authors" (push when tau divides t^i) or "full_period"
      (when tau divides t^i + 1).

  Returns:
    0 for "authors", 1 for "full_period".

  Raises:
    HyperparameterError: any other value.
  """
  return PUSH_TIMINGS.index(check_push_timing(push_timing))


def async_push(name: str, loss_fn: LossFn, optimizer: optax.GradientTransformation,
               *, num_workers: int, tau: int, schedule: ExchangeSchedule | None,
               master_rule: MasterRule, init_master: Callable, center: Callable,
               hyperparameters: dict, push_timing: str = "authors",
               axis_name=WORKER_AXES) -> Algorithm:
  """A DOWNPOUR-type method on the simulated asynchronous engine.

  Each local step of worker i (t^i its clock at the step's start, the
  authors' ``pversion``):

      u = optimizer step at x^i (SGD: -eta g^i(x^i));  acc^i <- acc^i + u
      if tau divides t^i + offset:   (at the step's END; one worker at a time)
        the master applies ``master_rule`` to acc^i (DOWNPOUR: x~ <- x~ + acc^i),
        x^i <- the center fetched after the update (``staleness`` late), acc^i <- 0
      else:
        x^i <- x^i + u
      t^i <- t^i + 1

  Conventions and their sources:
    * Push steps. ``push_timing="authors"`` (default, offset 0): pushes after
      local steps t = 0, tau, 2 tau, ..., the authors' ``optim-downpour.lua``
      (``pversion % su == 0``, tested before ``pversion`` is incremented), so
      the first push carries one step and the later ones tau steps. With
      tau = 1 every step pushes (asynchronous SGD). ``"full_period"``
      (offset 1): pushes after t = tau - 1, 2 tau - 1, ..., so every push
      carries exactly tau steps; our own convention (the package's rule
      before it followed the authors' code), kept to reproduce earlier runs.
    * The pushed update includes the step just taken, and on a push step the
      worker's own move is replaced by the fetched center: authors' code
      (``config.dfdx:add(dfdx)`` before the send; ``w:add(dfdx)`` only on
      steps without a push; the center is received into ``w``).
    * The push happens at the step's end, after the gradient: authors' code
      and the paper's loop; it is served at that time among the other
      exchanges (module docstring, :func:`slot_table` "step_end").
    * The fetch reads the center after the worker's own push: our choice
      for a deterministic simulation. The authors' client sends and receives
      concurrently and the server reads without a lock ("expect inconsistent
      read", ``pserver.lua``); the paper describes the fetch as the center
      after the push.

  Args:
    name: the algorithm's name.
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the worker's optimizer (state per worker).
    num_workers: p.
    tau: push period in local steps (>= 1).
    schedule: the exchange schedule; default round-robin, speeds 1.
    master_rule: see :data:`MasterRule`; return reply None for a fetch.
    init_master: ``init_master(params)``, the master's extra state.
    center: ``center(shared) -> params``, the evaluated model.
    hyperparameters: for logs.
    push_timing: "authors" (default) or "full_period" (above).
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.algorithms.Algorithm`; ``communication`` counts pushes
    (each sends one parameter-sized update and receives the center). Its
    hyperparameters hold ``tau`` and ``push_timing``.

  Raises:
    HyperparameterError: tau < 1, unknown push_timing, bad schedule.

  References:
    github.com/sixin-zh/mpiT (commit c359666), ``asyncsgd/optim-downpour.lua``
    and ``asyncsgd/pserver.lua``; Zhang, Choromanska, LeCun (2015), Section 5.
  """
  tau = elastic.check_tau(tau)
  offset = push_offset(push_timing)
  schedule = _resolve_schedule(schedule, num_workers)
  push_due = every_tau_steps(tau, offset)

  def local_step(worker, batch, key):
    loss, grads, model_state = momentum_lib.loss_and_grad(
        loss_fn, worker.params, batch, key, worker.model_state)
    step, opt_state = optimizer.update(grads, worker.opt_state, worker.params)
    params = optax.apply_updates(worker.params, step)
    acc = elastic.tree_add(worker.buffer, step)
    return loss, (params, acc, opt_state, model_state), acc, push_due(worker.clock)

  def finish(worker, proposal, fetched, exchanged):
    params, acc, opt_state, model_state = proposal
    return worker._replace(
        params=tree_where(exchanged, elastic.cast_like(fetched, params), params),
        buffer=tree_where(exchanged, tree_zeros_like(acc), acc),
        opt_state=opt_state, model_state=model_state)

  def communication(num_steps, param_bytes):
    n = mean_exchanges(schedule, num_steps, tau, "step_end", offset)
    return Communication(n, n * int(param_bytes))

  return simulate(
      name, schedule=schedule, local_step=local_step, master_rule=master_rule,
      finish=finish,  # the accumulated update u is kept in float32 for bf16 params
      init_buffer=lambda params: tree_zeros_like(elastic.to_reduction_dtype(params)),
      init_opt_state=optimizer.init, init_master=init_master, center=center,
      communication=communication,
      hyperparameters=dict(hyperparameters, num_workers=int(num_workers), tau=tau,
                           push_timing=push_timing),
      exchange_at="step_end", axis_name=axis_name, due=push_due)


# --------------------------------------------------------------------------
# The realised exchange sequence of a run.
# --------------------------------------------------------------------------


EXCHANGE_RECORD = np.dtype([
    ("slot", np.int64), ("tick", np.int64), ("time", np.float64),
    ("worker", np.int32), ("local_step", np.int64), ("version", np.int64),
    ("read_version", np.int64)])
"""Fields of :func:`exchange_log` (one record per exchange, in serving order).

  slot: the trainer step (0-based ``shared.step`` before the call) in which
    the master serves it.
  tick: ``slot // K``.
  time: its simulated time in ticks: the start (EASGD, EAMSGD) or the end
    (DOWNPOUR family) of the local step, tick + m / k_i or tick + (m + 1) / k_i.
  worker: i.
  local_step: t^i, the worker's clock at the start of that local step (the
    authors' ``pversion``); the step uses the worker's mini-batch of ``slot``.
  version: master updates served before this one (the master clock).
  read_version: master updates contained in the center the worker reads:
    EASGD / EAMSGD, before its update: max(version - staleness, 0);
    DOWNPOUR family, the fetch after its push: max(version + 1 - staleness, 0).
"""


def _exchange_records(schedule: ExchangeSchedule, key, num_steps: int, *, tau: int,
                      exchange_at: str, offset: int, ticks_per_chunk: int = 4096
                      ) -> np.ndarray:
  """:data:`EXCHANGE_RECORD` array of the first ``num_steps`` slots (see exchange_log)."""
  table = slot_table(schedule.worker_speeds, exchange_at)
  due_at = every_tau_steps(tau, offset)
  big_k, s = schedule.slots_per_tick, schedule.staleness
  speeds = np.asarray(schedule.worker_speeds, np.int64)
  before = np.cumsum(table.active, 0) - table.active  # [K, p] steps earlier in the tick
  time_in_tick = np.array([[float(t) if t is not None else 0.0 for t in row]
                           for row in table.time])
  orders_of = jax.vmap(lambda t: exchange_order(schedule, key, t))
  served_of = jax.vmap(jax.vmap(served_order, (None, 0)), (0, None))
  num_ticks = -(-int(num_steps) // big_k)
  chunks = []
  for t0 in range(0, num_ticks, ticks_per_chunk):
    ticks = np.arange(t0, min(t0 + ticks_per_chunk, num_ticks))
    orders = orders_of(jnp.asarray(ticks, jnp.int32))
    served = np.asarray(served_of(orders, jnp.asarray(table.rank)), np.int64)  # [n, K, p]
    tick = np.broadcast_to(ticks[:, None, None], served.shape)
    slot_in_tick = np.broadcast_to(np.arange(big_k)[None, :, None], served.shape)
    slot = tick * big_k + slot_in_tick
    clock = tick * speeds[served] + before[slot_in_tick, served]
    keep = (table.active[slot_in_tick, served] & np.asarray(due_at(clock), bool)
            & (slot < int(num_steps)))
    chunks.append(np.stack([a[keep] for a in (slot, tick, served, clock,
                                              slot_in_tick)], axis=1))
  rows = np.concatenate(chunks) if chunks else np.zeros((0, 5), np.int64)
  out = np.zeros(len(rows), EXCHANGE_RECORD)
  out["slot"], out["tick"], out["worker"], out["local_step"] = rows[:, :4].T
  out["time"] = out["tick"] + time_in_tick[rows[:, 4], rows[:, 2]]
  out["version"] = np.arange(len(rows))
  late = s - (1 if exchange_at == "step_end" else 0)
  out["read_version"] = np.maximum(out["version"] - late, 0)
  return out


def exchange_log(algorithm: Algorithm, key: jax.Array, num_steps: int) -> np.ndarray:
  """Every exchange of a simulated asynchronous run, in the order served.

  The sequence is a deterministic function of the schedule (order, speeds,
  staleness), tau, the push timing, the run's key and the number of trainer
  steps; it is computed on the host from the same tables and helpers as the
  device program (:func:`slot_table`, :func:`exchange_order`,
  :func:`served_order`, ``easgd.algorithms.every_tau_steps``), without
  running the model. The device's ``shared.master_clock`` after
  ``num_steps`` steps equals ``len(exchange_log(...))``.

  Args:
    algorithm: an algorithm of this module or of ``easgd.baselines``' DOWNPOUR
      family (its ``hyperparameters`` hold ``exchange_order``, ``worker_speeds``,
      ``staleness``, ``tau``, ``exchange_at`` and, for "step_end",
      ``push_timing``).
    key: the run's base key, the ``key`` given to ``Algorithm.step``.
    num_steps: trainer steps (slots) taken, an integer >= 0.

  Returns:
    A NumPy structured array of dtype :data:`EXCHANGE_RECORD`, one record per
    exchange, in the order the master served them (``version`` = 0, 1, ...).

  Raises:
    ValueError: the algorithm is not a simulated asynchronous one, or
      num_steps is not an integer >= 0.
  """
  hyper = algorithm.hyperparameters
  if "exchange_at" not in hyper or "worker_speeds" not in hyper:
    raise ValueError(f"algorithm {algorithm.name!r} has no simulated exchange "
                     f"schedule (not easgd.asynchronous)")
  if not _is_int(num_steps, 0):
    raise ValueError(f"num_steps must be an integer >= 0, got {num_steps!r}")
  schedule = exchange_schedule(len(hyper["worker_speeds"]), hyper["exchange_order"],
                               hyper["worker_speeds"], hyper["staleness"])
  offset = (push_offset(hyper["push_timing"])
            if hyper["exchange_at"] == "step_end" else 0)
  return _exchange_records(schedule, key, num_steps, tau=hyper["tau"],
                           exchange_at=hyper["exchange_at"], offset=offset)


def write_exchange_log(path, algorithm: Algorithm, key: jax.Array,
                       num_steps: int) -> int:
  """Writes :func:`exchange_log` as JSON lines, one exchange per line.

  Each line is an object with the fields of :data:`EXCHANGE_RECORD`, e.g.
  ``{"slot": 3, "tick": 1, "time": 1.5, "worker": 2, "local_step": 3,
  "version": 7, "read_version": 6}``. The file is replaced atomically, so
  calling it again with a larger ``num_steps`` (after resuming) gives the
  whole run, and an interrupted write leaves the previous file.

  Args:
    path: the file to write (str or path-like), e.g. ``<workdir>/exchanges.jsonl``.
    algorithm, key, num_steps: as :func:`exchange_log`.

  Returns:
    The number of exchanges written (= the device's ``shared.master_clock``).

  Raises:
    ValueError: as :func:`exchange_log`.
    OSError: the file cannot be written.
  """
  from easgd.files import write_text_atomic  # an interrupted write keeps the old file
  records = exchange_log(algorithm, key, num_steps)
  names = EXCHANGE_RECORD.names
  write_text_atomic(path, "".join(json.dumps(dict(zip(names, record))) + "\n"
                                  for record in records.tolist()))
  return len(records)


# --------------------------------------------------------------------------
# The rules one event at a time: per-event functions and the explicit-order
# replay (the simulator with the exchange order given by a log).
# --------------------------------------------------------------------------


LOG_EVENTS = ("exchange", "restart", "fault")
"""Kinds of record in an exchange log (the record's ``event``; a record without
one, as :func:`exchange_log` writes them, is an exchange): ``"exchange"`` (the
master served worker ``worker`` at its local step ``local_step``),
``"restart"`` (the worker restarted from the center after ``read_version``
master updates, its next local step being ``local_step``), ``"fault"`` (the
worker failed before its local step ``local_step``; informational)."""


def async_rules(algorithm: Algorithm) -> AsyncRules:
  """The :class:`AsyncRules` of an asynchronous algorithm.

  Args:
    algorithm: an algorithm of this module or of ``easgd.baselines``' DOWNPOUR
      family.

  Returns:
    ``algorithm.async_rules``.

  Raises:
    ValueError: the algorithm has none (a synchronous or one-model method).
  """
  rules = getattr(algorithm, "async_rules", None)
  if not isinstance(rules, AsyncRules):
    raise ValueError(
        f"algorithm {algorithm.name!r} has no asynchronous rules "
        f"(Algorithm.async_rules): only the asynchronous methods (async EASGD and "
        f"EAMSGD, the DOWNPOUR family) run outside the SPMD program")
  return rules


def local_key(key: jax.Array, worker, clock) -> jax.Array:
  """The key of worker ``worker``'s local step at clock ``clock``.

  ``fold_in(fold_in(key, clock), worker)``: the same construction as
  ``easgd.algorithms.worker_key`` with the worker's own clock in place of the
  common step count, so it is a function of (key, worker, local step) only.

  Args:
    key: the run's base key.
    worker: the worker's index (int or int32 scalar).
    clock: its local clock t^i (int or int32 scalar).

  Returns:
    A PRNG key of the type of ``key``.
  """
  return jax.random.fold_in(jax.random.fold_in(key, clock), worker)


def init_worker(rules: AsyncRules, params: Params, clock=0) -> AsyncWorker:
  """One worker's state at ``params`` (fresh optimizer state and buffer).

  Args:
    rules: the method's rules.
    params: the worker's parameters.
    clock: its local clock (0 at the start; a restarted worker keeps counting).

  Returns:
    An :class:`AsyncWorker`, as ``Algorithm.init`` builds it.
  """
  return AsyncWorker(params, rules.init_opt_state(params), rules.init_buffer(params),
                     jnp.asarray(clock, jnp.int32))


def restart_worker(rules: AsyncRules, center: Params, like: Params, clock
                   ) -> AsyncWorker:
  """A worker restarted from the center: ``init_worker(center cast like like)``.

  Args:
    rules: the method's rules.
    center: the center x~ the worker restarts from (``AsyncShared.center``).
    like: parameters of the workers' dtypes (e.g. the initial parameters).
    clock: the local clock the worker goes on from.

  Returns:
    An :class:`AsyncWorker` with params x~, fresh optimizer state and buffer.
  """
  return init_worker(rules, elastic.cast_like(center, like), clock)


def init_shared(rules: AsyncRules, params: Params) -> AsyncShared:
  """The master's state of a run without staleness (``history`` is ``()``).

  Args:
    rules: the method's rules.
    params: the common initial parameters.

  Returns:
    An :class:`AsyncShared` equal to ``Algorithm.init``'s with staleness 0.
  """
  center = elastic.to_reduction_dtype(params)
  return AsyncShared(center, rules.init_master(center), (), jnp.zeros((), jnp.int32),
                     jnp.zeros((), jnp.int32))


class RulePrograms:
  """The per-event functions of an asynchronous method, uncompiled.

  One local step of worker i at its clock t is, without an exchange,
  ``local``; with one (``rules.due(t)``), ``propose`` on the worker, ``serve``
  on the master (atomic: nothing else touches the master in between) and
  ``finish`` on the worker. These are :func:`simulate`'s rules for one worker
  and one exchange; the key of the step is :func:`local_key` of the worker's
  clock. :func:`replay` calls them in the log's order; the real runtimes
  compile the same functions (``easgd.async_shared.WorkerPrograms``), and a
  replay given those compiled programs repeats a run bit for bit.

  Args:
    rules: the method's :class:`AsyncRules`.
  """

  def __init__(self, rules: AsyncRules):
    self.rules = rules

  def local(self, worker: AsyncWorker, batch, key: jax.Array, index
            ) -> tuple[AsyncWorker, jax.Array]:
    """A local step without exchange: ``(worker after the step, its loss)``."""
    loss, proposal, _, _ = self.rules.local_step(
        worker, batch, local_key(key, index, worker.clock))
    none = tree_zeros_like(elastic.to_reduction_dtype(worker.params))
    new = self.rules.finish(worker, proposal, none, False)
    return new._replace(clock=worker.clock + 1), loss

  def propose(self, worker: AsyncWorker, batch, key: jax.Array, index):
    """The worker's half of an exchange step: ``(loss, proposal, message)``.

    The message is in ``easgd.elastic.reduction_dtype`` (float32 for bfloat16
    parameters), as the simulation's master receives it.
    """
    loss, proposal, message, _ = self.rules.local_step(
        worker, batch, local_key(key, index, worker.clock))
    return loss, proposal, elastic.to_reduction_dtype(message)

  def serve(self, shared: AsyncShared, message, read) -> tuple[AsyncShared, Params]:
    """The master's half: ``(master state after the update, reply)``.

    Args:
      shared: the master's state.
      message: the worker's message (:meth:`propose`).
      read: the center the worker reads (``shared.center`` in a real run;
        an older one for a stale read in a replay of the simulation).

    Returns:
      The new state (``master_clock`` + 1) and the reply: the rule's, or the
      center after the update for a fetch (DOWNPOUR).
    """
    center, master, reply = self.rules.master_rule(
        shared.center, shared.master, message, read, shared.master_clock)
    new = shared._replace(center=center, master=master,
                          master_clock=shared.master_clock + 1)
    return new, center if reply is None else reply

  def finish(self, worker: AsyncWorker, proposal, reply) -> AsyncWorker:
    """The worker's end of an exchange step (clock + 1)."""
    new = self.rules.finish(worker, proposal, reply, True)
    return new._replace(clock=worker.clock + 1)


class Replayed(NamedTuple):
  """What :func:`replay` returns.

  Attributes:
    workers: the final :class:`AsyncWorker` of every worker, in worker order.
    shared: the master's final :class:`AsyncShared` (``history`` ``()``).
    centers: with ``keep_centers``, the center after each master update
      (entry v holds it after v updates, entry 0 the initial one); else None.
  """
  workers: list
  shared: AsyncShared
  centers: list | None


def _log_record(record) -> dict:
  if isinstance(record, dict):
    r = dict(record)
  else:  # a row of exchange_log's structured array
    r = {name: record[name].item() for name in record.dtype.names}
  r.setdefault("event", "exchange")
  if r["event"] not in LOG_EVENTS:
    raise ValueError(f"unknown log event {r['event']!r}; allowed: {', '.join(LOG_EVENTS)}")
  return r


def replay(algorithm: Algorithm, log, params: Params, batch_fn: Callable, key: jax.Array,
           final_clocks: Sequence[int], *, programs=None,
           keep_centers: bool = False) -> Replayed:
  """Runs an asynchronous method's rules in the exchange order of a log.

  This is the simulator with the exchange order made explicit: every worker
  starts from ``params``; the records are taken in order; for an exchange of
  worker i at its local step t, the worker first takes its local steps up to
  t (``programs.local``: each depends on the worker's own state only, so
  their order relative to other workers does not matter), then the exchange
  step (``propose``, ``serve`` reading the center after ``read_version``
  master updates, ``finish``). A restart resets the worker to the center
  (:func:`restart_worker`). At the end every worker takes its remaining
  local steps up to ``final_clocks``. The log may come from a real run
  (``easgd.async_shared``, read versions of an atomic exchange) or from
  :func:`exchange_log` (any staleness).

  Worker i's local step at clock t reads ``batch_fn(i, t)`` and the key
  :func:`local_key` ``(key, i, t)``. A real run's batches are a function of
  (seed, worker, local step) only, so the replay rebuilds every one.

  Args:
    algorithm: the asynchronous algorithm (:func:`async_rules`).
    log: the records in serving order (dicts with ``worker``, ``local_step``,
      ``version``, ``read_version`` and optionally ``event``, see
      :data:`LOG_EVENTS`; or :func:`exchange_log`'s array).
    params: the common initial parameters.
    batch_fn: ``batch_fn(worker, clock) -> batch``.
    key: the run's base key.
    final_clocks: each worker's local clock at the end of the run.
    programs: the per-event functions; default :class:`RulePrograms`
      (uncompiled, op by op). Give a run's compiled programs
      (``easgd.async_shared.WorkerPrograms``) to repeat it bit for bit.
    keep_centers: also return the center after every master update.

  Returns:
    A :class:`Replayed`.

  Raises:
    ValueError: the algorithm has no rules; the log is not in serving order,
      names a worker out of range, exchanges at a local step that is not due,
      lacks an exchange that is due, or reads a center version that does not
      exist yet.
  """
  rules = async_rules(algorithm)
  programs = RulePrograms(rules) if programs is None else programs
  records = [_log_record(r) for r in log]
  p = len(final_clocks)
  step_end = rules.exchange_at == "step_end"

  def needs(r):  # the center versions a record reads
    if r["event"] == "restart":
      return r["read_version"]
    if r["event"] == "fault":
      return None
    return max(r["read_version"] - 1, 0) if step_end else r["read_version"]
  suffix_min, low = [0] * (len(records) + 1), None
  suffix_min[-1] = None
  for k in range(len(records) - 1, -1, -1):
    n = needs(records[k])
    low = n if low is None else (low if n is None else min(low, n))
    suffix_min[k] = low

  shared = init_shared(rules, params)
  workers_ = [init_worker(rules, params) for _ in range(p)]
  clocks = [0] * p
  index = [np.int32(i) for i in range(p)]
  centers = {0: shared.center}
  history = [shared.center] if keep_centers else None
  version = 0

  def advance(i, until):
    while clocks[i] < until:
      if bool(rules.due(clocks[i])):
        raise ValueError(f"the log lacks worker {i}'s exchange at its local step "
                         f"{clocks[i]} (due by the method's schedule)")
      workers_[i], _ = programs.local(workers_[i], batch_fn(i, clocks[i]), key,
                                      index[i])
      clocks[i] += 1

  for k, r in enumerate(records):
    i, t = int(r["worker"]), int(r["local_step"])
    if not 0 <= i < p:
      raise ValueError(f"log record {k} names worker {i}; the run has {p} workers")
    if r["event"] == "fault":
      continue
    if r["event"] == "restart":
      if r["read_version"] != version:
        raise ValueError(f"log record {k}: a restart reads the center after "
                         f"{r['read_version']} updates, but {version} were served")
      workers_[i] = restart_worker(rules, centers[version], params, t)
      clocks[i] = t
    else:
      if r["version"] != version:
        raise ValueError(f"log record {k} has version {r['version']}; expected "
                         f"{version} (records must be in serving order)")
      if not 0 <= r["read_version"] <= version + step_end:
        raise ValueError(f"log record {k} reads center version {r['read_version']} "
                         f"at master update {version}")
      advance(i, t)
      if clocks[i] != t or not bool(rules.due(t)):
        raise ValueError(f"log record {k}: worker {i} exchanges at local step {t}, "
                         f"which is not due or already passed (its clock is "
                         f"{clocks[i]})")
      loss, proposal, message = programs.propose(workers_[i], batch_fn(i, t), key,
                                                 index[i])
      del loss
      shared, reply = programs.serve(shared, message, centers[needs(r)])
      version += 1
      centers[version] = shared.center
      if keep_centers:
        history.append(shared.center)
      if step_end and r["read_version"] != version:
        reply = centers[r["read_version"]]  # a stale fetch (simulated staleness)
      workers_[i] = programs.finish(workers_[i], proposal, reply)
      clocks[i] += 1
    keep = suffix_min[k + 1]
    keep = version if keep is None else min(keep, version)
    for v in [v for v in centers if v < keep]:
      del centers[v]
  for i in range(p):
    advance(i, int(final_clocks[i]))
  return Replayed(workers_, shared, history)
