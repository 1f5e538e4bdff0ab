"""The time model of the simulated asynchronous methods: ticks, slots, speeds, orders.

Builds and checks the schedules (:class:`ExchangeSchedule`, :func:`exchange_schedule`,
the worker speeds), the slot tables, the exchange orders, the DOWNPOUR push timings and
the exchange counts; the model itself (what is and is not modelled) is in
docs/guides/algorithms.md ("Simulated asynchrony").

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Algorithms 1 and 2.
  The authors' code: github.com/sixin-zh/mpiT (commit c359666),
  ``asyncsgd/optim-downpour.lua`` (the push rule).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from easgd._util import checks
from easgd.asynchrony.names import EXCHANGE_ORDERS, PUSH_TIMINGS  # re-exported
from easgd.core import elastic

Params = Any


ORDER_STREAM = 0x7FFFFFFF
"""``fold_in`` index of the exchange-order key: a step count never reaches it,
so it never coincides with the ``fold_in(key, step)`` of ``worker_key``."""


class ExchangeSchedule(NamedTuple):
  """When and in which order the workers exchange with the center.

  Attributes:
    order: "round_robin" or "random" (module docstring), or an int32 JAX array
      holding the index of one of them in :data:`EXCHANGE_ORDERS` (traced per
      configuration: :func:`exchange_order`).
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


def exchange_schedule(
    num_workers: int,
    order: str = "round_robin",
    worker_speeds: Sequence[int] | None = None,
    staleness: int = 0,
) -> ExchangeSchedule:
  """Validates and builds an :class:`ExchangeSchedule`.

  Args:
    num_workers: number of workers p, >= 1.
    order: "round_robin" (workers 0..p-1 every tick) or "random" (a fresh
      permutation per tick); or an int32 JAX array (a tracer included) holding
      the index of one of them in :data:`EXCHANGE_ORDERS`, taken unchecked
      (``easgd.core.elastic.is_array_hyperparameter``), so that configurations
      of both orders run in one program.
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
  error = elastic.HyperparameterError
  checks.integer("num_workers", num_workers, 1, error=error)
  if not elastic.is_array_hyperparameter(order):
    checks.choice("exchange order", order, EXCHANGE_ORDERS, error=error)
  if worker_speeds is None or len(worker_speeds) == 0:
    worker_speeds = (1,) * num_workers
  if len(worker_speeds) != num_workers:
    raise elastic.HyperparameterError(
        f"worker_speeds has {len(worker_speeds)} entries, expected one per "
        f"worker (num_workers={num_workers})"
    )
  speeds = []
  for i, k in enumerate(worker_speeds):  # an integral float such as 2.0 is 2
    if checks.is_python_number(k) and float(k).is_integer():
      k = int(k)
    speeds.append(
        checks.integer(f"worker_speeds[{i}]", k, 1, error=error, what="local steps per tick")
    )
  staleness = checks.integer("staleness", staleness, 0, error=error, what="in master updates")
  return ExchangeSchedule(order, tuple(speeds), staleness)


def draw_worker_speeds(num_workers: int, max_speed: int, seed: int) -> tuple[int, ...]:
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
  checks.integer("max_worker_speed", max_speed, 1, error=elastic.HyperparameterError)
  rng = np.random.default_rng((int(seed), 1))
  return tuple(int(k) for k in rng.integers(1, max_speed + 1, size=num_workers))


def resolve_worker_speeds(
    num_workers: int,
    worker_speeds: Sequence[float] = (),
    max_worker_speed: int | None = None,
    seed: int = 0,
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
        f"unknown exchange_at {exchange_at!r}; allowed: {', '.join(EXCHANGE_POINTS)}"
    )
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


def slot_table(worker_speeds: Sequence[int], exchange_at: str = "step_start") -> SlotTable:
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


def local_steps_done(
    schedule: ExchangeSchedule, num_steps: int, exchange_at: str = "step_start"
) -> np.ndarray:
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
    schedule: the schedule; its ``order`` a name, or an array holding its
      index in :data:`EXCHANGE_ORDERS` (traced: both orders are computed and
      the one it names selected, the same integers as with the name).
    key: the run's base key (the ``key`` given to ``Algorithm.step``).
    tick: the tick (int or traced int32 scalar).

  Returns:
    ``arange(p)`` for "round_robin"; for "random" the permutation
    ``jax.random.permutation(fold_in(fold_in(key, ORDER_STREAM), tick), p)``.
  """
  p = schedule.num_workers
  in_turn = jnp.arange(p, dtype=jnp.int32)
  if isinstance(schedule.order, str) and schedule.order == "round_robin":
    return in_turn
  order_key = jax.random.fold_in(jax.random.fold_in(key, ORDER_STREAM), tick)
  drawn = jax.random.permutation(order_key, p).astype(jnp.int32)
  if isinstance(schedule.order, str):
    return drawn
  return jnp.where(schedule.order == EXCHANGE_ORDERS.index("random"), drawn, in_turn)


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


def mean_exchanges(
    schedule: ExchangeSchedule,
    num_steps: int,
    tau: int,
    exchange_at: str = "step_start",
    offset: int = 0,
) -> int:
  """Exchanges per worker over ``num_steps`` trainer steps, mean over workers.

  A worker's local step with clock t exchanges when tau divides t + offset
  (``easgd.core.base.every_tau_steps``): offset 0 gives t = 0, tau, 2 tau,
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
        f"unknown push_timing {push_timing!r}; allowed: {', '.join(PUSH_TIMINGS)}"
    )
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
