"""Grids that bracket the best rate: the protocol extends a grid whose choice is at an edge."""

import numpy as np
import pytest

from easgd import TrainConfig
from easgd.protocol import report, runs
from easgd.protocol.config import Arm, ProtocolConfig, ProtocolError
from easgd.tasks.task import Task

import testutil

H = 1.0
"""The curvature: plain gradient descent on 0.5 H (w - 1)^2 from w = 0 is at
w_T = 1 - (1 - lr H)^T, so the best rate is exactly 1 / H = 1."""


def quadratic_task() -> Task:
  """A deterministic quadratic (the batch is not read): pmean SGD is gradient descent."""
  return testutil.quadratic_task(H)


BASE = TrainConfig(
    num_epochs=1, global_batch_size=8, num_workers=2, validation_examples=16, progress=False
)
"""8 steps: 64 training rows, 16 held out, 2 x 4 per step."""


def run(rates, limit):
  config = ProtocolConfig(
      "grid",
      "",
      BASE,
      (Arm("gd", "pmean_sgd", {}, rates),),
      tune_seeds=(0, 1, 2),
      report_seeds=(5, 6, 7),
      eval_every_steps=4,
      max_grid_extensions=limit,
  )
  return runs.run_protocol(config, log=lambda line: None, task=quadratic_task())["arms"]["gd"]


def test_a_best_rate_beyond_the_grid_is_found_by_extending_it():
  arm = run((0.1, 0.2, 0.4), limit=2)  # 0.4 is the high edge; 0.8, then 1.6 (worse) added
  assert arm["grid_extended"] == pytest.approx([0.8, 1.6])
  assert arm["grid_extension"] == "interior" and arm["grid_edge"] is None
  assert arm["chosen_learning_rate"] == pytest.approx(0.8)
  assert arm["learning_rates"] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
  assert [t["learning_rate"] for t in arm["tuning"]] == pytest.approx(arm["learning_rates"])
  # the runs the first grid had are kept: 0.4's final error is |1 - 0.4|^8 away from 1
  w = 1 - (1 - 0.4 * H) ** 8
  want = 1 - np.exp(-((w - 1) ** 2))  # 2.8e-4, as float32 computes 1 - exp(-x): rel 1e-3
  assert arm["tuning"][2]["val_error_final"][0] == pytest.approx(want, rel=1e-3)
  assert report.grid_flag(arm) is None


def test_the_extension_stops_at_its_limit_and_says_so():
  arm = run((0.1, 0.2, 0.4), limit=1)
  assert arm["grid_extended"] == pytest.approx([0.8])
  assert arm["grid_extension"] == "limit" and arm["grid_edge"] == "high"
  assert arm["chosen_learning_rate"] == pytest.approx(0.8)
  arm = run((0.1, 0.2, 0.4), limit=0)
  assert arm["grid_extended"] == [] and arm["grid_extension"] == "limit"
  assert arm["grid_edge"] == "high" and arm["chosen_learning_rate"] == pytest.approx(0.4)


def test_an_interior_choice_extends_nothing_and_the_limit_is_checked():
  arm = run((0.5, 1.0, 2.0), limit=2)  # 1.0 exact: interior at once
  assert arm["grid_extended"] == [] and arm["grid_extension"] is None
  assert arm["chosen_learning_rate"] == pytest.approx(1.0)
  with pytest.raises(ProtocolError, match="max_grid_extensions"):
    ProtocolConfig(
        "g", "", BASE, (Arm("gd", "pmean_sgd", {}, (0.1, 0.2)),), max_grid_extensions=-1
    ).validate()


def test_results_md_says_which_grids_were_extended_and_why_they_stopped():
  results = runs.run_protocol(
      ProtocolConfig(
          "grid",
          "",
          BASE,
          (Arm("gd", "pmean_sgd", {}, (0.1, 0.2, 0.4)), Arm("gd1", "pmean_sgd", {}, (0.1, 0.2))),
          tune_seeds=(0, 1, 2),
          report_seeds=(5, 6, 7),
          eval_every_steps=4,
          max_grid_extensions=1,
      ),
      log=lambda line: None,
      task=quadratic_task(),
  )
  text = report.results_markdown(results)
  assert "0.8 (high edge); 0.1..0.8 (4), 1 added: stopped: limit" in text
  assert "0.4 (high edge); 0.1..0.4 (3), 1 added: stopped: limit" in text


def test_the_arms_of_one_program_extend_together_each_as_it_would_alone():
  config = ProtocolConfig(
      "grid",
      "",
      BASE,
      (Arm("gd", "pmean_sgd", {}, (0.1, 0.2, 0.4)), Arm("gd1", "pmean_sgd", {}, (0.05, 0.1, 0.2))),
      tune_seeds=(0, 1, 2),
      report_seeds=(5, 6, 7),
      eval_every_steps=4,
      max_grid_extensions=2,
  )
  results = runs.run_protocol(config, log=lambda line: None, task=quadratic_task())
  # one tuning program for the first grids, then one per round for both arms' new rates
  tune = [p for p in results["programs"] if p["kind"] == "tune"]
  assert [(p["arms"], p["configs"]) for p in tune] == [(["gd", "gd1"], 18)] + [
      (["gd", "gd1"], 6)
  ] * 2
  assert "the high edge of 'gd1'" in tune[1]["separate_because"]
  gd, gd1 = results["arms"]["gd"], results["arms"]["gd1"]
  assert gd["grid_extended"] == pytest.approx([0.8, 1.6]) and gd["grid_extension"] == "interior"
  assert gd1["grid_extended"] == pytest.approx([0.4, 0.8]) and gd1["grid_extension"] == "limit"
  alone = run((0.1, 0.2, 0.4), limit=2)  # gd's own protocol: the same choices and curves
  assert gd["chosen_learning_rate"] == alone["chosen_learning_rate"]
  for a, b in zip(gd["tuning"], alone["tuning"], strict=True):
    assert a["learning_rate"] == pytest.approx(b["learning_rate"])
    np.testing.assert_allclose(a["val_error_curve"], b["val_error_curve"], rtol=1e-6, atol=1e-7)
