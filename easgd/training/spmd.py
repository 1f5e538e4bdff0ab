"""The SPMD runtime: the run's pieces and the one mapped program that steps them.

:class:`Run` builds the data, model, local optimizer (schedule counted in
epochs) and algorithm from a :class:`~easgd.training.config.TrainConfig`, and
compiles one mapped step and one mapped evaluation. The evaluation takes the
CENTER on every test example exactly once, and records the mean worker
training loss, the mean distance of the workers to the center and the
communication so far; every runtime evaluates with it.

:class:`SpmdExecutor` is the runtime "spmd" of the one training loop
(``easgd.training.trainer.train_and_evaluate``, the contract in
``easgd.training.executor``): every step is one call of ``Run.step_fn`` on
all workers, the losses read one step late.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from easgd.core import algorithms, elastic
from easgd.training import batches, data, models
from easgd.parallel import workers
from easgd.methods import registry
from easgd.training.config import ConfigError, TrainConfig
from easgd.training.divergence import DivergenceError, divergence_message
from easgd.training.executor import Snapshot
from easgd.training.optimizers import make_optimizer, make_schedule
from easgd.parallel.workers import WORKER_AXES


def make_loss_fn(model):
  """``loss_fn(params, (x, y), key)``: mean cross-entropy of a mini-batch.

  Models with BatchNorm (``models.has_batch_norm``) normalise with the
  mini-batch's own statistics; the updated ``batch_stats`` that Flax returns are
  discarded, so no BatchNorm state is trained, exchanged or checkpointed (the
  policy of ``easgd.training.models``; the center's statistics: :func:`make_eval_fn`).

  Args:
    model: a Flax classifier from ``easgd.training.models.make_model``.

  Returns:
    ``loss_fn``: per-worker params, x [b, ...], integer labels y [b] and a
    dropout key -> the float32 scalar loss.
  """
  if models.has_batch_norm(model):

    def bn_loss_fn(params, batch, key):
      x, y = batch
      logits, _ = model.apply(
          {"params": params},
          x,
          train=True,  # _: batch_stats
          rngs={"dropout": key},
          mutable=["batch_stats"],
      )
      return models.cross_entropy_loss(logits, y)

    return bn_loss_fn

  def loss_fn(params, batch, key):
    x, y = batch
    logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
    return models.cross_entropy_loss(logits, y)

  return loss_fn


def make_eval_fn(model, algo: algorithms.Algorithm):
  """Per-worker evaluation of the center on this worker's test shard.

  Returns ``eval_fn(worker, shared, x, y, mask) -> (loss_sum, correct, count,
  distance)`` with x: [num_batches, eval_batch, ...], mask: bool like y. Sums
  run over masked entries only, so the totals over workers are exact.

  Models with BatchNorm (``models.has_batch_norm``) get one more argument,
  ``eval_fn(worker, shared, bn_x, x, y, mask)``, and this policy: the center is
  an average of the workers' parameters (elastic or plain), so statistics
  collected by any worker do not belong to it. Before the test batches, the
  center's BatchNorm statistics are recomputed from the center itself: a
  train-mode pass over ``bn_x`` ([n, ...], this worker's share of the fixed
  statistics examples, ``Run.bn_stats_data``) with cross-worker BatchNorm
  (``models.compute_batch_stats`` over ``WORKER_AXES``), i.e. each layer's
  exact per-channel mean and biased variance over all workers' examples,
  identical on every worker (as SWA's ``bn_update`` does for averaged weights,
  Izmailov et al., 2018). The center is then evaluated with
  ``train=False`` (``use_running_average=True``) and these statistics.
  Models without BatchNorm compile exactly as before (no extra pass).

  Args:
    model: a Flax classifier from ``easgd.training.models.make_model``.
    algo: the run's algorithm (``center``, ``worker_params``).

  Returns:
    ``eval_fn`` as above, to be mapped over workers (``easgd.parallel.workers.map_workers``).
  """

  def evaluate(worker, shared, center, variables, x, y, mask):
    def body(carry, inputs):
      xb, yb, mb = inputs
      logits = model.apply(variables, xb, train=False)
      loss, correct = models.per_example_stats(logits, yb)
      return (
          carry[0] + jnp.sum(jnp.where(mb, loss, 0.0)),
          carry[1] + jnp.sum(jnp.where(mb, correct, 0).astype(jnp.int32)),
          carry[2] + jnp.sum(mb.astype(jnp.int32)),
      ), None

    zeros = (jnp.float32(0), jnp.int32(0), jnp.int32(0))
    (loss_sum, correct, count), _ = lax.scan(body, zeros, (x, y, mask))
    distance = elastic.tree_l2_distance(algo.worker_params(worker, shared), center)
    return loss_sum, correct, count, distance

  if models.has_batch_norm(model):

    def bn_eval_fn(worker, shared, bn_x, x, y, mask):
      center = algo.center(shared)
      batch_stats = models.compute_batch_stats(model, center, bn_x, WORKER_AXES)
      return evaluate(
          worker, shared, center, {"params": center, "batch_stats": batch_stats}, x, y, mask
      )

    return bn_eval_fn

  def eval_fn(worker, shared, x, y, mask):
    center = algo.center(shared)
    return evaluate(worker, shared, center, {"params": center}, x, y, mask)

  return eval_fn


def bn_stats_indices(
    num_examples: int, num_workers: int, bn_stats_examples: int, seed: int
) -> np.ndarray:
  """The training examples of the center's BatchNorm statistics, per worker.

  The first ``W * n`` entries of ``batches.epoch_permutation(N, seed, 0)`` (epoch 0
  is never a training epoch), worker i taking the i-th block of n, with
  ``n = max(1, min(bn_stats_examples, N) // W)``: equal shards, so pooled moments
  are exact. The same at every evaluation and at export.

  Args:
    num_examples: N, the training set's size.
    num_workers: W.
    bn_stats_examples: how many examples the statistics should use in all.
    seed: the run's seed.

  Returns:
    int64 ``[W, n]`` indices into the training set.

  Raises:
    ConfigError: fewer training examples than workers.
  """
  n = max(1, min(bn_stats_examples, num_examples) // num_workers)
  if n * num_workers > num_examples:
    raise ConfigError(
        f"num_workers={num_workers} exceeds the {num_examples} training "
        "examples; BatchNorm statistics need one per worker"
    )
  perm = batches.epoch_permutation(num_examples, seed, 0)
  return perm[: n * num_workers].reshape(num_workers, n)


class Run:
  """Everything a training run compiles and feeds, built from a config.

  Construction validates the config, the worker layout and the data set before
  anything is compiled. Attributes: ``config``, ``layout``, ``dataset``,
  ``model``, ``algorithm``, ``steps_per_epoch``, ``total_steps``,
  ``param_bytes``, ``step_fn`` (``easgd.parallel.workers.map_step``: called with the
  host's step count as its last argument), ``eval_fn``
  (``easgd.parallel.workers.map_workers``), ``step_key``; for models with BatchNorm
  (``batch_norm`` True) also ``bn_stats_data`` (the examples of the center's
  statistics, :func:`bn_stats_indices`) and ``batch_stats_fn``.

  Raises:
    ConfigError, easgd.parallel.workers.LayoutError, easgd.training.data.DataError: bad input.
  """

  def __init__(self, config: TrainConfig):
    self.config = config = config.validate()
    self.layout = workers.make_layout(
        config.num_workers, config.num_devices, backend=config.mapping_backend
    )
    full = data.load_dataset(config.dataset, data_dir=config.data_dir, seed=config.seed)
    # validation_examples: held out of the training set, never trained on
    self.dataset, self.validation = data.with_validation_split(full, config.validation_examples)
    ds = self.dataset
    self.steps_per_epoch = batches.steps_per_epoch(
        len(ds.train_y), config.num_workers, config.per_worker_batch_size
    )
    # every quantity derived from the data's size (tau and K against the run,
    # the center's first exchange, the schedule in steps), checked before
    # anything compiles; summary.json and the metrics record it
    self.resolved = config.resolve(self.steps_per_epoch)
    self.total_steps = self.resolved["total_steps"]
    self.resolved.update(
        validation_examples=config.validation_examples, train_examples=len(ds.train_y)
    )
    self.schedule = make_schedule(config, self.steps_per_epoch)
    self.model = models.make_model(
        config.model,
        ds.num_classes,
        param_dtype=config.param_dtype,
        compute_dtype=config.compute_dtype,
    )
    # crop_size: the model sees crop x crop images (None: ds.input_shape).
    self.input_shape = batches.cropped_shape(ds.input_shape, config.crop_size)
    init_key, self.step_key = jax.random.split(jax.random.key(config.seed))
    self.init_params = models.init_params(self.model, self.input_shape, init_key)
    self.param_bytes = models.param_bytes(self.init_params)
    self.algorithm = algo = registry.make_algorithm(
        config,
        make_loss_fn(self.model),
        make_optimizer(config, self.steps_per_epoch),
        self.total_steps,
    )
    # (..., clock) -> ...; BatchNorm normalises each worker's own mini-batch, so a
    # device's workers are not merged into one batch for such models
    self.step_fn = workers.map_step(
        algo, self.layout, merge_workers=not models.has_batch_norm(self.model)
    )
    # BatchNorm models: the eval takes one more "worker" argument, bn_x.
    self.batch_norm = bn = models.has_batch_norm(self.model)
    self.eval_fn = workers.map_workers(
        make_eval_fn(self.model, algo),
        self.layout,
        ("worker", "shared") + ("worker",) * (4 if bn else 3),
        ("worker",) * 4,
    )
    # at most the examples a worker evaluates: a huge eval_batch_size pads nothing
    eval_batch = min(config.eval_batch_size, -(-len(ds.test_y) // config.num_workers))
    idx, mask = batches.eval_shards(len(ds.test_y), config.num_workers, eval_batch)
    test_x = batches.center_crop(ds.test_x, config.crop_size)  # evaluation: centre crop
    self.test_data = workers.split_workers((test_x[idx], ds.test_y[idx], mask), self.layout)
    self.val_data = None  # validation_examples: the held-out examples, sharded alike
    if config.validation_examples:
      val_x, val_y = self.validation
      val_batch = min(config.eval_batch_size, -(-len(val_y) // config.num_workers))
      vidx, vmask = batches.eval_shards(len(val_y), config.num_workers, val_batch)
      self.val_data = workers.split_workers(
          (batches.center_crop(val_x, config.crop_size)[vidx], val_y[vidx], vmask), self.layout
      )
    self.bn_stats_data = self.batch_stats_fn = None  # BatchNorm models only
    if bn:
      bn_idx = bn_stats_indices(
          len(ds.train_y), config.num_workers, config.bn_stats_examples, config.seed
      )
      # training images, centre-cropped like the test images: [d, w, n, ...]
      self.bn_stats_data = workers.split_workers(
          batches.center_crop(ds.train_x[bn_idx], config.crop_size), self.layout
      )
      self.batch_stats_fn = workers.map_workers(
          lambda center, bn_x: models.compute_batch_stats(self.model, center, bn_x, WORKER_AXES),
          self.layout,
          ("shared", "worker"),
          ("shared",),
      )

  # -- state ---------------------------------------------------------------
  def initial_state(self):
    """(worker_state, shared_state) on the devices: everyone starts equal."""
    return workers.place_state(self.algorithm, self.init_params, self.layout)

  def to_checkpoint(self, worker, shared, step, epoch_losses):
    """The layout-free checkpoint dict (see ``easgd.training.checkpoint``)."""
    losses = np.zeros((self.steps_per_epoch, self.config.num_workers), np.float32)
    done = host_losses(epoch_losses, self.config.num_workers)
    losses[: len(done)] = done
    shared_host = workers.first_copy(shared)
    return dict(
        worker=workers.merge_workers(worker),
        shared=shared_host,
        center=self.algorithm.center(shared_host),
        epoch_losses=losses,
        step=np.asarray(step, np.int64),
    )

  def from_checkpoint(self, restored):
    """(worker, shared, step, epoch_losses) placed on this run's devices."""
    step = int(restored["step"])
    done = step % self.steps_per_epoch
    losses = [restored["epoch_losses"][i] for i in range(done)]
    return (
        workers.split_workers(restored["worker"], self.layout),
        workers.replicate_per_device(restored["shared"], self.layout),
        step,
        losses,
    )

  def checkpoint_target(self):
    """Host zeros of the checkpoint dict's structure, shapes and dtypes (the
    target Orbax restores into; see :meth:`to_checkpoint`)."""
    worker, shared = self.algorithm.init(self.init_params)
    host_worker = jax.tree.map(
        lambda x: np.broadcast_to(np.asarray(x), (self.config.num_workers, *np.shape(x))), worker
    )
    return dict(
        worker=host_worker,
        shared=jax.tree.map(np.asarray, shared),
        center=jax.tree.map(np.asarray, self.algorithm.center(shared)),
        epoch_losses=np.zeros((self.steps_per_epoch, self.config.num_workers), np.float32),
        step=np.asarray(0, np.int64),
    )

  # -- evaluation ----------------------------------------------------------
  def center_batch_stats(self, center):
    """The BatchNorm statistics of ``center`` (host params) that the evaluation uses.

    Computed as in :func:`make_eval_fn` (same examples, same mapped pass);
    None for models without BatchNorm.
    """
    if not self.batch_norm:
      return None
    return workers.first_copy(
        self.batch_stats_fn(workers.replicate_per_device(center, self.layout), self.bn_stats_data)
    )

  def evaluate(self, worker, shared, epoch, step, epoch_losses):
    """One metrics record: the center on every test example exactly once (and
    on every held-out validation example, with ``validation_examples``).

    Args:
      worker, shared: the state on this run's devices.
      epoch: epochs done (0: the start).
      step: global steps done.
      epoch_losses: the epoch's per-step worker losses (``train_loss`` is
        their mean), or None.

    Returns:
      The record (``metrics.jsonl``'s fields).

    Raises:
      DivergenceError: the test or validation loss is not finite (a center
        with finite but huge parameters; the record is not returned).
    """
    bn_x = (self.bn_stats_data,) if self.batch_norm else ()
    loss_sum, correct, count, dist = workers.to_host(
        self.eval_fn(worker, shared, *bn_x, *self.test_data)
    )  # all workers, gathered across processes
    count = int(count.sum())
    comm = self.algorithm.communication(step, self.param_bytes)
    val = {}
    if self.val_data is not None:
      v_loss, v_correct, v_count, _ = workers.to_host(
          self.eval_fn(worker, shared, *bn_x, *self.val_data)
      )
      v_count = int(v_count.sum())
      val = dict(
          val_loss=float(v_loss.astype(np.float64).sum() / v_count),
          val_error=1.0 - int(v_correct.sum()) / v_count,
          val_count=v_count,
      )
    record = dict(
        epoch=epoch,
        step=step,
        test_loss=float(loss_sum.astype(np.float64).sum() / count),
        test_accuracy=int(correct.sum()) / count,
        test_error=1.0 - int(correct.sum()) / count,
        test_count=count,
        train_loss=(
            None
            if epoch_losses is None or not len(epoch_losses)
            else float(
                np.mean(host_losses(epoch_losses, self.config.num_workers).astype(np.float64))
            )
        ),
        worker_center_distance=float(np.mean(dist)),
        all_reduces=comm.all_reduces,
        bytes_communicated=comm.bytes,
        # the local step size of the next step (lr_scaling resolved) and how
        # many of the steps so far were synchronous warm-up
        learning_rate=float(self.schedule(step)),
        sync_warmup_steps_done=min(step, self.config.sync_warmup_steps),
        **val,
    )
    self.check_finite_record(record)
    return record

  def check_finite_record(self, record) -> None:
    """Raises DivergenceError if an evaluated loss of ``record`` is not finite.

    Args:
      record: a metrics record (:meth:`evaluate`): ``test_loss`` and, with
        ``validation_examples``, ``val_loss`` (nats per example).

    Raises:
      DivergenceError: names the quantity, its value, the step and epoch.
    """
    for name in ("test_loss", "val_loss"):
      value = record.get(name)
      if value is not None and not np.isfinite(value):
        raise DivergenceError(
            divergence_message(
                self.config,
                f"the evaluated center's {name} is {value} at step {record['step']} "
                f"(epoch {record['epoch']})",
            )
        )

  def check_finite(self, epoch_losses, first_step, state=None):
    """Raises DivergenceError at the first non-finite loss or state value.

    Called before every checkpoint save, hence before every evaluation: a
    non-finite state is never saved or evaluated.

    Args:
      epoch_losses: per-step worker losses, steps ``first_step, ...``
        (:func:`host_losses`' input or output).
      first_step: global step of ``epoch_losses[0]``.
      state: optional checkpoint dict (:meth:`to_checkpoint`): its merged
        worker state (leaves [num_workers, ...]) and its shared state (the
        center, or the one model of pmean SGD and the sequential methods,
        optimizer and master states) are checked for non-finite values.

    Raises:
      DivergenceError: names the step and worker, or the state entry, and the
        quadratic model's stability bound.
    """
    losses = host_losses(epoch_losses, self.config.num_workers)
    if len(losses):
      bad = np.argwhere(~np.isfinite(losses))
      if bad.size:
        s, w = (int(v) for v in bad[0])
        raise DivergenceError(
            divergence_message(
                self.config,
                f"worker {w} had a non-finite loss ({losses[s, w]}) at step " f"{first_step + s}",
            )
        )
    if state is None:
      return
    for path, leaf in jax.tree_util.tree_leaves_with_path(state["worker"]):
      ok = (
          np.isfinite(leaf.reshape(leaf.shape[0], -1)).all(axis=1)
          if np.issubdtype(leaf.dtype, np.floating)
          else None
      )
      if ok is not None and not ok.all():
        raise DivergenceError(
            divergence_message(
                self.config,
                f"worker {int(np.argmin(ok))} has non-finite parameters "
                f"({jax.tree_util.keystr(path)}) at step {int(state['step'])}",
            )
        )
    for path, leaf in jax.tree_util.tree_leaves_with_path(state["shared"]):
      leaf = np.asarray(leaf)
      if np.issubdtype(leaf.dtype, np.floating) and not np.isfinite(leaf).all():
        raise DivergenceError(
            divergence_message(
                self.config,
                f"the shared state (center or model) has non-finite values "
                f"({jax.tree_util.keystr(path)}) at step {int(state['step'])}",
            )
        )


def center_lag_steps(algorithm: algorithms.Algorithm, name: str, steps_done: int) -> int | None:
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


def host_losses(epoch_losses, num_workers: int) -> np.ndarray:
  """Per-step worker losses as one host array.

  Args:
    epoch_losses: a list of the step function's losses (device arrays
      [d, w], float32), or an array this function returned (passed through).
    num_workers: p.

  Returns:
    float32 array [len(epoch_losses), num_workers], worker i in column i.
  """
  if isinstance(epoch_losses, np.ndarray):
    return epoch_losses
  if not epoch_losses:
    return np.zeros((0, num_workers), np.float32)
  return np.stack([workers.to_host(l).reshape(-1) for l in epoch_losses]).astype(np.float32)


class SpmdExecutor:
  """Runtime "spmd" of the training loop (``easgd.training.executor.Executor``).

  Every global step is one call of ``Run.step_fn`` on all workers, fed the
  step's batch (``batches.worker_batch_indices`` of its epoch, random crops
  fixed by (seed, epoch, step)); each process feeds only its own workers.
  The state stays on the devices; a :class:`~easgd.training.executor.Snapshot`
  reads it to the host.

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

  def checkpoint_target(self) -> dict:
    """Host zeros of the checkpoint's tree (``Run.checkpoint_target``)."""
    return self.run.checkpoint_target()

  def initial_state(self) -> Snapshot:
    """Every worker at the initial parameters, on the devices; step 0."""
    self.worker, self.shared = self.run.initial_state()
    self.step, self.epoch_losses = 0, []
    return Snapshot(0, None, host_losses([], self.run.config.num_workers), {})

  def restore(self, restored: dict) -> Snapshot:
    """The restored checkpoint placed on this run's devices (any device count)."""
    self.worker, self.shared, self.step, self.epoch_losses = self.run.from_checkpoint(restored)
    return Snapshot(self.step, restored, host_losses([], self.run.config.num_workers), {})

  def start(self, on_progress: Callable[[int], None]) -> None:
    """Nothing to start (compiled on the first step); keeps ``on_progress``."""
    self.on_progress = on_progress

  def run_to(self, step: int, while_running: Callable[[], None] | None = None) -> None:
    """``while_running()``, then the steps up to global step ``step``."""
    if while_running is not None:  # before the next step: the state is the boundary's
      while_running()
    run = self.run
    while self.step < step:
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
      self.step += 1
      self.on_progress(self.step)

  def _batch(self, step: int):
    """This process's workers' batch of global step ``step``, split per device."""
    run, config = self.run, self.run.config
    spe = run.steps_per_epoch
    epoch = step // spe + 1
    if self._order[0] != epoch:
      self._order = (
          epoch,
          batches.worker_batch_indices(
              len(run.dataset.train_y),
              config.num_workers,
              config.per_worker_batch_size,
              config.seed,
              epoch,
          ),
      )
    ix = self._order[1][step % spe]
    x = run.dataset.train_x[ix]
    if config.crop_size is not None:  # random crops, fixed by (seed, epoch, step)
      x = batches.random_crop(x, config.crop_size, batches.crop_rng(config.seed, epoch, step))
    local = run.layout.local_workers  # each process feeds only its own workers
    return workers.split_local_workers((x[local], run.dataset.train_y[ix][local]), run.layout)

  def state_for_checkpoint(self, evaluated: bool) -> Snapshot:
    """The state and this epoch's losses, read from the devices once."""
    del evaluated  # the losses since the epoch's start are always in the snapshot
    losses = host_losses(self.epoch_losses, self.run.config.num_workers)
    state = self.run.to_checkpoint(self.worker, self.shared, self.step, losses)
    if self.step % self.run.steps_per_epoch == 0:  # an epoch end: its losses are read
      self.epoch_losses = []
    return Snapshot(self.step, state, losses, {})

  def evaluate_inputs(self, snapshot: Snapshot):
    """The device state (the snapshot's until the next ``run_to``)."""
    del snapshot  # the device state is the snapshot's until the next step
    return self.worker, self.shared

  def write_exchange_log(self, path, snapshot: Snapshot) -> None:
    """Simulated asynchronous algorithms: every exchange by the snapshot's step."""
    if registry.TABLE[self.run.config.algorithm].asynchronous:  # simulated: every exchange
      from easgd.asynchrony import log as async_log  # by the step, for replays

      async_log.write_exchange_log(path, self.run.algorithm, self.run.step_key, snapshot.step)

  def summary_fields(self) -> dict[str, Any]:
    """Algorithm, layout, the center's lag, communication, shared copies equal."""
    run, step = self.run, self.step
    comm = run.algorithm.communication(step, run.param_bytes)
    return dict(
        algorithm=dict(name=run.algorithm.name, **run.algorithm.hyperparameters),
        layout=run.layout.describe(),
        center_lag_steps=center_lag_steps(run.algorithm, run.config.algorithm, step),
        communication=dict(
            all_reduces=comm.all_reduces,
            bytes=comm.bytes,
            all_reduces_per_step=comm.all_reduces / max(step, 1),
            bytes_per_step=comm.bytes / max(step, 1),
        ),
        shared_copies_equal=workers.shared_copies_equal(self.shared),
    )

  def close(self) -> None:
    """Nothing to stop."""
    pass
