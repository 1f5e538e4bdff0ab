"""Atomic file writes: the one writer of every file easgd leaves behind.

Each file is written to a temporary file beside it (``.<name>.tmp<pid>``) and
renamed over the target (``os.replace``), so a reader, a crash or a SIGKILL
never sees a half-written file: the previous file stays until the new one is
complete. No other easgd module is imported here, so every layer can use it
(the asynchronous engine's exchange log, the sweep, the trainer, compare and
export).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


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
