"""Atomic file writes: the one writer of every file easgd leaves behind.

Also :func:`interrupts_deferred`, for writes that span several files (an
Orbax checkpoint): Ctrl-C waits until they are complete.

Each file is written to a temporary file beside it (``.<name>.tmp<pid>``) and
renamed over the target (``os.replace``), so a reader, a crash or a SIGKILL
never sees a half-written file: the previous file stays until the new one is
complete. No other easgd module is imported here, so every layer can use it
(the asynchronous engine's exchange log, the sweep, the trainer, compare and
export).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Callable, Iterator


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


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
  """Holds back Ctrl-C (SIGINT) until the block is done, then raises it.

  For a write that must not be cut in half (a checkpoint save and its clean-up
  of older checkpoints): a SIGINT during the block is remembered and raised as
  ``KeyboardInterrupt`` when the block ends. Off the main thread (where Python
  delivers no signals) or when SIGINT is not Python's handler, the block runs
  as is.

  Raises:
    KeyboardInterrupt: after the block, if SIGINT arrived during it.
  """
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
    yield
    return
  received = []
  previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
  if received:
    raise KeyboardInterrupt
