"""TensorBoard event files of runs, comparisons and the protocol: one writer for all.

The scheme (tags, steps, wall times, file layout, resume) is explained once,
in ``docs/guides/checkpoints.md`` (TensorBoard). In short: a run's event
files lie in its own directory, so the run's name in TensorBoard is its
directory's; a run appends one event per ``metrics.jsonl`` record, at the
record's ``step`` and with the wall clock of its evaluation, and flushes it
before the record's checkpoint; every invocation of a run writes a new file
that begins with a session start (``SessionLog.START``) at the first step it
writes, TensorBoard's own mark of a restart, so a reader drops what an
interrupted invocation wrote past the resumed checkpoint. Nothing is ever
rewritten or deleted while a run goes. The files are written with
tensorboardX's record writer (synchronous: a flush returns once every event
is in the file) and its protocol buffers.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from easgd._util.files import interrupts_deferred, json_ready

_FILE = re.compile(r"^events\.out\.tfevents\.(\d+)\.easgd$")
"""easgd's event files: ``events.out.tfevents.<n>.easgd``, ``n`` counting the
invocations that wrote into the directory (10 digits, so that name order,
TensorBoard's reading order, is writing order)."""

PROTOCOL_RUNS = ("report", "tune")
"""The directories of a protocol's workdir that hold its TensorBoard runs."""


def scalars_of(record: Mapping[str, Any]) -> dict[str, float]:
  """The scalars of one metrics record, by tag.

  Args:
    record: a ``metrics.jsonl`` record (or any dict of fields).

  Returns:
    ``{tag: value}``: every finite int or float field except ``step`` (the
    x axis) under its name, and every finite number of a list field under
    ``<field>/<index>``; bools, strings, None and non-finite values are left out.
  """
  out = {}
  for name, value in record.items():
    if name == "step":
      continue
    if isinstance(value, (list, tuple)):
      for i, v in enumerate(value):
        if _number(v):
          out[f"{name}/{i}"] = float(v)
    elif _number(value):
      out[name] = float(value)
  return out


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def hparams_of(fields: Mapping[str, Any]) -> dict[str, Any]:
  """A config's fields as hyperparameters of the hparams plugin.

  Args:
    fields: e.g. ``TrainConfig.to_dict()``.

  Returns:
    The fields with a number, string or bool value as they are (NumPy
    scalars as Python ones), lists, tuples and dicts as JSON text; None
    values (and non-finite numbers) left out.
  """
  out = {}
  for name, value in json_ready(dict(fields)).items():  # NumPy values as Python ones
    if value is None:
      continue
    if isinstance(value, (bool, int, float, str)):
      out[name] = value
    else:
      out[name] = json.dumps(value, default=str)
  return out


def event_files(directory) -> list[Path]:
  """The event files of ``directory`` (any writer's: ``tfevents`` in the name), sorted by name.

  Args:
    directory: a TensorBoard run directory (need not exist).

  Returns:
    Their paths, in TensorBoard's reading order; empty if none.
  """
  directory = Path(directory)
  if not directory.is_dir():
    return []
  return sorted(p for p in directory.iterdir() if p.is_file() and "tfevents" in p.name)


class EventFile:
  """A new event file of one TensorBoard run, appended to while it is open.

  It is created as ``events.out.tfevents.<n>.easgd`` (``n`` one past the
  highest of the directory's, so it is read after them) and begins with the
  version event, then a session start at ``purge_step`` (TensorBoard's
  reader drops every event of the run at or after that step that came
  before), then, if given, the hyperparameters (the hparams plugin's
  session start, at step 0). Events are appended as they come and are in
  the file once :meth:`flush` returns; a process killed while it writes
  leaves at most one partly written last event, which readers skip.

  Args:
    directory: the run's directory (created if missing).
    purge_step: the step this file's events start at (0: a new run).
    hparams: hyperparameters (:func:`hparams_of`), or None.
    wall_time: the wall time of the opening events in seconds since the
      epoch; None: now.

  Raises:
    OSError: the file cannot be created or written.
  """

  def __init__(
      self,
      directory,
      purge_step: int = 0,
      hparams: Mapping[str, Any] | None = None,
      wall_time: float | None = None,
  ):
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    from tensorboardX.record_writer import RecordWriter
    from tensorboardX.summary import hparams as hparams_summaries

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    numbers = [
        int(m.group(1)) for m in map(_FILE.match, (p.name for p in event_files(directory))) if m
    ]
    self.path = directory / f"events.out.tfevents.{max(numbers, default=0) + 1:010d}.easgd"
    self._event = Event
    t = time.time() if wall_time is None else wall_time
    with interrupts_deferred():  # a Ctrl-C or SIGTERM waits for the opening events
      self._writer = RecordWriter(str(self.path))
      self._write(Event(wall_time=t, file_version="brain.Event:2"))
      self._write(
          Event(wall_time=t, step=int(purge_step), session_log=SessionLog(status=SessionLog.START))
      )
      if hparams:
        _, start, _ = hparams_summaries(dict(hparams), {})  # the session start only: TensorBoard
        self._write(Event(wall_time=t, step=0, summary=start))  # forms the experiment from all runs
      self.flush()

  def _write(self, event) -> None:
    self._writer.write(event.SerializeToString())

  def add(self, step: int, scalars: Mapping[str, float], wall_time: float | None = None) -> None:
    """Appends one event: ``scalars`` (float32 in the file) at ``step``.

    Args:
      step: the x axis (global steps done).
      scalars: ``{tag: value}``; non-finite values are left out.
      wall_time: the time the values were measured, seconds since the
        epoch; None: now.
    """
    from tensorboardX.proto.summary_pb2 import Summary

    values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items() if _number(v)]
    t = time.time() if wall_time is None else wall_time
    self._write(self._event(wall_time=t, step=int(step), summary=Summary(value=values)))

  def flush(self) -> None:
    """Returns once every event added is in the file (flushed and fsynced)."""
    self._writer.flush()

  def close(self) -> None:
    """Flushes and closes the file."""
    self.flush()
    self._writer.close()


class RunEvents:
  """A run's TensorBoard events: its ``metrics.jsonl`` records, appended as they come.

  Opened once per invocation of a run (the trainer; only the process that
  writes files), with the records it starts from: a new run writes its
  config as hyperparameters and its first record; a resumed run writes a
  session start one step past its checkpoint, so TensorBoard drops what an
  interrupted invocation wrote beyond it, and appends from there (its
  earlier records stay in the earlier files; a directory without event
  files gets them all again).

  Args:
    workdir: the run directory (its events lie in it).
    config_fields: the run's config (``TrainConfig.to_dict()``).
    history: the records the run starts from (each with ``step``).
    resumed_step: the checkpoint's step a resumed run goes on from; None:
      a new run (or a resume without a checkpoint).
    wall_time: when the last record of ``history`` was measured; None: now.

  Raises:
    OSError: the file cannot be created or written.
  """

  def __init__(
      self,
      workdir,
      config_fields: Mapping[str, Any],
      history: Sequence[Mapping[str, Any]],
      resumed_step: int | None = None,
      wall_time: float | None = None,
  ):
    workdir = Path(workdir)
    if resumed_step is not None and event_files(workdir):
      self._file = EventFile(workdir, purge_step=resumed_step + 1)
    else:
      self._file = EventFile(workdir, 0, hparams_of(config_fields), wall_time)
      with interrupts_deferred():
        for r in history:
          self._file.add(r["step"], scalars_of(r), wall_time)
        self._file.flush()

  @property
  def path(self) -> Path:
    """The event file this invocation appends to."""
    return self._file.path

  def record(self, record: Mapping[str, Any], wall_time: float | None = None) -> None:
    """Appends one ``metrics.jsonl`` record and flushes it (Ctrl-C and SIGTERM wait).

    Args:
      record: the record (with ``step``).
      wall_time: when its evaluation was measured, seconds since the epoch; None: now.

    Raises:
      OSError: the file cannot be written.
    """
    with interrupts_deferred():  # a Ctrl-C or SIGTERM waits until the event is in the file
      self._file.add(record["step"], scalars_of(record), wall_time)
      self._file.flush()

  def close(self) -> None:
    """Flushes and closes the file."""
    self._file.close()


def write_events(
    directory,
    points: Iterable[tuple[int, Mapping[str, float]]],
    hparams: Mapping[str, Any] | None = None,
    wall_time: float | None = None,
) -> Path:
  """A new complete event file in ``directory``: a run written at once.

  The file begins with a session start at step 0, so a reader drops what it
  read of the directory's earlier files (:class:`EventFile`).

  Args:
    directory: the TensorBoard run directory (created if missing).
    points: ``(step, {tag: value})`` in order, one event per point.
    hparams: as :class:`EventFile`.
    wall_time: the events' wall time in seconds since the epoch; None: now.

  Returns:
    The path of the new file.

  Raises:
    OSError: the file cannot be written.
  """
  t = time.time() if wall_time is None else wall_time
  f = EventFile(directory, 0, hparams, t)
  for step, scalars in points:
    f.add(step, scalars, t)
  f.close()
  return f.path


def _dir_name(name: str, taken: set) -> str:
  """``name`` as one path component ("/" and "\\" as "_"), unique among ``taken`` (added)."""
  base = re.sub(r"[/\\]", "_", name)
  base = base if base.strip(".") else f"_{base}"
  out, k = base, 1
  while out in taken:
    k += 1
    out = f"{base}_{k}"
  taken.add(out)
  return out


def _curves(entry: Mapping[str, Any]) -> dict[str, list]:
  """``{tag: per-seed curves}`` of a protocol result: every ``<tag>_curve`` entry."""
  return {k[: -len("_curve")]: v for k, v in entry.items() if k.endswith("_curve")}


def write_protocol_events(workdir, results: Mapping[str, Any]) -> list[Path]:
  """The protocol's curves, one TensorBoard run per arm and seed, in ``workdir``.

  Report runs: ``report/<arm>/seed_<s>`` (the arm's name as one path
  component: "/" as "_", a repeat suffixed ``_2``), every curve of the
  report (``<tag>_curve``: ``test_error``, ``val_loss``, ... whichever
  metrics the task's evaluation gives) at the arm's evaluation steps;
  tuning runs: ``tune/<arm>/lr_<rate>/seed_<s>``, every curve of the rate's
  tuning entry (the tuning curves share the report's evaluation steps). Each
  has the arm's config, with its rate and seed, as hyperparameters (and
  ``phase``, ``arm``). The curves come out of compiled programs, not one
  evaluation at a time: their events carry the time they are written. Each
  run gets one new file beginning with a session start at step 0; the
  event files under ``report/`` and ``tune/`` that this call did not write
  (an earlier protocol's) are deleted after.

  Args:
    workdir: the protocol's directory.
    results: what ``easgd.protocol.runs.run_protocol`` returns (``arms``:
      ``config``, ``chosen_learning_rate``, ``report`` with ``seeds``,
      ``eval_steps`` and its curves, ``tuning`` per rate with its curves per
      tuning seed; ``protocol``: ``tune_seeds``).

  Returns:
    The paths of the files written.

  Raises:
    OSError: a file cannot be written.
  """
  root = Path(workdir)
  tune_seeds = list(results["protocol"]["tune_seeds"])
  written, dirs = [], set()
  t = time.time()
  for arm, res in results["arms"].items():
    report, fields = res["report"], dict(res["config"], arm=arm)
    name = _dir_name(arm, dirs)
    steps = report["eval_steps"]
    curves = _curves(report)
    for i, seed in enumerate(report["seeds"]):
      points = [(s, {c: v[i][k] for c, v in curves.items()}) for k, s in enumerate(steps)]
      lr = res["chosen_learning_rate"]
      hp = hparams_of(dict(fields, learning_rate=lr, seed=seed, phase="report"))
      path = root / PROTOCOL_RUNS[0] / name / f"seed_{seed}"
      written.append(write_events(path, points, hp, t))
    for rate in res["tuning"] or ():
      lr = rate["learning_rate"]
      curves = _curves(rate)
      for i, seed in enumerate(tune_seeds):
        points = [(s, {c: v[i][k] for c, v in curves.items()}) for k, s in enumerate(steps)]
        hp = hparams_of(dict(fields, learning_rate=lr, seed=seed, phase="tune"))
        path = root / PROTOCOL_RUNS[1] / name / f"lr_{lr:g}" / f"seed_{seed}"
        written.append(write_events(path, points, hp, t))
  keep = set(written)
  for d in PROTOCOL_RUNS:
    for p in (root / d).rglob("*tfevents*"):
      if p.is_file() and p not in keep:
        p.unlink(missing_ok=True)
  return written
