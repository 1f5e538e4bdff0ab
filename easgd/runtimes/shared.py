"""What the real asynchronous runtimes share: programs, the center, the log, a worker.

The real runtimes (``easgd.runtimes.threads``: one thread per worker in this
process; ``easgd.runtimes.ray_actors``: Ray actors, on one machine or a cluster) run the
rules an asynchronous algorithm is built from (``Algorithm.async_rules``, see
``easgd.asynchrony.simulation.AsyncRules``) for real: workers never wait for each other,
and each exchange with the center happens when that worker reaches it. Both
are made of the pieces here:

  :class:`WorkerPrograms`  the per-event functions of
                           ``easgd.asynchrony.log.RulePrograms`` compiled with
                           ``jax.jit`` (no collective, no axis name): ``local``
                           (a local step without exchange), ``propose``,
                           ``serve``, ``finish`` (an exchange step);
  :class:`CenterStore`     the center, held once on one device, and its
                           exchange log; an exchange reads the center, applies
                           the master's rule and returns the reply under one
                           lock, so exchanges are never interleaved;
  :class:`WorkerLoop`      one worker: its state on its device, its local clock,
                           ``run(n)`` takes n local steps;
  :func:`replay_run`       a run's log through ``easgd.asynchrony.log.replay``
                           with these same compiled programs (bit for bit);
  :func:`write_log`, :func:`read_log`  the log as JSON lines.

Order of one exchange step (worker i at its clock t, ``rules.due(t)``): the
worker computes its local step at its snapshot (``propose``: the gradient and
its message, e.g. x^i for EASGD, the accumulated update for DOWNPOUR), then
the center serves it atomically (``serve``), then the worker finishes the step
with the reply (``finish``). Algorithm 1's exchange reads the center at the
start of the step; here it reads it after the worker's gradient, i.e. a
little later in wall-clock time. The arithmetic is Algorithm 1's (the
gradient and the elastic difference both at the pre-exchange snapshot); only
which center version is read depends on timing, and the log records it.

The exchange log: one record per event, in the order the center served them,
``{"event", "worker", "local_step", "version", "read_version", "time_s"}``
(``easgd.asynchrony.log.LOG_EVENTS``), a fault's also ``"error"`` (one line). ``version`` is the number of master
updates before this one, ``read_version`` the number contained in the center
the worker read: ``version`` for EASGD/EAMSGD (the center before its update),
``version + 1`` for the DOWNPOUR family (the fetch after its own push). A real
exchange is atomic, so there is no other staleness. ``time_s`` is seconds
since the run started (informational).

Overlap (async EASGD/EAMSGD with ``delay`` V >= 1, docs/guides/streaming.md
"Overlap in the asynchronous runtimes"): at an exchange clock s the worker
finishes its step with a zero reply and hands the exchange (push, ``serve``,
pull, with the emulated link's sleeps) to a thread of its own; it takes its
next V local steps meanwhile and applies the reply in its step s + V, waiting
for it there only if it has not arrived. The log records the exchange when the
center serves it, as without overlap; ``replay`` reads V from the algorithm.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Algorithms 1 and 2.
"""

from __future__ import annotations

import concurrent.futures as futures
import json
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np
from optax.tree_utils import tree_zeros_like

from easgd._util.files import json_text, write_text_atomic
from easgd.asynchrony import simulator
from easgd.asynchrony.log import Replayed, RulePrograms, async_rules, overlap_of, replay
from easgd.core.base import Algorithm

Params = Any

LOG_FIELDS = ("event", "worker", "local_step", "version", "read_version", "time_s", "error")
"""Fields of a record of a real run's exchange log (module docstring)."""


class AsyncSetup(NamedTuple):
  """Everything a worker of a real asynchronous run needs.

  Attributes:
    algorithm: an asynchronous algorithm (``Algorithm.async_rules``).
    params: the common initial parameters (host or device arrays).
    batch_fn: ``batch_fn(worker, clock) -> batch``: the mini-batch of worker
      ``worker``'s local step at its clock ``clock``; a function of (worker,
      clock) only, so that a replay can rebuild every batch.
    key: the run's base key; the step's key is
      ``easgd.asynchrony.log.local_key(key, worker, clock)``.
    user_errors: the exception types that are the user's fault (their data
      or task, e.g. ``easgd.tasks.task.TaskError``): raised by a worker's
      step, one stops the run as :class:`UserFault` instead of counting as
      the worker's (machine) fault.
  """

  algorithm: Algorithm
  params: Params
  batch_fn: Callable[[int, int], Any]
  key: jax.Array
  user_errors: tuple[type[BaseException], ...] = ()


class WorkerPrograms:
  """The per-event functions of an asynchronous method, compiled.

  ``jax.jit`` of ``easgd.asynchrony.log.RulePrograms``' methods: ``local``,
  ``propose``, ``serve``, ``finish`` (see there). A program runs on the device
  of the state it is given (compiled once per device). Threads may call them
  concurrently.

  Args:
    rules: the method's ``easgd.asynchrony.simulation.AsyncRules``.
  """

  def __init__(self, rules: simulator.AsyncRules):
    base = RulePrograms(rules)
    self.rules = rules
    self.local = jax.jit(base.local)
    self.propose = jax.jit(base.propose)
    self.serve = jax.jit(base.serve)
    self.finish = jax.jit(base.finish)


def _one_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


class CenterStore:
  """The center, held once on one device, served one exchange at a time.

  Args:
    rules: the method's rules.
    programs: the compiled programs (:class:`WorkerPrograms`).
    shared: the master's state to start from (an
      ``easgd.asynchrony.simulation.AsyncShared`` without history, host or device).
    device: the device that holds the center (None: JAX's default).
    log: the records of the run so far (a resumed run goes on with them).
    elapsed_s: seconds the run has already taken (``time_s`` goes on from it).
  """

  def __init__(
      self,
      rules: simulator.AsyncRules,
      programs: WorkerPrograms,
      shared: simulator.AsyncShared,
      device=None,
      log: Sequence[dict] = (),
      elapsed_s: float = 0.0,
  ):
    self.rules = rules
    self.programs = programs
    self.device = device
    self.shared = jax.device_put(shared, device)
    self.version = int(np.asarray(shared.master_clock))
    self.log = [dict(r) for r in log]
    self.step_end = rules.exchange_at == "step_end"
    self.last_exchange = {}
    for r in self.log:
      if r.get("event", "exchange") == "exchange":
        self.last_exchange[r["worker"]] = r["local_step"]
    self._start = time.time() - float(elapsed_s)
    self._lock = threading.Lock()

  def _record(self, event, worker, clock, read_version, **extra):
    self.log.append(
        dict(
            event=event,
            worker=int(worker),
            local_step=int(clock),
            version=self.version,
            read_version=int(read_version),
            time_s=round(time.time() - self._start, 6),
            **extra,
        )
    )

  def exchange(self, worker: int, clock: int, message) -> Params:
    """One exchange of worker ``worker`` at its local step ``clock``, atomic.

    Under the lock: the master's rule reads the current center, updates it
    (``programs.serve``) and the exchange is logged; no other exchange
    interleaves. The work is dispatched to the center's device and not
    waited for: the next exchange takes the new center as its input, so the
    dispatch order is the serving order.

    Args:
      worker: the worker's index.
      clock: its local clock t (the step's).
      message: its message (``programs.propose``).

    Returns:
      The reply, on the center's device.
    """
    message = jax.device_put(message, self.device)
    with self._lock:
      self.shared, reply = self.programs.serve(self.shared, message, self.shared.center)
      self._record("exchange", worker, clock, self.version + self.step_end)
      self.version += 1
      self.last_exchange[int(worker)] = int(clock)
    return reply

  def restart(self, worker: int, clock: int) -> Params:
    """Logs the restart of ``worker`` at its clock ``clock``; returns the center.

    Returns:
      ``shared.center`` as served so far (on the center's device): the
      parameters the worker restarts from (``easgd.asynchrony.log.restart_worker``).
    """
    with self._lock:
      self._record("restart", worker, clock, self.version)
      return self.shared.center

  def fault(self, worker: int, clock: int, error: str = "") -> None:
    """Logs that ``worker`` failed before its local step ``clock``, and ``error``
    (one line: what stopped it)."""
    with self._lock:
      self._record("fault", worker, clock, self.version, error=str(error))

  def start_clock(self, elapsed_s: float = 0.0) -> None:
    """Counts the log's ``time_s`` from now, plus ``elapsed_s`` (earlier training)."""
    self._start = time.time() - float(elapsed_s)

  def warm_up(self) -> None:
    """Compiles ``serve`` on the center's device (a discarded call)."""
    zeros = jax.tree.map(lambda c: c * 0, self.shared.center)
    jax.block_until_ready(self.programs.serve(self.shared, zeros, self.shared.center))

  def state(self) -> tuple[simulator.AsyncShared, list[dict]]:
    """A consistent ``(master state, log records)``, the state as host arrays."""
    with self._lock:
      shared, log = self.shared, list(self.log)
    return jax.device_get(shared), log

  def last_exchange_clock(self, worker: int) -> int:
    """The local step of ``worker``'s last exchange, -1 if none."""
    with self._lock:
      return self.last_exchange.get(int(worker), -1)


class ChunkResult(NamedTuple):
  """What :meth:`WorkerLoop.run` returns.

  Attributes:
    worker: the worker's index.
    clock: its local clock after the chunk (the steps it completed).
    losses: float32 [steps completed]: each step's mini-batch loss.
    seconds: wall time of the chunk.
    error: None, or one line naming the exception that stopped the worker
      before its local step ``clock`` (a machine fault).
    waited_s: seconds the worker waited for replies in flight (overlap V >= 1:
      the communication not hidden behind its local steps; 0 without overlap).
    user_error: None, or the one-line message of the user's error
      (``AsyncSetup.user_errors``) that stopped the worker before its local
      step ``clock``; the run stops (:class:`UserFault`).
  """

  worker: int
  clock: int
  losses: np.ndarray
  seconds: float
  error: str | None = None
  user_error: str | None = None
  waited_s: float = 0.0


class InFlight(NamedTuple):
  """A worker's exchange in flight (overlap V >= 1, module docstring).

  Attributes:
    apply_at: the local clock s + V whose step applies the reply.
    reply: a ``concurrent.futures.Future`` of the reply (on the worker's
      device); done at a chunk's end.
  """

  apply_at: int
  reply: futures.Future


class InjectedFault(RuntimeError):
  """A fault injected by :meth:`WorkerLoop.arm_fault` (tests, experiments)."""


class UserFault(Exception):
  """A worker met an error of the user's data or task (``AsyncSetup.user_errors``).

  Its message is that error's one line (e.g. ``task 'toy': train data: item 17
  cannot be read (...)``); the run stops on it as on the user's error, and it
  is never a worker's fault."""


class WorkerLoop:
  """One worker of a real asynchronous run: its state, clock and steps.

  Args:
    index: the worker's index i.
    programs: the compiled programs (:class:`WorkerPrograms`).
    setup: the run's :class:`AsyncSetup` (batches, key).
    state: the worker's ``AsyncWorker`` to start from (host or device arrays;
      its ``clock`` is the local clock).
    exchange: ``exchange(worker, clock, message) -> reply``: one atomic
      exchange with the center (:meth:`CenterStore.exchange`, or a call to a
      remote center).
    device: the device the worker computes on (None: JAX's default).
    delay_s: seconds the worker waits after each local step (an injected
      straggler; 0: none).
    record: keep float64 host sums of every message sent and reply received
      (``sums``; tests of conservation), at the cost of a host transfer per
      exchange.
    link: an ``easgd.runtimes.link_emulation.WorkerLink``: the worker sleeps
      for the delay it charges before each exchange (the push) and after it
      (the pull); None: no link.

  With overlap (``delay`` V >= 1 in the algorithm's hyperparameters) the push,
  exchange and pull run on a thread of the worker's own (module docstring);
  :attr:`in_flight` is the exchange not yet applied.
  """

  def __init__(
      self,
      index: int,
      programs: WorkerPrograms,
      setup: AsyncSetup,
      state: simulator.AsyncWorker,
      exchange: Callable,
      device=None,
      delay_s: float = 0.0,
      record: bool = False,
      link=None,
  ):
    self.index = int(index)
    self.programs = programs
    self.due = programs.rules.due
    self.batch_fn = setup.batch_fn
    self.user_errors = tuple(setup.user_errors)
    self.device = device
    self.key = jax.device_put(setup.key, device)
    self.exchange = exchange
    self.delay_s = float(delay_s)
    self.record = record
    self.link = link
    self.sums = None  # (messages, replies), float64 host trees, with record
    self.overlap = overlap_of(programs.rules)
    self.in_flight: InFlight | None = None
    self._sender = None  # the thread of the exchanges in flight (overlap)
    self._zeros = None  # the zero reply of a step that sends (overlap)
    self._index_arg = np.int32(self.index)
    self._fault = None
    self._stop = threading.Event()
    self.set_state(state)

  def set_state(self, state: simulator.AsyncWorker) -> None:
    """Places ``state`` on the worker's device; its clock becomes the worker's;
    an exchange in flight is dropped (a restart from the center)."""
    self.state = jax.device_put(state, self.device)
    self.clock = int(np.asarray(state.clock))
    self.in_flight = None

  def host_state(self) -> simulator.AsyncWorker:
    """The worker's state as host arrays (waits for its last step)."""
    return jax.device_get(self.state)

  def host_in_flight(self) -> tuple[int, Params | None]:
    """``(apply_at, reply)`` of the exchange in flight as host arrays, ``(-1, None)``
    if none; call between chunks (the reply has arrived)."""
    if self.in_flight is None:
      return -1, None
    return self.in_flight.apply_at, jax.device_get(self.in_flight.reply.result())

  def set_in_flight(self, apply_at: int, reply: Params | None) -> None:
    """Sets the exchange in flight (a resumed run's): its reply, applied in the
    step at clock ``apply_at``; ``apply_at`` < 0: none.

    Raises:
      ValueError: ``apply_at`` is not in (clock - 1, clock + V - 1], or the
        algorithm has no overlap.
    """
    if apply_at < 0:
      self.in_flight = None
      return
    if not self.clock <= apply_at < self.clock + self.overlap:
      raise ValueError(
          f"worker {self.index}: a reply in flight applied at local step {apply_at} with "
          f"its clock {self.clock} and delay {self.overlap}; allowed: local steps "
          f"[{self.clock}, {self.clock + self.overlap - 1}]"
      )
    done = futures.Future()
    done.set_result(jax.device_put(reply, self.device))
    self.in_flight = InFlight(int(apply_at), done)

  def arm_fault(self, clock: int, action: Callable[[int], None] | None = None) -> None:
    """Calls ``action(clock)`` once, before the local step ``clock`` (a test hook).

    Args:
      clock: the local step before which the fault fires.
      action: what happens; default: raise :class:`InjectedFault`.
    """

    def raise_fault(t):
      raise InjectedFault(f"fault injected into worker {self.index} before its " f"local step {t}")

    self._fault = (int(clock), action or raise_fault)

  def stop(self) -> None:
    """Makes a running :meth:`run` return after its current step (and its exchange
    in flight); ends the thread of the exchanges in flight."""
    self._stop.set()
    if self._sender is not None:
      self._sender.shutdown(wait=True)

  def warm_up(self) -> None:
    """Compiles the worker's programs: runs each once on its state, discards it.

    Raises:
      UserFault: the batch of the worker's clock cannot be read (an error of
        ``AsyncSetup.user_errors``).
    """
    try:
      batch = self.batch_fn(self.index, self.clock)
    except self.user_errors as e:
      raise UserFault(_user_line(e)) from None
    out = self.programs.local(self.state, batch, self.key, self._index_arg)
    _, proposal, message = self.programs.propose(self.state, batch, self.key, self._index_arg)
    reply = jax.tree.map(lambda m: m * 0, message)  # the reply's structure
    jax.block_until_ready((out, self.programs.finish(self.state, proposal, reply)))

  def _send(self, clock: int, message) -> Params:
    """One exchange: the push over the link, the center's serve, the pull; returns
    the reply on the worker's device (on the sender's thread with overlap)."""
    if self.link is not None:  # the push crosses the link, then the center serves
      self._stop.wait(self.link.push(message))
    reply = jax.device_put(self.exchange(self.index, clock, message), self.device)
    if self.link is not None:
      self._stop.wait(self.link.pull(reply))
    if self.record:
      self._accumulate(message, reply)
    return reply

  def _send_later(self, clock: int, message) -> InFlight:
    """Starts :meth:`_send` on the sender's thread; the reply is due at clock + V."""
    if self._sender is None:
      self._sender = futures.ThreadPoolExecutor(
          1, thread_name_prefix=f"easgd-exchange-{self.index}"
      )
    return InFlight(clock + self.overlap, self._sender.submit(self._send, clock, message))

  def _wait_in_flight(self) -> float:
    """Waits for the reply in flight, if any (it stays to be applied); returns
    the seconds waited. Raises what the exchange raised."""
    if self.in_flight is None or self.in_flight.reply.done():
      if self.in_flight is not None:
        self.in_flight.reply.result()  # its error, if any
      return 0.0
    start = time.perf_counter()
    self.in_flight.reply.result()
    return time.perf_counter() - start

  def _accumulate(self, message, reply):
    host = [jax.tree.map(lambda x: np.asarray(x, np.float64), t) for t in (message, reply)]
    self.sums = (
        host if self.sums is None else [jax.tree.map(np.add, a, b) for a, b in zip(self.sums, host)]
    )

  def run(self, num_steps: int) -> ChunkResult:
    """Takes ``num_steps`` local steps (fewer if stopped or on an error).

    Each step at clock t reads ``batch_fn(i, t)``; when ``due(t)`` it exchanges
    with the center (``propose``, ``exchange``, ``finish``), otherwise it runs
    ``local``. With overlap V >= 1 the step at an exchange clock s finishes with
    a zero reply while the exchange runs on the sender's thread, and the step at
    s + V finishes with its reply (``propose``, ``finish``); at the chunk's end
    the worker waits for a reply in flight, which stays to be applied. The host waits for each step's loss one step late (at most two
    steps in flight), and after each step for ``delay_s``. An exception stops
    the chunk; it is returned as ``user_error`` if it is one of
    ``AsyncSetup.user_errors`` (the user's data or task), else as ``error``
    (a machine fault), one line each, the state and clock being those after
    the last completed step.

    Args:
      num_steps: local steps to take, >= 0.

    Returns:
      A :class:`ChunkResult`.
    """
    start = time.perf_counter()
    losses, error, user_error, waited = [], None, None, 0.0
    try:
      for _ in range(int(num_steps)):
        if self._stop.is_set():
          break
        t = self.clock
        if self._fault is not None and self._fault[0] == t:
          _, action = self._fault
          self._fault = None
          action(t)
        batch = self.batch_fn(self.index, t)
        if self.due(t):
          loss, proposal, message = self.programs.propose(
              self.state, batch, self.key, self._index_arg
          )
          if self.overlap:  # x^i_{s+1} = x^i_s + u_s; the exchange goes on meanwhile
            if self._zeros is None:
              self._zeros = tree_zeros_like(message)
            self.in_flight = self._send_later(t, message)
            self.state = self.programs.finish(self.state, proposal, self._zeros)
          else:
            self.state = self.programs.finish(self.state, proposal, self._send(t, message))
        elif self.in_flight is not None and self.in_flight.apply_at == t:
          waited += self._wait_in_flight()  # the communication not hidden
          loss, proposal, _ = self.programs.propose(self.state, batch, self.key, self._index_arg)
          reply = self.in_flight.reply.result()
          self.state = self.programs.finish(self.state, proposal, reply)
          self.in_flight = None
        else:
          self.state, loss = self.programs.local(self.state, batch, self.key, self._index_arg)
        self.clock = t + 1
        if losses:  # one step late: the host prepares the next batch meanwhile
          losses[-1].block_until_ready()
        losses.append(loss)
        if self.delay_s:
          loss.block_until_ready()
          time.sleep(self.delay_s)
      waited += self._wait_in_flight()  # a boundary: the center has served it
      host = np.asarray(jax.device_get(losses), np.float32).reshape(-1)
    except self.user_errors as e:  # the user's data or task: the run stops on it
      user_error = _user_line(e)
      host = _finished_losses(losses)
    except Exception as e:  # a machine fault, reported: the other workers go on
      error = _one_line(e)
      host = _finished_losses(losses)
    if self.in_flight is not None:  # after an error too: the exchange is served
      futures.wait([self.in_flight.reply])
      if self.in_flight.reply.exception() is not None:  # not served: nothing to apply
        self.in_flight = None
    return ChunkResult(
        self.index, self.clock, host, time.perf_counter() - start, error, user_error, waited
    )


def _user_line(error: BaseException) -> str:
  """The one line of a user's error: its message (which names what failed)."""
  text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
  return text or type(error).__name__


def _finished_losses(losses) -> np.ndarray:
  """The losses that can still be read after an error (a failed step has none)."""
  out = []
  for l in losses:
    try:
      out.append(float(l))
    except Exception:  # noqa: BLE001 (the step that failed on the device)
      break
  return np.asarray(out, np.float32)


def replay_run(
    setup: AsyncSetup,
    log: Sequence[dict],
    final_clocks: Sequence[int],
    *,
    compiled: bool = True,
    device=None,
    keep_centers: bool = False,
) -> Replayed:
  """Replays a real run from its exchange log (``easgd.asynchrony.log.replay``).

  Args:
    setup: the run's :class:`AsyncSetup` (the same algorithm, initial
      parameters, batches and key).
    log: the run's log records.
    final_clocks: each worker's local clock at the end (checkpoint).
    compiled: run the same compiled programs as the runtimes
      (:class:`WorkerPrograms`: equal bit for bit on the same kind of device);
      False: the uncompiled rules op by op (equal up to float32 rounding).
    device: where to replay (None: JAX's default device).
    keep_centers: also return the center after every master update.

  Returns:
    The ``easgd.asynchrony.log.Replayed`` final states.
  """
  rules = async_rules(setup.algorithm)
  programs = WorkerPrograms(rules) if compiled else None
  params = jax.device_put(setup.params, device)
  return replay(
      setup.algorithm,
      log,
      params,
      setup.batch_fn,
      jax.device_put(setup.key, device),
      final_clocks,
      programs=programs,
      keep_centers=keep_centers,
  )


def write_log(path, records: Sequence[dict]) -> int:
  """Writes log records as JSON lines (atomically); returns their number.

  Raises:
    OSError: the file cannot be written (the previous file stays).
  """
  write_text_atomic(
      path, "".join(json_text({k: r[k] for k in LOG_FIELDS if k in r}) + "\n" for r in records)
  )
  return len(records)


def read_log(path) -> list[dict]:
  """The records of a log written by :func:`write_log` (or ``write_exchange_log``).

  Raises:
    OSError: the file cannot be read.
    ValueError: a line is not a JSON object.
  """
  records = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if line.strip():
        r = json.loads(line)
        if not isinstance(r, dict):
          raise ValueError(f"{path}:{n}: not a log record: {line.strip()[:80]}")
        records.append(r)
  return records


def stack_workers(states: Sequence[simulator.AsyncWorker]):
  """Host ``AsyncWorker`` states stacked along a new leading worker axis."""
  return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *states)


def unstack_workers(stacked, num_workers: int) -> list:
  """Inverse of :func:`stack_workers`."""
  return [jax.tree.map(lambda x: np.asarray(x)[i], stacked) for i in range(num_workers)]
