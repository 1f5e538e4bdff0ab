"""Collapse: a run that finishes but learns nothing, flagged beside divergence in the
protocol, ``compare`` and the sweeps from one definition (easgd.run.compare.collapsed)."""

import json
import math

import numpy as np
import pytest

from easgd import TrainConfig
from easgd.protocol import runs
from easgd.protocol.config import Arm, ProtocolConfig, lr_grid_edges
from easgd.run import compare
from easgd.sweeps import grid as sweep_grid
from easgd.sweeps import network, quadratic
from easgd.sweeps import report as sweep_report
from easgd.sweeps.grid import SweepGrid
from easgd.tasks.task import Task

import testutil

# ----------------------------------------------------------------------------
# The definition
# ----------------------------------------------------------------------------


def test_the_chance_line_and_the_loss_criterion():
  # 10 classes: chance 0.9, the line (1 - 0.1) * 0.9 = 0.81; 2 classes: 0.45
  assert compare.chance_error(10) == pytest.approx(0.9)
  assert compare.collapsed(2.30, 2.0, 0.81, 10) is True
  assert compare.collapsed(2.30, 2.0, 0.8099, 10) is False
  assert compare.collapsed(0.69, 0.6, 0.45, 2) is True
  assert compare.collapsed(0.69, 0.6, 0.4499, 2) is False
  # the audit's arm: a seed at 57% error whose loss fell learned something
  assert compare.collapsed(2.42, 1.72, 0.575, 10) is False
  # its seed at 69% error whose test loss ended above its start (2.375 -> 2.445)
  assert compare.collapsed(2.375, 2.445, 0.693, 10) is True
  # the loss criterion alone: at or above the start, finite
  assert compare.collapsed(0.5, 0.5) is True and compare.collapsed(0.5, 0.4999) is False
  assert compare.collapsed(None, 0.5, 0.9, None) is False  # nothing to compare with
  # not finite: diverged, not collapsed
  for final in (math.nan, math.inf, None):
    assert compare.collapsed(2.3, final, 0.9, 10) is False
  assert compare.collapsed(2.3, 2.0, math.nan, 10) is False  # no error: the loss alone
  with pytest.raises(ValueError, match="num_classes must be an integer >= 2, got 1"):
    compare.chance_error(1)


def test_the_classes_come_from_the_task_info():
  assert compare.task_classes({"num_classes": 10, "model": "mlp"}) == 10
  for info in ({}, {"num_classes": 1}, {"num_classes": True}, {"num_classes": "10"}, None):
    assert compare.task_classes(info) is None


def test_a_grid_whose_every_run_failed_is_untunable():
  grid = (0.01, 0.1, 1.0)
  failed = [
      dict(diverged=[True, False], collapsed=[False, True], val_error_final=[0.9, 0.88]),
      dict(diverged=[False, False], collapsed=[True, True], val_error_final=[0.9, 0.9]),
      dict(diverged=[True, True], collapsed=[False, False], val_error_final=[None, None]),
  ]
  assert lr_grid_edges(grid, 0.01, failed) == "untunable: every rate diverged or collapsed"
  one_fine = failed[:2] + [
      dict(diverged=[False, False], collapsed=[False, True], val_error_final=[0.2, 0.9])
  ]
  assert lr_grid_edges(grid, 1.0, one_fine) == "high"
  old = [dict(diverged=[True, True], val_error_final=[0.9, 0.9])] * 3  # before collapse existed
  assert lr_grid_edges(grid, 0.01, old) == "untunable: every rate diverged"


# ----------------------------------------------------------------------------
# The protocol, end to end on a quadratic "classifier" of 2 classes
# ----------------------------------------------------------------------------


def quadratic_task() -> Task:
  """Gradient descent on 0.5 (w - 1)^2 from w = 0 (the batch is not read), so after T
  steps at rate lr, w_T = 1 - (1 - lr)^T; "correct" is exp(-(w - 1)^2) per example,
  recorded as a task of 2 classes (chance error 0.5, collapsed at error >= 0.45)."""
  return testutil.quadratic_task(num_classes=2)


BASE = TrainConfig(
    num_epochs=1, global_batch_size=8, num_workers=2, validation_examples=16, progress=False
)
"""8 steps: 64 training rows, 16 held out, 2 x 4 per step."""


def test_the_protocol_counts_collapsed_runs_as_failed(tmp_path):
  # After 8 steps (evaluations at 0, 4, 8; loss 0.5 and error 1 - e^-1 = 0.632 at 0):
  #   lr 0.005: w = 1 - 0.995^8 = 0.0393, error 1 - exp(-0.923) = 0.603 >= 0.45:
  #             collapsed by the error (its loss fell, 0.5 -> 0.46)
  #   lr 0.01:  w = 0.0773, error 0.573: collapsed by the error
  #   lr 0.25, 0.5, 1: error 0.0100, 1.5e-5, 0: fine; 1 is the grid's high edge, so
  #   lr 2 is added: w = 0, 2, 0, ...: the loss ends at its start 0.5, finite
  #             (not diverged at factor 10): collapsed by the loss, on every seed
  config = ProtocolConfig(
      "collapse",
      "",
      BASE,
      (Arm("gd", "pmean_sgd", {}, (0.25, 0.5, 1.0)), Arm("slow", "pmean_sgd", {}, (0.005, 0.01))),
      tune_seeds=(0, 1, 2),
      report_seeds=(5, 6, 7),
      eval_every_steps=4,
      max_grid_extensions=2,
  )
  results = runs.run_protocol(config, tmp_path, log=lambda line: None, task=quadratic_task())
  assert results["collapse"] == dict(
      num_classes=2, chance_error=0.5, margin=0.1, error_at_least=pytest.approx(0.45)
  )
  written = json.loads((tmp_path / "results.json").read_text())
  assert written["protocol"]["max_grid_extensions"] == 2
  assert written["collapse"] == results["collapse"]
  gd, slow = results["arms"]["gd"], results["arms"]["slow"]
  # the grid extended to 2, which collapsed on every tuning seed: bracketed
  assert gd["learning_rates"] == [0.25, 0.5, 1.0, 2.0] and gd["grid_extension"] == "collapsed"
  two = gd["tuning"][-1]
  assert two["learning_rate"] == 2.0 and two["collapsed"] == [True] * 3
  assert two["diverged"] == [False] * 3
  assert two["val_error_final"] == pytest.approx([1 - math.exp(-1)] * 3, rel=1e-6)
  assert two["score"] == 1.0  # counted as a diverged run: the worst, not 0.632
  assert gd["chosen_learning_rate"] == 1.0 and gd["collapsed"] == [False] * 3
  # every rate of "slow" collapsed: untunable, and its report runs collapsed
  for entry, error in zip(slow["tuning"], (0.603, 0.573)):
    assert entry["collapsed"] == [True] * 3 and entry["score"] == 1.0
    assert entry["val_error_final"] == pytest.approx([error] * 3, abs=1e-3)
  assert slow["grid_edge"] == "untunable: every rate diverged or collapsed"
  assert slow["collapsed"] == [True] * 3 and slow["diverged"] == [False] * 3
  assert slow["final_test_errors"] == pytest.approx([0.603] * 3, abs=1e-3)  # its own error
  text = (tmp_path / "results.md").read_text()
  assert "bracketed by a collapsing rate" in text
  assert "(untunable: every rate diverged or collapsed)" in text
  row = next(line for line in text.splitlines() if line.startswith("| slow |"))
  assert "(3 collapsed)" in row
  assert "0.005: 100.0 (3 coll.), 0.01: 100.0 (3 coll.)" in text
  assert "a diverged or collapsed run counts as 100%" in text
  assert "its final test error at least 45.0% (90% of chance, 50.0% for 2 classes)" in text


def test_a_report_seed_is_diverged_or_collapsed_never_both():
  nan = math.nan
  losses = [
      [2.3, 1.0, 0.5],  # learned
      [2.3, 2.0, 2.4],  # ends above its start: collapsed
      [2.3, 5.0, 24.0],  # above 10 x its start: diverged (also above its start)
      [2.3, nan, None],  # not finite: diverged
      [2.3, 2.2, 2.25],  # loss fell a little, error at chance: collapsed
  ]
  errors = [[0.9, 0.3, 0.1], [0.9, 0.5, 0.5], [0.9, 0.9, 0.9], [0.9, nan, None], [0.9, 0.9, 0.88]]
  div, col = runs._failures(losses, errors, 10.0, 10)
  assert div == [False, False, True, True, False]
  assert col == [False, True, False, False, True]
  assert runs._failures(losses, None, 10.0, None)[1] == [False, True, False, False, False]


# ----------------------------------------------------------------------------
# compare
# ----------------------------------------------------------------------------


def test_compare_flags_a_collapsed_run(tmp_path):
  # rate 2 on the quadratic: w = 0, 2, 0, ... ; after 8 steps the test loss is its
  # start, 0.5 (finite: no DivergenceError), the error 1 - e^-1
  config = TrainConfig(
      num_epochs=1, global_batch_size=8, num_workers=2, learning_rate=2.0, progress=False
  )
  (row,) = compare.compare(config, tmp_path, ["pmean_sgd"], task=quadratic_task())
  assert row["collapsed"] is True
  assert row["test_loss"] == pytest.approx(0.5) and row["test_accuracy"] == pytest.approx(
      math.exp(-1), rel=1e-6
  )
  table = (tmp_path / "results.md").read_text()
  assert f"{100 * math.exp(-1):.2f}% (collapsed)" in table
  assert compare.COLLAPSED_NOTE in table
  fine = dict(row, collapsed=False, test_accuracy=0.99)
  assert "collapsed" not in compare.results_table([fine]).lower()


# ----------------------------------------------------------------------------
# The sweeps
# ----------------------------------------------------------------------------


def test_the_quadratic_sweep_flags_a_center_that_never_moved():
  # alpha = 0: the center is never pulled, its loss ends at its start: collapsed;
  # alpha = 0.1 learns; eta = 1e20 diverges (and is not also collapsed)
  g = SweepGrid(tau=(1,), alpha=(0.0, 0.1), learning_rate=(0.3, 1e20), num_workers=(2,))
  res = quadratic.sweep_quadratic(g, 30)
  flags = {(r["learning_rate"], r["alpha"]): (r["diverged"], r["collapsed"]) for r in res.records}
  assert flags == {
      (0.3, 0.0): (False, True),
      (0.3, 0.1): (False, False),
      (1e20, 0.0): (True, False),
      (1e20, 0.1): (True, False),
  }
  stuck = next(r for r in res.records if r["alpha"] == 0.0 and r["learning_rate"] == 0.3)
  assert stuck["center_loss"] == stuck["initial_center_loss"]
  assert "collapsed" in res.columns() and res.to_csv().splitlines()[0].count("collapsed") == 1
  text = sweep_report.summarize(res)
  assert "  1 collapsed (finished, but the center's loss ended at or above its start" in text


def test_sweep_records_apply_the_chance_line():
  # constructed outputs of one program of 3 configurations, 10 classes (line 0.81)
  g = SweepGrid(tau=(1,), alpha=(0.1, 0.2, 0.3), learning_rate=(0.1,), num_workers=(2,))
  g = g.validate()
  n = 3
  outputs = dict(
      diverged=np.array([False, False, True]),
      workers_diverged=np.array([False, False, True]),
      center_diverged=np.array([False, False, False]),
      diverged_step=np.array([-1, -1, 3]),
      initial_loss=np.full(n, 2.3),
      final_loss=np.array([1.0, 2.2, np.inf]),
      initial_center_loss=np.full(n, 2.3),
      center_loss=np.array([0.9, 2.25, 2.2]),
      test_accuracy=np.array([0.7, 0.15, 0.1]),  # errors 0.3, 0.85, 0.9
      worker_center_distance=np.full(n, 0.1),
  )
  rows = sweep_grid.records("network", g, 2, outputs, None, None, num_classes=10)
  assert [r["collapsed"] for r in rows] == [False, True, False]  # the diverged one: not both
  rows = sweep_grid.records("network", g, 2, outputs, None, None)  # no classes: loss alone
  assert [r["collapsed"] for r in rows] == [False, False, False]


def test_the_network_sweep_knows_the_data_sets_classes():
  # digits, 10 classes: a rate of 1e-6 leaves the center at its initial error,
  # far above the line 0.81; a rate of 0.1 learns
  g = SweepGrid(tau=(1,), alpha=(0.1,), learning_rate=(1e-6, 0.1), num_workers=(2,))
  res = network.sweep_network(g, 20, dataset="digits", hessian_iterations=0)
  still, learned = res.records
  assert 1 - still["test_accuracy"] >= 0.81 and still["collapsed"] is True
  assert still["center_loss"] < still["initial_center_loss"]  # by the error, not the loss
  assert 1 - learned["test_accuracy"] < 0.81 and learned["collapsed"] is False
