"""The real asynchronous runtime across hosts: the center and the workers as Ray actors.

Ray (https://docs.ray.io; ``pip install 'easgd[ray]'``) runs each worker as an
actor, a process of its own on any node of the cluster, computing on that
process's devices (one GPU each when the cluster has a GPU per worker), and
the center as one more actor. Ray runs an actor's methods one at a time, so
the center actor's ``exchange`` (an ``easgd.runtimes.shared.CenterStore``) is
atomic: an exchange reads the center, applies the master's rule and replies
before the next one starts. A worker actor runs ``WorkerLoop.run`` chunks that
``easgd.runtimes.driver.Driver`` hands out from the driver process; each
exchange is one call from the worker to the center (message and reply as
host arrays).

Every actor builds its own copy of the run from a picklable ``factory()``
returning an ``easgd.runtimes.shared.AsyncSetup`` (``easgd.runtimes.async_runs``
passes the config), so nothing but states, messages and replies crosses the
network. On one machine :func:`connect` starts a local Ray instance
(``ray.init()``); give an address to join a running cluster, on whose nodes
easgd (with the same JAX version) must be installed.

Faults: a worker whose process dies (``RayActorError``) is restarted by Ray
(``max_restarts``) and then by :meth:`RayBackend.restart` from the current
center, at its clock after its last exchange (no exchange is repeated or
lost); a worker whose step raises is restarted the same way, in its process.
The restart is logged; the other workers never stop. An error of the user's
data or task (``AsyncSetup.user_errors``) is no fault: it stops the run
(``easgd.runtimes.shared.UserFault``), as on the threads runtime. A chunk of steps is
never retried by Ray (at-most-once: ``max_task_retries=0``); the calls that
may be repeated safely (state, restart, warm-up) are retried while Ray
restarts the process.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import uuid
import warnings
from typing import Any, Callable, Sequence

import jax

from easgd._util import files
from easgd.asynchrony.log import async_rules, init_shared, init_worker, restart_worker
from easgd.parallel import distributed
from easgd.runtimes import link_emulation
from easgd.runtimes.driver import WorkerLost, WorkersLostError
from easgd.runtimes.shared import (
    AsyncSetup,
    CenterStore,
    ChunkResult,
    UserFault,
    WorkerLoop,
    WorkerPrograms,
)

MAX_RESTARTS = 3
"""How many times a worker actor is restarted (by Ray and by the driver)."""


class Connection:
  """A connection to Ray made by :func:`connect`; ``close`` ends what it started."""

  def __init__(self, started: bool):
    self.started = started

  def close(self) -> None:
    """Shuts Ray down if :func:`connect` started it (a caller's ``ray.init`` stays)."""
    if self.started:
      import ray

      ray.shutdown()
      self.started = False


def connect(address: str | None = None) -> Connection:
  """Connects to Ray: a running cluster at ``address``, or a new local instance.

  If Ray is already initialised in this process (e.g. by the caller's
  ``ray.init(num_cpus=2)``), that connection is used and left open.

  A local instance uses Ray's token authentication: chosen here
  (``RAY_AUTH_MODE=token``, unless the environment names a mode or this process
  imported Ray before), so Ray prints no notice of its default. Ray's own
  messages below warnings are not shown, nor JAX's warning of a fork while
  ``ray.init`` starts Ray's processes (docs/guides/runtimes.md).

  Args:
    address: the cluster's address ("ray://head:10001", "head:6379",
      "auto"), or None to start Ray on this machine.

  Returns:
    A :class:`Connection`; its ``close()`` shuts down what it started.

  Raises:
    easgd.parallel.distributed.StartupError: Ray cannot start or the cluster cannot be
      reached (one line; ``easgd train`` exits with status 3).
  """
  if address in (None, "local") and "ray" not in sys.modules:  # Ray reads it when imported
    os.environ.setdefault("RAY_AUTH_MODE", "token")
  import ray

  if ray.is_initialized():
    return Connection(False)
  if address not in (None, "auto", "local"):
    _probe(address)  # ray.init would wait minutes for an unreachable cluster
  sigterm_is_interrupt = files.sigterm_is_interrupt()
  try:
    with warnings.catch_warnings():
      # Ray starts its processes by fork and, at once, exec of its programs (its preexec_fn
      # masks SIGINT and ties the child to its parent): they run no JAX, which warns of
      # every fork once its backends run.
      warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
      ray.init(
          address=address,
          include_dashboard=False,
          log_to_driver=False,
          logging_level=logging.WARNING,
      )
  except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError ...
    text = str(e).strip().splitlines()
    where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
    raise distributed.StartupError(
        f"cannot connect to {where}: {type(e).__name__}: " f"{(text[0] if text else '')[:300]}"
    ) from None
  finally:
    if sigterm_is_interrupt:  # ray.init replaces it by sys.exit
      files.restore_sigterm_as_interrupt()
  return Connection(True)


def connect_to(config) -> Connection:
  """:func:`connect` to ``config.ray_address`` (runtime "ray"'s ``connect`` in
  ``easgd.settings.runtime_table``)."""
  return connect(config.ray_address)


PROBE_TIMEOUT_S = 10.0
"""Seconds :func:`connect` waits for a TCP connection to a cluster's address."""


def _probe(address: str) -> None:
  """Raises StartupError unless ``address`` ([ray://]host:port) accepts a connection."""
  host, sep, port = address.removeprefix("ray://").rpartition(":")
  if not sep or not host or not port.isdigit():
    raise distributed.StartupError(
        f"ray_address must be [ray://]host:port or 'auto', got {address!r}"
    )
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S):
      pass
  except OSError as e:
    raise distributed.StartupError(
        f"cannot reach the Ray cluster at {address!r} ({e.strerror or e}); start one "
        f"with 'ray start --head' there, or leave ray_address unset for a local "
        f"Ray"
    ) from None


class CenterActor:
  """The center in its own process (wrapped with ``ray.remote`` by :class:`RayBackend`).

  Args:
    factory: ``factory() -> AsyncSetup``.
    shared: the master's state to start from, or None (initial).
    log: the exchange log so far.
    elapsed_s: seconds the run has already taken.
  """

  def __init__(self, factory: Callable[[], AsyncSetup], shared, log, elapsed_s):
    setup = factory()
    rules = async_rules(setup.algorithm)
    if shared is None:
      shared = init_shared(rules, setup.params)
    self.store = CenterStore(rules, WorkerPrograms(rules), shared, None, log, elapsed_s)

  def exchange(self, worker, clock, message):
    return jax.device_get(self.store.exchange(worker, clock, message))

  def restart(self, worker, clock):
    return jax.device_get(self.store.restart(worker, clock))

  def fault(self, worker, clock, error=""):
    self.store.fault(worker, clock, error)

  def last_exchange_clock(self, worker):
    return self.store.last_exchange_clock(worker)

  def state(self):
    return self.store.state()

  def warm_up(self):
    self.store.warm_up()

  def start_clock(self, elapsed_s):
    self.store.start_clock(elapsed_s)


class WorkerActor:
  """One worker in its own process (wrapped with ``ray.remote`` by :class:`RayBackend`).

  Args:
    index: the worker's index.
    factory: ``factory() -> AsyncSetup``.
    center_name: the center actor's name (its handle is looked up by name, so
      that no handle is a constructor argument, which Ray re-runs on restart).
    delay_s: seconds to wait after each local step.
    link: the worker's ``easgd.runtimes.link_emulation.LinkSpec``, or None.

  The worker starts at the initial parameters; :meth:`set_state` (a resumed
  run) and :meth:`restart_from` (after a fault) replace its state (so the
  constructor's arguments stay small: Ray re-runs it on a restart).
  """

  def __init__(self, index, factory, center_name, delay_s, link=None):
    import ray

    center = ray.get_actor(center_name)  # by name: a restart finds it again
    self.setup = factory()
    self.rules = async_rules(self.setup.algorithm)
    state = init_worker(self.rules, self.setup.params)

    def exchange(worker, clock, message):
      return ray.get(center.exchange.remote(worker, clock, jax.device_get(message)))

    self.loop = WorkerLoop(
        index,
        WorkerPrograms(self.rules),
        self.setup,
        state,
        exchange,
        None,
        delay_s,
        link=None if link is None else link_emulation.WorkerLink(link),
    )

  def run(self, num_steps) -> ChunkResult:
    return self.loop.run(num_steps)

  def warm_up(self):
    self.loop.warm_up()

  def arm_fault(self, clock):
    self.loop.arm_fault(clock, lambda t: os._exit(1))  # the process dies

  def restart_from(self, center, clock):
    self.loop.set_state(restart_worker(self.rules, center, self.setup.params, clock))

  def set_state(self, state):
    self.loop.set_state(state)

  def state(self):
    return self.loop.host_state()


class RayBackend:
  """p worker actors and one center actor (``easgd.runtimes.driver.Backend``).

  Args:
    factory: ``factory() -> AsyncSetup``, picklable (called in every actor).
    num_workers: p.
    delays_s: seconds each worker waits after each local step (empty: none).
    workers: each worker's ``AsyncWorker`` to start from (host), or None.
    shared: the master's ``AsyncShared`` to start from, or None.
    log: the exchange log so far.
    elapsed_s: seconds the run has already taken.
    gpus_per_worker: GPUs per worker actor; None: 1 when the cluster has at
      least one GPU per worker, else 0.
    max_restarts: restarts of each worker (:data:`MAX_RESTARTS`).
    links: each worker's ``easgd.runtimes.link_emulation.LinkSpec``, or None.
  """

  restartable = True

  def __init__(
      self,
      factory: Callable[[], AsyncSetup],
      num_workers: int,
      *,
      delays_s: Sequence[float] = (),
      workers: Sequence | None = None,
      shared=None,
      log: Sequence[dict] = (),
      elapsed_s: float = 0.0,
      gpus_per_worker: float | None = None,
      max_restarts: int = MAX_RESTARTS,
      links: Sequence | None = None,
  ):
    import ray

    self._ray = ray
    self.num_workers = p = int(num_workers)
    if gpus_per_worker is None:
      gpus_per_worker = 1 if ray.cluster_resources().get("GPU", 0) >= p else 0
    delays = list(delays_s) or [0.0] * p
    center_cls = ray.remote(num_cpus=0)(CenterActor)
    worker_cls = ray.remote(num_cpus=0, num_gpus=gpus_per_worker, max_restarts=max_restarts)(
        WorkerActor
    )
    name = f"easgd-center-{uuid.uuid4().hex}"
    self.center = center_cls.options(name=name).remote(factory, shared, list(log), elapsed_s)
    self._ray.get(self.center.start_clock.remote(elapsed_s))  # the center is up
    links = [None] * p if links is None else list(links)
    self.actors = [worker_cls.remote(i, factory, name, delays[i], links[i]) for i in range(p)]
    if workers is not None:  # a resumed run
      self._ray.get([a.set_state.remote(w) for a, w in zip(self.actors, workers)])
    self._elapsed_s = float(elapsed_s)
    self._worker_of = {}

  def _get(self, ref, worker):
    return self._fetch(ref, WorkerLost, f"worker {worker}'s process")

  def submit(self, worker: int, num_steps: int):
    ref = self.actors[worker].run.remote(num_steps)
    self._worker_of[ref] = worker
    return ref

  def wait(self, handles):
    ready, _ = self._ray.wait(list(handles), num_returns=1)
    return ready

  def result(self, handle) -> ChunkResult:
    return self._get(handle, self._worker_of.pop(handle))

  def _center(self, ref):
    return self._fetch(ref, WorkersLostError, "the center's process")

  def _fetch(self, ref, error, whose: str):
    """``ray.get(ref)``; a dead actor's process becomes ``error`` (one line)."""
    try:
      return self._ray.get(ref)
    except self._ray.exceptions.RayActorError as e:
      text = str(e).strip().splitlines()
      raise error(
          f"{whose} died ({type(e).__name__}: " f"{(text[0] if text else '')[:200]})"
      ) from None

  def fault(self, worker: int, clock: int, error: str = "") -> int:
    """Logs the fault at the worker's clock after its last exchange, if later."""
    last = self._center(self.center.last_exchange_clock.remote(worker))
    clock = max(int(clock), int(last) + 1)
    self._center(self.center.fault.remote(worker, clock, error))
    return clock

  def restart(self, worker: int, clock: int) -> int:
    """Restarts ``worker`` from the current center after its last exchange."""
    last = self._center(self.center.last_exchange_clock.remote(worker))
    clock = max(int(clock), int(last) + 1)
    center = self._center(self.center.restart.remote(worker, clock))
    self._get(
        self.actors[worker].restart_from.options(max_task_retries=-1).remote(center, clock), worker
    )  # retried until Ray has restarted the process
    return clock

  def warm_up(self) -> None:
    """Waits for every actor to be built and its programs compiled.

    Raises:
      easgd.runtimes.shared.UserFault: a worker cannot read its first batch
        (the user's data), one line.
    """
    try:
      self._ray.get(
          [self.center.warm_up.remote()]
          + [a.warm_up.options(max_task_retries=-1).remote() for a in self.actors]
      )
    except self._ray.exceptions.RayTaskError as e:  # the actor's own exception, wrapped
      if isinstance(e.cause, UserFault):
        raise UserFault(str(e.cause)) from None
      raise
    self._ray.get(self.center.start_clock.remote(self._elapsed_s))

  def arm_fault(self, worker: int, clock: int) -> None:
    """Makes ``worker``'s process exit before its local step ``clock``."""
    self._ray.get(self.actors[worker].arm_fault.remote(clock))

  def state(self):
    """``(worker states, master state, log)`` as host values; call when idle."""
    workers = [
        self._get(a.state.options(max_task_retries=-1).remote(), i)
        for i, a in enumerate(self.actors)
    ]
    shared, log = self._center(self.center.state.remote())
    return workers, shared, log

  def in_flight(self) -> list[tuple[int, Any]]:
    """No exchange is in flight between chunks: the Ray runtime does not read ``delay``
    (``easgd.settings.runtime_table``), so every worker applies its reply at once."""
    return [(-1, None)] * self.num_workers

  def close(self) -> None:
    """Ends the actors."""
    for actor in [*self.actors, self.center]:
      self._ray.kill(actor, no_restart=True)
