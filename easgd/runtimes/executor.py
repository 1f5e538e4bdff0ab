"""The contract between the one training loop and a runtime: :class:`Executor`.

``easgd.run.trainer.train_and_evaluate`` owns the run directory (lock,
checks, resume), the checkpoint layout, the evaluation, the metrics, the
summary and the divergence checks. A runtime supplies only how steps are
executed, as an :class:`Executor`:

  ``easgd.runtimes.spmd.SpmdExecutor``        runtime "spmd": one mapped program;
  ``easgd.runtimes.async_runs.AsyncExecutor`` runtimes "threads" and "ray":
                                               real asynchronous workers.

The loop asks for the state at each boundary (an epoch end, a checkpoint, the
end) as a :class:`Snapshot`, checks it, and writes the boundary's files
(record, exchange log, checkpoint) in the next ``run_to``'s ``while_running``,
so a runtime whose workers run on (threads, Ray) overlaps them with the
training, and one that does not (SPMD) writes them before its next step.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

import numpy as np


class Snapshot(NamedTuple):
  """The state of a run at a boundary, on the host.

  Attributes:
    step: global steps done (a step: one mini-batch per worker).
    state: the checkpoint dict (``easgd.run.checkpoint``'s tree; at the
      start of a new run only ``worker`` and ``shared``).
    losses: float32 [k, num_workers], the per-step worker losses of steps
      ``step - k .. step - 1`` not yet evaluated (SPMD); [0, num_workers]
      for a runtime that reports them otherwise.
    record: fields this runtime sets in the boundary's metrics record
      (threads/Ray: ``train_loss``, exchanges, clocks, faults, ``wall_time_s``).
    nonfinite: None, or ``(worker, local_step, loss)``: the first non-finite
      loss a real asynchronous worker reported.
    log: the real runtimes' exchange log at the boundary (None for SPMD,
      whose simulated log is a function of ``step``).
  """

  step: int
  state: dict
  losses: np.ndarray
  record: dict
  nonfinite: tuple | None = None
  log: list | None = None


class Executor(Protocol):
  """How the steps of a run are executed; the loop does everything else.

  Methods, in the order the loop calls them:
    checkpoint_target(): host zeros of the checkpoint's tree (Orbax's target).
    initial_state() / restore(restored): start from the beginning / from a
      restored checkpoint (may raise ConfigError); the start's Snapshot.
    start(on_progress): compile, start workers; ``on_progress(steps_done)``.
    run_to(step, while_running): train until ``step`` global steps are done,
      calling ``while_running()`` once (the previous boundary's files).
    state_for_checkpoint(evaluated): the boundary's Snapshot (``evaluated``:
      an evaluation follows, so the training losses are taken).
    evaluate_inputs(snapshot): (worker, shared) on the run's devices for
      ``Run.evaluate`` (called before the next ``run_to``).
    write_exchange_log(path, snapshot): the exchange log up to the snapshot.
    summary_fields(): the runtime's entries of ``summary.json``.
    close(): stop workers (always called).
  """

  def checkpoint_target(self) -> dict:
    ...

  def initial_state(self) -> Snapshot:
    ...

  def restore(self, restored: dict) -> Snapshot:
    ...

  def start(self, on_progress: Callable[[int], None]) -> None:
    ...

  def run_to(self, step: int, while_running: Callable[[], None] | None = None) -> None:
    ...

  def state_for_checkpoint(self, evaluated: bool) -> Snapshot:
    ...

  def evaluate_inputs(self, snapshot: Snapshot) -> tuple[Any, Any]:
    ...

  def write_exchange_log(self, path, snapshot: Snapshot) -> None:
    ...

  def summary_fields(self) -> dict[str, Any]:
    ...

  def close(self) -> None:
    ...
