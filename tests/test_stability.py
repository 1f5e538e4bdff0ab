"""Analytic stability maps (easgd.analysis.stability) vs full matrices and JAX simulations."""

import re

import jax
import numpy as np
import pytest
import scipy.linalg

from easgd.analysis import round_robin, stability
from easgd.sweeps import quadratic

RNG_SEED = 20150


def full_radius(m):
  return np.max(np.abs(np.linalg.eigvals(m)))


# ---------------------------------------------------------------------------
# Synchronous EASGD
# ---------------------------------------------------------------------------


# Hand-worked period, p = 2, u = eta*h = 0.5, alpha = 0.25 (beta = 0.5), tau = 2;
# state (x^1, x^2, x~). Elastic step first (clock 0), then one plain step:
#  from (1, 1, 1):  elastic x^i = (1 - .5 - .25)*1 + .25*1 = .5,
#                   x~ = .25*(1 + 1) + (1 - .5)*1 = 1;   plain x^i = .25, x~ = 1
#                   -> (.25, .25, 1)
#  from (1, -1, 0): elastic x = (.25, -.25), x~ = .25*0 + .5*0 = 0;
#                   plain -> (.125, -.125, 0)
#  (the other order, plain then elastic, gives (.375, .375, .75) from (1, 1, 1))
def test_period_matrix_hand_worked():
  p_mat = stability.sync_easgd_period_matrix(0.5, 0.25, 2, 2)
  np.testing.assert_allclose(p_mat @ [1, 1, 1], [0.25, 0.25, 1.0], atol=1e-15)
  np.testing.assert_allclose(p_mat @ [1, -1, 0], [0.125, -0.125, 0.0], atol=1e-15)


@pytest.mark.parametrize("tau", [1, 3])
def test_sync_radius_equals_full_period_matrix(tau):
  rng = np.random.default_rng(RNG_SEED + tau)
  n = 40
  u = rng.uniform(-0.3, 2.5, n)
  a = rng.uniform(0.0, 1.0, n)
  p = rng.choice([1, 2, 3, 5, 8], n)
  vectorised = stability.sync_easgd_spectral_radius(u, a, tau, p)
  assert vectorised.shape == (n,)
  full = [
      full_radius(stability.sync_easgd_period_matrix(u[k], a[k], tau, int(p[k]))) for k in range(n)
  ]
  np.testing.assert_allclose(vectorised, full, rtol=1e-10)
  assert (np.asarray(full) > 1).any() and (np.asarray(full) < 1).any()


@pytest.mark.parametrize("num_workers", [1, 4])
def test_tau1_region_is_the_jury_conditions(num_workers):
  # tau = 1 closed form (paper_notes/stability.md): with T, D the trace and
  # determinant of M, rho(M) < 1 iff |D| < 1, 1 - T + D = u beta > 0 and
  # 1 + T + D > 0; plus |1 - u - alpha| < 1 for the deviations when p >= 2.
  u, a = np.meshgrid(np.linspace(-0.5, 4.5, 201), np.linspace(-0.5, 2.5, 151))
  b = num_workers * a
  trace, det = 2 - u - a - b, 1 - u - a - b + u * b
  jury = (np.abs(det) < 1) & (1 - trace + det > 0) & (1 + trace + det > 0)
  if num_workers >= 2:
    jury &= np.abs(1 - u - a) < 1
  radius = stability.sync_easgd_spectral_radius(u, a, 1, num_workers)
  assert jury.any()
  disagree = jury != (radius < 1)
  np.testing.assert_allclose(radius[disagree], 1.0, atol=1e-12)


def test_period_map_order_matches_jax_simulation():
  # easgd.core.algorithms.easgd exchanges when tau divides the clock (t = 0 first):
  # the simulated tau steps must equal P = L^(tau-1) E, not E L^(tau-1).
  x0 = np.array([1.0, -2.0, 0.5, 3.0])
  u, a, tau, p = 0.3, 0.2, 3, 3
  run = quadratic.simulate_sync_easgd(u, a, tau, p, tau, x0=x0)
  simulated = np.r_[np.asarray(run.workers), float(run.center[-1])]
  np.testing.assert_allclose(
      simulated, stability.sync_easgd_period_matrix(u, a, tau, p) @ x0, rtol=1e-5
  )
  elastic, plain = stability.sync_easgd_step_matrices(u, a, p)
  assert not np.allclose(simulated, elastic @ np.linalg.matrix_power(plain, 2) @ x0, rtol=1e-3)


def test_sync_radius_agrees_with_jax_power_iteration():
  # Error of the estimate: O(1/K) for complex pairs (K = 200 periods); 3% bound.
  rng = np.random.default_rng(RNG_SEED)
  n = 24
  u = rng.uniform(0.02, 2.3, n)
  a = rng.uniform(0.02, 0.6, n)
  tau = rng.choice([1, 2, 3, 5], n)
  analytic = stability.sync_easgd_spectral_radius(u, a, tau, 4)
  assert (analytic < 1).sum() >= 5 and (analytic > 1).sum() >= 5
  estimate = np.asarray(quadratic.estimate_spectral_radius(u, a, tau, 4, num_periods=200))
  np.testing.assert_allclose(estimate, analytic, rtol=0.03)
  np.testing.assert_array_equal(estimate < 1, analytic < 1)


def test_sync_marginal_and_degenerate_cases():
  # alpha = 0: the center never moves -> radius exactly 1, not stable.
  assert stability.sync_easgd_spectral_radius(0.5, 0.0, 4, 4) == 1.0
  assert not stability.sync_easgd_stable(0.5, 0.0, 4, 4)
  # eta*h = 0: consensus preserved -> radius 1.
  np.testing.assert_allclose(stability.sync_easgd_spectral_radius(0.0, 0.1, 1, 4), 1.0)
  # p = 1: only the 2x2 (no deviations); tau = 1: radius of M.
  m = np.array([[1 - 0.3 - 0.6, 0.6], [0.6, 1 - 0.6]])
  np.testing.assert_allclose(
      stability.sync_easgd_spectral_radius(0.3, 0.6, 1, 1), full_radius(m), rtol=1e-12
  )
  # p = 2 with the same numbers: the deviation factor |1 - u - alpha| counts.
  dev = abs(1 - 1.5 - 0.6)
  assert stability.sync_easgd_spectral_radius(1.5, 0.6, 1, 2) >= dev


def test_stable_regions_are_the_vectorised_verdict():
  etas = np.linspace(0.0, 2.2, 23)
  alphas = np.linspace(0.0, 0.8, 17)
  taus = np.arange(1, 9)
  region = stability.sync_easgd_stable_region(etas, alphas, 4, 4)
  assert region.shape == (17, 23)
  assert region[5, 3] == stability.sync_easgd_stable(etas[3], alphas[5], 4, 4)
  assert region.any() and not region.all()
  assert not region[0].any()  # alpha = 0 row: marginal
  ta = stability.sync_easgd_stable_region_tau_alpha(taus, alphas, 0.5, 4)
  assert ta.shape == (17, 8)
  assert ta[7, 2] == stability.sync_easgd_stable(0.5, alphas[7], 3, 4)


# Marginal maps. eta*h = 0: x^i = x~ = c is kept by every step, so the period
# map has the eigenvalue 1 exactly (the other ones: 1 - alpha - beta and, for
# p >= 2, 1 - alpha). alpha = 0: the center never moves (eigenvalue 1). Also
# exactly 1: the other eigenvalue -1 at eta*h = 0, alpha = 2 / (1 + p), and
# 1 - (1 - u)^tau = 0 at u = 2 for even tau. None of these is stable. The
# closed-form eigenvalues round the radius at eta*h = 0 to 1 - 1.1e-16 or
# 1 - 2.2e-16 for about one alpha in ten (e.g. alpha = 0.05, tau = 1, p = 8),
# which used to be reported as stable; the radius returned there is now 1.0,
# and elsewhere on these sets it is within 2.3e-16 of 1 (measured: 2.2e-16).
def test_marginal_maps_are_never_stable():
  alphas = np.linspace(0.0, 2.5, 2001)
  etas = np.linspace(-0.5, 4.5, 2001)
  for p in (1, 2, 3, 8, 16):
    for tau in (1, 2, 5, 8):
      radius = stability.sync_easgd_spectral_radius(0.0, alphas, tau, p)
      assert not stability.sync_easgd_stable(0.0, alphas, tau, p).any(), (p, tau)
      assert np.all(radius >= 1.0), (p, tau)
      inside = (np.abs(1 - alphas * (1 + p)) <= 1) & ((p == 1) | (alphas <= 2))
      np.testing.assert_allclose(radius[inside], 1.0, rtol=0, atol=2.3e-16)
      assert np.all(stability.sync_easgd_spectral_radius(etas, 0.0, tau, p) >= 1.0)
      assert not stability.sync_easgd_stable(etas, 0.0, tau, p).any()
      if tau % 2 == 0:
        assert not stability.sync_easgd_stable(2.0, alphas, tau, p).any()
  assert stability.sync_easgd_spectral_radius(0.0, 0.05, 1, 8) == 1.0
  assert not stability.sync_easgd_stable(0.0, 0.05, 1, 8)
  for p, alpha in ((1, 1.0), (3, 0.5), (7, 0.25), (15, 0.125)):  # eigenvalues +-1
    assert stability.sync_easgd_spectral_radius(0.0, alpha, 1, p) == 1.0
    assert not stability.sync_easgd_stable(0.0, alpha, 3, p)
  # Just inside / outside (1e-9, far above rounding), by the tau = 1 Jury
  # conditions: u beta > 0, 4 - 2u - 2(alpha + beta) + u beta > 0, |D| < 1.
  for u, alpha, tau, p, stable in (
      (1e-9, 0.05, 1, 8, True),
      (-1e-9, 0.05, 1, 8, False),
      (0.5, 1e-9, 4, 4, True),
      (0.5, -1e-9, 4, 4, False),
      (1e-9, 0.5 - 1e-9, 1, 3, True),
      (1e-9, 0.5 + 1e-9, 1, 3, False),
  ):
    assert stability.sync_easgd_stable(u, alpha, tau, p) == stable, (u, alpha)
    radius = stability.sync_easgd_spectral_radius(u, alpha, tau, p)
    assert (radius < 1) == stable and abs(radius - 1) < 1e-8, (u, alpha, radius)


def test_eta_h_zero_is_outside_every_region_interval_and_message():
  alphas = np.linspace(0.01, 0.2, 20)
  assert not stability.sync_easgd_stable_region_tau_alpha(np.arange(1, 9), alphas, 0.0, 8).any()
  region = stability.sync_easgd_stable_region(np.linspace(0.0, 1.0, 11), alphas, 1, 8)
  assert not region[:, 0].any() and region[:, 1].all()
  lo, hi = stability.stable_eta_h_interval(0.05, 1, 8)  # open interval
  assert lo == 0.0 and not stability.sync_easgd_stable(lo, 0.05, 1, 8)
  assert stability.sync_easgd_stable(1e-9, 0.05, 1, 8)
  msg = stability.stability_bound_message(0.0, 0.05, 1, 8)
  assert msg is not None and "period spectral radius 1 >= 1" in msg
  assert f"eta*h in (0, {hi:.4g})" in msg
  # no stationary state (it used to return Var(x~) = 1.5e13 here)
  with pytest.raises(ValueError, match="eta_h=0.0, alpha=0.05.*radius 1 >= 1"):
    stability.sync_easgd_stationary_covariance(0.0, 0.05, 8, 0.1, 1.0)


# ---------------------------------------------------------------------------
# Round-robin EASGD
# ---------------------------------------------------------------------------


def _near_condition_boundary(eta, alpha, d=1e-6):
  """True where the condition changes within distance d of (eta, alpha)."""
  here = round_robin.round_robin_easgd_condition(eta, alpha)
  near = np.zeros_like(here)
  for de, da in [(d, 0), (-d, 0), (0, d), (0, -d)]:
    near |= round_robin.round_robin_easgd_condition(eta + de, alpha + da) != here
  return near


def test_round_robin_condition_is_boundary_of_2x2_stability():
  eta, alpha = np.meshgrid(np.linspace(-0.5, 4.5, 501), np.linspace(-0.5, 2.5, 301))
  radius = round_robin.round_robin_easgd_spectral_radius(eta, alpha)
  m = round_robin.round_robin_easgd_matrix(eta, alpha)
  np.testing.assert_allclose(radius, np.max(np.abs(np.linalg.eigvalsh(m)), -1), rtol=1e-12)
  cond = round_robin.round_robin_easgd_condition(eta, alpha)
  assert 0.05 < cond.mean() < 0.2  # area ~1.24 of the 5 x 3 window
  disagree = cond != (radius <= 1 + 1e-12)
  assert np.all(_near_condition_boundary(eta[disagree], alpha[disagree]))
  # Just inside / outside the curve alpha = (4 - 2 eta) / (4 - eta).
  e = np.linspace(0.01, 1.99, 199)
  bound = (4 - 2 * e) / (4 - e)
  assert np.all(round_robin.round_robin_easgd_spectral_radius(e, bound - 1e-6) < 1)
  assert np.all(round_robin.round_robin_easgd_spectral_radius(e, bound + 1e-6) > 1)
  assert np.all(round_robin.round_robin_easgd_condition(e, bound - 1e-6))
  assert not np.any(round_robin.round_robin_easgd_condition(e, bound + 1e-6))
  # The other edges: eta just above 2 or alpha just below 0 are unstable.
  assert round_robin.round_robin_easgd_spectral_radius(2 + 1e-6, 0.0) > 1
  assert round_robin.round_robin_easgd_spectral_radius(0.5, -1e-6) > 1


@pytest.mark.parametrize("num_workers", [2, 3, 5])
def test_round_robin_round_map_against_condition(num_workers):
  eta, alpha = np.meshgrid(np.linspace(-0.5, 4.5, 101), np.linspace(-0.5, 2.5, 81))
  cond = round_robin.round_robin_easgd_condition(eta, alpha)
  round_stable = (
      round_robin.round_robin_easgd_round_spectral_radius(eta, alpha, num_workers) <= 1 + 1e-9
  )
  # Sufficiency holds for every p (each F^i is symmetric with norm rho(A)).
  assert not np.any(cond & ~round_stable)
  extra = round_stable & ~cond
  with np.errstate(divide="ignore"):
    bound = (4 - 2 * eta) / (4 - eta)
  if num_workers % 2:
    # Odd p: the round is stable exactly on the paper's set.
    assert np.all(_near_condition_boundary(eta[extra], alpha[extra], d=1e-9))
  else:
    # Even p (found here, not in the paper): a thin stable sliver just above
    # the curve alpha = (4 - 2 eta) / (4 - eta), inside 0 < eta < 2.
    assert extra.sum() > 10
    assert np.all((eta[extra] > 0) & (eta[extra] < 2))
    assert np.all((alpha[extra] >= bound[extra] - 1e-12) & (alpha[extra] < bound[extra] + 0.05))


def _round_robin_direct(eta, alpha, num_workers, num_rounds, x0=1.0):
  # eq. (12)-(13) written out: worker i and the master read the same x^i, x~.
  x = [x0 * (1 + 0.1 * i) for i in range(num_workers)]
  c = x0
  for _ in range(num_rounds):
    for i in range(num_workers):
      x[i], c = x[i] - eta * x[i] - alpha * (x[i] - c), c + alpha * (x[i] - c)
  return np.sqrt(sum(v * v for v in x) + c * c)


def test_round_robin_even_p_sliver_by_direct_simulation():
  eta, alpha = 0.75, 0.775  # outside: (4 - 1.5) / 3.25 = 0.769 < 0.775
  assert not round_robin.round_robin_easgd_condition(eta, alpha)
  assert round_robin.round_robin_easgd_spectral_radius(eta, alpha) > 1.01
  assert round_robin.round_robin_easgd_round_spectral_radius(eta, alpha, 2) < 0.95
  assert round_robin.round_robin_easgd_round_spectral_radius(eta, alpha, 3) > 1
  assert _round_robin_direct(eta, alpha, 2, 400) < 1e-8
  assert _round_robin_direct(eta, alpha, 3, 400) > 1.0


def test_round_robin_worker_map_is_symmetric_and_composes():
  maps = [round_robin.round_robin_easgd_worker_map(0.3, 0.2, i, 3) for i in range(3)]
  for m in maps:
    np.testing.assert_array_equal(m, m.T)
  np.testing.assert_allclose(
      maps[2] @ maps[1] @ maps[0], round_robin.round_robin_easgd_round_map(0.3, 0.2, 3)
  )


# ---------------------------------------------------------------------------
# Round-robin ADMM (Figure 1)
# ---------------------------------------------------------------------------

ETA_EX, RHO_EX = 0.001, 2.5  # the paper's divergence example


def test_admm_single_workers_stable_round_unstable():
  p = 3
  for i in range(p):
    assert full_radius(round_robin.admm_worker_map(ETA_EX, RHO_EX, i, p)) <= 1 + 1e-12
  radius = float(round_robin.admm_spectral_radius(ETA_EX, RHO_EX, p))
  assert radius > 1 + 5e-4
  np.testing.assert_allclose(radius, full_radius(round_robin.admm_round_map(ETA_EX, RHO_EX, p)))


def test_admm_simulation_matches_round_map():
  p = 3
  rounds = 50
  traj = round_robin.admm_simulate(0.004, 6.0, p, rounds, x0=1000.0)
  state = np.r_[np.tile([0.0, 1000.0], p), 1000.0]
  round_map = round_robin.admm_round_map(0.004, 6.0, p)
  expected = np.linalg.matrix_power(round_map, rounds) @ state
  np.testing.assert_allclose(traj.center[-1], expected[-1], rtol=1e-9)
  np.testing.assert_allclose(traj.norm[-1], np.linalg.norm(expected), rtol=1e-9)
  assert traj.center.shape == traj.norm.shape == (rounds + 1,)


def test_admm_diverges_where_easgd_converges():
  p, rounds = 3, 20000
  admm = round_robin.admm_simulate(ETA_EX, RHO_EX, p, rounds, x0=1000.0)
  assert admm.norm[-1] > 1e6 and abs(admm.center[-1]) > 1e6
  assert admm.norm[-1] > admm.norm[rounds // 2] > 1e3  # keeps growing
  alpha = ETA_EX * RHO_EX
  easgd = quadratic.simulate_sync_easgd(ETA_EX, alpha, 1, p, rounds, x0=1000.0, trajectory=False)
  assert abs(float(easgd.center)) < 1e-2
  assert stability.sync_easgd_spectral_radius(ETA_EX, alpha, 1, p) < 1
  assert round_robin.round_robin_easgd_round_spectral_radius(ETA_EX, alpha, p) < 1


def test_admm_radius_grid_is_vectorised_and_exceeds_one():
  eta = np.linspace(0, 1e-2, 11)[1:]
  rho = np.linspace(0, 10, 9)[1:]
  for p in (3, 8):
    grid = round_robin.admm_spectral_radius(eta[None, :], rho[:, None], p)
    assert grid.shape == (8, 10)
    np.testing.assert_allclose(
        grid[3, 4], full_radius(round_robin.admm_round_map(eta[4], rho[3], p))
    )
    assert grid.max() > 1.0 and grid.min() < 1.0


# ---------------------------------------------------------------------------
# Noisy quadratic: stationary variance
# ---------------------------------------------------------------------------


def test_stationary_covariance_reduces_to_mean_center_pair():
  # Noise eta^2 sigma^2 I on the workers projects to eta^2 sigma^2 / p on the
  # mean y, uncorrelated with the deviations; Var(x~) follows from the 2x2
  # (y, x~) Lyapunov equation, with Q_y summed over the period's steps.
  u, a, p, eta, sigma = 0.2, 0.1, 4, 0.1, 1.5
  for tau in (1, 3):
    res = stability.sync_easgd_stationary_covariance(u, a, p, eta, sigma, tau=tau)
    k = (1 - u) ** (tau - 1)
    p2 = np.array([[k * (1 - u - a), k * a], [p * a, 1 - p * a]])
    qy = (eta * sigma) ** 2 / p * sum((1 - u) ** (2 * m) for m in range(tau))
    reduced = scipy.linalg.solve_discrete_lyapunov(p2, np.diag([qy, 0.0]))
    np.testing.assert_allclose(res.center_variance, reduced[1, 1], rtol=1e-10)
    assert res.covariance.shape == (p + 1, p + 1)
  zero = stability.sync_easgd_stationary_covariance(u, a, p, eta, 0.0)
  np.testing.assert_array_equal(zero.covariance, 0.0)


def test_stationary_variance_matches_jax_simulation():
  # 4096 independent chains per tau (vmapped configurations), started at 0,
  # 300 steps (period radius <= 0.86, so the start is forgotten to ~1e-40).
  # Estimator: mean of x~^2 (the mean is exactly 0); its standard error is
  # std(x~^2) / sqrt(4096) (~2.2% of the variance); pass within 4 s.e.
  u, a, p, eta, sigma, chains = 0.2, 0.1, 4, 0.1, 1.0, 4096
  taus = np.repeat(np.array([[1], [3]]), chains, axis=1)
  run = quadratic.simulate_sync_easgd(
      u, a, taus, p, 300, x0=0.0, key=jax.random.key(7), sigma=sigma, eta=eta, trajectory=False
  )
  sq = np.asarray(run.center, np.float64) ** 2
  for row, tau in enumerate((1, 3)):
    theory = stability.sync_easgd_stationary_covariance(
        u, a, p, eta, sigma, tau=tau
    ).center_variance
    se = sq[row].std() / np.sqrt(chains)
    assert abs(sq[row].mean() - theory) < 4 * se, (tau, sq[row].mean(), theory, se)


def test_stationary_covariance_raises_when_unstable():
  with pytest.raises(ValueError, match=r"eta_h=2\.5.*alpha=0\.1.*tau=1.*>= 1"):
    stability.sync_easgd_stationary_covariance(2.5, 0.1, 4, 0.1, 1.0)
  with pytest.raises(ValueError, match="alpha=0.0"):  # marginal: radius 1
    stability.sync_easgd_stationary_covariance(0.5, 0.0, 4, 0.1, 1.0)


# ---------------------------------------------------------------------------
# Warning message for the trainer
# ---------------------------------------------------------------------------


def test_stability_bound_message():
  assert stability.stability_bound_message(0.1, 0.9 / 4, 4, 4) is None
  msg = stability.stability_bound_message(0.1, 0.9, 4, 4)
  assert msg.count(".") >= 1 and "\n" not in msg
  assert "eta*h=0.1" in msg and "alpha=0.9" in msg and "tau=4" in msg
  assert "num_workers=4" in msg
  lo, hi = map(float, re.search(r"alpha in \(([^,]+), ([^)]+)\)", msg).groups())
  assert lo == 0.0
  assert stability.sync_easgd_stable(0.1, hi * (1 - 1e-3), 4, 4)
  assert not stability.sync_easgd_stable(0.1, hi * (1 + 1e-3), 4, 4)
  # No alpha helps at eta*h = 2.5: the message gives the eta*h range instead.
  msg = stability.stability_bound_message(2.5, 0.1, 4, 4)
  lo, hi = map(float, re.search(r"eta\*h in \(([^,]+), ([^)]+)\)", msg).groups())
  assert stability.sync_easgd_stable(hi * (1 - 1e-3), 0.1, 4, 4)
  assert not stability.sync_easgd_stable(hi * (1 + 1e-3), 0.1, 4, 4)


# ---------------------------------------------------------------------------
# JAX simulation plumbing and input validation
# ---------------------------------------------------------------------------


def test_simulation_compiles_once_for_new_configuration_values():
  shape_args = dict(num_workers=2, num_steps=7, trajectory=True)
  run = quadratic.simulate_sync_easgd([0.1, 0.2, 0.3], 0.1, [1, 2, 3], **shape_args)
  before = quadratic._simulate_flat._cache_size()
  run2 = quadratic.simulate_sync_easgd([1.1, 0.5, 0.05], 0.3, [4, 1, 2], **shape_args)
  assert quadratic._simulate_flat._cache_size() == before
  assert run.center.shape == run2.center.shape == (3, 8)
  assert run.workers.shape == (3, 2)


BAD_CALLS = [
    (lambda: stability.sync_easgd_spectral_radius(0.1, 0.1, 0, 4), r"tau.*>= 1.*0"),
    (lambda: stability.sync_easgd_spectral_radius(0.1, 0.1, 2.5, 4), r"tau.*2\.5"),
    (lambda: stability.sync_easgd_period_matrix(0.1, 0.1, True, 4), r"tau.*True"),
    (lambda: stability.sync_easgd_period_matrix(0.1, 0.1, 2, 0), r"num_workers.*0"),
    (lambda: stability.sync_easgd_spectral_radius(np.nan, 0.1, 1, 4), r"eta_h.*nan"),
    (lambda: stability.sync_easgd_stable([0.1, np.inf], 0.1, 1, 4), r"eta_h.*inf"),
    (lambda: stability.sync_easgd_stable(0.1, "big", 1, 4), r"alpha.*'big'"),
    (
        lambda: stability.sync_easgd_stable_region(np.zeros((2, 2)), [0.1], 1, 4),
        r"eta_h_grid.*1-D.*\(2, 2\)",
    ),
    (
        lambda: stability.sync_easgd_stable_region_tau_alpha([1, 0], [0.1], 0.1, 4),
        r"tau_grid.*>= 1.*0",
    ),
    (
        lambda: stability.sync_easgd_stationary_covariance(0.1, 0.1, 4, 0.0, 1.0),
        r"eta must be a finite real in \(0\.0, inf\), got 0\.0",
    ),
    (
        lambda: stability.sync_easgd_stationary_covariance(0.1, 0.1, 4, 0.1, -1.0),
        r"sigma must be a finite real in \[0\.0, inf\), got -1\.0",
    ),
    (lambda: stability.stability_bound_message(0.1, 0.1, 3, -2), r"num_workers.*-2"),
    (lambda: round_robin.round_robin_easgd_worker_map(0.1, 0.1, 3, 3), r"i .*\[0, 2\].*3"),
    (lambda: round_robin.admm_worker_map(0.1, 0.1, -1, 3), r"i .*>= 0.*-1"),
    (lambda: round_robin.admm_spectral_radius(-1.0, 1.0, 3), r"eta \* rho.*-1"),
    (lambda: round_robin.admm_simulate(0.001, 2.5, 3, -5), r"num_rounds.*-5"),
    (lambda: quadratic.simulate_sync_easgd(0.1, 0.1, 0, 2, 5), r"tau.*0"),
    (
        lambda: quadratic.simulate_sync_easgd(0.1, 0.1, 1, 2, 5, sigma=1.0, eta=0.1),
        r"key.*sigma > 0",
    ),
    (lambda: quadratic.simulate_sync_easgd(0.1, 0.1, 1, 2, 5, x0=np.ones(4)), r"x0.*\(4,\)"),
    (lambda: quadratic.estimate_spectral_radius(0.1, 0.1, 1, 2, num_periods=1), r"num_periods.*1"),
]


@pytest.mark.parametrize("call,pattern", BAD_CALLS)
def test_bad_inputs_raise_value_error_naming_the_value(call, pattern):
  with pytest.raises(ValueError, match=pattern):
    call()
