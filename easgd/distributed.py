"""Several processes, one run: ``jax.distributed`` setup and a peer watchdog.

Multi-process training runs the same program in every process (SPMD): the
workers of :mod:`easgd.workers` are spread over ALL processes' devices with the
``"shard_map"`` backend, each process feeds the batches of its own workers, and
process 0 writes metrics, summaries and checkpoints (host copies gathered from
all processes). This module holds the process-level part:

  :func:`resolve`     the process settings from flags or the environment;
  :func:`initialize`  gloo collectives on CPU, ``jax.distributed.initialize``
                      with the given timeouts, and a :class:`Watchdog`;
  :func:`is_primary`, :func:`barrier`, :func:`fail`, :func:`shutdown`.

Environment (read by :func:`resolve` when a flag is not given):
  ``JAX_COORDINATOR_ADDRESS``  host:port of process 0's coordination service
                               (the variable ``jax.distributed.initialize``
                               itself reads);
  ``JAX_NUM_PROCESSES``        number of processes (this package's name; JAX
                               reads the count only from cluster managers such
                               as Slurm or Open MPI);
  ``JAX_PROCESS_ID``           this process's id in [0, JAX_NUM_PROCESSES).

Failure handling. A collective waits for every process; if one dies, the others
would wait in it (gloo raises at once when the peer's socket resets, but a
stopped or partitioned peer never answers). Two bounds apply:
  * the :class:`Watchdog`: each process publishes a heartbeat counter in the
    coordination service's key-value store every ``interval_s`` and reads the
    others'; a peer whose counter has not moved for ``peer_timeout_s`` is
    declared lost and this process prints an error naming it and exits with
    status :data:`EXIT_PEER_LOST` (``os._exit``: the main thread may be stuck
    in a collective that no exception can interrupt);
  * JAX's own heartbeat (``heartbeat_timeout_s``): the coordination service
    terminates every process once one has missed its heartbeats that long.
Keep ``peer_timeout_s`` below ``heartbeat_timeout_s`` so the named error comes
first. A peer that is alive but stuck in Python code keeps its heartbeat and
is not detected.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import Callable, Mapping

import jax

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"

EXIT_PEER_LOST = 3
"""Exit status of a process that stops because another one was lost."""

_KEY = "easgd/heartbeat/{}"
_DONE = "done"


class DistributedError(ValueError):
  """The process settings are missing or inconsistent."""


@dataclasses.dataclass(frozen=True)
class ProcessSetup:
  """How this process joins a multi-process run.

  Attributes:
    coordinator_address: ``host:port`` of process 0's coordination service.
    num_processes: number of processes, >= 1.
    process_id: this process's id in [0, num_processes).
    heartbeat_timeout_s: JAX's heartbeat timeout, in seconds (JAX: 100).
    peer_timeout_s: the :class:`Watchdog`'s limit, in seconds, on a peer's
      silence before it is declared lost.
    initialization_timeout_s: seconds to wait for all processes to connect.
  """
  coordinator_address: str
  num_processes: int
  process_id: int
  heartbeat_timeout_s: int = 100
  peer_timeout_s: float = 10.0
  initialization_timeout_s: int = 300


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, *, env: Mapping[str, str] | None = None,
            **timeouts) -> ProcessSetup | None:
  """The process settings from arguments, else the environment.

  Args:
    coordinator_address: ``host:port``; default ``$JAX_COORDINATOR_ADDRESS``.
    num_processes: default ``$JAX_NUM_PROCESSES``.
    process_id: default ``$JAX_PROCESS_ID``.
    env: the environment (default ``os.environ``).
    **timeouts: ``heartbeat_timeout_s``, ``peer_timeout_s``,
      ``initialization_timeout_s`` of :class:`ProcessSetup` (None: default).

  Returns:
    A :class:`ProcessSetup`, or None for a single-process run (nothing given,
    or one process).

  Raises:
    DistributedError: a value is malformed, only some are given, or the id is
      out of range; names the flag and the environment variable.
  """
  env = os.environ if env is None else env
  address = coordinator_address or env.get(ENV_COORDINATOR) or None
  n = _int_setting(num_processes, env, ENV_NUM_PROCESSES, "--num-processes", 1)
  pid = _int_setting(process_id, env, ENV_PROCESS_ID, "--process-id", 0)
  if address is None and n is None and pid is None:
    return None
  if n == 1 and pid in (None, 0):  # one process: nothing to join
    return None
  missing = [name for name, v in (("--coordinator-address/" + ENV_COORDINATOR, address),
                                  ("--num-processes/" + ENV_NUM_PROCESSES, n),
                                  ("--process-id/" + ENV_PROCESS_ID, pid)) if v is None]
  if missing:
    raise DistributedError(f"a multi-process run needs {', '.join(missing)} as well")
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit():
    raise DistributedError(f"coordinator address must be host:port, got {address!r}")
  if not 0 <= pid < n:
    raise DistributedError(f"process id {pid} is outside [0, {n}) for {n} processes")
  kw = {k: v for k, v in timeouts.items() if v is not None}
  unknown = set(kw) - {"heartbeat_timeout_s", "peer_timeout_s", "initialization_timeout_s"}
  if unknown:
    raise TypeError(f"unknown setting(s) {sorted(unknown)}")
  for k, v in kw.items():
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
      raise DistributedError(f"{k} must be a number of seconds > 0, got {v!r}")
  for k in ("heartbeat_timeout_s", "initialization_timeout_s"):
    if k in kw:
      kw[k] = max(1, int(round(kw[k])))
  return ProcessSetup(address, n, pid, **kw)


def _int_setting(value, env, var, flag, low):
  if value is None:
    text = env.get(var)
    if text is None or text == "":
      return None
    try:
      value = int(text)
    except ValueError:
      raise DistributedError(f"${var} must be an integer, got {text!r}") from None
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise DistributedError(f"{flag} must be an integer >= {low}, got {value!r}")
  return value


_WATCHDOG: "Watchdog | None" = None


def initialize(setup: ProcessSetup | None) -> "Watchdog | None":
  """Joins the run described by ``setup`` (no-op for None) and starts a watchdog.

  Must run before JAX touches a device. On CPU, cross-process collectives
  need gloo: ``jax_cpu_collectives_implementation`` is set to "gloo" first.

  Args:
    setup: from :func:`resolve`; None for a single process.

  Returns:
    The started :class:`Watchdog`, or None for a single process.
  """
  global _WATCHDOG
  if setup is None:
    return None
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      setup.coordinator_address, setup.num_processes, setup.process_id,
      initialization_timeout=setup.initialization_timeout_s,
      heartbeat_timeout_seconds=setup.heartbeat_timeout_s)
  from jax._src import distributed as _jax_distributed
  _WATCHDOG = Watchdog(_jax_distributed.global_state.client, setup.process_id,
                       setup.num_processes, setup.peer_timeout_s,
                       coordinator=setup.coordinator_address)
  _WATCHDOG.start()
  return _WATCHDOG


def is_multiprocess() -> bool:
  """True after :func:`initialize` joined a multi-process run (until shutdown)."""
  return _WATCHDOG is not None


def is_primary() -> bool:
  """True in the process that writes files (process 0; the only one if alone)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches ``barrier(name)``; no-op when alone."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def shutdown() -> None:
  """Stops the watchdog (telling peers this process finished) and leaves the run."""
  global _WATCHDOG
  if _WATCHDOG is not None:
    _WATCHDOG.stop()
    _WATCHDOG = None
    jax.distributed.shutdown()


def fail(error: BaseException, code: int = 1) -> None:
  """Reports ``error`` of a multi-process run and exits this process at once.

  If the watchdog finds (within its peer timeout) that another process is
  lost, the message names it and the status is :data:`EXIT_PEER_LOST`; the
  error itself (e.g. gloo's "Connection reset by peer") follows. The exit
  skips ``jax.distributed``'s shutdown barrier, which would wait for the lost
  process.
  """
  lost = None
  if _WATCHDOG is not None:
    _WATCHDOG.on_lost = lambda message: None  # report here, with the error
    lost = _WATCHDOG.wait_for_lost(_WATCHDOG.peer_timeout_s + 2)
  text = str(error).strip().splitlines()
  first = text[-1] if text else type(error).__name__
  if lost:
    _exit(f"{lost}; the collective failed with: {first[:300]}", EXIT_PEER_LOST)
  _exit(f"{type(error).__name__}: {first[:500]}", code)


def _exit(message: str, code: int) -> None:
  print(f"easgd: error: {message}", file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(code)


class Watchdog:
  """Declares a silent peer lost and stops this process with an error.

  A daemon thread publishes this process's heartbeat counter under
  ``easgd/heartbeat/<id>`` in the coordination service's key-value store every
  ``interval_s`` and reads every peer's. A peer whose counter has not changed
  for ``peer_timeout_s`` (measured on this process's clock, so clocks need not
  agree) is lost; so is the coordination service if it cannot be reached for
  that long. ``on_lost(message)`` then runs; the default prints
  ``easgd: error: process <i> of <n> stopped responding ...`` and exits with
  :data:`EXIT_PEER_LOST`.

  Args:
    client: ``jax.distributed``'s client (key_value_set / key_value_try_get).
    process_id, num_processes: this process and the run's size.
    peer_timeout_s: silence, in seconds, before a peer is lost.
    interval_s: seconds between heartbeats.
    coordinator: the coordinator's address, for messages.
    on_lost: called once with the message; default: print it and exit.
  """

  def __init__(self, client, process_id: int, num_processes: int,
               peer_timeout_s: float, interval_s: float | None = None,
               coordinator: str = "", on_lost: Callable[[str], None] | None = None):
    self.client = client
    self.process_id = process_id
    self.num_processes = num_processes
    self.peer_timeout_s = float(peer_timeout_s)
    self.interval_s = interval_s or min(0.5, self.peer_timeout_s / 10)
    self.coordinator = coordinator
    self.on_lost = on_lost or (lambda message: _exit(message, EXIT_PEER_LOST))
    self.lost: str | None = None
    self._stop = threading.Event()
    self._found = threading.Event()
    self._thread = threading.Thread(target=self._run, name="easgd-watchdog",
                                    daemon=True)

  def start(self) -> None:
    self._thread.start()

  def stop(self) -> None:
    """Stops beating and publishes "done", so peers do not count this as lost."""
    self._stop.set()
    self._thread.join(timeout=5 * self.interval_s + 1)
    try:
      self.client.key_value_set(_KEY.format(self.process_id), _DONE, True)
    except Exception:  # the service may already be gone at the end of a run
      pass

  def wait_for_lost(self, timeout_s: float) -> str | None:
    """The lost-peer message if one is found within ``timeout_s``, else None."""
    self._found.wait(timeout_s)
    return self.lost

  def _run(self) -> None:
    peers = [i for i in range(self.num_processes) if i != self.process_id]
    now = time.monotonic()
    seen = {i: (None, now) for i in peers}   # last value, local time it changed
    unreachable_since = None
    beat = 0
    while not self._stop.is_set():
      beat += 1
      now = time.monotonic()
      try:
        self.client.key_value_set(_KEY.format(self.process_id), str(beat), True)
        values = {i: self._try_get(i) for i in peers}
        unreachable_since = None
      except Exception as e:  # the coordination service is gone
        unreachable_since = unreachable_since or now
        if now - unreachable_since > self.peer_timeout_s:
          self._report(
              f"process {self.process_id} of {self.num_processes} lost the "
              f"coordination service at {self.coordinator} (process 0) for "
              f"{now - unreachable_since:.1f} s: {str(e).splitlines()[0][:200]}")
          return
        self._stop.wait(self.interval_s)
        continue
      lost = []
      for i, v in values.items():
        if v == _DONE:
          seen[i] = (v, now)
          continue
        if v != seen[i][0]:
          seen[i] = (v, now)
        elif now - seen[i][1] > self.peer_timeout_s:
          lost.append((i, now - seen[i][1]))
      if lost:
        names = ", ".join(f"process {i}" for i, _ in lost)
        self._report(
            f"{names} of {self.num_processes} stopped responding (no heartbeat "
            f"for {max(t for _, t in lost):.1f} s: died, hung or unreachable); "
            f"process {self.process_id} stops instead of waiting in a "
            f"collective")
        return
      self._stop.wait(self.interval_s)

  def _try_get(self, i: int) -> str | None:
    try:
      return self.client.key_value_try_get(_KEY.format(i))
    except Exception as e:
      if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
        return None
      raise

  def _report(self, message: str) -> None:
    self.lost = message
    self._found.set()
    self.on_lost(message)
