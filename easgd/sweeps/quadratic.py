"""Synchronous EASGD on the quadratic F(x) = h x^2 / 2, simulated in JAX.

The same problem as :mod:`easgd.analysis.stability`, simulated instead of solved: p
scalar workers and a scalar center run ``easgd.core.algorithms.easgd``'s own step
(eq. 5-6 with communication period tau, plain-SGD local steps) on the loss
:func:`quadratic_loss`, u x^2 / 2 + xi x per worker. The workers are
``easgd.parallel.mapping.vmap_workers`` (the step's all-reduce runs over them), the
steps a ``lax.scan``, and an outer ``jax.vmap`` runs many configurations at
once: the algorithm is built inside it from the configuration's traced
alpha and tau (``easgd.sweeps.engine``), so one compiled program serves every
configuration of a given count.

Functions:
  :func:`simulate_sync_easgd`       center trajectories (or final values).
  :func:`estimate_spectral_radius`  empirical period spectral radius (power
                                    iteration on the simulated dynamics).
  :func:`sweep_quadratic`           the (learning_rate, tau, alpha) grid with
                                    its divergence flags and theory columns
                                    (``easgd.sweeps.engine``, ``easgd.sweeps.grid``).

The compiled kernels (module-level ``jax.jit``) are specialised on
``num_workers``, ``num_steps`` and the number of configurations only.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6), Section 4.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from easgd._util import checks
from easgd.core import algorithms
from easgd.sweeps.engine import (
    SweepError,
    check_factor,
    check_int,
    check_real,
    make_sweep_fn,
    simulated_params,
    simulated_step,
    start_state,
)
from easgd.sweeps.grid import (
    SweepGrid,
    SweepResult,
    check_memory,
    check_num_steps,
    run_grid,
    sweep_result,
)


def quadratic_loss(x, batch, key):
  """u x^2 / 2 + xi x for one scalar worker, ``batch = (u, xi)``; gradient u x + xi.

  With ``optax.sgd(eta)`` and u = h, xi the gradient noise, this is SGD on
  F(x) = h x^2 / 2 with noisy gradients; with ``optax.sgd(1)``, u = eta h and
  xi = eta times the noise it is the same step (the loss scaled by eta),
  which is how :func:`simulate_sync_easgd` runs a configuration given eta*h.
  """
  del key
  u, noise = batch
  return 0.5 * u * x * x + noise * x


def _sync_easgd(alpha, tau, num_workers):
  """EASGD with plain-SGD step 1 on :func:`quadratic_loss` (eta folded into u and xi)."""
  return algorithms.easgd(
      quadratic_loss, num_workers=num_workers, learning_rate=1.0, tau=tau, alpha=alpha
  )


def _run_one(
    eta_h, alpha, tau, noise_scale, state0, key, *, num_workers, num_steps, noisy, normalize
):
  """Scans ``num_steps`` steps of one configuration (scalars, state (p + 1,)).

  Returns the final workers and center, the per-step outputs (center after
  step t + 1, cumulative log-norm). With ``normalize`` the state (every float
  leaf of the algorithm's states) is rescaled to unit norm of (x^1, ..., x^p,
  x~) after every step (valid for the noise-free linear dynamics: power
  iteration).
  """
  p = num_workers
  algorithm = _sync_easgd(alpha, tau, p)
  step = simulated_step(algorithm, p)
  params_of = simulated_params(algorithm, p)
  step_key = jax.random.key(0)  # the loss draws nothing; the noise comes as batch
  curvature = jnp.broadcast_to(eta_h, (p,))

  def body(carry, t):
    worker, shared, log_norm = carry
    if noisy:
      noise = noise_scale * jax.random.normal(jax.random.fold_in(key, t), (p,), state0.dtype)
    else:
      noise = jnp.zeros((p,), state0.dtype)
    worker, shared, _ = step(worker, shared, (curvature, noise), step_key)
    if normalize:
      x, c = params_of(worker, shared), algorithm.center(shared)
      norm = jnp.maximum(jnp.sqrt(jnp.sum(x * x) + c * c), jnp.finfo(x.dtype).tiny)
      scale = lambda a: a / norm if jnp.issubdtype(a.dtype, jnp.floating) else a
      worker, shared = jax.tree.map(scale, (worker, shared))
      log_norm = log_norm + jnp.log(norm)
    return (worker, shared, log_norm), (algorithm.center(shared), log_norm)

  worker, shared = start_state(algorithm, state0[:p], state0[p])
  (worker, shared, _), (centers, log_norms) = lax.scan(
      body, (worker, shared, jnp.zeros((), state0.dtype)), jnp.arange(num_steps, dtype=jnp.int32)
  )
  return params_of(worker, shared), algorithm.center(shared), centers, log_norms


@functools.partial(jax.jit, static_argnames=("num_workers", "num_steps", "noisy", "trajectory"))
def _simulate_flat(
    eta_h, alpha, tau, noise_scale, state0, keys, *, num_workers, num_steps, noisy, trajectory
):
  def one(eta_h, alpha, tau, noise_scale, state0, key):
    x, c, centers, _ = _run_one(
        eta_h,
        alpha,
        tau,
        noise_scale,
        state0,
        key,
        num_workers=num_workers,
        num_steps=num_steps,
        noisy=noisy,
        normalize=False,
    )
    if trajectory:
      centers = jnp.concatenate([state0[num_workers:], centers])
    return x, c, centers if trajectory else c

  return jax.vmap(one)(eta_h, alpha, tau, noise_scale, state0, keys)


@functools.partial(jax.jit, static_argnames=("num_workers", "num_periods", "max_tau"))
def _radius_flat(eta_h, alpha, tau, state0, *, num_workers, num_periods, max_tau):
  def one(eta_h, alpha, tau, state0):
    state0 = state0 / jnp.linalg.norm(state0)
    _, _, _, log_norms = _run_one(
        eta_h,
        alpha,
        tau,
        0.0,
        state0,
        None,
        num_workers=num_workers,
        num_steps=num_periods * max_tau,
        noisy=False,
        normalize=True,
    )
    # log ||state|| after k periods is log_norms[k tau - 1] (start has norm 1).
    k1, k2 = num_periods // 2, num_periods
    rate = (log_norms[k2 * tau - 1] - log_norms[k1 * tau - 1]) / (k2 - k1)
    return jnp.exp(rate)

  return jax.vmap(one)(eta_h, alpha, tau, state0)


class QuadraticRun(NamedTuple):
  """Result of :func:`simulate_sync_easgd` for a batch of configurations.

  Attributes:
    center: float32, config_shape + (num_steps + 1,) (the center x~_t for
      t = 0..num_steps) if ``trajectory``, else config_shape (x~ at num_steps).
    workers: float32 config_shape + (num_workers,), the workers x^i at
      num_steps.
  """

  center: jax.Array
  workers: jax.Array


def simulate_sync_easgd(
    eta_h,
    alpha,
    tau,
    num_workers: int,
    num_steps: int,
    x0=1.0,
    key: jax.Array | None = None,
    sigma=0.0,
    eta=None,
    trajectory: bool = True,
) -> QuadraticRun:
  """Simulates synchronous EASGD on F(x) = h x^2 / 2 for many configurations.

  Each configuration runs, from clock t = 0,

      g^i_t = h x^i_t + xi^i_t,   xi^i_t ~ N(0, sigma^2) iid over i, t, configs
      exchange (tau | t):  x^i_{t+1} = x^i_t - eta g^i_t - alpha (x^i_t - x~_t)   (5)
                           x~_{t+1}  = x~_t + alpha sum_i (x^i_t - x~_t)           (6)
      otherwise:           x^i_{t+1} = x^i_t - eta g^i_t,  x~_{t+1} = x~_t

  as the step of ``easgd.core.algorithms.easgd`` with ``optax.sgd(1)`` on
  :func:`quadratic_loss` with u = eta h and the noise scaled by eta (eta
  times F: the same step as SGD of size eta on F), built inside the
  configurations' ``vmap`` from the traced alpha and tau; the workers are
  ``easgd.parallel.mapping.vmap_workers``, the steps a ``lax.scan``. Only eta*h enters
  the noise-free part; eta scales the noise.

  Args:
    eta_h: u = eta * h, finite reals, any shape.
    alpha: moving rate, finite reals.
    tau: communication periods, integers >= 1.
    num_workers: p, a Python integer >= 1 (static).
    num_steps: number of steps, a Python integer >= 0 (static).
    x0: start, broadcastable to config_shape + (p + 1,) with the last axis
      (x^1, ..., x^p, x~); a scalar starts every worker and the center there.
    key: a JAX PRNG key; required when sigma > 0 (split per configuration,
      folded with the step).
    sigma: gradient-noise standard deviation(s) >= 0 (gradient units).
    eta: learning rate(s) > 0; required when any sigma > 0 (noise on x is
      eta * sigma).
    trajectory: return the whole center trajectory (default) or only the end.
    eta_h, alpha, tau, sigma, eta and x0[..., 0] broadcast together to
    config_shape.

  Returns:
    A :class:`QuadraticRun` (float32).

  Raises:
    ValueError: non-finite or out-of-range values (named), sigma > 0 without
      key or eta, x0 not broadcastable.

  Example:
    >>> run = simulate_sync_easgd([0.1, 2.5], 0.2, 1, num_workers=4,
    ...                           num_steps=100)
    >>> run.center.shape
    (2, 101)

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6), Algorithm 1 (period tau).
  """
  p = checks.integer("num_workers", num_workers, 1)
  num_steps = checks.integer("num_steps", num_steps, 0)
  u = checks.real_array("eta_h", eta_h)
  a = checks.real_array("alpha", alpha)
  t = checks.integer_array("tau", tau, 1)
  s = checks.real_array("sigma", sigma, 0.0)
  noisy = bool(np.any(s > 0))
  if noisy:
    if key is None:
      raise ValueError("key must be a JAX PRNG key when sigma > 0, got None")
    if eta is None:
      raise ValueError("eta (learning rate > 0) is required when sigma > 0, " "got None")
  e = checks.real_array("eta", 1.0 if eta is None else eta, 0.0, open_low=True)
  x0 = checks.real_array("x0", x0)
  try:
    shape = np.broadcast_shapes(
        u.shape, a.shape, t.shape, s.shape, e.shape, x0.shape[:-1] if x0.ndim else ()
    )
    x0 = np.broadcast_to(x0 if x0.ndim else x0[None], shape + (p + 1,))
  except ValueError:
    raise ValueError(
        f"x0 of shape {x0.shape} does not broadcast to "
        f"config_shape + (num_workers + 1,) = (..., {p + 1})"
    ) from None
  n = int(np.prod(shape))
  flat = lambda v, dt: jnp.asarray(np.broadcast_to(v, shape).reshape(n), dt)
  keys = jax.random.split(key, n) if noisy else jnp.zeros((n, 2), jnp.uint32)
  x, c, centers = _simulate_flat(
      flat(u, jnp.float32),
      flat(a, jnp.float32),
      flat(t, jnp.int32),
      flat(s * e, jnp.float32),
      jnp.asarray(x0.reshape(n, p + 1), jnp.float32),
      keys,
      num_workers=p,
      num_steps=num_steps,
      noisy=noisy,
      trajectory=bool(trajectory),
  )
  centers = centers.reshape(shape + ((num_steps + 1,) if trajectory else ()))
  return QuadraticRun(centers, x.reshape(shape + (p,)))


def estimate_spectral_radius(
    eta_h, alpha, tau, num_workers: int, num_periods: int = 200, key: jax.Array | None = None
) -> jax.Array:
  """Empirical spectral radius of one period, by power iteration on the simulation.

  From a random start s_0 (standard normal, per configuration) the noise-free
  dynamics run ``num_periods * max(tau)`` steps, the state rescaled to unit norm
  after every step (the map is linear, so this is power iteration with the
  logs of the norms accumulated). With K = num_periods,

      rho_hat = exp( (log ||P^K s_0|| - log ||P^(K//2) s_0||) / (K - K//2) ),

  which tends to the spectral radius of the period map P (both log-norms are
  read at period boundaries of each configuration's own tau). The error is
  O(1/K) from oscillating complex pairs or a Jordan block, plus
  (second / first eigenvalue modulus)^(K/2).

  Args:
    eta_h: u = eta * h, finite reals, any shape.
    alpha: moving rate, finite reals.
    tau: communication periods, integers >= 1 (concrete: max(tau) sets the
      number of steps).
    num_workers: p, an integer >= 1.
    num_periods: K, an integer >= 2.
    key: PRNG key for the random starts; default ``jax.random.key(0)``.
    eta_h, alpha, tau broadcast together to config_shape.

  Returns:
    float32 array of config_shape.

  Raises:
    ValueError: invalid values (named).

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6), Section 4.
  """
  p = checks.integer("num_workers", num_workers, 1)
  num_periods = checks.integer("num_periods", num_periods, 2)
  u = checks.real_array("eta_h", eta_h)
  a = checks.real_array("alpha", alpha)
  t = checks.integer_array("tau", tau, 1)
  shape = np.broadcast_shapes(u.shape, a.shape, t.shape)
  n = int(np.prod(shape))
  key = jax.random.key(0) if key is None else key
  state0 = jax.random.normal(key, (n, p + 1), jnp.float32)
  flat = lambda v, dt: jnp.asarray(np.broadcast_to(v, shape).reshape(n), dt)
  radius = _radius_flat(
      flat(u, jnp.float32),
      flat(a, jnp.float32),
      flat(t, jnp.int32),
      state0,
      num_workers=p,
      num_periods=num_periods,
      max_tau=int(t.max()),
  )
  return radius.reshape(shape)


# ----------------------------------------------------------------------------
# The (learning_rate, tau, alpha) sweep on F(x) = h x^2 / 2
# ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _quadratic_program(num_workers: int, num_steps: int):
  def eval_fn(center, h):
    return dict(center_loss=0.5 * h * center * center)

  build = functools.partial(algorithms.easgd, quadratic_loss, num_workers=num_workers)
  return make_sweep_fn(build, num_workers, num_steps, eval_fn)


def quadratic_start(
    num_workers: int, x0: float = 1.0, spread: float = 0.5
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
  return (x0 * (1.0 + spread * (2.0 * i / (num_workers - 1) - 1.0))).astype(np.float32), float(x0)


def check_quadratic(grid: SweepGrid, num_steps) -> int:
  """Checks the length and memory of a quadratic sweep, before anything is built.

  Every step's inputs are held at once: the curvature and the noise draw of
  each worker (two float32, 8 bytes; ``easgd.sweeps.grid.check_memory``). Arguments,
  return value and errors as ``easgd.sweeps.grid.check_num_steps``, and a
  ``SweepError`` for a memory estimate above ``easgd.sweeps.grid.MAX_SWEEP_BYTES``.
  """
  num_steps = check_num_steps(grid, num_steps)
  check_memory("quadratic", grid, num_steps, 8, 4, "curvature and noise (2 float32)")
  return num_steps


def sweep_quadratic(
    grid: SweepGrid,
    num_steps: int,
    *,
    curvature: float = 1.0,
    x0: float = 1.0,
    spread: float = 0.5,
    sigma: float = 0.0,
    seed: int = 0,
    divergence_factor: float = 1e3,
) -> SweepResult:
  """Sweeps synchronous EASGD on F(x) = h x^2 / 2 over a grid, one program per p.

  Each configuration runs ``easgd.core.algorithms.easgd``'s step (eq. 5-6 with
  communication period tau, plain-SGD step eta) on scalar workers with the
  loss :func:`quadratic_loss` (u = h), gradient g^i_t = h x^i_t + xi^i_t with
  xi ~ N(0, sigma^2) iid over workers and steps (the same draws for every
  configuration), from :func:`quadratic_start`, in one program of
  ``easgd.sweeps.engine.make_sweep_fn`` (divergence flags there).
  ``center_loss`` is F(x~) = h x~^2 / 2 at the end; ``theory_radius`` is the
  period spectral radius at eta*h (``easgd.analysis.stability.sync_easgd_spectral_radius``).

  Args:
    grid: the configurations (validated here).
    num_steps: local steps, an integer in [1, 2**31 - 1], at least every tau of
      the grid (:func:`check_quadratic`).
    curvature: h > 0.
    x0: start value (finite, non-zero so that the loss can grow).
    spread: relative spread of the worker starts, finite >= 0.
    sigma: gradient-noise standard deviation >= 0.
    seed: seed of the noise draws, an integer in [0, 2**32 - 1].
    divergence_factor: c > 1; a configuration diverges when its mean worker
      loss exceeds c x its step-0 value, or its center's loss F(x~) after the
      last step exceeds c x F(x0) (``easgd.sweeps.engine``: ``workers_diverged``,
      ``center_diverged``).

  Returns:
    A :class:`~easgd.sweeps.grid.SweepResult` with ``problem="quadratic"``.

  Raises:
    SweepError: invalid grid or settings (named in the message), a tau of
      the grid longer than num_steps, or a sweep above the memory limit
      (:func:`check_quadratic`); all before anything is compiled.

  Example:
    >>> res = sweep_quadratic(SweepGrid(tau=(1, 4), alpha=(0.1, 0.9)), 200)
    >>> [r["diverged"] for r in res.records]
    [False, True, False, True]

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Section 4.
  """
  grid = grid.validate()
  num_steps = check_quadratic(grid, num_steps)
  h = check_real("curvature", curvature, 0.0, True)
  spread = check_real("spread", spread, 0.0, False)
  sigma = check_real("sigma", sigma, 0.0, False)
  factor = check_factor(divergence_factor)
  seed = check_int("seed", seed, 0, 2**32 - 1)
  if not (checks.is_python_number(x0) and math.isfinite(x0) and x0 != 0):
    raise SweepError(f"x0 must be a finite non-zero real, got {x0!r}")
  x0 = float(x0)

  def inputs(p):
    w0, c0 = quadratic_start(p, x0, spread)
    noise = sigma * jax.random.normal(jax.random.key(seed), (num_steps, p), jnp.float32)
    hs = jnp.full((num_steps, p), h, jnp.float32)
    return (jnp.asarray(w0), jnp.float32(c0), (hs, noise), jnp.float32(h), jax.random.key(seed))

  outputs, programs = run_grid(grid, lambda p: _quadratic_program(p, num_steps), inputs, factor)
  centers = {p: np.asarray(out["center"]) for p, out in outputs.items()}
  info = dict(
      programs=programs,
      num_steps=num_steps,
      curvature=h,
      x0=x0,
      spread=spread,
      sigma=sigma,
      seed=seed,
      divergence_factor=factor,
  )
  return sweep_result("quadratic", grid, outputs, h, None, info, centers)
