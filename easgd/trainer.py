"""The trainer: ``train_and_evaluate(config, workdir)``.

Builds the data, model, local optimizer (schedule counted in epochs) and
algorithm from a :class:`~easgd.config.TrainConfig`, compiles one mapped step
and one mapped evaluation, and trains. It evaluates the CENTER on every test
example exactly once, and records the mean worker training loss, the mean
distance of the workers to the center and the communication so far.

Files written to ``workdir`` (each replaced atomically, so an interrupted run
never leaves a half-written file):
  ``metrics.jsonl``  one JSON object per evaluation (epoch 0 = the start);
  ``summary.json``   resolved config, layout, communication totals, final
                     metrics, wall time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from easgd import algorithms, data, elastic, models, workers
from easgd.config import ConfigError, TrainConfig

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def make_schedule(config: TrainConfig, steps_per_epoch: int) -> optax.Schedule:
  """The learning-rate schedule of ``config``, converted from epochs to steps.

  Epoch-based settings (warm-up, decay points, total length) are multiplied by
  ``steps_per_epoch``, so the schedule over epochs does not change with the
  number of workers at a fixed global batch.

  Args:
    config: a validated config.
    steps_per_epoch: optimizer steps per epoch (one per global batch).

  Returns:
    An ``optax.Schedule`` of the step count (per worker).
  """
  lr = config.learning_rate
  total = config.num_epochs * steps_per_epoch
  warmup = int(round(config.warmup_epochs * steps_per_epoch))
  if config.lr_schedule == "constant":
    main = optax.constant_schedule(lr)
  elif config.lr_schedule == "cosine":
    main = optax.cosine_decay_schedule(lr, max(total - warmup, 1))
  else:  # step
    boundaries = {int(round(e * steps_per_epoch)) - warmup: config.lr_decay_factor
                  for e in config.lr_decay_epochs}
    main = optax.piecewise_constant_schedule(lr, boundaries)
  if warmup == 0:
    return main
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), main], [warmup])


def make_optimizer(config: TrainConfig, steps_per_epoch: int
                   ) -> optax.GradientTransformation:
  """The local optimizer of ``config`` with its epoch-based schedule.

  "sgd", "momentum" and "nesterov" are ``optax.sgd``; "adam" and "adamw" the
  Optax ones. ``weight_decay`` is an L2 term added to the gradient
  (``optax.add_decayed_weights``) except for "adamw", which decouples it.
  """
  schedule = make_schedule(config, steps_per_epoch)
  name = config.optimizer
  if name == "adamw":
    return optax.adamw(schedule, weight_decay=config.weight_decay)
  if name == "adam":
    opt = optax.adam(schedule)
  else:
    opt = optax.sgd(schedule, momentum=config.momentum if name != "sgd" else None,
                    nesterov=name == "nesterov")
  if config.weight_decay:
    opt = optax.chain(optax.add_decayed_weights(config.weight_decay), opt)
  return opt


def make_loss_fn(model):
  """``loss_fn(params, (x, y), key)``: mean cross-entropy of a mini-batch."""
  def loss_fn(params, batch, key):
    x, y = batch
    logits = model.apply({"params": params}, x, train=True,
                         rngs={"dropout": key})
    return models.cross_entropy_loss(logits, y)
  return loss_fn


def make_algorithm(config: TrainConfig, loss_fn, optimizer) -> algorithms.Algorithm:
  """The algorithm named by ``config.algorithm`` with the given local optimizer."""
  if config.algorithm == "easgd":
    return algorithms.easgd(loss_fn, optimizer, num_workers=config.num_workers,
                            tau=config.tau, alpha=config.alpha, beta=config.beta)
  return algorithms.pmean_sgd(loss_fn, optimizer)


def make_eval_fn(model, algo: algorithms.Algorithm):
  """Per-worker evaluation of the center on this worker's test shard.

  Returns ``eval_fn(worker, shared, x, y, mask) -> (loss_sum, correct, count,
  distance)`` with x: [num_batches, eval_batch, ...], mask: bool like y. Sums
  run over masked entries only, so the totals over workers are exact.
  """
  def eval_fn(worker, shared, x, y, mask):
    center = algo.center(shared)

    def body(carry, inputs):
      xb, yb, mb = inputs
      logits = model.apply({"params": center}, xb, train=False)
      loss, correct = models.per_example_stats(logits, yb)
      return (carry[0] + jnp.sum(jnp.where(mb, loss, 0.0)),
              carry[1] + jnp.sum(jnp.where(mb, correct, 0).astype(jnp.int32)),
              carry[2] + jnp.sum(mb.astype(jnp.int32))), None

    zeros = (jnp.float32(0), jnp.int32(0), jnp.int32(0))
    (loss_sum, correct, count), _ = lax.scan(body, zeros, (x, y, mask))
    distance = elastic.tree_l2_distance(algo.worker_params(worker, shared), center)
    return loss_sum, correct, count, distance
  return eval_fn


def _write_atomic(path: Path, text: str) -> None:
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  tmp.write_text(text)
  os.replace(tmp, path)


def check_workdir(workdir, overwrite: bool) -> Path:
  """Refuses to write over a finished or started run unless ``overwrite``.

  Raises:
    ConfigError: workdir is a file, or holds metrics/summary and not overwrite.
  """
  workdir = Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise ConfigError(f"workdir '{workdir}' exists and is not a directory")
  if not overwrite and any((workdir / f).exists() for f in (METRICS_FILE, SUMMARY_FILE)):
    raise ConfigError(f"workdir '{workdir}' already holds a run; choose another "
                      "directory or pass overwrite (--overwrite)")
  return workdir


class _Progress:
  """A tqdm bar when enabled, else nothing."""

  def __init__(self, enabled: bool, total: int, desc: str):
    self.bar = None
    if enabled:
      from tqdm.auto import tqdm
      self.bar = tqdm(total=total, desc=desc, unit="step", leave=True)

  def update(self, n=1):
    if self.bar is not None:
      self.bar.update(n)

  def postfix(self, **kw):
    if self.bar is not None:
      self.bar.set_postfix(kw, refresh=False)

  def close(self):
    if self.bar is not None:
      self.bar.close()


def train_and_evaluate(config: TrainConfig, workdir, *, overwrite: bool = False
                       ) -> dict[str, Any]:
  """Trains ``config`` and writes metrics and a summary into ``workdir``.

  Everything is validated first (config values, the worker/device layout, the
  data set and the workdir), before any compilation.

  Args:
    config: the run's configuration.
    workdir: output directory (created if missing).
    overwrite: allow replacing the files of an earlier run in ``workdir``.

  Returns:
    The summary dict also written to ``workdir/summary.json``; its ``"history"``
    holds the list of metric records of ``metrics.jsonl``.

  Raises:
    ConfigError: a bad config value or workdir.
    easgd.workers.LayoutError: num_workers not a multiple of the devices used.
    easgd.data.DataError: unknown or missing data set files, or a batch larger
      than the data.
  """
  config.validate()
  workdir = check_workdir(workdir, overwrite)
  layout = workers.make_layout(config.num_workers, config.num_devices)
  ds = data.load_dataset(config.dataset, data_dir=config.data_dir, seed=config.seed)
  n_train, n_test = len(ds.train_y), len(ds.test_y)
  b = config.per_worker_batch_size
  steps_per_epoch = data.steps_per_epoch(n_train, config.num_workers, b)
  total_steps = steps_per_epoch * config.num_epochs
  workdir.mkdir(parents=True, exist_ok=True)
  for f in (METRICS_FILE, SUMMARY_FILE):
    (workdir / f).unlink(missing_ok=True)

  model = models.make_model(config.model, ds.num_classes)
  key = jax.random.key(config.seed)
  init_key, step_key = jax.random.split(key)
  params = models.init_params(model, ds.input_shape, init_key)
  param_bytes = models.param_bytes(params)
  algo = make_algorithm(config, make_loss_fn(model),
                        make_optimizer(config, steps_per_epoch))

  worker_state, shared_state = algo.init(params)
  worker_state = workers.replicate_per_worker(worker_state, layout)
  shared_state = workers.replicate_per_device(shared_state, layout)
  step_fn = workers.map_workers(algo.step, layout,
                                ("worker", "shared", "worker", "broadcast"),
                                ("worker", "shared", "worker"), donate_argnums=(0, 1))
  eval_fn = workers.map_workers(make_eval_fn(model, algo), layout,
                                ("worker", "shared", "worker", "worker", "worker"),
                                ("worker",) * 4)
  idx, mask = data.eval_shards(n_test, config.num_workers, config.eval_batch_size)
  test_x = workers.split_workers(ds.test_x[idx], layout)
  test_y = workers.split_workers(ds.test_y[idx], layout)
  test_mask = workers.split_workers(mask, layout)

  history: list[dict[str, Any]] = []
  start = time.perf_counter()

  def evaluate(epoch, step, train_losses):
    loss_sum, correct, count, dist = (np.asarray(a) for a in eval_fn(
        worker_state, shared_state, test_x, test_y, test_mask))
    count = int(count.sum())
    comm = algo.communication(step, param_bytes)
    record = dict(
        epoch=epoch, step=step,
        test_loss=float(loss_sum.astype(np.float64).sum() / count),
        test_accuracy=int(correct.sum()) / count,
        test_error=1.0 - int(correct.sum()) / count,
        test_count=count,
        train_loss=(None if train_losses is None else
                    float(np.mean(np.asarray(train_losses, np.float64)))),
        worker_center_distance=float(np.mean(dist)),
        all_reduces=comm.all_reduces, bytes_communicated=comm.bytes,
        elapsed_s=round(time.perf_counter() - start, 3))
    history.append(record)
    _write_atomic(workdir / METRICS_FILE,
                  "".join(json.dumps(r) + "\n" for r in history))
    return record

  evaluate(0, 0, None)
  progress = _Progress(config.progress, total_steps,
                       f"{config.algorithm} p={config.num_workers}")
  step = 0
  try:
    for epoch in range(1, config.num_epochs + 1):
      batches = data.worker_batch_indices(n_train, config.num_workers, b,
                                          config.seed, epoch)
      losses = []
      for s in range(steps_per_epoch):
        ix = batches[s]
        batch = workers.split_workers((ds.train_x[ix], ds.train_y[ix]), layout)
        worker_state, shared_state, loss = step_fn(
            worker_state, shared_state, batch, step_key)
        losses.append(loss)  # device arrays: read once per epoch, not per step
        step += 1
        progress.update()
      if epoch % config.eval_every_epochs == 0 or epoch == config.num_epochs:
        rec = evaluate(epoch, step, jnp.stack(losses))
        progress.postfix(test_acc=f"{rec['test_accuracy']:.4f}")
  finally:
    progress.close()

  comm = algo.communication(total_steps, param_bytes)
  summary = dict(
      config=config.to_dict(),
      algorithm=dict(name=algo.name, **algo.hyperparameters),
      layout=layout.describe(), num_devices=layout.num_devices,
      jax_version=jax.__version__, platform=layout.devices[0].platform,
      num_params=models.count_params(params), param_bytes=param_bytes,
      train_examples=n_train, test_examples=n_test,
      steps_per_epoch=steps_per_epoch, total_steps=total_steps,
      communication=dict(all_reduces=comm.all_reduces, bytes=comm.bytes,
                         all_reduces_per_step=comm.all_reduces / total_steps,
                         bytes_per_step=comm.bytes / total_steps),
      final=history[-1],
      best_test_accuracy=max(r["test_accuracy"] for r in history),
      wall_time_s=round(time.perf_counter() - start, 3),
      shared_copies_equal=workers.shared_copies_equal(shared_state))
  _write_atomic(workdir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
  summary["history"] = history
  return summary
