"""Analytic stability of round-robin EASGD and round-robin ADMM on F(x) = x^2/2 (Section 4).

NumPy only: each update is a small real matrix on the state of the workers and the
center, reduced to a spectral radius (the paper's Figure 1); arguments broadcast with
NumPy semantics. Model, notation and the closed condition radius <= 1:
docs/guides/stability.md; derivations: ``paper_notes/stability.md``.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Section 4, eq. (9)-(13), Figure 1.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from easgd._util import checks
from easgd.analysis import stability


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


def _batched_radius(matrices: np.ndarray) -> np.ndarray:
  """max |eigenvalue| over the last two axes of a (..., n, n) array."""
  return np.max(np.abs(np.linalg.eigvals(matrices)), axis=-1)


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

  Args, raised errors and references as :func:`round_robin_easgd_matrix`; returns
  float64 of the broadcast shape.
  """
  eta = checks.real_array("eta", eta)
  a = checks.real_array("alpha", alpha)
  return stability.radius_2x2(1.0 - eta - a, a, a + 0.0 * eta, 1.0 - a + 0.0 * eta)


def round_robin_easgd_condition(eta, alpha) -> np.ndarray:
  r"""The paper's stability condition of round-robin EASGD (Section 4).

  .. math::

     0 \le \eta \le 2 \quad\text{and}\quad 0 \le \alpha \le \frac{4 - 2\eta}{4 - \eta}

  It is exactly the set where the 2x2 map of :func:`round_robin_easgd_matrix`
  has all |eigenvalues| <= 1 (closed set: the boundary is marginally stable).
  It does not depend on p, and it guarantees a stable round for every p (see
  :func:`round_robin_easgd_round_spectral_radius` for the even-p sliver where
  the round is stable although the condition fails).

  Args and raised errors as :func:`round_robin_easgd_matrix`; returns bool of the
  broadcast shape.
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
