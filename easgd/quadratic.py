"""JAX simulations of synchronous EASGD on the quadratic F(x) = h x^2 / 2.

The same problem as :mod:`easgd.stability`, simulated instead of solved: p
scalar workers and a scalar center run the rule of :func:`easgd.elastic.
easgd_update` (eq. 5-6 with communication period tau), with the gradient step
u = -(eta h) x^i - eta xi^i (xi the gradient noise, variance sigma^2). The
workers are a ``jax.vmap`` with a named axis (the rule's ``psum`` runs over
it), the steps a ``lax.scan``, and an outer ``jax.vmap`` runs many
configurations at once: eta*h, alpha, tau, sigma, eta and the start are traced
arrays, so one compiled program serves every configuration of a given count.

Functions:
  :func:`simulate_sync_easgd`       center trajectories (or final values).
  :func:`estimate_spectral_radius`  empirical period spectral radius (power
                                    iteration on the simulated dynamics).

The compiled kernels (module-level ``jax.jit``) are specialised on
``num_workers``, ``num_steps`` and the number of configurations only.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6), Section 4.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from easgd import elastic, stability

WORKER_AXIS = "quadratic_workers"
"""Axis name of the simulated workers (the rule's all-reduce runs over it)."""


# The same input checks as the analytic module, so both raise the same messages.
_check_int = stability._int_scalar
_check_reals = stability._real_array


def _check_tau(tau) -> np.ndarray:
  return stability._int_array("tau", tau, 1)


def _worker_step(x, center, eta_h, alpha, exchange, noise):
  """One worker's step of eq. (5)-(6) on h x^2/2: update = -(eta h) x - eta xi."""
  updates = -eta_h * x - noise
  return elastic.easgd_update(x, updates, center, alpha, exchange, WORKER_AXIS)


_all_workers_step = jax.vmap(_worker_step, in_axes=(0, None, None, None, None, 0),
                             out_axes=(0, None), axis_name=WORKER_AXIS)


def _run_one(eta_h, alpha, tau, noise_scale, state0, key, *, num_workers,
             num_steps, noisy, normalize):
  """Scans ``num_steps`` steps of one configuration (scalars, state (p + 1,)).

  Returns per-step outputs (center after step t + 1, cumulative log-norm) and
  the final state. With ``normalize`` the state is rescaled to unit norm after
  every step (valid for the noise-free linear dynamics: power iteration).
  """
  p = num_workers

  def body(carry, t):
    x, c, log_norm = carry
    if noisy:
      noise = noise_scale * jax.random.normal(jax.random.fold_in(key, t), (p,),
                                              x.dtype)
    else:
      noise = jnp.zeros_like(x)
    x, c = _all_workers_step(x, c, eta_h, alpha,
                             elastic.is_exchange_step(t, tau), noise)
    if normalize:
      norm = jnp.sqrt(jnp.sum(x * x) + c * c)
      norm = jnp.maximum(norm, jnp.finfo(x.dtype).tiny)
      x, c, log_norm = x / norm, c / norm, log_norm + jnp.log(norm)
    return (x, c, log_norm), (c, log_norm)

  init = (state0[:p], state0[p], jnp.zeros((), state0.dtype))
  (x, c, _), (centers, log_norms) = lax.scan(
      body, init, jnp.arange(num_steps, dtype=jnp.int32))
  return x, c, centers, log_norms


@functools.partial(jax.jit, static_argnames=("num_workers", "num_steps", "noisy",
                                             "trajectory"))
def _simulate_flat(eta_h, alpha, tau, noise_scale, state0, keys, *, num_workers,
                   num_steps, noisy, trajectory):
  def one(eta_h, alpha, tau, noise_scale, state0, key):
    x, c, centers, _ = _run_one(eta_h, alpha, tau, noise_scale, state0, key,
                                num_workers=num_workers, num_steps=num_steps,
                                noisy=noisy, normalize=False)
    if trajectory:
      centers = jnp.concatenate([state0[num_workers:], centers])
    return x, c, centers if trajectory else c

  return jax.vmap(one)(eta_h, alpha, tau, noise_scale, state0, keys)


@functools.partial(jax.jit, static_argnames=("num_workers", "num_periods",
                                             "max_tau"))
def _radius_flat(eta_h, alpha, tau, state0, *, num_workers, num_periods,
                 max_tau):
  def one(eta_h, alpha, tau, state0):
    state0 = state0 / jnp.linalg.norm(state0)
    _, _, _, log_norms = _run_one(
        eta_h, alpha, tau, 0.0, state0, None, num_workers=num_workers,
        num_steps=num_periods * max_tau, noisy=False, normalize=True)
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


def simulate_sync_easgd(eta_h, alpha, tau, num_workers: int, num_steps: int,
                        x0=1.0, key: jax.Array | None = None, sigma=0.0,
                        eta=None, trajectory: bool = True) -> QuadraticRun:
  """Simulates synchronous EASGD on F(x) = h x^2 / 2 for many configurations.

  Each configuration runs, from clock t = 0,

      g^i_t = h x^i_t + xi^i_t,   xi^i_t ~ N(0, sigma^2) iid over i, t, configs
      exchange (tau | t):  x^i_{t+1} = x^i_t - eta g^i_t - alpha (x^i_t - x~_t)   (5)
                           x~_{t+1}  = x~_t + alpha sum_i (x^i_t - x~_t)           (6)
      otherwise:           x^i_{t+1} = x^i_t - eta g^i_t,  x~_{t+1} = x~_t

  through :func:`easgd.elastic.easgd_update` (workers vmapped over
  :data:`WORKER_AXIS`, steps in ``lax.scan``, configurations in an outer vmap).
  Only eta*h enters the noise-free part; eta scales the noise.

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
  p = _check_int("num_workers", num_workers, 1)
  num_steps = _check_int("num_steps", num_steps, 0)
  u = _check_reals("eta_h", eta_h)
  a = _check_reals("alpha", alpha)
  t = _check_tau(tau)
  s = _check_reals("sigma", sigma, minimum=0.0)
  noisy = bool(np.any(s > 0))
  if noisy:
    if key is None:
      raise ValueError("key must be a JAX PRNG key when sigma > 0, got None")
    if eta is None:
      raise ValueError("eta (learning rate > 0) is required when sigma > 0, "
                       "got None")
  e = _check_reals("eta", 1.0 if eta is None else eta, minimum=0.0, strictly=True)
  x0 = _check_reals("x0", x0)
  try:
    shape = np.broadcast_shapes(u.shape, a.shape, t.shape, s.shape, e.shape,
                                x0.shape[:-1] if x0.ndim else ())
    x0 = np.broadcast_to(x0 if x0.ndim else x0[None], shape + (p + 1,))
  except ValueError:
    raise ValueError(f"x0 of shape {x0.shape} does not broadcast to "
                     f"config_shape + (num_workers + 1,) = (..., {p + 1})") from None
  n = int(np.prod(shape))
  flat = lambda v, dt: jnp.asarray(np.broadcast_to(v, shape).reshape(n), dt)
  keys = (jax.random.split(key, n) if noisy else
          jnp.zeros((n, 2), jnp.uint32))
  x, c, centers = _simulate_flat(
      flat(u, jnp.float32), flat(a, jnp.float32), flat(t, jnp.int32),
      flat(s * e, jnp.float32), jnp.asarray(x0.reshape(n, p + 1), jnp.float32),
      keys, num_workers=p, num_steps=num_steps, noisy=noisy,
      trajectory=bool(trajectory))
  centers = centers.reshape(shape + ((num_steps + 1,) if trajectory else ()))
  return QuadraticRun(centers, x.reshape(shape + (p,)))


def estimate_spectral_radius(eta_h, alpha, tau, num_workers: int,
                             num_periods: int = 200,
                             key: jax.Array | None = None) -> jax.Array:
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
  p = _check_int("num_workers", num_workers, 1)
  num_periods = _check_int("num_periods", num_periods, 2)
  u = _check_reals("eta_h", eta_h)
  a = _check_reals("alpha", alpha)
  t = _check_tau(tau)
  shape = np.broadcast_shapes(u.shape, a.shape, t.shape)
  n = int(np.prod(shape))
  key = jax.random.key(0) if key is None else key
  state0 = jax.random.normal(key, (n, p + 1), jnp.float32)
  flat = lambda v, dt: jnp.asarray(np.broadcast_to(v, shape).reshape(n), dt)
  radius = _radius_flat(flat(u, jnp.float32), flat(a, jnp.float32),
                        flat(t, jnp.int32), state0, num_workers=p,
                        num_periods=num_periods, max_tau=int(t.max()))
  return radius.reshape(shape)
