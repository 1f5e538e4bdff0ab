"""The run every executor trains: :class:`Run` and what its executors share.

:class:`Run` builds, from a :class:`~easgd.settings.config.TrainConfig`, the task
(its view with the validation examples held out: :func:`checked_task`), the
layout, the local optimizer and the algorithm, and compiles one mapped step and
one mapped evaluation of the center (every test example once:
:func:`make_eval_fn`). The loop (``easgd.run.trainer``) evaluates and checks with
it whatever the runtime; the executors (``easgd.runtimes.spmd``,
``easgd.runtimes.async_runs``) feed its step with :func:`global_batch`.
docs/guides/architecture.md.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from easgd.core import elastic
from easgd.core.base import Algorithm
from easgd.core.elastic import WORKER_AXES
from easgd.methods import registry
from easgd.parallel import data_parallel, mapping, placement, worker_layout
from easgd.runtimes.divergence import DivergenceError, divergence_message
from easgd.runtimes.optimizers import make_optimizer, make_schedule
from easgd.settings import builtin_tasks
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import batches, data, models
from easgd.tasks.sources import Subset, take
from easgd.tasks.task import Task, check_task, user_call


def make_eval_fn(task: Task, algo: Algorithm, metrics: tuple[str, ...]):
  """Per-worker evaluation of the center on this worker's shard of a split.

  Returns ``eval_fn(worker, shared, batch, mask) -> (sums, count, distance)``
  with ``batch`` a tree of leaves [num_batches, eval_batch, ...] and ``mask``
  bool [num_batches, eval_batch]: ``sums[k]`` is the float32 sum of metric
  ``metrics[k]`` of ``task.evaluate`` over the masked entries only, so the
  totals over workers are exact; ``distance`` the worker's distance to the
  center.

  A task with ``center_state`` (BatchNorm models) gets one more argument,
  ``eval_fn(worker, shared, state_batch, batch, mask)``: the center's state is
  first recomputed from the center by ``task.center_state`` over
  ``state_batch`` (this worker's share of ``Run.bn_stats_data``) pooled over
  ``WORKER_AXES`` (BatchNorm: exact per-channel mean and biased variance, as
  SWA's ``bn_update``, Izmailov et al., 2018; docs/guides/multi_device.md).

  Args:
    task: the run's task.
    algo: the run's algorithm (``center``, ``worker_params``).
    metrics: the metric names ``task.evaluate`` returns, in record order.

  Returns:
    ``eval_fn`` as above, to be mapped over workers (``easgd.parallel.mapping.map_workers``).
  """

  def evaluate(worker, shared, center, state, batch, mask):
    def body(carry, inputs):
      b, mb = inputs
      out = task.evaluate(center, b) if state is None else task.evaluate(center, b, state)
      sums = tuple(
          carry[0][k] + jnp.sum(jnp.where(mb, out[m].astype(jnp.float32), 0.0))
          for k, m in enumerate(metrics)
      )
      return (sums, carry[1] + jnp.sum(mb.astype(jnp.int32))), None

    zeros = (tuple(jnp.float32(0) for _ in metrics), jnp.int32(0))
    (sums, count), _ = lax.scan(body, zeros, (batch, mask))
    distance = elastic.tree_l2_distance(algo.worker_params(worker, shared), center)
    return sums, count, distance

  if task.center_state is not None:

    def state_eval_fn(worker, shared, state_batch, batch, mask):
      center = algo.center(shared)
      state = task.center_state(center, state_batch, WORKER_AXES)
      return evaluate(worker, shared, center, state, batch, mask)

    return state_eval_fn

  def eval_fn(worker, shared, batch, mask):
    center = algo.center(shared)
    return evaluate(worker, shared, center, None, batch, mask)

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


def with_validation(task: Task, num_held_out: int) -> Task:
  """``task`` with ``num_held_out`` training examples held out as its validation data.

  The held-out examples are ``easgd.tasks.data.validation_split``'s (a
  seeded choice fixed by the training set's size alone); 0 keeps ``task``.

  Raises:
    ConfigError: the task has validation data of its own.
    easgd.tasks.data.DataError: as ``validation_split``.
  """
  if not num_held_out:
    return task
  if task.validation is not None:
    raise ConfigError(
        f"validation_examples={num_held_out}: task {task.name!r} has validation data of "
        "its own; allowed: validation_examples 0"
    )
  train_idx, val_idx = data.validation_split(len(task.train), num_held_out)
  return dataclasses.replace(
      task, train=Subset(task.train, train_idx), validation=Subset(task.train, val_idx)
  )


def checked_task(config: TrainConfig, task: Task | None = None) -> tuple[Task, tuple[str, ...]]:
  """The run's view of its task, checked against the run's sizes (nothing compiled).

  Args:
    config: the validated config.
    task: the task, or None for the one ``config`` names
      (``easgd.settings.builtin_tasks.task_of``).

  Returns:
    ``(task, metrics)``: the task with ``validation_examples`` held out of its
    training data (:func:`with_validation`), and the metric names its
    ``evaluate`` returns (``easgd.tasks.task.check_task``).

  Raises:
    easgd.tasks.task.TaskError, ConfigError, easgd.tasks.data.DataError:
      as ``task_of``, :func:`with_validation`, ``TrainConfig.resolve`` (what
      the data's size derives, checked first) and ``check_task``.
  """
  task = with_validation(builtin_tasks.task_of(config, task), config.validation_examples)
  if config.validation_examples and len(task.train) < config.global_batch_size:
    raise ConfigError(
        f"validation_examples={config.validation_examples} leaves {len(task.train)} training "
        f"examples, fewer than one global batch ({config.global_batch_size}); allowed: at "
        f"most {len(task.train) + config.validation_examples - config.global_batch_size}"
    )
  # the quantities derived from the data's size first (pure arithmetic)
  config.resolve(
      batches.steps_per_epoch(len(task.train), config.num_workers, config.per_worker_batch_size),
      len(task.train),
  )
  eval_batch = min(config.eval_batch_size, -(-len(task.test) // config.num_workers))
  metrics = check_task(
      task,
      num_workers=config.num_workers,
      per_worker_batch=config.per_worker_batch_size,
      eval_batch=eval_batch,
  )["metrics"]
  return task, metrics


def evaluated_examples(task: Task, indices: np.ndarray, source=None):
  """The examples of ``source`` (default ``task.train``) at ``indices`` (any
  shape), with ``task.eval_transform`` applied: leaves ``[*indices.shape, ...]``."""
  indices = np.asarray(indices)
  batch = take(task.train if source is None else source, indices.reshape(-1))
  if task.eval_transform is not None:
    batch = user_call(task, "eval_transform", task.eval_transform, batch)
  return jax.tree.map(lambda a: a.reshape(*indices.shape, *a.shape[1:]), batch)


def split_means(split: str, metrics, sums, count, *, test: bool) -> dict:
  """A split's record fields from the workers' metric sums and counts.

  ``{split}_loss`` (nats per example), with a ``correct`` metric
  ``test_accuracy`` (test only) and ``{split}_error``, every other metric's
  mean ``{split}_{name}``, and ``{split}_count`` (examples).
  """
  count = int(np.asarray(count).sum())
  total = {m: np.asarray(v).astype(np.float64).sum() for m, v in zip(metrics, sums)}
  out = {f"{split}_loss": float(total["loss"] / count)}
  if "correct" in total:
    correct = float(total["correct"])
    if test:
      out[f"{split}_accuracy"] = correct / count
    out[f"{split}_error"] = 1.0 - correct / count
  if test:
    out[f"{split}_count"] = count
  for m in metrics:
    if m not in ("loss", "correct"):
      out[f"{split}_{m}"] = float(total[m] / count)
  if not test:
    out[f"{split}_count"] = count
  return out


def check_devices_per_worker(task: Task, devices_per_worker: int) -> None:
  """Refuses a task a worker of several devices cannot train.

  A worker of D > 1 devices averages its devices' losses and gradients
  (``easgd.parallel.data_parallel.data_parallel_loss``), which are its whole
  batch's only for a loss that is the mean of independent per-example terms
  (``Task.mean_of_examples``, which the task declares) and a model without
  state of its own (``Task.center_state``: BatchNorm statistics, which each
  device would take from its own examples). docs/guides/task.md.

  Args:
    task: the run's task.
    devices_per_worker: D, an int >= 1 (D = 1: nothing to check).

  Raises:
    ConfigError: D > 1 with a task that has a ``center_state`` or does not
      declare ``mean_of_examples=True``; one line saying what to change.
  """
  D = devices_per_worker
  if D == 1:
    return
  averages = f"devices_per_worker={D} averages a worker's loss and gradient over its devices"
  if task.center_state is not None:
    raise ConfigError(
        f"{averages}; task {task.name!r} has a center_state (model state such as BatchNorm "
        "statistics, which each device would take from its own examples); allowed: "
        "devices_per_worker 1"
    )
  if not task.mean_of_examples:
    raise ConfigError(
        f"{averages}, which are its whole batch's only for a loss that is a mean of "
        f"independent per-example terms; task {task.name!r} does not declare its loss one "
        "(mean_of_examples=False, the default); allowed: devices_per_worker 1, or, if the "
        "loss is such a mean, the task built with easgd.Task(..., mean_of_examples=True) "
        "(docs/guides/task.md)"
    )


class Run:
  """Everything a training run compiles and feeds, built from a config.

  Construction validates the config, the worker layout and the task (its
  data and functions against the run's sizes, abstractly) before anything is
  compiled. Attributes: ``config``, ``layout``, ``task`` (the run's view: the
  held-out validation examples split off its training data), ``metrics``
  (the names ``task.evaluate`` returns), ``algorithm``, ``steps_per_epoch``,
  ``total_steps``, ``param_bytes`` (one copy of the parameters), ``exchange_bytes``
  (:func:`easgd.core.elastic.reduced_bytes`: what one exchange or gradient
  average moves, the count of every communication record), ``step_fn``
  (``easgd.parallel.mapping.map_step``: called with the host's step count as
  its last argument), ``eval_fn`` (``easgd.parallel.mapping.map_workers``),
  ``step_key``; for tasks with a ``center_state`` (BatchNorm; ``batch_norm``
  True) also ``bn_stats_data`` (the examples of the center's statistics,
  :func:`bn_stats_indices`) and ``batch_stats_fn``.

  Args:
    config: the run's configuration.
    task: the problem (``easgd.tasks.task.Task``); None: the one
      ``config`` names (``config.task`` or the built-in dataset and model).

  Raises:
    ConfigError, easgd.parallel.worker_layout.LayoutError, easgd.tasks.data.DataError,
    easgd.tasks.task.TaskError: bad input; ConfigError also for
      ``devices_per_worker`` > 1 with a task whose loss is not a mean of
      examples (``mean_of_examples``) or that has model state
      (:func:`check_devices_per_worker`).
  """

  def __init__(self, config: TrainConfig, task: Task | None = None):
    self.config = config = config.validate()
    self.layout = worker_layout.make_layout(
        config.num_workers,
        config.num_devices,
        backend=config.resolved_mapping_backend,
        devices_per_worker=config.devices_per_worker,
    )
    self.task, self.metrics = checked_task(config, task)
    task = self.task
    if config.devices_per_worker > 1:
      check_devices_per_worker(task, config.devices_per_worker)
    self.steps_per_epoch = batches.steps_per_epoch(
        len(task.train), config.num_workers, config.per_worker_batch_size
    )
    # every quantity derived from the data's size (tau and K against the run,
    # the center's first exchange, the schedule in steps), checked before
    # anything compiles; summary.json and the metrics record it
    self.resolved = config.resolve(self.steps_per_epoch, len(task.train))
    self.total_steps = self.resolved["total_steps"]
    self.resolved.update(
        validation_examples=config.validation_examples, train_examples=len(task.train)
    )
    # at most the examples a worker evaluates: a huge eval_batch_size pads nothing
    eval_batch = min(config.eval_batch_size, -(-len(task.test) // config.num_workers))
    self.schedule = make_schedule(config, self.steps_per_epoch, num_examples=len(task.train))
    init_key, self.step_key = jax.random.split(jax.random.key(config.seed))
    if config.shard_params:  # parameter-shaped state split over each worker's devices
      self.layout = data_parallel.shard_params(self.layout, jax.eval_shape(task.init, init_key))
    self.init_params = task.init(init_key)
    self.param_bytes = models.param_bytes(self.init_params)
    # what an exchange or a gradient average moves: the parameters in float32 at least
    self.exchange_bytes = elastic.reduced_bytes(self.init_params)
    self.algorithm = algo = registry.make_algorithm(
        config,
        # D > 1: the loss and gradient of each worker's whole batch, averaged
        # over its devices (the identity for D = 1)
        data_parallel.data_parallel_loss(task.loss, self.layout),
        make_optimizer(config, self.steps_per_epoch, num_examples=len(task.train)),
        self.total_steps,
        self.init_params,
    )
    # (..., clock) -> ...; a loss that is not a mean of per-example terms
    # (BatchNorm normalises each worker's own mini-batch) keeps a device's
    # workers apart
    self.batch_norm = bn = task.center_state is not None
    self.step_fn = mapping.map_step(algo, self.layout, merge_workers=task.mean_of_examples)
    # tasks with a center state: the eval takes one more "worker" argument
    self.eval_fn = mapping.map_workers(
        make_eval_fn(task, algo, self.metrics),
        self.layout,
        ("worker", "shared") + ("worker",) * (3 if bn else 2),
        ("worker",) * 3,
    )
    self.test_data = self._eval_shards(task.test, eval_batch)
    self.val_data = None  # the held-out examples, sharded alike
    if task.validation is not None:
      val_batch = min(config.eval_batch_size, -(-len(task.validation) // config.num_workers))
      self.val_data = self._eval_shards(task.validation, val_batch)
    self.bn_stats_data = self.batch_stats_fn = None  # tasks with a center state only
    if bn:
      bn_idx = bn_stats_indices(
          len(task.train), config.num_workers, config.bn_stats_examples, config.seed
      )
      # training examples, transformed like the evaluated ones: [d, w, n, ...]
      self.bn_stats_data = placement.split_workers(evaluated_examples(task, bn_idx), self.layout)
      self.batch_stats_fn = mapping.map_workers(
          lambda center, batch: task.center_state(center, batch, WORKER_AXES),
          self.layout,
          ("shared", "worker"),
          ("shared",),
      )

  def _eval_shards(self, source, eval_batch: int):
    """(batch, mask) of every example of ``source`` once, split per device."""
    idx, mask = batches.eval_shards(len(source), self.config.num_workers, eval_batch)
    return placement.split_workers((evaluated_examples(self.task, idx, source), mask), self.layout)

  @property
  def train_examples(self) -> int:
    """The examples trained on (the held-out ones excluded)."""
    return len(self.task.train)

  # -- state ---------------------------------------------------------------
  def initial_state(self):
    """(worker_state, shared_state) on the devices: everyone starts equal."""
    return placement.place_state(self.algorithm, self.init_params, self.layout)

  # -- evaluation ----------------------------------------------------------
  def center_batch_stats(self, center):
    """The BatchNorm statistics of ``center`` (host params) that the evaluation uses.

    Computed as in :func:`make_eval_fn` (same examples, same mapped pass);
    None for models without BatchNorm.
    """
    if not self.batch_norm:
      return None
    return placement.first_copy(
        self.batch_stats_fn(placement.replicate_per_device(center, self.layout), self.bn_stats_data)
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
    sums, count, dist = placement.to_host(
        self.eval_fn(worker, shared, *bn_x, *self.test_data)
    )  # all workers, gathered across processes
    comm = self.algorithm.communication(step, self.exchange_bytes)
    val = {}
    if self.val_data is not None:
      v_sums, v_count, _ = placement.to_host(self.eval_fn(worker, shared, *bn_x, *self.val_data))
      val = split_means("val", self.metrics, v_sums, v_count, test=False)
    record = dict(
        epoch=epoch,
        step=step,
        **split_means("test", self.metrics, sums, count, test=True),
        train_loss=(
            None
            if epoch_losses is None or not len(epoch_losses)
            else float(
                np.mean(host_losses(epoch_losses, self.config.num_workers).astype(np.float64))
            )
        ),
        worker_center_distance=float(np.mean(dist)),
        worker_center_distances=[float(d) for d in np.reshape(dist, -1)],  # [p], per worker
        all_reduces=comm.all_reduces,
        bytes_communicated=comm.bytes,
        # compressed exchanges (all-gathers): only where a run has them
        **(
            dict(all_gathers=comm.all_gathers, gathered_bytes=comm.gathered_bytes)
            if comm.all_gathers
            else {}
        ),
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
        validation data, ``val_loss`` (nats per example).

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
      state: optional checkpoint dict (``easgd.runtimes.executor.checkpoint_tree``): its merged
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
          if jnp.issubdtype(leaf.dtype, jnp.floating)  # bfloat16 too
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
      if jnp.issubdtype(leaf.dtype, jnp.floating) and not np.isfinite(leaf).all():
        raise DivergenceError(
            divergence_message(
                self.config,
                f"the shared state (center or model) has non-finite values "
                f"({jax.tree_util.keystr(path)}) at step {int(state['step'])}",
            )
        )


def global_batch(run: "Run", indices: np.ndarray, epoch: int, step: int):
  """The global training batch of ``step`` (of ``epoch``, 1-based) at ``indices``.

  Args:
    run: the run (its task's training data and ``augment``).
    indices: int ``[num_workers, B]``, ``batches.worker_batch_indices`` of
      the epoch at the step.
    epoch, step: where the batch is (``augment``'s generator is
      ``batches.crop_rng(seed, epoch, step)``, fixed by them).

  Returns:
    The batch, leaves ``[num_workers, B, ...]`` (worker i: row i).

  Raises:
    easgd.tasks.task.TaskError: an item the source cannot read, or
      ``augment`` fails (one line naming the task).
  """
  task = run.task
  batch = take(task.train, indices)
  if task.augment is not None:  # e.g. random crops, fixed by (seed, epoch, step)
    batch = user_call(
        task, "augment", task.augment, batch, batches.crop_rng(run.config.seed, epoch, step)
    )
  return batch


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
  return np.stack([placement.to_host(l).reshape(-1) for l in epoch_losses]).astype(np.float32)
