"""Every setting means what it says: defaults that keep each algorithm itself,
settings an algorithm does not read refused, the end of training defined, a
comparison that reports what it did not apply, and divergence caught before
anything non-finite is saved.
"""

import json

import jax
import numpy as np
import pytest

from easgd.core import algorithms, elastic
from easgd.methods import registry
from easgd.run import checkpoint, trainer
from easgd.run.compare import compare
from easgd.runtimes import spmd, training_run
from easgd.settings.config import ConfigError, TrainConfig

from linear_problem import loss_fn, params0

# digits: 1438 training images; global batch 64 -> 22 steps per epoch
DIGITS = TrainConfig(
    dataset="digits",
    model="mlp",
    num_workers=4,
    global_batch_size=64,
    num_epochs=1,
    learning_rate=0.1,
    eval_batch_size=64,
    progress=False,
)


def center_and_workers(workdir):
  """The latest checkpoint's center and worker parameters (host arrays)."""
  ckpt = checkpoint.Checkpointer(workdir)
  try:
    state = ckpt.restore(ckpt.latest_step())
  finally:
    ckpt.close()
  return state["center"], state["worker"]["params"], state


# -- 1. the momentum methods keep their momentum ---------------------------------


def test_eamsgd_takes_the_papers_delta_by_default_and_differs_from_easgd(tmp_path):
  assert TrainConfig().delta == 0.99
  cfg = DIGITS.replace(tau=8, learning_rate=0.01)
  easgd = trainer.train_and_evaluate(cfg.replace(algorithm="easgd"), tmp_path / "e")
  eamsgd = trainer.train_and_evaluate(cfg.replace(algorithm="eamsgd"), tmp_path / "m")
  assert eamsgd["algorithm"]["momentum"] == 0.99
  assert eamsgd["final"]["test_loss"] != easgd["final"]["test_loss"]


@pytest.mark.parametrize(
    "name,equivalent",
    [
        ("eamsgd", "easgd"),
        ("async_eamsgd", "async_easgd"),
        ("msgd", "sgd"),
        ("mdownpour", "downpour"),
    ],
)
def test_a_delta_that_erases_the_momentum_is_refused_naming_the_equivalent(name, equivalent):
  cfg, _ = TrainConfig(delta=0.0).for_algorithm(name)
  with pytest.raises(ConfigError, match=f"delta=0 turns {name} into {equivalent}"):
    cfg.validate()
  assert registry.TABLE[name].without_momentum == equivalent


def test_the_optimizers_momentum_is_not_the_algorithms_delta():
  # momentum belongs to the local optimizer "momentum"/"nesterov" only
  with pytest.raises(
      ConfigError,
      match="momentum=0.9 has no effect with optimizer 'sgd'; " "use .* or delta for eamsgd",
  ):
    TrainConfig(algorithm="eamsgd", momentum=0.9).validate()
  cfg = TrainConfig(algorithm="easgd", optimizer="momentum", momentum=0.9).validate()
  assert cfg.momentum == 0.9


# -- 1. settings that nothing reads are refused ----------------------------------


@pytest.mark.parametrize(
    "algorithm,changes",
    [
        ("pmean_sgd", dict(tau=8)),
        ("sgd", dict(tau=8)),
        ("msgd", dict(tau=8)),
        ("asgd", dict(tau=8)),
        ("mvasgd", dict(tau=2)),
        ("easgd", dict(worker_speeds=(1, 2, 1, 1))),
        ("eamsgd", dict(staleness=2)),
        ("local_sgd", dict(exchange_order="random")),
        ("pmean_sgd", dict(max_worker_speed=3)),
        ("easgd", dict(delta=0.9)),
        ("downpour", dict(beta=0.5)),
        ("pmean_sgd", dict(alpha=0.1)),
        ("sgd", dict(outer_momentum=0.5)),
        ("easgd", dict(average_rate=0.1)),
        ("pmean_sgd", dict(reset_opt_state=True)),
        ("local_sgd", dict(curvature=2.0)),
        ("diloco", dict(delta=0.5)),
        ("async_easgd", dict(push_timing="full_period")),
    ],
)
def test_a_setting_the_algorithm_does_not_read_is_refused(algorithm, changes):
  ((name, value),) = changes.items()
  cfg = TrainConfig(algorithm=algorithm).replace(**changes)
  with pytest.raises(
      ConfigError,
      match=f"^{name}=.* is not read by algorithm " f"'{algorithm}'; leave it at its default",
  ):
    cfg.validate()
  # the message names the algorithms that read it, and they accept it
  reader = registry.readers("alpha" if name == "beta" else name)[0]
  TrainConfig(algorithm=reader).replace(**changes).validate()


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(lr_decay_factor=0.5), "lr_decay_factor=0.5 has no effect with lr_schedule"),
        (dict(bn_stats_examples=10), "bn_stats_examples=10 has no effect with model 'cnn'"),
        (dict(dataset="digits", data_dir="/tmp"), "data_dir='/tmp' is not read by dataset"),
    ],
)
def test_other_settings_that_nothing_reads_are_refused(changes, match):
  with pytest.raises(ConfigError, match=match):
    TrainConfig().replace(**changes).validate()


def test_every_algorithm_field_is_read_by_some_algorithm_and_defaults_are_accepted():
  for field in registry.ALGORITHM_FIELDS:
    assert registry.readers(field), field
  for name in registry.ALGORITHMS:
    cfg, dropped = TrainConfig().for_algorithm(name)
    assert cfg.validate().algorithm == name
    assert set(dropped) <= {"tau", "beta"} and not cfg.unread_fields()


# -- 1. a communication period longer than the run, and the end of training ------


def test_a_tau_longer_than_the_run_is_refused_before_compiling(tmp_path):
  with pytest.raises(
      ConfigError,
      match=r"tau=23 \(communication period\) is longer " r"than the whole run \(22 steps",
  ):
    trainer.train_and_evaluate(DIGITS.replace(algorithm="local_sgd", tau=23), tmp_path)
  assert not (tmp_path / "summary.json").exists()


def test_a_tau_that_leaves_the_center_untrained_is_refused_at_the_edge(tmp_path):
  # 22 steps: tau = 22 exchanges only at step 0, where every worker still equals
  # the center (the run would export the initial parameters); tau = 21 also
  # exchanges at step 21, and the center it exports has moved
  with pytest.raises(
      ConfigError,
      match=r"^tau=22 leaves the center untrained: easgd "
      r"first moves it at the exchange of a worker's "
      r"local step 22 .* only 22 steps \(22 steps = 1 "
      r"epochs x 22 steps\); allowed: tau <= 21$",
  ):
    trainer.train_and_evaluate(DIGITS.replace(tau=22), tmp_path / "refused")
  assert not (tmp_path / "refused" / "config.json").exists()
  cfg = DIGITS.replace(tau=21)
  s = trainer.train_and_evaluate(cfg, tmp_path / "edge")
  center, _, _ = center_and_workers(tmp_path / "edge")
  init = training_run.Run(cfg).init_params
  moved = [
      float(np.abs(np.asarray(c) - np.asarray(i)).max())
      for c, i in zip(jax.tree.leaves(center), jax.tree.leaves(init))
  ]
  assert min(moved) > 0 and s["communication"]["all_reduces"] == 2  # steps 0 and 21
  assert s["center_lag_steps"] == 1


@pytest.mark.parametrize(
    "algorithm,changes,steps",
    [
        ("eamsgd", dict(), 22),
        ("easgd", dict(sync_warmup_steps=5), 17),  # the warm-up's K steps are not easgd's
        ("local_sgd", dict(sync_warmup_steps=5), None),  # ends on an average: any tau
        ("async_easgd", dict(), 22),  # every worker: one step a slot
        ("async_eamsgd", dict(worker_speeds=(1, 2, 1, 1)), 22),  # the fastest: every slot
        ("async_easgd", dict(runtime="threads"), 22),  # clocks sum to 22 p: one reaches 22
        ("downpour", dict(push_timing="full_period"), None),  # first push after tau - 1
        ("downpour", dict(), None),  # first push after step 0
    ],
)
def test_the_center_rule_holds_for_every_family(algorithm, changes, steps):
  cfg = DIGITS.replace(algorithm=algorithm, **changes)
  if steps is None:  # every tau up to the run's length trains the center
    for tau in (21, 22):
      cfg.replace(tau=tau).validate().resolve(22)
    return
  cfg.replace(tau=steps - 1).validate().resolve(22)  # the edge: allowed
  with pytest.raises(
      ConfigError,
      match=f"^tau={steps} leaves the center untrained: "
      f"{algorithm} .* only {steps} steps .*allowed: "
      f"tau <= {steps - 1}$",
  ):
    cfg.replace(tau=steps).validate().resolve(22)


@pytest.mark.parametrize("speeds", [(1, 1, 1, 1), (1, 2, 1, 1), (3, 1, 2, 1)])
def test_at_the_edge_the_simulated_schedule_holds_an_exchange_at_local_step_tau(speeds):
  # the rule refuses exactly the taus whose realised exchanges (the simulated
  # schedule's log) are all at local step 0: at the edge tau = 21 of a 22-step run
  # the fastest worker takes a step in every slot, so its exchange at local step
  # 21 is served; tau = 22 has none
  import optax

  from easgd.asynchrony.log import exchange_log

  cfg = DIGITS.replace(algorithm="async_easgd", worker_speeds=speeds).validate()
  for tau in (20, 21, 22):
    algo = registry.make_algorithm(cfg.replace(tau=tau), loss_fn, optax.sgd(0.1), 22)
    log = exchange_log(algo, jax.random.key(0), 22)
    moves = bool((log["local_step"] >= 1).any())
    assert moves == (tau < 22), (tau, log["local_step"])
    try:
      cfg.replace(tau=tau).resolve(22)
      refused = False
    except ConfigError:
      refused = True
    assert refused == (not moves), tau


def test_a_run_too_short_for_any_exchange_to_move_the_center_says_so():
  with pytest.raises(
      ConfigError,
      match="tau=1 leaves the center untrained: .* only 1 "
      "steps .*allowed: a run that gives easgd at "
      "least 2 steps",
  ):
    DIGITS.replace(tau=1, sync_warmup_steps=21).validate().resolve(22)


@pytest.mark.parametrize("algorithm", ["easgd", "eamsgd", "async_easgd", "async_eamsgd"])
@pytest.mark.parametrize("given", ["alpha", "beta"])
def test_an_elastic_force_of_zero_is_refused(algorithm, given):
  # alpha = 0: no exchange ever moves the center, whatever tau
  cfg = DIGITS.replace(algorithm=algorithm, **{given: 0.0})
  with pytest.raises(
      ConfigError,
      match=f"^{given}=0.0 leaves the center untrained: its "
      f"elastic force .* is 0, so the center "
      f"{algorithm} evaluates and exports stays at the "
      f"initial parameters; allowed: {given} > 0$",
  ):
    cfg.validate()


@pytest.mark.parametrize("algorithm", ["local_sgd", "diloco"])
def test_local_sgd_and_diloco_end_on_an_average_that_is_returned(tmp_path, algorithm):
  # 22 steps, tau = 8: averages after steps 7 and 15, and after the last, 21
  s = trainer.train_and_evaluate(DIGITS.replace(algorithm=algorithm, tau=8), tmp_path)
  center, params, _ = center_and_workers(tmp_path)
  for c, w in zip(jax.tree.leaves(center), jax.tree.leaves(params)):
    if algorithm == "local_sgd":  # the center is the mean of the final workers
      np.testing.assert_allclose(c, w.mean(axis=0), rtol=0, atol=1e-6)
    for i in range(4):  # and every worker restarted from it
      np.testing.assert_array_equal(w[i], c)
  assert s["communication"]["all_reduces"] == 3 and s["center_lag_steps"] == 0
  assert s["final"]["test_accuracy"] > 0.5  # a trained model, not the initial one


def test_the_summary_states_how_far_the_center_lags_the_workers(tmp_path):
  # EASGD exchanges at t = 0, 8, 16: the center holds the workers of step 16,
  # which have taken 22 - 16 = 6 more steps
  s = trainer.train_and_evaluate(DIGITS.replace(tau=8), tmp_path)
  assert s["center_lag_steps"] == 6
  tau1 = algorithms.easgd(loss_fn, num_workers=4, tau=1, beta=0.9, learning_rate=0.1)
  assert spmd.center_lag_steps(tau1, "easgd", 22) == 1


# -- 1. compare reports what it did not apply, and refuses what nobody reads -----


def test_compare_reports_a_shared_setting_one_algorithm_does_not_read(tmp_path):
  cfg = DIGITS.replace(delta=0.9, learning_rate=0.01, tau=8)
  rows = compare(cfg, tmp_path, ["easgd", "eamsgd"])
  assert [r["settings"].get("delta") for r in rows] == [None, 0.9]
  text = (tmp_path / "results.md").read_text()
  assert "| algorithm | p | delta | tau | beta | epochs |" in text  # shared: no column
  assert "| easgd | 4 | - | 8 | 0.9 |" in text and "| eamsgd | 4 | 0.9 | 8 | 0.9 |" in text
  assert "Not read by easgd (run at its default): delta=0.9." in text
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["notes"] == ["Not read by easgd (run at its default): delta=0.9."]
  easgd_cfg = json.loads((tmp_path / "easgd" / "config.json").read_text())
  assert easgd_cfg["delta"] == 0.99  # easgd ran at the default, as reported


def test_compare_refuses_a_run_that_cannot_train_its_center_before_any_run(tmp_path):
  # pmean_sgd ignores tau (reset to its default); easgd's tau = 22 would leave its
  # center untrained: refused before pmean_sgd trains
  with pytest.raises(ConfigError, match="^tau=22 leaves the center untrained: easgd"):
    compare(DIGITS.replace(tau=22), tmp_path, ["pmean_sgd", "easgd"])
  assert not any(tmp_path.iterdir())


def test_compare_refuses_a_setting_that_no_compared_algorithm_reads(tmp_path):
  with pytest.raises(
      ConfigError,
      match="momentum=0.9 is read by none of the compared " r"algorithms \(easgd, eamsgd\)",
  ):
    compare(DIGITS.replace(momentum=0.9), tmp_path, ["easgd", "eamsgd"])
  assert not any(tmp_path.iterdir())


# -- 3. divergence of a one-model method: never saved, always an error -----------


@pytest.mark.parametrize("algorithm", ["pmean_sgd", "sgd", "msgd"])
def test_a_diverging_one_model_method_stops_and_never_saves_a_non_finite_state(tmp_path, algorithm):
  cfg, _ = DIGITS.replace(num_epochs=2, learning_rate=1e38).for_algorithm(algorithm)
  with pytest.raises(trainer.DivergenceError, match="training diverged"):
    trainer.train_and_evaluate(cfg, tmp_path)
  ckpt = checkpoint.Checkpointer(tmp_path)
  try:
    steps = ckpt.all_steps()
    for step in steps:
      state = ckpt.restore(step)
      for leaf in jax.tree.leaves((state["worker"], state["shared"], state["center"])):
        leaf = np.asarray(leaf)
        if np.issubdtype(leaf.dtype, np.floating):
          assert np.isfinite(leaf).all(), step
  finally:
    ckpt.close()
  assert not (tmp_path / "summary.json").exists()


# -- 6. a step outside any mapping says how to map it ----------------------------


@pytest.mark.parametrize(
    "name", ["easgd", "eamsgd", "pmean_sgd", "sgd", "local_sgd", "async_easgd", "downpour"]
)
def test_a_step_outside_a_mapping_raises_the_packages_error(name):
  cfg, _ = TrainConfig(num_workers=2, tau=2).for_algorithm(name)
  algo = registry.make_algorithm(cfg.validate(), loss_fn, __import__("optax").sgd(0.1), 8)
  worker, shared = algo.init(params0())
  batch = (np.zeros((4, 3), np.float32), np.zeros((4,), np.float32))
  with pytest.raises(elastic.MappingError, match="mapping.map_step") as e:
    algo.step(worker, shared, batch, jax.random.key(0))
  assert isinstance(e.value, NameError)  # what JAX raised before, so callers keep working


def test_an_exchange_outside_a_mapping_raises_the_packages_error():
  x = {"w": np.ones(3, np.float32)}
  with pytest.raises(elastic.MappingError, match="map_workers"):
    elastic.elastic_exchange(x, x, 0.1, elastic.WORKER_AXES)
  # the same exchange mapped: one worker, no collective needed
  out = jax.vmap(lambda p: elastic.elastic_exchange(p, x, 0.1, None), axis_name="w")(
      {"w": np.ones((1, 3), np.float32)}
  )
  np.testing.assert_array_equal(out[1]["w"][0], x["w"])


# -- the realised exchanges of an asynchronous run are logged with it -------------


def test_an_asynchronous_run_logs_every_exchange_it_served(tmp_path):
  cfg = DIGITS.replace(
      algorithm="downpour", tau=2, worker_speeds=(1, 2, 1, 2), push_timing="full_period"
  )
  trainer.train_and_evaluate(cfg, tmp_path)
  lines = [json.loads(l) for l in (tmp_path / "exchanges.jsonl").read_text().splitlines()]
  _, _, state = center_and_workers(tmp_path)
  assert len(lines) == int(state["shared"]["master_clock"]) > 0
  assert set(lines[0]) == {
      "slot",
      "tick",
      "time",
      "worker",
      "local_step",
      "version",
      "read_version",
  }
  assert [r["version"] for r in lines] == list(range(len(lines)))
  assert not (tmp_path.parent / "sync").exists()
  trainer.train_and_evaluate(DIGITS, tmp_path.parent / "sync")  # synchronous: no log
  assert not (tmp_path.parent / "sync" / "exchanges.jsonl").exists()
