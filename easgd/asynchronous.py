"""Asynchronous EASGD and EAMSGD, simulated deterministically inside SPMD code.

The paper's experiments run Algorithms 1 and 2 asynchronously: each worker has
its own clock t^i and, whenever tau divides t^i, exchanges with the center held
by a master, one worker at a time. This module reproduces that sequence of
events deterministically inside the same per-worker SPMD program as the
synchronous algorithms (``easgd.workers``: pmap over devices of vmap over
workers), so a run is reproducible per seed and identical for every layout.

What is modelled
  * Simulated time is counted in ticks. Worker i takes k_i local steps per tick
    (its speed, an integer >= 1). With K = max_i k_i, one tick is K slots and
    one call of ``Algorithm.step`` (one trainer step, one mini-batch per worker)
    is one slot. Worker i's m-th local step of a tick (m = 0 .. k_i - 1) is
    placed at time m / k_i of the tick, i.e. in slot floor(m K / k_i); in the
    other slots the worker is idle (its mini-batch of that slot is not used,
    its state and clock do not change). With all speeds 1, a step is a tick
    and every worker takes one local step in it.
  * In a slot, every active worker computes its local step at its own
    snapshot (the gradient of Algorithm 1/2 is taken at the pre-exchange
    snapshot, so it does not depend on the center). Then the exchanges of the
    workers whose clock is due (tau divides t^i) are served by the master one
    at a time in the tick's exchange order: each reads the center as left by
    the exchanges before it (minus ``staleness``, below), and the master
    applies the elastic difference before serving the next worker. The served
    sequence is computed identically on every device with a ``lax.scan`` over
    the order, from the workers' snapshots gathered by one all-reduce.
  * Exchange order, fixed per tick: ``"round_robin"`` (worker 0, 1, ..., p-1:
    with speeds 1 and tau = 1 one tick is p consecutive steps of the
    round-robin scheme of eq. (12)-(13)), or ``"random"`` (a fresh uniform
    permutation every tick, drawn from the run's key, so the same seed gives
    the same order).
  * Staleness s >= 0, counted in master updates: a worker reads the center as
    it was s master updates before the current one (clamped at the initial
    center). The master still adds the resulting difference to its CURRENT
    center, so the force stays symmetric. s = 0 reads the current center.
  * Worker speeds are fixed for the run: given as a list, or drawn once from
    a uniform distribution on {1, ..., max_speed} with the run's seed
    (:func:`draw_worker_speeds`).

What is not modelled
  * No real concurrency: nothing runs at the same time as anything else, and
    there are no network delays other than ``staleness``, no message loss,
    no variation of a worker's speed over time. Wall-clock time of the
    simulation says nothing about an asynchronous cluster; use simulated time
    (:func:`simulated_time`, in ticks).
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
workers push an accumulated update and fetch the center after their push.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Algorithms 1 and 2, eq. (12)-(13).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax.tree_utils import tree_where, tree_zeros_like
from jax import lax

from easgd import elastic, momentum as momentum_lib
from easgd.algorithms import (Algorithm, Communication, LossFn, _local_optimizer,
                              reset_optimizer_state, worker_key)
from easgd.workers import WORKER_AXES

Params = Any

SCHEDULES = ("round_robin", "random")
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
  if order not in SCHEDULES:
    raise elastic.HyperparameterError(
        f"unknown schedule {order!r}; allowed: {', '.join(SCHEDULES)}")
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


def active_slots(worker_speeds: Sequence[int]) -> np.ndarray:
  """bool [K, p]: worker i takes a local step in slot j of every tick.

  Slot j holds worker i's m-th step when floor(m K / k_i) = j, i.e. when
  ceil((j + 1) k_i / K) > ceil(j k_i / K); each worker has exactly k_i active
  slots per tick, slot 0 always among them.
  """
  k = np.asarray(worker_speeds, np.int64)[None, :]
  big_k = int(k.max())
  j = np.arange(big_k)[:, None]
  return -(-(j + 1) * k // big_k) > -(-j * k // big_k)


def local_steps_done(schedule: ExchangeSchedule, num_steps: int) -> np.ndarray:
  """int [p]: local steps each worker has taken after ``num_steps`` trainer steps."""
  table = active_slots(schedule.worker_speeds)
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


class AsyncWorker(NamedTuple):
  """Per-worker state of a simulated asynchronous method.

  Attributes:
    params: x^i.
    opt_state: the local optimizer's state.
    buffer: EAMSGD: the velocity v^i; DOWNPOUR: the accumulated update u;
      EASGD: ``()``.
    clock: int32 scalar, the worker's local step count t^i.
  """
  params: Params
  opt_state: Any
  buffer: Any
  clock: jax.Array


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

  One all-reduce of a zero-padded buffer (exact: all other entries add zeros).
  """
  def gather(x):
    buf = jnp.zeros((num_workers,) + x.shape, x.dtype).at[index].set(x)
    return lax.psum(buf, axis_name)
  return jax.tree.map(gather, tree)


MasterRule = Callable[..., tuple]
"""``rule(center, master, message, read, master_clock) -> (center, master, reply)``:
one exchange served by the master. ``read`` is the center the worker reads
before the update (stale by ``staleness``); ``reply`` is a params-like tree
sent back, or None to send the center read after the update (a fetch)."""


def simulate(name: str, *, schedule: ExchangeSchedule, local_step: Callable,
             master_rule: MasterRule, finish: Callable, init_buffer: Callable,
             init_opt_state: Callable, init_master: Callable, center: Callable,
             communication: Callable, hyperparameters: dict,
             axis_name=WORKER_AXES) -> Algorithm:
  """Builds a simulated asynchronous algorithm from its local and master rules.

  One call of ``step`` is one slot (module docstring): active workers run
  ``local_step``; the due exchanges are served by ``master_rule`` in the
  tick's order; each worker applies ``finish`` with its reply.

  Args:
    name: the algorithm's name.
    schedule: the exchange schedule (order, speeds, staleness).
    local_step: ``local_step(worker, batch, key) -> (loss, proposal, message,
      due)``: the worker's local computation at its snapshot; ``message`` (a
      params-like tree) goes to the master when ``due`` (bool scalar).
    master_rule: see :data:`MasterRule`.
    finish: ``finish(worker, proposal, reply, exchanged) -> worker`` (without
      the clock); ``reply`` is zeros when the worker did not exchange.
    init_buffer, init_opt_state: ``f(params)`` for the worker state.
    init_master: ``init_master(params)``, the master's extra state.
    center: ``center(shared) -> params``, the evaluated model.
    communication: ``communication(num_steps, param_bytes)``.
    hyperparameters: for logs; the schedule's fields are added.
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.algorithms.Algorithm`; its hyperparameters gain
    ``schedule``, ``worker_speeds``, ``staleness`` and ``slots_per_tick``.
  """
  p, big_k, s = schedule.num_workers, schedule.slots_per_tick, schedule.staleness
  active_table = active_slots(schedule.worker_speeds)

  def init(params):
    history = (jax.tree.map(lambda x: jnp.stack([x] * (s + 1)), params)
               if s else ())
    return (AsyncWorker(params, init_opt_state(params), init_buffer(params),
                        jnp.zeros((), jnp.int32)),
            AsyncShared(params, init_master(params), history,
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
    index = lax.axis_index(axis_name)
    tick, slot = shared.step // big_k, shared.step % big_k
    active = jnp.asarray(active_table)[slot, index]
    loss, proposal, message, due = local_step(
        worker, batch, worker_key(key, shared.step, axis_name))
    due = jnp.logical_and(due, active)
    messages = _gather(message, index, p, axis_name)
    all_due = _gather(due.astype(jnp.int32), index, p, axis_name) > 0
    order = exchange_order(schedule, key, tick)
    (center, master, history, clock), replies = serve(shared, messages, all_due,
                                                      order)
    reply = _tree_index(replies, jnp.argmax(order == index))
    new = finish(worker, proposal, reply, due)
    new = tree_where(active, new._replace(clock=worker.clock + 1), worker)
    return (new, AsyncShared(center, master, history, clock, shared.step + 1),
            loss)

  return Algorithm(
      name=name, init=init, step=step, center=center,
      worker_params=lambda worker, shared: worker.params,
      communication=communication,
      hyperparameters=dict(hyperparameters, schedule=schedule.order,
                           worker_speeds=list(schedule.worker_speeds),
                           staleness=schedule.staleness,
                           slots_per_tick=schedule.slots_per_tick))


def mean_exchanges(schedule: ExchangeSchedule, num_steps: int, tau: int,
                   at_start: bool) -> int:
  """Exchanges per worker over ``num_steps`` trainer steps, mean over workers.

  ``at_start``: exchanges at local clocks t with tau | t (t = 0 included,
  Algorithm 1); else after every tau local steps (DOWNPOUR). Rounded to the
  nearest integer.
  """
  n = local_steps_done(schedule, num_steps)
  counts = -(-n // tau) if at_start else n // tau
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
  optimizer = _local_optimizer(optimizer, learning_rate)
  schedule = _resolve_schedule(schedule, num_workers)

  def local_step(worker, batch, key):
    due = elastic.is_exchange_step(worker.clock, tau)
    opt_state = worker.opt_state
    if reset_opt_state:
      opt_state = reset_optimizer_state(optimizer, opt_state, worker.params, due)
    if momentum is None:
      loss, grads = jax.value_and_grad(loss_fn)(worker.params, batch, key)
      step, opt_state = optimizer.update(grads, opt_state, worker.params)
    else:
      loss, step, opt_state = momentum_lib.nesterov_velocity(
          loss_fn, optimizer, momentum, worker.params, worker.buffer, opt_state,
          batch, key)
    return loss, (step, opt_state), worker.params, due

  def master_rule(center, master, x, read, clock):
    del clock
    diff = elastic.elastic_difference(x, read, alpha)  # alpha (x - x~_read)
    return elastic.tree_add(center, diff), master, diff

  def finish(worker, proposal, diff, exchanged):
    del exchanged  # diff is zero when the worker did not exchange
    step, opt_state = proposal
    params = elastic.tree_add(elastic.tree_sub(worker.params, diff), step)
    return worker._replace(params=params, opt_state=opt_state,
                           buffer=() if momentum is None else step)

  def communication(num_steps, param_bytes):
    n = mean_exchanges(schedule, num_steps, tau, at_start=True)
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
      hyperparameters=hyper, axis_name=axis_name)


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
  gives :func:`async_easgd`.

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
  """
  return _async_elastic("async_eamsgd", loss_fn, optimizer, num_workers=num_workers,
                        tau=tau, alpha=alpha, beta=beta, learning_rate=learning_rate,
                        schedule=schedule,
                        momentum=momentum_lib.check_momentum(momentum),
                        reset_opt_state=reset_opt_state, axis_name=axis_name)


def async_push(name: str, loss_fn: LossFn, optimizer: optax.GradientTransformation,
               *, num_workers: int, tau: int, schedule: ExchangeSchedule | None,
               master_rule: MasterRule, init_master: Callable, center: Callable,
               hyperparameters: dict, axis_name=WORKER_AXES) -> Algorithm:
  """A DOWNPOUR-type method on the simulated asynchronous engine.

  Each local step of worker i:

      u = optimizer step at x^i (SGD: -eta g^i(x^i));  x^i <- x^i + u;
      acc^i <- acc^i + u;  t^i <- t^i + 1
      if tau divides t^i:   (served one worker at a time)
        the master applies ``master_rule`` to acc^i (DOWNPOUR: x~ <- x~ + acc^i),
        x^i <- the center fetched after the update (``staleness`` late), acc^i <- 0

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
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.algorithms.Algorithm`; ``communication`` counts pushes
    (each sends one parameter-sized update and receives the center).
  """
  tau = elastic.check_tau(tau)
  schedule = _resolve_schedule(schedule, num_workers)

  def local_step(worker, batch, key):
    loss, grads = jax.value_and_grad(loss_fn)(worker.params, batch, key)
    step, opt_state = optimizer.update(grads, worker.opt_state, worker.params)
    params = optax.apply_updates(worker.params, step)
    acc = elastic.tree_add(worker.buffer, step)
    due = (worker.clock + 1) % tau == 0
    return loss, (params, acc, opt_state), acc, due

  def finish(worker, proposal, fetched, exchanged):
    params, acc, opt_state = proposal
    return worker._replace(
        params=tree_where(exchanged, fetched, params),
        buffer=tree_where(exchanged, tree_zeros_like(acc), acc),
        opt_state=opt_state)

  def communication(num_steps, param_bytes):
    n = mean_exchanges(schedule, num_steps, tau, at_start=False)
    return Communication(n, n * int(param_bytes))

  return simulate(
      name, schedule=schedule, local_step=local_step, master_rule=master_rule,
      finish=finish, init_buffer=lambda params: tree_zeros_like(params),
      init_opt_state=optimizer.init, init_master=init_master, center=center,
      communication=communication,
      hyperparameters=dict(hyperparameters, num_workers=int(num_workers), tau=tau),
      axis_name=axis_name)
