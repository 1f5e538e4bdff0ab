"""Hyperparameter sweeps of synchronous EASGD as ONE compiled program per grid.

A sweep runs every (learning_rate, tau, alpha) configuration of a grid at once:

    jit( vmap over configurations (             <- tau, alpha, eta traced, batched
           scan over steps (                    <- lax.scan, num_steps static
             vmap over workers, axis_name=SWEEP_WORKER_AXIS (
               grad, easgd.elastic.easgd_update, psum ))))

so a grid of n configurations costs one trace and one compilation, and a second
sweep of the same shapes with other values costs none (the test suite counts
``/jax/core/compile/backend_compile_duration`` events). Because tau is a traced
value that differs between configurations, the exchange flag
``t % tau == 0`` is batched over the configuration axis, and the ``lax.cond``
of :func:`easgd.elastic.easgd_update` is turned by ``vmap`` into a select:
every configuration computes the elastic exchange (and its ``psum`` over the
simulated workers) at every step and keeps it only on exchange steps. The
values are those of eq. (5)-(6) exactly; only the communication saving of
tau > 1 is not realised, which does not matter for a simulation on one device.
``num_workers`` changes array shapes, so a grid over it runs one program per
value (each of them still one program for all its (eta, tau, alpha)).

Each configuration records, without stopping the others:
  workers_diverged         the first step t whose mean worker loss is
                           non-finite or exceeds ``divergence_factor`` x the
                           step-0 mean worker loss, or whose new worker
                           parameters are non-finite.
  center_diverged          the center's parameters became non-finite at some
                           step, or the center's loss after the last step
                           (``center_loss`` of ``eval_fn``) is non-finite or
                           exceeds ``divergence_factor`` x the center's loss at
                           the common start (``initial_center_loss``, the same
                           ``eval_fn`` evaluated once on the start center).
  diverged                 workers_diverged or center_diverged; the theory
                           agreement (``summarize``, heatmaps) is computed
                           from it.
  diverged_step            the step at which a per-step test fired (from then
                           on the configuration's state is frozen
                           (``jnp.where``) at its value at the start of that
                           step, which is finite, so NaN never reaches its
                           metrics or another configuration); ``num_steps``
                           when only the end test of the center's loss fired;
                           -1 when not diverged.
  final_loss               mean worker mini-batch loss of the last step that
                           passed the test (for a finished run: step
                           num_steps - 1, at the parameters before it).
  center_loss              loss of the center x~: F(x~) on the quadratic, the
                           test cross-entropy for a network (with
                           ``test_accuracy``).
  worker_center_distance   mean over workers of ||x^i - x~||_2 at the end.
  theory_radius            the analytic period spectral radius of
                           :func:`easgd.stability.sync_easgd_spectral_radius` at
                           eta*h, with h the known curvature (quadratic) or the
                           estimated largest Hessian eigenvalue (network; only
                           when its residual certifies it, see
                           :func:`hessian_curvature`).

The center is watched separately because it can be ruined while the workers
are not: with beta = p alpha > 2 the center's own factor 1 - beta at an
exchange leaves the unit disc, while between exchanges the workers' local
steps pull them back down (e.g. the MNIST-1D MLP at p = 4, eta = 0.1,
tau = 16, alpha = 0.5 over 300 steps: the center's test loss grows some
thousand-fold, the workers' mini-batch loss a few-fold).
Its LOSS is checked once, after the last step, not along the way: the
reported center metrics are those at the end, so the end test flags exactly
the configurations whose reported center is ruined, and on a network the
center's loss is a pass over the whole test set, which at every step would
cost more than the training itself (MNIST-1D: 2,000 test signals against
p B = 128 training signals per step). Its parameters are checked for
finiteness at every step (free). What this gives up: the step at which the
center crossed the limit (``diverged_step`` = ``num_steps``), and a center
that crossed it and came back by the end is not flagged (its final metrics
are then what they say).

Problems:
  :func:`sweep_quadratic`  F(x) = h x^2 / 2, scalar workers (the model of the
                           paper's Section 4); workers start spread around x0 so
                           that every mode of the period map is excited.
  :func:`sweep_network`    a Flax classifier (MNIST-1D MLP by default) trained
                           with plain SGD local steps, the workers reading
                           disjoint batches (``easgd.data.worker_batch_indices``);
                           all configurations see the same batches.

Command line: ``easgd sweep`` (:func:`run_sweep`): CSV, JSON and one heatmap
PNG per metric (tau on the x axis, alpha on the y axis) with the theory's
stability boundary (radius = 1) drawn over it.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6), Algorithm 1, Section 4.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import io
import json
import math
import numbers
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from optax.tree_utils import tree_where

from easgd import elastic

Params = Any
SWEEP_WORKER_AXIS = "sweep_workers"
"""Axis name of the simulated workers inside one configuration."""

PROBLEMS = ("quadratic", "network", "both")
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

# Metrics drawn as heatmaps, with (colour-bar label, log colour scale).
HEATMAP_METRICS = {
    "diverged": ("diverged, workers or center (1) / not (0)", False),
    "center_loss": ("center loss", True),
    "test_accuracy": ("center test accuracy", False),
    "worker_center_distance": ("mean ||x^i - x~|| at the end", True),
    "final_loss": ("mean worker loss, last step", True),
}

CSV_COLUMNS = ("problem", "num_workers", "learning_rate", "tau", "alpha", "beta",
               "diverged", "workers_diverged", "center_diverged", "diverged_step",
               "initial_loss", "final_loss", "initial_center_loss", "center_loss",
               "test_accuracy", "worker_center_distance",
               "eta_h", "theory_radius", "theory_stable", "eta_h_trained",
               "theory_radius_trained")


class SweepError(elastic.HyperparameterError):
  """A sweep grid or setting is outside its allowed range (one-line message)."""


# ----------------------------------------------------------------------------
# Grid and settings
# ----------------------------------------------------------------------------


def _int_scalar(name: str, value, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise SweepError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def _real_scalar(name: str, value, minimum: float, strictly: bool) -> float:
  ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
        and math.isfinite(value) and (value > minimum if strictly else value >= minimum))
  if not ok:
    rng = f"> {minimum:g}" if strictly else f">= {minimum:g}"
    raise SweepError(f"{name} must be a finite real {rng}, got {value!r}")
  return float(value)


def _int_tuple(name: str, values, minimum: int) -> tuple[int, ...]:
  values = _as_tuple(name, values)
  for v in values:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
      raise SweepError(f"{name} grid values must be integers >= {minimum}, got {v!r}")
  return _sorted_unique(name, tuple(int(v) for v in values))


def _real_tuple(name: str, values, minimum: float, strictly: bool) -> tuple[float, ...]:
  values = _as_tuple(name, values)
  for v in values:
    ok = (not isinstance(v, bool) and isinstance(v, numbers.Real)
          and math.isfinite(v) and (v > minimum if strictly else v >= minimum))
    if not ok:
      rng = f"> {minimum:g}" if strictly else f">= {minimum:g}"
      raise SweepError(f"{name} grid values must be finite reals {rng}, got {v!r}")
  return _sorted_unique(name, tuple(float(v) for v in values))


def _as_tuple(name, values) -> tuple:
  if isinstance(values, (numbers.Number, np.number)):
    values = (values,)
  values = tuple(v.item() if isinstance(v, np.generic) else v for v in values)
  if not values:
    raise SweepError(f"{name} grid must have at least one value, got none")
  return values


def _sorted_unique(name, values):
  if len(set(values)) != len(values):
    dup = next(v for v in values if values.count(v) > 1)
    raise SweepError(f"{name} grid has the value {dup!r} twice; give each value once")
  return tuple(sorted(values))


@dataclasses.dataclass(frozen=True)
class SweepGrid:
  """The configurations of a sweep: the Cartesian product of four axes.

  Every axis is sorted ascending on validation. For each ``num_workers`` value
  the configurations are ordered learning_rate-major, then tau, then alpha
  (``np.meshgrid(..., indexing="ij")`` of (learning_rate, tau, alpha)).

  Attributes:
    tau: communication periods in local steps, integers >= 1.
    alpha: moving rates (beta = num_workers * alpha), finite reals >= 0.
    learning_rate: eta, the local plain-SGD step size, finite reals > 0.
    num_workers: p, integers >= 1; one compiled program per value.
  """
  tau: tuple[int, ...]
  alpha: tuple[float, ...]
  learning_rate: tuple[float, ...] = (0.1,)
  num_workers: tuple[int, ...] = (4,)

  def validate(self) -> "SweepGrid":
    """The grid with sorted tuples of Python numbers.

    Raises:
      SweepError: empty axis, duplicate value, tau or num_workers not integers
        >= 1, alpha negative or not finite, learning_rate not a finite real > 0.
    """
    return SweepGrid(tau=_int_tuple("tau", self.tau, 1),
                     alpha=_real_tuple("alpha", self.alpha, 0.0, False),
                     learning_rate=_real_tuple("learning_rate", self.learning_rate,
                                               0.0, True),
                     num_workers=_int_tuple("num_workers", self.num_workers, 1))

  @property
  def configs_per_program(self) -> int:
    """Configurations in one compiled program (one num_workers value)."""
    return len(self.learning_rate) * len(self.tau) * len(self.alpha)

  def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(learning_rate, tau, alpha) of every configuration of one program.

    Returns:
      float32 [n], int32 [n], float32 [n] with n = :attr:`configs_per_program`.
    """
    lr, tau, alpha = np.meshgrid(np.asarray(self.learning_rate, np.float64),
                                 np.asarray(self.tau, np.int64),
                                 np.asarray(self.alpha, np.float64), indexing="ij")
    return (lr.ravel().astype(np.float32), tau.ravel().astype(np.int32),
            alpha.ravel().astype(np.float32))


# ----------------------------------------------------------------------------
# The compiled engine
# ----------------------------------------------------------------------------


class SweepState(NamedTuple):
  """Carry of one configuration's scan.

  Attributes:
    params: worker parameters, pytree with leading axis [p].
    center: the center x~, pytree without the worker axis.
    diverged: bool scalar, set at the first bad step and never cleared (the
      state is frozen from then on).
    workers_diverged: bool scalar, the workers' test fired at that step.
    center_diverged: bool scalar, the center's parameters were non-finite at
      that step.
    diverged_step: int32 scalar, that step (-1 while not diverged).
    initial_loss: float32 scalar, mean worker loss at step 0.
    last_loss: float32 scalar, mean worker loss of the last good step.
  """
  params: Params
  center: Params
  diverged: jax.Array
  workers_diverged: jax.Array
  center_diverged: jax.Array
  diverged_step: jax.Array
  initial_loss: jax.Array
  last_loss: jax.Array


def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return functools.reduce(jnp.logical_and, leaves, jnp.bool_(True))


def _above(loss, reference, factor):
  """loss is non-finite or exceeds factor * |reference| (a tiny floor for 0)."""
  limit = factor * jnp.maximum(jnp.abs(reference), jnp.finfo(jnp.float32).tiny)
  return ~jnp.isfinite(loss) | (loss > limit)


def make_sweep_fn(loss_fn: Callable, num_workers: int, num_steps: int,
                  eval_fn: Callable | None = None) -> Callable:
  """Builds the one-program sweep for a loss: all configurations, all steps.

  For each configuration (eta, tau, alpha) and step t = 0, ..., num_steps - 1,
  every worker i takes

      g^i_t = grad loss_fn(x^i_t, batch^i_t, key^i_t)
      u^i_t = -eta g^i_t
      (x^i_{t+1}, x~_{t+1}) = easgd_update(x^i_t, u^i_t, x~_t, alpha,
                                           exchange = (t % tau == 0))     (5)-(6)

  with key^i_t = fold_in(fold_in(key, t), i) (as ``easgd.algorithms``). With
  L_t = mean_i loss_fn(x^i_t, ...) and F the ``center_loss`` of ``eval_fn``,
  a configuration is

      workers_diverged  if for some t: L_t not finite, L_t > c |L_0|, or
                        x^i_{t+1} not finite                  (per step)
      center_diverged   if for some t: x~_{t+1} not finite    (per step), or
                        F(x~_T) not finite or F(x~_T) > c |F(x~_0)|  (end)

  with c = ``divergence_factor``, T = num_steps and x~_0 the common start of
  the center (F(x~_0) evaluated once, outside the configurations' ``vmap``).
  A per-step test freezes the configuration at its state at the start of
  step t; the end test sees the (possibly frozen) final center. See the
  module docstring for why the center's loss is tested only at the end.
  The configurations are ``vmap``-ed (their tau is traced, so the exchange is
  a select, see the module docstring), the workers are an inner ``vmap`` over
  :data:`SWEEP_WORKER_AXIS`, the steps a ``lax.scan``.

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> float32 scalar``, one worker's
      mini-batch loss (``easgd.algorithms.LossFn``).
    num_workers: p, an integer >= 1 (static: it sets shapes).
    num_steps: local steps per worker, an integer >= 1 (static).
    eval_fn: optional ``eval_fn(center, eval_data) -> dict of float32
      scalars`` holding ``center_loss`` (used by the center's end test),
      evaluated on the common start center and on each configuration's final
      center (inside the same program). Without it the center is tested for
      finiteness only.

  Returns:
    A jitted ``run(learning_rate, tau, alpha, worker_params, center, batches,
    eval_data, key, divergence_factor) -> dict`` where ``learning_rate``
    float32 [n], ``tau`` int32 [n], ``alpha`` float32 [n]; ``worker_params``
    a pytree with leading axis [p] (the start of every configuration);
    ``center`` a pytree (the common start of the center); ``batches`` a pytree
    with leading axes [num_steps, p] (the same for every configuration);
    ``eval_data`` any pytree for ``eval_fn``; ``key`` a PRNG key;
    ``divergence_factor`` a float32 scalar. The dict holds [n] arrays
    ``diverged``, ``workers_diverged``, ``center_diverged`` (bool),
    ``diverged_step`` (int32), ``initial_loss``, ``final_loss``,
    ``worker_center_distance``, ``initial_center_loss`` (NaN without
    ``eval_fn``; the same for every configuration), the ``eval_fn`` metrics,
    and ``center`` (the final centers, leading axis [n]). Compiled once per
    shape.

  Raises:
    SweepError: num_workers or num_steps not an integer >= 1; ``eval_fn``
      without a ``center_loss`` (when the program is traced).

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6).
  """
  _int_scalar("num_workers", num_workers, 1)
  num_steps = _int_scalar("num_steps", num_steps, 1)

  def worker_step(params, center, batch, lr, alpha, exchange, key, t):
    wkey = jax.random.fold_in(jax.random.fold_in(key, t),
                              lax.axis_index(SWEEP_WORKER_AXIS))
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, wkey)
    updates = jax.tree.map(lambda g: (-lr * g).astype(g.dtype), grads)
    params, center = elastic.easgd_update(params, updates, center, alpha, exchange,
                                          SWEEP_WORKER_AXIS)
    return params, center, loss

  all_workers = jax.vmap(worker_step,
                         in_axes=(0, None, 0, None, None, None, None, None),
                         out_axes=(0, None, 0), axis_name=SWEEP_WORKER_AXIS)

  def evaluate(center, eval_data):
    metrics = dict(eval_fn(center, eval_data))
    if "center_loss" not in metrics:
      raise SweepError(f"eval_fn must return 'center_loss' (the center's divergence "
                       f"test), got {sorted(metrics)}")
    return metrics

  def one_config(lr, tau, alpha, params0, center0, batches, eval_data, key, factor,
                 initial_center_loss):
    def body(state, xs):
      t, batch = xs
      exchange = elastic.is_exchange_step(t, tau)
      params, center, losses = all_workers(state.params, state.center, batch, lr,
                                           alpha, exchange, key, t)
      loss = jnp.mean(losses.astype(jnp.float32))
      initial = jnp.where(t == 0, loss, state.initial_loss)
      workers_bad = _above(loss, initial, factor) | ~_all_finite(params)
      center_bad = ~_all_finite(center)
      first = (workers_bad | center_bad) & ~state.diverged
      diverged = state.diverged | first
      new = SweepState(
          params=tree_where(diverged, state.params, params),
          center=tree_where(diverged, state.center, center),
          diverged=diverged,
          workers_diverged=state.workers_diverged | (first & workers_bad),
          center_diverged=state.center_diverged | (first & center_bad),
          diverged_step=jnp.where(first, t, state.diverged_step),
          initial_loss=initial,
          last_loss=jnp.where(diverged, state.last_loss, loss))
      return new, None

    false = jnp.bool_(False)
    init = SweepState(params0, center0, false, false, false, jnp.int32(-1),
                      jnp.float32(jnp.nan), jnp.float32(jnp.nan))
    state, _ = lax.scan(body, init, (jnp.arange(num_steps, dtype=jnp.int32), batches))
    dist = jax.vmap(elastic.tree_l2_distance, in_axes=(0, None))(state.params,
                                                                 state.center)
    out = dict(worker_center_distance=jnp.mean(dist), center=state.center,
               initial_loss=state.initial_loss, final_loss=state.last_loss,
               initial_center_loss=initial_center_loss)
    center_end_bad = false
    if eval_fn is not None:
      metrics = evaluate(state.center, eval_data)
      out.update(metrics)
      center_end_bad = _above(jnp.asarray(metrics["center_loss"], jnp.float32),
                              initial_center_loss, factor)
    out.update(
        diverged=state.diverged | center_end_bad,
        workers_diverged=state.workers_diverged,
        center_diverged=state.center_diverged | center_end_bad,
        diverged_step=jnp.where(state.diverged, state.diverged_step,
                                jnp.where(center_end_bad, jnp.int32(num_steps),
                                          jnp.int32(-1))))
    return out

  configs = jax.vmap(one_config,
                     in_axes=(0, 0, 0, None, None, None, None, None, None, None))

  @jax.jit
  def run(learning_rate, tau, alpha, worker_params, center, batches, eval_data, key,
          divergence_factor):
    initial_center_loss = (
        jnp.float32(jnp.nan) if eval_fn is None
        else jnp.asarray(evaluate(center, eval_data)["center_loss"], jnp.float32))
    return configs(learning_rate, tau, alpha, worker_params, center, batches,
                   eval_data, key, jnp.asarray(divergence_factor, jnp.float32),
                   initial_center_loss)

  return run


class CompileCounter:
  """Counts XLA compilations (and their seconds) while the context is open.

  Listens to the ``/jax/core/compile/backend_compile_duration`` event of
  ``jax.monitoring``: one event per backend compilation, cache hits excluded.

  Example:
    >>> with CompileCounter() as cc:
    ...   jax.jit(lambda x: x + 1)(1.0)
    >>> cc.count
    1
  """

  def __init__(self):
    self.count = 0
    self.seconds = 0.0
    self.names = []  # the compiled functions, e.g. "jit(run)"

  def _listen(self, event, duration_secs, **kwargs):
    if event == COMPILE_EVENT:
      self.count += 1
      self.seconds += float(duration_secs)
      self.names.append(kwargs.get("fun_name"))

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listen)
    return False


# ----------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class SweepResult:
  """Per-configuration results of a sweep.

  Attributes:
    problem: ``"quadratic"`` or ``"network"``.
    grid: the validated :class:`SweepGrid`.
    records: one dict per configuration (keys: :data:`CSV_COLUMNS`; values
      Python numbers, ``None`` where not applicable), ordered by num_workers,
      then as :meth:`SweepGrid.flat`.
    curvature: h used for the theory columns (quadratic: the given
      curvature; network: the largest Hessian eigenvalue at the initial
      parameters, if its estimate converged), or None.
    info: wall times, compile counts, Hessian estimates, settings.
    centers: num_workers -> final centers (pytree, leading axis [n]) on the
      host; not written to disk.
  """
  problem: str
  grid: SweepGrid
  records: list[dict[str, Any]]
  curvature: float | None = None
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  centers: dict[int, Any] = dataclasses.field(default_factory=dict, repr=False)

  def table(self, metric: str, num_workers: int | None = None,
            learning_rate: float | None = None) -> np.ndarray:
    """One metric as a float64 [len(alpha), len(tau)] array (rows: alpha).

    Args:
      metric: a record key; bools become 0/1, ``None`` becomes NaN.
      num_workers, learning_rate: the slice (default: the first grid value).

    Raises:
      KeyError: unknown metric.
    """
    p = self.grid.num_workers[0] if num_workers is None else num_workers
    lr = self.grid.learning_rate[0] if learning_rate is None else learning_rate
    out = np.full((len(self.grid.alpha), len(self.grid.tau)), np.nan)
    ti = {t: i for i, t in enumerate(self.grid.tau)}
    ai = {a: i for i, a in enumerate(self.grid.alpha)}
    for r in self.records:
      if r["num_workers"] == p and r["learning_rate"] == lr:
        v = r[metric]
        out[ai[r["alpha"]], ti[r["tau"]]] = np.nan if v is None else float(v)
    return out

  def to_csv(self) -> str:
    """The records as CSV text (header :data:`CSV_COLUMNS`)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in self.records:
      w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
    return buf.getvalue()

  def to_json(self) -> dict[str, Any]:
    """JSON-ready dict: problem, grid, curvature, info, records."""
    return dict(problem=self.problem, grid=dataclasses.asdict(self.grid),
                curvature=self.curvature, info=self.info, records=self.records)


def _theory(lr, alpha, tau, p, h):
  """(eta*h, radius) of the analytic period map, or Nones without h."""
  from easgd import stability
  if h is None or not math.isfinite(h):
    return None, None
  u = float(lr) * float(h)
  return u, float(stability.sync_easgd_spectral_radius(u, float(alpha), int(tau),
                                                       int(p)))


def grid_config(grid: SweepGrid, index: int) -> dict[str, Any]:
  """learning_rate, tau, alpha of configuration ``index`` of :meth:`SweepGrid.flat`,
  as the grid's Python numbers (not float32 round trips)."""
  na, nt = len(grid.alpha), len(grid.tau)
  return dict(learning_rate=grid.learning_rate[index // (nt * na)],
              tau=grid.tau[(index // na) % nt], alpha=grid.alpha[index % na])


def _records(problem, grid, p, outputs, curvature, curvature_trained):
  host = {k: np.asarray(v) for k, v in outputs.items() if k != "center"}
  rows = []
  for i in range(grid.configs_per_program):
    c = grid_config(grid, i)
    r_lr, r_tau, r_alpha = c["learning_rate"], c["tau"], c["alpha"]
    u, radius = _theory(r_lr, r_alpha, r_tau, p, curvature)
    u2, radius2 = _theory(r_lr, r_alpha, r_tau, p, curvature_trained)
    f = lambda k: (None if k not in host or not np.isfinite(host[k][i])
                   else float(host[k][i]))
    rows.append(dict(
        problem=problem, num_workers=p, learning_rate=r_lr, tau=r_tau,
        alpha=r_alpha, beta=p * r_alpha, diverged=bool(host["diverged"][i]),
        workers_diverged=bool(host["workers_diverged"][i]),
        center_diverged=bool(host["center_diverged"][i]),
        diverged_step=int(host["diverged_step"][i]),
        initial_loss=f("initial_loss"), final_loss=f("final_loss"),
        initial_center_loss=f("initial_center_loss"),
        center_loss=f("center_loss"), test_accuracy=f("test_accuracy"),
        worker_center_distance=f("worker_center_distance"),
        eta_h=u, theory_radius=radius,
        theory_stable=None if radius is None else bool(radius < 1.0),
        eta_h_trained=u2, theory_radius_trained=radius2))
  return rows


# ----------------------------------------------------------------------------
# The quadratic F(x) = h x^2 / 2
# ----------------------------------------------------------------------------


def _run_timed(run, args, num_configs: int):
  """Runs one compiled sweep program; returns (outputs, wall time and compile info)."""
  start = time.perf_counter()
  with CompileCounter() as cc:
    out = jax.block_until_ready(run(*args))
  return out, dict(configs=num_configs, wall_s=round(time.perf_counter() - start, 3),
                   compiles=cc.count, compile_s=round(cc.seconds, 3), compiled=cc.names)


@functools.lru_cache(maxsize=16)
def _quadratic_program(num_workers: int, num_steps: int):
  def loss_fn(x, batch, key):
    h, noise = batch
    return 0.5 * h * x * x + noise * x   # gradient h x + xi

  def eval_fn(center, h):
    return dict(center_loss=0.5 * h * center * center)

  return make_sweep_fn(loss_fn, num_workers, num_steps, eval_fn)


def quadratic_start(num_workers: int, x0: float = 1.0, spread: float = 0.5
                    ) -> tuple[np.ndarray, float]:
  """Start of the quadratic sweep: workers spread evenly around x0, center x0.

      x^i_0 = x0 (1 + spread (2 i / (p - 1) - 1)),  i = 0..p-1   (x0 for p = 1)
      x~_0  = x0

  Unequal workers excite the deviation modes x^i - mean(x) of the period map
  as well as the (mean, center) pair, so the simulation diverges wherever the
  analytic radius exceeds 1.

  Returns:
    (float32 [p] worker starts, center start).
  """
  if num_workers == 1:
    return np.full((1,), x0, np.float32), float(x0)
  i = np.arange(num_workers, dtype=np.float64)
  return (x0 * (1.0 + spread * (2.0 * i / (num_workers - 1) - 1.0))).astype(
      np.float32), float(x0)


def sweep_quadratic(grid: SweepGrid, num_steps: int, *, curvature: float = 1.0,
                    x0: float = 1.0, spread: float = 0.5, sigma: float = 0.0,
                    seed: int = 0, divergence_factor: float = 1e3) -> SweepResult:
  """Sweeps synchronous EASGD on F(x) = h x^2 / 2 over a grid, one program per p.

  Each configuration runs eq. (5)-(6) with communication period tau on scalar
  workers (see :func:`make_sweep_fn`), gradient g^i_t = h x^i_t + xi^i_t with
  xi ~ N(0, sigma^2) iid over workers and steps (the same draws for every
  configuration), from :func:`quadratic_start`. ``center_loss`` is
  F(x~) = h x~^2 / 2 at the end; ``theory_radius`` is the period spectral
  radius at eta*h (``easgd.stability.sync_easgd_spectral_radius``).

  Args:
    grid: the configurations (validated here).
    num_steps: local steps, an integer >= 1.
    curvature: h > 0.
    x0: start value (finite, non-zero so that the loss can grow).
    spread: relative spread of the worker starts, finite >= 0.
    sigma: gradient-noise standard deviation >= 0.
    seed: seed of the noise draws.
    divergence_factor: c > 1; a configuration diverges when its mean worker
      loss exceeds c x its step-0 value, or its center's loss F(x~) after the
      last step exceeds c x F(x0) (module docstring: ``workers_diverged``,
      ``center_diverged``).

  Returns:
    A :class:`SweepResult` with ``problem="quadratic"``.

  Raises:
    SweepError: invalid grid or settings (named in the message).

  Example:
    >>> res = sweep_quadratic(SweepGrid(tau=(1, 4), alpha=(0.1, 0.9)), 200)
    >>> [r["diverged"] for r in res.records]
    [False, True, False, True]

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Section 4.
  """
  grid = grid.validate()
  num_steps = _int_scalar("num_steps", num_steps, 1)
  h = _real_scalar("curvature", curvature, 0.0, True)
  _real_scalar("spread", spread, 0.0, False)
  _real_scalar("sigma", sigma, 0.0, False)
  factor = _check_factor(divergence_factor)
  if not (isinstance(x0, numbers.Real) and math.isfinite(x0) and x0 != 0):
    raise SweepError(f"x0 must be a finite non-zero real, got {x0!r}")
  records, info, centers = [], dict(programs={}), {}
  for p in grid.num_workers:
    run = _quadratic_program(p, num_steps)
    w0, c0 = quadratic_start(p, x0, spread)
    noise = sigma * jax.random.normal(jax.random.key(seed), (num_steps, p), jnp.float32)
    hs = jnp.full((num_steps, p), h, jnp.float32)
    lr, tau, alpha = grid.flat()
    args = (jnp.asarray(lr), jnp.asarray(tau), jnp.asarray(alpha), jnp.asarray(w0),
            jnp.float32(c0), (hs, noise), jnp.float32(h), jax.random.key(seed),
            jnp.float32(factor))
    out, program_info = _run_timed(run, args, int(lr.size))
    info["programs"][p] = program_info
    records += _records("quadratic", grid, p, out, h, None)
    centers[p] = np.asarray(out["center"])
  info.update(num_steps=num_steps, curvature=h, x0=x0, spread=spread, sigma=sigma,
              seed=seed, divergence_factor=factor)
  return SweepResult("quadratic", grid, records, h, info, centers)


def _check_factor(value) -> float:
  if (isinstance(value, bool) or not isinstance(value, numbers.Real)
      or not math.isfinite(value) or value <= 1):
    raise SweepError(f"divergence_factor must be a finite real > 1, got {value!r}")
  return float(value)


# ----------------------------------------------------------------------------
# A neural network (MNIST-1D MLP by default)
# ----------------------------------------------------------------------------


def network_fns(model):
  """(loss_fn, eval_fn) of a Flax classifier for :func:`make_sweep_fn`.

  ``loss_fn(params, (x, y), key)`` is the mean cross-entropy of a batch (as
  ``easgd.trainer.make_loss_fn``); ``eval_fn(center, (x, y))`` gives the
  center's mean cross-entropy ``center_loss`` and ``test_accuracy`` on (x, y).
  """
  from easgd import models

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
  return make_sweep_fn(loss_fn, num_workers, num_steps, eval_fn)


def network_batches(dataset, num_workers: int, per_worker_batch_size: int,
                    num_steps: int, seed: int = 0):
  """The training batches of every step, as the trainer draws them.

  Epoch e (1-based, as ``easgd.trainer``) uses
  ``easgd.data.worker_batch_indices(N, p, B, seed, e)``; steps run on across
  epochs until ``num_steps``.

  Returns:
    (x float32 [num_steps, p, B, ...], y int32 [num_steps, p, B]) host arrays.
  """
  from easgd import data
  spe = data.steps_per_epoch(len(dataset.train_y), num_workers, per_worker_batch_size)
  idx = np.concatenate([
      data.worker_batch_indices(len(dataset.train_y), num_workers,
                                per_worker_batch_size, seed, epoch)
      for epoch in range(1, -(-num_steps // spe) + 1)])[:num_steps]
  return dataset.train_x[idx], dataset.train_y[idx]


@functools.lru_cache(maxsize=16)
def _data_loss(model):
  """``loss(x, y, params)``: mean cross-entropy of (x, y), eval mode; one
  function object per model, so the Hessian's compiled products are reused."""
  from easgd import models

  def loss(x, y, params):
    return models.cross_entropy_loss(model.apply({"params": params}, x, train=False),
                                     y)
  return loss


def hessian_curvature(model, params, x, y, key, num_iterations: int = 100,
                      tol: float = 1e-4) -> dict[str, Any]:
  """Largest Hessian eigenvalue of the mean cross-entropy on (x, y) at params.

  Uses :func:`easgd.hessian.top_hessian_eigenvalue` (Hessian-vector products by
  ``jax.jvp`` of ``jax.grad``, ARPACK's Lanczos for the largest algebraic
  eigenvalue, the residual measured with one more product). ``h`` is a
  certified eigenvalue only when ``converged``: ||H v - h v||_2 <= tol |h|;
  :func:`certified_curvature` returns it only then.

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
  from easgd import hessian
  start = time.perf_counter()
  loss = jax.tree_util.Partial(_data_loss(model), x, y)
  r = hessian.top_hessian_eigenvalue(loss, params, key, num_iterations, tol)
  finite = lambda v: v if math.isfinite(v) else None
  return dict(h=finite(r.eigenvalue), converged=r.converged,
              residual=finite(r.residual), tol=tol, products=r.iterations,
              method=r.method, examples=int(x.shape[0]),
              seconds=round(time.perf_counter() - start, 3))


def certified_curvature(estimate: dict[str, Any] | None) -> float | None:
  """h of a :func:`hessian_curvature` result if it converged, else None.

  The theory columns and the heatmaps' boundary use only certified values: an
  estimate with ||H v - h v||_2 > tol |h| need not be near an eigenvalue.

  Args:
    estimate: a :func:`hessian_curvature` dict, or None (no estimate made).

  Returns:
    ``estimate["h"]`` (float) when ``estimate["converged"]``, else None.
  """
  if not estimate or not estimate.get("converged"):
    return None
  return estimate["h"]


class CurvatureWarning(UserWarning):
  """A Hessian estimate did not converge; the theory it feeds is left out."""


def _warn_unconverged(estimate: dict[str, Any], where: str) -> None:
  if estimate.get("converged"):
    return
  residual = estimate.get("residual")
  got = ("no Ritz value" if estimate.get("h") is None else
         f"h={estimate['h']:.4g} with residual {residual:.3g} > tol*|h| = "
         f"{estimate['tol'] * abs(estimate['h']):.3g}")
  warnings.warn(f"Hessian estimate at {where} did not converge within "
                f"{estimate['products']} Hessian-vector products ({got}); its theory "
                f"columns are left empty (raise hessian_iterations or hessian_tol)",
                CurvatureWarning, stacklevel=3)


def sweep_network(grid: SweepGrid, num_steps: int, *, dataset: str = "mnist1d",
                  model="mlp", per_worker_batch_size: int = 32, seed: int = 0,
                  divergence_factor: float = 1e3, data_dir=None,
                  hessian_iterations: int = 100, hessian_tol: float = 1e-4,
                  hessian_examples: int = 2000, hessian_at_trained: bool = True
                  ) -> SweepResult:
  """Sweeps synchronous EASGD on a Flax classifier, one program per p.

  Every configuration starts from the same initial parameters (workers and
  center equal, as in the paper), takes plain-SGD local steps u = -eta g on
  the same sequence of disjoint worker batches (:func:`network_batches`) and is
  evaluated on the whole test set at the end (``center_loss`` = test
  cross-entropy of the center, ``test_accuracy``); the same evaluation of the
  initial parameters is ``initial_center_loss``, the reference of the
  center's divergence test (module docstring).

  The curvature for the theory columns is the largest eigenvalue h of the
  Hessian of the mean training loss on the first ``hessian_examples``
  training examples (:func:`hessian_curvature`), at the initial parameters
  (``curvature``, ``theory_radius``) and, if ``hessian_at_trained`` and some
  configuration did not diverge, at the final center of the non-diverged
  configuration with the lowest ``center_loss`` (``eta_h_trained``,
  ``theory_radius_trained``). An estimate that did not converge (residual
  above ``hessian_tol`` x |h|) is recorded in ``info`` but not used: its
  theory columns stay empty and a :class:`CurvatureWarning` is issued.

  Args:
    grid: the configurations (validated here).
    num_steps: local steps per worker, an integer >= 1.
    dataset: an ``easgd.data.DATASETS`` name.
    model: ``"mlp"``/``"cnn"`` (``easgd.models.make_model``) or a Flax module.
    per_worker_batch_size: examples per worker per step.
    seed: data-order and initialisation seed (as the trainer: init key and
      step key are ``split(key(seed))``).
    divergence_factor: see :func:`sweep_quadratic`.
    data_dir: Fashion-MNIST directory (``easgd.data.load_dataset``).
    hessian_iterations, hessian_tol, hessian_examples: budget of
      Hessian-vector products (an integer >= 0; 0 skips the estimate),
      relative residual tolerance (a finite real > 0) and number of training
      examples of the Hessian's loss.
    hessian_at_trained: also estimate h at the best final center.

  Returns:
    A :class:`SweepResult` with ``problem="network"``.

  Raises:
    SweepError: invalid grid or settings. easgd.data.DataError,
      easgd.models.ModelError: unknown data set or model.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6); Section 4 for the theory.
  """
  from easgd import data, models
  grid = grid.validate()
  num_steps = _int_scalar("num_steps", num_steps, 1)
  batch_size = _int_scalar("per_worker_batch_size", per_worker_batch_size, 1)
  factor = _check_factor(divergence_factor)
  hessian_iterations = _int_scalar("hessian_iterations", hessian_iterations, 0)
  hessian_examples = _int_scalar("hessian_examples", hessian_examples, 1)
  _real_scalar("hessian_tol", hessian_tol, 0.0, True)
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
    _warn_unconverged(info["hessian_init"], "the initial parameters")
    h = certified_curvature(info["hessian_init"])
  test = (jnp.asarray(ds.test_x), jnp.asarray(ds.test_y))
  outputs, centers = {}, {}
  for p in grid.num_workers:
    run = _network_program(model, p, num_steps)
    x, y = network_batches(ds, p, batch_size, num_steps, seed)
    worker0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (p, *a.shape)), params0)
    lr, tau, alpha = grid.flat()
    args = (jnp.asarray(lr), jnp.asarray(tau), jnp.asarray(alpha), worker0, params0,
            (jnp.asarray(x), jnp.asarray(y)), test, step_key, jnp.float32(factor))
    out, program_info = _run_timed(run, args, int(lr.size))
    info["programs"][p] = program_info
    outputs[p] = out
    centers[p] = jax.tree.map(np.asarray, out["center"])
  h2 = None
  if hessian_iterations and hessian_at_trained:
    best = None
    for p, out in outputs.items():
      loss = np.where(np.asarray(out["diverged"]), np.inf,
                      np.nan_to_num(np.asarray(out["center_loss"]), nan=np.inf))
      i = int(np.argmin(loss))
      if np.isfinite(loss[i]) and (best is None or loss[i] < best[0]):
        best = (float(loss[i]), p, i)
    if best is not None:
      _, p, i = best
      point = jax.tree.map(lambda a: jnp.asarray(a[i]), centers[p])
      info["hessian_trained"] = dict(
          hessian_curvature(model, point, hx, hy, hess_key, hessian_iterations,
                            hessian_tol),
          at=dict(num_workers=p, **grid_config(grid, i), step=num_steps))
      _warn_unconverged(info["hessian_trained"], "the best final center")
      h2 = certified_curvature(info["hessian_trained"])
  records = []
  for p, out in outputs.items():
    records += _records("network", grid, p, out, h, h2)
  return SweepResult("network", grid, records, h, info, centers)


# ----------------------------------------------------------------------------
# One configuration through easgd.algorithms (reference and sequential baseline)
# ----------------------------------------------------------------------------


def run_with_algorithm(loss_fn: Callable, params0: Params, batches, key, *,
                       num_workers: int, tau: int, alpha: float,
                       learning_rate: float, eval_fn: Callable | None = None,
                       eval_data=None) -> dict[str, Any]:
  """Runs ONE configuration with ``easgd.algorithms.easgd`` as its own program.

  The per-worker step of ``easgd.algorithms.easgd(loss_fn,
  optax.sgd(learning_rate), tau=tau, alpha=alpha)`` (tau and alpha Python
  constants, so every configuration compiles its own program) is vmapped over
  the workers and scanned over ``batches``; no divergence handling. This is
  what one would run without the sweep: tests compare the sweep against it
  and ``benchmarks/sweep_vs_sequential.py`` times it.

  Args:
    loss_fn: ``loss_fn(params, batch, key)``.
    params0: common start of workers and center (no worker axis).
    batches: pytree with leading axes [num_steps, p].
    key: the run's base key.
    num_workers, tau, alpha, learning_rate: the configuration.
    eval_fn, eval_data: optional final evaluation of the center.

  Returns:
    dict(worker_params [p, ...], center, losses float32 [num_steps, p], and
    the ``eval_fn`` metrics), device arrays, after ``block_until_ready``.
  """
  import optax
  from easgd import algorithms
  algo = algorithms.easgd(loss_fn, optax.sgd(learning_rate), num_workers=num_workers,
                          tau=tau, alpha=alpha, axis_name=SWEEP_WORKER_AXIS)
  step = jax.vmap(algo.step, in_axes=(0, None, 0, None), out_axes=(0, None, 0),
                  axis_name=SWEEP_WORKER_AXIS)

  @jax.jit
  def run(params0, batches, key, eval_data):
    worker, shared = algo.init(params0)
    worker = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_workers, *a.shape)),
                          worker)

    def body(carry, batch):
      w, s = carry
      w, s, loss = step(w, s, batch, key)
      return (w, s), loss

    (worker, shared), losses = lax.scan(body, (worker, shared), batches)
    out = dict(worker_params=algo.worker_params(worker, shared),
               center=algo.center(shared), losses=losses)
    if eval_fn is not None:
      out.update(eval_fn(algo.center(shared), eval_data))
    return out

  return jax.block_until_ready(run(params0, batches, key, eval_data))


# ----------------------------------------------------------------------------
# Theory overlay, files, command line
# ----------------------------------------------------------------------------


def theory_contour(grid: SweepGrid, eta_h: float, num_workers: int,
                   num_alpha: int = 241) -> dict[str, np.ndarray]:
  """The analytic radius on a (tau, fine alpha) mesh in heatmap cell coordinates.

  The radius of :func:`easgd.stability.sync_easgd_spectral_radius` is
  evaluated at the grid's own tau values (columns; cell k at x = k, the edge
  columns repeated at x = -0.5 and n - 0.5 so a contour spans the plot) and
  at ``num_alpha`` alphas from half a cell below the first grid alpha to half
  a cell above the last (mapped to y by piecewise-linear interpolation between
  the grid values, linear extrapolation at the ends). Intermediate integer
  taus are deliberately not drawn: for eta*h > 1 the plain-step factor
  (1 - eta h)^(tau - 1) alternates in sign with tau, so the boundary between
  two grid taus says nothing about either.

  Returns:
    dict(x [len(tau) + 2], y [num_alpha], radius [num_alpha, len(tau) + 2])
    (float64).
  """
  from easgd import stability
  tau = np.asarray(grid.tau, np.int64)
  a = np.asarray(grid.alpha, np.float64)
  cells = np.arange(len(a), dtype=np.float64)
  if len(a) > 1:
    lo = a[0] - 0.5 * (a[1] - a[0])
    hi = a[-1] + 0.5 * (a[-1] - a[-2])
    y_lo, y_hi = -0.5, len(a) - 0.5
    if lo < 0:  # alpha >= 0: stop at 0, at the matching cell coordinate
      y_lo, lo = -0.5 * a[0] / (0.5 * (a[1] - a[0])), 0.0
  else:
    lo, hi, y_lo, y_hi = a[0] * 0.9, a[0] * 1.1 + 1e-3, -0.5, 0.5
  alphas = np.linspace(lo, hi, num_alpha)
  y = np.interp(alphas, np.r_[lo, a, hi], np.r_[y_lo, cells, y_hi])
  radius = stability.sync_easgd_spectral_radius(eta_h, alphas[:, None], tau[None, :],
                                                num_workers)
  radius = np.concatenate([radius[:, :1], radius, radius[:, -1:]], axis=1)
  x = np.r_[-0.5, np.arange(len(tau), dtype=np.float64), len(tau) - 0.5]
  return dict(x=x, y=y, radius=np.minimum(radius, 1e6))


_DIVERGED_CMAP = "Greys"  # 0 = white (finished), 1 = black (diverged)


def plot_result(result: SweepResult, workdir, prefix: str | None = None) -> list[Path]:
  """One heatmap PNG per metric and per (num_workers, learning_rate) slice.

  File names: ``{prefix}{metric}[_p{p}][_lr{lr}].png`` (the suffixes only
  when that axis has several values); prefix default ``"{problem}_"``.
  Cells of diverged configurations (``diverged``: workers or center) are
  hatched out in the metric plots; the theory's boundary (radius = 1) is drawn
  at eta*h for h at the start (solid) and, for a network, at the trained point
  (dashed), each only when its Hessian estimate converged
  (:func:`certified_curvature`).

  Returns:
    The written paths.
  """
  from easgd import plotting
  workdir = Path(workdir)
  prefix = f"{result.problem}_" if prefix is None else prefix
  g = result.grid
  h2 = certified_curvature(result.info.get("hessian_trained"))
  paths = []
  for p in g.num_workers:
    for lr in g.learning_rate:
      suffix = ((f"_p{p}" if len(g.num_workers) > 1 else "")
                + (f"_lr{lr:g}" if len(g.learning_rate) > 1 else ""))
      contours = []
      for h, style, name in ((result.curvature, "-", "h at the start"),
                             (h2, "--", "h at the trained point")):
        if h is not None and math.isfinite(h) and h > 0:
          c = theory_contour(g, lr * h, p)
          contours.append(dict(c, label=f"theory radius=1, {name} (eta*h={lr * h:.3g})",
                               linestyle=style))
      diverged = result.table("diverged", p, lr) > 0
      steps = result.table("diverged_step", p, lr)
      for metric, (label, log) in HEATMAP_METRICS.items():
        values = result.table(metric, p, lr)
        if np.all(np.isnan(values)):
          continue
        annot = None
        if metric == "diverged":
          annot = np.where(diverged, steps, np.nan)
        title = (f"{result.problem}: {metric}, p={p}, eta={lr:g}, "
                 f"{result.info.get('num_steps')} steps"
                 + (f"\n(numbers: step of divergence; {result.info.get('num_steps')}: "
                    "the center's final loss only)" if metric == "diverged" else
                    "\n(hatched: diverged; a workers' divergence freezes the state)"
                    if diverged.any() else ""))
        paths.append(plotting.plot_tau_alpha_heatmap(
            values, g.tau, g.alpha, workdir / f"{prefix}{metric}{suffix}.png",
            title=title, label=label, log=log,
            mask=None if metric == "diverged" else diverged,
            annotations=annot, contours=contours,
            cmap=_DIVERGED_CMAP if metric == "diverged" else "viridis"))
  return paths


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """Everything ``easgd sweep`` runs; written to ``sweep_config.json``.

  Attributes:
    problem: ``"quadratic"``, ``"network"`` or ``"both"`` (subdirectories).
    tau: communication periods (local steps).
    alpha: moving rates (beta = num_workers * alpha).
    learning_rate: eta values (local SGD step size).
    num_workers: p values (one compiled program each).
    num_steps: local steps per worker.
    per_worker_batch_size: examples per worker per step (network).
    dataset: data set name (network).
    model: ``"mlp"`` or ``"cnn"`` (network).
    curvature: h of the quadratic.
    quadratic_spread: relative spread of the quadratic's worker starts.
    quadratic_sigma: gradient-noise std of the quadratic.
    divergence_factor: loss ratio that counts as diverged: the workers' mean
      loss to its step-0 value, the center's final loss to its initial one.
    hessian_iterations: budget of Hessian-vector products for h (0: skip;
      network).
    hessian_tol: relative residual tolerance of h: certified when
      ||H v - h v|| <= hessian_tol |h| (> 0).
    hessian_examples: training examples in the Hessian's loss.
    hessian_at_trained: also estimate h at the best final center.
    seed: seed of data order, initialisation and noise.
    data_dir: Fashion-MNIST directory, or None.
  """
  problem: str = "network"
  tau: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
  alpha: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
  learning_rate: tuple[float, ...] = (0.1,)
  num_workers: tuple[int, ...] = (4,)
  num_steps: int = 300
  per_worker_batch_size: int = 32
  dataset: str = "mnist1d"
  model: str = "mlp"
  curvature: float = 1.0
  quadratic_spread: float = 0.5
  quadratic_sigma: float = 0.0
  divergence_factor: float = 1e3
  hessian_iterations: int = 100
  hessian_tol: float = 1e-4
  hessian_examples: int = 2000
  hessian_at_trained: bool = True
  seed: int = 0
  data_dir: str | None = None

  @property
  def grid(self) -> SweepGrid:
    return SweepGrid(self.tau, self.alpha, self.learning_rate, self.num_workers)

  def validate(self) -> "SweepConfig":
    """The config with a validated grid; raises SweepError (one line)."""
    if self.problem not in PROBLEMS:
      raise SweepError(f"unknown problem {self.problem!r}; allowed: "
                       f"{', '.join(PROBLEMS)}")
    g = self.grid.validate()
    _int_scalar("num_steps", self.num_steps, 1)
    _int_scalar("per_worker_batch_size", self.per_worker_batch_size, 1)
    _int_scalar("hessian_iterations", self.hessian_iterations, 0)
    _int_scalar("hessian_examples", self.hessian_examples, 1)
    _real_scalar("curvature", self.curvature, 0.0, True)
    _real_scalar("quadratic_spread", self.quadratic_spread, 0.0, False)
    _real_scalar("quadratic_sigma", self.quadratic_sigma, 0.0, False)
    _real_scalar("hessian_tol", self.hessian_tol, 0.0, True)
    _check_factor(self.divergence_factor)
    from easgd.data import DATASETS
    from easgd.models import MODELS
    if self.dataset not in DATASETS:
      raise SweepError(f"unknown dataset {self.dataset!r}; allowed: {', '.join(DATASETS)}")
    if self.model not in MODELS:
      raise SweepError(f"unknown model {self.model!r}; allowed: {', '.join(MODELS)}")
    _int_scalar("seed", self.seed, 0)
    if max(g.tau) > 2**30:
      raise SweepError(f"tau values must be at most 2**30 (int32 clocks), got {max(g.tau)}")
    return dataclasses.replace(self, tau=g.tau, alpha=g.alpha,
                               learning_rate=g.learning_rate, num_workers=g.num_workers)


def write_result(result: SweepResult, workdir, plots: bool = True) -> list[Path]:
  """Writes ``sweep.csv``, ``sweep.json`` and the heatmaps into ``workdir``."""
  from easgd.files import write_text_atomic
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  write_text_atomic(workdir / "sweep.csv", result.to_csv())
  write_text_atomic(workdir / "sweep.json",
                    json.dumps(result.to_json(), indent=1, default=_jsonable) + "\n")
  paths = [workdir / "sweep.csv", workdir / "sweep.json"]
  if plots:
    paths += plot_result(result, workdir, prefix="")
  return paths


def _jsonable(v):
  if isinstance(v, np.generic):
    return v.item()
  raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def run_sweep(config: SweepConfig, workdir, *, overwrite: bool = False,
              plots: bool = True) -> dict[str, SweepResult]:
  """Runs ``config`` and writes results to ``workdir`` (``easgd sweep``).

  With ``problem="both"`` the quadratic goes to ``workdir/quadratic`` and the
  network to ``workdir/network``; otherwise straight into ``workdir``. Each
  directory gets ``sweep.csv``, ``sweep.json`` (records, grid, curvature, wall
  and compile times, Hessian estimates) and ``<metric>.png`` heatmaps;
  ``workdir/sweep_config.json`` holds the resolved config.

  Raises:
    SweepError: invalid config. easgd.config.ConfigError: workdir holds a sweep
      and not ``overwrite``. DataError/ModelError: unknown data set or model.
  """
  from easgd.files import write_text_atomic
  from easgd.config import ConfigError
  config = config.validate()
  workdir = Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise ConfigError(f"workdir '{workdir}' exists and is not a directory")
  if not overwrite and (workdir / "sweep_config.json").exists():
    raise ConfigError(f"workdir '{workdir}' already holds a sweep; choose another "
                      "directory or pass --overwrite")
  problems = ("quadratic", "network") if config.problem == "both" else (config.problem,)
  workdir.mkdir(parents=True, exist_ok=True)
  results = {}
  for problem in problems:
    start = time.perf_counter()
    if problem == "quadratic":
      res = sweep_quadratic(config.grid, config.num_steps, curvature=config.curvature,
                            spread=config.quadratic_spread, sigma=config.quadratic_sigma,
                            seed=config.seed, divergence_factor=config.divergence_factor)
    else:
      res = sweep_network(config.grid, config.num_steps, dataset=config.dataset,
                          model=config.model,
                          per_worker_batch_size=config.per_worker_batch_size,
                          seed=config.seed, divergence_factor=config.divergence_factor,
                          data_dir=config.data_dir,
                          hessian_iterations=config.hessian_iterations,
                          hessian_tol=config.hessian_tol,
                          hessian_examples=config.hessian_examples,
                          hessian_at_trained=config.hessian_at_trained)
    res.info["total_wall_s"] = round(time.perf_counter() - start, 3)
    res.info["platform"] = jax.devices()[0].platform
    res.info["jax_version"] = jax.__version__
    write_result(res, workdir / problem if len(problems) > 1 else workdir, plots)
    results[problem] = res
  # written last: a sweep that fails leaves an earlier sweep's files consistent
  write_text_atomic(workdir / "sweep_config.json",
                    json.dumps(dataclasses.asdict(config), indent=2) + "\n")
  return results


def summarize(result: SweepResult) -> str:
  """A short text summary: divergence counts and agreement with the theory.

  ``diverged`` is the combined flag (workers or center, module docstring);
  the agreement counts configurations where it equals radius >= 1, for each
  certified curvature (at the start and, for a network, at the trained
  point). Hessian estimates that did not converge are reported as such.
  """
  recs = result.records
  div = sum(r["diverged"] for r in recs)
  workers = sum(r["workers_diverged"] for r in recs)
  center = sum(r["center_diverged"] for r in recs)
  center_only = sum(r["center_diverged"] and not r["workers_diverged"] for r in recs)
  lines = [f"{result.problem}: {len(recs)} configurations, {div} diverged "
           f"({workers} by the workers' loss, {center} by the center's, "
           f"{center_only} of them by the center's alone)"]
  for p, prog in result.info.get("programs", {}).items():
    lines.append(f"  p={p}: {prog['configs']} configs in one program, "
                 f"{prog['wall_s']:.2f} s wall ({prog['compiles']} compilations, "
                 f"{prog['compile_s']:.2f} s compiling)")
  for name, where in (("hessian_init", "the start"), ("hessian_trained", "the trained point")):
    est = result.info.get(name)
    if est and est.get("converged"):
      lines.append(f"  h at {where}: {est['h']:.4g} (residual {est['residual']:.2g} "
                   f"<= tol*|h|, {est['products']} Hessian-vector products)")
    elif est:
      got = ("no Ritz value" if est["h"] is None else
             f"estimate {est['h']:.4g}, residual {est['residual']:.2g} > tol*|h|")
      lines.append(f"  h at {where}: NOT converged in {est['products']} Hessian-vector "
                   f"products ({got}); no theory from it")
  for column, h, where in (("theory_radius", result.curvature, "h"),
                           ("theory_radius_trained",
                            certified_curvature(result.info.get("hessian_trained")),
                            "trained h")):
    known = [r for r in recs if r[column] is not None]
    if h is not None and known:
      agree = sum(r["diverged"] == (r[column] >= 1.0) for r in known)
      lines.append(f"  theory at {where}={h:.4g}: divergence agrees with "
                   f"radius >= 1 on {agree}/{len(known)} configurations")
  ok = [r for r in recs if not r["diverged"] and r["center_loss"] is not None]
  if ok:
    best = min(ok, key=lambda r: r["center_loss"])
    extra = (f", test accuracy {best['test_accuracy']:.4f}"
             if best["test_accuracy"] is not None else "")
    lines.append(f"  best: tau={best['tau']}, alpha={best['alpha']:g}, "
                 f"eta={best['learning_rate']:g}, p={best['num_workers']}: "
                 f"center loss {best['center_loss']:.4g}{extra}")
  return "\n".join(lines)


# ----------------------------------------------------------------------------
# Command line (``easgd sweep``; wired in easgd.cli)
# ----------------------------------------------------------------------------


def int_list(text: str) -> tuple[int, ...]:
  """``"1,2,4"`` -> (1, 2, 4) (argparse type; ranges are checked later)."""
  return tuple(int(t) for t in text.split(",") if t.strip())


def float_list(text: str) -> tuple[float, ...]:
  """``"0.1,0.5"`` -> (0.1, 0.5) (argparse type; ranges are checked later)."""
  return tuple(float(t) for t in text.split(",") if t.strip())


def _bool(text: str) -> bool:
  if text.lower() in ("1", "true", "yes", "on"):
    return True
  if text.lower() in ("0", "false", "no", "off"):
    return False
  raise ValueError(text)


def _optional_str(text: str) -> str | None:
  return None if text.lower() == "none" else text


_FLAG_TYPES = {"tau": int_list, "num_workers": int_list, "alpha": float_list,
               "learning_rate": float_list, "hessian_at_trained": _bool,
               "data_dir": _optional_str}


def add_sweep_arguments(parser) -> None:
  """Adds the ``easgd sweep`` flags: --workdir, --overwrite, --no-plots and one
  flag per :class:`SweepConfig` field (lists comma-separated)."""
  parser.add_argument("--workdir", required=True, help="output directory")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace an earlier sweep in --workdir")
  parser.add_argument("--no-plots", action="store_true", help="CSV and JSON only")
  group = parser.add_argument_group("sweep (SweepConfig fields; lists: 1,2,4)")
  defaults = SweepConfig()
  for f in dataclasses.fields(SweepConfig):
    default = getattr(defaults, f.name)
    kind = _FLAG_TYPES.get(f.name, type(default))
    extra = dict(choices=PROBLEMS) if f.name == "problem" else {}
    shown = ",".join(f"{v:g}" for v in default) if isinstance(default, tuple) else default
    group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind,
                       default=argparse.SUPPRESS, metavar=f.name.upper(),
                       help=f"default: {shown}", **extra)


def main_sweep(args) -> int:
  """Runs ``easgd sweep`` from parsed arguments; prints a summary; returns 0."""
  overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(SweepConfig)
               if hasattr(args, f.name)}
  config = SweepConfig(**overrides).validate()
  results = run_sweep(config, args.workdir, overwrite=args.overwrite,
                      plots=not args.no_plots)
  for res in results.values():
    print(summarize(res))
  print(f"results: {args.workdir}")
  return 0
