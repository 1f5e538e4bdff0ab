"""Atomic file writes: the one writer of every file easgd leaves behind.

Also :func:`json_text`, the one writer of JSON text (every ``.json`` and
``.jsonl`` file easgd writes is strict JSON: a non-finite number is written
as ``null``), and :func:`interrupts_deferred`, for writes that span several
files (an Orbax checkpoint): Ctrl-C (and SIGTERM under
:func:`terminate_as_interrupt`, which the command line turns on) waits until
they are complete.

Each file is written to a temporary file beside it (``.<name>.tmp<pid>``) and
renamed over the target (``os.replace``), so a reader, a crash or a SIGKILL
never sees a half-written file: the previous file stays until the new one is
complete. No other easgd module is imported here, so every layer can use it
(the asynchronous engine's exchange log, the sweep, the trainer, compare and
export).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterator


def _write_atomic(path, write: Callable[[Path], object]) -> None:
  path = Path(path)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  write(tmp)
  os.replace(tmp, path)


def write_text_atomic(path, text: str) -> None:
  """Replaces ``path`` by ``text`` through a temporary file and a rename.

  Args:
    path: the file (str or path-like); its directory must exist.
    text: the whole content (``Path.write_text``'s default encoding).

  Raises:
    OSError: the file cannot be written; ``path`` is then left as it was.
  """
  _write_atomic(path, lambda tmp: tmp.write_text(text))


def write_bytes_atomic(path, data: bytes) -> None:
  """Replaces ``path`` by ``data`` through a temporary file and a rename.

  Args:
    path: the file (str or path-like); its directory must exist.
    data: the whole content.

  Raises:
    OSError: the file cannot be written; ``path`` is then left as it was.
  """
  _write_atomic(path, lambda tmp: tmp.write_bytes(data))


def json_ready(value: Any) -> Any:
  """``value`` with every non-finite float replaced by None, NumPy values as Python ones.

  Walks dicts, lists and tuples (tuples become lists); NumPy scalars become
  Python ones and NumPy arrays nested lists (both through ``.tolist()``, which
  NumPy provides without importing it here); ``float('nan')``, ``inf`` and
  ``-inf``, Python or NumPy, become None. Other values are returned as they are.

  Args:
    value: a JSON-like structure (dict keys are left as they are).

  Returns:
    The same structure, holding no NaN or Infinity.
  """
  if isinstance(value, float):  # numpy.float64 too
    return float(value) if math.isfinite(value) else None
  if isinstance(value, dict):
    return {k: json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [json_ready(v) for v in value]
  if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
    return json_ready(value.tolist())  # scalars (float32, int64, bool_) and arrays
  return value


def json_text(value: Any, indent: int | None = None, sort_keys: bool = False) -> str:
  """``value`` as strict JSON text: the writer of every JSON file easgd writes.

  A non-finite number (NaN, +/-Infinity; Python or NumPy, inside dicts and
  lists too) is written as ``null`` (:func:`json_ready`): in easgd's files
  ``null`` where a number belongs means the value was not finite (a diverged
  run's loss or error) or was not measured (e.g. the training loss of step
  0, before any step). The text is what ``json.dumps(..., allow_nan=False)``
  writes, so strict JSON parsers (and ``json.loads`` with a
  ``parse_constant`` that refuses ``NaN``) read every file.

  Args:
    value: a JSON-like structure (dicts, lists, tuples, str, int, float,
      bool, None, NumPy scalars and arrays).
    indent: as ``json.dumps`` (None: one line, as a JSON-lines record).
    sort_keys: as ``json.dumps``.

  Returns:
    The JSON text (no trailing newline).

  Raises:
    TypeError: a value JSON has no form for (e.g. an object).

  Example:
    >>> json_text({"loss": float("nan"), "steps": [0, 1]})
    '{"loss": null, "steps": [0, 1]}'
  """
  return json.dumps(json_ready(value), indent=indent, sort_keys=sort_keys, allow_nan=False)


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised like Ctrl-C while :func:`terminate_as_interrupt` is on."""


def _raise_terminated(signum, frame):
  raise Terminated(f"signal {signum} (SIGTERM)")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
  """SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) during the block.

  Python's default for SIGTERM ends the process at once, with no clean-up; a
  job scheduler's stop then looks like SIGKILL. Inside this block it stops the
  program as Ctrl-C does: ``finally`` blocks run and a checkpoint save in
  progress completes first (:func:`interrupts_deferred`). Off the main thread
  the block runs as is.

  Raises:
    Terminated: when SIGTERM arrives (outside :func:`interrupts_deferred`).
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.signal(signal.SIGTERM, _raise_terminated)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def sigterm_is_interrupt() -> bool:
  """Whether SIGTERM is now :func:`terminate_as_interrupt`'s handler."""
  return signal.getsignal(signal.SIGTERM) is _raise_terminated


def restore_sigterm_as_interrupt() -> None:
  """Puts :func:`terminate_as_interrupt`'s SIGTERM handler back (main thread only),
  e.g. after a library (``ray.init``) replaced it."""
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _raise_terminated)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
  """Holds back Ctrl-C (SIGINT) and SIGTERM until the block is done, then raises.

  For a write that must not be cut in half (a checkpoint save and its clean-up
  of older checkpoints): a SIGINT during the block is remembered and raised as
  ``KeyboardInterrupt`` when the block ends; a SIGTERM, when
  :func:`terminate_as_interrupt` is on, likewise as :class:`Terminated`. Off
  the main thread (where Python delivers no signals) the block runs as is; so
  does a SIGINT that is not Python's handler.

  Raises:
    KeyboardInterrupt: after the block, if SIGINT (or, as :class:`Terminated`,
      SIGTERM) arrived during it.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  deferred = []
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    deferred.append(signal.SIGINT)
  if sigterm_is_interrupt():
    deferred.append(signal.SIGTERM)
  received = []
  previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in deferred}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  if signal.SIGINT in received:
    raise KeyboardInterrupt
  if received:
    raise Terminated(f"signal {received[0]} (SIGTERM)")
