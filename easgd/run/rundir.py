"""The run directory: its files, its checks, set-aside on overwrite and resume.

A run directory (``workdir``) holds, each file replaced atomically
(``easgd._util.files``), so an interrupted run never leaves a half-written file:
  ``config.json``     the config the run was started with (:func:`saved_config`);
  ``task.json``       what the run's task was at its start
                      (``easgd.tasks.task.fingerprint``: parameter shapes,
                      data sizes, a digest of a few items), which a resume
                      and an export check the task they rebuild against
                      (:func:`check_task_record`); a run without it (written
                      before the package recorded it) records it when resumed;
  ``metrics.jsonl``   one JSON object per evaluation (epoch 0 = the start),
                      each written before the checkpoint of its step: an
                      interrupt between the two leaves one record past the
                      latest checkpoint, which a resumed run drops and
                      redoes (:func:`resumed_history`);
  ``times.jsonl``     the run's training clock at each record of
                      ``metrics.jsonl``, ``{"step", "time_s"}``, same steps,
                      written with it (timings stay out of the bit-for-bit
                      metrics; ``easgd.run.timing``);
  ``summary.json``    resolved config, layout, communication totals, the
                      last metrics record (``final``) and its step
                      (``final_step``: the last evaluation, which for a
                      stopped run may precede ``steps_done``), how many
                      steps the center lags the workers
                      (``center_lag_steps``), wall time; real asynchronous
                      runs also the clocks, exchanges and faults of the
                      checkpoint it describes (``easgd.runtimes.async_runs``);
                      ``wall_time_s``: the whole run in seconds, from the
                      start of training (data loaded, model built) to the
                      summary, compilation, evaluations and checkpoints
                      included, summed over the invocations that wrote a
                      summary (:func:`earlier_wall_time`); not the metrics'
                      ``wall_time_s`` of the real asynchronous runtimes
                      (seconds of training since the run began, compilation
                      excluded);
  ``exchanges.jsonl`` asynchronous algorithms only: every exchange served so
                      far, in serving order, with ``version`` (master updates
                      served before it) and ``read_version`` (master updates
                      in the center the worker read), rewritten at every
                      checkpoint (``easgd.asynchrony.log.write_exchange_log``,
                      fields ``EXCHANGE_RECORD``; real runs:
                      ``easgd.runtimes.shared``), so that an independent
                      reference can replay the run;
  ``checkpoints/``    the layout-free Orbax checkpoints (``easgd.run.checkpoint``);
  ``events.out.tfevents.<n>.easgd``  the records of ``metrics.jsonl`` as
                      TensorBoard events and the config as hyperparameters,
                      one file per invocation, appended at each record
                      (``easgd.run.tensorboard``), so the run shows in
                      TensorBoard under the directory's own name;
  ``previous_run/``   with overwrite only: the earlier run, kept until the new
                      one has written its summary (:func:`set_aside_previous_run`);
  ``.easgd.lock``, ``.easgd.lock.json``  while a command runs in it: its lock
                      and holder (``easgd.run.runlock``), never part of the run.

Everything here runs before anything is compiled (the checks) or between the
trainer's steps (the writers); the training loop itself is ``easgd.run.trainer``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from easgd._util import checks
from easgd._util.files import json_text, write_text_atomic
from easgd.parallel import distributed
from easgd.run import checkpoint, tensorboard
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks.task import fingerprint_differences

METRICS_FILE = "metrics.jsonl"
TIMES_FILE = "times.jsonl"  # the training clock of each evaluation (easgd.run.timing)
EXCHANGES_FILE = "exchanges.jsonl"  # asynchronous algorithms: the realised exchanges
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"
TASK_FILE = "task.json"  # the task's fingerprint (easgd.tasks.task.fingerprint)
RUN_FILES = (METRICS_FILE, TIMES_FILE, SUMMARY_FILE, CONFIG_FILE, EXCHANGES_FILE, TASK_FILE)
PREVIOUS_RUN_DIR = "previous_run"

# Fields that may differ between a run and its resumption: where it runs and how
# it reports, not what it computes.
RESUMABLE_CHANGES = (
    "num_devices",
    "devices_per_worker",
    "shard_params",
    "mapping_backend",
    "progress",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "ray_address",
)


# -- checks before a run ------------------------------------------------------
def workdir_path(workdir, name: str = "workdir") -> Path:
  """``workdir`` as a path, refusing a blank one (which would mean ``.``).

  Args:
    workdir: the directory argument (str or path-like).
    name: how the message names it, e.g. ``"--workdir"`` on the command line.

  Returns:
    ``Path(workdir)``.

  Raises:
    ConfigError: ``workdir`` is not a str or path-like, or is empty or only
      white space.
  """
  if not isinstance(workdir, (str, os.PathLike)):
    raise ConfigError(f"{name} must be a path (str or os.PathLike), got {workdir!r}")
  if not str(workdir).strip():
    raise ConfigError(f"{name} must be a non-empty path, got {str(workdir)!r}")
  return Path(workdir)


def ensure_writable_dir(path) -> Path:
  """Creates ``path`` (and parents) now, before anything is compiled.

  Args:
    path: the directory (str or path-like).

  Returns:
    ``Path(path)``, an existing directory this process can write to.

  Raises:
    ConfigError: it cannot be created or written (names the path and why).
  """
  path = Path(path)
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".easgd-write-test-{os.getpid()}"
    probe.write_text("")
    probe.unlink()
  except OSError as e:
    raise ConfigError(f"workdir '{path}' cannot be written: {e.strerror or e}") from None
  return path


def check_workdir(workdir, overwrite: bool, resumable: bool = True) -> Path:
  """Refuses to write over a finished or started run unless ``overwrite``.

  Args:
    workdir: the run directory (created if missing).
    overwrite: allow a directory that already holds a run's files.
    resumable: whether the caller can resume a run (``easgd train``, not
      ``easgd compare``): the message suggests only what the caller offers.

  Returns:
    ``Path(workdir)``, an existing writable directory.

  Raises:
    ConfigError: workdir is a file, holds a run and not overwrite, or cannot
      be written.
  """
  workdir = Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise ConfigError(f"workdir '{workdir}' exists and is not a directory")
  if not overwrite and any((workdir / f).exists() for f in RUN_FILES):
    raise ConfigError(
        f"workdir '{workdir}' already holds a run; choose another "
        "directory, pass overwrite (--overwrite)" + (" or resume (--resume)" if resumable else "")
    )
  ensure_writable_dir(workdir)
  return workdir


def saved_config(workdir) -> TrainConfig:
  """The config a run in ``workdir`` was started with (``config.json``).

  Args:
    workdir: the run directory.

  Returns:
    The saved :class:`~easgd.settings.config.TrainConfig` (not validated).

  Raises:
    ConfigError: there is no run in ``workdir``, or its config is unreadable.
  """
  path = Path(workdir) / CONFIG_FILE
  if not path.is_file():
    raise ConfigError(f"workdir '{workdir}' holds no run ({CONFIG_FILE} is missing)")
  try:
    saved = json.loads(path.read_text())
    return TrainConfig.from_dict(saved)
  except (ValueError, TypeError, AttributeError) as e:
    raise ConfigError(
        f"'{path}' is not a readable run config: " f"{type(e).__name__}: {e}"
    ) from None


def check_resume_config(config: TrainConfig, workdir) -> None:
  """Refuses to resume the run in ``workdir`` with another config.

  Args:
    config: the config of the resumption.
    workdir: the run directory.

  Raises:
    ConfigError: no run in ``workdir``, or a field outside
      :data:`RESUMABLE_CHANGES` differs from the saved config (names each
      field with its old and new value).
  """
  old = saved_config(workdir).to_dict()
  new = config.to_dict()
  changed = sorted(k for k in new if k not in RESUMABLE_CHANGES and old.get(k) != new[k])
  if changed:
    diffs = ", ".join(f"{k}: {old.get(k)!r} -> {new[k]!r}" for k in changed)
    raise ConfigError(
        f"--resume with a different config ({diffs}); allowed to "
        f"change: {', '.join(RESUMABLE_CHANGES)}"
    )


def check_start(
    config: TrainConfig,
    workdir: Path,
    *,
    overwrite: bool,
    resume: bool,
    task_record: dict[str, Any] | None = None,
) -> None:
  """Checks that a run can start, or resume, in ``workdir``; before compiling.

  Args:
    config: the validated config of the run.
    workdir: the run directory (:func:`workdir_path`).
    overwrite: as :func:`check_workdir` (a new run only).
    resume: go on from the run in ``workdir``: its config must match
      (:func:`check_resume_config`), and its task (``task_record``, checked by
      :func:`check_task_record`), ``workdir`` (and its checkpoints) must be
      writable, and if it has a checkpoint its whole evaluation history must be
      readable (:func:`read_history`).
    task_record: the fingerprint of the task the run is given
      (``easgd.tasks.task.fingerprint``); None: not checked.

  Raises:
    ConfigError: ``overwrite`` or ``resume`` not a bool, or both true; from
      :func:`check_workdir`, :func:`check_resume_config`,
      :func:`check_task_record`, :func:`ensure_writable_dir` or
      :func:`read_history`.
  """
  overwrite = checks.flag("overwrite", overwrite, error=ConfigError)
  resume = checks.flag("resume", resume, error=ConfigError)
  if overwrite and resume:
    raise ConfigError(
        "overwrite and resume exclude each other (resume goes on from "
        f"the run in '{workdir}', overwrite replaces it); pass one"
    )
  if resume:
    check_resume_config(config, workdir)
    if task_record is not None:
      check_task_record(workdir, task_record, "resume")
    ensure_writable_dir(workdir)
    if (workdir / checkpoint.CHECKPOINT_DIR).is_dir():
      ensure_writable_dir(workdir / checkpoint.CHECKPOINT_DIR)
    ckpt_dir = workdir / checkpoint.CHECKPOINT_DIR
    if ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir()):
      read_history(workdir)  # a checkpoint to go on from: its history must be whole
  else:
    check_workdir(workdir, overwrite)


def check_task_record(workdir, task_record: dict[str, Any], action: str) -> None:
  """Refuses a task that differs from the one the run in ``workdir`` recorded.

  Args:
    workdir: the run directory.
    task_record: the fingerprint of the task rebuilt now
      (``easgd.tasks.task.fingerprint``).
    action: what would go on with it, for the message ("resume", "export").

  Raises:
    ConfigError: the recorded ``task.json`` is unreadable, or differs (one
      line naming each difference, ``easgd.tasks.task.fingerprint_differences``).
      A run that recorded none (written before the package recorded it)
      passes: there is nothing to compare.
  """
  path = Path(workdir) / TASK_FILE
  if not path.is_file():
    return
  try:
    recorded = json.loads(path.read_text())
    differences = fingerprint_differences(recorded, task_record)
  except (OSError, ValueError, TypeError, AttributeError, KeyError) as e:
    raise ConfigError(
        f"cannot {action}: '{path}' (the run's task) is damaged ({type(e).__name__}: {e})"
    ) from None
  if differences:
    raise ConfigError(
        f"cannot {action}: the task differs from the one the run recorded in '{path}' "
        f"({'; '.join(differences)}); allowed: the run's own task (its module and data as "
        "they were)"
    )


# -- overwrite: the earlier run is set aside until the new one stands ---------
def set_aside_previous_run(workdir: Path, ckpt: checkpoint.Checkpointer) -> None:
  """Overwrite: moves an earlier run to ``workdir/previous_run``.

  The earlier run is deleted (:func:`drop_previous_run`) only when the new run
  completes, so a new run that fails never destroys it. If ``previous_run``
  is already there and the workdir holds no summary, an earlier overwrite
  failed: ``previous_run`` still holds the last run that finished, so it is
  kept and the failed run's files are dropped instead.

  Args:
    workdir: the run directory.
    ckpt: a Checkpointer of ``workdir``; it is closed here (before its
      directory moves).
  """
  old = [workdir / f for f in RUN_FILES if (workdir / f).is_file()]
  has_checkpoints = bool(ckpt.all_steps())
  ckpt.close()
  if not old and not has_checkpoints:
    return
  if (workdir / checkpoint.CHECKPOINT_DIR).exists():
    old.append(workdir / checkpoint.CHECKPOINT_DIR)
  old += tensorboard.event_files(workdir)
  move_aside(workdir, old, finished=workdir / SUMMARY_FILE)


def move_aside(
    workdir: Path,
    entries,
    finished: Path,
    aside: str = PREVIOUS_RUN_DIR,
    marker: str | None = None,
) -> None:
  """Moves ``entries`` (files and directories of ``workdir``) to ``workdir/aside``.

  The one set-aside of an overwrite (runs: :func:`set_aside_previous_run`;
  comparisons: ``easgd.run.compare``; sweeps, into ``previous_sweep``:
  ``easgd.sweeps.command``), undone by :func:`drop_previous_run` once the new
  files stand. If ``aside`` is already there and ``finished`` (the file a
  finished run or comparison writes last) is not, an earlier overwrite failed:
  ``aside`` still holds the last finished one, so it is kept and ``entries``
  (the failed attempt's) are deleted instead. An earlier ``aside`` is replaced
  otherwise.

  Args:
    workdir: the directory that holds ``entries``.
    entries: paths that exist, moved in their order; nothing happens when
      there are none.
    finished: the path whose presence says the entries are a finished run.
    aside: the directory's name inside ``workdir``.
    marker: a file written into ``aside`` once every entry is in it (says the
      set-aside is whole); None: none.

  Raises:
    OSError: an entry cannot be moved or deleted.
  """
  if not entries:
    return
  aside = workdir / aside
  if aside.exists() and not finished.exists():
    for e in entries:
      shutil.rmtree(e, ignore_errors=True) if e.is_dir() else e.unlink()
    return
  if aside.exists():
    shutil.rmtree(aside)
  aside.mkdir()
  for e in entries:
    os.replace(e, aside / e.name)
  if marker is not None:
    (aside / marker).write_text("")


def open_run(
    config: TrainConfig,
    workdir: Path,
    *,
    resume: bool,
    task_record: dict[str, Any] | None = None,
) -> checkpoint.Checkpointer:
  """Opens ``workdir`` for writing a run; call it on every process.

  A new run (not ``resume``): process 0 sets an earlier run aside
  (:func:`set_aside_previous_run`), every process waits for it
  (``easgd.parallel.distributed.barrier``), then process 0 writes ``config.json``
  and ``task.json``. A resumed run writes ``task.json`` only if the run has
  none (written before the package recorded it).

  Args:
    config: the validated config of the run (``keep_checkpoints``).
    workdir: the run directory, checked by :func:`check_start`.
    resume: go on from the run in ``workdir`` (nothing is set aside).
    task_record: the fingerprint of the run's task
      (``easgd.tasks.task.fingerprint``); None: none is written.

  Returns:
    The run's :class:`~easgd.run.checkpoint.Checkpointer` (the caller closes it).
  """
  workdir.mkdir(parents=True, exist_ok=True)
  ckpt = checkpoint.Checkpointer(workdir, config.keep_checkpoints)
  if resume:
    if task_record is not None and distributed.is_primary():
      if not (workdir / TASK_FILE).exists():
        write_text_atomic(workdir / TASK_FILE, json_text(task_record, indent=2) + "\n")
    return ckpt
  primary = distributed.is_primary()
  if primary:
    set_aside_previous_run(workdir, ckpt)  # closes ckpt
  else:
    ckpt.close()
  distributed.barrier("easgd:previous-run-set-aside")
  ckpt = checkpoint.Checkpointer(workdir, config.keep_checkpoints)
  if primary:
    write_config(workdir, config)
    if task_record is not None:
      write_text_atomic(workdir / TASK_FILE, json_text(task_record, indent=2) + "\n")
  return ckpt


def drop_previous_run(workdir: Path, aside: str = PREVIOUS_RUN_DIR) -> None:
  """Deletes ``workdir/aside`` (if any; :func:`move_aside`): the new run stands.

  Args:
    workdir: the run directory.
    aside: the set-aside directory's name inside ``workdir``.
  """
  if (workdir / aside).exists():
    shutil.rmtree(workdir / aside, ignore_errors=True)


# -- resume: what an earlier invocation left ----------------------------------
def read_history(workdir: Path, up_to_step: int | None = None) -> list[dict[str, Any]]:
  """The records of ``metrics.jsonl`` up to ``up_to_step`` (all if None).

  Args:
    workdir: the run directory.
    up_to_step: keep the records of steps <= this; None keeps all.

  Returns:
    The evaluation records, in the file's order, the first of step 0, each
    with ``test_loss`` and the test metrics the task's evaluation gives
    (``easgd.runtimes.training_run.split_means``), all numbers. A
    value written as ``null`` (not finite, e.g. a diverged run's loss, or not
    measured, e.g. step 0's training loss: ``easgd._util.files.json_text``) is None.

  Raises:
    ConfigError: the file is missing or damaged (a resumed run would lose or
      misreport its history).
  """
  path = workdir / METRICS_FILE
  try:
    text = path.read_text()
  except OSError as e:
    raise ConfigError(
        f"cannot resume: '{path}' (the run's evaluation history) cannot "
        f"be read: {e.strerror or e}"
    ) from None
  except ValueError as e:  # not UTF-8
    raise ConfigError(
        f"cannot resume: '{path}' is damaged ({type(e).__name__}); "
        "start the run again with --overwrite"
    ) from None
  try:
    records = [json.loads(l) for l in text.splitlines() if l.strip()]
    steps = [r["step"] for r in records]
    # every task evaluates a loss; its other test metrics are those its evaluation
    # gives ("correct": test_accuracy and test_error; any other: its mean), in every record
    metrics = {"test_loss", *(k for k in records[0] if k.startswith("test_"))} if records else ()
    for r in records:
      if {k for k in r if k.startswith("test_")} != metrics or not all(
          r[k] is None or isinstance(r[k], (int, float)) and not isinstance(r[k], bool)
          for k in metrics
      ):
        raise ValueError(
            f"record of step {r.get('step')!r} without numeric test metrics {sorted(metrics)}"
        )
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in steps):
      raise ValueError(f"steps must be integers, got {steps}")
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(
        f"cannot resume: '{path}' is damaged ({type(e).__name__}: {e}); "
        "start the run again with --overwrite"
    ) from None
  if not records or steps[0] != 0:
    raise ConfigError(
        f"cannot resume: '{path}' lacks the step-0 evaluation; start the "
        "run again with --overwrite"
    )
  return [r for r, t in zip(records, steps) if up_to_step is None or t <= up_to_step]


def evaluated(config: TrainConfig, steps_per_epoch: int, step: int) -> bool:
  """Whether a run evaluates (and records) the center after global step ``step`` >= 1.

  Args:
    config: the run's config (``eval_every_epochs``, ``eval_every_steps``,
      ``num_epochs``).
    steps_per_epoch: global steps per epoch.
    step: global steps done.

  Returns:
    True at the end of every ``eval_every_epochs``-th epoch and of the last
    one, and (``eval_every_steps`` > 0) at every multiple of
    ``eval_every_steps``.
  """
  every = config.eval_every_steps
  if every and step % every == 0:
    return True
  epoch, within = divmod(step, steps_per_epoch)
  return within == 0 and (epoch % config.eval_every_epochs == 0 or epoch == config.num_epochs)


def record_epoch(step: int, steps_per_epoch: int) -> int | float:
  """A record's ``epoch``: completed epochs after global step ``step``.

  An int at an epoch's end (the records of ``eval_every_steps`` 0 are as
  before it existed); inside an epoch ``step / steps_per_epoch`` rounded to
  6 digits (e.g. 33 of 22 steps per epoch: 1.5).
  """
  epoch, within = divmod(step, steps_per_epoch)
  return epoch if within == 0 else round(step / steps_per_epoch, 6)


def evaluation_steps(config: TrainConfig, steps_per_epoch: int, up_to_step: int) -> list[int]:
  """The steps of the evaluations a run has recorded by ``up_to_step``.

  Args:
    config: the run's config (``eval_every_epochs``, ``eval_every_steps``,
      ``num_epochs``).
    steps_per_epoch: global steps per epoch.
    up_to_step: global steps done.

  Returns:
    Step 0 and the steps :func:`evaluated` up to ``up_to_step``, ascending:
    the ends of the evaluated epochs (every ``eval_every_epochs``, and the
    last epoch) and the multiples of ``eval_every_steps`` (if > 0), once each.
  """
  epochs = {
      e * steps_per_epoch
      for e in range(1, up_to_step // steps_per_epoch + 1)
      if e % config.eval_every_epochs == 0 or e == config.num_epochs
  }
  every = config.eval_every_steps
  dense = set(range(every, up_to_step + 1, every)) if every else set()
  return [0, *sorted(epochs | dense)]


def resumed_history(
    config: TrainConfig, workdir: Path, steps_per_epoch: int, step: int
) -> list[dict[str, Any]]:
  """The evaluation history a run resumed from the checkpoint at ``step`` goes on with.

  Args:
    config: the run's config.
    workdir: the run directory.
    steps_per_epoch: global steps per epoch.
    step: the global step of the checkpoint resumed from.

  Records past ``step`` (an evaluation written before an interrupt cut off its
  checkpoint) are dropped: the resumed run redoes them.

  Returns:
    The records of ``metrics.jsonl`` up to ``step``.

  Raises:
    ConfigError: the file is damaged, or its evaluations are not exactly those
      the run made by ``step`` (:func:`evaluation_steps`).
  """
  history = read_history(workdir, step)
  expected = evaluation_steps(config, steps_per_epoch, step)
  if [r["step"] for r in history] != expected:
    raise ConfigError(
        f"cannot resume: '{workdir / METRICS_FILE}' holds evaluations at steps "
        f"{[r['step'] for r in history]} up to the checkpoint at step {step}; "
        f"expected {expected}; start the run again with --overwrite"
    )
  return history


def earlier_wall_time(workdir: Path) -> float:
  """``wall_time_s`` of the summary an earlier invocation of this run wrote.

  Args:
    workdir: the run directory.

  Returns:
    That wall time in seconds; 0.0 if there is no readable summary or no
    non-negative number in it.
  """
  try:
    value = json.loads((workdir / SUMMARY_FILE).read_text())["wall_time_s"]
  except (OSError, ValueError, KeyError, TypeError):
    return 0.0
  return float(value) if isinstance(value, (int, float)) and value >= 0 else 0.0


# -- writers (call them on the primary process only) --------------------------
def write_config(workdir: Path, config: TrainConfig) -> None:
  """Writes ``config.json`` (read back by :func:`saved_config`).

  Args:
    workdir: the run directory (existing).
    config: the run's config.

  Raises:
    OSError: the file cannot be written.
  """
  write_text_atomic(workdir / CONFIG_FILE, config.to_json() + "\n")


def write_metrics(workdir: Path, history: list[dict[str, Any]]) -> None:
  """Writes ``metrics.jsonl``: one JSON object per evaluation record, in order.

  Strict JSON (``easgd._util.files.json_text``): a non-finite value (a diverged
  run's loss) is ``null``, as is step 0's ``train_loss`` (no step yet).

  Args:
    workdir: the run directory (existing).
    history: the evaluation records so far (read back by :func:`read_history`).

  Raises:
    OSError: the file cannot be written.
  """
  write_text_atomic(workdir / METRICS_FILE, "".join(json_text(r) + "\n" for r in history))


def write_summary(workdir: Path, summary: dict[str, Any]) -> None:
  """Writes ``summary.json`` (indented strict JSON: non-finite values as ``null``).

  Args:
    workdir: the run directory (existing).
    summary: the run's summary (JSON-serialisable).

  Raises:
    OSError: the file cannot be written.
  """
  write_text_atomic(workdir / SUMMARY_FILE, json_text(summary, indent=2) + "\n")
