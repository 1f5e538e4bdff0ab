"""The network problem of the EASGD sweep: a task's loss, batches, evaluation and curvature.

Builds what the sweep engine (``easgd.sweeps.engine``) takes from an
``easgd.tasks.task.Task``: a user's, or the built-in Flax classifier on a data set
(``easgd.settings.builtin_tasks``); the curvature h of the theory columns is the largest
Hessian eigenvalue of the mean evaluation loss (``easgd.analysis.hessian``).
:func:`check_network` checks every setting before anything compiles; :func:`sweep_network`
runs the (learning_rate, tau, alpha) grid. See docs/guides/stability.md.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6); Section 4 for the theory.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from easgd._util import checks
from easgd.analysis import hessian
from easgd.core import algorithms
from easgd.run.compare import task_classes
from easgd.settings import builtin_tasks
from easgd.sweeps.engine import SweepError, check_factor, check_int, check_real, make_sweep_fn
from easgd.sweeps.grid import (
    SweepGrid,
    SweepResult,
    check_memory,
    check_num_steps,
    grid_config,
    run_grid,
    sweep_result,
)
from easgd.tasks import batches, datasets, models
from easgd.tasks.names import BATCH_NORM_MODELS, MODELS
from easgd.tasks.sources import TaskError, take
from easgd.tasks.task import Task, check_task, load_task, parse_task_args, user_call

HESSIAN_EXAMPLES = 2000
"""Training examples of the Hessian's loss when none are given (fewer if the
data set has fewer)."""


def _sweep_fns(loss_fn, evaluate):
  """(loss_fn, eval_fn): ``eval_fn(center, batch)`` the means of ``evaluate``'s
  per-example ``"loss"`` (``center_loss``), ``"correct"`` (``test_accuracy``)
  and every other metric ``m`` it gives (``test_m``)."""

  def eval_fn(center, eval_data):
    metrics = evaluate(center, eval_data)
    out = dict(center_loss=jnp.mean(metrics["loss"]))
    if "correct" in metrics:
      out["test_accuracy"] = jnp.mean(metrics["correct"])
    for m in sorted(metrics):
      if m not in ("loss", "correct"):
        out[f"test_{m}"] = jnp.mean(metrics[m])
    return out

  return loss_fn, eval_fn


def task_fns(task: Task):
  """(loss_fn, eval_fn) of a task for ``easgd.sweeps.engine.make_sweep_fn``.

  ``loss_fn`` is ``task.loss(params, batch, key)``; ``eval_fn(center, batch)``
  gives the center's mean evaluation loss ``center_loss`` (the mean of
  ``task.evaluate``'s per-example ``"loss"``), if the task evaluates a
  ``"correct"``, its mean ``test_accuracy``, and the mean ``test_m`` of every
  other metric ``m`` it evaluates.
  """
  return _sweep_fns(task.loss, task.evaluate)


@functools.lru_cache(maxsize=16)
def _classifier_fns(model):
  """(loss, evaluate) of a Flax classifier (``easgd.settings.builtin_tasks``); one
  pair of function objects per model, so its compiled programs are reused."""
  return builtin_tasks.make_loss_fn(model), builtin_tasks.make_classifier_eval(model)


def network_fns(model):
  """(loss_fn, eval_fn) of a Flax classifier for ``easgd.sweeps.engine.make_sweep_fn``.

  :func:`task_fns` of its built-in task: ``loss_fn(params, (x, y), key)`` is
  the mean cross-entropy of a batch (``easgd.settings.builtin_tasks.make_loss_fn``);
  ``eval_fn(center, (x, y))`` gives the center's mean cross-entropy
  ``center_loss`` and ``test_accuracy`` on (x, y).
  """
  return _sweep_fns(*_classifier_fns(model))


@functools.lru_cache(maxsize=16)
def _network_program(loss_fn, evaluate, num_workers: int, num_steps: int):
  loss_fn, eval_fn = _sweep_fns(loss_fn, evaluate)
  build = functools.partial(algorithms.easgd, loss_fn, num_workers=num_workers)
  return make_sweep_fn(build, num_workers, num_steps, eval_fn)


def _step_indices(n: int, num_workers: int, per_worker_batch_size: int, num_steps: int, seed: int):
  """int [num_steps, p, B]: the training examples of every step, as the trainer
  draws them (epoch e of steps ``batches.worker_batch_indices(n, p, B, seed, e)``)."""
  spe = batches.steps_per_epoch(n, num_workers, per_worker_batch_size)
  return np.concatenate(
      [
          batches.worker_batch_indices(n, num_workers, per_worker_batch_size, seed, epoch)
          for epoch in range(1, -(-num_steps // spe) + 1)
      ]
  )[:num_steps]


def network_batches(
    dataset, num_workers: int, per_worker_batch_size: int, num_steps: int, seed: int = 0
):
  """The training batches of every step, as the trainer draws them.

  Epoch e (1-based, as ``easgd.run.trainer``) uses
  ``easgd.tasks.batches.worker_batch_indices(N, p, B, seed, e)``; steps run on across
  epochs until ``num_steps``.

  Returns:
    (x float32 [num_steps, p, B, ...], y int32 [num_steps, p, B]) host arrays.
  """
  idx = _step_indices(len(dataset.train_y), num_workers, per_worker_batch_size, num_steps, seed)
  return dataset.train_x[idx], dataset.train_y[idx]


def task_batches(
    task: Task, num_workers: int, per_worker_batch_size: int, num_steps: int, seed: int = 0
):
  """The training batches of every step of a task, as the trainer draws them.

  Step t of epoch e = t // steps_per_epoch + 1 reads the rows
  ``easgd.tasks.batches.worker_batch_indices(N, p, B, seed, e)`` of the
  task's training data (``take``), and with ``task.augment`` the augmented
  global batch (its generator ``batches.crop_rng(seed, e, t)``, as
  ``easgd.runtimes.training_run.global_batch``); steps run on across epochs until
  ``num_steps``.

  Returns:
    The batches: a pytree of host arrays, leaves ``[num_steps, p, B, ...]``.
  """
  n = len(task.train)
  idx = _step_indices(n, num_workers, per_worker_batch_size, num_steps, seed)
  if task.augment is None:
    return take(task.train, idx)
  spe = batches.steps_per_epoch(n, num_workers, per_worker_batch_size)
  steps = []
  for t, ix in enumerate(idx):
    rng = batches.crop_rng(seed, t // spe + 1, t)
    steps.append(user_call(task, "augment", task.augment, take(task.train, ix), rng))
  return jax.tree.map(lambda *a: np.stack(a), *steps)


@functools.lru_cache(maxsize=16)
def _mean_eval_loss(evaluate):
  """``loss(batch, params)``: the mean of ``evaluate``'s per-example ``"loss"``; one
  function object per ``evaluate``, so the Hessian's compiled products are reused."""

  def loss(batch, params):
    return jnp.mean(evaluate(params, batch)["loss"])

  return loss


def task_curvature(
    evaluate, params, batch, key, num_iterations: int = 100, tol: float = 1e-4
) -> dict[str, Any]:
  """Largest Hessian eigenvalue of a task's mean evaluation loss on ``batch`` at params.

  ``easgd.analysis.hessian.curvature_estimate`` (Hessian-vector products by
  ``jax.jvp`` of ``jax.grad``, ARPACK's Lanczos for the largest algebraic
  eigenvalue, the residual measured with one more product) of
  ``mean(evaluate(params, batch)["loss"])`` (a task's ``evaluate``: eval
  mode, no dropout); ``easgd.analysis.hessian.certified_curvature`` gives its
  h only when it converged.

  Args:
    evaluate: ``evaluate(params, batch) -> {"loss": [b], ...}`` (``Task.evaluate``).
    params: the point.
    batch: the examples of the loss (a pytree, leaves ``[b, ...]``).
    key: PRNG key of the Lanczos start vector.
    num_iterations: budget of Hessian-vector products, an integer >= 1.
    tol: relative residual tolerance, a finite real > 0.

  Returns:
    dict(h (None if no estimate), converged, residual (None if no estimate),
    tol, products (Hessian-vector products used), method, examples, seconds).

  Raises:
    ValueError: as :func:`easgd.analysis.hessian.top_hessian_eigenvalue`.

  References:
    Pearlmutter (1994); Lehoucq, Sorensen, Yang, ARPACK Users' Guide (1998).
  """
  loss = jax.tree_util.Partial(_mean_eval_loss(evaluate), batch)
  examples = int(jax.tree.leaves(batch)[0].shape[0])
  return hessian.curvature_estimate(loss, params, key, num_iterations, tol, examples=examples)


def hessian_curvature(
    model, params, x, y, key, num_iterations: int = 100, tol: float = 1e-4
) -> dict[str, Any]:
  """Largest Hessian eigenvalue of the mean cross-entropy on (x, y) at params.

  :func:`task_curvature` of the model's built-in evaluation (per-example cross-entropy
  in eval mode, ``easgd.settings.builtin_tasks.make_classifier_eval``): ``model`` a Flax
  classifier, ``x, y`` the inputs and int labels of the loss; the other arguments, the
  record returned and the errors raised as :func:`task_curvature`.
  """
  return task_curvature(_classifier_fns(model)[1], params, (x, y), key, num_iterations, tol)


def _best_center(outputs: dict[int, dict]) -> tuple[int, int] | None:
  """(num_workers, index) of the non-diverged configuration with the lowest
  finite ``center_loss``, or None."""
  best = None
  for p, out in outputs.items():
    loss = np.where(
        np.asarray(out["diverged"]),
        np.inf,
        np.nan_to_num(np.asarray(out["center_loss"]), nan=np.inf),
    )
    i = int(np.argmin(loss))
    if np.isfinite(loss[i]) and (best is None or loss[i] < best[0]):
      best = (float(loss[i]), p, i)
  return None if best is None else best[1:]


SWEEP_MODELS = tuple(m for m in MODELS if m not in BATCH_NORM_MODELS)
"""The ``easgd.tasks.names.MODELS`` the sweep runs (it keeps no BatchNorm statistics)."""
_BATCH_NORM = (
    "model {!r} has BatchNorm, which the sweep does not support (it keeps "
    "no BatchNorm statistics; train it with easgd.run.trainer); allowed: " + ", ".join(SWEEP_MODELS)
)


def check_model_name(name) -> str:
  """``name`` if it is one of :data:`SWEEP_MODELS`.

  Raises:
    easgd.tasks.models.ModelError: an unknown model, or one with BatchNorm.
  """
  checks.choice("model", name, MODELS, error=models.ModelError)
  if name in BATCH_NORM_MODELS:
    raise models.ModelError(_BATCH_NORM.format(name))
  return name


@dataclasses.dataclass(frozen=True)
class NetworkSetup:
  """What :func:`check_network` built and checked.

  Attributes:
    task: the task swept (a user's, or the built-in classifier's on its data
      set, ``easgd.settings.builtin_tasks.classifier_task``).
    model: the built-in problem's Flax module; None for a user's task.
    model_name: its name (``"mlp"``, or the module's class name); None for a
      user's task.
    dataset_name: the built-in problem's data set; None for a user's task.
    per_worker_batch_size, hessian_iterations, hessian_examples: the checked
      Python ints (hessian_examples resolved: never None).
    memory_bytes: the sweep's memory estimate (``easgd.sweeps.grid.check_memory``).
  """

  task: Task
  model: Any
  model_name: str | None
  dataset_name: str | None
  per_worker_batch_size: int
  hessian_iterations: int
  hessian_examples: int
  memory_bytes: int

  @property
  def user_task(self) -> bool:
    """Whether the task is a user's (not the built-in data set and model)."""
    return self.model is None


_BUILTIN_DEFAULTS = dict(dataset="mnist1d", model="mlp", data_dir=None)
"""The built-in problem's arguments of :func:`check_network`, at their defaults."""


def refuse_builtin_args(task_name: str, **given) -> None:
  """Refuses a built-in problem's argument (dataset, model, data_dir) away from
  its default beside a task, which brings its own data and model.

  Raises:
    SweepError: naming the argument, its value and the task.
  """
  for name, value in given.items():
    if not (isinstance(value, str) or value is None) or value != _BUILTIN_DEFAULTS[name]:
      raise SweepError(
          f"{name}={value!r} is read by the built-in problem only; task {task_name!r} "
          f"brings its own data and model; leave {name} at its default "
          f"{_BUILTIN_DEFAULTS[name]!r}"
      )


def resolve_task(task, task_args=(), *, seed: int = 0) -> Task | None:
  """The task to sweep: a Task, or the one an import path names (``--task``).

  Args:
    task: None (the built-in problem), a ``Task``, or ``"package.module:factory"``
      (``easgd.tasks.task.load_task``, the working directory searched first).
    task_args: the factory's ``"key=value"`` arguments (``--task-arg``); only
      with an import path.
    seed: the sweep's seed, passed to a factory that takes ``seed``.

  Returns:
    The task, or None.

  Raises:
    easgd.tasks.task.TaskError: a task that does not import or build,
      malformed arguments, arguments without an import path, or a value that
      is neither.
  """
  if isinstance(task, str):
    return load_task(task, parse_task_args(task_args), seed=seed)
  if task_args:
    raise TaskError(
        f"task_args={tuple(task_args)!r} need a task import path 'package.module:function'"
    )
  if task is not None and not isinstance(task, Task):
    raise TaskError(
        f"task must be an easgd Task, 'package.module:function' or None, got {type(task).__name__}"
    )
  return task


def _builtin_setup(dataset, model, seed, data_dir):
  """(task, model, model_name) of the built-in problem; checks the model first."""
  if isinstance(model, str):
    check_model_name(model)
  ds = datasets.load_dataset(dataset, data_dir=data_dir, seed=seed)
  model_name = model if isinstance(model, str) else type(model).__name__
  if isinstance(model, str):
    model = models.make_model(model, ds.num_classes)
  if models.has_batch_norm(model):
    raise models.ModelError(_BATCH_NORM.format(model_name))
  try:
    jax.eval_shape(lambda k: models.init_params(model, ds.input_shape, k), jax.random.key(0))
  except models.ModelError:
    raise
  except Exception as e:  # a Flax shape error: one line, the model and the data named
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    raise models.ModelError(
        f"model {model_name!r} cannot take the inputs of dataset {dataset!r} (shape "
        f"{ds.input_shape}): {type(e).__name__}: {first}"
    ) from None
  loss, evaluate = _classifier_fns(model)  # one program per model (lru_cache)
  task = builtin_tasks.classifier_task(
      model,
      (ds.train_x, ds.train_y),
      (ds.test_x, ds.test_y),
      name=f"{dataset}/{model_name}",
      input_shape=ds.input_shape,
      info=dict(num_classes=ds.num_classes),  # chance, for collapse
  )
  return dataclasses.replace(task, loss=loss, evaluate=evaluate), model, model_name


def _nbytes(tree) -> int:
  return sum(int(np.prod(np.shape(a))) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def check_network(
    grid: SweepGrid,
    num_steps: int,
    *,
    dataset: str = "mnist1d",
    model="mlp",
    per_worker_batch_size: int = 32,
    seed: int = 0,
    data_dir=None,
    hessian_iterations: int = 100,
    hessian_examples: int | None = None,
    task=None,
    task_args=(),
) -> NetworkSetup:
  """Builds the task and checks the network sweep against it; compiles nothing.

  Everything :func:`sweep_network` could refuse is refused here, before any Hessian
  estimate or compilation (the checks: docs/guides/stability.md; the model and the task
  are evaluated abstractly, ``jax.eval_shape`` and ``easgd.tasks.task.check_task``).

  Args:
    grid: a validated grid.
    num_steps, dataset, model, per_worker_batch_size, seed, data_dir,
      hessian_iterations, hessian_examples, task, task_args: as
      :func:`sweep_network`.

  Returns:
    A :class:`NetworkSetup`.

  Raises:
    SweepError: num_steps, a tau above it, per_worker_batch_size or
      hessian_examples out of range (the message names the data's size),
      the memory estimate above the limit, or dataset, model or data_dir set
      beside a task. easgd.tasks.data.DataError: unknown data set, or its
      files are missing or damaged. easgd.tasks.models.ModelError:
      unknown model, a BatchNorm model, or one that cannot take the data
      set's inputs. easgd.tasks.task.TaskError: a task that does not
      build, has a center_state, or does not fit the sweep.
  """
  num_steps = check_num_steps(grid, num_steps)
  batch_size = check_int("per_worker_batch_size", per_worker_batch_size, 1)
  hessian_iterations = check_int("hessian_iterations", hessian_iterations, 0)
  if hessian_examples is not None:
    check_int("hessian_examples", hessian_examples, 1)
  if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
    raise SweepError(f"data_dir must be a path string or None, got {data_dir!r}")
  task = resolve_task(task, task_args, seed=seed)
  if task is None:
    task, model, model_name = _builtin_setup(dataset, model, seed, data_dir)
    dataset_name, data_name = dataset, f"dataset {dataset!r}"
  else:
    refuse_builtin_args(task.name, dataset=dataset, model=model, data_dir=data_dir)
    if task.center_state is not None:
      raise TaskError(
          f"task {task.name!r} has a center_state (BatchNorm), which the sweep does not "
          "support (it keeps no BatchNorm statistics); train it with easgd train"
      )
    model = model_name = dataset_name = None
    data_name = f"task {task.name!r}"
  n, p = len(task.train), max(grid.num_workers)
  check_int(
      "per_worker_batch_size",
      batch_size,
      1,
      n // p,
      what=f"examples per worker per step; one step of {p} workers must fit "
      f"in the {n} training examples of {data_name}",
  )
  if hessian_examples is None:
    hessian_examples = min(HESSIAN_EXAMPLES, n)
  else:
    check_int(
        "hessian_examples",
        hessian_examples,
        1,
        n,
        what=f"training examples in the Hessian's loss; {data_name} has {n}",
    )
  check_task(task, num_workers=p, per_worker_batch=batch_size, eval_batch=len(task.test))
  shapes = jax.eval_shape(task.init, jax.random.key(0))
  step = take(task.train, np.arange(p * batch_size).reshape(p, batch_size))
  if task.augment is not None:  # the bytes of what is held: the augmented batch
    step = user_call(task, "augment", task.augment, step, np.random.default_rng(0))
  need = check_memory(
      "network",
      grid,
      num_steps,
      _nbytes(step) // p,
      _nbytes(shapes),
      f"a batch of {batch_size} examples",
  )
  return NetworkSetup(
      task,
      model,
      model_name,
      dataset_name,
      batch_size,
      hessian_iterations,
      hessian_examples,
      need,
  )


def _evaluated(task: Task, source, n: int):
  """The first ``n`` examples of ``source`` as device arrays, with ``task.eval_transform``."""
  batch = take(source, np.arange(n))
  if task.eval_transform is not None:
    batch = user_call(task, "eval_transform", task.eval_transform, batch)
  return jax.tree.map(jnp.asarray, batch)


def _curvature_fn(setup: NetworkSetup, key: jax.Array, tol: float):
  """``curvature(params) -> record``: :func:`task_curvature` on the setup's
  first ``hessian_examples`` training examples, with its budget, ``key`` and ``tol``."""
  task = setup.task
  examples = _evaluated(task, task.train, setup.hessian_examples)
  return lambda params: task_curvature(
      task.evaluate, params, examples, key, setup.hessian_iterations, tol
  )


def _inputs_fn(setup: NetworkSetup, params0, num_steps: int, seed: int, step_key: jax.Array):
  """``inputs(p)`` of ``easgd.sweeps.grid.run_grid``: p workers and the center at
  ``params0``, every step's batches (:func:`task_batches`), the test set, the key."""
  task, batch_size = setup.task, setup.per_worker_batch_size
  test = _evaluated(task, task.test, len(task.test))

  def inputs(p):
    steps = task_batches(task, p, batch_size, num_steps, seed)
    worker0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (p, *a.shape)), params0)
    return worker0, params0, jax.tree.map(jnp.asarray, steps), test, step_key

  return inputs


def sweep_network(
    grid: SweepGrid,
    num_steps: int,
    *,
    dataset: str = "mnist1d",
    model="mlp",
    per_worker_batch_size: int = 32,
    seed: int = 0,
    divergence_factor: float = 1e3,
    data_dir=None,
    hessian_iterations: int = 100,
    hessian_tol: float = 1e-4,
    hessian_examples: int | None = None,
    hessian_at_trained: bool = True,
    task=None,
    task_args=(),
) -> SweepResult:
  """Sweeps synchronous EASGD on a task (by default a Flax classifier), one program per p.

  Every configuration runs ``easgd.core.algorithms.easgd``'s step with plain-SGD local
  steps from the same initial parameters on the same batches (:func:`task_batches`) and
  is evaluated on the whole test set at the end (``center_loss``, ``test_accuracy``,
  ``test_m``; ``initial_center_loss`` the reference of the center's divergence test). h
  is :func:`task_curvature` at the start and, with ``hessian_at_trained``, at the best
  final center; an estimate that did not converge is recorded in ``info`` but not used
  (a ``CurvatureWarning``). See docs/guides/stability.md.

  Args:
    grid: the configurations (validated here).
    num_steps: local steps per worker, an integer in [1, 2**31 - 1], at least
      every tau of the grid.
    dataset: an ``easgd.tasks.datasets.DATASETS`` name (the built-in problem).
    model: one of :data:`SWEEP_MODELS` (``easgd.tasks.models.make_model``) or a Flax
      module without BatchNorm (the built-in problem).
    per_worker_batch_size: examples per worker per step; num_workers x it
      must fit in the training set.
    seed: data-order and initialisation seed, in [0, 2**32 - 1] (as the
      trainer: init key and step key are ``split(key(seed))``).
    divergence_factor: see ``easgd.sweeps.quadratic.sweep_quadratic``.
    data_dir: Fashion-MNIST or CIFAR-10 directory (``easgd.tasks.datasets.load_dataset``).
    hessian_iterations, hessian_tol, hessian_examples: budget of
      Hessian-vector products (an integer >= 0; 0 skips the estimate),
      relative residual tolerance (a finite real > 0) and number of training
      examples of the Hessian's loss (at most the training set's size; None:
      :data:`HESSIAN_EXAMPLES`, or the whole training set if smaller).
    hessian_at_trained: also estimate h at the best final center (a bool).
    task: the problem instead of ``dataset`` and ``model`` (which then keep
      their defaults): an ``easgd.tasks.task.Task`` without
      ``center_state``, or its import path ``"package.module:factory"``
      (:func:`resolve_task`); recorded in ``info["task"]``
      (``Task.describe``). Its ``augment`` is applied to every step's global
      batch, its ``eval_transform`` to the test and Hessian examples.
    task_args: the import path's ``"key=value"`` arguments.

  Returns:
    A :class:`~easgd.sweeps.grid.SweepResult` with ``problem="network"``.

  Raises:
    SweepError: invalid grid or settings, sizes that do not fit the data set,
      a sweep above the memory limit. easgd.tasks.data.DataError,
      easgd.tasks.models.ModelError: unknown or unloadable data set, unknown or
      incompatible model. easgd.tasks.task.TaskError: a task that does not
      build or fit. All from :func:`check_network` or the checks before it,
      before any Hessian estimate or compilation.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6); Section 4 for the theory.
  """
  grid = grid.validate()
  factor = check_factor(divergence_factor)
  check_real("hessian_tol", hessian_tol, 0.0, True)
  checks.flag("hessian_at_trained", hessian_at_trained, error=SweepError)
  seed = check_int("seed", seed, 0, 2**32 - 1)
  setup = check_network(
      grid,
      num_steps,
      dataset=dataset,
      model=model,
      per_worker_batch_size=per_worker_batch_size,
      seed=seed,
      data_dir=data_dir,
      hessian_iterations=hessian_iterations,
      hessian_examples=hessian_examples,
      task=task,
      task_args=task_args,
  )
  num_steps = int(num_steps)
  task, iterations = setup.task, setup.hessian_iterations
  init_key, step_key = jax.random.split(jax.random.key(seed))
  params0 = task.init(init_key)
  curvature = _curvature_fn(setup, jax.random.fold_in(init_key, 1), hessian_tol)
  info = dict(programs={}, num_steps=num_steps)
  if setup.user_task:
    info.update(task=task.describe())
  else:
    info.update(dataset=setup.dataset_name, model=setup.model_name)
  info.update(
      num_params=models.count_params(params0),
      per_worker_batch_size=setup.per_worker_batch_size,
      seed=seed,
      divergence_factor=factor,
  )
  h = None
  if iterations:
    info["hessian_init"] = curvature(params0)
    hessian.warn_unconverged(info["hessian_init"], "the initial parameters")
    h = hessian.certified_curvature(info["hessian_init"])

  outputs, info["programs"] = run_grid(
      grid,
      lambda p: _network_program(task.loss, task.evaluate, p, num_steps),
      _inputs_fn(setup, params0, num_steps, seed, step_key),
      factor,
  )
  centers = {p: jax.tree.map(np.asarray, out["center"]) for p, out in outputs.items()}
  h2 = None
  best = _best_center(outputs) if iterations and hessian_at_trained else None
  if best is not None:
    p, i = best
    point = jax.tree.map(lambda a: jnp.asarray(a[i]), centers[p])
    info["hessian_trained"] = dict(
        curvature(point), at=dict(num_workers=p, **grid_config(grid, i), step=num_steps)
    )
    hessian.warn_unconverged(info["hessian_trained"], "the best final center")
    h2 = hessian.certified_curvature(info["hessian_trained"])
  return sweep_result(
      "network", grid, outputs, h, h2, info, centers, num_classes=task_classes(task.info)
  )
