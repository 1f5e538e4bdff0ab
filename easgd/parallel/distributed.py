"""Several processes, one run: ``jax.distributed`` setup and a peer watchdog.

Multi-process training runs the same program in every process (SPMD): the
workers of :mod:`easgd.parallel.worker_layout` are spread over ALL processes' devices with the
``"shard_map"`` backend, each process feeds the batches of its own workers, and
process 0 writes metrics, summaries and checkpoints (host copies gathered from
all processes). This module holds the process-level part:

  :func:`resolve`     the process settings from flags or the environment;
  :func:`initialize`  gloo collectives on CPU, ``jax.distributed.initialize``
                      under a :class:`StartupGuard`, then a :class:`Watchdog`;
  :func:`is_primary`, :func:`barrier`, :func:`fail`, :func:`leave`, :func:`shutdown`.

Environment (read by :func:`resolve` when a flag is not given):
  ``JAX_COORDINATOR_ADDRESS``  host:port of process 0's coordination service
                               (the variable ``jax.distributed.initialize``
                               itself reads);
  ``JAX_NUM_PROCESSES``        number of processes (this package's name; JAX
                               reads the count only from cluster managers such
                               as Slurm or Open MPI);
  ``JAX_PROCESS_ID``           this process's id in [0, JAX_NUM_PROCESSES).

Start-up. ``jax.distributed.initialize`` blocks until every process has
connected to process 0's coordination service. If one never does, JAX 0.10.2
aborts every waiting process (SIGABRT, a C++ stack trace on stderr, nothing
Python can catch) about 5 s after its ``initialization_timeout``; with JAX's
default of 300 s that is 305 s. :func:`initialize` instead runs a
:class:`StartupGuard` that stops the process after
``ProcessSetup.initialization_timeout_s`` (default 30 s; ``easgd train
--startup-timeout``) with one line ``easgd: error: ...`` naming the process(es)
that did not join, or the coordinator that could not be reached, and exit
status :data:`EXIT_PEER_LOST`; JAX's own deadline is set 30 s later. Process 0
checks first that the coordinator's port is free (JAX 0.10.2 otherwise raises
"Failed to start RPC server" or, if the holder set SO_REUSEADDR, crashes with
SIGSEGV).

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
import math
import os
import socket
import sys
import threading
import time
from typing import Callable, Mapping

import jax

from easgd._util import checks, files

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"

EXIT_PEER_LOST = 3
"""Exit status of a process that stops because another one was lost or never
joined, or because the run could not start (:class:`StartupError`)."""

STARTUP_TIMEOUT_S = 30.0
"""Default of ``ProcessSetup.initialization_timeout_s`` (``--startup-timeout``)."""

_JAX_DEADLINE_MARGIN_S = 30
"""JAX's ``initialization_timeout`` is the guard's limit plus this (seconds)."""

_TIMEOUT_FLAGS = {
    "heartbeat_timeout_s": "--heartbeat-timeout",
    "peer_timeout_s": "--peer-timeout",
    "initialization_timeout_s": "--startup-timeout",
}

_KEY = "easgd/heartbeat/{}"
_DONE = "done"


class DistributedError(ValueError):
  """The process settings are missing or inconsistent."""


class StartupError(RuntimeError):
  """A multi-process run could not start (the CLI exits with EXIT_PEER_LOST)."""


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
    initialization_timeout_s: seconds each process waits, from its own call
      of :func:`initialize`, for all processes to connect before it stops
      with an error (:class:`StartupGuard`); ``--startup-timeout``.
  """

  coordinator_address: str
  num_processes: int
  process_id: int
  heartbeat_timeout_s: int = 100
  peer_timeout_s: float = 10.0
  initialization_timeout_s: float = STARTUP_TIMEOUT_S


def resolve(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    env: Mapping[str, str] | None = None,
    **timeouts,
) -> ProcessSetup | None:
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
  missing = [
      name
      for name, v in (
          ("--coordinator-address/" + ENV_COORDINATOR, address),
          ("--num-processes/" + ENV_NUM_PROCESSES, n),
          ("--process-id/" + ENV_PROCESS_ID, pid),
      )
      if v is None
  ]
  if missing:
    raise DistributedError(f"a multi-process run needs {', '.join(missing)} as well")
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise DistributedError(
        f"coordinator address must be host:port with a port in " f"[1, 65535], got {address!r}"
    )
  if not 0 <= pid < n:
    raise DistributedError(f"process id {pid} is outside [0, {n}) for {n} processes")
  kw = {k: v for k, v in timeouts.items() if v is not None}
  unknown = set(kw) - set(_TIMEOUT_FLAGS)
  if unknown:
    raise TypeError(f"unknown setting(s) {sorted(unknown)}")
  for k, v in kw.items():
    kw[k] = checks.real(
        k, v, 0, open_low=True, error=DistributedError, what=f"{_TIMEOUT_FLAGS[k]}, seconds"
    )
  if "heartbeat_timeout_s" in kw:  # JAX takes whole seconds
    kw["heartbeat_timeout_s"] = max(1, int(round(kw["heartbeat_timeout_s"])))
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
  return checks.integer(flag, value, low, error=DistributedError)


_WATCHDOG: "Watchdog | None" = None


def initialize(setup: ProcessSetup | None) -> "Watchdog | None":
  """Joins the run described by ``setup`` (no-op for None) and starts a watchdog.

  Must run before JAX touches a device. On CPU, cross-process collectives
  need gloo: ``jax_cpu_collectives_implementation`` is set to "gloo" first.
  JAX's preemption service is turned off (``jax_enable_preemption_service``: its
  notifier takes SIGTERM and the run goes on) and the SIGINT and SIGTERM
  handlers are those before the call (see docs/guides/checkpoints.md).
  Process 0 first checks that the coordinator's port is free. A
  :class:`StartupGuard` bounds the wait for the other processes: after
  ``setup.initialization_timeout_s`` seconds it prints one line
  ``easgd: error: ...`` naming the process(es) that did not join (or the
  coordinator that could not be reached) and exits the process with status
  :data:`EXIT_PEER_LOST`, before JAX's own deadline (30 s later) would abort
  it with a C++ stack trace.

  Args:
    setup: from :func:`resolve`; None for a single process.

  Returns:
    The started :class:`Watchdog`, or None for a single process.

  Raises:
    StartupError: process 0's coordinator port is taken, or
      ``jax.distributed.initialize`` raised (its first line is quoted).
  """
  global _WATCHDOG
  if setup is None:
    return None
  if setup.process_id == 0:
    _check_port_free(setup)
  guard = StartupGuard(setup)
  guard.start()
  try:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # no preemption service: its notifier takes SIGTERM (a C handler, a thread) and the run goes on
    jax.config.update("jax_enable_preemption_service", False)
    with files.signal_handlers_kept():  # the command's SIGINT and SIGTERM handlers stay
      jax.distributed.initialize(
          setup.coordinator_address,
          setup.num_processes,
          setup.process_id,
          initialization_timeout=(
              math.ceil(setup.initialization_timeout_s) + _JAX_DEADLINE_MARGIN_S
          ),
          heartbeat_timeout_seconds=setup.heartbeat_timeout_s,
      )
  except Exception as e:
    text = str(e).strip().splitlines()
    raise StartupError(
        f"process {setup.process_id} of {setup.num_processes} could not join the "
        f"run at {setup.coordinator_address}: {type(e).__name__}: "
        f"{(text[0] if text else '')[:300]}"
    ) from None
  finally:
    guard.cancel()
  from jax._src import distributed as _jax_distributed

  _WATCHDOG = Watchdog(
      _jax_distributed.global_state.client,
      setup.process_id,
      setup.num_processes,
      setup.peer_timeout_s,
      coordinator=setup.coordinator_address,
  )
  _WATCHDOG.start()
  return _WATCHDOG


def _host_port(address: str) -> tuple[str, int]:
  host, _, port = address.rpartition(":")
  return host.strip("[]"), int(port)


def _check_port_free(setup: ProcessSetup) -> None:
  """Raises StartupError if process 0 cannot bind the coordinator's port.

  JAX binds ``[::]:PORT`` (or ``$JAX_COORDINATOR_BIND_ADDRESS``, then nothing
  is checked here); on a taken port JAX 0.10.2 raises "Failed to start RPC
  server" or crashes with SIGSEGV. The probe sets SO_REUSEADDR, as gRPC does,
  so that a port left in TIME_WAIT by an earlier run still counts as free.
  """
  if os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
    return  # bound elsewhere than we would check
  port = _host_port(setup.coordinator_address)[1]
  family, address = (
      (socket.AF_INET6, ("::", port)) if socket.has_ipv6 else (socket.AF_INET, ("0.0.0.0", port))
  )
  try:
    with socket.socket(family, socket.SOCK_STREAM) as s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
      s.bind(address)
  except OSError as e:
    raise StartupError(
        f"process 0 of {setup.num_processes} cannot start the coordination "
        f"service: port {port} (of --coordinator-address "
        f"{setup.coordinator_address}) is not free on this machine "
        f"({e.strerror or e}); choose another port"
    ) from None


def _reachable(host: str, port: int, timeout_s: float) -> bool:
  """True if a TCP connection to host:port opens within ``timeout_s``."""
  try:
    with socket.create_connection((host, port), timeout=timeout_s):
      return True
  except OSError:
    return False


def _processes(ids: list[int], n: int) -> str:
  if len(ids) == 1:
    return f"process {ids[0]} of {n}"
  return f"one or more of processes {', '.join(map(str, ids))} of {n}"


class StartupGuard:
  """Stops a start-up that does not complete in time, with a one-line error.

  ``jax.distributed.initialize`` waits in C++ (GIL released) until all
  processes have connected, and JAX 0.10.2 aborts the process when its
  deadline passes. This daemon thread fires first: after ``timeout_s``
  seconds (``setup.initialization_timeout_s`` by default) it calls
  ``on_timeout(message)``, by default printing ``easgd: error: <message>`` and
  exiting with :data:`EXIT_PEER_LOST`. Until then it tries a TCP connection to
  the coordinator every ``poll_s`` seconds, to tell a coordinator that never
  came up from processes that did not join. JAX does not say which processes
  have connected, so the message names those that may be missing: for process
  0 all others, for process i the others except 0 and i.

  Args:
    setup: the run (address, size, this process's id, the limit).
    timeout_s: limit in seconds; default ``setup.initialization_timeout_s``.
    poll_s: seconds between connection checks.
    on_timeout: called once with the message; default: print it and exit.
  """

  def __init__(
      self,
      setup: ProcessSetup,
      timeout_s: float | None = None,
      poll_s: float = 0.5,
      on_timeout: Callable[[str], None] | None = None,
  ):
    self.setup = setup
    self.timeout_s = float(setup.initialization_timeout_s if timeout_s is None else timeout_s)
    self.poll_s = poll_s
    self.on_timeout = on_timeout or (lambda message: _exit(message, EXIT_PEER_LOST))
    self.reached = False  # the coordinator accepted a TCP connection
    self.fired = False
    self._lock = threading.Lock()
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._run, name="easgd-startup-guard", daemon=True)

  def start(self) -> None:
    """Starts the clock (call right before ``jax.distributed.initialize``)."""
    self._thread.start()

  def cancel(self) -> bool:
    """Start-up finished (or failed otherwise): stops the guard.

    Returns:
      True if the guard had not fired (it never will now), False if it had.
    """
    with self._lock:
      self._done.set()
      return not self.fired

  def message(self) -> str:
    """The error for a start-up that did not complete within ``timeout_s``."""
    n, i, address = (
        self.setup.num_processes,
        self.setup.process_id,
        self.setup.coordinator_address,
    )
    within = f"within {self.timeout_s:g} s (--startup-timeout)"
    if i == 0 and not self.reached:
      return (
          f"process 0 of {n} could not reach its own coordination service at "
          f"{address} {within}: is that host an address of this machine?"
      )
    if i == 0:
      return (
          f"{_processes(list(range(1, n)), n)} did not join the run {within}; "
          f"process 0 waited at {address} (not started, crashed, or given "
          f"another --coordinator-address/--num-processes?)"
      )
    if not self.reached:
      return (
          f"process {i} of {n} could not reach the coordinator (process 0) "
          f"at {address} {within}: process 0 is not running there (not "
          f"started, exited, or another address/port?)"
      )
    others = [j for j in range(1, n) if j != i]
    who = (
        f"{_processes(others, n)} did not join"
        if others
        else "process 0 did not complete the start-up"
    )
    return (
        f"process {i} of {n} reached the coordinator (process 0) at {address} "
        f"but the run did not start {within}: {who}, or another process "
        f"already uses --process-id {i}"
    )

  def _run(self) -> None:
    host, port = _host_port(self.setup.coordinator_address)
    deadline = time.monotonic() + self.timeout_s
    while True:
      left = deadline - time.monotonic()
      if left <= 0:
        break
      if not self.reached:
        self.reached = _reachable(host, port, min(self.poll_s, left))
      if self._done.wait(max(0.0, min(self.poll_s, deadline - time.monotonic()))):
        return
    if not self.reached:  # last look, in case it came up at the end
      self.reached = _reachable(host, port, 0.2)
    with self._lock:
      if self._done.is_set():
        return
      self.fired = True
      self.on_timeout(self.message())


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


def leave(status: int) -> None:
  """Exits this process of a multi-process run at once with ``status`` (130 or
  143: a signal stopped it, its files complete; the command has reported it).

  Skips ``jax.distributed``'s shutdown barrier (an ``atexit`` function of JAX),
  where this process would wait for peers that wait for it in a collective; they
  stop with an error within their peer timeout (:class:`Watchdog`) or at once
  (their collective fails, or process 0's coordination service is gone).
  """
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


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

  def __init__(
      self,
      client,
      process_id: int,
      num_processes: int,
      peer_timeout_s: float,
      interval_s: float | None = None,
      coordinator: str = "",
      on_lost: Callable[[str], None] | None = None,
  ):
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
    self._thread = threading.Thread(target=self._run, name="easgd-watchdog", daemon=True)

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
    seen = {i: (None, now) for i in peers}  # last value, local time it changed
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
              f"{now - unreachable_since:.1f} s: {str(e).splitlines()[0][:200]}"
          )
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
            f"collective"
        )
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
