"""The events of an asynchronous run: its exchange log, and its replay.

An exchange log lists every exchange a run served, in serving order: the
worker, its local clock, the center version it read (:data:`EXCHANGE_RECORD`).
:func:`exchange_log` computes the log of a simulated run on the host from the
same schedule helpers the device program uses; the real runtimes
(``easgd.runtimes.shared``) record theirs as they run. :func:`replay` runs an
algorithm's own rules (``Algorithm.async_rules``) one event at a time in the
order a log gives (the deterministic simulator with the exchange order made
explicit), so any run can be checked against its log.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Algorithms 1 and 2.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from optax.tree_utils import tree_zeros_like

from easgd._util import checks
from easgd.asynchrony.schedule import (
    ExchangeSchedule,
    exchange_order,
    exchange_schedule,
    push_offset,
    served_order,
    slot_table,
)
from easgd.asynchrony.simulator import AsyncRules, AsyncShared, AsyncWorker
from easgd.core import elastic
from easgd.core.base import Algorithm, every_tau_steps

Params = Any


# --------------------------------------------------------------------------
# The realised exchange sequence of a run.
# --------------------------------------------------------------------------


EXCHANGE_RECORD = np.dtype(
    [
        ("slot", np.int64),
        ("tick", np.int64),
        ("time", np.float64),
        ("worker", np.int32),
        ("local_step", np.int64),
        ("version", np.int64),
        ("read_version", np.int64),
    ]
)
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


def _exchange_records(
    schedule: ExchangeSchedule,
    key,
    num_steps: int,
    *,
    tau: int,
    exchange_at: str,
    offset: int,
    ticks_per_chunk: int = 4096,
) -> np.ndarray:
  """:data:`EXCHANGE_RECORD` array of the first ``num_steps`` slots (see exchange_log)."""
  table = slot_table(schedule.worker_speeds, exchange_at)
  due_at = every_tau_steps(tau, offset)
  big_k, s = schedule.slots_per_tick, schedule.staleness
  speeds = np.asarray(schedule.worker_speeds, np.int64)
  before = np.cumsum(table.active, 0) - table.active  # [K, p] steps earlier in the tick
  time_in_tick = np.array([[float(t) if t is not None else 0.0 for t in row] for row in table.time])
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
    keep = (
        table.active[slot_in_tick, served]
        & np.asarray(due_at(clock), bool)
        & (slot < int(num_steps))
    )
    chunks.append(np.stack([a[keep] for a in (slot, tick, served, clock, slot_in_tick)], axis=1))
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
  :func:`served_order`, ``easgd.core.base.every_tau_steps``), without
  running the model. The device's ``shared.master_clock`` after
  ``num_steps`` steps equals ``len(exchange_log(...))``.

  Args:
    algorithm: an algorithm of this module or of ``easgd.methods.baselines``' DOWNPOUR
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
    raise ValueError(
        f"algorithm {algorithm.name!r} has no simulated exchange "
        f"schedule (not easgd.asynchrony.simulation)"
    )
  checks.integer("num_steps", num_steps, 0)
  schedule = exchange_schedule(
      len(hyper["worker_speeds"]),
      hyper["exchange_order"],
      hyper["worker_speeds"],
      hyper["staleness"],
  )
  offset = push_offset(hyper["push_timing"]) if hyper["exchange_at"] == "step_end" else 0
  return _exchange_records(
      schedule, key, num_steps, tau=hyper["tau"], exchange_at=hyper["exchange_at"], offset=offset
  )


def write_exchange_log(path, algorithm: Algorithm, key: jax.Array, num_steps: int) -> int:
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
  from easgd._util.files import json_text, write_text_atomic  # atomic: keeps the old file

  records = exchange_log(algorithm, key, num_steps)
  names = EXCHANGE_RECORD.names
  write_text_atomic(
      path, "".join(json_text(dict(zip(names, record))) + "\n" for record in records.tolist())
  )
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
    algorithm: an algorithm of this module or of ``easgd.methods.baselines``' DOWNPOUR
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
        f"EAMSGD, the DOWNPOUR family) run outside the SPMD program"
    )
  return rules


def overlap_of(rules: AsyncRules) -> int:
  """The overlap V of an asynchronous method's exchanges (``delay``; 0: none).

  With V >= 1 (async EASGD/EAMSGD, ``easgd.asynchrony.simulation.async_easgd``)
  the step at an exchange clock s finishes with a zero reply, and the step at
  s + V with the reply the master gave at s.

  Args:
    rules: the method's rules (their ``hyperparameters["delay"]``, absent: 0).

  Returns:
    V, an int >= 0.
  """
  return int(rules.hyperparameters.get("delay", 0))


def local_key(key: jax.Array, worker, clock) -> jax.Array:
  """The key of worker ``worker``'s local step at clock ``clock``.

  ``fold_in(fold_in(key, clock), worker)``: the same construction as
  ``easgd.core.base.worker_key`` with the worker's own clock in place of the
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
  return AsyncWorker(
      params, rules.init_opt_state(params), rules.init_buffer(params), jnp.asarray(clock, jnp.int32)
  )


def restart_worker(rules: AsyncRules, center: Params, like: Params, clock) -> AsyncWorker:
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
  return AsyncShared(
      center, rules.init_master(center), (), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)
  )


class RulePrograms:
  """The per-event functions of an asynchronous method, uncompiled.

  One local step of worker i at its clock t is, without an exchange,
  ``local``; with one (``rules.due(t)``), ``propose`` on the worker, ``serve``
  on the master (atomic: nothing else touches the master in between) and
  ``finish`` on the worker. These are :func:`simulate`'s rules for one worker
  and one exchange; the key of the step is :func:`local_key` of the worker's
  clock. :func:`replay` calls them in the log's order; the real runtimes
  compile the same functions (``easgd.runtimes.shared.WorkerPrograms``), and a
  replay given those compiled programs repeats a run bit for bit.

  Args:
    rules: the method's :class:`AsyncRules`.
  """

  def __init__(self, rules: AsyncRules):
    self.rules = rules

  def local(
      self, worker: AsyncWorker, batch, key: jax.Array, index
  ) -> tuple[AsyncWorker, jax.Array]:
    """A local step without exchange: ``(worker after the step, its loss)``."""
    loss, proposal, _, _ = self.rules.local_step(worker, batch, local_key(key, index, worker.clock))
    none = tree_zeros_like(elastic.to_reduction_dtype(worker.params))
    new = self.rules.finish(worker, proposal, none, False)
    return new._replace(clock=worker.clock + 1), loss

  def propose(self, worker: AsyncWorker, batch, key: jax.Array, index):
    """The worker's half of an exchange step: ``(loss, proposal, message)``.

    The message is in ``easgd.core.elastic.reduction_dtype`` (float32 for bfloat16
    parameters), as the simulation's master receives it.
    """
    loss, proposal, message, _ = self.rules.local_step(
        worker, batch, local_key(key, index, worker.clock)
    )
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
        shared.center, shared.master, message, read, shared.master_clock
    )
    new = shared._replace(center=center, master=master, master_clock=shared.master_clock + 1)
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
    in_flight: per worker, None or ``(s + V, reply)``: the reply of its last
      exchange, not applied by its final clock (overlap V >= 1); () without.
  """

  workers: list
  shared: AsyncShared
  centers: list | None
  in_flight: list | tuple = ()


def _log_record(record) -> dict:
  if isinstance(record, dict):
    r = dict(record)
  else:  # a row of exchange_log's structured array
    r = {name: record[name].item() for name in record.dtype.names}
  r.setdefault("event", "exchange")
  if r["event"] not in LOG_EVENTS:
    raise ValueError(f"unknown log event {r['event']!r}; allowed: {', '.join(LOG_EVENTS)}")
  return r


def _center_needed(record: dict, step_end: bool) -> int | None:
  """The center version a log record reads in a replay (None: a fault, none).

  A restart reads its ``read_version``; an exchange serves against the center
  before its update: ``read_version`` (EASGD, EAMSGD), or one version before
  the fetch it reads (DOWNPOUR family, ``step_end``; at least 0).
  """
  if record["event"] == "restart":
    return record["read_version"]
  if record["event"] == "fault":
    return None
  return max(record["read_version"] - 1, 0) if step_end else record["read_version"]


def _oldest_needed(records: list, step_end: bool) -> list:
  """Entry k: the oldest center version records k, k+1, ... read (None: none).

  Has ``len(records) + 1`` entries (the last None), so a replay can drop every
  older center after it served record k - 1.
  """
  oldest, low = [0] * (len(records) + 1), None
  oldest[-1] = None
  for k in range(len(records) - 1, -1, -1):
    n = _center_needed(records[k], step_end)
    low = n if low is None else (low if n is None else min(low, n))
    oldest[k] = low
  return oldest


class _Replay:
  """The state of a :func:`replay` in progress: workers, clocks, master, centers.

  ``centers`` maps a master version v to the center after v updates (only the
  versions records still to come may read); ``history`` every center, with
  ``keep_centers``.
  """

  def __init__(
      self,
      rules: AsyncRules,
      programs,
      params: Params,
      batch_fn: Callable,
      key: jax.Array,
      p: int,
      keep_centers: bool,
  ):
    self.rules, self.programs, self.params = rules, programs, params
    self.batch_fn, self.key, self.p = batch_fn, key, p
    self.step_end = rules.exchange_at == "step_end"
    self.overlap = overlap_of(rules)
    self.in_flight = [None] * p  # (clock s + V, reply) of each worker's exchange in flight
    self.shared = init_shared(rules, params)
    self.workers = [init_worker(rules, params) for _ in range(p)]
    self.clocks = [0] * p
    self.index = [np.int32(i) for i in range(p)]
    self.centers = {0: self.shared.center}
    self.history = [self.shared.center] if keep_centers else None
    self.version = 0

  def advance(self, i: int, until: int) -> None:
    """Worker i's local steps up to clock ``until`` (raises at a due exchange); the
    step at s + V applies the reply in flight (overlap)."""
    while self.clocks[i] < until:
      t = self.clocks[i]
      if bool(self.rules.due(t)):
        raise ValueError(
            f"the log lacks worker {i}'s exchange at its local step "
            f"{t} (due by the method's schedule)"
        )
      batch = self.batch_fn(i, t)
      if self.in_flight[i] is not None and self.in_flight[i][0] == t:
        _, proposal, _ = self.programs.propose(self.workers[i], batch, self.key, self.index[i])
        self.workers[i] = self.programs.finish(self.workers[i], proposal, self.in_flight[i][1])
        self.in_flight[i] = None
      else:
        self.workers[i], _ = self.programs.local(self.workers[i], batch, self.key, self.index[i])
      self.clocks[i] += 1

  def restart(self, k: int, r: dict) -> None:
    """Log record k, a restart: the worker restarts from the current center."""
    i, t = int(r["worker"]), int(r["local_step"])
    if r["read_version"] != self.version:
      raise ValueError(
          f"log record {k}: a restart reads the center after "
          f"{r['read_version']} updates, but {self.version} were served"
      )
    self.workers[i] = restart_worker(self.rules, self.centers[self.version], self.params, t)
    self.clocks[i] = t
    self.in_flight[i] = None  # a restart drops the reply not yet applied

  def exchange(self, k: int, r: dict) -> None:
    """Log record k, an exchange: local steps up to it, then propose, serve, finish."""
    i, t = int(r["worker"]), int(r["local_step"])
    version, step_end = self.version, self.step_end
    if r["version"] != version:
      raise ValueError(
          f"log record {k} has version {r['version']}; expected "
          f"{version} (records must be in serving order)"
      )
    if not 0 <= r["read_version"] <= version + step_end:
      raise ValueError(
          f"log record {k} reads center version {r['read_version']} " f"at master update {version}"
      )
    self.advance(i, t)
    if self.clocks[i] != t or not bool(self.rules.due(t)):
      raise ValueError(
          f"log record {k}: worker {i} exchanges at local step {t}, "
          f"which is not due or already passed (its clock is "
          f"{self.clocks[i]})"
      )
    _, proposal, message = self.programs.propose(
        self.workers[i], self.batch_fn(i, t), self.key, self.index[i]
    )
    self.shared, reply = self.programs.serve(
        self.shared, message, self.centers[_center_needed(r, step_end)]
    )
    self.version += 1
    self.centers[self.version] = self.shared.center
    if self.history is not None:
      self.history.append(self.shared.center)
    if step_end and r["read_version"] != self.version:
      reply = self.centers[r["read_version"]]  # a stale fetch (simulated staleness)
    if self.overlap:  # x^i_{s+1} = x^i_s + u_s; the reply is applied at s + V
      self.in_flight[i] = (t + self.overlap, reply)
      reply = tree_zeros_like(message)
    self.workers[i] = self.programs.finish(self.workers[i], proposal, reply)
    self.clocks[i] += 1

  def forget_centers_before(self, oldest: int | None) -> None:
    """Drops the centers older than ``oldest`` (and than the current version)."""
    keep = self.version if oldest is None else min(oldest, self.version)
    for v in [v for v in self.centers if v < keep]:
      del self.centers[v]


def replay(
    algorithm: Algorithm,
    log,
    params: Params,
    batch_fn: Callable,
    key: jax.Array,
    final_clocks: Sequence[int],
    *,
    programs=None,
    keep_centers: bool = False,
) -> Replayed:
  """Runs an asynchronous method's rules in the exchange order of a log.

  This is the simulator with the exchange order made explicit: every worker
  starts from ``params``; the records are taken in order; for an exchange of
  worker i at its local step t, the worker first takes its local steps up to
  t (``programs.local``: each depends on the worker's own state only, so
  their order relative to other workers does not matter), then the exchange
  step (``propose``, ``serve`` reading the center after ``read_version``
  master updates, ``finish``). A restart resets the worker to the center
  (:func:`restart_worker`). At the end every worker takes its remaining
  local steps up to ``final_clocks``. With overlap V >= 1 (the algorithm's
  ``hyperparameters["delay"]``, :func:`overlap_of`) the exchange step at s
  finishes with a zero reply and worker i's step at s + V (taken when it
  advances past it) with the reply: x^i_{s+V+1} = (x^i_{s+V} - d) + u_{s+V}. A
  reply whose step s + V is at or past the worker's final clock is not applied
  (returned in ``in_flight``). The log may come from a real run
  (``easgd.runtimes.shared``, read versions of an atomic exchange) or from
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
      (``easgd.runtimes.shared.WorkerPrograms``) to repeat it bit for bit.
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
  run = _Replay(rules, programs, params, batch_fn, key, len(final_clocks), keep_centers)
  oldest_needed = _oldest_needed(records, run.step_end)
  for k, r in enumerate(records):
    i = int(r["worker"])
    if not 0 <= i < run.p:
      raise ValueError(f"log record {k} names worker {i}; the run has {run.p} workers")
    if r["event"] == "fault":
      continue
    if r["event"] == "restart":
      run.restart(k, r)
    else:
      run.exchange(k, r)
    run.forget_centers_before(oldest_needed[k + 1])
  for i in range(run.p):
    run.advance(i, int(final_clocks[i]))
  return Replayed(run.workers, run.shared, run.history, run.in_flight if run.overlap else ())
