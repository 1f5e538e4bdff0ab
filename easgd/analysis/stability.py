"""Analytic stability of synchronous EASGD on one-dimensional quadratics (Section 4).

NumPy/SciPy only: the period map of eq. (5)-(6) on F(x) = h x^2 / 2, its spectral radius,
stable regions, stationary covariance and the trainer's stability warning. Arguments broadcast
with NumPy semantics; "stable" means spectral radius < 1 strictly (see
docs/guides/stability.md for the model, notation and conventions, ``paper_notes/stability.md``
for the derivations). Round-robin EASGD and ADMM: ``easgd.analysis.round_robin``.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Section 4, eq. (5)-(6).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.linalg

from easgd._util import checks


def radius_2x2(a11, a12, a21, a22) -> np.ndarray:
  """max |eigenvalue| of [[a11, a12], [a21, a22]], elementwise over arrays
  (float64 of the broadcast shape; inf where an entry is inf or nan).

  Closed form instead of ``np.linalg.eigvals``: the synchronous period map's
  entries overflow to inf/nan for large tau, which eigvals rejects (here such
  cells come out as inf, unstable), and the tests check it against eigvals."""
  with np.errstate(all="ignore"):
    half_trace = 0.5 * (a11 + a22)
    disc = (0.5 * (a11 - a22)) ** 2 + a12 * a21
    root = np.sqrt(disc.astype(np.complex128))
    radius = np.maximum(np.abs(half_trace + root), np.abs(half_trace - root))
  return np.where(np.isnan(radius), np.inf, radius)


# ----------------------------------------------------------------------------
# Synchronous EASGD, eq. (5)-(6) with communication period tau
# ----------------------------------------------------------------------------


def _checked(eta_h, alpha, tau, num_workers, real, integer):
  """(u, alpha, tau, p) checked in that order by ``real`` and ``integer`` (``easgd._util.checks``).

  Raises:
    ValueError: naming the first of them that is not finite, or not an integer >= 1.
  """
  u, a = real("eta_h", eta_h), real("alpha", alpha)
  return u, a, integer("tau", tau, 1), integer("num_workers", num_workers, 1)


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
  u, a, tau, p = _checked(eta_h, alpha, tau, num_workers, checks.real_array, checks.integer_array)
  u, a, tau, p = np.broadcast_arrays(u, a, tau, p)
  with np.errstate(all="ignore"):
    k = np.power(1.0 - u, tau - 1)
    beta = p * a
    radius = radius_2x2(k * (1.0 - u - a), k * a, beta, 1.0 - beta)
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
  u, a, tau, p = _checked(eta_h, alpha, tau, num_workers, checks.real, checks.integer)
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
