"""The real asynchronous runtime on one host: one Python thread per worker.

Each worker is an ``easgd.runtimes.shared.WorkerLoop`` on its own thread (a
one-thread executor, so its steps run in order), computing on its device: the
workers are spread over ``devices`` as the SPMD layout spreads them (worker i
on device i // (p / d)); several workers may share a device. The center is
held once, on ``center_device``, by an ``easgd.runtimes.shared.CenterStore``
whose lock makes each exchange atomic. JAX releases the GIL while a program
runs, so the workers compute concurrently; Python holds it only for the
dispatch of each step.

Guarantees: every exchange reads the center and applies the master's rule
without interleaving with another; every exchange is logged with the worker,
its local clock and the center version it read; the log replays the run bit
for bit (``easgd.runtimes.shared.replay_run``, same compiled programs on the
same kind of device). Not guaranteed: the order of exchanges, which depends
on timing (threads, the OS scheduler, ``delays_s``).

Faults: a worker whose step raises stops (the error is reported in the
chunk's result and logged); the other workers go on and take its share of
the budget (``easgd.runtimes.driver``). It is not restarted: in the same process
the same code would most likely raise again; nor after ``--resume``, which
goes on with the faults of its checkpoint (``easgd.runtimes.driver.logged_faults``).
An error of the user's data or task (``AsyncSetup.user_errors``) is no fault:
the run stops on it (``easgd.runtimes.shared.UserFault``).
"""

from __future__ import annotations

import concurrent.futures as futures
from typing import Sequence

import jax

from easgd.asynchrony import simulator
from easgd.asynchrony.log import async_rules, init_shared, init_worker
from easgd.runtimes import link_emulation
from easgd.runtimes.shared import AsyncSetup, CenterStore, ChunkResult, WorkerLoop, WorkerPrograms


class ThreadBackend:
  """p workers on threads of this process, the center in its memory.

  Implements ``easgd.runtimes.driver.Backend``.

  Args:
    setup: the run's ``AsyncSetup``.
    devices: one device per worker (None: JAX's default device for all).
    center_device: the device that holds the center (None: ``devices[0]``).
    delays_s: seconds each worker waits after each local step (empty: none).
    workers: each worker's ``AsyncWorker`` to start from (host arrays; None:
      every worker at ``setup.params``, clock 0).
    shared: the master's ``AsyncShared`` to start from (None: initial).
    log: the exchange log so far (a resumed run).
    elapsed_s: seconds the run has already taken.
    record: keep each worker's float64 sums of messages and replies
      (``WorkerLoop.sums``).
    links: each worker's ``easgd.runtimes.link_emulation.LinkSpec`` (its
      emulated link), or None: no link.
    in_flight: each worker's exchange in flight to start with (a resumed run with
      overlap): ``(apply_at, reply)``, apply_at -1 for none
      (``WorkerLoop.set_in_flight``); None: none.
  """

  restartable = False

  def __init__(
      self,
      setup: AsyncSetup,
      num_workers: int,
      *,
      devices: Sequence | None = None,
      center_device=None,
      delays_s: Sequence[float] = (),
      workers: Sequence | None = None,
      shared: simulator.AsyncShared | None = None,
      log: Sequence[dict] = (),
      elapsed_s: float = 0.0,
      record: bool = False,
      links: Sequence | None = None,
      in_flight: Sequence | None = None,
  ):
    rules = async_rules(setup.algorithm)
    self.num_workers = p = int(num_workers)
    self.devices = list(devices) if devices is not None else [None] * p
    if center_device is None:
      center_device = self.devices[0]
    self.programs = WorkerPrograms(rules)
    if shared is None:
      shared = init_shared(rules, setup.params)
    self.center = CenterStore(rules, self.programs, shared, center_device, log, elapsed_s)
    self._elapsed_s = float(elapsed_s)
    delays = list(delays_s) or [0.0] * p
    if workers is None:
      workers = [init_worker(rules, setup.params)] * p
    self.loops = [
        WorkerLoop(
            i,
            self.programs,
            setup,
            workers[i],
            self.center.exchange,
            self.devices[i],
            delays[i],
            record,
            None if links is None else link_emulation.WorkerLink(links[i]),
        )
        for i in range(p)
    ]
    for loop, (apply_at, reply) in zip(self.loops, in_flight or ()):
      loop.set_in_flight(int(apply_at), reply)
    self._pools = [
        futures.ThreadPoolExecutor(1, thread_name_prefix=f"easgd-worker-{i}") for i in range(p)
    ]

  def submit(self, worker: int, num_steps: int) -> futures.Future:
    return self._pools[worker].submit(self.loops[worker].run, num_steps)

  def wait(self, handles):
    return futures.wait(handles, return_when=futures.FIRST_COMPLETED).done

  def result(self, handle: futures.Future) -> ChunkResult:
    return handle.result()

  def fault(self, worker: int, clock: int, error: str = "") -> int:
    self.center.fault(worker, clock, error)
    return clock  # the thread reported its exact clock

  def restart(self, worker: int, clock: int) -> int:
    raise NotImplementedError("the threads runtime does not restart workers")

  def warm_up(self) -> None:
    """Compiles every program on every device before the run's clock starts."""
    self.center.warm_up()
    for f in [pool.submit(loop.warm_up) for pool, loop in zip(self._pools, self.loops)]:
      f.result()
    self.center.start_clock(self._elapsed_s)

  def arm_fault(self, worker: int, clock: int) -> None:
    """Makes ``worker`` raise before its local step ``clock`` (tests, experiments)."""
    self.loops[worker].arm_fault(clock)

  def state(self):
    """``(worker states, master state, log)`` as host values; call when idle."""
    shared, log = self.center.state()
    return [loop.host_state() for loop in self.loops], shared, log

  def in_flight(self) -> list[tuple[int, object]]:
    """Each worker's exchange in flight, ``(apply_at, reply)`` as host values
    (``WorkerLoop.host_in_flight``: ``(-1, None)`` for none); call when idle."""
    return [loop.host_in_flight() for loop in self.loops]

  def close(self) -> None:
    """Stops the workers after their current step and ends their threads."""
    for loop in self.loops:
      loop.stop()
    for pool in self._pools:
      pool.shutdown(wait=True)


def worker_devices(num_workers: int, devices: Sequence) -> list:
  """Worker i on device i // (p / d), as the SPMD layout places it.

  Args:
    num_workers: p, a multiple of ``len(devices)``.
    devices: the d devices.

  Returns:
    p devices, one per worker.
  """
  per = num_workers // len(devices)
  return [devices[i // per] for i in range(num_workers)]


def default_devices(num_workers: int) -> list:
  """The devices a threads run uses by default: as many as divide p."""
  available = jax.devices()
  d = max(n for n in range(1, min(num_workers, len(available)) + 1) if num_workers % n == 0)
  return worker_devices(num_workers, available[:d])
