"""Analytic stability of EASGD and round-robin ADMM on one-dimensional quadratics.

NumPy/SciPy only (no JAX): every map here is a small real matrix, built in
closed form and reduced to a spectral radius. Functions that take ``eta_h``,
``alpha``, ``tau``, ... as arrays broadcast them with NumPy semantics and return
arrays of the broadcast shape, so whole (eta*h, alpha) or (tau, alpha) grids are
evaluated in one call. ``paper_notes/stability.md`` has the derivations.

Model (Section 4 of the paper): F(x) = h x^2 / 2 in one dimension; a gradient
step of size eta multiplies x by (1 - u) with u = eta * h (the paper takes h = 1
and writes eta for u). Notation as in ``easgd.core.elastic``: p = ``num_workers``,
x~ = ``center``, alpha the moving rate, beta = p * alpha, tau the communication
period.

Contents:
  Synchronous EASGD, eq. (5)-(6) with period tau (``easgd.core.algorithms.easgd``):
    :func:`sync_easgd_step_matrices`, :func:`sync_easgd_period_matrix`,
    :func:`sync_easgd_spectral_radius`, :func:`sync_easgd_stable`,
    :func:`sync_easgd_stable_region`, :func:`sync_easgd_stable_region_tau_alpha`,
    :func:`sync_easgd_stationary_covariance`, :func:`stability_bound_message`.
  Round-robin asynchronous EASGD, eq. (12)-(13):
    :func:`round_robin_easgd_matrix`, :func:`round_robin_easgd_spectral_radius`,
    :func:`round_robin_easgd_condition`, :func:`round_robin_easgd_worker_map`,
    :func:`round_robin_easgd_round_map`,
    :func:`round_robin_easgd_round_spectral_radius`.
  Round-robin ADMM, eq. (9)-(11) (the paper's Figure 1):
    :func:`admm_worker_map`, :func:`admm_round_map`, :func:`admm_spectral_radius`,
    :func:`admm_simulate`.

Stability convention: "stable" means spectral radius < 1 strictly, i.e. every
state (workers and center) converges to the minimum x = 0. Marginal cases with
radius exactly 1 (alpha = 0: the center never moves; eta*h = 0: the consensus
direction is preserved) are NOT stable. The synchronous verdict does not rest on
the computed radius alone (its closed form rounds the radius 1 of eta*h = 0 to
1 - 1.1e-16 for some alpha): the Schur-Cohn conditions of the period map, whose
sign at eta*h = 0 and alpha = 0 is exact, must hold as well, and the radius is
returned as 1.0 where they fail but rounding put it below 1, so that
``sync_easgd_stable == (sync_easgd_spectral_radius < 1)`` everywhere. The
round-robin condition of the paper is the closed set radius <= 1 and is
documented as such.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Section 4, eq. (5)-(6), (9)-(13), Figure 1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg

from easgd._util import checks


def _active_worker(i, num_workers) -> tuple[int, int]:
  """``(i, p)``: p = ``num_workers`` an integer >= 1, the active worker i in [0, p).

  Raises:
    ValueError: num_workers < 1, i not an integer >= 0, or i >= p.
  """
  p = checks.integer("num_workers", num_workers, 1)
  i = checks.integer("i", i, 0)
  if i >= p:
    raise ValueError(f"i must be an integer in [0, {p - 1}], got {i!r}")
  return i, p


def _radius_2x2(a11, a12, a21, a22) -> np.ndarray:
  """max |eigenvalue| of [[a11, a12], [a21, a22]], elementwise over arrays.

  Closed form instead of ``np.linalg.eigvals``: the synchronous period map's
  entries overflow to inf/nan for large tau, which eigvals rejects (here such
  cells come out as inf, unstable), and the tests check it against eigvals."""
  with np.errstate(all="ignore"):
    half_trace = 0.5 * (a11 + a22)
    disc = (0.5 * (a11 - a22)) ** 2 + a12 * a21
    root = np.sqrt(disc.astype(np.complex128))
    radius = np.maximum(np.abs(half_trace + root), np.abs(half_trace - root))
  return np.where(np.isnan(radius), np.inf, radius)


def _batched_radius(matrices: np.ndarray) -> np.ndarray:
  """max |eigenvalue| over the last two axes of a (..., n, n) array."""
  return np.max(np.abs(np.linalg.eigvals(matrices)), axis=-1)


# ----------------------------------------------------------------------------
# Synchronous EASGD, eq. (5)-(6) with communication period tau
# ----------------------------------------------------------------------------


def sync_easgd_step_matrices(
    eta_h: float, alpha: float, num_workers: int
) -> tuple[np.ndarray, np.ndarray]:
  r"""The elastic-step and plain-step matrices of synchronous EASGD on h x^2/2.

  On the state s = (x^1, ..., x^p, x~) (length p + 1), with u = eta * h, the
  elastic step E (tau divides the clock), eq. (5)-(6), is

  .. math::

     x^i &\leftarrow (1 - u - \alpha)\, x^i + \alpha \tilde x \\
     \tilde x &\leftarrow \alpha \sum_{i=1}^{p} x^i + (1 - p \alpha)\, \tilde x

  and the plain local step L is :math:`x^i \leftarrow (1 - u)\, x^i`,
  :math:`\tilde x \leftarrow \tilde x`.

  Args:
    eta_h: u = eta * h, learning rate times curvature; a finite real scalar.
    alpha: moving rate alpha (beta = num_workers * alpha); a finite real scalar.
    num_workers: p, an integer >= 1.

  Returns:
    ``(elastic, plain)``, two float64 arrays of shape (p + 1, p + 1) acting on
    column vectors (x^1, ..., x^p, x~).

  Raises:
    ValueError: if eta_h or alpha is not a finite real, or num_workers is not an
      integer >= 1.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6).
  """
  u = checks.real("eta_h", eta_h)
  a = checks.real("alpha", alpha)
  p = checks.integer("num_workers", num_workers, 1)
  elastic = np.zeros((p + 1, p + 1))
  elastic[:p, :p] = (1.0 - u - a) * np.eye(p)
  elastic[:p, p] = a
  elastic[p, :p] = a
  elastic[p, p] = 1.0 - p * a
  plain = np.diag(np.r_[np.full(p, 1.0 - u), 1.0])
  return elastic, plain


def sync_easgd_period_matrix(eta_h: float, alpha: float, tau: int, num_workers: int) -> np.ndarray:
  r"""The linear map of one communication period of synchronous EASGD on h x^2/2.

  The worker clock starts at 0 and ``easgd.core.algorithms.easgd`` exchanges when tau
  divides it, so a period is ONE elastic step followed by tau - 1 plain steps:

  .. math::

     P = L^{\tau - 1} E, \qquad s_{k+1} = P s_k

  (s_k the state at clock k * tau)

  with E, L the matrices of :func:`sync_easgd_step_matrices` on
  s = (x^1, ..., x^p, x~). (The other order, E L^(tau-1), is a cyclic
  permutation with the same eigenvalues but a different map.)

  Args:
    eta_h: u = eta * h, a finite real scalar.
    alpha: moving rate, a finite real scalar.
    tau: communication period in local steps, an integer >= 1.
    num_workers: p, an integer >= 1.

  Returns:
    float64 array of shape (p + 1, p + 1).

  Raises:
    ValueError: for a non-finite eta_h or alpha, tau or num_workers not an
      integer >= 1.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Algorithm 1 (period tau).
  """
  tau = checks.integer("tau", tau, 1)
  elastic, plain = sync_easgd_step_matrices(eta_h, alpha, num_workers)
  return np.linalg.matrix_power(plain, tau - 1) @ elastic


def sync_easgd_spectral_radius(eta_h, alpha, tau, num_workers) -> np.ndarray:
  r"""Spectral radius of one communication period of synchronous EASGD.

  With y = mean_i x^i, the period map of :func:`sync_easgd_period_matrix`
  splits into the pair (y, x~), mapped by P2, and the p - 1 deviations
  x^i - y, each multiplied by d:

  .. math::

     P_2 &= \begin{pmatrix} 1 - u & 0 \\ 0 & 1 \end{pmatrix}^{\tau - 1}
            \begin{pmatrix} 1 - u - \alpha & \alpha \\ \beta & 1 - \beta \end{pmatrix} \\
     d &= (1 - u)^{\tau - 1} (1 - u - \alpha)

  with u = eta * h and beta = p * alpha, so the radius is
  :math:`\max(|\lambda(P_2)|, |d|)` (the ``|d|`` term for p >= 2 only).

  The closed-form eigenvalues round: at u = 0 (radius exactly 1) they give
  1 - 1.1e-16 for some alpha. Where the Schur-Cohn conditions say the map is
  not stable (:func:`_sync_schur_cohn`, exact in sign at u = 0 and alpha = 0)
  but the computed radius is below 1, the radius returned is 1.0, so that
  ``radius < 1`` is the stability verdict; elsewhere it is the closed form
  (relative error ~1e-15 against ``np.linalg.eigvals`` of the full matrix).

  Args:
    eta_h: u = eta * h, finite reals, any shape.
    alpha: moving rate, finite reals, any shape.
    tau: communication period, integers >= 1, any shape.
    num_workers: p, integers >= 1, any shape.
    All four broadcast together with NumPy semantics.

  Returns:
    float64 array of the broadcast shape; ``inf`` where the period map
    overflows float64.

  Raises:
    ValueError: for non-finite eta_h or alpha, tau or num_workers not integers
      >= 1.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Section 4.
  """
  u = checks.real_array("eta_h", eta_h)
  a = checks.real_array("alpha", alpha)
  tau = checks.integer_array("tau", tau, 1)
  p = checks.integer_array("num_workers", num_workers, 1)
  u, a, tau, p = np.broadcast_arrays(u, a, tau, p)
  with np.errstate(all="ignore"):
    k = np.power(1.0 - u, tau - 1)
    beta = p * a
    radius = _radius_2x2(k * (1.0 - u - a), k * a, beta, 1.0 - beta)
    dev = np.abs(k * (1.0 - u - a))
  dev = np.where(np.isnan(dev), np.inf, dev)
  radius = np.where(p >= 2, np.maximum(radius, dev), radius)
  return np.where((radius < 1.0) & ~_sync_schur_cohn(u, a, tau, p), 1.0, radius)


def _sync_schur_cohn(u, a, tau, p) -> np.ndarray:
  """Whether every eigenvalue of the period map lies strictly inside |z| = 1.

  Schur-Cohn (Jury) conditions for the 2x2 block P2 (trace T, determinant D,
  characteristic polynomial q(z) = z^2 - T z + D) and the deviation factor,
  with k = (1 - u)^(tau - 1) and beta = p alpha:

      q(1)  = 1 - T + D = beta (1 - (1 - u)^tau)                     > 0
      q(-1) = 1 + T + D = 2 - beta + k ((1 - u)(2 - beta) - 2 alpha) > 0
      |D|   = |k ((1 - u)(1 - beta) - alpha)|                        < 1
      |d|   = |k (1 - u - alpha)|                                    < 1  (p >= 2)

  q(1) vanishes on the marginal sets alpha = 0, u = 0 and (u = 2, tau even);
  its sign is taken from those of alpha and 1 - (1 - u)^tau, both decided by
  comparisons of the inputs (no rounding): 1 - (1 - u)^tau is > 0 for
  0 < u < 2 and for u >= 2 with tau odd, 0 for u = 0 and for u = 2 with tau
  even, < 0 otherwise. The other three are evaluated in float64 (exact at the
  marginal points u = 0, alpha in {0, 2 / (1 + p)}); overflow or nan counts as
  not stable. Inputs already broadcast; returns a bool array.
  """
  even = tau % 2 == 0
  g_sign = np.select([u == 0, u < 0, u < 2, (u == 2) & even, even], [0, -1, 1, 0, -1], default=1)
  with np.errstate(all="ignore"):
    k = np.power(1.0 - u, tau - 1)
    beta = p * a
    q_minus = 2.0 - beta + k * ((1.0 - u) * (2.0 - beta) - 2.0 * a)
    det = k * ((1.0 - u) * (1.0 - beta) - a)
    dev = k * (1.0 - u - a)
    return (
        (np.sign(a) * g_sign > 0)
        & (q_minus > 0)
        & (np.abs(det) < 1.0)
        & ((p < 2) | (np.abs(dev) < 1.0))
    )


def sync_easgd_stable(eta_h, alpha, tau, num_workers) -> np.ndarray:
  r"""Whether synchronous EASGD converges on h x^2/2: period spectral radius < 1.

  .. math::

     \text{stable} \iff \rho(L^{\tau - 1} E) < 1

  (the radius of :func:`sync_easgd_spectral_radius`).

  Radius exactly 1 counts as NOT stable: it is marginal (e.g. alpha = 0, where
  the workers converge but the center never moves, or eta*h = 0, where the
  consensus direction is kept). There is no tolerance: a radius that rounds to
  1.0 in float64 is not stable, and neither is a marginal map whose radius the
  closed form rounds below 1 (the Schur-Cohn conditions of
  :func:`sync_easgd_spectral_radius` decide those exactly).

  Args:
    eta_h, alpha, tau, num_workers: as in :func:`sync_easgd_spectral_radius`,
      broadcast together.

  Returns:
    bool array of the broadcast shape.

  Raises:
    ValueError: as :func:`sync_easgd_spectral_radius`.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Section 4.
  """
  return sync_easgd_spectral_radius(eta_h, alpha, tau, num_workers) < 1.0


def sync_easgd_stable_region(eta_h_grid, alpha_grid, tau: int, num_workers: int) -> np.ndarray:
  """The stable set of synchronous EASGD on an (eta*h, alpha) grid.

      region[j, i] = rho(P(eta_h_grid[i], alpha_grid[j], tau, p)) < 1

  Args:
    eta_h_grid: 1-D array (n,) of u = eta * h values (finite).
    alpha_grid: 1-D array (m,) of moving rates (finite).
    tau: communication period, an integer >= 1.
    num_workers: p, an integer >= 1.

  Returns:
    bool array of shape (m, n): rows follow alpha, columns follow eta*h (the
    ``imshow`` / ``pcolormesh`` layout with alpha on the vertical axis).

  Raises:
    ValueError: if a grid is not 1-D or has non-finite values; tau or
      num_workers not an integer >= 1.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Section 4.
  """
  u = checks.real_array("eta_h_grid", eta_h_grid)
  a = checks.real_array("alpha_grid", alpha_grid)
  for name, g in (("eta_h_grid", u), ("alpha_grid", a)):
    if g.ndim != 1:
      raise ValueError(f"{name} must be a 1-D array, got shape {g.shape}")
  return sync_easgd_stable(
      u[None, :],
      a[:, None],
      checks.integer("tau", tau, 1),
      checks.integer("num_workers", num_workers, 1),
  )


def sync_easgd_stable_region_tau_alpha(
    tau_grid, alpha_grid, eta_h: float, num_workers: int
) -> np.ndarray:
  """The stable set of synchronous EASGD on a (tau, alpha) grid at fixed eta*h.

      region[j, i] = rho(P(eta_h, alpha_grid[j], tau_grid[i], p)) < 1

  Args:
    tau_grid: 1-D integer array (n,) of communication periods >= 1.
    alpha_grid: 1-D array (m,) of moving rates (finite).
    eta_h: u = eta * h, a finite real scalar.
    num_workers: p, an integer >= 1.

  Returns:
    bool array of shape (m, n): rows follow alpha, columns follow tau.

  Raises:
    ValueError: a grid not 1-D, tau values not integers >= 1, non-finite values,
      num_workers not an integer >= 1.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6), Algorithm 1, Section 4.
  """
  t = checks.integer_array("tau_grid", tau_grid, 1)
  a = checks.real_array("alpha_grid", alpha_grid)
  for name, g in (("tau_grid", t), ("alpha_grid", a)):
    if g.ndim != 1:
      raise ValueError(f"{name} must be a 1-D array, got shape {g.shape}")
  return sync_easgd_stable(
      checks.real("eta_h", eta_h),
      a[:, None],
      t[None, :],
      checks.integer("num_workers", num_workers, 1),
  )


class StationaryCovariance(NamedTuple):
  """Stationary second moments of noisy synchronous EASGD on h x^2/2.

  Attributes:
    center_variance: Var(x~) in the stationary state (float, parameter units^2).
      The center only moves at exchanges, so this is its variance at every
      step, not only at period boundaries.
    covariance: float64 (p + 1, p + 1) covariance of (x^1, ..., x^p, x~) at
      clock multiples of tau (just before an exchange).
  """

  center_variance: float
  covariance: np.ndarray


def sync_easgd_stationary_covariance(
    eta_h: float, alpha: float, num_workers: int, eta: float, sigma: float, tau: int = 1
) -> StationaryCovariance:
  r"""Stationary covariance of synchronous EASGD under gradient noise.

  Each worker's gradient is h x^i + xi^i_t with xi iid, mean 0, variance
  sigma^2 across workers and steps, so a step adds w_t = -eta xi_t to the
  workers (covariance W = eta^2 sigma^2 diag(1, ..., 1, 0)). Over one period
  (elastic step E then tau - 1 plain steps L):

  .. math::

     s_{k+1} = P s_k + n_k, \qquad P = L^{\tau - 1} E, \qquad
     Q = \operatorname{Cov}(n_k) = \sum_{m=0}^{\tau - 1} L^m W (L^m)^\top

  and the stationary covariance solves the discrete Lyapunov equation
  (``scipy.linalg.solve_discrete_lyapunov``)

  .. math::

     \Sigma = P \Sigma P^\top + Q.

  Args:
    eta_h: u = eta * h (dimensionless), a finite real scalar.
    alpha: moving rate, a finite real scalar.
    num_workers: p, an integer >= 1.
    eta: learning rate (> 0) that scales the noise; h = eta_h / eta.
    sigma: standard deviation of each worker's gradient noise (>= 0), in
      gradient units.
    tau: communication period, an integer >= 1.

  Returns:
    A :class:`StationaryCovariance` (center variance, full covariance).

  Raises:
    ValueError: for invalid arguments, or if the period map is not stable
      (spectral radius >= 1), in which case no stationary state exists.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6); the noisy quadratic is the
    paper's Section 4 model with additive gradient noise (derived).
  """
  p = checks.integer("num_workers", num_workers, 1)
  tau = checks.integer("tau", tau, 1)
  eta = checks.real("eta", eta, 0.0, open_low=True)
  sigma = checks.real("sigma", sigma, 0.0)
  elastic, plain = sync_easgd_step_matrices(eta_h, alpha, p)
  radius = float(sync_easgd_spectral_radius(eta_h, alpha, tau, p))
  if not radius < 1.0:
    raise ValueError(
        f"no stationary state: synchronous EASGD with eta_h={eta_h!r}, "
        f"alpha={alpha!r}, tau={tau}, num_workers={p} has period spectral "
        f"radius {radius:.6g} >= 1 (stable requires < 1)"
    )
  period = np.linalg.matrix_power(plain, tau - 1) @ elastic
  w = (eta * sigma) ** 2 * np.diag(np.r_[np.ones(p), 0.0])
  q = np.zeros_like(w)
  lm = np.eye(p + 1)
  for _ in range(tau):
    q += lm @ w @ lm.T
    lm = plain @ lm
  cov = scipy.linalg.solve_discrete_lyapunov(period, q)
  cov = 0.5 * (cov + cov.T)
  return StationaryCovariance(float(cov[p, p]), cov)


def _stable_intervals(grid: np.ndarray, stable: np.ndarray):
  """Index pairs (first, last) of the runs of True in ``stable``."""
  edges = np.diff(np.r_[0, stable.astype(np.int8), 0])
  return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1))


def _bisect(f, lo: float, hi: float, steps: int = 60) -> float:
  """Boundary between f(lo) and f(hi) (which differ), by bisection."""
  flo = f(lo)
  for _ in range(steps):
    mid = 0.5 * (lo + hi)
    if f(mid) == flo:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)


def _stable_interval(f, grid, stable, target) -> tuple[float, float, int] | None:
  """(lo, hi, number of runs): the stable run of ``grid`` nearest ``target``.

  The run's ends are refined by bisection against ``f`` (True = stable); an end
  within 1e-12 of zero is returned as exactly 0.
  """
  runs = _stable_intervals(grid, stable)
  if not runs:
    return None

  def dist(run):
    lo, hi = grid[run[0]], grid[run[1]]
    return 0.0 if lo <= target <= hi else min(abs(target - lo), abs(target - hi))

  first, last = min(runs, key=dist)
  lo = grid[first] if first == 0 else _bisect(f, grid[first - 1], grid[first])
  hi = grid[last] if last == len(grid) - 1 else _bisect(f, grid[last], grid[last + 1])
  lo, hi = (0.0 if abs(v) < 1e-12 else float(v) for v in (lo, hi))
  return lo, hi, len(runs)


def stability_bound_message(eta_h: float, alpha: float, tau: int, num_workers: int) -> str | None:
  """A one-sentence warning when a config lies outside the analytic stable region.

  Uses the quadratic model F(x) = h x^2 / 2: with learning rate eta and a
  curvature h supplied by the user (e.g. the largest Hessian eigenvalue),
  eta_h = eta * h. The config is inside when the period spectral radius is < 1
  (:func:`sync_easgd_stable`). Outside, the message gives the radius and the
  open range of alpha (and beta = p alpha) that is stable at this eta*h, tau
  and p, found by a dense scan of alpha over [0, max(4, 2 |alpha|)] (8001
  points) with both ends refined by bisection; if the stable set has several
  runs, the one nearest the given alpha. If no alpha is stable there, it gives
  the stable range of eta*h at this alpha (scan of [0, 4]) instead.

  Args:
    eta_h: u = eta * h, a finite real scalar.
    alpha: moving rate, a finite real scalar (beta = num_workers * alpha).
    tau: communication period, an integer >= 1.
    num_workers: p, an integer >= 1.

  Returns:
    ``None`` inside the stable region, otherwise a one-sentence ``str``.

  Raises:
    ValueError: for invalid arguments (as :func:`sync_easgd_spectral_radius`).

  Example:
    >>> stability_bound_message(0.1, 0.9 / 4, 4, 4) is None
    True

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Section 4.
  """
  u = checks.real("eta_h", eta_h)
  a = checks.real("alpha", alpha)
  tau = checks.integer("tau", tau, 1)
  p = checks.integer("num_workers", num_workers, 1)
  radius = float(sync_easgd_spectral_radius(u, a, tau, p))
  if radius < 1.0:
    return None
  head = (
      f"EASGD config eta*h={u:.4g}, alpha={a:.4g} (beta={p * a:.4g}), "
      f"tau={tau}, num_workers={p} is outside the analytic stability region "
      f"of the quadratic model (period spectral radius {radius:.4g} >= 1)"
  )
  alphas = np.linspace(0.0, max(4.0, 2.0 * abs(a)), 8001)
  found = _stable_interval(
      lambda x: bool(sync_easgd_stable(u, x, tau, p)),
      alphas,
      sync_easgd_stable(u, alphas, tau, p),
      a,
  )
  if found is not None:
    lo, hi, runs = found
    where = "" if runs == 1 else f", the nearest of {runs} stable intervals"
    return (
        f"{head}; at this eta*h, tau and num_workers it is stable only for "
        f"alpha in ({lo:.4g}, {hi:.4g}), i.e. beta in ({p * lo:.4g}, "
        f"{p * hi:.4g}){where}."
    )
  etas = np.linspace(0.0, 4.0, 8001)
  found = _stable_interval(
      lambda x: bool(sync_easgd_stable(x, a, tau, p)), etas, sync_easgd_stable(etas, a, tau, p), u
  )
  if found is not None:
    lo, hi, _ = found
    return (
        f"{head}; no alpha in [0, {alphas[-1]:.4g}] is stable at this eta*h, "
        f"and at this alpha it is stable only for eta*h in ({lo:.4g}, "
        f"{hi:.4g}) (eta*h = learning_rate * curvature)."
    )
  return (
      f"{head}; no alpha in [0, {alphas[-1]:.4g}] is stable at this eta*h "
      f"and no eta*h in [0, 4] is stable at this alpha."
  )


def stable_eta_h_interval(alpha: float, tau: int, num_workers: int) -> tuple[float, float] | None:
  """The range of eta*h in which synchronous EASGD is stable at this alpha, tau, p.

  Scans eta*h over [0, 4] (8001 points; the plain step alone is unstable beyond
  eta*h = 2) and refines both ends by bisection; if the stable set has several
  runs, the first (smallest eta*h). With a curvature estimate h of the loss,
  the learning rate must satisfy eta < hi / h.

  Args:
    alpha: moving rate (>= 0); tau: communication period (>= 1); num_workers: p.

  Returns:
    ``(lo, hi)`` (open interval), or None when no eta*h in [0, 4] is stable.

  Raises:
    ValueError: for invalid arguments (as :func:`sync_easgd_spectral_radius`).

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Section 4 (derived).
  """
  a = checks.real("alpha", alpha)
  tau = checks.integer("tau", tau, 1)
  p = checks.integer("num_workers", num_workers, 1)
  etas = np.linspace(0.0, 4.0, 8001)
  stable = sync_easgd_stable(etas, a, tau, p)
  found = _stable_interval(
      lambda x: bool(sync_easgd_stable(x, a, tau, p)), etas, stable, float(etas[np.argmax(stable)])
  )
  return None if found is None else (found[0], found[1])


# ----------------------------------------------------------------------------
# Round-robin asynchronous EASGD, eq. (12)-(13)
# ----------------------------------------------------------------------------


def round_robin_easgd_matrix(eta, alpha) -> np.ndarray:
  r"""The 2x2 map of one round-robin EASGD update on (x^i, x~), F(x) = x^2/2.

  The active worker i does eq. (5) with the true gradient and the master moves
  by the same elastic force from that worker alone (both read time-t values;
  eq. (12)-(13), Section 4):

  .. math::

     \begin{pmatrix} x^i \\ \tilde x \end{pmatrix} \leftarrow A
     \begin{pmatrix} x^i \\ \tilde x \end{pmatrix}, \qquad
     A = \begin{pmatrix} 1 - \eta - \alpha & \alpha \\ \alpha & 1 - \alpha \end{pmatrix}

  i.e. A = [[1 - eta - alpha, alpha], [alpha, 1 - alpha]] (symmetric).

  Args:
    eta: step size times curvature (eta * h), finite reals, any shape.
    alpha: moving rate, finite reals, broadcast with ``eta``.

  Returns:
    float64 array of shape broadcast(eta, alpha).shape + (2, 2).

  Raises:
    ValueError: non-finite eta or alpha.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (12)-(13), Section 4.
  """
  eta = checks.real_array("eta", eta)
  a = checks.real_array("alpha", alpha)
  eta, a = np.broadcast_arrays(eta, a)
  return np.stack([np.stack([1.0 - eta - a, a], -1), np.stack([a, 1.0 - a], -1)], -2)


def round_robin_easgd_spectral_radius(eta, alpha) -> np.ndarray:
  r"""Spectral radius of the round-robin EASGD 2x2 map (eigenvalues are real).

  .. math::

     \rho(A) = \max |\lambda(A)|, \qquad
     A = \begin{pmatrix} 1 - \eta - \alpha & \alpha \\ \alpha & 1 - \alpha \end{pmatrix}

  Args:
    eta: eta * h, finite reals, any shape.
    alpha: moving rate, finite reals, broadcast with ``eta``.

  Returns:
    float64 array of the broadcast shape.

  Raises:
    ValueError: non-finite eta or alpha.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (12)-(13), Section 4.
  """
  eta = checks.real_array("eta", eta)
  a = checks.real_array("alpha", alpha)
  return _radius_2x2(1.0 - eta - a, a, a + 0.0 * eta, 1.0 - a + 0.0 * eta)


def round_robin_easgd_condition(eta, alpha) -> np.ndarray:
  r"""The paper's stability condition of round-robin EASGD (Section 4).

  .. math::

     0 \le \eta \le 2 \quad\text{and}\quad 0 \le \alpha \le \frac{4 - 2\eta}{4 - \eta}

  It is exactly the set where the 2x2 map of :func:`round_robin_easgd_matrix`
  has all |eigenvalues| <= 1 (closed set: the boundary is marginally stable).
  It does not depend on p, and it guarantees a stable round for every p (see
  :func:`round_robin_easgd_round_spectral_radius` for the even-p sliver where
  the round is stable although the condition fails).

  Args:
    eta: eta * h, finite reals, any shape.
    alpha: moving rate, finite reals, broadcast with ``eta``.

  Returns:
    bool array of the broadcast shape.

  Raises:
    ValueError: non-finite eta or alpha.

  References:
    Zhang, Choromanska, LeCun (2015), Section 4 (round-robin EASGD).
  """
  eta = checks.real_array("eta", eta)
  a = checks.real_array("alpha", alpha)
  with np.errstate(all="ignore"):
    bound = (4.0 - 2.0 * eta) / (4.0 - eta)
  return (eta >= 0) & (eta <= 2) & (a >= 0) & (a <= bound)


def _rr_worker_maps(eta, a, p: int) -> list[np.ndarray]:
  """The p per-worker maps, each of shape eta.shape + (p + 1, p + 1)."""
  shape = eta.shape
  maps = []
  for i in range(p):
    m = np.broadcast_to(np.eye(p + 1), shape + (p + 1, p + 1)).copy()
    m[..., i, i] = 1.0 - eta - a
    m[..., i, p] = a
    m[..., p, i] = a
    m[..., p, p] = 1.0 - a
    maps.append(m)
  return maps


def round_robin_easgd_worker_map(eta: float, alpha: float, i: int, num_workers: int) -> np.ndarray:
  """Round-robin EASGD map of worker i on the full state (x^1, ..., x^p, x~).

  The active worker i and the center move by the 2x2 matrix A of
  :func:`round_robin_easgd_matrix`; all other workers hold still (identity).

  Args:
    eta: eta * h, a finite real scalar.
    alpha: moving rate, a finite real scalar.
    i: the active worker, 0-based (the paper's worker i + 1), 0 <= i < p.
    num_workers: p, an integer >= 1.

  Returns:
    float64 array (p + 1, p + 1).

  Raises:
    ValueError: invalid eta, alpha, num_workers, or i outside [0, p).

  References:
    Zhang, Choromanska, LeCun (2015), eq. (12)-(13).
  """
  eta = checks.real("eta", eta)
  a = checks.real("alpha", alpha)
  i, p = _active_worker(i, num_workers)
  return _rr_worker_maps(np.asarray(eta), np.asarray(a), p)[i]


def round_robin_easgd_round_map(eta, alpha, num_workers: int) -> np.ndarray:
  r"""One round of round-robin EASGD: workers 1, ..., p in turn.

  .. math::

     F = F^p \circ \cdots \circ F^1

  (the matrix product ``F^p @ ... @ F^1``).

  Args:
    eta: eta * h, finite reals, any shape.
    alpha: moving rate, finite reals, broadcast with ``eta``.
    num_workers: p, an integer >= 1.

  Returns:
    float64 array of shape broadcast(eta, alpha).shape + (p + 1, p + 1).

  Raises:
    ValueError: invalid eta, alpha or num_workers.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (12)-(13).
  """
  eta = checks.real_array("eta", eta)
  a = checks.real_array("alpha", alpha)
  p = checks.integer("num_workers", num_workers, 1)
  eta, a = np.broadcast_arrays(eta, a)
  out = None
  for m in _rr_worker_maps(eta, a, p):
    out = m if out is None else m @ out
  return out


def round_robin_easgd_round_spectral_radius(eta, alpha, num_workers: int) -> np.ndarray:
  """Spectral radius of one round-robin EASGD round, rho(F^p o ... o F^1).

  Each F^i is symmetric, so ||F^i||_2 = rho(A) and ||F||_2 <= rho(A)^p: the
  round is (marginally) stable whenever :func:`round_robin_easgd_condition`
  holds, for every p. The converse is p-dependent (found numerically, see
  ``paper_notes/stability.md``): for odd p (3, 5, 7 checked) the round is stable
  exactly on the condition's set, but for even p a thin sliver just above the
  curve alpha = (4 - 2 eta) / (4 - eta) is stable too (up to about 0.042 above
  it for p = 2, 0.0098 for p = 4, 0.0044 for p = 6), e.g. eta = 0.75,
  alpha = 0.775, p = 2: rho(A) = 1.011 but rho(F) = 0.939.

  Args:
    eta: eta * h, finite reals, any shape.
    alpha: moving rate, finite reals, broadcast with ``eta``.
    num_workers: p, an integer >= 1.

  Returns:
    float64 array of the broadcast shape.

  Raises:
    ValueError: invalid eta, alpha or num_workers.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (12)-(13), Section 4.
  """
  return _batched_radius(round_robin_easgd_round_map(eta, alpha, num_workers))


# ----------------------------------------------------------------------------
# Round-robin ADMM, eq. (9)-(11), F(x) = x^2 / 2
# ----------------------------------------------------------------------------


def _admm_worker_maps(eta, rho, p: int) -> list[np.ndarray]:
  """F^i = F^i_3 F^i_2 F^i_1 for i = 0..p-1, each eta.shape + (n, n), n = 2p+1.

  State layout: lambda^i at 2i, x^i at 2i + 1, center at 2p.
  """
  n = 2 * p + 1
  shape = eta.shape
  eye = np.broadcast_to(np.eye(n), shape + (n, n))
  er = eta * rho
  maps = []
  for i in range(p):
    li, xi, c = 2 * i, 2 * i + 1, 2 * p
    f1 = eye.copy()  # lambda^i <- lambda^i - (x^i - x~)          (9)
    f1[..., li, xi] = -1.0
    f1[..., li, c] = 1.0
    # x^i <- ((1 - eta) x^i + eta rho (lambda^i + x~)) / (1 + eta rho)   (10)
    f2 = eye.copy()
    f2[..., xi, xi] = (1.0 - eta) / (1.0 + er)
    f2[..., xi, li] = er / (1.0 + er)
    f2[..., xi, c] = er / (1.0 + er)
    f3 = eye.copy()  # x~ <- (1/p) sum_j (x^j - lambda^j)          (11)
    f3[..., c, :] = 0.0
    f3[..., c, 1:c:2] = 1.0 / p
    f3[..., c, 0:c:2] = -1.0 / p
    maps.append(f3 @ f2 @ f1)
  return maps


def admm_worker_map(eta: float, rho: float, i: int, num_workers: int) -> np.ndarray:
  r"""Round-robin ADMM map of worker i on (lambda^1, x^1, ..., lambda^p, x^p, x~).

  For F(x) = x^2 / 2 (gradient x) and the active worker i, F^i = F^i_3 o F^i_2
  o F^i_1 with

  .. math::

     F^i_1 &: \lambda^i \leftarrow \lambda^i - (x^i - \tilde x) \qquad (9) \\
     F^i_2 &: x^i \leftarrow \frac{x^i - \eta x^i + \eta \rho (\lambda^i + \tilde x)}{1 + \eta \rho}
       \qquad (10) \\
     F^i_3 &: \tilde x \leftarrow \frac{1}{p} \sum_{j=1}^{p} (x^j - \lambda^j) \qquad (11)

  (each reads the values the previous one wrote); other workers hold still.

  Args:
    eta: step size (times curvature), a finite real scalar.
    rho: elastic penalty rho, a finite real scalar with eta * rho != -1.
    i: the active worker, 0-based (the paper's worker i + 1), 0 <= i < p.
    num_workers: p, an integer >= 1.

  Returns:
    float64 array (2p + 1, 2p + 1); lambda^i at index 2i, x^i at 2i + 1, x~ at
    2p.

  Raises:
    ValueError: invalid eta, rho, num_workers, i outside [0, p), or
      eta * rho == -1.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (9)-(11), Section 4.
  """
  eta = checks.real("eta", eta)
  rho = checks.real("rho", rho)
  i, p = _active_worker(i, num_workers)
  _check_eta_rho(np.asarray(eta), np.asarray(rho))
  return _admm_worker_maps(np.asarray(eta), np.asarray(rho), p)[i]


def _check_eta_rho(eta, rho):
  bad = eta * rho == -1.0
  if np.any(bad):
    first = tuple(np.argwhere(bad)[0])
    raise ValueError(
        f"eta * rho must not be -1 (division by 1 + eta * rho), "
        f"got eta={np.broadcast_to(eta, bad.shape)[first]!r}, "
        f"rho={np.broadcast_to(rho, bad.shape)[first]!r}"
    )


def admm_round_map(eta, rho, num_workers: int) -> np.ndarray:
  """One round of round-robin ADMM: F = F^p o ... o F^1 (worker 1 first).

  Args:
    eta: step size, finite reals, any shape.
    rho: elastic penalty, finite reals, broadcast with ``eta``.
    num_workers: p, an integer >= 1.

  Returns:
    float64 array broadcast(eta, rho).shape + (2p + 1, 2p + 1) on
    (lambda^1, x^1, ..., lambda^p, x^p, x~).

  Raises:
    ValueError: invalid eta, rho, num_workers, or eta * rho == -1.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (9)-(11), Section 4.
  """
  eta = checks.real_array("eta", eta)
  rho = checks.real_array("rho", rho)
  p = checks.integer("num_workers", num_workers, 1)
  eta, rho = np.broadcast_arrays(eta, rho)
  _check_eta_rho(eta, rho)
  out = None
  for m in _admm_worker_maps(eta, rho, p):
    out = m if out is None else m @ out
  return out


def admm_spectral_radius(eta_grid, rho_grid, num_workers: int) -> np.ndarray:
  r"""Largest |eigenvalue| of the round-robin ADMM round map (the paper's Figure 1).

  .. math::

     \max |\lambda(F^p \circ \cdots \circ F^1)|

  Args:
    eta_grid: step sizes, finite reals, any shape (e.g. (1, n)).
    rho_grid: elastic penalties, finite reals, broadcast with ``eta_grid``
      (e.g. (m, 1) for an (m, n) image).
    num_workers: p, an integer >= 1.

  Returns:
    float64 array of the broadcast shape (batched ``np.linalg.eigvals``).

  Raises:
    ValueError: invalid values, or eta * rho == -1.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (9)-(11), Figure 1.
  """
  return _batched_radius(admm_round_map(eta_grid, rho_grid, num_workers))


class AdmmTrajectory(NamedTuple):
  """A round-robin ADMM run, recorded after each round.

  Attributes:
    center: float64 (num_rounds + 1,), the center x~ (index 0 = start).
    norm: float64 (num_rounds + 1,), Euclidean norm of the whole state
      (lambda^1, x^1, ..., lambda^p, x^p, x~).
  """

  center: np.ndarray
  norm: np.ndarray


def admm_simulate(
    eta: float, rho: float, num_workers: int, num_rounds: int, x0: float = 1000.0
) -> AdmmTrajectory:
  """Runs round-robin ADMM on F(x) = x^2 / 2 straight from eq. (9)-(11).

  Starts from lambda^i = 0, x^i = x~ = x0; each round activates workers
  1, ..., p in turn, each doing (9), (10), (11) in that order. The arithmetic is
  written out from the equations (not via :func:`admm_round_map`), so the two
  check each other. Overflow gives ``inf`` / ``nan`` silently.

  Args:
    eta: step size, a finite real scalar.
    rho: elastic penalty, a finite real scalar, eta * rho != -1.
    num_workers: p, an integer >= 1.
    num_rounds: number of rounds, an integer >= 0.
    x0: the common starting value of the workers and the center (finite).

  Returns:
    An :class:`AdmmTrajectory`.

  Raises:
    ValueError: invalid arguments.

  References:
    Zhang, Choromanska, LeCun (2015), eq. (9)-(11); the divergence example
    eta = 0.001, rho = 2.5 from 1000 in Section 4.
  """
  eta = checks.real("eta", eta)
  rho = checks.real("rho", rho)
  p = checks.integer("num_workers", num_workers, 1)
  num_rounds = checks.integer("num_rounds", num_rounds, 0)
  x0 = checks.real("x0", x0)
  _check_eta_rho(np.asarray(eta), np.asarray(rho))
  lam = [0.0] * p
  x = [x0] * p
  c = x0
  centers, norms = [c], [np.sqrt(sum(v * v for v in x) + c * c)]
  with np.errstate(all="ignore"):
    for _ in range(num_rounds):
      for i in range(p):
        lam[i] = lam[i] - (x[i] - c)  # (9)
        x[i] = (x[i] - eta * x[i] + eta * rho * (lam[i] + c)) / (1 + eta * rho)  # (10)
        c = sum(xj - lj for xj, lj in zip(x, lam)) / p  # (11)
      centers.append(c)
      norms.append(float(np.sqrt(np.float64(sum(v * v for v in x + lam) + c * c))))
  return AdmmTrajectory(np.asarray(centers, np.float64), np.asarray(norms, np.float64))
