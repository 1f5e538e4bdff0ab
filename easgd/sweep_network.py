"""The network problem of the EASGD sweep: a Flax classifier, its data and curvature.

The sweep engine (``easgd.sweep_engine``) takes a problem as arguments: a loss,
the batches of every step, a start and an evaluation. This module builds them
for a Flax classifier of ``easgd.models`` on a data set of ``easgd.data``
(which is why it sits above both the analysis and the training modules), and
the curvature h of the theory columns, the largest Hessian eigenvalue of the
training loss (``easgd.hessian``):

  :func:`network_fns`        (loss_fn, eval_fn) of a classifier.
  :func:`network_batches`    every step's worker batches, as the trainer draws them.
  :func:`hessian_curvature`  the largest Hessian eigenvalue on some examples.
  :func:`sweep_network`      the (learning_rate, tau, alpha) grid of EASGD on it.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6); Section 4 for the theory.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from easgd import algorithms, batches, data, hessian, models, sweep_engine
from easgd.sweep_engine import check_factor, check_int, check_real
from easgd.sweep_grid import SweepGrid, SweepResult, grid_config, records, run_grid


def network_fns(model):
  """(loss_fn, eval_fn) of a Flax classifier for ``easgd.sweep_engine.make_sweep_fn``.

  ``loss_fn(params, (x, y), key)`` is the mean cross-entropy of a batch (as
  ``easgd.trainer.make_loss_fn``); ``eval_fn(center, (x, y))`` gives the
  center's mean cross-entropy ``center_loss`` and ``test_accuracy`` on (x, y).
  """
  def loss_fn(params, batch, key):
    x, y = batch
    return models.cross_entropy_loss(model.apply({"params": params}, x, train=True,
                                                 rngs={"dropout": key}), y)

  def eval_fn(center, eval_data):
    x, y = eval_data
    loss, correct = models.per_example_stats(model.apply({"params": center}, x,
                                                         train=False), y)
    return dict(center_loss=jnp.mean(loss), test_accuracy=jnp.mean(correct))
  return loss_fn, eval_fn


@functools.lru_cache(maxsize=16)
def _network_program(model, num_workers: int, num_steps: int):
  loss_fn, eval_fn = network_fns(model)
  build = functools.partial(algorithms.easgd, loss_fn, num_workers=num_workers)
  return sweep_engine.make_sweep_fn(build, num_workers, num_steps, eval_fn)


def network_batches(dataset, num_workers: int, per_worker_batch_size: int,
                    num_steps: int, seed: int = 0):
  """The training batches of every step, as the trainer draws them.

  Epoch e (1-based, as ``easgd.trainer``) uses
  ``easgd.batches.worker_batch_indices(N, p, B, seed, e)``; steps run on across
  epochs until ``num_steps``.

  Returns:
    (x float32 [num_steps, p, B, ...], y int32 [num_steps, p, B]) host arrays.
  """
  spe = batches.steps_per_epoch(len(dataset.train_y), num_workers, per_worker_batch_size)
  idx = np.concatenate([
      batches.worker_batch_indices(len(dataset.train_y), num_workers,
                                per_worker_batch_size, seed, epoch)
      for epoch in range(1, -(-num_steps // spe) + 1)])[:num_steps]
  return dataset.train_x[idx], dataset.train_y[idx]


@functools.lru_cache(maxsize=16)
def _data_loss(model):
  """``loss(x, y, params)``: mean cross-entropy of (x, y), eval mode; one
  function object per model, so the Hessian's compiled products are reused."""
  def loss(x, y, params):
    return models.cross_entropy_loss(model.apply({"params": params}, x, train=False),
                                     y)
  return loss


def hessian_curvature(model, params, x, y, key, num_iterations: int = 100,
                      tol: float = 1e-4) -> dict[str, Any]:
  """Largest Hessian eigenvalue of the mean cross-entropy on (x, y) at params.

  ``easgd.hessian.curvature_estimate`` (Hessian-vector products by
  ``jax.jvp`` of ``jax.grad``, ARPACK's Lanczos for the largest algebraic
  eigenvalue, the residual measured with one more product) of the loss of
  ``model`` in eval mode; ``easgd.hessian.certified_curvature`` gives its h
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
    ValueError: as :func:`easgd.hessian.top_hessian_eigenvalue`.

  References:
    Pearlmutter (1994); Lehoucq, Sorensen, Yang, ARPACK Users' Guide (1998).
  """
  loss = jax.tree_util.Partial(_data_loss(model), x, y)
  return hessian.curvature_estimate(loss, params, key, num_iterations, tol,
                                    examples=int(x.shape[0]))


def _best_center(outputs: dict[int, dict]) -> tuple[int, int] | None:
  """(num_workers, index) of the non-diverged configuration with the lowest
  finite ``center_loss``, or None."""
  best = None
  for p, out in outputs.items():
    loss = np.where(np.asarray(out["diverged"]), np.inf,
                    np.nan_to_num(np.asarray(out["center_loss"]), nan=np.inf))
    i = int(np.argmin(loss))
    if np.isfinite(loss[i]) and (best is None or loss[i] < best[0]):
      best = (float(loss[i]), p, i)
  return None if best is None else best[1:]


def sweep_network(grid: SweepGrid, num_steps: int, *, dataset: str = "mnist1d",
                  model="mlp", per_worker_batch_size: int = 32, seed: int = 0,
                  divergence_factor: float = 1e3, data_dir=None,
                  hessian_iterations: int = 100, hessian_tol: float = 1e-4,
                  hessian_examples: int = 2000, hessian_at_trained: bool = True
                  ) -> SweepResult:
  """Sweeps synchronous EASGD on a Flax classifier, one program per p.

  Every configuration runs ``easgd.algorithms.easgd``'s step from the same
  initial parameters (workers and center equal, as in the paper), with
  plain-SGD local steps u = -eta g on the same sequence of disjoint worker
  batches (:func:`network_batches`), in one program of
  ``easgd.sweep_engine.make_sweep_fn``, and is evaluated on the whole test
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
  theory columns stay empty and an ``easgd.hessian.CurvatureWarning`` is
  issued.

  Args:
    grid: the configurations (validated here).
    num_steps: local steps per worker, an integer >= 1.
    dataset: an ``easgd.data.DATASETS`` name.
    model: ``"mlp"``/``"cnn"`` (``easgd.models.make_model``) or a Flax module.
    per_worker_batch_size: examples per worker per step.
    seed: data-order and initialisation seed (as the trainer: init key and
      step key are ``split(key(seed))``).
    divergence_factor: see ``easgd.quadratic.sweep_quadratic``.
    data_dir: Fashion-MNIST directory (``easgd.data.load_dataset``).
    hessian_iterations, hessian_tol, hessian_examples: budget of
      Hessian-vector products (an integer >= 0; 0 skips the estimate),
      relative residual tolerance (a finite real > 0) and number of training
      examples of the Hessian's loss.
    hessian_at_trained: also estimate h at the best final center.

  Returns:
    A :class:`~easgd.sweep_grid.SweepResult` with ``problem="network"``.

  Raises:
    SweepError: invalid grid or settings. easgd.data.DataError,
      easgd.models.ModelError: unknown data set or model.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6); Section 4 for the theory.
  """
  grid = grid.validate()
  num_steps = check_int("num_steps", num_steps, 1)
  batch_size = check_int("per_worker_batch_size", per_worker_batch_size, 1)
  factor = check_factor(divergence_factor)
  hessian_iterations = check_int("hessian_iterations", hessian_iterations, 0)
  hessian_examples = check_int("hessian_examples", hessian_examples, 1)
  check_real("hessian_tol", hessian_tol, 0.0, True)
  ds = data.load_dataset(dataset, data_dir=data_dir, seed=seed)
  model_name = model if isinstance(model, str) else type(model).__name__
  if isinstance(model, str):
    model = models.make_model(model, ds.num_classes)
  if models.has_batch_norm(model):  # the sweep keeps no BatchNorm statistics
    raise models.ModelError(f"the sweep does not support BatchNorm models "
                            f"({model_name}); train them with easgd.trainer")
  init_key, step_key = jax.random.split(jax.random.key(seed))
  params0 = models.init_params(model, ds.input_shape, init_key)
  hx = jnp.asarray(ds.train_x[:hessian_examples])
  hy = jnp.asarray(ds.train_y[:hessian_examples])
  hess_key = jax.random.fold_in(init_key, 1)
  info = dict(programs={}, num_steps=num_steps, dataset=dataset, model=model_name,
              num_params=models.count_params(params0),
              per_worker_batch_size=batch_size, seed=seed, divergence_factor=factor)
  h = None
  if hessian_iterations:
    info["hessian_init"] = hessian_curvature(model, params0, hx, hy, hess_key,
                                             hessian_iterations, hessian_tol)
    hessian.warn_unconverged(info["hessian_init"], "the initial parameters")
    h = hessian.certified_curvature(info["hessian_init"])
  test = (jnp.asarray(ds.test_x), jnp.asarray(ds.test_y))

  def inputs(p):
    x, y = network_batches(ds, p, batch_size, num_steps, seed)
    worker0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (p, *a.shape)), params0)
    return worker0, params0, (jnp.asarray(x), jnp.asarray(y)), test, step_key

  outputs, info["programs"] = run_grid(
      grid, lambda p: _network_program(model, p, num_steps), inputs, factor)
  centers = {p: jax.tree.map(np.asarray, out["center"]) for p, out in outputs.items()}
  h2 = None
  best = _best_center(outputs) if hessian_iterations and hessian_at_trained else None
  if best is not None:
    p, i = best
    point = jax.tree.map(lambda a: jnp.asarray(a[i]), centers[p])
    info["hessian_trained"] = dict(
        hessian_curvature(model, point, hx, hy, hess_key, hessian_iterations,
                          hessian_tol),
        at=dict(num_workers=p, **grid_config(grid, i), step=num_steps))
    hessian.warn_unconverged(info["hessian_trained"], "the best final center")
    h2 = hessian.certified_curvature(info["hessian_trained"])
  result = SweepResult("network", grid, [], h, info, centers)
  for p, out in outputs.items():
    result.records += records("network", grid, p, out, h, h2)
  return result
