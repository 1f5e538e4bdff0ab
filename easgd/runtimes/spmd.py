"""The SPMD runtime: :class:`SpmdExecutor`, every step one mapped program on all workers.

The executor of runtime "spmd" of the one training loop
(``easgd.run.trainer.train_and_evaluate``, the contract in
``easgd.runtimes.executor``): every step is one call of ``Run.step_fn``
(``easgd.runtimes.training_run``) on all workers, the losses read one step late.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np

from easgd._util.files import check_interrupt
from easgd.core.base import Algorithm
from easgd.methods import registry
from easgd.parallel import accounting, placement
from easgd.runtimes import executor
from easgd.runtimes.training_run import Run, global_batch, host_losses
from easgd.tasks import batches


def to_checkpoint(
    run: Run, worker, shared, step: int, epoch_losses, train_seconds: float = 0.0
) -> dict:
  """The checkpoint's tree (``easgd.runtimes.executor.checkpoint_tree``) of a state.

  Args:
    run: the run.
    worker, shared: the state on the run's devices.
    step: global steps done.
    epoch_losses: this epoch's per-step worker losses so far (:func:`host_losses`'
      input or output), saved as ``epoch_losses`` float32 [steps_per_epoch, p].
    train_seconds: the training clock (``SpmdExecutor.train_seconds``), seconds.
  """
  losses = np.zeros((run.steps_per_epoch, run.config.num_workers), np.float32)
  done = host_losses(epoch_losses, run.config.num_workers)
  losses[: len(done)] = done
  shared_host = placement.first_copy(shared)
  return executor.checkpoint_tree(
      run.algorithm,
      placement.merge_workers(worker),
      shared_host,
      step,
      epoch_losses=losses,
      train_seconds=train_seconds,
  )


def from_checkpoint(run: Run, restored: dict):
  """(worker, shared, step, epoch_losses) of a restored checkpoint, on the run's devices."""
  step = int(restored["step"])
  done = step % run.steps_per_epoch
  losses = [restored["epoch_losses"][i] for i in range(done)]
  return (
      placement.split_workers(restored["worker"], run.layout, state=True),
      placement.replicate_per_device(restored["shared"], run.layout),
      step,
      losses,
  )


def checkpoint_target(run: Run) -> dict:
  """Host zeros of the checkpoint's tree (Orbax's restore target; :func:`to_checkpoint`)."""
  worker, shared = run.algorithm.init(run.init_params)
  return executor.checkpoint_target(
      run.algorithm,
      worker,
      shared,
      run.config.num_workers,
      epoch_losses=(run.steps_per_epoch, run.config.num_workers),
      train_seconds=(),
  )


def center_lag_steps(algorithm: Algorithm, name: str, steps_done: int) -> int | None:
  """How many local steps the evaluated model lags the workers after ``steps_done``.

  Synchronous EASGD/EAMSGD: the center last moved at the exchange of clock
  t_e (the last t < steps_done with tau | t), towards the workers' parameters
  of that clock (eq. 6 reads x^i_t before the step), so it lags them by
  ``steps_done - t_e`` steps (tau = 4, 40 steps: t_e = 36, lag 4). Local SGD
  and DiLoCo: the center is the average after the step of their last
  exchange, ``steps_done - t_e - 1`` (0 when the run ends on an average).
  The one-model methods (pmean SGD, sequential): 0. Asynchronous methods
  (each worker exchanges on its own clock): None.

  Args:
    algorithm: the run's algorithm (``exchange_at``).
    name: its name in ``easgd.methods.registry.TABLE``.
    steps_done: global steps done.

  Returns:
    The lag in steps, or None (asynchronous, or no exchange yet).
  """
  spec = registry.TABLE[name]
  if spec.asynchronous:
    return None
  if algorithm.exchange_at is None or steps_done == 0:
    return 0 if algorithm.exchange_at is None else None
  t = steps_done - 1
  while t >= 0 and not bool(algorithm.exchange_at(t)):
    t -= 1
  if t < 0:
    return None  # never exchanged (cannot happen for tau <= the run)
  return steps_done - t - (0 if spec.family == "elastic" else 1)


COMPILE_EVENTS = "/jax/core/compile/"
"""The prefix of the ``jax.monitoring`` duration events of a compilation (tracing,
lowering, backend compile, a persistent-cache hit's retrieval included)."""


class SpmdExecutor:
  """Runtime "spmd" of the training loop (``easgd.runtimes.executor.Executor``).

  Every global step is one call of ``Run.step_fn`` on all workers, fed the
  step's batch (``batches.worker_batch_indices`` of its epoch, random crops
  fixed by (seed, epoch, step)); each process feeds only its own workers.
  The state stays on the devices; a :class:`~easgd.runtimes.executor.Snapshot`
  reads it to the host. The training clock (:meth:`train_seconds`) runs while
  ``run_to`` runs steps, up to the end of the segment's last step (waited
  for), from the end of the first step this executor runs (it compiles), less
  the compilations JAX reports meanwhile (:data:`COMPILE_EVENTS`: the second
  step may compile again, for its inputs' placement).

  Args:
    run: the run's :class:`Run`.
  """

  def __init__(self, run: Run):
    self.run = run
    self.worker = self.shared = None
    self.step = 0
    self.epoch_losses = []  # this epoch's losses: device arrays [d, w] (or host rows)
    self.on_progress = lambda steps: None
    self._order = (None, None)  # (epoch, its batch indices)
    self.seconds = 0.0  # the training clock (train_seconds)
    self.compiled = False  # the first step (which compiles) has run
    self.compiling = 0.0  # seconds of compilation reported while started
    self.listening = False

  def checkpoint_target(self) -> dict:
    """Host zeros of the checkpoint's tree (:func:`checkpoint_target`)."""
    return checkpoint_target(self.run)

  def initial_state(self) -> executor.Snapshot:
    """Every worker at the initial parameters, on the devices; step 0."""
    self.worker, self.shared = self.run.initial_state()
    self.step, self.epoch_losses, self.seconds = 0, [], 0.0
    return executor.Snapshot(0, None, host_losses([], self.run.config.num_workers), {})

  def restore(self, restored: dict) -> executor.Snapshot:
    """The restored checkpoint placed on this run's devices (any device count)."""
    self.worker, self.shared, self.step, self.epoch_losses = from_checkpoint(self.run, restored)
    # a checkpoint saved before the clock was: it restarts at 0 (easgd.run.timing)
    self.seconds = float(restored.get("train_seconds", 0.0))
    return executor.Snapshot(self.step, restored, host_losses([], self.run.config.num_workers), {})

  def start(self, on_progress: Callable[[int], None]) -> None:
    """Listens for compilations (compiled on the first step); keeps ``on_progress``."""
    self.on_progress = on_progress
    if not self.listening:
      jax.monitoring.register_event_duration_secs_listener(self._compiled_for)
      self.listening = True

  def _compiled_for(self, event: str, duration_secs: float, **kwargs) -> None:
    if event.startswith(COMPILE_EVENTS):
      self.compiling += float(duration_secs)

  def run_to(self, step: int, while_running: Callable[[], None] | None = None) -> None:
    """``while_running()``, then the steps up to global step ``step``, timed."""
    if while_running is not None:  # before the next step: the state is the boundary's
      while_running()
    run = self.run
    began = time.perf_counter() if self.compiled else None
    compiling, loss = self.compiling, None
    while self.step < step:
      check_interrupt()  # a signal whose exception was swallowed stops here
      batch = self._batch(self.step)
      self.worker, self.shared, loss = run.step_fn(
          self.worker, self.shared, batch, run.step_key, self.step
      )
      if self.epoch_losses:
        # Wait for the previous step (one step late, so the host still prepares
        # the next batch while this one runs): at most two steps are in flight.
        # Queuing hundreds of steps deadlocks XLA's CPU all-reduce across
        # (fake) CPU devices.
        jax.block_until_ready(self.epoch_losses[-1])
      self.epoch_losses.append(loss)  # device arrays, read at boundaries
      if not self.compiled:  # the clock starts once the first step (compiled) is done
        jax.block_until_ready(loss)
        self.compiled, began, compiling = True, time.perf_counter(), self.compiling
      self.step += 1
      self.on_progress(self.step)
    if began is not None and loss is not None:
      jax.block_until_ready(loss)  # the segment's last step is done
      elapsed = time.perf_counter() - began - (self.compiling - compiling)
      self.seconds += max(elapsed, 0.0)

  def train_seconds(self) -> float:
    """The training clock in seconds (``easgd.runtimes.executor.Executor``)."""
    return self.seconds

  def _batch(self, step: int):
    """This process's workers' batch of global step ``step``, split per device."""
    run, config = self.run, self.run.config
    spe = run.steps_per_epoch
    epoch = step // spe + 1
    if self._order[0] != epoch:
      self._order = (
          epoch,
          batches.worker_batch_indices(
              len(run.task.train),
              config.num_workers,
              config.per_worker_batch_size,
              config.seed,
              epoch,
          ),
      )
    batch = global_batch(run, self._order[1][step % spe], epoch, step)
    local = run.layout.local_workers  # each process feeds only its own workers
    return placement.split_local_workers(
        jax.tree.map(lambda a: a[local], batch), run.layout, kind="batch"
    )

  def state_for_checkpoint(self, evaluated: bool) -> executor.Snapshot:
    """The state and this epoch's losses, read from the devices once."""
    del evaluated  # the losses since the epoch's start are always in the snapshot
    losses = host_losses(self.epoch_losses, self.run.config.num_workers)
    state = to_checkpoint(self.run, self.worker, self.shared, self.step, losses, self.seconds)
    if self.step % self.run.steps_per_epoch == 0:  # an epoch end: its losses are read
      self.epoch_losses = []
    return executor.Snapshot(self.step, state, losses, {})

  def evaluate_inputs(self, snapshot: executor.Snapshot):
    """The device state (the snapshot's until the next ``run_to``)."""
    del snapshot  # the device state is the snapshot's until the next step
    return self.worker, self.shared

  def summary_fields(self) -> dict[str, Any]:
    """Algorithm, layout, the center's lag, communication, shared copies equal.

    ``communication``: the algorithm's exchange across workers
    (``all_reduces``, ``bytes``, and per step, per device), and ``by_axis``:
    the same four fields per level (``across_workers``, the algorithm's;
    ``within_workers``, a worker's data-parallel average over its D devices,
    zero for D = 1), each with the mesh axis it reduces over and the size of
    its groups of devices (``easgd.parallel.accounting.communication_by_level``).
    A simulated asynchronous method (``Algorithm.program_communication``)
    counts there what a real asynchronous run sends; ``program`` then adds the
    same four fields for what its compiled programs send across workers
    (every worker's message every slot, ``Algorithm.wire_communication``).
    """
    run, step = self.run, self.step
    layout = run.layout
    levels = accounting.communication_by_level(
        run.algorithm, step, run.exchange_bytes, layout.devices_per_worker, layout.shard_params
    )
    group_size = dict(across_workers=layout.num_groups, within_workers=layout.devices_per_worker)

    def fields(comm):
      return executor.communication_fields(
          comm.all_reduces, comm.bytes, step, comm.all_gathers, comm.gathered_bytes
      )

    by_axis = {
        level: dict(
            mesh_axis=accounting.LEVELS[level], group_size=group_size[level], **fields(comm)
        )
        for level, comm in levels._asdict().items()
    }
    communication = dict(**fields(levels.across_workers), by_axis=by_axis)
    if run.algorithm.program_communication is not None:
      communication["program"] = fields(
          accounting.communication_by_level(
              run.algorithm,
              step,
              run.exchange_bytes,
              layout.devices_per_worker,
              layout.shard_params,
              program=True,
          ).across_workers
      )
    return dict(
        algorithm=dict(name=run.algorithm.name, **run.algorithm.hyperparameters),
        layout=layout.describe(),
        center_lag_steps=center_lag_steps(run.algorithm, run.config.algorithm, step),
        communication=communication,
        shared_copies_equal=placement.shared_copies_equal(self.shared),
    )

  def close(self) -> None:
    """Stops listening for compilations."""
    if self.listening:
      jax.monitoring.unregister_event_duration_listener(self._compiled_for)
      self.listening = False
