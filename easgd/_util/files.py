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


_received: list[int] = []
"""The signals (SIGINT, SIGTERM) received under :func:`terminate_as_interrupt` or
:func:`interrupts_deferred` and not yet raised at a safe point: an exception
raised from a signal handler can be swallowed (a ``gc.callbacks`` function such
as JAX's, a ``__del__``, a weakref callback), so the signal is also kept here
for :func:`check_interrupt`."""

_deferring = [0]  # open interrupts_deferred blocks: the handler only records


def _interrupt(signum: int) -> KeyboardInterrupt:
  """The exception that stands for ``signum``: KeyboardInterrupt or Terminated."""
  if signum == signal.SIGINT:
    return KeyboardInterrupt()
  return Terminated(f"signal {signum} (SIGTERM)")


def _on_signal(signum, frame):
  """Records ``signum``; raises it unless a write is in progress or one was raised.

  Only the first signal raises: a later one arrives while the first unwinds
  (``finally`` blocks, the release of the workdir's lock) and must not cut that
  short; it is kept, and :func:`pending_interrupt` reports it.
  """
  del frame
  first = not _received
  _received.append(signum)
  if first and not _deferring[0]:
    raise _interrupt(signum)


def pending_interrupt() -> KeyboardInterrupt | None:
  """The exception of the first signal received and not yet cleared, or None."""
  return _interrupt(_received[0]) if _received else None


def check_interrupt() -> None:
  """Raises the first signal received (:func:`pending_interrupt`), if any: a safe point.

  The handler raises at once, wherever the program is; when that exception is
  swallowed (a garbage-collection callback, a ``__del__``), the run goes on
  until its next safe point, this call: the loops call it once per step. Costs
  one list read.

  Raises:
    KeyboardInterrupt: SIGINT was received (:class:`Terminated`: SIGTERM).
  """
  if _received:
    raise _interrupt(_received[0])


def clear_interrupts() -> None:
  """Forgets the signals received (once the command has reported them)."""
  _received.clear()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
  """SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) during the block, SIGINT
  ``KeyboardInterrupt``; neither is ever lost.

  Python's default for SIGTERM ends the process at once, with no clean-up; a
  job scheduler's stop then looks like SIGKILL. Inside this block it stops the
  program as Ctrl-C does: ``finally`` blocks run and a checkpoint save in
  progress completes first (:func:`interrupts_deferred`). Each signal is also
  recorded: an exception raised from the handler inside a garbage-collection
  callback (JAX's) or a ``__del__`` is swallowed by Python, so the loops raise it
  again at their next step (:func:`check_interrupt`) and the caller reads
  :func:`pending_interrupt` before it reports success. The record is cleared
  when the block ends. Off the main thread the block runs as is.

  Raises:
    Terminated: when SIGTERM arrives (outside :func:`interrupts_deferred`).
    KeyboardInterrupt: when SIGINT arrives (likewise).
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    clear_interrupts()


def sigterm_is_interrupt() -> bool:
  """Whether SIGTERM is now :func:`terminate_as_interrupt`'s handler."""
  return signal.getsignal(signal.SIGTERM) is _on_signal


def restore_sigterm_as_interrupt() -> None:
  """Puts :func:`terminate_as_interrupt`'s SIGINT and SIGTERM handler back (main thread
  only), e.g. after a library (``ray.init``) replaced them."""
  if threading.current_thread() is threading.main_thread():
    for s in (signal.SIGINT, signal.SIGTERM):
      signal.signal(s, _on_signal)


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
  """SIGINT's and SIGTERM's handlers after the block are those before it (main thread
  only; elsewhere the block runs as is).

  Reinstalled with ``signal.signal`` whatever ``signal.getsignal`` reports: a
  library's C code may install its own with ``sigaction`` during the block
  (JAX's preemption notifier, in ``jax.distributed.initialize``), which
  ``signal.getsignal`` does not see. A handler Python did not install (None) is
  left as is.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for s, handler in previous.items():
      if handler is not None:
        signal.signal(s, handler)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
  """Holds back Ctrl-C (SIGINT) and SIGTERM until the block is done, then raises.

  For a write that must not be cut in half (a checkpoint save and its clean-up
  of older checkpoints): a SIGINT during the block is remembered and raised as
  ``KeyboardInterrupt`` when the block ends; a SIGTERM, when
  :func:`terminate_as_interrupt` is on, likewise as :class:`Terminated`. Off
  the main thread (where Python delivers no signals) the block runs as is; so
  does a SIGINT that is neither Python's handler nor :func:`terminate_as_interrupt`'s.

  Raises:
    KeyboardInterrupt: after the block, if SIGINT (or, as :class:`Terminated`,
      SIGTERM) arrived during it.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  library = signal.getsignal(signal.SIGINT) is signal.default_int_handler
  before = len(_received)
  _deferring[0] += 1
  if library:  # no terminate_as_interrupt: SIGINT is recorded for this block only
    signal.signal(signal.SIGINT, _on_signal)
  try:
    yield
  finally:
    _deferring[0] -= 1
    if library:
      signal.signal(signal.SIGINT, signal.default_int_handler)
  arrived = _received[before:]
  if library:
    del _received[before:]  # raised here; nothing else reads them
  if arrived and not before:  # an earlier signal is unwinding, or a safe point raises it
    raise _interrupt(arrived[0])
