"""The training loop: ``train_and_evaluate(config, workdir)``, for every runtime.

The one owner of what a run writes and checks: the workdir lock
(``easgd.run.runlock``), its checks and resume (``easgd.run.rundir``), the
checkpoint at every boundary (its tree: ``easgd.runtimes.executor.checkpoint_tree``),
the evaluation (``easgd.runtimes.training_run.Run.evaluate``), ``metrics.jsonl``
and its TensorBoard events, the training clock of each record (``times.jsonl``,
``easgd.run.timing``), the exchange log, ``summary.json`` and the
divergence checks. A runtime's ``easgd.runtimes.executor.Executor`` gives its
state and executes the steps. The order of a boundary's files, and why:
docs/guides/architecture.md, docs/guides/checkpoints.md.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Mapping

import jax

from easgd._util import checks
from easgd._util.files import check_interrupt
from easgd._util.progress import progress_bar
from easgd.methods import registry
from easgd.parallel import distributed
from easgd.run import checkpoint, rundir, runlock, tensorboard, timing
from easgd.runtimes import async_runs
from easgd.runtimes.divergence import (
    DivergenceError,
    StabilityWarning,
    stability_warning,
    worker_loss_message,
)
from easgd.runtimes.executor import Executor, Snapshot
from easgd.runtimes.shared import write_log
from easgd.runtimes.training_run import Run, checked_task
from easgd.settings import builtin_tasks, runtime_table
from easgd.settings.config import ConfigError, TrainConfig, as_train_config
from easgd.tasks import models
from easgd.tasks.task import Task, fingerprint

SUMMARY_KEYS = (
    "status",
    "config",
    "algorithm",
    "runtime",
    "layout",
    "num_devices",
    "jax_version",
    "platform",
    "num_params",
    "param_bytes",
    "exchange_bytes",
    "num_processes",
    "task",
    "train_examples",
    "test_examples",
    "steps_per_epoch",
    "total_steps",
    "steps_done",
    "resolved",
    "center_lag_steps",
    "communication",
    "exchanges",
    "exchanges_per_worker",
    "worker_local_steps",
    "faults",
    "stopped_workers",
    "final_step",
    "final",
    "best_test_accuracy",
    "wall_time_s",
    "shared_copies_equal",
)
"""``summary.json``'s entries, in order (``runtime`` to ``stopped_workers``
and ``shared_copies_equal``: those of the runtime, ``Executor.summary_fields``)."""


def train_and_evaluate(
    config: TrainConfig,
    workdir,
    *,
    overwrite: bool = False,
    resume: bool = False,
    stop_after_steps: int | None = None,
    task: Task | None = None,
) -> dict[str, Any]:
  """Trains ``config``, writing metrics, checkpoints and a summary to ``workdir``.

  Everything is checked before anything compiles or is written; every runtime
  (``config.runtime``: docs/guides/runtimes.md) runs this one loop. Checkpoints,
  divergence, interrupts and resume: docs/guides/checkpoints.md.

  Args:
    config: the run's configuration.
    workdir: output directory (created if missing).
    overwrite: replace an earlier run in ``workdir`` (set aside in
      ``workdir/previous_run`` until the new run has written its summary).
    resume: continue from the latest checkpoint (the config equal to the saved
      one up to ``easgd.run.rundir.RESUMABLE_CHANGES``); without one, start.
    stop_after_steps: stop, with a checkpoint, once this many global steps are
      done; None runs to the end.
    task: the problem (``easgd.tasks.task.Task``); None: the one ``config``
      names. A task built in code must be given again to resume.

  Returns:
    The summary written to ``workdir/summary.json`` (``"status"``
    ``"complete"`` or ``"stopped"``; ``"final"`` the last metrics record, of
    step ``"final_step"`` <= ``"steps_done"``), plus ``"history"``: the records
    of ``metrics.jsonl``.

  Raises:
    ConfigError: ``config`` not a TrainConfig, a bad config value or workdir,
      overwrite with resume, or a resume with another config or another task
      (its parameter shapes, data sizes or a digest of its data differ from
      the run's ``task.json``, ``easgd.run.rundir.check_task_record``).
    easgd.run.runlock.WorkdirInUseError: another command holds ``workdir``
      (``easgd.run.runlock``: one run per workdir, taken before its checks).
    easgd.parallel.worker_layout.LayoutError: num_workers not a multiple of the devices used.
    easgd.tasks.data.DataError: unknown or missing data set files, or a batch larger
      than the data.
    easgd.tasks.task.TaskError: a task that does not import or build, or
      whose data or functions do not fit the run (``check_task``); raised
      before anything is written.
    DivergenceError: a non-finite training loss or parameter (names step and
      worker), or a non-finite evaluated test or validation loss.
  """
  return _start(config, workdir, overwrite, resume, stop_after_steps, None, task)


def train_and_evaluate_async(
    config: TrainConfig,
    workdir,
    *,
    overwrite: bool = False,
    resume: bool = False,
    stop_after_steps: int | None = None,
    faults: Mapping[int, int] | None = None,
    task: Task | None = None,
) -> dict[str, Any]:
  """:func:`train_and_evaluate` of a real asynchronous runtime, with injected faults.

  Args:
    config: the run's configuration (``runtime`` "threads" or "ray").
    workdir, overwrite, resume, stop_after_steps: as :func:`train_and_evaluate`
      (a step is num_workers local steps).
    faults: ``{worker: local_step}``: make that worker fail before that local
      step (threads: it raises; Ray: its process exits), for tests and
      experiments.
    task: as :func:`train_and_evaluate`.

  Returns:
    The summary (also ``workdir/summary.json``), with ``"history"``. It
    describes the latest checkpoint (``steps_done``): ``worker_local_steps``
    (its clocks), ``exchanges_per_worker``, ``faults`` (every fault of the run
    up to it, from the log: worker, local step, error, ``restarted_at``) and
    ``stopped_workers`` (those a fault stopped for good: on threads every
    faulted worker, also after a resume; on Ray one whose restarts ran out);
    ``final`` is the last metrics record, of step ``final_step``.

  Raises:
    ConfigError: as :func:`train_and_evaluate`; also a runtime that is "spmd".
    easgd.run.runlock.WorkdirInUseError: another command holds ``workdir``.
    easgd.parallel.distributed.StartupError: the Ray cluster cannot be reached.
    DivergenceError: a non-finite loss or state, or a non-finite evaluated
      test or validation loss.
    easgd.runtimes.driver.WorkersLostError: every worker stopped.
  """
  config = as_train_config(config).validate()
  if config.runtime not in runtime_table.REAL:
    raise ConfigError(
        f"train_and_evaluate_async runs runtime {runtime_table.either(runtime_table.REAL)}, "
        f"got {config.runtime!r}"
    )
  return _start(config, workdir, overwrite, resume, stop_after_steps, faults, task)


def run_task(config: TrainConfig, task: Task | None = None) -> tuple[TrainConfig, Task, Task]:
  """A run's task, built and checked against the run before anything is written.

  What :func:`train_and_evaluate` checks first, for callers that check several
  runs before the first one starts (``easgd.run.compare``).

  Args:
    config: a validated config.
    task: a task, or None for the one ``config`` names
      (``easgd.settings.builtin_tasks.task_of``).

  Returns:
    ``(config, task, view)``: ``config`` with the task's import path recorded
    (``builtin_tasks.make_task_config``), the task, and the run's checked view
    of it (``easgd.runtimes.training_run.checked_task``: the validation examples held
    out of its training data).

  Raises:
    easgd.tasks.task.TaskError, ConfigError, easgd.tasks.data.DataError:
      as ``task_of`` and ``checked_task``; ConfigError: runtime "ray" with a
      task built in code (each Ray worker's process rebuilds the task from
      its import path, ``config.task``).
  """
  task = builtin_tasks.task_of(config, task)
  view, _ = checked_task(config, task)  # its data and functions against the run's sizes
  config = builtin_tasks.make_task_config(config, task)
  if runtime_table.TABLE[config.runtime].processes and task.factory is None:
    raise ConfigError(  # no other process can build it
        f"runtime {config.runtime!r} builds the task in each worker's process from an "
        "import path; "
        f"task {task.name!r} was built in code: give config.task "
        "'package.module:function' (--task) instead"
    )
  return config, task, view


def _start(config, workdir, overwrite, resume, stop_after_steps, faults, task) -> dict[str, Any]:
  """The checks before a run, its lock, then :func:`_train` (stack: the caller's caller)."""
  config = as_train_config(config).validate()
  # the task first: one that does not build or fit the run writes nothing
  config, task, view = run_task(config, task)
  task_record = fingerprint(view)  # recorded at the start; a resume checks against it
  if stop_after_steps is not None:
    stop_after_steps = checks.integer("stop_after_steps", stop_after_steps, 1, error=ConfigError)
  if not runtime_table.TABLE[config.runtime].multiprocess and distributed.is_multiprocess():
    raise ConfigError(
        f"runtime {config.runtime!r} runs in one process (Ray spreads "
        "the workers over hosts); drop the multi-process flags"
    )
  workdir = rundir.workdir_path(workdir)
  hint = stability_warning(config)
  if hint:
    warnings.warn(hint, StabilityWarning, stacklevel=3)
  primary = distributed.is_primary()  # the process that writes files
  with runlock.hold_workdir(workdir, "train", primary=primary):  # before its checks
    rundir.check_start(config, workdir, overwrite=overwrite, resume=resume, task_record=task_record)
    distributed.barrier("easgd:workdir-checked")  # before process 0 writes to it
    with async_runs.connection(config):  # Ray: the cluster, before anything is built
      return _train(config, workdir, resume, stop_after_steps, faults, task, task_record)


def _executor(run: Run, workdir, faults) -> Executor:
  """The executor of the run's runtime (``easgd.settings.runtime_table``)."""
  spec = runtime_table.TABLE[run.config.runtime]
  executor = runtime_table.load(spec.executor)
  if spec.backend is None:  # one program: no exchange log, no faults
    return executor(run)
  return executor(run, workdir / rundir.EXCHANGES_FILE, faults)


def _train(config, workdir, resume, stop_after_steps, faults, task, task_record) -> dict[str, Any]:
  """:func:`train_and_evaluate` in ``workdir``, checked, whose lock the caller holds."""
  run = Run(config, task)
  executor = _executor(run, workdir, faults)
  primary = distributed.is_primary()  # the process that writes files
  # checkpoints: all processes
  ckpt = rundir.open_run(config, workdir, resume=resume, task_record=task_record)
  start = time.perf_counter()
  earlier_wall_time_s = rundir.earlier_wall_time(workdir) if resume else 0.0
  spe = run.steps_per_epoch
  events = None  # the primary's TensorBoard events, appended at each record
  try:
    step, history, times, events = _begin(run, executor, ckpt, workdir, resume, primary)
    last = run.total_steps if stop_after_steps is None else min(run.total_steps, stop_after_steps)
    runtime = "" if config.runtime == runtime_table.DEFAULT else f" [{config.runtime}]"
    progress = progress_bar(
        run.total_steps,
        spe,
        initial=step,
        desc=f"{config.algorithm} p={config.num_workers}{runtime}",
        disable=not (config.progress and step < last and primary),
    )
    files = functools.partial(
        _write_boundary, run, executor, ckpt, workdir, history, times, progress, primary, events
    )
    try:
      executor.start(lambda steps: progress.update(steps - progress.n))
      pending = None  # the last boundary's files, written in the next run_to
      while step < last:
        check_interrupt()  # a signal whose exception was swallowed stops here
        epoch = step // spe + 1  # the next boundary: epoch end, checkpoint, evaluation, stop
        boundary = min(epoch * spe, last)
        for every in (config.checkpoint_every_steps, config.eval_every_steps):
          if every:  # a checkpoint, an evaluation inside the epoch
            boundary = min(boundary, (step // every + 1) * every)
        step = boundary
        executor.run_to(step, while_running=pending)
        evaluated = rundir.evaluated(config, spe, step)
        snapshot = executor.state_for_checkpoint(evaluated)
        seconds = executor.train_seconds()  # the clock of the snapshot
        _check_finite(run, snapshot)
        epoch = rundir.record_epoch(step, spe) if evaluated else None
        pending = functools.partial(files, snapshot, epoch, seconds)
      if pending is not None:
        pending()
    finally:
      progress.close()
      executor.close()
  finally:
    ckpt.close()
    if events is not None:
      events.close()
  # summed over this run's invocations that wrote a summary (resume adds up)
  summary = _summary(
      run, executor, step, history, round(earlier_wall_time_s + time.perf_counter() - start, 3)
  )
  if primary:
    rundir.write_summary(workdir, summary)
    rundir.drop_previous_run(workdir)  # the new run stands: drop the old
  summary["history"] = history
  return summary


def _begin(
    run: Run, executor: Executor, ckpt, workdir, resume: bool, primary: bool
) -> tuple[int, list[dict], list[dict], tensorboard.RunEvents | None]:
  """(step, history, times, events) at the start: a restored checkpoint, or step 0 evaluated.

  A resumed run rewrites ``metrics.jsonl``, ``times.jsonl``
  (``easgd.run.timing.resumed_times``) and the exchange log to its
  checkpoint's step: what an interrupt left past the checkpoint is redone
  (and TensorBoard drops its events: ``easgd.run.tensorboard.RunEvents``).
  ``events`` is None on a process that writes no files.

  Raises:
    ConfigError: the files of ``workdir`` do not match its checkpoint.
    DivergenceError: the evaluation of step 0 is not finite.
  """
  config_fields = run.config.to_dict()
  if resume and ckpt.latest_step() is not None:
    restored = _restore(ckpt, executor.checkpoint_target())
    step = int(restored["step"])
    history = rundir.resumed_history(run.config, workdir, run.steps_per_epoch, step)
    times = timing.resumed_times(workdir, history)
    snapshot = executor.restore(restored)
    events = None
    if primary:
      rundir.write_metrics(workdir, history)
      timing.write_times(workdir, times)
      events = tensorboard.RunEvents(workdir, config_fields, history, resumed_step=step)
      _write_exchange_log(run, workdir, snapshot)
    return step, history, times, events
  history = [_evaluate(run, executor, executor.initial_state(), 0)]
  measured = time.time()  # the evaluation's wall clock (its TensorBoard events)
  times = [timing.clock_record(0, 0.0)]
  if not primary:
    return 0, history, times, None
  rundir.write_metrics(workdir, history)
  timing.write_times(workdir, times)
  events = tensorboard.RunEvents(workdir, config_fields, history, wall_time=measured)
  return 0, history, times, events


def _restore(ckpt: checkpoint.Checkpointer, target: dict) -> dict:
  """The latest checkpoint; one saved before runtime "spmd" kept its clock (no
  ``train_seconds``) is restored without it (the clock restarts at 0 there)."""
  try:
    return ckpt.restore(target=target)
  except checkpoint.CheckpointError as e:
    if "train_seconds" not in target:
      raise
    error = e
  try:
    return ckpt.restore(target={k: v for k, v in target.items() if k != "train_seconds"})
  except checkpoint.CheckpointError:
    raise error from None


def _check_finite(run: Run, snapshot: Snapshot) -> None:
  """Raises DivergenceError at a non-finite loss or state (which is never saved)."""
  if snapshot.nonfinite is not None:
    raise DivergenceError(worker_loss_message(run.config, *snapshot.nonfinite))
  run.check_finite(snapshot.losses, snapshot.step - len(snapshot.losses), snapshot.state)


def _evaluate(run: Run, executor: Executor, snapshot: Snapshot, epoch: int | float) -> dict:
  """The metrics record of ``snapshot`` after ``epoch`` epochs (checked finite; inside
  an epoch ``train_loss`` is the mean of the snapshot's losses: spmd, the epoch's so far)."""
  record = run.evaluate(*executor.evaluate_inputs(snapshot), epoch, snapshot.step, snapshot.losses)
  record.update(snapshot.record)
  return record


def _write_boundary(
    run,
    executor,
    ckpt,
    workdir,
    history,
    times,
    progress,
    primary,
    events,
    snapshot: Snapshot,
    epoch: int | float | None,
    seconds: float,
) -> None:
  """A boundary's files: (evaluated) the record, then the log, then the checkpoint.

  The record (``epoch``: its epochs done, ``easgd.run.rundir.record_epoch``)
  goes to ``metrics.jsonl``, its clock ``seconds`` (``Executor.train_seconds``
  at the snapshot) to ``times.jsonl``, then the record is appended to the
  TensorBoard events (``events``, flushed, with the evaluation's wall clock).
  These files come before the checkpoint: an interrupt between them leaves a record and
  log entries past the latest checkpoint, which a resumed run drops and
  redoes; a non-finite evaluation (DivergenceError) writes nothing. Only the
  primary process writes files; every process saves its checkpoint.
  """
  if epoch is not None:
    record = _evaluate(run, executor, snapshot, epoch)
    measured = time.time()
    history.append(record)
    times.append(timing.clock_record(snapshot.step, seconds))
    if primary:
      rundir.write_metrics(workdir, history)
      timing.write_times(workdir, times)
      events.record(record, measured)
    if "test_accuracy" in record:
      progress.set_postfix(test_acc=f"{record['test_accuracy']:.4f}", refresh=False)
    else:
      progress.set_postfix(test_loss=f"{record['test_loss']:.4f}", refresh=False)
  if primary:
    _write_exchange_log(run, workdir, snapshot)
  ckpt.save(snapshot.step, snapshot.state)


def _write_exchange_log(run: Run, workdir, snapshot: Snapshot) -> None:
  """``exchanges.jsonl`` at the snapshot: the real workers' log, or (simulated
  asynchronous algorithms) every exchange by the snapshot's step, for replays."""
  path = workdir / rundir.EXCHANGES_FILE
  if snapshot.log is not None:
    write_log(path, snapshot.log)
  elif registry.TABLE[run.config.algorithm].asynchronous:
    from easgd.asynchrony.log import write_exchange_log

    write_exchange_log(path, run.algorithm, run.step_key, snapshot.step)


def _summary(
    run: Run, executor: Executor, step: int, history: list[dict], wall_time_s: float
) -> dict[str, Any]:
  """``summary.json``: the run's common entries and the runtime's, in :data:`SUMMARY_KEYS`' order."""
  entries = dict(
      status="complete" if step == run.total_steps else "stopped",
      config=run.config.to_dict(),
      num_devices=run.layout.num_devices,
      jax_version=jax.__version__,
      platform=run.layout.devices[0].platform,
      num_params=models.count_params(run.init_params),
      param_bytes=run.param_bytes,
      exchange_bytes=run.exchange_bytes,  # one exchange or gradient average, per device
      num_processes=run.layout.num_processes,
      task=run.task.describe(),
      train_examples=run.train_examples,
      test_examples=len(run.task.test),
      steps_per_epoch=run.steps_per_epoch,
      total_steps=run.total_steps,
      steps_done=step,
      resolved=run.resolved,
      final_step=history[-1]["step"],  # the step of `final` (<= steps_done)
      final=history[-1],
      # a task whose evaluation gives "correct" (the metrics it lacks are absent)
      **(
          dict(best_test_accuracy=max(r["test_accuracy"] for r in history))
          if "test_accuracy" in history[-1]
          else {}
      ),
      wall_time_s=wall_time_s,
      **executor.summary_fields(),
  )
  ordered = {k: entries.pop(k) for k in SUMMARY_KEYS if k in entries}
  return {**ordered, **entries}  # (a runtime's entry not listed: at the end)
