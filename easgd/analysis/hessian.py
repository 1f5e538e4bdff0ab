"""The largest Hessian eigenvalue of a loss: Lanczos (ARPACK) on Hessian-vector products.

The curvature h that the stability analysis (Section 4) reads as eta * h; the method and
its certificate (the residual bound): docs/guides/stability.md ("The curvature h").

References:
  B. Pearlmutter. Fast exact multiplication by the Hessian. Neural Computation 6(1), 1994.
  R. Lehoucq, D. Sorensen, C. Yang. ARPACK Users' Guide. SIAM 1998.
  B. Parlett. The Symmetric Eigenvalue Problem. SIAM 1998, Theorem 4.5.1.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, LinearOperator, eigsh

from easgd._util import checks

Params = Any

DENSE_MAX_PARAMETERS = 20
"""Up to this many parameters the Hessian is formed from n products (eigh)."""

LANCZOS_VECTORS = 20
"""ARPACK's ncv, Lanczos vectors per restart cycle (its default for k = 1)."""


def hvp(loss: Callable[[Params], jax.Array], params: Params, vector: Params) -> Params:
  r"""The Hessian-vector product H(params) v of a scalar loss, forward-over-reverse.

  .. math::

     H v = \frac{d}{d\epsilon} \nabla \mathrm{loss}(\mathrm{params} + \epsilon v) \Big|_{\epsilon = 0}

  Args:
    loss: ``loss(params) -> float scalar``, twice differentiable.
    params: the point, a pytree of float arrays.
    vector: the direction v, a pytree like ``params``.

  Returns:
    A pytree like ``params``: H v.

  Example:
    >>> float(hvp(lambda x: 0.5 * 3.0 * x ** 2, 1.0, 2.0))   # H = 3
    6.0

  References:
    Pearlmutter (1994).
  """
  return jax.jvp(jax.grad(loss), (params,), (vector,))[1]


class HessianEigen(NamedTuple):
  """Result of :func:`top_hessian_eigenvalue` (host values).

  Attributes:
    eigenvalue: float, the estimate of lambda_max (the largest, i.e. most
      positive, eigenvalue); NaN when the Lanczos iteration produced no Ritz
      value within the budget.
    eigenvector: unit-norm pytree like ``params`` (its dtype), the
      eigenvector estimate (NaN where ``eigenvalue`` is).
    iterations: int, Hessian-vector products used, including the one that
      measures the residual.
    converged: bool, ``residual <= tol * |eigenvalue|`` (module docstring).
    residual: float, ||H v - eigenvalue v||_2 for the unit vector v, measured
      with one more product (NaN with ``eigenvalue``). An eigenvalue of H lies
      within ``residual`` of ``eigenvalue``.
    method: ``"lanczos"`` (ARPACK) or ``"dense"`` (n <=
      :data:`DENSE_MAX_PARAMETERS`).
  """

  eigenvalue: float
  eigenvector: Params
  iterations: int
  converged: bool
  residual: float
  method: str


class _BudgetExhausted(Exception):
  """Raised inside the ARPACK operator when the product budget is used up."""


def _products(loss, params, vectors):
  """H v for every row of ``vectors`` [m, n] (flat), at ``params``."""
  flat, unravel = ravel_pytree(params)
  flat_loss = lambda x: loss(unravel(x))
  return jax.vmap(lambda v: hvp(flat_loss, flat, v))(vectors)


# ``loss`` travels as a jax.tree_util.Partial (a pytree), so one compiled
# program serves every call with the same loss function and shapes.
_products_jit = jax.jit(_products)


class _CountedProducts:
  """H v for every row of ``vectors`` [m, n], float64, at fixed ``params``.

  Counts the products taken (``used``) and whether every one was exactly 0
  (``all_zero``); raises ValueError on a product that is not finite.
  """

  def __init__(self, loss: jax.tree_util.Partial, params: Params, dtype: np.dtype):
    self.loss, self.params, self.dtype = loss, params, dtype
    self.used, self.all_zero = 0, True

  def __call__(self, vectors: np.ndarray) -> np.ndarray:
    self.used += vectors.shape[0]
    out = np.asarray(
        _products_jit(self.loss, self.params, np.asarray(vectors, self.dtype)), np.float64
    )
    if not np.all(np.isfinite(out)):
      raise ValueError(
          "the Hessian-vector product at params is not finite "
          "(the loss or its derivatives overflow there)"
      )
    self.all_zero = self.all_zero and not np.any(out)
    return out


def _dense_top(products: _CountedProducts, n: int) -> tuple[float, np.ndarray]:
  """(lambda_max, its eigenvector) of H from its n columns (``numpy.linalg.eigh``)."""
  h = products(np.eye(n))
  lam, vecs = np.linalg.eigh(0.5 * (h + h.T))
  return float(lam[-1]), vecs[:, -1]


def _lanczos_top(
    products: _CountedProducts, n: int, key: jax.Array, num_iterations: int, tol: float
) -> tuple[float, np.ndarray]:
  """(lambda_max, its Ritz vector) by ARPACK's Lanczos within ``num_iterations`` products.

  NaN (and a NaN vector) when the budget runs out or ARPACK does not
  converge; 0 (and the start vector) for H = 0.
  """

  def matvec(x):
    if products.used >= num_iterations:
      raise _BudgetExhausted
    return products(np.reshape(x, (1, n)))[0]

  v0 = np.asarray(jax.random.normal(key, (n,), np.float32), np.float64)
  ncv = max(2, min(LANCZOS_VECTORS, n, num_iterations))
  try:
    lam, vecs = eigsh(
        LinearOperator((n, n), matvec=matvec, dtype=np.float64),
        k=1,
        which="LA",
        v0=v0,
        ncv=ncv,
        maxiter=num_iterations,
        tol=tol,
    )
    return float(lam[0]), vecs[:, 0]
  except (_BudgetExhausted, ArpackNoConvergence):
    return math.nan, np.full(n, np.nan)
  except ArpackError:
    if not products.all_zero:
      raise
    return 0.0, v0  # H v0 = 0 for a random v0: H = 0 (ARPACK stops, info -9)


def top_hessian_eigenvalue(
    loss: Callable[[Params], jax.Array],
    params: Params,
    key: jax.Array,
    num_iterations: int = 100,
    tol: float = 1e-4,
) -> HessianEigen:
  """Estimates the largest eigenvalue of the Hessian of ``loss`` at ``params``.

  With n parameters and H = d^2 loss / d params^2 (applied by :func:`hvp`):

  - n > :data:`DENSE_MAX_PARAMETERS`: ARPACK's implicitly restarted Lanczos
    (``scipy.sparse.linalg.eigsh(LinearOperator(H), k=1, which="LA",
    ncv=max(2, min(20, num_iterations)), tol=tol)``) from the start vector
    v_0 ~ N(0, I) drawn with ``key``. ARPACK stops when its Ritz estimate
    satisfies ||H v - lambda v|| <= tol |lambda|; if it has not after
    ``num_iterations`` products, it is stopped and no Ritz value is returned
    (eigenvalue NaN). H = 0 (every product exactly 0) gives lambda = 0.
  - n <= :data:`DENSE_MAX_PARAMETERS`: H = [H e_1, ..., H e_n] from n
    products, symmetrised, and ``numpy.linalg.eigh`` (float64); ``key`` and
    ``num_iterations`` are not used.

  Either way the residual r = ||H v - lambda v||_2 of the returned unit vector
  is then measured with one more product, and ``converged = r <= tol |lambda|``
  (so some eigenvalue of H lies within tol |lambda| of the estimate). The
  products run in ``params``' dtype (float32 usually), which limits the
  attainable r to about 1e-6 ||H||: a ``tol`` far below that, or a
  lambda_max near 0 next to a large negative eigenvalue, gives
  ``converged=False``.

  Runs on the host: the products are one jitted program (compiled once per
  loss function and shapes; pass ``jax.tree_util.Partial(f, *data)`` to reuse
  it across data of the same shapes), ARPACK runs in NumPy. It cannot be
  called inside ``jax.jit``/``vmap``.

  Args:
    loss: ``loss(params) -> float scalar`` (e.g. the mean training loss of a
      fixed batch; no randomness inside, or the Hessian is not well defined).
    params: the point, a pytree of float arrays (not tracers).
    key: PRNG key of the Lanczos start vector.
    num_iterations: budget of Hessian-vector products for the Lanczos
      iteration, an integer >= 1 (each costs about two gradients; a restart
      cycle of ARPACK takes up to ncv of them).
    tol: relative residual tolerance, a finite real > 0 (see above).

  Returns:
    A :class:`HessianEigen`.

  Raises:
    ValueError: num_iterations not an integer >= 1, tol not a finite real > 0,
      params holding tracers (called under a JAX transformation), or a
      Hessian-vector product that is not finite.
    scipy.sparse.linalg.ArpackError: ARPACK failed for another reason than
      non-convergence (passed on unchanged).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> r = top_hessian_eigenvalue(lambda v: v[0] * v[1], jnp.ones(2),
    ...                            jax.random.key(0))   # eigenvalues +1, -1
    >>> round(r.eigenvalue, 6), r.converged
    (1.0, True)

  References:
    Pearlmutter (1994) for H v; Lehoucq, Sorensen, Yang, ARPACK Users' Guide
    (1998); Parlett (1998), Theorem 4.5.1 for the residual bound.
  """
  checks.integer("num_iterations", num_iterations, 1)
  checks.real("tol", tol, 0, open_low=True)
  if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(params)):
    raise ValueError(
        "top_hessian_eigenvalue runs on the host (SciPy ARPACK) and "
        "cannot be traced; call it outside jax.jit/vmap"
    )
  flat, unravel = ravel_pytree(params)
  n, dtype = int(flat.size), np.dtype(flat.dtype)
  if not isinstance(loss, jax.tree_util.Partial):
    loss = jax.tree_util.Partial(loss)
  products = _CountedProducts(loss, params, dtype)
  if n <= DENSE_MAX_PARAMETERS:
    method = "dense"
    lam, v = _dense_top(products, n)
  else:
    method = "lanczos"
    lam, v = _lanczos_top(products, n, key, num_iterations, tol)
  if math.isfinite(lam):
    v = v / np.linalg.norm(v)
    residual = float(np.linalg.norm(products(v[None])[0] - lam * v))
  else:
    residual = math.nan
  converged = bool(residual <= tol * abs(lam))  # False for NaN
  eigenvector = unravel(jnp.asarray(v, dtype))
  return HessianEigen(lam, eigenvector, products.used, converged, residual, method)


def curvature_estimate(
    loss: Callable[[Params], jax.Array],
    params: Params,
    key: jax.Array,
    num_iterations: int = 100,
    tol: float = 1e-4,
    *,
    examples: int | None = None,
) -> dict[str, Any]:
  """:func:`top_hessian_eigenvalue` as a JSON-ready record, timed.

  ``h`` is a certified eigenvalue only when ``converged``: ||H v - h v||_2 <=
  tol |h|; :func:`certified_curvature` returns it only then.

  Args:
    loss, params, key, num_iterations, tol: as :func:`top_hessian_eigenvalue`.
    examples: the number of examples in ``loss``, recorded when given.

  Returns:
    dict(h (None if no estimate), converged, residual (None if no estimate),
    tol, products (Hessian-vector products used), method, [examples,]
    seconds).

  Raises:
    ValueError: as :func:`top_hessian_eigenvalue`.
  """
  start = time.perf_counter()
  r = top_hessian_eigenvalue(loss, params, key, num_iterations, tol)
  finite = lambda v: v if math.isfinite(v) else None
  record = dict(
      h=finite(r.eigenvalue),
      converged=r.converged,
      residual=finite(r.residual),
      tol=tol,
      products=r.iterations,
      method=r.method,
  )
  if examples is not None:
    record["examples"] = int(examples)
  record["seconds"] = round(time.perf_counter() - start, 3)
  return record


def certified_curvature(estimate: dict[str, Any] | None) -> float | None:
  """h of a :func:`curvature_estimate` record if it converged, else None.

  The theory columns and the heatmaps' boundary of the sweeps use only
  certified values: an estimate with ||H v - h v||_2 > tol |h| need not be
  near an eigenvalue.

  Args:
    estimate: a :func:`curvature_estimate` record, or None (no estimate made).

  Returns:
    ``estimate["h"]`` (float) when ``estimate["converged"]``, else None.
  """
  if not estimate or not estimate.get("converged"):
    return None
  return estimate["h"]


class CurvatureWarning(UserWarning):
  """A Hessian estimate did not converge; the theory it feeds is left out."""


def warn_unconverged(estimate: dict[str, Any], where: str) -> None:
  """Issues a :class:`CurvatureWarning` when the :func:`curvature_estimate`
  record ``estimate`` (made at ``where``, e.g. "the initial parameters") did
  not converge; nothing otherwise."""
  if estimate.get("converged"):
    return
  residual = estimate.get("residual")
  got = (
      "no Ritz value"
      if estimate.get("h") is None
      else f"h={estimate['h']:.4g} with residual {residual:.3g} > tol*|h| = "
      f"{estimate['tol'] * abs(estimate['h']):.3g}"
  )
  warnings.warn(
      f"Hessian estimate at {where} did not converge within "
      f"{estimate['products']} Hessian-vector products ({got}); its theory "
      f"columns are left empty (raise hessian_iterations or hessian_tol)",
      CurvatureWarning,
      stacklevel=3,
  )
