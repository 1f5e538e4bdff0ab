"""The one-program tau x alpha sweep, its divergence flags and `easgd sweep`.

Everything is tiny (scalar quadratics, an 8-unit MLP on random data) so the file
runs in well under a minute on two CPU cores.
"""

import dataclasses
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from easgd import cli
from easgd._util import flags
from easgd.analysis import hessian, stability
from easgd.asynchrony import simulation
from easgd.core import algorithms
from easgd.methods import baselines
from easgd.methods.downpour_family import mdownpour
from easgd.sweeps import command, engine, network, quadratic, report
from easgd.sweeps.engine import CompileCounter
from easgd.sweeps.grid import SweepGrid
from easgd.tasks import models


def numpy_easgd_quadratic(lr, tau, alpha, h, w0, c0, noise):
  """Eq. (5)-(6) with period tau on F(x) = h x^2 / 2, float64, written out.

  Returns (center, final_loss, worker_center_distance) like the sweep: the loss
  is the mean worker loss at the parameters before the last step.
  """
  x, c = np.asarray(w0, np.float64), float(c0)
  loss = None
  for t in range(noise.shape[0]):
    loss = np.mean(0.5 * h * x * x + noise[t] * x)
    g = h * x + noise[t]
    if t % tau == 0:
      d = alpha * (x - c)  # every worker reads x~_t ...
      x, c = x - lr * g - d, c + d.sum()  # ... and the center the SUM of forces
    else:
      x = x - lr * g
  return c, loss, np.mean(np.abs(x - c))


def test_quadratic_sweep_matches_individual_runs():
  p, steps, h, sigma = 3, 40, 1.5, 0.1
  grid = SweepGrid(tau=(1, 3), alpha=(0.1, 0.3), learning_rate=(0.3, 0.7), num_workers=(p,))
  res = quadratic.sweep_quadratic(grid, steps, curvature=h, sigma=sigma, seed=3)
  assert len(res.records) == 8 and not any(r["diverged"] for r in res.records)
  w0, c0 = quadratic.quadratic_start(p)
  noise = np.asarray(sigma * jax.random.normal(jax.random.key(3), (steps, p)), np.float64)
  for r in res.records:
    one = quadratic.sweep_quadratic(
        SweepGrid(
            tau=(r["tau"],),
            alpha=(r["alpha"],),
            learning_rate=(r["learning_rate"],),
            num_workers=(p,),
        ),
        steps,
        curvature=h,
        sigma=sigma,
        seed=3,
    ).records[0]
    for k in ("center_loss", "final_loss", "worker_center_distance"):
      np.testing.assert_allclose(r[k], one[k], rtol=1e-6, atol=1e-7, err_msg=k)
    c, loss, dist = numpy_easgd_quadratic(
        r["learning_rate"], r["tau"], r["alpha"], h, w0, c0, noise
    )
    np.testing.assert_allclose(r["center_loss"], 0.5 * h * c * c, rtol=1e-4)
    np.testing.assert_allclose(r["final_loss"], loss, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(r["worker_center_distance"], dist, rtol=1e-4, atol=1e-7)
  # Noise-free, against easgd.sweeps.quadratic's independent simulation.
  res = quadratic.sweep_quadratic(grid, steps, curvature=h)
  lr, tau, alpha = grid.flat()
  sim = quadratic.simulate_sync_easgd(
      lr.astype(np.float64) * h, alpha, tau, p, steps, x0=np.r_[w0, c0], trajectory=False
  )
  np.testing.assert_allclose(
      [r["center_loss"] for r in res.records],
      0.5 * h * np.asarray(sim.center, np.float64) ** 2,
      rtol=1e-4,
  )


def test_divergence_flags_agree_with_analytic_radius():
  p = 4
  grid = SweepGrid(
      tau=(1, 2, 4, 8),
      alpha=(0.05, 0.2, 0.35, 0.5, 0.7, 0.9),
      learning_rate=(0.1, 0.5, 1.0, 1.9),
      num_workers=(p,),
  )
  res = quadratic.sweep_quadratic(grid, 2000)
  radius = np.array(
      [
          stability.sync_easgd_spectral_radius(r["learning_rate"], r["alpha"], r["tau"], p)
          for r in res.records
      ]
  )
  np.testing.assert_allclose([r["theory_radius"] for r in res.records], radius)
  diverged = np.array([r["diverged"] for r in res.records])
  clear = np.abs(radius - 1.0) > 0.05
  assert clear.sum() > 60 and diverged[clear].sum() >= 10 and (~diverged[clear]).sum() >= 10
  bad = [res.records[i] for i in np.flatnonzero(clear & (diverged != (radius > 1)))]
  assert not bad, bad[:3]
  steps = np.array([r["diverged_step"] for r in res.records])
  assert np.all(steps[diverged] >= 0) and np.all(steps[~diverged] == -1)


def test_diverged_configuration_does_not_contaminate_others():
  p, steps = 2, 30
  # eta = 1e20 overflows to inf/NaN in two steps; eta = 0.3 is stable.
  grid = SweepGrid(tau=(1, 2), alpha=(0.2,), learning_rate=(0.3, 1e20), num_workers=(p,))
  res = quadratic.sweep_quadratic(grid, steps)
  stable = [r for r in res.records if r["learning_rate"] == 0.3]
  exploded = [r for r in res.records if r["learning_rate"] == 1e20]
  assert all(r["diverged"] and r["diverged_step"] == 1 for r in exploded)
  for r in exploded:  # frozen at the last good (finite) state
    assert all(np.isfinite(r[k]) for k in ("center_loss", "worker_center_distance"))
  for r in stable:
    assert not r["diverged"]
    alone = quadratic.sweep_quadratic(
        SweepGrid(tau=(r["tau"],), alpha=(0.2,), learning_rate=(0.3,), num_workers=(p,)), steps
    ).records[0]
    for k in ("center_loss", "final_loss", "worker_center_distance"):
      assert np.isfinite(r[k])
      np.testing.assert_allclose(r[k], alone[k], rtol=1e-6, atol=1e-12)
  assert np.all(np.isfinite(res.centers[p]))


def test_center_divergence_is_flagged_when_the_workers_stay_bounded(tmp_path):
  # eta h = 1, tau = 4, p = 16 from quadratic_start (workers 0.5..1.5, x~ = 1):
  # a plain step sends a worker to 0 exactly; at t = 0 the mean of the workers
  # equals x~, so x~ stays 1, and at every later exchange t = 4k the workers are
  # at 0:   x^i <- alpha x~,   x~ <- (1 - beta) x~,   beta = p alpha.
  #   alpha = 0.2 (beta = 3.2): x~_T = (-2.2)^6 = 113.4 after t = 24, center
  #     loss 0.5 * 2.2^12 = 6427.5 = 12855 x F(x~_0) = 0.5; the workers' loss
  #     peaks at t = 25: 0.5 (0.2 * 2.2^5)^2 = 53.1 = 97 x its step-0 0.547.
  #   alpha = 0.1 (beta = 1.6): x~ shrinks by 0.6 per exchange: fine.
  p, steps = 16, 26
  grid = SweepGrid(tau=(4,), alpha=(0.1, 0.2), learning_rate=(1.0,), num_workers=(p,))
  res = quadratic.sweep_quadratic(grid, steps, curvature=1.0)
  fine, ruined = res.records
  np.testing.assert_allclose(ruined["center_loss"], 0.5 * 2.2**12, rtol=2e-6)
  np.testing.assert_allclose(ruined["final_loss"], 0.5 * (0.2 * 2.2**5) ** 2, rtol=2e-6)
  assert ruined["initial_center_loss"] == 0.5 and fine["initial_center_loss"] == 0.5
  assert ruined["final_loss"] < 100 * ruined["initial_loss"]  # workers bounded
  # old code: diverged False (only the workers' loss was tested)
  assert ruined["center_diverged"] and not ruined["workers_diverged"]
  assert ruined["diverged"] and ruined["diverged_step"] == steps  # found at the end
  assert not (fine["diverged"] or fine["center_diverged"] or fine["workers_diverged"])
  assert fine["diverged_step"] == -1 and fine["center_loss"] < 1e-2
  # the theory agrees with the combined flag on both (radius 2.2 and 0.6)
  assert [r["theory_stable"] for r in res.records] == [True, False]
  text = report.summarize(res)
  assert (
      "2 configurations, 1 diverged (0 by the workers' loss, 1 by the center's, "
      "1 of them by the center's alone)"
  ) in text
  assert "divergence agrees with radius >= 1 on 2/2 configurations" in text  # old: 1/2
  report.write_result(res, tmp_path, plots=False)
  header, *rows = (tmp_path / "sweep.csv").read_text().splitlines()
  cols = header.split(",")
  assert ["diverged", "workers_diverged", "center_diverged", "diverged_step"] == cols[
      cols.index("diverged") : cols.index("diverged") + 4
  ]
  row = dict(zip(cols, rows[1].split(",")))
  assert (
      row["diverged"],
      row["workers_diverged"],
      row["center_diverged"],
      row["diverged_step"],
      row["initial_center_loss"],
  ) == ("True", "False", "True", "26", "0.5")
  data = json.loads((tmp_path / "sweep.json").read_text())
  assert data["records"][1]["center_diverged"] is True


def test_second_sweep_with_other_values_does_not_recompile():
  grid = SweepGrid(tau=(1, 5), alpha=(0.1, 0.2, 0.3), learning_rate=(0.2,), num_workers=(3,))
  with CompileCounter() as first:
    quadratic.sweep_quadratic(grid, 23)
  assert first.count >= 1  # the counter sees compilations at all
  other = SweepGrid(tau=(2, 7), alpha=(0.05, 0.4, 0.6), learning_rate=(0.9,), num_workers=(3,))
  with CompileCounter() as second:
    res = quadratic.sweep_quadratic(other, 23)
  assert second.count == 0
  assert res.info["programs"][3]["compiles"] == 0
  assert {r["alpha"] for r in res.records} == {0.05, 0.4, 0.6}


def _tiny_network(p, steps, batch=4, seed=0):
  model = models.MLP(num_classes=3, hidden=(8,))
  k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
  params0 = models.init_params(model, (5,), k1)
  x = jax.random.normal(k2, (steps, p, batch, 5))
  y = jax.random.randint(k3, (steps, p, batch), 0, 3)
  test = (jax.random.normal(k4, (32, 5)), jnp.arange(32) % 3)
  return model, params0, (x, y), test


def test_network_sweep_matches_easgd_algorithm_runs_and_does_not_recompile():
  p, steps = 2, 7
  model, params0, batches, test = _tiny_network(p, steps)
  loss_fn, eval_fn = network.network_fns(model)
  build = functools.partial(algorithms.easgd, loss_fn, num_workers=p)
  run = engine.make_sweep_fn(build, p, steps, eval_fn)
  grid = SweepGrid(tau=(1, 3), alpha=(0.1, 0.4), learning_rate=(0.5,), num_workers=(p,)).validate()
  lr, tau, alpha = grid.flat()
  workers0 = jax.tree.map(lambda a: jnp.stack([a] * p), params0)
  key = jax.random.key(1)
  out = run(grid.hyperparameters(), workers0, params0, batches, test, key, 1e3)
  assert not np.any(out["diverged"])
  assert not np.any(out["workers_diverged"]) and not np.any(out["center_diverged"])
  # the center's reference: eval_fn once at the common start
  np.testing.assert_allclose(
      out["initial_center_loss"], eval_fn(params0, test)["center_loss"], rtol=1e-6
  )
  for i in (0, 3):  # (tau 1, alpha 0.1) and (tau 3, alpha 0.4): both exchange patterns
    algo = algorithms.easgd(
        loss_fn, optax.sgd(float(lr[i])), num_workers=p, tau=int(tau[i]), alpha=float(alpha[i])
    )
    ref = engine.run_with_algorithm(
        algo, params0, batches, key, num_workers=p, eval_fn=eval_fn, eval_data=test
    )
    got = jax.tree.map(lambda a: a[i], out["center"])
    flat_got, flat_ref = ravel_pytree(got)[0], ravel_pytree(ref["center"])[0]
    np.testing.assert_allclose(flat_got, flat_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["final_loss"][i], np.mean(ref["losses"][-1]), rtol=1e-5)
    np.testing.assert_allclose(out["test_accuracy"][i], ref["test_accuracy"])
  with CompileCounter() as cc:
    jax.block_until_ready(
        run(
            dict(learning_rate=lr, tau=tau, alpha=alpha[::-1] * 0.5),
            workers0,
            params0,
            batches,
            test,
            key,
            1e3,
        )
    )
  assert cc.count == 0


def test_network_sweep_uses_only_certified_curvature():
  # 3 Hessian-vector products cannot finish a Lanczos cycle: no certified h,
  # so no theory columns and no boundary (old code: a 3-step power-iteration
  # value went into every theory column).
  grid = SweepGrid(tau=(1, 4), alpha=(0.1, 0.9), learning_rate=(0.1,), num_workers=(2,))
  kw = dict(dataset="digits", hessian_examples=200)
  with pytest.warns(hessian.CurvatureWarning, match="did not converge within 3 Hessian"):
    res = network.sweep_network(grid, 20, hessian_iterations=3, **kw)
  assert res.curvature is None and not res.info["hessian_init"]["converged"]
  assert all(
      r["eta_h"] is None and r["theory_radius"] is None and r["theory_radius_trained"] is None
      for r in res.records
  )
  assert "h at the start: NOT converged in 3 Hessian-vector products" in report.summarize(res)
  res = network.sweep_network(grid, 20, **kw)
  est = res.info["hessian_init"]
  assert est["converged"] and est["residual"] <= est["tol"] * est["h"]
  assert res.curvature == est["h"] and res.records[0]["eta_h"] == pytest.approx(0.1 * est["h"])


BAD_INPUTS = [
    (["--tau", "0,1"], "tau grid value must be an integer >= 1, got 0"),
    (["--alpha=-0.1,0.2"], "alpha grid value must be a finite real in [0.0, inf), got -0.1"),
    (["--alpha", "-0.5"], "alpha grid value must be a finite real in [0.0, inf), got -0.5"),
    (["--learning-rate", "0"], "learning_rate grid value must be a finite real in (0.0, inf)"),
    (["--num-workers", "0"], "num_workers grid value must be an integer >= 1, got 0"),
    (["--tau", "2,2"], "tau grid has the value 2 twice"),
    (["--tau", "1,x"], "argument --tau: invalid int_list value: '1,x'"),
    (
        ["--num-steps", "0"],
        "num_steps (local steps per worker; int32 step counter) must "
        "be an integer in [1, 2147483647], got 0",
    ),
    (["--divergence-factor", "0.5"], "divergence_factor must be a finite real in (1, inf)"),
    (["--hessian-tol", "0"], "hessian_tol must be a finite real in (0.0, inf), got 0.0"),
    (["--problem", "quad"], "argument --problem: invalid choice: 'quad'"),
]


@pytest.mark.parametrize("flags,message", BAD_INPUTS)
def test_cli_sweep_bad_input_is_one_line_and_exit_2(flags, message, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    sys.exit(cli.main(["sweep", "--workdir", str(tmp_path / "s"), *flags]))
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("easgd: error: "), err
  assert message in err
  assert not (tmp_path / "s").exists()


def test_cli_sweep_quadratic_end_to_end(tmp_path, capsys):
  args = [
      "sweep",
      "--workdir",
      str(tmp_path / "s"),
      "--problem",
      "quadratic",
      "--tau",
      "1,4",
      "--alpha",
      "0.1,1.2",
      "--learning-rate",
      "0.5",
      "--num-workers",
      "2",
      "--num-steps",
      "200",
  ]
  assert cli.main(args) == 0
  out = capsys.readouterr().out
  assert "quadratic: 4 configurations, 2 diverged" in out
  lines = (tmp_path / "s" / "sweep.csv").read_text().splitlines()
  assert (
      lines[0].split(",")[:5] == ["problem", "num_workers", "learning_rate", "tau", "alpha"]
      and len(lines) == 5
  )
  data = json.loads((tmp_path / "s" / "sweep.json").read_text())
  assert [r["diverged"] for r in data["records"]] == [False, True, False, True]
  assert all(r["theory_stable"] == (not r["diverged"]) for r in data["records"])
  assert (tmp_path / "s" / "diverged.png").stat().st_size > 1000
  assert json.loads((tmp_path / "s" / "sweep_config.json").read_text())["tau"] == [1, 4]
  assert cli.main(args) == 2  # refuses to overwrite without --overwrite
  assert "already holds a sweep" in capsys.readouterr().err


def test_failed_sweep_leaves_an_earlier_sweep_consistent(tmp_path):
  from easgd import cli

  ok = [
      "sweep",
      "--workdir",
      str(tmp_path),
      "--problem",
      "quadratic",
      "--tau",
      "1,2",
      "--alpha",
      "0.1,0.2",
      "--num-steps",
      "5",
      "--no-plots",
  ]
  assert cli.main(ok) == 0
  before = (tmp_path / "sweep_config.json").read_text()
  assert cli.main(ok[:-1] + ["--overwrite", "--problem", "network", "--dataset", "foo"]) == 2
  assert (tmp_path / "sweep_config.json").read_text() == before


# ---------------------------------------------------------------------------
# The engine runs any algorithm whose hyperparameters are arrays
# ---------------------------------------------------------------------------


def _linear_loss(params, batch, key):
  x, y = batch
  noise = 0.01 * jax.random.normal(key, y.shape)  # the step's key reaches the loss
  return jnp.mean((x @ params["w"] + params["b"] - y + noise) ** 2)


SWEPT = [  # (factory, fixed Python arguments, swept values of two configurations)
    (algorithms.easgd, {}, dict(learning_rate=(0.1, 0.3), tau=(1, 3), alpha=(0.1, 0.4))),
    (
        algorithms.eamsgd,
        {},
        dict(learning_rate=(0.05, 0.1), tau=(2, 3), alpha=(0.1, 0.2), momentum=(0.5, 0.9)),
    ),
    (algorithms.pmean_sgd, {}, dict(learning_rate=(0.1, 0.3))),
    (baselines.local_sgd, dict(num_steps=7), dict(learning_rate=(0.1, 0.2), tau=(2, 3))),
    (
        baselines.diloco,
        dict(num_steps=7),
        dict(
            learning_rate=(0.1, 0.2),
            tau=(2, 3),
            outer_learning_rate=(0.5, 0.9),
            outer_momentum=(0.5, 0.9),
        ),
    ),
    (baselines.msgd, {}, dict(learning_rate=(0.05, 0.1), momentum=(0.5, 0.9))),
    (baselines.mvasgd, {}, dict(learning_rate=(0.1, 0.2), average_rate=(0.1, 0.5))),
    (mdownpour, dict(tau=2), dict(learning_rate=(0.05, 0.1), momentum=(0.5, 0.9))),
    (simulation.async_easgd, dict(tau=2), dict(learning_rate=(0.1, 0.2), alpha=(0.1, 0.3))),
]


@pytest.mark.parametrize("factory,fixed,swept", SWEPT, ids=[f.__name__ for f, _, _ in SWEPT])
def test_the_engine_sweeps_every_algorithm_with_array_hyperparameters(factory, fixed, swept):
  # The configurations of one program each equal the algorithm built with their
  # Python values and run as its own program (run_with_algorithm).
  p, steps = 2, 7
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  params0 = dict(w=0.1 * jax.random.normal(k1, (3,)), b=jnp.zeros(()))
  batches = (jax.random.normal(k2, (steps, p, 4, 3)), jax.random.normal(k3, (steps, p, 4)))
  build = functools.partial(factory, _linear_loss, num_workers=p, **fixed)
  run = engine.make_sweep_fn(build, p, steps)
  hyper = {k: np.asarray(v, np.int32 if k == "tau" else np.float32) for k, v in swept.items()}
  workers0 = jax.tree.map(lambda a: jnp.stack([a] * p), params0)
  key = jax.random.key(4)
  out = run(hyper, workers0, params0, batches, None, key, 1e3)
  assert not np.any(out["diverged"])
  for i in range(2):
    python = {k: (int if k == "tau" else float)(v[i]) for k, v in swept.items()}
    ref = engine.run_with_algorithm(build(**python), params0, batches, key, num_workers=p)
    got = jax.tree.map(lambda a: a[i], out["center"])
    np.testing.assert_allclose(
        ravel_pytree(got)[0], ravel_pytree(ref["center"])[0], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(out["final_loss"][i], np.mean(ref["losses"][-1]), rtol=1e-5)


def test_each_configuration_may_have_its_own_key_and_start():
  # A learning rate x seed grid: per_config gives every configuration its key
  # and start; each equals its own run.
  p, steps = 2, 5
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  params0 = dict(w=jax.random.normal(k1, (2, 3)), b=jnp.zeros((2,)))  # two seeds
  batches = (jax.random.normal(k2, (steps, p, 4, 3)), jax.random.normal(k3, (steps, p, 4)))
  keys = jax.random.split(jax.random.key(2), 2)
  build = functools.partial(algorithms.easgd, _linear_loss, num_workers=p, tau=2, alpha=0.2)
  run = engine.make_sweep_fn(build, p, steps, per_config=("worker_params", "center", "key"))
  workers0 = jax.tree.map(lambda a: jnp.stack([a] * p, axis=1), params0)
  out = run(dict(learning_rate=np.float32([0.1, 0.1])), workers0, params0, batches, None, keys, 1e3)
  for i in range(2):
    start = jax.tree.map(lambda a: a[i], params0)
    ref = engine.run_with_algorithm(
        build(learning_rate=0.1), start, batches, keys[i], num_workers=p
    )
    np.testing.assert_allclose(out["center"]["w"][i], ref["center"]["w"], rtol=1e-6)
  assert not np.allclose(out["center"]["w"][0], out["center"]["w"][1])
  with pytest.raises(engine.SweepError, match="per_config names unknown"):
    engine.make_sweep_fn(build, p, steps, per_config=("seed",))


def test_the_sweep_and_the_simulator_run_the_algorithms_own_step(monkeypatch):
  # Every program traces easgd.core.algorithms.easgd's step: no copy of the rule.
  traced = []
  factory = algorithms.easgd

  def counting_easgd(*args, **kwargs):
    algo = factory(*args, **kwargs)

    def step(*a, **kw):
      traced.append(kwargs.get("tau"))
      return algo.step(*a, **kw)

    return algo._replace(step=step)

  monkeypatch.setattr(algorithms, "easgd", counting_easgd)
  quadratic.simulate_sync_easgd([0.1, 0.2], 0.1, [1, 2], num_workers=3, num_steps=11)
  assert traced and all(isinstance(t, jax.Array) for t in traced)  # traced tau
  traced.clear()
  quadratic.estimate_spectral_radius([0.1, 0.2], 0.1, [1, 2], 3, num_periods=6)
  assert traced
  traced.clear()
  quadratic.sweep_quadratic(SweepGrid(tau=(1, 2), alpha=(0.1,), num_workers=(5,)), 13)
  assert traced


def test_sweep_flags_are_generated_from_the_config_fields(capsys):
  args = cli.build_parser().parse_args(
      [
          "sweep",
          "--workdir",
          "w",
          "--no-hessian-at-trained",
          "--data-dir",
          "none",
          "--tau",
          "1,2",
          "--alpha",
          "0.5",
      ]
  )
  assert flags.overrides(args, command.SweepConfig) == dict(
      hessian_at_trained=False, data_dir=None, tau=(1, 2), alpha=(0.5,)
  )
  with pytest.raises(SystemExit):
    cli.build_parser().parse_args(["sweep", "--help"])
  text = capsys.readouterr().out
  singular = {"task_args": "--task-arg"}  # repeated, one key=value each (as easgd train)
  for f in dataclasses.fields(command.SweepConfig):
    flag = singular.get(f.name, "--" + f.name.replace("_", "-"))
    assert f.metadata["help"] and flag in text
