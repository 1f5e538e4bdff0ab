"""The contract between the one training loop and a runtime, and the checkpoint's tree.

``easgd.run.trainer.train_and_evaluate`` owns the run directory (lock,
checks, resume), the evaluation, the metrics, the exchange log's file, the
summary and the divergence checks; a checkpoint holds :func:`checkpoint_tree`
(declared here, once, for every runtime). A runtime supplies only its state
and how steps are executed, as an :class:`Executor`:

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

import jax
import numpy as np

RUNTIME_ENTRIES = {
    # spmd: this epoch's worker losses so far, [steps_per_epoch, num_workers] (rows past
    # the step are 0), so that the epoch's mean training loss survives a resume
    "epoch_losses": np.float32,
    # threads, ray: each worker's loss sum and count since the last evaluation, [num_workers]
    "loss_sum": np.float64,
    "loss_count": np.int64,
    # threads, ray: the exchange log's records at the checkpoint, [] (a resume cuts it there)
    "log_length": np.int64,
    # every runtime: the training clock so far, seconds (Executor.train_seconds), []
    "train_seconds": np.float64,
    # threads, with overlap (delay V >= 1): the local clock s + V whose step applies each
    # worker's exchange in flight, -1 for none, [num_workers]
    "reply_clock": np.int64,
    # threads, with overlap: each worker's reply in flight (zeros for none), a tree of the
    # reply's leaves [num_workers, ...] in their own dtypes (None: a tree, kept as given)
    "reply_in_flight": None,
}
"""A runtime's own entries of a checkpoint, by name: their dtype (:func:`checkpoint_tree`;
None: a tree of arrays, each kept in its dtype)."""


def checkpoint_tree(algorithm, worker, shared, step: int, **entries) -> dict:
  """A checkpoint's tree (what ``easgd.run.checkpoint.Checkpointer`` saves), any runtime.

  Layout-free host arrays (docs/guides/checkpoints.md); to add an entry, declare it
  in :data:`RUNTIME_ENTRIES` (or here, for every runtime) and give its value.

  Args:
    algorithm: the run's ``easgd.core.base.Algorithm`` (its ``center``).
    worker: every worker's state, leaves ``[num_workers, ...]``.
    shared: the shared state once (center, clocks, schedule state).
    step: global steps done: the data position and the random state.
    **entries: the runtime's own entries, named in :data:`RUNTIME_ENTRIES`.

  Returns:
    ``{worker, shared, center, step, **entries}``: ``center`` is
    ``algorithm.center(shared)`` (the evaluated model, for export), ``step`` an
    int64 scalar, each entry an array of its declared dtype.

  Raises:
    KeyError: an entry not in :data:`RUNTIME_ENTRIES`.
  """
  tree = dict(worker=worker, shared=shared, center=algorithm.center(shared))
  tree["step"] = np.asarray(step, np.int64)
  for name, value in entries.items():
    dtype = RUNTIME_ENTRIES[name]
    tree[name] = jax.tree.map(np.asarray, value) if dtype is None else np.asarray(value, dtype)
  return tree


def checkpoint_target(algorithm, worker, shared, num_workers: int, **shapes) -> dict:
  """Host zeros of a checkpoint's tree (:func:`checkpoint_tree`): Orbax's restore target.

  Args:
    algorithm: the run's algorithm.
    worker: ONE worker's initial state (given to every worker).
    shared: the initial shared state.
    num_workers: p.
    **shapes: each of the runtime's entries (:data:`RUNTIME_ENTRIES`): its shape; for an
      entry of dtype None, a tree of arrays of its leaves' shapes and dtypes.

  Returns:
    The tree, every leaf a host array of the saved shape and dtype.
  """
  worker = jax.tree.map(
      lambda x: np.broadcast_to(np.asarray(x), (num_workers, *np.shape(x))), worker
  )
  zeros = {
      name: jax.tree.map(lambda x: np.zeros(np.shape(x), np.asarray(x).dtype), shape)
      if RUNTIME_ENTRIES[name] is None
      else np.zeros(shape, RUNTIME_ENTRIES[name])
      for name, shape in shapes.items()
  }
  return jax.tree.map(np.asarray, checkpoint_tree(algorithm, worker, shared, 0, **zeros))


def communication_fields(
    all_reduces: int, nbytes: int, steps: int, all_gathers: int = 0, gathered_bytes: int = 0
) -> dict[str, Any]:
  """A summary's communication counts: totals and means per global step.

  Args:
    all_reduces: exchanges (all-reduces) per worker over ``steps`` global steps.
    nbytes: the bytes they reduce, per worker.
    steps: global steps done (0 counts as 1).
    all_gathers, gathered_bytes: the compressed exchanges' all-gathers and the
      bytes a worker contributes to them (``easgd.core.base.Communication``);
      reported only where there are any.

  Returns:
    ``{all_reduces, bytes, all_reduces_per_step, bytes_per_step}`` (and
    ``all_gathers``, ``gathered_bytes`` where ``all_gathers`` > 0).
  """
  out = dict(
      all_reduces=all_reduces,
      bytes=nbytes,
      all_reduces_per_step=all_reduces / max(steps, 1),
      bytes_per_step=nbytes / max(steps, 1),
  )
  if all_gathers:
    out.update(all_gathers=all_gathers, gathered_bytes=gathered_bytes)
  return out


class Snapshot(NamedTuple):
  """The state of a run at a boundary, on the host.

  Attributes:
    step: global steps done (a step: one mini-batch per worker).
    state: the checkpoint's tree (:func:`checkpoint_tree`; at the start of a
      new run None (SPMD) or only ``worker`` and ``shared``).
    losses: float32 [k, num_workers], the per-step worker losses of steps
      ``step - k .. step - 1`` not yet evaluated (SPMD); [0, num_workers]
      for a runtime that reports them otherwise.
    record: fields this runtime sets in the boundary's metrics record
      (threads/Ray: ``train_loss``, exchanges, clocks, faults, ``wall_time_s``).
    nonfinite: None, or ``(worker, local_step, loss)``: the first non-finite
      loss a real asynchronous worker reported.
    log: the real runtimes' exchange log at the boundary, which the loop
      writes (None for SPMD, whose simulated log is a function of ``step``).
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
    checkpoint_target(): host zeros of the checkpoint's tree (:func:`checkpoint_target`).
    initial_state() / restore(restored): start from the beginning / from a
      restored checkpoint (may raise ConfigError); the start's Snapshot.
    start(on_progress): compile, start workers; ``on_progress(steps_done)``.
    run_to(step, while_running): train until ``step`` global steps are done,
      calling ``while_running()`` once (the previous boundary's files).
    state_for_checkpoint(evaluated): the boundary's Snapshot (``evaluated``:
      an evaluation follows, so the training losses are taken).
    evaluate_inputs(snapshot): (worker, shared) on the run's devices for
      ``Run.evaluate`` (called before the next ``run_to``).
    train_seconds(): the run's training clock at the latest boundary (seconds).
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

  def train_seconds(self) -> float:
    """Seconds of training on the run's clock at the latest boundary.

    Time spent running steps, summed over the run's invocations (restored from
    the checkpoint's ``train_seconds``); not evaluations, files or checkpoints,
    nor compilation (SPMD: the first step an invocation runs and the
    compilations JAX reports later; threads/Ray: their warm-up). 0.0 at the
    start. Written to ``times.jsonl`` (``easgd.run.timing``).
    """
    ...

  def summary_fields(self) -> dict[str, Any]:
    ...

  def close(self) -> None:
    ...
