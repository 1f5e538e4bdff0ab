"""The difference a comparison resolves, paired comparisons, and the seeds a difference needs."""

import math

import numpy as np
import pytest

from easgd.protocol import stats


def test_the_resolvable_difference_is_welchs_half_width_in_closed_form():
  # two arms of n = 5 seeds with the same spread: Welch's df is 2n - 2 = 8
  a = np.array([1.0, 2.0, 3.0, 4.0, 5.0])  # sd (ddof 1) = sqrt(2.5)
  b = a + 10.0
  d = stats.difference_interval(a, b)
  t_8 = 2.306004135  # Student t, 8 degrees of freedom, 0.975 (tables)
  expected = t_8 * math.sqrt(2.5) * math.sqrt(2 / 5)
  assert d["resolvable"] == pytest.approx(expected, rel=1e-9)
  assert d["difference"] == -10.0 and d["paired"] is False
  assert d["high"] - d["low"] == pytest.approx(2 * expected, rel=1e-9)


def test_a_paired_comparison_resolves_what_the_seeds_share():
  seed_effect = np.array([0.0, 3.0, -2.0, 5.0, 1.0])  # large, shared by both arms
  a = 10.0 + seed_effect + np.array([0.1, -0.1, 0.0, 0.2, -0.2])
  b = 9.0 + seed_effect
  paired = stats.difference_interval(a, b, paired=True)
  welch = stats.difference_interval(a, b)
  # a - b: 1.1, 0.9, 1.0, 1.2, 0.8 (mean 1, sd sqrt(0.025))
  t_4 = 2.776445105
  assert paired["difference"] == pytest.approx(1.0)
  assert paired["resolvable"] == pytest.approx(t_4 * math.sqrt(0.025) / math.sqrt(5), rel=1e-9)
  assert paired["low"] > 0 > welch["low"]  # paired: resolved; Welch: not
  with pytest.raises(ValueError, match="one value per seed"):
    stats.difference_interval(a, b[:4], paired=True)


@pytest.mark.parametrize(
    "spread, difference, paired, n",
    [
        (1.0, 1.0, False, 9),  # n=8: 2.1448 * 0.5 = 1.072; n=9: 2.1199 * 0.4714 = 0.9993
        (1.0, 1.0, True, 7),  # n=6: 2.5706 / 2.449 = 1.0495; n=7: 2.4469 / 2.6458 = 0.9248
        (0.5, 2.0, False, 3),  # n=2: 4.3027 * 0.5 * 1 = 2.151; n=3: 2.7764 * 0.5 * 0.8165 = 1.134
    ],
)
def test_seeds_to_resolve_a_difference(spread, difference, paired, n):
  assert stats.seeds_to_resolve(spread, difference, paired=paired) == n


def test_seeds_to_resolve_refuses_what_no_budget_resolves():
  with pytest.raises(ValueError, match="more than 10\\*\\*6 seeds"):
    stats.seeds_to_resolve(1.0, 1e-4)
  with pytest.raises(ValueError):
    stats.seeds_to_resolve(0.0, 1.0)


def test_the_command_line_sets_the_number_of_seeds(tmp_path, capsys):
  import argparse

  from easgd import cli
  from easgd.protocol.config import load_protocol_file

  config = load_protocol_file("experiments/protocol_fig2.py")
  args = argparse.Namespace(task=None, task_args=None, tune_seeds=4, report_seeds=10)
  more = cli._with_task(config, args).validate()
  assert more.tune_seeds == (0, 1, 2, 3) and more.report_seeds == tuple(range(100, 110))
  for flags, message in (
      (["--report-seeds", "2"], "report_seeds must be a tuple of at least 3 seeds"),
      (["--tune-seeds", "101"], "report_seeds must be fresh: [100]"),
      (["--report-seeds", "0"], "--report-seeds must be"),
  ):
    argv = [
        "protocol",
        "--config",
        "experiments/protocol_fig2.py",
        "--workdir",
        str(tmp_path / "o"),
    ]
    assert cli.main([*argv, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()
