"""easgd.analysis.hessian: the largest ALGEBRAIC Hessian eigenvalue, certified by its residual.

Reference values are exact (diagonal and bilinear forms) or a float64 dense
Hessian (``jax.hessian`` on the flat parameter vector). The products run in
float32, so estimates agree to a few float32 ulps; tolerances are set at the
measured error (noted at each assertion).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from easgd.analysis import hessian
from easgd.sweeps import network
from easgd.tasks import models


def test_saddle_xy_gives_plus_one_for_every_key():
  # f(x, y) = x y: Hessian [[0, 1], [1, 0]], eigenvalues +1 and -1 of equal
  # magnitude. Power iteration returned 0.375 ... 1.0, all "converged".
  f = lambda v: v[0] * v[1]
  for seed in range(20):
    r = hessian.top_hessian_eigenvalue(f, jnp.array([0.3, -0.7]), jax.random.key(seed))
    assert r.method == "dense" and r.converged
    assert r.eigenvalue == pytest.approx(1.0, abs=1e-12)  # float64 eigh of exact H
    assert r.residual <= 1e-7  # measured 1.7e-8 (float32 product of the unit vector)
    v = ravel_pytree(r.eigenvector)[0]
    np.testing.assert_allclose(np.abs(v), np.sqrt(0.5), rtol=1e-6)


def test_bilinear_saddle_through_lanczos():
  # f(x, y) = sum_i d_i x_i y_i on R^100 x R^100: eigenvalues +-d_i, so the
  # two ends +-3 have equal magnitude. Old power iteration: 0.63-3.0, all
  # "converged". n = 200 > DENSE_MAX_PARAMETERS: ARPACK.
  d = jnp.asarray(np.r_[3.0, np.linspace(0.1, 2.0, 99)], jnp.float32)
  f = lambda v: jnp.sum(v[:100] * d * v[100:])
  for seed in range(5):
    r = hessian.top_hessian_eigenvalue(f, jnp.ones(200), jax.random.key(seed))
    assert r.method == "lanczos" and r.converged
    assert r.residual <= 1e-4 * abs(r.eigenvalue)
    np.testing.assert_allclose(r.eigenvalue, 3.0, rtol=2e-7)  # measured <= 4e-8
    assert abs(r.eigenvalue - 3.0) <= r.residual + 1e-6  # the residual bound


def test_dominant_negative_eigenvalue_gives_largest_algebraic():
  # diag(-20, 2, linspace(-1, 1, 198)): lambda_max = 2, dominated by -20.
  # Old (power iteration, then a shifted pass): 1.983 "converged" or 1.868.
  a = jnp.asarray(np.r_[-20.0, 2.0, np.linspace(-1.0, 1.0, 198)], jnp.float32)
  q = lambda v: 0.5 * jnp.sum(a * v * v)
  for seed in range(3):
    r = hessian.top_hessian_eigenvalue(q, jnp.ones(200), jax.random.key(seed))
    assert r.method == "lanczos" and r.converged
    np.testing.assert_allclose(r.eigenvalue, 2.0, rtol=1e-7)  # measured <= 2.4e-8
  # The same on the dense path (n = 3).
  d = jnp.array([-5.0, 1.0, 2.0])
  r = hessian.top_hessian_eigenvalue(lambda v: 0.5 * v @ (d * v), jnp.ones(3), jax.random.key(1))
  assert r.method == "dense" and r.converged and r.eigenvalue == pytest.approx(2.0, abs=1e-12)
  np.testing.assert_allclose(np.abs(np.asarray(r.eigenvector)), [0, 0, 1], atol=1e-12)
  # A linear loss, H = 0: lambda_max = 0 exactly on both paths (ARPACK alone
  # stops with "starting vector is zero").
  for n in (3, 50):
    r = hessian.top_hessian_eigenvalue(jnp.sum, jnp.ones(n), jax.random.key(0))
    assert (r.eigenvalue, r.residual, r.converged) == (0.0, 0.0, True)


def test_not_converged_when_budget_or_tolerance_cannot_be_met():
  # Eigenvalues linspace(0, 1, 400): gap 0.0025 at the top. In 30 products
  # Lanczos cannot reach residual 1e-3 (it needs 51); old power iteration
  # stopped at 0.987 "converged" after 23.
  a = jnp.asarray(np.linspace(0.0, 1.0, 400), jnp.float32)
  q = lambda v: 0.5 * jnp.sum(a * v * v)
  r = hessian.top_hessian_eigenvalue(q, jnp.ones(400), jax.random.key(0), 30, 1e-3)
  assert not r.converged and r.iterations == 30
  assert np.isnan(r.eigenvalue) and np.isnan(r.residual)
  # With budget it converges (measured: 51 products + 1 for the residual).
  r = hessian.top_hessian_eigenvalue(q, jnp.ones(400), jax.random.key(0), 100, 1e-3)
  assert r.converged and r.iterations == 52 and r.residual <= 1e-3 * r.eigenvalue
  assert abs(r.eigenvalue - 1.0) <= r.residual
  # ARPACK's own estimate meets tol = 1e-8, the measured float32 residual
  # (1.5e-7) does not: an estimate is returned, not certified.
  loss, params, _ = _tiny_mlp_loss(0)
  r = hessian.top_hessian_eigenvalue(loss, params, jax.random.key(0), 100, 1e-8)
  assert not r.converged and np.isfinite(r.eigenvalue)
  assert r.residual > 1e-8 * r.eigenvalue


def _tiny_mlp_loss(seed):
  """(loss, params, (model, x, y)) of a 75-parameter MLP on 16 random examples."""
  model = models.MLP(num_classes=3, hidden=(8,))
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  params = models.init_params(model, (5,), k1)
  x = jax.random.normal(k2, (16, 5))
  y = jax.random.randint(k3, (16,), 0, 3)
  loss = lambda q: models.cross_entropy_loss(model.apply({"params": q}, x), y)
  return loss, params, (model, x, y)


def _dense_hessian_f64(model, params, x, y):
  flat, unravel = ravel_pytree(params)
  with jax.enable_x64(True):
    f64 = jnp.asarray(np.asarray(flat), jnp.float64)
    x64 = jnp.asarray(np.asarray(x), jnp.float64)
    loss = lambda f: models.cross_entropy_loss(model.apply({"params": unravel(f)}, x64), y)
    h = np.asarray(jax.hessian(loss)(f64), np.float64)
  assert h.dtype == np.float64
  return 0.5 * (h + h.T)


def test_small_mlp_agrees_with_dense_float64_hessian():
  # Old power iteration at its defaults: relative error 6e-6 to 5e-5.
  for seed in range(3):
    loss, params, (model, x, y) = _tiny_mlp_loss(seed)
    h = _dense_hessian_f64(model, params, x, y)
    exact = np.linalg.eigvalsh(h)[-1]
    for key in range(2):
      r = hessian.top_hessian_eigenvalue(loss, params, jax.random.key(key))
      assert r.method == "lanczos" and r.converged and r.iterations <= 101
      np.testing.assert_allclose(r.eigenvalue, exact, rtol=1e-7)  # measured <= 3e-8
      assert abs(r.eigenvalue - exact) <= r.residual + 1e-7 * exact
      v = np.asarray(ravel_pytree(r.eigenvector)[0], np.float64)
      np.testing.assert_allclose(np.linalg.norm(v), 1.0, rtol=1e-6)
      # an eigenvector of the float64 Hessian too (measured 1.5e-7)
      assert np.linalg.norm(h @ v - r.eigenvalue * v) <= 1e-6


def test_sweep_curvature_matches_dense_and_refuses_uncertified_estimates():
  loss, params, (model, x, y) = _tiny_mlp_loss(2)
  exact = np.linalg.eigvalsh(_dense_hessian_f64(model, params, x, y))[-1]
  est = network.hessian_curvature(model, params, x, y, jax.random.key(0))
  assert est["converged"] and est["method"] == "lanczos"
  np.testing.assert_allclose(hessian.certified_curvature(est), exact, rtol=1e-7)
  bad = network.hessian_curvature(model, params, x, y, jax.random.key(0), num_iterations=5)
  assert not bad["converged"] and bad["h"] is None and bad["products"] == 5
  assert hessian.certified_curvature(bad) is None
  with pytest.warns(hessian.CurvatureWarning, match="did not converge within 5 "):
    hessian.warn_unconverged(bad, "the start")


def test_refuses_traced_params_bad_settings_and_non_finite_products():
  loss = lambda v: v @ v
  with pytest.raises(ValueError, match="cannot be traced; call it outside jax.jit"):
    jax.jit(lambda q: hessian.top_hessian_eigenvalue(loss, q, jax.random.key(0)).eigenvalue)(
        jnp.ones(30)
    )
  with pytest.raises(ValueError, match="num_iterations must be an integer >= 1, got 0"):
    hessian.top_hessian_eigenvalue(loss, jnp.ones(2), jax.random.key(0), 0)
  with pytest.raises(ValueError, match=r"tol must be a finite real in \(0, inf\), got 0"):
    hessian.top_hessian_eigenvalue(loss, jnp.ones(2), jax.random.key(0), 10, 0)
  # exp(100 x) overflows float32 at x = 10: no eigenvalue, loudly
  for n in (3, 30):
    with pytest.raises(ValueError, match="Hessian-vector product at params is not finite"):
      hessian.top_hessian_eigenvalue(
          lambda v: jnp.sum(jnp.exp(100.0 * v)), jnp.full(n, 10.0), jax.random.key(0)
      )
