"""The scheduler of a real asynchronous run: budgets, boundaries, faults.

A real run (``easgd.runtimes.threads``, ``easgd.runtimes.ray_actors``) has a budget of
local steps summed over all workers: the same number of gradient evaluations
as the synchronous run of the same config (``total_steps * num_workers``), but
no worker waits for another, so a fast worker takes more of the budget than a
slow one. The :class:`Driver` hands each worker chunks of a few local steps at
a time (a worker always has one chunk in flight while budget remains) and
stops handing out steps at a boundary (an evaluation, a checkpoint, the end),
where every worker is idle and the state is consistent: every exchange the
center has applied is in its worker's state, and vice versa.

Chunk sizes: at most ``chunk_steps``; near a boundary the remaining steps are
shared in proportion to each worker's measured speed, so that the workers
reach the boundary at about the same time.

Faults. A worker whose chunk raises (``ChunkResult.error``) or whose process
dies (the backend raises :class:`WorkerLost`) is reported (:class:`Fault`)
and its unused steps go back to the budget. A backend that can restart
workers (``Backend.restartable``, Ray) restarts it from the current center at
most ``max_restarts`` times; otherwise (threads) the worker stays stopped and
the others finish the budget. If every worker has stopped before the budget
is spent, :class:`WorkersLostError` is raised. Each fault is logged with its
error (``Backend.fault``), so a run resumed from its log goes on with the
faults of the checkpoint (:func:`logged_faults`): a stopped worker stays
stopped, and restarts count over the whole run. Each fault, and each worker
a resumed run goes on without, is one :class:`WorkerFaultWarning`.

An error of the user's data or task (``ChunkResult.user_error``, the
exceptions of ``AsyncSetup.user_errors``) is not a fault: no more steps are
handed out, the chunks in flight end, and ``run_to`` raises
``easgd.runtimes.shared.UserFault`` with its one line.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np

from easgd.runtimes.shared import ChunkResult, UserFault


class WorkerLost(RuntimeError):
  """A worker's process died while running a chunk (raised by a backend)."""


class WorkersLostError(RuntimeError):
  """Every worker of a real asynchronous run stopped before its budget was spent."""


class WorkerFaultWarning(RuntimeWarning):
  """A worker of a real asynchronous run failed (restarted or stopped), or a
  resumed run goes on without a worker its log records as stopped (one line;
  ``easgd train`` prints it on stderr)."""


class Fault(NamedTuple):
  """A worker's fault, as reported in metrics and the summary.

  Attributes:
    worker: the worker's index.
    local_step: its clock when it stopped (the step it did not complete).
    error: one line: the exception, or the lost process.
    restarted_at: the local clock it restarted from (from the current center),
      or None if it was not restarted.
  """

  worker: int
  local_step: int
  error: str
  restarted_at: int | None


class Backend(Protocol):
  """What the :class:`Driver` and ``easgd.runtimes.async_runs.AsyncExecutor``
  call on a runtime's workers (``ThreadBackend``, ``RayBackend``).

  Built by the executor from its row of ``easgd.settings.runtime_table`` as
  ``Backend(setup, p, *, devices, delays_s, workers, shared, log, elapsed_s)``
  (workers in this process; ``devices``: one per worker), or with
  ``factory() -> AsyncSetup`` (picklable) in place of ``setup`` and no
  ``devices`` when each worker builds the run in a process of its own.

  Attributes:
    num_workers: p.
    restartable: whether :meth:`restart` is available.
  """

  num_workers: int
  restartable: bool

  def submit(self, worker: int, num_steps: int) -> Any:
    """Starts ``WorkerLoop.run(num_steps)`` on the worker; returns a handle."""

  def wait(self, handles: Sequence[Any]) -> Sequence[Any]:
    """Blocks until at least one handle is done; returns the done ones."""

  def result(self, handle: Any) -> ChunkResult:
    """The chunk's result; raises :class:`WorkerLost` if the process died."""

  def fault(self, worker: int, clock: int, error: str) -> int:
    """Logs the worker's fault (and ``error``, one line) in the exchange log;
    ``clock`` is the last clock the driver knows. Returns the clock the worker
    is known to have reached (after its last exchange, if that is later)."""

  def restart(self, worker: int, clock: int) -> int:
    """Restarts the worker from the current center, at clock >= ``clock``
    (after its last exchange); returns the clock it goes on from."""

  def warm_up(self) -> None:
    """Compiles every program of every worker and the center, then starts the
    run's clock; raises ``easgd.runtimes.shared.UserFault`` (the user's data)."""

  def arm_fault(self, worker: int, clock: int) -> None:
    """Makes ``worker`` fail before its local step ``clock`` (tests, experiments)."""

  def state(self) -> tuple[list, Any, list[dict]]:
    """``(worker states, master state, exchange log)`` as host values; call when idle."""

  def in_flight(self) -> list[tuple[int, Any]]:
    """Each worker's exchange in flight (overlap, ``delay`` V >= 1), ``(apply_at,
    reply)`` as host values, ``(-1, None)`` for none; call when idle. A backend
    whose runtime does not read ``delay`` has none."""

  def close(self) -> None:
    """Stops the workers and frees what the backend holds."""


def logged_faults(log) -> list[Fault]:
  """The faults an exchange log records, each with the restart that followed it.

  Args:
    log: the records of a real run's exchange log (``easgd.runtimes.shared``):
      a ``"fault"`` record (with its ``error``, if logged) and the worker's
      next ``"restart"`` record, if any, make one fault.

  Returns:
    The :class:`Fault` s in log order; ``restarted_at`` is the restart's
    local step, None for a worker that stayed stopped.
  """
  faults, open_faults = [], {}
  for r in log:
    event, worker = r.get("event", "exchange"), r.get("worker")
    if event == "fault":
      open_faults[worker] = len(faults)
      faults.append(
          Fault(int(worker), int(r["local_step"]), str(r.get("error", "(not logged)")), None)
      )
    elif event == "restart" and worker in open_faults:
      k = open_faults.pop(worker)
      faults[k] = faults[k]._replace(restarted_at=int(r["local_step"]))
  return faults


def stopped_workers(faults: Sequence[Fault]) -> list[int]:
  """The workers whose last fault was not followed by a restart, ascending."""
  last = {f.worker: f.restarted_at for f in faults}
  return sorted(w for w, restarted in last.items() if restarted is None)


class Driver:
  """Hands out local steps to the workers of a backend up to boundaries.

  Args:
    backend: a :class:`Backend`.
    clocks: each worker's local clock now (0, or a checkpoint's).
    chunk_steps: the most local steps handed out at once.
    max_restarts: restarts per worker on a restartable backend.
    on_progress: ``on_progress(total_local_steps)`` after each chunk.
    faults: the faults so far (a resumed run: :func:`logged_faults` of its
      log): their stopped workers take no steps, their restarts count
      towards ``max_restarts``.

  Attributes:
    clocks: each worker's local clock.
    alive: whether each worker still takes steps.
    faults: the :class:`Fault` s so far.
    loss_sum, loss_count: float64 / int64 [p]: losses since the last
      :meth:`take_losses`.
    nonfinite: None, or the first non-finite loss ``(worker, clock, value)``.
  """

  def __init__(
      self,
      backend: Backend,
      clocks: Sequence[int],
      *,
      chunk_steps: int = 8,
      max_restarts: int = 3,
      on_progress: Callable[[int], None] | None = None,
      faults: Sequence[Fault] = (),
  ):
    p = backend.num_workers
    self.backend = backend
    self.clocks = [int(c) for c in clocks]
    self.faults: list[Fault] = list(faults)
    self.restarts = [
        sum(f.worker == i and f.restarted_at is not None for f in faults) for i in range(p)
    ]
    stopped = stopped_workers(self.faults)
    self.alive = [i not in stopped for i in range(p)]
    self.chunk_steps = max(1, int(chunk_steps))
    self.max_restarts = int(max_restarts)
    self.on_progress = on_progress
    self.rates = [None] * p  # local steps per second, measured
    self.chunks = [0] * p
    self.loss_sum = np.zeros(p, np.float64)
    self.loss_count = np.zeros(p, np.int64)
    self.nonfinite = None
    self.user_error = None  # the first ChunkResult.user_error
    for w in stopped:  # a resumed run: said once more, it goes on without them
      f = [f for f in self.faults if f.worker == w][-1]
      warnings.warn(
          f"worker {w} stays stopped (its fault at local step {f.local_step}: {f.error}); "
          "the other workers take its share of the steps",
          WorkerFaultWarning,
          stacklevel=2,
      )

  @property
  def total(self) -> int:
    """Local steps done, summed over workers."""
    return sum(self.clocks)

  def take_losses(self) -> tuple[np.ndarray, np.ndarray]:
    """``(loss_sum, loss_count)`` since the last call, and resets them."""
    out = (self.loss_sum.copy(), self.loss_count.copy())
    self.loss_sum[:] = 0
    self.loss_count[:] = 0
    return out

  def _chunk_for(self, worker: int, remaining: int) -> int:
    """At most ``chunk_steps``, and the worker's share of the unclaimed steps:
    in proportion to its measured speed (equal shares until all are measured)."""
    alive = sum(self.alive)
    rates = [r for r, a in zip(self.rates, self.alive) if a and r]
    if self.rates[worker] and len(rates) == alive:
      share = remaining * self.rates[worker] / sum(rates)
    else:
      share = remaining / alive
    return max(1, min(self.chunk_steps, math.ceil(share), remaining))

  def run_to(self, target: int, while_running: Callable[[], None] | None = None) -> None:
    """Runs the workers until their clocks sum to ``target``; then all are idle.

    Args:
      target: total local steps (summed over workers) at the boundary.
      while_running: called once on this thread after the first chunks are
        handed out (e.g. to save a checkpoint and evaluate the previous
        boundary's state while the workers run).

    Raises:
      WorkersLostError: every worker stopped before the clocks reached
        ``target`` (names the faults).
      easgd.runtimes.shared.UserFault: a worker met an error of the user's
        data or task (``ChunkResult.user_error``); raised once every chunk in
        flight has ended.
    """
    pending = {}  # handle -> (worker, clock at its start, steps)
    busy = set()

    def fill():
      if self.user_error is not None:
        return  # the run stops on the user's error
      for i in range(self.backend.num_workers):
        remaining = target - self.total - sum(n for _, _, n in pending.values())
        if remaining <= 0:
          return
        if self.alive[i] and i not in busy:
          n = self._chunk_for(i, remaining)
          pending[self.backend.submit(i, n)] = (i, self.clocks[i], n)
          busy.add(i)

    def drain(refill):
      while pending:
        for handle in self.backend.wait(list(pending)):
          i, start, _ = pending.pop(handle)
          busy.discard(i)
          self._collect(handle, i, start)
        refill()

    fill()
    try:
      if while_running is not None:
        while_running()
    except BaseException:
      drain(lambda: None)  # no new steps; the chunks in flight end
      raise
    drain(fill)
    if self.user_error is not None:
      raise UserFault(self.user_error)
    if self.total < target:
      raise WorkersLostError(
          f"every worker stopped with {target - self.total} of the run's local steps "
          f"left; faults: "
          + "; ".join(
              f"worker {f.worker} at local step {f.local_step}: {f.error}" for f in self.faults
          )
      )

  def _collect(self, handle, i: int, start: int) -> None:
    try:
      res = self.backend.result(handle)
    except WorkerLost as e:
      self._fault(i, self.clocks[i], str(e))
      return
    losses = np.asarray(res.losses, np.float64)
    self.clocks[i] = int(res.clock)
    if len(losses):
      self.loss_sum[i] += losses.sum()
      self.loss_count[i] += len(losses)
      bad = np.flatnonzero(~np.isfinite(losses))
      if bad.size and self.nonfinite is None:
        self.nonfinite = (i, start + int(bad[0]), float(losses[bad[0]]))
      self.chunks[i] += 1
      if res.seconds > 0 and self.chunks[i] > 1:  # the first chunk compiles
        rate = len(losses) / res.seconds
        self.rates[i] = rate if self.rates[i] is None else 0.5 * (self.rates[i] + rate)
    if res.user_error is not None and self.user_error is None:
      self.user_error = res.user_error
    if res.error is not None:
      self._fault(i, self.clocks[i], res.error)
    if self.on_progress is not None:
      self.on_progress(self.total)

  def _fault(self, i: int, clock: int, error: str) -> None:
    clock = self.backend.fault(i, clock, error)
    restarted = None
    if self.backend.restartable and self.restarts[i] < self.max_restarts:
      try:
        restarted = self.backend.restart(i, clock)
      except WorkerLost as e:
        error = f"{error}; restart failed: {e}"
    if restarted is None:
      self.alive[i] = False
      outcome = "it stays stopped, the other workers take its share of the steps"
    else:
      self.restarts[i] += 1
      self.clocks[i] = int(restarted)
      outcome = f"restarted from the center at local step {restarted}"
    self.faults.append(Fault(i, int(clock), error, restarted))
    warnings.warn(
        f"worker {i} failed at local step {clock} ({error}); {outcome}",
        WorkerFaultWarning,
        stacklevel=2,
    )
