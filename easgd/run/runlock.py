"""One workdir, one command: an OS lock held on the workdir for the whole run.

``easgd train``, ``compare``, ``protocol`` and ``sweep`` (and their library
entry points ``easgd.run.trainer.train_and_evaluate``, ``easgd.run.compare.compare``,
``easgd.protocol.runs.run_protocol``, ``easgd.sweeps.command.run_sweep``) hold an exclusive
``flock`` on ``workdir/.easgd.lock`` (:data:`LOCK_FILE`) from before their
workdir checks until they return, so two commands started together on one
workdir cannot both pass the "empty directory" check: the second stops at once
with :class:`WorkdirInUseError` (one line naming the holder; exit status 2 on
the command line). Who holds it (pid, host, command line, start time) is in
``workdir/.easgd.lock.json`` (:data:`HOLDER_FILE`, written atomically by
``easgd._util.files``); both files are removed when the command ends, and neither
counts as a run's files (``easgd.run.rundir.RUN_FILES``).

The OS drops the lock of a process that dies (SIGKILL, a crash, a lost
machine); its holder file stays, and the next command takes the lock over with
one :class:`WorkdirLockWarning` naming the dead process. In a multi-process run
(``easgd.parallel.distributed``) only the primary process, the one that writes, takes
the lock. A comparison locks its own directory and each of its runs its
sub-directory. On a platform or file system without ``flock`` a command warns
once and runs unlocked.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import shlex
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

try:
  import fcntl
except ImportError:  # not POSIX: no flock
  fcntl = None

from easgd._util.files import write_text_atomic
from easgd.run import rundir
from easgd.settings.config import ConfigError

LOCK_FILE = ".easgd.lock"  # the file flock holds (empty)
HOLDER_FILE = ".easgd.lock.json"  # who holds it: pid, host, command, argv, started
LOCK_FILES = (LOCK_FILE, HOLDER_FILE)
"""The lock's files: never part of a run, a comparison, a sweep or a protocol."""

_HOLDER_WAIT_S = 1.0  # how long a refused command waits for the holder to write its file


class WorkdirInUseError(ConfigError):
  """Another process holds the workdir (:func:`hold_workdir`)."""


class WorkdirLockWarning(UserWarning):
  """The lock of a dead process was taken over, or the workdir cannot be locked."""


@contextlib.contextmanager
def hold_workdir(workdir, command: str, *, primary: bool = True) -> Iterator[Path]:
  """Holds ``workdir``'s lock for the block: one command per workdir at a time.

  Creates ``workdir`` (and its parents) if missing, takes the exclusive
  ``flock`` of ``workdir/.easgd.lock`` without waiting and writes the holder
  file; at the end of the block removes both files and, if it created
  ``workdir`` and nothing else was written there, ``workdir`` itself.

  Args:
    workdir: the command's directory (str or path-like).
    command: what holds it, as the holder file and messages name it, e.g.
      ``"train"`` (shown as ``easgd train``).
    primary: whether this process writes to ``workdir``. False (a secondary
      process of a multi-process run, ``easgd.parallel.distributed.is_primary``): no
      lock is taken and nothing is written.

  Yields:
    ``Path(workdir)``.

  Raises:
    WorkdirInUseError: another process (or another hold in this process)
      holds it; the one-line message names its pid, host, command line and
      start time.
    ConfigError: ``workdir`` is blank, exists and is not a directory, or
      cannot be created or written.

  Warns:
    WorkdirLockWarning: the lock of a dead process is taken over (one line
      naming its pid, host and command), or the file system cannot lock.

  Example::

    with hold_workdir("runs/a", "train"):
      ...  # check runs/a, then write to it
  """
  workdir = rundir.workdir_path(workdir)
  if not primary:
    yield workdir
    return
  if workdir.exists() and not workdir.is_dir():
    raise ConfigError(f"workdir '{workdir}' exists and is not a directory")
  created = not workdir.exists()
  rundir.ensure_writable_dir(workdir)
  fd = _lock(workdir)
  try:
    if fd is not None:
      dead = _read_holder(workdir)  # the flock is free: its holder is gone
      write_text_atomic(workdir / HOLDER_FILE, json.dumps(_holder(command)) + "\n")
      if dead is not None:
        warnings.warn(
            f"took over the lock of workdir '{workdir}' from dead process " f"{_describe(dead)}",
            WorkdirLockWarning,
            stacklevel=3,
        )
    yield workdir
  finally:
    if fd is not None:
      try:
        for name in (HOLDER_FILE, LOCK_FILE):  # while still held: no one locks a removed file
          with contextlib.suppress(OSError):
            (workdir / name).unlink()
      finally:
        os.close(fd)  # releases the flock
    if created:
      with contextlib.suppress(OSError):
        workdir.rmdir()  # only if empty: a command that wrote nothing leaves nothing


def _lock(workdir: Path) -> int | None:
  """The descriptor of ``workdir``'s locked lock file; None where flock is missing."""
  path = workdir / LOCK_FILE
  for _ in range(10):  # the path changes only when a holder removes it on release
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise ConfigError(
          f"workdir '{workdir}' cannot be locked: '{path}': " f"{e.strerror or e}"
      ) from None
    try:
      if fcntl is None:
        raise OSError(errno.ENOSYS, "no fcntl.flock on this platform")
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
        raise WorkdirInUseError(_in_use_message(workdir)) from None
      warnings.warn(
          f"workdir '{workdir}' cannot be locked ({e.strerror or e}); two "
          "commands started on it would not be kept apart",
          WorkdirLockWarning,
          stacklevel=4,
      )
      return None
    try:
      if os.path.samestat(os.fstat(fd), os.stat(path)):
        return fd
    except FileNotFoundError:
      pass
    os.close(fd)  # a released holder removed this file between open and flock: again
  raise WorkdirInUseError(
      f"workdir '{workdir}' is in use: its lock file '{path}' keeps "
      "being replaced; wait for the other commands or choose "
      "another workdir"
  )


def _holder(command: str) -> dict[str, Any]:
  """The holder file's record of this process."""
  argv = [Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
  return dict(
      pid=os.getpid(),
      host=socket.gethostname(),
      command=f"easgd {command}",
      argv=argv,
      started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
  )


def _read_holder(workdir: Path) -> dict[str, Any] | None:
  """The holder file's record, or None if it is missing or unreadable."""
  try:
    holder = json.loads((workdir / HOLDER_FILE).read_text())
  except (OSError, ValueError):
    return None
  return holder if isinstance(holder, dict) else None


def _describe(holder: dict[str, Any]) -> str:
  """``P on host H (easgd train: cli.py train --workdir X ..., started T)``."""
  argv = holder.get("argv")
  line = (
      " ".join(shlex.quote(str(a)) for a in argv)
      if isinstance(argv, list)
      else "command line unknown"
  )
  return (
      f"{holder.get('pid', '?')} on host {holder.get('host', '?')} "
      f"({holder.get('command', 'easgd')}: {line}, started {holder.get('started', '?')})"
  )


def _in_use_message(workdir: Path) -> str:
  """The refusal, naming the holder once it has written its file."""
  deadline = time.monotonic() + _HOLDER_WAIT_S
  holder = _read_holder(workdir)
  while holder is None and time.monotonic() < deadline:  # it locked, not yet written
    time.sleep(0.05)
    holder = _read_holder(workdir)
  who = f"pid {_describe(holder)}" if holder is not None else "another easgd process"
  return f"workdir '{workdir}' is in use by {who}; wait for it to end or choose another " "workdir"
