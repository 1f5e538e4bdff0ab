"""TensorBoard event files of runs, comparisons and the protocol: one writer for all.

Every run directory gets ``tb/`` (:data:`TB_DIR`) beside ``metrics.jsonl``,
one TensorBoard run, so ``tensorboard --logdir WORKDIR`` shows a run and
``tensorboard --logdir`` of a ``compare`` directory shows its algorithms side
by side (runs ``<algorithm>/tb``); the protocol writes ``tb/report/<arm>/seed_<s>``
and ``tb/tune/<arm>/lr_<rate>/seed_<s>`` in its workdir.

Tags: a scalar's tag is the field name of its ``metrics.jsonl`` record
(``test_accuracy``, ``test_loss``, ``val_loss``, ``train_loss``,
``worker_center_distance``, ``all_reduces``, ``learning_rate``, ``epoch``,
...; the protocol's curves: ``test_error``, ``val_error``, ``test_loss``,
``val_loss``, ``train_loss``), at the record's ``step`` (global steps done),
and a per-worker list field is one scalar per worker, ``<field>/<worker>``
(``worker_center_distances/0``; the real runtimes' ``worker_local_steps/i``
and ``exchanges_per_worker/i``). A value that ``metrics.jsonl`` writes as
``null`` (not finite, or not measured: step 0's ``train_loss``) has no event;
the event format stores float32. The run's config is its hyperparameters (the
hparams plugin's session start, written at step 0: numbers, strings and
bools as they are, lists as JSON text, None left out); the metrics of the
hparams table are the run's scalars, their last values the final ones.

Written as a view of the records, never appended to: each write replaces the
directory's event file by a new complete one (:func:`write_events`: an atomic
rename, ``easgd._util.files``, then the older event files are deleted), so
after a resume the events are exactly the resumed ``metrics.jsonl``, with no
duplicated or stale steps. Each file begins with a session start at step 0, so
a TensorBoard that read an earlier file (or a file an interrupt left beside a
newer one) drops what it had (``purge_orphaned_data``) and reads the new one.
An event's wall time is when its file was written.
"""

from __future__ import annotations

import json
import math
import re
import struct
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from easgd._util.files import json_ready, write_bytes_atomic

TB_DIR = "tb"
"""The directory of a run's (or the protocol's) event files in its workdir."""

_FILE = re.compile(r"^events\.out\.tfevents\.(\d+)\.easgd$")


def scalars_of(record: Mapping[str, Any]) -> dict[str, float]:
  """The scalars of one metrics record, by tag (module docstring: the scheme).

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


def _finite(points):
  """``(step, {tag: value})`` with the non-finite and None values dropped, as floats."""
  return [(t, {k: float(v) for k, v in d.items() if _number(v)}) for t, d in points]


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


def _record(data: bytes) -> bytes:
  """One TFRecord frame (length, its masked CRC-32C, data, its masked CRC-32C)."""
  from tensorboardX.record_writer import masked_crc32c

  header = struct.pack("Q", len(data))
  return (
      header
      + struct.pack("I", masked_crc32c(header))
      + data
      + struct.pack("I", masked_crc32c(data))
  )


def event_file_bytes(
    points: Iterable[tuple[int, Mapping[str, float]]],
    hparams: Mapping[str, Any] | None = None,
    wall_time: float | None = None,
) -> bytes:
  """The bytes of one complete event file.

  Args:
    points: ``(step, {tag: value})`` in order, one event per point.
    hparams: hyperparameters (:func:`hparams_of`) for the hparams plugin's
      session start; None: none.
    wall_time: the events' wall time in seconds since the epoch; None: now.

  Returns:
    The file: the version event, a session start at step 0 (a reader drops
    what it read of earlier files), the hyperparameters, then the points.
  """
  from tensorboardX.proto.event_pb2 import Event, SessionLog
  from tensorboardX.proto.summary_pb2 import Summary
  from tensorboardX.summary import hparams as hparams_summaries

  t = time.time() if wall_time is None else wall_time
  events = [
      Event(wall_time=t, file_version="brain.Event:2"),
      Event(wall_time=t, step=0, session_log=SessionLog(status=SessionLog.START)),
  ]
  if hparams:
    _, start, _ = hparams_summaries(dict(hparams), {})  # the session start only: TensorBoard
    events.append(Event(wall_time=t, step=0, summary=start))  # forms the experiment from all runs
  for step, scalars in points:
    values = [Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
    events.append(Event(wall_time=t, step=int(step), summary=Summary(value=values)))
  return b"".join(_record(e.SerializeToString()) for e in events)


def write_events(
    directory,
    points: Iterable[tuple[int, Mapping[str, float]]],
    hparams: Mapping[str, Any] | None = None,
) -> Path:
  """Replaces the event files of ``directory`` by one holding ``points``.

  The new file (named ``events.out.tfevents.<n>.easgd``, ``n`` one past the
  highest there) is written atomically, then every other event file of
  ``directory`` is deleted: an interrupt leaves the old files, or the new one
  beside them (which a reader's purge at its step 0 makes the only one read).

  Args:
    directory: the TensorBoard run directory (created if missing).
    points: ``(step, {tag: value})``, as :func:`event_file_bytes`.
    hparams: as :func:`event_file_bytes`.

  Returns:
    The path of the new file.

  Raises:
    OSError: the file cannot be written.
  """
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  old = [p for p in directory.iterdir() if p.is_file() and "tfevents" in p.name]
  numbers = [int(m.group(1)) for m in map(_FILE.match, (p.name for p in old)) if m]
  path = directory / f"events.out.tfevents.{max(numbers, default=0) + 1:010d}.easgd"
  write_bytes_atomic(path, event_file_bytes(points, hparams))
  for p in old:  # (and a temporary file a killed write left: one writer per workdir)
    if p.name != path.name:
      p.unlink(missing_ok=True)
  return path


def write_run_events(workdir, config_fields: Mapping[str, Any], history: Sequence[dict]) -> Path:
  """``workdir/tb``: the run's metrics records as scalars, its config as hyperparameters.

  Called wherever ``metrics.jsonl`` is written (the trainer, after
  ``easgd.training.rundir.write_metrics``), with the same records.

  Args:
    workdir: the run directory.
    config_fields: the run's config (``TrainConfig.to_dict()``).
    history: the records of ``metrics.jsonl`` (each with ``step``).

  Returns:
    The event file's path.

  Raises:
    OSError: the file cannot be written.
  """
  points = [(r["step"], scalars_of(r)) for r in history]
  return write_events(Path(workdir) / TB_DIR, points, hparams_of(config_fields))


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


_CURVES = ("test_error", "val_error", "test_loss", "val_loss", "train_loss")
"""The protocol report's curves (``<name>_curve`` per seed), written as scalars."""


def write_protocol_events(workdir, results: Mapping[str, Any]) -> list[Path]:
  """``workdir/tb``: the protocol's curves, one TensorBoard run per arm and seed.

  Report runs: ``tb/report/<arm>/seed_<s>`` (the arm's name as one path
  component: "/" as "_", a repeat suffixed ``_2``), the scalars :data:`_CURVES` at
  the arm's evaluation steps; tuning runs: ``tb/tune/<arm>/lr_<rate>/seed_<s>``,
  ``val_error`` (the tuning curves share the report's evaluation steps). Each
  has the arm's config, with its rate and seed, as hyperparameters (and
  ``phase``, ``arm``). Event files under ``tb/`` of an earlier protocol that
  this one did not write are deleted.

  Args:
    workdir: the protocol's directory.
    results: what ``easgd.protocol.runs.run_protocol`` returns (``arms``:
      ``config``, ``report`` with ``seeds``, ``eval_steps`` and the curves,
      ``tuning`` per rate with ``val_error_curve`` per tuning seed).

  Returns:
    The paths of the files written.

  Raises:
    OSError: a file cannot be written.
  """
  root = Path(workdir) / TB_DIR
  tune_seeds = list(results["protocol"]["tune_seeds"])
  written, dirs = [], set()
  for arm, res in results["arms"].items():
    report, fields = res["report"], dict(res["config"], arm=arm)
    name = _dir_name(arm, dirs)
    steps = report["eval_steps"]
    for i, seed in enumerate(report["seeds"]):
      curves = {c: report[f"{c}_curve"][i] for c in _CURVES}
      points = [(t, {c: v[k] for c, v in curves.items()}) for k, t in enumerate(steps)]
      lr = res["chosen_learning_rate"]
      hp = hparams_of(dict(fields, learning_rate=lr, seed=seed, phase="report"))
      written.append(write_events(root / "report" / name / f"seed_{seed}", _finite(points), hp))
    for rate in res["tuning"] or ():
      lr = rate["learning_rate"]
      for seed, curve in zip(tune_seeds, rate["val_error_curve"]):
        points = [(t, {"val_error": v}) for t, v in zip(steps, curve)]
        hp = hparams_of(dict(fields, learning_rate=lr, seed=seed, phase="tune"))
        path = root / "tune" / name / f"lr_{lr:g}" / f"seed_{seed}"
        written.append(write_events(path, _finite(points), hp))
  keep = set(written)
  for p in root.rglob("*tfevents*"):
    if p.is_file() and p not in keep:
      p.unlink(missing_ok=True)
  return written
