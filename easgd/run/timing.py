"""A run's training clock (``times.jsonl``) and its measured time to a target error.

``times.jsonl`` (``easgd.run.rundir.TIMES_FILE``) holds one JSON object per record
of ``metrics.jsonl``, in its order and with its steps: ``{"step": S, "time_s": T}``,
T the run's training clock when the state of step S was taken
(``easgd.runtimes.executor.Executor.train_seconds``, rounded to milliseconds):
seconds spent running steps, summed over the run's invocations, without
evaluations, files, checkpoints or compilation. Runtime "spmd" does not count
the first step an invocation runs (it compiles), so a resumed run's clock lacks
one step per resume, nor the compilations JAX reports later
(``easgd.runtimes.spmd.SpmdExecutor``); "threads" and "ray" count from the end
of their warm-up: the records' ``wall_time_s``. Step 0: 0.0. The times stay out of
``metrics.jsonl``, which is the same bit for bit at every run of a config.

A resumed run goes on with the clock of its checkpoint (its ``train_seconds``)
and keeps the earlier records of ``times.jsonl`` whose steps are its history's
(:func:`resumed_times`); where ``times.jsonl`` is missing, damaged or lacks a
step, that record's ``time_s`` is ``null`` (unknown), and the resume goes on.
A checkpoint saved before runtime "spmd" kept its clock restarts it at 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from easgd._util.files import json_text, write_text_atomic
from easgd.run.rundir import TIMES_FILE
from easgd.settings.config import ConfigError


def read_times(workdir) -> list[dict[str, Any]]:
  """The records of ``workdir/times.jsonl``, in order.

  Args:
    workdir: the run directory.

  Returns:
    ``[{"step": int, "time_s": float | None}, ...]`` (None: unknown).

  Raises:
    ConfigError: the file is missing, or a line is not such a record (names
      the file and the line).
  """
  path = Path(workdir) / TIMES_FILE
  try:
    lines = [l for l in path.read_text().splitlines() if l.strip()]
  except (OSError, ValueError) as e:
    raise ConfigError(f"'{path}' (the run's clock) cannot be read: {e}") from None
  records = []
  for i, line in enumerate(lines, 1):
    try:
      r = json.loads(line)
      step, t = r["step"], r["time_s"]
      ok = isinstance(step, int) and not isinstance(step, bool)
      ok = ok and (t is None or isinstance(t, (int, float)) and not isinstance(t, bool))
    except (ValueError, KeyError, TypeError):
      ok = False
    if not ok:
      raise ConfigError(
          f'\'{path}\' line {i} is not a record {{"step": int, "time_s": number}}: {line[:80]!r}'
      )
    records.append(dict(step=step, time_s=None if t is None else float(t)))
  return records


def resumed_times(workdir, history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """The clock records a resumed run goes on with: one per record of ``history``.

  Args:
    workdir: the run directory.
    history: the metrics records kept (``easgd.run.rundir.resumed_history``).

  Returns:
    ``{"step", "time_s"}`` per record of ``history``, ``time_s`` read from
    ``times.jsonl`` at that step, None where the file is missing, damaged or
    has no record of the step (never refuses the resume).
  """
  try:
    known = {r["step"]: r["time_s"] for r in read_times(workdir)}
  except ConfigError:
    known = {}
  return [dict(step=r["step"], time_s=known.get(r["step"])) for r in history]


def write_times(workdir, times: Sequence[dict[str, Any]]) -> None:
  """Writes ``times.jsonl`` (atomically): one ``{"step", "time_s"}`` per line.

  Raises:
    OSError: the file cannot be written.
  """
  write_text_atomic(Path(workdir) / TIMES_FILE, "".join(json_text(r) + "\n" for r in times))


def clock_record(step: int, seconds: float) -> dict[str, Any]:
  """The ``times.jsonl`` record of the evaluation of step ``step`` at clock ``seconds``."""
  return dict(step=int(step), time_s=round(float(seconds), 3))


TOLERANCE = 1e-12
"""Float rounding allowed in ``1 - test_accuracy <= target`` (1 - 0.7 is 0.30000000000000004)."""


def time_to_target(
    history: Sequence[dict[str, Any]], times: Sequence[dict[str, Any]], target_error: float
) -> dict[str, Any]:
  """The measured time at which a run's center first reached a test error.

  The rule: the first evaluated record (in order) whose center test error
  ``1 - test_accuracy`` is <= ``target_error`` (up to :data:`TOLERANCE`).
  The run crossed the target between the evaluation before it and it, so the
  true crossing time lies in ``[bracket_s, time_s]``; the resolution is
  ``time_s - bracket_s`` (evaluate more often, ``eval_every_steps``, to
  narrow it). Reached at step 0: both 0.0.

  Args:
    history: the metrics records (``metrics.jsonl``), each with ``step`` and
      ``test_accuracy`` (a fraction; None: not measured, skipped).
    times: the clock records (:func:`read_times`), the same steps in order.
    target_error: the test error to reach, in (0, 1).

  Returns:
    ``{"step": S, "time_s": T, "bracket_s": B}`` (seconds on the run's
    training clock; None where ``times`` does not know it), or all three None
    when the run never reached the target.

  Raises:
    ValueError: ``target_error`` not a number in (0, 1); a record without
      ``test_accuracy`` (a task whose evaluation has no ``"correct"`` metric);
      ``times`` whose steps are not ``history``'s.
  """
  if (
      not isinstance(target_error, (int, float))
      or isinstance(target_error, bool)
      or not 0 < target_error < 1
  ):
    raise ValueError(f"target_error must be a number in (0, 1), got {target_error!r}")
  for r in history:
    if "test_accuracy" not in r:
      raise ValueError(
          f"the record of step {r.get('step')!r} has no test_accuracy (a task without a "
          "'correct' metric); time to target needs a task with test accuracy"
      )
  steps, clock = [r["step"] for r in history], [t["step"] for t in times]
  if steps != clock:
    raise ValueError(f"times at steps {clock} do not match the metrics' steps {steps}")
  for i, r in enumerate(history):
    accuracy = r["test_accuracy"]
    if accuracy is None or not math.isfinite(accuracy):
      continue
    if 1 - accuracy <= target_error + TOLERANCE:
      time_s = times[i]["time_s"]
      return dict(step=r["step"], time_s=time_s, bracket_s=times[i - 1]["time_s"] if i else time_s)
  return dict(step=None, time_s=None, bracket_s=None)
