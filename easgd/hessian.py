"""The largest Hessian eigenvalue of a loss, by power iteration on Hessian-vector products.

The stability analysis of :mod:`easgd.stability` is for the quadratic
F(x) = h x^2 / 2, where a gradient step of size eta multiplies x by (1 - eta h).
For a neural network the curvature that matters for divergence is the largest
eigenvalue h = lambda_max of the Hessian of the training loss; this module
estimates it without forming the Hessian:

    H v = d/de grad L(x + e v) |_{e=0}          (``jax.jvp`` of ``jax.grad``)

so one product costs about two gradient evaluations and memory linear in the
number of parameters. Everything is pure: no ``jit`` inside (callers compile).

Functions:
  :func:`hvp`                    one Hessian-vector product of a pytree loss.
  :func:`top_hessian_eigenvalue` power iteration (fixed iteration budget and a
                                 relative tolerance) with a shift for the case
                                 where a negative eigenvalue dominates.

References:
  B. Pearlmutter. Fast exact multiplication by the Hessian. Neural Computation
  6(1), 1994 (the Hessian-vector product).
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Section 4 (read eta as eta * h).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

Params = Any


def hvp(loss: Callable[[Params], jax.Array], params: Params, vector: Params
        ) -> Params:
  """The Hessian-vector product H(params) v of a scalar loss, forward-over-reverse.

      H v = d/de [grad loss](params + e v) at e = 0

  Args:
    loss: ``loss(params) -> float scalar``, twice differentiable.
    params: the point, a pytree of float arrays.
    vector: the direction v, a pytree like ``params``.

  Returns:
    A pytree like ``params``: H v.

  Example:
    >>> float(hvp(lambda x: 0.5 * 3.0 * x ** 2, 1.0, 2.0))   # H = 3
    6.0
  """
  return jax.jvp(jax.grad(loss), (params,), (vector,))[1]


class HessianEigen(NamedTuple):
  """Result of :func:`top_hessian_eigenvalue`.

  Attributes:
    eigenvalue: float32 scalar, the estimate of lambda_max (the largest, i.e.
      most positive, eigenvalue).
    eigenvector: unit-norm pytree like ``params``, its eigenvector estimate.
    iterations: int32 scalar, power iterations used in the final pass.
    converged: bool scalar, whether the relative change of the estimate fell
      below ``tol`` within ``num_iterations``.
    dominant: float32 scalar, the eigenvalue of largest magnitude found by the
      first pass (differs from ``eigenvalue`` when a negative eigenvalue
      dominates and the shifted pass was needed).
  """
  eigenvalue: jax.Array
  eigenvector: Params
  iterations: jax.Array
  converged: jax.Array
  dominant: jax.Array


def _power_iteration(matvec, v0, num_iterations, tol):
  """Power iteration on a flat vector: (rayleigh, v, iterations, converged)."""
  def cond(carry):
    i, _, _, done = carry
    return jnp.logical_and(i < num_iterations, jnp.logical_not(done))

  def body(carry):
    i, v, lam, _ = carry
    w = matvec(v)
    new_lam = jnp.vdot(v, w)  # Rayleigh quotient, ||v|| = 1
    norm = jnp.linalg.norm(w)
    new_v = jnp.where(norm > 0, w / jnp.where(norm > 0, norm, 1.0), v)
    done = jnp.abs(new_lam - lam) <= tol * jnp.abs(new_lam)
    return i + 1, new_v, new_lam, done

  v0 = v0 / jnp.linalg.norm(v0)
  init = (jnp.int32(0), v0, jnp.asarray(jnp.inf, v0.dtype), jnp.bool_(False))
  i, v, lam, done = lax.while_loop(cond, body, init)
  return jnp.vdot(v, matvec(v)), v, i, done


def top_hessian_eigenvalue(loss: Callable[[Params], jax.Array], params: Params,
                           key: jax.Array, num_iterations: int = 100,
                           tol: float = 1e-4) -> HessianEigen:
  """Estimates the largest eigenvalue of the Hessian of ``loss`` at ``params``.

  Power iteration from a random unit vector v_0:

      w = H v_k,   lambda_k = v_k . w,   v_{k+1} = w / ||w||

  stopping when |lambda_k - lambda_{k-1}| <= tol |lambda_k| or after
  ``num_iterations`` products. Power iteration finds the eigenvalue of largest
  MAGNITUDE; if that one is negative (lambda_dom < 0), a second pass runs on the
  shifted operator H - lambda_dom I, whose dominant eigenvalue is
  lambda_max - lambda_dom >= 0, and lambda_max is recovered by adding
  lambda_dom back. The final Rayleigh quotient is returned.

  Convergence is geometric in |lambda_2 / lambda_1|; with a small gap the
  estimate after ``num_iterations`` is a lower bound (a Rayleigh quotient never
  exceeds lambda_max).

  Args:
    loss: ``loss(params) -> float32 scalar`` (e.g. the mean training loss of a
      fixed batch; no randomness inside, or the Hessian is not well defined).
    params: the point, a pytree of float arrays.
    key: PRNG key for the start vector.
    num_iterations: maximum power iterations per pass, an integer >= 1 (each
      costs one Hessian-vector product, about two gradients).
    tol: relative tolerance on the eigenvalue between iterations, >= 0.

  Returns:
    A :class:`HessianEigen`.

  Raises:
    ValueError: num_iterations not an integer >= 1, or tol not a finite real
      >= 0.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> a = jnp.diag(jnp.array([1.0, 4.0, -2.0]))
    >>> r = top_hessian_eigenvalue(lambda x: 0.5 * x @ a @ x, jnp.ones(3),
    ...                            jax.random.key(0))
    >>> round(float(r.eigenvalue), 3)
    4.0

  References:
    Pearlmutter (1994) for H v; Golub & Van Loan, Matrix Computations, 7.3.1
    (the power method).
  """
  if (isinstance(num_iterations, bool) or not isinstance(num_iterations, numbers.Integral)
      or num_iterations < 1):
    raise ValueError(f"num_iterations must be an integer >= 1, got {num_iterations!r}")
  if (isinstance(tol, bool) or not isinstance(tol, numbers.Real)
      or not 0 <= tol < float("inf")):
    raise ValueError(f"tol must be a finite real >= 0, got {tol!r}")
  flat, unravel = ravel_pytree(params)
  flat_loss = lambda x: loss(unravel(x))

  def matvec(v):
    return hvp(flat_loss, flat, v.astype(flat.dtype))

  v0 = jax.random.normal(key, flat.shape, flat.dtype)
  lam, v, iters, done = _power_iteration(matvec, v0, num_iterations, tol)

  def shifted(_):
    lam_s, v_s, it_s, done_s = _power_iteration(
        lambda x: matvec(x) - lam * x, v0, num_iterations, tol)
    return lam_s + lam, v_s, it_s, done_s

  top, v, iters, done = lax.cond(lam < 0, shifted,
                                 lambda _: (lam, v, iters, done), None)
  return HessianEigen(top, unravel(v), iters, done, lam)
