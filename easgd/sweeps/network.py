"""The network problem of the EASGD sweep: a Flax classifier, its data and curvature.

The sweep engine (``easgd.sweeps.engine``) takes a problem as arguments: a loss,
the batches of every step, a start and an evaluation. This module builds them
for a Flax classifier of ``easgd.training.models`` on a data set of ``easgd.training.data``
(which is why it sits above both the analysis and the training modules), and
the curvature h of the theory columns, the largest Hessian eigenvalue of the
training loss (``easgd.analysis.hessian``):

  :func:`network_fns`        (loss_fn, eval_fn) of a classifier.
  :func:`network_batches`    every step's worker batches, as the trainer draws them.
  :func:`hessian_curvature`  the largest Hessian eigenvalue on some examples.
  :func:`check_network`      loads the data and checks every setting against it,
                             before anything is compiled.
  :func:`sweep_network`      the (learning_rate, tau, alpha) grid of EASGD on it.

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

from easgd.core import algorithms
from easgd.training import batches, data, models
from easgd._util import checks
from easgd.analysis import hessian
from easgd.sweeps import engine as sweep_engine
from easgd.sweeps.engine import SweepError, check_factor, check_int, check_real
from easgd.sweeps.grid import (
    SweepGrid,
    SweepResult,
    check_memory,
    check_num_steps,
    grid_config,
    run_grid,
    sweep_result,
)

HESSIAN_EXAMPLES = 2000
"""Training examples of the Hessian's loss when none are given (fewer if the
data set has fewer)."""


def network_fns(model):
  """(loss_fn, eval_fn) of a Flax classifier for ``easgd.sweeps.engine.make_sweep_fn``.

  ``loss_fn(params, (x, y), key)`` is the mean cross-entropy of a batch (as
  ``easgd.training.builtin_tasks.make_loss_fn``); ``eval_fn(center, (x, y))`` gives the
  center's mean cross-entropy ``center_loss`` and ``test_accuracy`` on (x, y).
  """

  def loss_fn(params, batch, key):
    x, y = batch
    return models.cross_entropy_loss(
        model.apply({"params": params}, x, train=True, rngs={"dropout": key}), y
    )

  def eval_fn(center, eval_data):
    x, y = eval_data
    loss, correct = models.per_example_stats(model.apply({"params": center}, x, train=False), y)
    return dict(center_loss=jnp.mean(loss), test_accuracy=jnp.mean(correct))

  return loss_fn, eval_fn


@functools.lru_cache(maxsize=16)
def _network_program(model, num_workers: int, num_steps: int):
  loss_fn, eval_fn = network_fns(model)
  build = functools.partial(algorithms.easgd, loss_fn, num_workers=num_workers)
  return sweep_engine.make_sweep_fn(build, num_workers, num_steps, eval_fn)


def network_batches(
    dataset, num_workers: int, per_worker_batch_size: int, num_steps: int, seed: int = 0
):
  """The training batches of every step, as the trainer draws them.

  Epoch e (1-based, as ``easgd.training.trainer``) uses
  ``easgd.training.batches.worker_batch_indices(N, p, B, seed, e)``; steps run on across
  epochs until ``num_steps``.

  Returns:
    (x float32 [num_steps, p, B, ...], y int32 [num_steps, p, B]) host arrays.
  """
  spe = batches.steps_per_epoch(len(dataset.train_y), num_workers, per_worker_batch_size)
  idx = np.concatenate(
      [
          batches.worker_batch_indices(
              len(dataset.train_y), num_workers, per_worker_batch_size, seed, epoch
          )
          for epoch in range(1, -(-num_steps // spe) + 1)
      ]
  )[:num_steps]
  return dataset.train_x[idx], dataset.train_y[idx]


@functools.lru_cache(maxsize=16)
def _data_loss(model):
  """``loss(x, y, params)``: mean cross-entropy of (x, y), eval mode; one
  function object per model, so the Hessian's compiled products are reused."""

  def loss(x, y, params):
    return models.cross_entropy_loss(model.apply({"params": params}, x, train=False), y)

  return loss


def hessian_curvature(
    model, params, x, y, key, num_iterations: int = 100, tol: float = 1e-4
) -> dict[str, Any]:
  """Largest Hessian eigenvalue of the mean cross-entropy on (x, y) at params.

  ``easgd.analysis.hessian.curvature_estimate`` (Hessian-vector products by
  ``jax.jvp`` of ``jax.grad``, ARPACK's Lanczos for the largest algebraic
  eigenvalue, the residual measured with one more product) of the loss of
  ``model`` in eval mode; ``easgd.analysis.hessian.certified_curvature`` gives its h
  only when it converged.

  Args:
    model: a Flax classifier (``model.apply({"params": ...}, x, train=False)``).
    params: the point.
    x, y: the examples of the loss (inputs, int labels).
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
  loss = jax.tree_util.Partial(_data_loss(model), x, y)
  return hessian.curvature_estimate(
      loss, params, key, num_iterations, tol, examples=int(x.shape[0])
  )


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


SWEEP_MODELS = tuple(m for m in models.MODELS if m not in models.BATCH_NORM_MODELS)
"""The ``easgd.training.models.MODELS`` the sweep runs (it keeps no BatchNorm statistics)."""
_BATCH_NORM = (
    "model {!r} has BatchNorm, which the sweep does not support (it keeps "
    "no BatchNorm statistics; train it with easgd.training.trainer); allowed: "
    + ", ".join(SWEEP_MODELS)
)


def check_model_name(name) -> str:
  """``name`` if it is one of :data:`SWEEP_MODELS`.

  Raises:
    easgd.training.models.ModelError: an unknown model, or one with BatchNorm.
  """
  checks.choice("model", name, models.MODELS, error=models.ModelError)
  if name in models.BATCH_NORM_MODELS:
    raise models.ModelError(_BATCH_NORM.format(name))
  return name


@dataclasses.dataclass(frozen=True)
class NetworkSetup:
  """What :func:`check_network` loaded and checked.

  Attributes:
    dataset: the loaded ``easgd.training.data.Dataset``.
    model: the Flax module.
    model_name: its name (``"mlp"``, or the module's class name).
    per_worker_batch_size, hessian_iterations, hessian_examples: the checked
      Python ints (hessian_examples resolved: never None).
    memory_bytes: the sweep's memory estimate (``easgd.sweeps.grid.check_memory``).
  """

  dataset: data.Dataset
  model: Any
  model_name: str
  per_worker_batch_size: int
  hessian_iterations: int
  hessian_examples: int
  memory_bytes: int


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
) -> NetworkSetup:
  """Loads the data set and checks the network sweep against it; compiles nothing.

  Everything :func:`sweep_network` could refuse is refused here, before any
  Hessian estimate or compilation: the data set must load, the model must be
  known, without BatchNorm and able to take the data set's inputs (its
  parameters are built abstractly, ``jax.eval_shape``), one step's global
  batch (largest num_workers x per_worker_batch_size) and the Hessian's
  examples must fit in the training set, and the memory estimate must stay
  within ``easgd.sweeps.grid.MAX_SWEEP_BYTES`` (every step's batches are held
  at once: float32 inputs and int32 labels).

  Args:
    grid: a validated grid.
    num_steps, dataset, model, per_worker_batch_size, seed, data_dir,
      hessian_iterations, hessian_examples: as :func:`sweep_network`.

  Returns:
    A :class:`NetworkSetup`.

  Raises:
    SweepError: num_steps, a tau above it, per_worker_batch_size or
      hessian_examples out of range (the message names the data set's size),
      or the memory estimate above the limit. easgd.training.data.DataError: unknown
      data set, or its files are missing or damaged. easgd.training.models.ModelError:
      unknown model, a BatchNorm model, or one that cannot take the data
      set's inputs.
  """
  num_steps = check_num_steps(grid, num_steps)
  batch_size = check_int("per_worker_batch_size", per_worker_batch_size, 1)
  hessian_iterations = check_int("hessian_iterations", hessian_iterations, 0)
  if hessian_examples is not None:
    check_int("hessian_examples", hessian_examples, 1)
  if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
    raise SweepError(f"data_dir must be a path string or None, got {data_dir!r}")
  if isinstance(model, str):
    check_model_name(model)
  ds = data.load_dataset(dataset, data_dir=data_dir, seed=seed)
  model_name = model if isinstance(model, str) else type(model).__name__
  if isinstance(model, str):
    model = models.make_model(model, ds.num_classes)
  if models.has_batch_norm(model):
    raise models.ModelError(_BATCH_NORM.format(model_name))
  try:
    shapes = jax.eval_shape(
        lambda k: models.init_params(model, ds.input_shape, k), jax.random.key(0)
    )
  except models.ModelError:
    raise
  except Exception as e:  # a Flax shape error: one line, the model and the data named
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    raise models.ModelError(
        f"model {model_name!r} cannot take the inputs of dataset {dataset!r} (shape "
        f"{ds.input_shape}): {type(e).__name__}: {first}"
    ) from None
  n, p = ds.num_train, max(grid.num_workers)
  check_int(
      "per_worker_batch_size",
      batch_size,
      1,
      n // p,
      what=f"examples per worker per step; one step of {p} workers must fit "
      f"in the {n} training examples of dataset {dataset!r}",
  )
  if hessian_examples is None:
    hessian_examples = min(HESSIAN_EXAMPLES, n)
  else:
    check_int(
        "hessian_examples",
        hessian_examples,
        1,
        n,
        what=f"training examples in the Hessian's loss; dataset {dataset!r} " f"has {n}",
    )
  example_bytes = 4 * int(np.prod(ds.input_shape)) + 4
  param_bytes = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(shapes))
  need = check_memory(
      "network",
      grid,
      num_steps,
      batch_size * example_bytes,
      param_bytes,
      f"a batch of {batch_size} examples",
  )
  return NetworkSetup(ds, model, model_name, batch_size, hessian_iterations, hessian_examples, need)


def _curvature_fn(setup: NetworkSetup, key: jax.Array, tol: float):
  """``curvature(params) -> record``: :func:`hessian_curvature` on the setup's
  first ``hessian_examples`` training examples, with its budget, ``key`` and ``tol``."""
  n = setup.hessian_examples
  hx, hy = jnp.asarray(setup.dataset.train_x[:n]), jnp.asarray(setup.dataset.train_y[:n])
  return lambda params: hessian_curvature(
      setup.model, params, hx, hy, key, setup.hessian_iterations, tol
  )


def _inputs_fn(setup: NetworkSetup, params0, num_steps: int, seed: int, step_key: jax.Array):
  """``inputs(p)`` of ``easgd.sweeps.grid.run_grid``: p workers and the center at
  ``params0``, every step's batches (:func:`network_batches`), the test set, the key."""
  ds, batch_size = setup.dataset, setup.per_worker_batch_size
  test = (jnp.asarray(ds.test_x), jnp.asarray(ds.test_y))

  def inputs(p):
    x, y = network_batches(ds, p, batch_size, num_steps, seed)
    worker0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (p, *a.shape)), params0)
    return worker0, params0, (jnp.asarray(x), jnp.asarray(y)), test, step_key

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
) -> SweepResult:
  """Sweeps synchronous EASGD on a Flax classifier, one program per p.

  Every configuration runs ``easgd.core.algorithms.easgd``'s step from the same
  initial parameters (workers and center equal, as in the paper), with
  plain-SGD local steps u = -eta g on the same sequence of disjoint worker
  batches (:func:`network_batches`), in one program of
  ``easgd.sweeps.engine.make_sweep_fn``, and is evaluated on the whole test
  set at the end (``center_loss`` = test cross-entropy of the center,
  ``test_accuracy``); the same evaluation of the initial parameters is
  ``initial_center_loss``, the reference of the center's divergence test.

  The curvature for the theory columns is the largest eigenvalue h of the
  Hessian of the mean training loss on the first ``hessian_examples``
  training examples (:func:`hessian_curvature`), at the initial parameters
  (``curvature``, ``theory_radius``) and, if ``hessian_at_trained`` and some
  configuration did not diverge, at the final center of the non-diverged
  configuration with the lowest ``center_loss`` (``eta_h_trained``,
  ``theory_radius_trained``). An estimate that did not converge (residual
  above ``hessian_tol`` x |h|) is recorded in ``info`` but not used: its
  theory columns stay empty and an ``easgd.analysis.hessian.CurvatureWarning`` is
  issued.

  Args:
    grid: the configurations (validated here).
    num_steps: local steps per worker, an integer in [1, 2**31 - 1], at least
      every tau of the grid.
    dataset: an ``easgd.training.data.DATASETS`` name.
    model: one of :data:`SWEEP_MODELS` (``easgd.training.models.make_model``) or a Flax
      module without BatchNorm.
    per_worker_batch_size: examples per worker per step; num_workers x it
      must fit in the training set.
    seed: data-order and initialisation seed, in [0, 2**32 - 1] (as the
      trainer: init key and step key are ``split(key(seed))``).
    divergence_factor: see ``easgd.sweeps.quadratic.sweep_quadratic``.
    data_dir: Fashion-MNIST or CIFAR-10 directory (``easgd.training.data.load_dataset``).
    hessian_iterations, hessian_tol, hessian_examples: budget of
      Hessian-vector products (an integer >= 0; 0 skips the estimate),
      relative residual tolerance (a finite real > 0) and number of training
      examples of the Hessian's loss (at most the training set's size; None:
      :data:`HESSIAN_EXAMPLES`, or the whole training set if smaller).
    hessian_at_trained: also estimate h at the best final center (a bool).

  Returns:
    A :class:`~easgd.sweeps.grid.SweepResult` with ``problem="network"``.

  Raises:
    SweepError: invalid grid or settings, sizes that do not fit the data set,
      a sweep above the memory limit. easgd.training.data.DataError,
      easgd.training.models.ModelError: unknown or unloadable data set, unknown or
      incompatible model. All from :func:`check_network` or the checks
      before it, before any Hessian estimate or compilation.

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
  )
  num_steps = int(num_steps)
  ds, model, iterations = setup.dataset, setup.model, setup.hessian_iterations
  init_key, step_key = jax.random.split(jax.random.key(seed))
  params0 = models.init_params(model, ds.input_shape, init_key)
  curvature = _curvature_fn(setup, jax.random.fold_in(init_key, 1), hessian_tol)
  info = dict(
      programs={},
      num_steps=num_steps,
      dataset=dataset,
      model=setup.model_name,
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
      lambda p: _network_program(model, p, num_steps),
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
  return sweep_result("network", grid, outputs, h, h2, info, centers)
