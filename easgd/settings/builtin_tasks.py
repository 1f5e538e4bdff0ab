"""The built-in data sets and models as tasks, and the task of a config.

:func:`classifier_task` turns any Flax classifier (``__call__(x, train)`` ->
logits) and ``(x, y)`` arrays or sources into a :class:`~easgd.tasks.task.Task`:
the mean cross-entropy as the loss, per-example cross-entropy and correctness
as the evaluation, and for a model with BatchNorm (``models.has_batch_norm``)
the package's BatchNorm policy (each worker's mini-batch statistics in
training; the center's statistics recomputed from the center,
``models.compute_batch_stats``, for evaluation). :func:`builtin_task` is the
built-in data sets (``easgd.tasks.datasets``) and models
(``easgd.tasks.models``) through it; :func:`task_of` the task a
:class:`~easgd.settings.config.TrainConfig` names (``config.task``, an import
path, or the built-in one of ``dataset`` and ``model``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import batches, datasets, models
from easgd.tasks.data import DataError
from easgd.tasks.sources import TaskError, as_source
from easgd.tasks.task import Task, load_task, parse_task_args

_BN_DEFAULT = TrainConfig.__dataclass_fields__["bn_stats_examples"].default


BUILTIN_FACTORY = "easgd.settings.builtin_tasks:builtin_task"
"""The factory of the built-in tasks (a config names them by dataset and model)."""


def make_task_config(config, task: Task):
  """``config`` with ``task``'s import path and arguments recorded (``config.task``,
  ``config.task_args``), so a resume, a Ray worker or export rebuilds it; the
  config itself for a built-in task or one built in code (no import path)."""
  if config.task is not None or task.factory in (None, BUILTIN_FACTORY):
    return config
  args = tuple(f"{k}={json.dumps(v)}" for k, v in task.factory_args.items())
  return config.replace(task=task.factory, task_args=args).validate()


def make_loss_fn(model):
  """``loss_fn(params, (x, y), key)``: mean cross-entropy of a mini-batch.

  Models with BatchNorm (``models.has_batch_norm``) normalise with the
  mini-batch's own statistics; the updated ``batch_stats`` that Flax returns are
  discarded, so no BatchNorm state is trained, exchanged or checkpointed (the
  policy of ``easgd.tasks.models``; the center's statistics:
  ``Task.center_state``).

  Args:
    model: a Flax classifier (``__call__(x, train)`` -> logits ``[b, classes]``).

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


def make_classifier_eval(model):
  """``evaluate(params, (x, y)[, batch_stats]) -> {"loss", "correct"}`` per example
  (``models.per_example_stats``; BatchNorm models take the statistics)."""
  if models.has_batch_norm(model):

    def bn_evaluate(params, batch, batch_stats):
      x, y = batch
      logits = model.apply({"params": params, "batch_stats": batch_stats}, x, train=False)
      loss, correct = models.per_example_stats(logits, y)
      return {"loss": loss, "correct": correct}

    return bn_evaluate

  def evaluate(params, batch):
    x, y = batch
    logits = model.apply({"params": params}, x, train=False)
    loss, correct = models.per_example_stats(logits, y)
    return {"loss": loss, "correct": correct}

  return evaluate


def classifier_task(
    model,
    train,
    test,
    *,
    name: str = "classifier",
    input_shape: tuple[int, ...] | None = None,
    validation=None,
    crop_size: int | None = None,
    random_flip: bool = False,
    info: dict[str, Any] | None = None,
    split_from_seed: bool = False,
) -> Task:
  """A Flax classifier on ``(x, y)`` data as a task.

  Args:
    model: a Flax module, ``model.apply({"params": p}, x, train=...)`` ->
      logits ``[b, classes]``; with BatchNorm (``models.has_batch_norm``) the
      package's policy applies (module docstring).
    train, test: ``(x, y)`` arrays (float inputs ``[N, ...]``, int labels
      ``[N]``) or sources whose items are ``(x, y)``.
    name: the task's name.
    input_shape: one example's input shape (default: the first training
      example's, cropped with ``crop_size``).
    validation: optional held-out ``(x, y)``.
    crop_size: random crops of this side for training (fixed by seed, epoch
      and step, ``easgd.tasks.batches.random_crop``), centre crops for
      evaluation; None: whole inputs.
    random_flip: each training image mirrored left-right with probability 1/2
      (``easgd.tasks.batches.random_flip``, drawn after the crop from the same
      generator); evaluation unflipped. Images ``[H, W, C]`` only.
    info: recorded in ``summary.json``.
    split_from_seed: as :class:`~easgd.tasks.task.Task`.

  Returns:
    The task.

  Raises:
    TaskError: as :class:`~easgd.tasks.task.Task`.
    easgd.tasks.data.DataError: crops or flips of inputs that are not images.
  """
  train = as_source(train, f"task {name!r}: train")
  shape = tuple(input_shape) if input_shape is not None else None
  if shape is None:  # one training example's input, cropped
    x0 = train.take(np.zeros(1, np.int64))[0]
    shape = batches.cropped_shape(tuple(np.shape(x0)[1:]), crop_size)

  def init(key):
    return models.init_params(model, shape, key)

  if random_flip and len(shape) != 3:
    raise DataError(
        f"random_flip flips images [H, W, C]; task {name!r} has inputs of shape {shape}; "
        "allowed: random_flip False"
    )
  augment, eval_transform = batches.crop_transforms(crop_size, random_flip)

  center_state = None
  if models.has_batch_norm(model):

    def center_state(params, batch, axis_name):
      return models.compute_batch_stats(model, params, batch[0], axis_name)

  return Task(
      name=name,
      init=init,
      loss=make_loss_fn(model),
      evaluate=make_classifier_eval(model),
      train=train,
      test=test,
      validation=validation,
      augment=augment,
      eval_transform=eval_transform,
      center_state=center_state,
      mean_of_examples=center_state is None,
      split_from_seed=split_from_seed,
      info=dict(info or {}),
  )


def builtin_task(
    dataset: str = "mnist1d",
    model: str = "cnn",
    *,
    data_dir=None,
    crop_size: int | None = None,
    random_flip: bool = False,
    param_dtype: str = "float32",
    compute_dtype: str = "float32",
    seed: int = 0,
) -> Task:
  """A built-in data set (``easgd.tasks.datasets``) and model (``easgd.tasks.models``).

  Args:
    dataset: one of ``easgd.tasks.datasets.DATASETS``.
    model: one of ``easgd.tasks.names.MODELS``.
    data_dir: the data set's directory (``DatasetSpec.data_dir``), if it reads one.
    crop_size: random training crops and centre evaluation crops (images).
    random_flip: random horizontal training flips (images).
    param_dtype, compute_dtype: the model's dtypes.
    seed: MNIST-1D's generator seed and digits' split seed (the others ignore it).

  Returns:
    The task (``info``: dataset, model, num_classes, input_shape).

  Raises:
    easgd.tasks.data.DataError, easgd.tasks.models.ModelError: bad input.
  """
  ds = datasets.load_dataset(dataset, data_dir=data_dir, seed=seed)
  net = models.make_model(
      model, ds.num_classes, param_dtype=param_dtype, compute_dtype=compute_dtype
  )
  task = classifier_task(
      net,
      (ds.train_x, ds.train_y),
      (ds.test_x, ds.test_y),
      name=f"{dataset}/{model}",
      input_shape=batches.cropped_shape(ds.input_shape, crop_size),
      crop_size=crop_size,
      random_flip=random_flip,
      info=dict(
          model=model,
          dataset=dataset,
          num_classes=ds.num_classes,
          input_shape=list(batches.cropped_shape(ds.input_shape, crop_size)),
      ),
      split_from_seed=datasets.TABLE[dataset].seeded_split,
  )
  args = dict(dataset=dataset, model=model, data_dir=None if data_dir is None else str(data_dir))
  args.update(crop_size=crop_size, random_flip=random_flip)
  args.update(param_dtype=param_dtype, compute_dtype=compute_dtype)
  return dataclasses.replace(task, factory=BUILTIN_FACTORY, factory_args=args)


def _builtin_args(config) -> dict[str, Any]:
  """The built-in task's arguments a config names."""
  return dict(
      dataset=config.dataset,
      model=config.model,
      data_dir=None if config.data_dir is None else str(config.data_dir),
      crop_size=config.crop_size,
      random_flip=config.random_flip,
      param_dtype=config.param_dtype,
      compute_dtype=config.compute_dtype,
  )


def _read_by(config, task: Task) -> Task:
  """``task``; ConfigError if ``bn_stats_examples`` is set and the task has no
  ``center_state`` to read it."""
  if task.center_state is None and config.bn_stats_examples != _BN_DEFAULT:
    raise ConfigError(
        f"bn_stats_examples={config.bn_stats_examples} has no effect: task "
        f"{task.name!r} has no center_state (BatchNorm); leave it at {_BN_DEFAULT}"
    )
  return task


def task_of(config, task: Task | None = None, *, seed: int | None = None) -> Task:
  """The task of a run: ``task`` if given, else the one ``config`` names.

  Args:
    config: a validated ``TrainConfig``: ``config.task`` (an import path,
      ``config.task_args`` its arguments) or the built-in ``dataset`` and
      ``model`` (with ``data_dir``, ``crop_size``, ``random_flip``, the dtypes).
    task: a task built in code (then ``config.task`` must be None or its
      import path, and the built-in fields at their defaults).
    seed: the seed the data are drawn with (default ``config.seed``).

  Returns:
    The task.

  Raises:
    TaskError: ``task`` not a Task, or another import path than ``config.task``.
    easgd.settings.config.ConfigError: built-in fields set beside a task.
  """
  seed = config.seed if seed is None else seed
  if task is not None:
    if not isinstance(task, Task):
      raise TaskError(f"task must be an easgd.Task, got {type(task).__name__}")
    if config.task is not None and config.task != task.factory:
      made = "in code" if task.factory is None else f"from {task.factory!r}"
      raise TaskError(
          f"config.task={config.task!r} names a factory, but the task given was built "
          f"{made}; give one of them"
      )
    if task.factory == BUILTIN_FACTORY:  # the config's built-in fields describe it
      if task.factory_args != _builtin_args(config):
        raise TaskError(
            f"the built-in task given ({task.factory_args}) is not the one the config "
            f"names ({_builtin_args(config)}); give one of them"
        )
      return task
    config.refuse_builtin_fields(task.name)
    return _read_by(config, task)
  if config.task is not None:
    return _read_by(config, load_task(config.task, parse_task_args(config.task_args), seed=seed))
  return builtin_task(**_builtin_args(config), seed=seed)
