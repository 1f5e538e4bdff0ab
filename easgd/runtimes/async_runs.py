"""The real asynchronous runtimes ("threads", "ray"): :class:`AsyncExecutor`.

The executor of the training loop (``easgd.run.trainer``; the contract:
``easgd.runtimes.executor``) for a config whose ``runtime`` is not "spmd": the
same algorithm (its ``Algorithm.async_rules``), local optimizer, data, model and
evaluation as the SPMD runtime, with real asynchronous workers on a backend
(``easgd.runtimes.threads``: one thread per worker; ``easgd.runtimes.ray_actors``:
Ray actors) taking the local steps ``easgd.runtimes.driver.Driver`` hands out; a
run's "step" is num_workers local steps. Data, keys, boundaries, files, faults:
docs/guides/runtimes.md.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np

from easgd.asynchrony.log import async_rules, init_shared, init_worker, overlap_of
from easgd.core import elastic
from easgd.parallel import placement
from easgd.runtimes import link_emulation, threads
from easgd.runtimes.driver import Driver, logged_faults, stopped_workers
from easgd.runtimes.executor import (
    Snapshot,
    checkpoint_target,
    checkpoint_tree,
    communication_fields,
)
from easgd.runtimes.shared import (
    AsyncSetup,
    UserFault,
    read_log,
    stack_workers,
    unstack_workers,
)
from easgd.runtimes.training_run import Run, global_batch
from easgd.settings import runtime_table
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import batches
from easgd.tasks.sources import TaskError, take
from easgd.tasks.task import module_root


def make_batch_fn(run: Run):
  """``batch_fn(worker, clock)``: worker's rows of global batch ``clock``.

  Args:
    run: the run (its task's training data, config and steps per epoch).

  Returns:
    ``batch_fn(i, t) -> batch`` (leaves ``[B, ...]``), the rows of worker i in
    global batch t of the SPMD order (``easgd.runtimes.training_run.global_batch``:
    epoch t // steps_per_epoch + 1, its step t % steps_per_epoch, the crops of
    ``crop_rng(seed, epoch, t)``); a worker that runs ahead reads later global
    batches; thread-safe.
  """
  config, steps_per_epoch = run.config, run.steps_per_epoch
  n, p = len(run.task.train), config.num_workers
  b, seed = config.per_worker_batch_size, config.seed

  @functools.lru_cache(maxsize=2 * p + 2)  # workers may be in different epochs
  def epoch_indices(epoch):
    return batches.worker_batch_indices(n, p, b, seed, epoch)

  def batch_fn(worker, clock):
    epoch, t = clock // steps_per_epoch + 1, clock % steps_per_epoch
    ix = epoch_indices(epoch)[t]  # [p, B]: global batch `clock`
    if run.task.augment is None:  # only this worker's rows are read
      return take(run.task.train, ix[worker])
    return jax.tree.map(lambda a: a[worker], global_batch(run, ix, epoch, clock))

  return batch_fn


def make_setup(run: Run) -> AsyncSetup:
  """The ``AsyncSetup`` of a run: its algorithm, initial params, batches, key;
  a ``TaskError`` (the user's data or task) is the user's error, never a fault."""
  return AsyncSetup(run.algorithm, run.init_params, make_batch_fn(run), run.step_key, (TaskError,))


@contextlib.contextmanager
def _user_errors_raised():
  """A worker's ``UserFault`` raised again as the ``TaskError`` it was (one line)."""
  try:
    yield
  except UserFault as e:
    raise TaskError(str(e)) from None


def ray_setup(fields: Mapping[str, Any], import_dirs: tuple[str, ...] = ()) -> AsyncSetup:
  """:func:`make_setup` from config fields, in a Ray actor's process (one device).

  Args:
    fields: the config's fields (``TrainConfig.to_dict_fields``); its
      ``task`` (an import path) is built again in this process.
    import_dirs: directories to search first for the task's module (the
      driver's, ``easgd.tasks.task.module_root``).
  """
  import sys

  for d in reversed(import_dirs):
    if d not in sys.path:
      sys.path.insert(0, d)
  config = TrainConfig(**fields).replace(num_devices=1)
  return make_setup(Run(config))


def _no_replies(run: Run) -> Any:
  """Host zeros of every worker's reply, leaves ``[p, ...]`` (the center's dtypes)."""
  p = run.config.num_workers
  center = jax.device_get(elastic.to_reduction_dtype(run.init_params))
  return jax.tree.map(lambda c: np.zeros((p, *np.shape(c)), np.asarray(c).dtype), center)


def _checkpoint_target(run: Run, rules) -> dict:
  """Host zeros of the checkpoint's tree (workers, master, losses, log length; with
  overlap the replies in flight and their clocks)."""
  p = run.config.num_workers
  overlap = {}
  if overlap_of(rules):
    overlap = dict(reply_clock=(p,), reply_in_flight=_no_replies(run))
  return checkpoint_target(
      run.algorithm,
      init_worker(rules, run.init_params),
      init_shared(rules, run.init_params),
      p,
      loss_sum=(p,),
      loss_count=(p,),
      log_length=(),
      train_seconds=(),
      **overlap,
  )


def _in_flight_entries(run: Run, in_flight) -> dict:
  """The checkpoint's ``reply_clock`` and ``reply_in_flight`` of the backend's
  ``in_flight()`` (a worker without one: clock -1, zeros)."""
  replies = jax.tree.map(np.copy, _no_replies(run))
  for i, (_, reply) in enumerate(in_flight):
    if reply is not None:
      jax.tree.map(lambda out, r, i=i: out.__setitem__(i, r), replies, reply)
  return dict(reply_clock=[int(a) for a, _ in in_flight], reply_in_flight=replies)


def _resumed_log(path, length: int) -> list[dict]:
  try:
    log = read_log(path)
  except (OSError, ValueError) as e:
    raise ConfigError(
        f"cannot resume: '{path}' (the exchange log) cannot be read: "
        f"{e}; start the run again with --overwrite"
    ) from None
  if len(log) < length:
    raise ConfigError(
        f"cannot resume: '{path}' holds {len(log)} records, the "
        f"checkpoint {length}; start the run again with --overwrite"
    )
  return log[:length]  # records after the checkpoint are redone


def _clocks(stacked) -> list[int]:
  """Each worker's local clock in a stacked worker state (a checkpoint's)."""
  return [int(c) for c in np.asarray(stacked.clock).reshape(-1)]


def _exchanges_per_worker(log, p: int) -> np.ndarray:
  counts = np.zeros(p, np.int64)
  for r in log:
    if r.get("event", "exchange") == "exchange":
      counts[r["worker"]] += 1
  return counts


def _make_backend(config, run, setup, worker_states, shared, log, elapsed_s, in_flight=None):
  """The runtime's backend (its row of ``easgd.settings.runtime_table``), started."""
  spec, p = runtime_table.TABLE[config.runtime], config.num_workers
  backend = runtime_table.load(spec.backend)
  kw = dict(
      delays_s=config.worker_delays,
      workers=worker_states,
      shared=shared,
      log=log,
      elapsed_s=elapsed_s,
  )
  links = link_emulation.worker_links(config)
  if links is not None:  # an emulated link in every worker's exchanges
    kw["links"] = links
  if in_flight is not None:  # a resumed run with overlap: the replies in flight
    kw["in_flight"] = in_flight
  if spec.processes:  # each worker's process builds the run again from the config
    # (a task built in code, which no other process can build, is refused by the trainer)
    dirs = tuple(d for d in [module_root(run.task.factory)] if d)
    return backend(functools.partial(ray_setup, config.to_dict_fields(), dirs), p, **kw)
  devices = threads.worker_devices(p, list(run.layout.devices))
  return backend(setup, p, devices=devices, **kw)


def _describe(config, run) -> str:
  """The layout line: where the workers run, and the mapping that evaluates."""
  p = config.num_workers
  evaluation = f"evaluation: {run.layout.backend}"  # mapping_backend is read here
  if runtime_table.TABLE[config.runtime].processes:
    return (
        f"{p} workers = {p} Ray actors [{config.ray_address or 'local Ray'}, "
        f"{config.runtime}; {evaluation}]"
    )
  return (
      f"{p} workers = {p} threads on {run.layout.num_devices} device(s) "
      f"[{run.layout.devices[0].platform}, {config.runtime}; {evaluation}]"
  )


@contextlib.contextmanager
def connection(config: TrainConfig):
  """The runtime's cluster (its row's ``connect``, e.g. Ray's at
  ``config.ray_address``), connected while open; nothing for the others.

  Raises:
    easgd.parallel.distributed.StartupError: the cluster cannot be reached.
  """
  connect = runtime_table.TABLE[config.runtime].connect
  if connect is None:
    yield
    return
  connected = runtime_table.load(connect)(config)
  try:
    yield
  finally:
    connected.close()


class AsyncExecutor:
  """Runtimes "threads" and "ray" of the training loop (``easgd.runtimes.executor``).

  Workers run on a backend (``easgd.runtimes.threads.ThreadBackend`` or
  ``easgd.runtimes.ray_actors.RayBackend``) and take the local steps that
  ``easgd.runtimes.driver.Driver`` hands out; a global step is num_workers
  local steps. At a boundary every worker is idle while the state is read;
  they go on while the loop writes the boundary's files (``while_running``).

  Args:
    run: the run's ``easgd.runtimes.training_run.Run`` (algorithm, data, evaluation).
    log_path: the exchange log (``workdir/exchanges.jsonl``), read on resume.
    faults: ``{worker: local_step}`` faults to inject (tests, experiments).
  """

  def __init__(self, run: Run, log_path, faults: Mapping[int, int] | None = None):
    p = run.config.num_workers
    self.run, self.log_path, self.faults = run, log_path, dict(faults or {})
    self.rules = async_rules(run.algorithm)
    self.overlap = overlap_of(self.rules)
    self.in_flight = None  # a restored checkpoint's [(apply_at, reply)] (overlap)
    self.setup = make_setup(run)
    self.backend = self.driver = None
    self.worker_states = self.shared = None
    self.log: list[dict] = []
    self.loss_sum, self.loss_count = np.zeros(p), np.zeros(p, np.int64)
    self.seconds, self.train_start, self.step = 0.0, 0.0, 0
    self.latest = ([0] * p, self.log)  # (clocks, log) of the latest checkpoint

  def checkpoint_target(self) -> dict:
    """Host zeros of the checkpoint's tree (workers, master, losses, log length)."""
    return _checkpoint_target(self.run, self.rules)

  def initial_state(self) -> Snapshot:
    """Every worker at the initial parameters and clock 0 (host state)."""
    p = self.run.config.num_workers
    worker = init_worker(self.rules, self.run.init_params)
    shared = init_shared(self.rules, self.run.init_params)
    state = dict(worker=stack_workers([worker] * p), shared=jax.device_get(shared))
    return Snapshot(0, state, self._no_losses(), self._record([], [0] * p, 0.0, None), log=[])

  def restore(self, restored: dict) -> Snapshot:
    """Workers, master, losses and the exchange log (cut to the checkpoint's length).

    Raises:
      ConfigError: the exchange log cannot be read or is shorter than the
        checkpoint says.
    """
    p = self.run.config.num_workers
    self.log = _resumed_log(self.log_path, int(restored["log_length"]))
    self.worker_states = unstack_workers(restored["worker"], p)
    self.shared = restored["shared"]
    self.loss_sum, self.loss_count = restored["loss_sum"], restored["loss_count"]
    self.seconds = float(restored["train_seconds"])
    self.step = int(restored["step"])
    if self.overlap:
      replies = unstack_workers(restored["reply_in_flight"], p)
      self.in_flight = list(zip(np.asarray(restored["reply_clock"]).tolist(), replies))
    self.latest = (_clocks(restored["worker"]), self.log)
    return Snapshot(self.step, restored, self._no_losses(), {}, log=self.log)

  def start(self, on_progress: Callable[[int], None]) -> None:
    """Starts the backend, arms the faults, compiles, then starts the clock.

    Raises:
      TaskError: a worker cannot read its first batch (the user's data).
    """
    config, p = self.run.config, self.run.config.num_workers
    self.backend = _make_backend(
        config,
        self.run,
        self.setup,
        self.worker_states,
        self.shared,
        self.log,
        self.seconds,
        self.in_flight,
    )
    for worker, clock in self.faults.items():
      self.backend.arm_fault(int(worker), int(clock))
    with _user_errors_raised():
      self.backend.warm_up()  # compile every program before the clock starts
    self.driver = Driver(
        self.backend,
        [0] * p if self.worker_states is None else [int(w.clock) for w in self.worker_states],
        chunk_steps=runtime_table.TABLE[config.runtime].chunk_steps,
        on_progress=lambda total: on_progress(total // p),
        faults=logged_faults(self.log),
    )  # resumed: a stopped worker stays so
    self.driver.loss_sum[:], self.driver.loss_count[:] = self.loss_sum, self.loss_count
    self.train_start = time.perf_counter() - self.seconds

  def run_to(self, step: int, while_running: Callable[[], None] | None = None) -> None:
    """Runs the workers until their clocks sum to ``step * num_workers``.

    Raises:
      TaskError: a worker met an error of the user's data or task.
      easgd.runtimes.driver.WorkersLostError: every worker stopped.
    """
    with _user_errors_raised():
      self.driver.run_to(step * self.run.config.num_workers, while_running=while_running)
    self.step = step

  def state_for_checkpoint(self, evaluated: bool) -> Snapshot:
    """The idle workers' state, the master's, the log and (``evaluated``) the losses."""
    driver, step = self.driver, self.step
    seconds = time.perf_counter() - self.train_start
    self.seconds = seconds  # the clock of this boundary (train_seconds)
    workers_now, shared_now, log_now = self.backend.state()
    stacked = stack_workers(workers_now)
    shared_now = shared_now._replace(step=np.asarray(step, np.int32))
    train_loss = None
    if evaluated:
      s, c = driver.take_losses()
      train_loss = float(s.sum() / c.sum()) if c.sum() else None
    state = checkpoint_tree(
        self.run.algorithm,
        stacked,
        shared_now,
        step,
        loss_sum=driver.loss_sum.copy(),
        loss_count=driver.loss_count.copy(),
        log_length=len(log_now),
        train_seconds=seconds,
        **(_in_flight_entries(self.run, self.backend.in_flight()) if self.overlap else {}),
    )
    self.latest = (_clocks(stacked), log_now)
    return Snapshot(
        step,
        state,
        self._no_losses(),
        self._record(log_now, list(driver.clocks), seconds, train_loss),
        nonfinite=driver.nonfinite,
        log=log_now,
    )

  def train_seconds(self) -> float:
    """Seconds of training since the run began, compilation excluded, at the
    latest boundary: its record's ``wall_time_s`` (unrounded)."""
    return self.seconds

  def _no_losses(self) -> np.ndarray:
    return np.zeros((0, self.run.config.num_workers), np.float32)

  def _record(self, log, clocks, seconds, train_loss) -> dict:
    """The metrics fields of the real runtimes: exchanges, clocks, faults, time."""
    per = _exchanges_per_worker(log, self.run.config.num_workers)
    mean = int(round(float(np.mean(per))))
    return dict(
        train_loss=train_loss,
        all_reduces=mean,
        bytes_communicated=mean * self.run.exchange_bytes,
        exchanges=int(per.sum()),
        exchanges_per_worker=per.tolist(),
        worker_local_steps=[int(c) for c in clocks],
        faults=sum(r.get("event") == "fault" for r in log),
        wall_time_s=round(seconds, 3),
    )

  def evaluate_inputs(self, snapshot: Snapshot):
    """The snapshot's host state placed on the run's devices."""
    layout = self.run.layout
    return (
        placement.split_workers(snapshot.state["worker"], layout),
        placement.replicate_per_device(snapshot.state["shared"], layout),
    )

  def summary_fields(self) -> dict[str, Any]:
    """The runtime, layout, exchanges, clocks and faults of the latest checkpoint."""
    run, step = self.run, self.step
    clocks, log = self.latest  # the clocks, exchanges and faults of the latest checkpoint
    per_worker = _exchanges_per_worker(log, run.config.num_workers)
    faults = logged_faults(log)
    mean = int(round(float(np.mean(per_worker))))
    return dict(
        algorithm=dict(name=run.algorithm.name, **self.rules.hyperparameters),
        runtime=run.config.runtime,
        layout=_describe(run.config, run),
        center_lag_steps=None,
        communication=communication_fields(mean, mean * run.exchange_bytes, step),
        exchanges=int(per_worker.sum()),
        exchanges_per_worker=per_worker.tolist(),
        worker_local_steps=clocks,
        faults=[f._asdict() for f in faults],
        stopped_workers=stopped_workers(faults),
    )

  def close(self) -> None:
    """Stops the workers (threads, Ray actors)."""
    if self.backend is not None:
      self.backend.close()
