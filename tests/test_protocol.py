"""The comparison protocol (easgd.protocol.runs): one program = separate runs, a validation
split that is disjoint from what is trained and tested on, rates chosen without
the test set, and intervals from scipy.stats checked on known cases."""

import dataclasses
import json
import math
import tempfile

import numpy as np
import pytest
from scipy import stats

from easgd import TrainConfig, cli, train_and_evaluate
from easgd.protocol import claims as protocol_claims
from easgd.protocol import networks as protocol_networks
from easgd.protocol import programs
from easgd.protocol import report as protocol_report
from easgd.protocol import runs as protocol
from easgd.protocol import stats as protocol_stats
from easgd.protocol.config import (
    Arm,
    ProtocolConfig,
    ProtocolError,
    log_grid,
    lr_grid_edges,
    to_dict,
)
from easgd.settings.config import ConfigError
from easgd.tasks import data, datasets

BASE = TrainConfig(
    dataset="mnist1d",
    model="mlp",
    num_epochs=2,
    global_batch_size=384,
    num_workers=4,
    validation_examples=1000,
    progress=False,
)
"""18 steps per epoch (7000 training signals, 1000 held out, 4 x 96 per step)."""
LOSS_RTOL = 1e-6
"""Relative tolerance on the test and validation losses, one program with one
configuration per call against separate ``train_and_evaluate`` runs (float32;
measured: at most 2.5e-7 over the 36 steps of these runs on this machine's CPU)."""
BATCHED_LOSS_RTOL = 1e-4
"""The same with two configurations per call (the protocol's batching). XLA
compiles the batched program with other fusions, so its float32 rounding
differs by an ulp; where a ReLU pre-activation lies within rounding of zero
(1e-8), that ulp decides the side of the kink, and the run moves by a step of
the unit's gradient. Measured here: at most 2.2e-5 in a loss, from DOWNPOUR,
seed 5, whose flip was traced to step 4 (worker 2, example 18, unit 82 of the
MLP's second layer; 1.2e-5 in its test loss after 36 steps). A float64 run of
the same program agrees with the batched run to 1.3e-8, so neither is wrong;
the kink picks one float32 rounding. 1e-4 admits such events, not a wrong step (a
mini-batch or exchange off by one moves the loss by 1e-3 or more)."""


def tiny_protocol(**changes):
  arms = (
      Arm("easgd tau=1", "easgd", dict(tau=1), log_grid(0.03, 0.3, 3)),
      Arm("easgd tau=4", "easgd", dict(tau=4), log_grid(0.03, 0.3, 3)),
      Arm("pmean", "pmean_sgd", {}, log_grid(0.03, 0.3, 3)),
      Arm(
          "pmean linear",
          "pmean_sgd",
          dict(lr_scaling="linear", lr_reference_batch=192),
          lr_from="pmean",
      ),
  )
  return dataclasses.replace(
      ProtocolConfig("tiny", "a test", BASE, arms, eval_every_steps=18, configs_per_batch=2),
      **changes,
  )


# ----------------------------------------------------------------------------
# The validation split
# ----------------------------------------------------------------------------


def test_validation_split_is_disjoint_seeded_and_complete():
  train, val = data.validation_split(8000, 1000)
  assert len(val) == 1000 and len(train) == 7000
  assert not set(train) & set(val) and set(train) | set(val) == set(range(8000))
  again = data.validation_split(8000, 1000)
  assert all(np.array_equal(a, b) for a, b in zip(again, (train, val)))  # fixed
  assert not np.array_equal(val, np.arange(1000))  # a draw, not the first rows
  with pytest.raises(
      data.DataError, match=r"validation_examples .* must be an integer " r"in \[1, 9\], got 10"
  ):
    data.validation_split(10, 10)


def test_validation_examples_are_never_trained_on_and_are_not_test_examples():
  full = datasets.load_dataset("mnist1d", seed=3)
  reduced, (val_x, val_y) = data.with_validation_split(full, 1000)
  train_idx, val_idx = data.validation_split(full.num_train, 1000)
  assert reduced.num_train == 7000 and len(val_y) == 1000
  np.testing.assert_array_equal(reduced.train_x, full.train_x[train_idx])
  np.testing.assert_array_equal(val_x, full.train_x[val_idx])
  rows = lambda x: {r.tobytes() for r in np.asarray(x).reshape(len(x), -1)}
  assert not rows(val_x) & rows(reduced.train_x)  # disjoint from what is trained on
  assert not rows(val_x) & rows(full.test_x)  # and from the test set
  # every batch the protocol gathers comes from the training part
  seeds = programs.SeedData(
      BASE.replace(dataset="mnist1d", model="cnn", validation_examples=1000), (3,)
  )
  run = programs.prepare(
      tiny_protocol(base=BASE.replace(dataset="mnist1d", model="cnn", validation_examples=1000)),
      seeds.num_train,
  )
  idx = programs.batch_indices(seeds, run["easgd tau=4"], 3)
  assert not set(idx.ravel().tolist()) & set(val_idx.tolist())


# ----------------------------------------------------------------------------
# One program = separate runs
# ----------------------------------------------------------------------------


EQUALITY_ARMS = (
    Arm("easgd tau=4", "easgd", dict(tau=4), (0.1,)),
    Arm("easgd tau=2", "easgd", dict(tau=2), (0.1,)),  # tau traced, same program
    Arm("eamsgd K=3", "eamsgd", dict(tau=4, delta=0.9, sync_warmup_steps=3), (0.02,)),
    Arm("downpour tau=2", "downpour", dict(tau=2), (0.05,)),
    Arm("local_sgd K=4", "local_sgd", dict(tau=4, sync_warmup_steps=4), (0.1,)),
    Arm("diloco", "diloco", dict(tau=4), (0.1,)),
    Arm("pmean", "pmean_sgd", {}, (0.1,)),
)
"""One arm of every algorithm family, each its own program but the two EASGD
arms, which share one (tau is traced)."""


def test_the_equality_arms_make_the_programs_the_next_test_checks_one_by_one():
  config = ProtocolConfig("eq", "", BASE, EQUALITY_ARMS, eval_every_steps=18).validate()
  runs = programs.prepare(config, programs.SeedData(BASE, (5, 6)).num_train)
  groups = programs.group_programs(list(runs.values()))
  assert [[r.arm.name for r in g] for g in groups] == [
      ["easgd tau=4", "easgd tau=2"],
      *[[a.name] for a in EQUALITY_ARMS[2:]],
  ]


@pytest.mark.parametrize(
    "names",
    [("easgd tau=4", "easgd tau=2"), *[(a.name,) for a in EQUALITY_ARMS[2:]]],
    ids=lambda names: names[0].split()[0],
)
def test_one_program_gives_each_configuration_its_train_and_evaluate_run(names):
  arms = tuple(a for a in EQUALITY_ARMS if a.name in names)
  config = ProtocolConfig("eq", "", BASE, arms, eval_every_steps=18).validate()
  seeds = programs.SeedData(BASE, (5, 6))
  runs = programs.prepare(config, seeds.num_train)
  (group,) = programs.group_programs(list(runs.values()))  # one program
  worst = {1: 0.0, 2: 0.0}
  configs = [
      dict(arm=r.arm.name, learning_rate=r.arm.learning_rates[0], seed=s)
      for r in group
      for s in (5, 6)
  ]
  summaries = [
      train_and_evaluate(
          runs[c["arm"]].config.replace(learning_rate=c["learning_rate"], seed=c["seed"]),
          tempfile.mkdtemp(),
      )
      for c in configs
  ]
  for kind, split in (("tune", "val"), ("report", "test")):
    for per_call, rtol in ((1, LOSS_RTOL), (2, BATCHED_LOSS_RTOL)):
      out, info = programs.run_program(
          group,
          configs,
          seeds,
          kind,
          dataclasses.replace(config, configs_per_batch=per_call),
      )
      assert info["compiles"] <= 5  # init, step (x2 phases with a warm-up), eval, final
      for i, (c, summary) in enumerate(zip(configs, summaries)):
        steps = list(runs[c["arm"]].eval_steps)
        assert [rec["step"] for rec in summary["history"]] == [0, 18, 36]  # epoch ends
        for rec in summary["history"]:
          k = steps.index(rec["step"])
          got_loss = out["curves"][f"{split}_loss"][i, k]
          want_loss = rec[f"{split}_loss"]
          worst[per_call] = max(worst[per_call], abs(got_loss - want_loss) / want_loss)
          assert got_loss == pytest.approx(want_loss, rel=rtol), (c, per_call)
          if per_call == 1:
            assert out["curves"][f"{split}_error"][i, k] == pytest.approx(
                rec[f"{split}_error"], abs=1e-6
            )
  print(
      f"\nmeasured: relative loss difference, one program vs separate runs: "
      f"{worst[1]:.2e} (one configuration per call), {worst[2]:.2e} (two)"
  )


def test_the_values_do_not_depend_on_how_many_configurations_share_a_call():
  """Every batched chunking (2, 4 or all 12 configurations per call) gives the same
  losses to float32 rounding (measured: 1.5e-7); one configuration per call is another
  program and agrees within BATCHED_LOSS_RTOL (measured on an AVX2 CPU: 4.2e-5 at 2 of
  54 entries, one ReLU kink event)."""
  config = tiny_protocol().validate()
  seeds = programs.SeedData(BASE, (0, 1, 2))
  runs = programs.prepare(config, seeds.num_train)
  group = [runs["easgd tau=1"], runs["easgd tau=4"]]
  configs = [
      dict(arm=r.arm.name, learning_rate=lr, seed=s)
      for r in group
      for lr in r.arm.learning_rates
      for s in (0, 1, 2)
  ]
  outs = [
      programs.run_program(
          group, configs, seeds, "tune", dataclasses.replace(config, configs_per_batch=k)
      )[0]
      for k in (1, 2, 4, None)
  ]
  single, batched = outs[0]["curves"]["val_loss"], [o["curves"]["val_loss"] for o in outs[1:]]
  for out in batched[1:]:
    np.testing.assert_allclose(out, batched[0], rtol=1e-6)
  np.testing.assert_allclose(batched[0], single, rtol=BATCHED_LOSS_RTOL)


# ----------------------------------------------------------------------------
# The rate chosen for the report never looked at the test set
# ----------------------------------------------------------------------------


def test_the_chosen_rates_do_not_depend_on_the_test_set(monkeypatch):
  config = tiny_protocol()
  clean = protocol.run_protocol(config, log=lambda line: None)
  load = datasets.load_dataset

  def poisoned(name, data_dir=None, seed=0):
    ds = load(name, data_dir=data_dir, seed=seed)
    rng = np.random.default_rng(seed)
    return data.Dataset(
        ds.name,
        ds.train_x,
        ds.train_y,
        np.full_like(ds.test_x, np.nan),  # no signal at all
        rng.permutation(ds.test_y).astype(np.int32),
        ds.num_classes,
    )

  monkeypatch.setattr(datasets, "load_dataset", poisoned)
  dirty = protocol.run_protocol(config, log=lambda line: None)
  for name, arm in clean["arms"].items():
    other = dirty["arms"][name]
    assert other["chosen_learning_rate"] == arm["chosen_learning_rate"]
    assert other["tuning"] == arm["tuning"]  # every validation curve, bit for bit
    assert other["final_test_errors"] != arm["final_test_errors"]  # the report did see it
    # the report's evaluation is chosen on its validation curves alone: the
    # same evaluations, whatever the test set holds
    assert other["report"]["val_error_curve"] == arm["report"]["val_error_curve"]
    assert other["best_val_steps"] == arm["best_val_steps"]
    for res in (arm, other):
      rep = res["report"]
      steps = rep["eval_steps"]
      assert res["test_errors_at_best_val"] == [
          curve[steps.index(s)] for curve, s in zip(rep["test_error_curve"], res["best_val_steps"])
      ]
      assert "best_test_error" not in res and "best_test_errors" not in res
  assert {p["kind"] for p in clean["programs"]} == {"tune", "report"}


def test_the_reported_test_error_is_read_where_validation_is_lowest():
  # the lowest test error (0.10, evaluation 2) is not where validation is
  # lowest (0.20, first at evaluation 1): the report takes evaluation 1
  test = [0.90, 0.40, 0.10, 0.30]
  val = [0.90, 0.20, 0.25, 0.20]
  assert protocol_stats.best_val_index(val) == 1
  assert protocol_stats.error_at_best_val(test, val) == 0.40
  assert protocol_stats.best_val_index([0.5, math.nan, None, 0.4]) == 3
  assert protocol_stats.best_val_index([math.nan, None]) == 1  # none finite: the last
  assert protocol_stats.error_at_best_val([0.9, math.nan], [0.5, 0.1]) == 1.0  # diverged
  with pytest.raises(ValueError, match="one value per evaluation, got 2 and 3"):
    protocol_stats.error_at_best_val([0.1, 0.2], [0.1, 0.2, 0.3])
  # the arm's summary over two seeds: the test-selected minimum is reported nowhere
  config = tiny_protocol().validate()
  run = programs.prepare(config, 7000)["easgd tau=1"]
  E = len(run.eval_steps)  # 3: steps 0, 18, 36
  rep = dict(
      seeds=[100, 101],
      eval_steps=run.eval_steps.tolist(),
      test_error_curve=[[0.9, 0.1, 0.3], [0.9, 0.2, 0.15]],
      val_error_curve=[[0.9, 0.3, 0.2], [0.9, 0.2, 0.25]],
      test_loss_curve=[[2.3] * E] * 2,
      train_loss_curve=[[math.nan] + [1.0] * (E - 1)] * 2,
      worker_test_error=[[0.3] * 4] * 2,
      worker_center_distance=[0.1, 0.1],
  )
  res = dict(report=rep, chosen_learning_rate=0.1, grid_edge=None, tuning=None)
  arm = protocol.summarize_arm(run, res, config, 1e-3, lambda t: ((0, 0), (0, 0)))
  assert arm["test_errors_at_best_val"] == [0.3, 0.2]  # not the minima 0.1 and 0.15
  assert arm["best_val_steps"] == [36, 18]
  assert arm["final_test_errors"] == [0.3, 0.15]
  assert arm["test_error_at_best_val"]["mean"] == pytest.approx(0.25)
  assert not {"best_test_error", "best_test_errors"} & set(arm)


def test_a_grid_that_cannot_tune_is_flagged_never_an_edge():
  grid = (0.01, 0.1, 1.0)
  ok = [dict(diverged=[False, False], val_error_final=[0.2, 0.3])] * 3
  assert lr_grid_edges(grid, 0.01, ok) == "low"
  assert lr_grid_edges(grid, 1.0, ok) == "high"
  assert lr_grid_edges(grid, 0.1, ok) is None
  assert lr_grid_edges((0.1,), 0.1, None) == "untunable: a single rate"
  # every run of every rate diverged (or ended non-finite, written as null):
  # the first rate is "chosen", which says nothing about the low side
  lost = [
      dict(diverged=[True, False], val_error_final=[0.9, None]),
      dict(diverged=[True, True], val_error_final=[0.9, 0.9]),
      dict(diverged=[False, False], val_error_final=[math.nan, math.nan]),
  ]
  assert lr_grid_edges(grid, 0.01, lost) == "untunable: every rate diverged"
  partly = lost[:2] + ok[:1]
  assert lr_grid_edges(grid, 1.0, partly) == "high"


def test_a_diverged_arm_is_flagged_and_its_results_are_strict_json(tmp_path):
  arms = (
      Arm("diverges", "pmean_sgd", {}, (1e3, 1e4)),
      Arm("one rate", "pmean_sgd", {}, (0.1,)),
      Arm(
          "from diverged",
          "pmean_sgd",
          dict(lr_scaling="linear", lr_reference_batch=192),
          lr_from="diverges",
      ),
      Arm("tunes", "pmean_sgd", {}, log_grid(0.03, 0.3, 3)),
  )
  config = ProtocolConfig(
      "strict",
      "a diverged arm",
      BASE.replace(num_epochs=1),
      arms,
      eval_every_steps=6,
      targets=(0.7,),
      configs_per_batch=4,
  )
  results = protocol.run_protocol(config, tmp_path, log=lambda line: None)
  text = (tmp_path / "results.json").read_text()
  for name in ("results.md", "curves.png"):  # the library writes every file of the protocol
    assert (tmp_path / name).is_file()

  def refuse(name):
    raise ValueError(f"{name} in results.json")

  strict = json.loads(text, parse_constant=refuse)  # NaN / Infinity would raise
  diverged = strict["arms"]["diverges"]
  assert all(all(r["diverged"]) for r in diverged["tuning"])
  assert None in diverged["report"]["test_loss_curve"][0]  # non-finite: null
  assert all(c[0] is None for c in diverged["report"]["train_loss_curve"])  # no step yet
  flags = {name: a["grid_edge"] for name, a in results["arms"].items()}
  assert flags["diverges"] == "untunable: every rate diverged"
  assert flags["one rate"] == "untunable: a single rate"
  assert flags["from diverged"] == "untunable: from 'diverges'"
  assert not (flags["tunes"] or "").startswith("untunable")
  protocol_report.write_report(tmp_path, group_by="")  # the report reads null back
  for table in ((tmp_path / "results.md").read_text(), protocol_report.compact_markdown(strict)):
    assert "(untunable: every rate diverged)" in table
    assert "(untunable: a single rate)" in table
    assert "1e+03 (low edge)" not in table and "untunable: every rate diverged edge" not in table


def test_protocol_settings_are_checked_before_anything_runs():
  good = tiny_protocol()
  with pytest.raises(ProtocolError, match="report_seeds must be fresh"):
    dataclasses.replace(good, report_seeds=(2, 3, 4)).validate()
  with pytest.raises(ProtocolError, match="at least 3 seeds"):
    dataclasses.replace(good, tune_seeds=(0, 1)).validate()
  with pytest.raises(ProtocolError, match="not log-spaced"):
    dataclasses.replace(good, arms=(Arm("a", "easgd", {}, (0.1, 0.2, 0.25)),)).validate()
  with pytest.raises(ProtocolError, match="overrides \\['learning_rate'\\]"):
    dataclasses.replace(good, arms=(Arm("a", "easgd", dict(learning_rate=0.1), (0.1,)),)).validate()
  with pytest.raises(ProtocolError, match="unknown lr_from"):
    dataclasses.replace(good, arms=(Arm("a", "easgd", {}, lr_from="b"),)).validate()
  with pytest.raises(ProtocolError, match="validation_examples \\(of base\\)"):
    dataclasses.replace(good, base=BASE.replace(validation_examples=0)).validate()
  with pytest.raises(ProtocolError, match="overrides \\['compute_dtype'\\]"):
    dataclasses.replace(
        good, arms=(Arm("a", "easgd", dict(compute_dtype="bfloat16"), (0.1,)),)
    ).validate()
  with pytest.raises(ProtocolError, match="give alpha .* and beta"):
    dataclasses.replace(
        good,
        arms=(
            Arm("a", "easgd", dict(beta=0.9), (0.1,)),
            Arm("b", "easgd", dict(alpha=0.2, beta=None), (0.1,)),
        ),
    ).validate()
  for bad, message in (
      (dict(description=None), "description must be a string"),
      (dict(arms=[tiny_protocol().arms[0]]), "arms must be a tuple"),
      (dict(targets=0.5), "targets must be a tuple"),
      (dict(targets=(0.5, 0.5)), "targets has a test error twice"),
      (
          dict(arms=(Arm("a", "easgd", dict(algorithm="sgd"), (0.1,)),)),
          "overrides \\['algorithm'\\]",
      ),
      (dict(arms=(Arm("a", "easgd", None, (0.1,)),)), "overrides of arm 'a' must be a dict"),
      (dict(arms=(Arm("a", "easgd", {}, 0.1),)), "learning_rates of arm 'a' must be a tuple"),
      (dict(arms=(Arm("a", "easgd", {}, (1e300, 1e301)),)), "learning rate of arm 'a'"),
      (dict(arms=(Arm("a", "easgd", {}, (1e-320,)),)), "learning rate of arm 'a'"),
  ):
    with pytest.raises(ProtocolError, match=message):
      dataclasses.replace(good, **bad).validate()
  with pytest.raises(ConfigError, match="is not read by algorithm 'pmean_sgd'"):
    dataclasses.replace(
        good, arms=(Arm("a", "pmean_sgd", dict(sync_warmup_steps=3), (0.1,)),)
    ).validate()


def test_results_json_records_every_setting_of_the_protocol():
  # every field at a value other than its default, so a field left out or read from
  # the wrong attribute shows
  config = tiny_protocol(
      tune_seeds=(7, 8, 9),
      report_seeds=(50, 51, 52, 53),
      eval_every_steps=9,
      targets=(0.4, 0.2),
      networks=(protocol_networks.GIGABIT_ETHERNET,),
      select_metric="loss",
      select_better="lower",
      max_grid_extensions=5,
      divergence_factor=7.5,
      configs_per_batch=3,
      eval_chunk=123,
  ).validate()
  recorded = to_dict(config)
  fields = [f.name for f in dataclasses.fields(ProtocolConfig)]
  assert list(recorded) == fields  # every field, in the declaration's order, nothing else
  assert recorded["base"] == BASE.to_dict()
  assert [a["name"] for a in recorded["arms"]] == [a.name for a in config.arms]
  assert recorded["networks"] == [dataclasses.asdict(protocol_networks.GIGABIT_ETHERNET)]
  for name in fields:
    value = getattr(config, name)
    if name not in ("base", "arms", "networks"):
      assert recorded[name] == (list(value) if isinstance(value, tuple) else value), name
  assert recorded["max_grid_extensions"] == 5
  json.dumps(recorded, allow_nan=False)  # JSON-ready: raises otherwise


def test_cli_protocol_writes_results_and_refuses_bad_files(tmp_path, capsys):
  bad = tmp_path / "bad.py"
  bad.write_text("x = 1\n")
  assert cli.main(["protocol", "--config", str(bad), "--workdir", str(tmp_path / "o")]) == 2
  assert "must define get_protocol()" in capsys.readouterr().err
  good = tmp_path / "good.py"
  good.write_text(
      "from easgd import TrainConfig\n"
      "from easgd.protocol.config import Arm, ProtocolConfig, log_grid\n"
      "def get_protocol():\n"
      "  base = TrainConfig(dataset='mnist1d', model='mlp', num_epochs=1, "
      "global_batch_size=384, validation_examples=1000, progress=False)\n"
      "  return ProtocolConfig('cli', 'cli test', base, (Arm('easgd', 'easgd', {}, "
      "log_grid(0.05, 0.2, 3)), Arm('pmean', 'pmean_sgd', {}, log_grid(0.05, 0.2, 3))), "
      "eval_every_steps=6, targets=(0.7,))\n"
  )
  out = tmp_path / "out"
  assert cli.main(["protocol", "--config", str(good), "--workdir", str(out)]) == 0
  text = (out / "results.md").read_text()
  assert "| easgd |" in text and "\u00b1" in text and (out / "curves.png").is_file()
  assert (out / "report" / "easgd" / "seed_100").is_dir()  # and the TensorBoard runs
  assert cli.main(["protocol", "--workdir", str(out), "--report-only"]) == 0
  before = (out / "results.json").read_bytes()
  # a second run into the same directory: refused, the results untouched
  assert cli.main(["protocol", "--config", str(good), "--workdir", str(out)]) == 2
  assert "already holds a protocol's results" in capsys.readouterr().err
  assert (out / "results.json").read_bytes() == before


def test_a_budget_beyond_memory_is_refused_before_anything_runs():
  config = dataclasses.replace(
      tiny_protocol(), arms=(Arm("long", "easgd", dict(tau=2, num_epochs=10**6), (0.1,)),)
  ).validate()
  with pytest.raises(ProtocolError, match="of batch indices need .* GiB; allowed: at most 2"):
    programs.prepare(config, 7000)


def test_cli_protocol_refuses_bad_arguments_before_running(tmp_path, capsys):
  assert cli.main(["protocol", "--workdir", str(tmp_path / "o")]) == 2
  assert "--config is required" in capsys.readouterr().err
  assert cli.main(["protocol", "--workdir", str(tmp_path / "o"), "--report-only"]) == 2
  assert "holds no results.json" in capsys.readouterr().err
  assert cli.main(["protocol", "--config", "experiments/protocol_fig2.py", "--workdir", " "]) == 2
  assert "--workdir must be a non-empty path" in capsys.readouterr().err
  a_file = tmp_path / "f"
  a_file.write_text("")
  assert (
      cli.main(["protocol", "--config", "experiments/protocol_fig2.py", "--workdir", str(a_file)])
      == 2
  )
  assert "exists and is not a directory" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()
  damaged = tmp_path / "damaged"
  damaged.mkdir()
  (damaged / "results.json").write_text('{"protocol": ')
  assert cli.main(["protocol", "--workdir", str(damaged), "--report-only"]) == 2
  assert "is not a readable protocol results file" in capsys.readouterr().err
  (damaged / "results.json").unlink()
  (damaged / "results.json").mkdir()
  assert (
      cli.main(
          [
              "protocol",
              "--config",
              "experiments/protocol_fig2.py",
              "--workdir",
              str(damaged),
              "--overwrite",
          ]
      )
      == 2
  )
  assert "exists and is not a file" in capsys.readouterr().err
  exits = tmp_path / "exits.py"
  exits.write_text("raise SystemExit('bye\\nsecond line')\n")
  assert cli.main(["protocol", "--config", str(exits), "--workdir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert "failed to load: SystemExit: bye; second line" in err and err.count("\n") == 1
  assert cli.main(["protocol", "--config", str(tmp_path), "--workdir", str(tmp_path / "o")]) == 2
  assert "is a directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------


def test_mean_interval_is_student_t_from_scipy_on_a_known_case():
  # n = 3, mean 2, s = 1: 2 -/+ t_{0.975, 2} / sqrt(3); with 2 degrees of freedom
  # the t quantile has the closed form (2q - 1) sqrt(2 / (4 q (1 - q))) = 4.3027
  q = 0.975
  r = protocol_stats.mean_interval([1.0, 2.0, 3.0])
  half = (2 * q - 1) * math.sqrt(2 / (4 * q * (1 - q))) / math.sqrt(3)
  assert (r["mean"], r["n"], r["std"]) == (2.0, 3, 1.0)
  assert r["low"] == pytest.approx(2 - half, rel=1e-12)
  assert r["high"] == pytest.approx(2 + half, rel=1e-12)
  assert protocol_stats.mean_interval([0.5, 0.5, 0.5])["half_width"] == 0.0


def test_welch_interval_matches_the_welch_satterthwaite_formula():
  a, b = np.array([0.20, 0.22, 0.25, 0.21]), np.array([0.30, 0.31, 0.33])
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
  half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
  d = protocol_stats.difference_interval(a, b)
  assert d["difference"] == pytest.approx(a.mean() - b.mean())
  assert d["low"] == pytest.approx(a.mean() - b.mean() - half, rel=1e-9)
  assert d["high"] == pytest.approx(a.mean() - b.mean() + half, rel=1e-9)
  assert protocol_stats.verdict(d, holds_if="negative") == "holds"
  assert protocol_stats.verdict(d, holds_if="positive") == "does not hold"
  assert protocol_stats.verdict(dict(low=-1, high=1), holds_if="positive") == "inconclusive"


def test_interval_covers_the_mean_95_percent_of_the_time():
  rng = np.random.default_rng(0)
  hits = [
      protocol_stats.mean_interval(x)["low"] <= 0.0 <= protocol_stats.mean_interval(x)["high"]
      for x in rng.normal(size=(4000, 3))
  ]
  assert np.mean(hits) == pytest.approx(0.95, abs=0.012)  # 3 binomial sd: 0.010


def test_time_to_target_and_the_network_model():
  assert protocol_stats.first_reach([0.9, 0.4, 0.25, 0.3], [0, 10, 20, 30], 0.3) == 20
  assert protocol_stats.first_reach([0.9, np.nan, 0.5], [0, 1, 2], 0.3) is None
  # p = 4: each all-reduce 50 us, and 2 * 3 / 4 = 1.5 x the bytes over 125 MB/s
  s = protocol_stats.allreduce_seconds(10, 1_000_000, 4, 125e6, 50e-6)
  assert s == pytest.approx(10 * 50e-6 + 1.5 * 1e6 / 125e6)
  assert protocol_stats.allreduce_seconds(10, 1_000_000, 1, 125e6, 50e-6) == 0.0
  assert protocol_stats.modelled_seconds(
      100, 0.01, 10, 1_000_000, 4, 125e6, 50e-6
  ) == pytest.approx(1.0 + s)
  # compressed exchanges: 10 all-gathers of 1 MB per worker in all, p - 1 = 3 payloads each
  g = protocol_stats.allgather_seconds(10, 1_000_000, 4, 125e6, 50e-6)
  assert g == pytest.approx(10 * 50e-6 + 3 * 1e6 / 125e6)
  assert protocol_stats.allgather_seconds(10, 1_000_000, 1, 125e6, 50e-6) == 0.0
  net = protocol_networks.Network("test", 125e6, 50e-6)
  assert net.modelled_seconds(
      100, 0.01, (10, 1_000_000, 10, 1_000_000), num_workers=4
  ) == pytest.approx(1.0 + s + g)


def test_a_streaming_arm_runs_and_reports_what_its_compressed_exchanges_send(tmp_path):
  """An arm with fragments and int8 compression goes through the protocol; its results
  report the all-gathers and their bytes per worker, counted by hand from the MLP's
  leaves (the 40-256-256-10 MLP's 78,858 entries split where half is passed: leaves
  0-3 and 4-5; their int8 payloads and one float32 scale per 256 entries), one send of
  a fragment every tau = 4 steps from its offset (0 and 2), over 18 steps."""
  arm = Arm("easgd int8", "easgd", dict(tau=4, fragments=2, compression="int8"), (0.1,))
  config = ProtocolConfig(
      "stream", "", BASE.replace(num_epochs=1), (arm,), eval_every_steps=6, configs_per_batch=4
  )
  results = protocol.run_protocol(config, tmp_path, log=lambda line: None)
  out = results["arms"]["easgd int8"]
  sizes = [256, 40 * 256, 256, 256 * 256, 10, 256 * 10]  # b1, w1, b2, w2, b3, w3 in leaf order

  def payload(n):
    return n + 4 * -(-n // 256)

  fragments = [sum(payload(n) for n in sizes[:4]), sum(payload(n) for n in sizes[4:])]
  sends = [len(range(o, 18, 4)) for o in (0, 2)]  # 5 and 4
  assert out["all_gathers"] == sum(sends) and out["all_reduces"] == 0
  assert out["gathered_bytes_per_worker"] == sum(n * b for n, b in zip(sends, fragments))
  assert out["communication_curve"]["gathered_bytes"][-1] == out["gathered_bytes_per_worker"]


# ----------------------------------------------------------------------------
# The claims
# ----------------------------------------------------------------------------


def _claims_arm(algorithm, tau, hits, final=(0.2, 0.21, 0.22), all_reduces_per_step=1.0):
  """A results.json arm for protocol_claims.claims: 3 seeds, evaluations every
  10 of 100 steps, first reaching the claims' target at ``hits`` (None: never)."""
  steps = list(range(0, 101, 10))
  return dict(
      algorithm=algorithm,
      config=dict(tau=tau, num_workers=4),
      time_to_target={"0.3": dict(steps=list(hits), n=3, reached=sum(h is not None for h in hits))},
      report=dict(eval_steps=steps),
      compute_per_step_s=0.01,
      communication_curve=dict(
          all_reduces=[int(all_reduces_per_step * s) for s in steps],
          bytes=[int(all_reduces_per_step * s) * 10**7 for s in steps],
      ),
      final_test_errors=list(final),
      test_errors_at_best_val=list(final),
      final_worker_test_errors=[e + 0.01 for e in final],
  )


def _claims_results(arms):
  return dict(
      protocol=dict(
          name="synthetic",
          report_seeds=[100, 101, 102],
          targets=[0.3],
          networks=[dict(name="1GbE", bandwidth_bytes_per_s=125e6, latency_s=50e-6)],
      ),
      arms=arms,
  )


def test_a_method_that_never_reaches_the_target_is_never_fastest():
  # EAMSGD misses the target on every seed: its censored time (the whole run,
  # with few exchanges) is BELOW pmean SGD's, whose every step all-reduces
  missing = _claims_results(
      {
          "eamsgd tau=64": _claims_arm("eamsgd", 64, (None, None, None), all_reduces_per_step=0.02),
          "pmean_sgd": _claims_arm("pmean_sgd", 1, (70, 80, 90)),
      }
  )
  fastest, *_ = protocol_claims.claims(missing, None)
  (part,) = fastest["parts"]
  assert part["interval"]["high"] < 0  # the lower bounds look faster
  assert part["verdict"] == "inconclusive"  # but a lower bound cannot show it
  assert "missed the target on 3 seed(s)" in part["text"]
  # reaching it first on every seed, with the same communication: holds
  reached = _claims_results(
      {
          "eamsgd tau=64": _claims_arm("eamsgd", 64, (20, 20, 30)),
          "pmean_sgd": _claims_arm("pmean_sgd", 1, (70, 80, 90)),
      }
  )
  measured = {c["key"]: c for c in protocol_claims.claims(reached, None)}
  fastest, center = measured["fastest"], measured["center"]
  assert fastest["verdict"] == "holds"
  assert center["verdict"] == "holds"  # the center 1 point below its workers
  assert "robust" not in measured  # no DOWNPOUR: the claim is not measured here
  assert "EAMSGD" in protocol_claims.claims_markdown([fastest, center])
  reached["protocol"]["targets"] = [0.5]
  with pytest.raises(ValueError, match="not among the protocol's targets"):
    protocol_claims.claims(reached, None)


def test_more_workers_is_judged_on_a_test_error_not_chosen_on_the_test_set():
  # at p = 8 the final error is lower than at p = 4, the error at the best
  # validation evaluation higher: the claim follows the latter; results
  # without validation curves of their report runs use the final error
  def arm(p, final, at_val):
    return dict(
        algorithm="easgd",
        config=dict(num_workers=p, tau=10),
        final_test_errors=list(final),
        test_errors_at_best_val=list(at_val),
    )

  fig3 = _claims_results(
      {
          "easgd p=4": arm(4, (0.30, 0.31, 0.32), (0.20, 0.21, 0.22)),
          "easgd p=8": arm(8, (0.10, 0.11, 0.12), (0.40, 0.41, 0.42)),
      }
  )
  (workers,) = protocol_claims.claims(None, fig3)
  assert "lowest validation error" in workers["measurement"]
  assert workers["parts"][0]["what"] == "easgd p=4 - easgd p=8 (test error at best val)"
  assert workers["verdict"] == "does not hold"
  for a in fig3["arms"].values():
    del a["test_errors_at_best_val"]
  (workers,) = protocol_claims.claims(None, fig3)
  assert (
      "final test error" in workers["measurement"]
      and "nothing is selected" in workers["measurement"]
  )
  assert workers["verdict"] == "holds"


def test_claims_are_measured_on_the_asynchronous_methods_and_paired_by_seed():

  # DOWNPOUR 1 point above async EASGD on every seed, the seeds' spread 5 points:
  # per seed the difference is exact (paired: holds); Welch's interval of the
  # two samples would contain 0
  spread = (0.20, 0.25, 0.30)
  above = tuple(e + 0.01 for e in spread)
  arms = {
      "downpour tau=16": _claims_arm("downpour", 16, (50, 50, 50), final=above),
      "async_easgd tau=16": _claims_arm("async_easgd", 16, (40, 40, 40), final=spread),
      "easgd tau=16": _claims_arm("easgd", 16, (40, 40, 40), final=(0.5, 0.5, 0.6)),
      "async_eamsgd tau=16": _claims_arm("async_eamsgd", 16, (20, 20, 30), final=spread),
      "eamsgd tau=16": _claims_arm("eamsgd", 16, (90, 90, 90), final=spread),
  }
  measured = {c["key"]: c for c in protocol_claims.claims(_claims_results(arms), None)}
  fastest, tau_claim, center = measured["fastest"], measured["robust"], measured["center"]
  assert [p["what"] for p in tau_claim["parts"]] == [
      "downpour tau=16 - async_easgd tau=16 (final test error)",
      "downpour tau=16 - async_eamsgd tau=16 (final test error)",
  ]
  for part in tau_claim["parts"]:
    assert part["interval"]["paired"] and part["interval"]["resolvable"] == pytest.approx(0)
    assert part["interval"]["difference"] == pytest.approx(0.01)
    assert part["verdict"] == "holds"
  welch = protocol_stats.difference_interval(above, spread)
  assert welch["low"] < 0 < welch["high"]
  assert "asynchronous EASGD, Algorithm 1" in tau_claim["measurement"]
  # the fastest claim: async EAMSGD against every other method at its tau, never
  # against synchronous EAMSGD (the same method, another schedule)
  assert sorted(p["what"] for p in fastest["parts"]) == [
      "async_eamsgd tau=16 - async_easgd tau=16",
      "async_eamsgd tau=16 - downpour tau=16",
      "async_eamsgd tau=16 - easgd tau=16",
  ]
  assert "asynchronous EAMSGD, Algorithm 2" in fastest["measurement"]
  assert [p["what"].split(":")[0] for p in center["parts"]] == [
      "async_easgd tau=16",
      "async_eamsgd tau=16",
  ]
  # without asynchronous arms the synchronous methods are measured
  sync = {k: v for k, v in arms.items() if not k.startswith("async")}
  tau_claim = {c["key"]: c for c in protocol_claims.claims(_claims_results(sync), None)}["robust"]
  assert [p["what"] for p in tau_claim["parts"]] == [
      "downpour tau=16 - easgd tau=16 (final test error)",
      "downpour tau=16 - eamsgd tau=16 (final test error)",
  ]
