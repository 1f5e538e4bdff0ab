"""The difference a comparison resolves, paired comparisons, and the seeds a difference needs."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

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


def test_the_paired_interval_is_the_t_interval_of_the_differences_in_closed_form():
  a = np.array([3.0, 5.0, 4.0, 6.0, 7.0])
  b = np.array([2.0, 3.5, 3.5, 4.0, 6.0])
  # a - b = 1.0, 1.5, 0.5, 2.0, 1.0: mean 1.2, sd (ddof 1) sqrt(0.325), se sqrt(0.325 / 5)
  se = math.sqrt(0.325 / 5)
  t_4 = 2.776445105  # Student t, 4 degrees of freedom, 0.975 (tables)
  d = stats.difference_interval(a, b, paired=True)
  assert d["difference"] == pytest.approx(1.2, rel=1e-12)
  assert d["low"] == pytest.approx(1.2 - t_4 * se, rel=1e-9)
  assert d["high"] == pytest.approx(1.2 + t_4 * se, rel=1e-9)
  # two-sided p of t = 1.2 / se = 4.7068 on 4 df
  assert d["p_value"] == pytest.approx(2 * scipy_stats.t.sf(1.2 / se, 4), rel=1e-9)
  assert d["paired"] is True and d["n_a"] == d["n_b"] == 5


def test_equivalence_paired_is_the_90_percent_interval_of_the_differences():
  a = np.array([3.0, 5.0, 4.0, 6.0, 7.0])
  b = np.array([2.0, 3.5, 3.5, 4.0, 6.0])  # differences as above: mean 1.2, se sqrt(0.065)
  se = math.sqrt(0.325 / 5)
  t_4 = 2.131846786  # Student t, 4 degrees of freedom, 0.95 (tables): alpha = 0.05 each side
  low, high = 1.2 - t_4 * se, 1.2 + t_4 * se  # 0.6565, 1.7435
  r = stats.equivalence(a, b, 2.0, paired=True)
  assert r["low"] == pytest.approx(low, rel=1e-9) and r["high"] == pytest.approx(high, rel=1e-9)
  assert r["df"] == 4 and r["level"] == pytest.approx(0.90) and r["equivalent"] is True
  # the binding side is the upper one: p = P(T_4 < (1.2 - 2) / se)
  assert r["p_value"] == pytest.approx(scipy_stats.t.cdf((1.2 - 2.0) / se, 4), rel=1e-9)
  # equivalent flips where the bound passes the interval's far end; there p = alpha
  assert stats.equivalence(a, b, high * (1 + 1e-9), paired=True)["equivalent"] is True
  at = stats.equivalence(a, b, high * (1 - 1e-9), paired=True)
  assert at["equivalent"] is False and at["p_value"] == pytest.approx(0.05, rel=1e-6)


def test_equivalence_unpaired_is_welchs_90_percent_interval():
  a = np.array([1.0, 2.0, 4.0, 5.0])  # mean 3, var 10 / 3
  b = np.array([2.0, 2.5, 3.0])  # mean 2.5, var 0.25
  va, vb = (10 / 3) / 4, 0.25 / 3
  se = math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2)  # Welch-Satterthwaite: 3.4839...
  t_q = scipy_stats.t.ppf(0.95, df)
  r = stats.equivalence(a, b, 3.0, paired=False)
  assert r["df"] == pytest.approx(df, rel=1e-9)
  assert r["low"] == pytest.approx(0.5 - t_q * se, rel=1e-9)
  assert r["high"] == pytest.approx(0.5 + t_q * se, rel=1e-9)
  p_lower = scipy_stats.t.sf((0.5 + 3.0) / se, df)
  p_upper = scipy_stats.t.cdf((0.5 - 3.0) / se, df)
  assert r["p_value"] == pytest.approx(max(p_lower, p_upper), rel=1e-9)
  assert r["equivalent"] is (r["high"] < 3.0 and r["low"] > -3.0)
  edge = 0.5 + t_q * se  # the far end: equivalent just above it, not just below
  assert stats.equivalence(a, b, edge * (1 + 1e-9), paired=False)["equivalent"] is True
  assert stats.equivalence(a, b, edge * (1 - 1e-9), paired=False)["equivalent"] is False
  with pytest.raises(ValueError, match="bound must be a finite real in \\(0, inf\\), got 0"):
    stats.equivalence(a, b, 0, paired=False)
  with pytest.raises(ValueError, match="one value per seed"):
    stats.equivalence(a, b, 1.0, paired=True)


def test_equivalence_without_spread_is_the_point_difference():
  r = stats.equivalence([1.0, 2.0], [0.5, 1.5], 0.6, paired=True)
  assert (r["low"], r["high"], r["equivalent"], r["p_value"]) == (0.5, 0.5, True, None)
  assert stats.equivalence([1.0, 2.0], [0.5, 1.5], 0.4, paired=True)["equivalent"] is False


def _exact_power(sd, d, n, paired):
  # two-sided 95% t test: P(|T| > t_crit) with T noncentral t
  df = n - 1 if paired else 2 * n - 2
  nc = d * math.sqrt(n) / sd if paired else d / (sd * math.sqrt(2 / n))
  c = scipy_stats.t.ppf(0.975, df)
  return scipy_stats.nct.sf(c, df, nc) + scipy_stats.nct.cdf(-c, df, nc)


@pytest.mark.parametrize(
    "sd, d, paired, n",
    [
        (1.0, 0.5, False, 64),  # Cohen (1988) Table 2.4.1, d = 0.5, power 0.8: 64 per group
        (1.0, 0.8, False, 26),  # d = 0.8: 26 per group
        (1.0, 0.2, False, 394),  # d = 0.2: 394 (Cohen's table, from an approximation: 393)
        (1.0, 0.5, True, 34),  # paired, d_z = 0.5: 34 pairs (G*Power)
        (0.91, 1.0, False, 15),  # the fig2 spread: seeds_to_resolve says 8
        (2.23, 1.0, False, 80),  # the spread realised over 20 seeds
    ],
)
def test_seeds_for_power_against_textbook_values_and_the_normal_approximation(sd, d, paired, n):
  assert stats.seeds_for_power(sd, d, paired=paired) == n
  # exact power at n and n - 1 straddles 0.8
  assert _exact_power(sd, d, n, paired) >= 0.8 > _exact_power(sd, d, n - 1, paired)
  assert stats.resolution_power(sd, d, n, paired=paired) == pytest.approx(
      _exact_power(sd, d, n, paired), rel=1e-12
  )
  # normal approximation n ~ k (z_0.975 + z_0.8)^2 sd^2 / d^2 (k = 2 unpaired, 1 paired):
  # the t's heavier tails need a little more, never less
  z = 1.959963985 + 0.841621234
  normal = (1 if paired else 2) * z**2 * sd**2 / d**2
  assert math.ceil(normal) <= n <= math.ceil(normal) + 2


def test_seeds_for_power_against_simulated_experiments():
  rng = np.random.default_rng(0)
  experiments = 20_000
  sd, d = 0.91, 1.0
  for paired, n in ((False, stats.seeds_for_power(sd, d)), (True, 9)):
    if paired:  # sd is the per-seed differences' spread
      diffs = rng.normal(d, sd, (experiments, n))
      p = scipy_stats.ttest_1samp(diffs, 0.0, axis=1).pvalue
    else:
      a = rng.normal(d, sd, (experiments, n))
      b = rng.normal(0.0, sd, (experiments, n))
      p = scipy_stats.ttest_ind(a, b, axis=1).pvalue
    resolved = float(np.mean(p < 0.05))
    expected = stats.resolution_power(sd, d, n, paired=paired)
    se = math.sqrt(expected * (1 - expected) / experiments)  # binomial: 0.0027 here
    assert abs(resolved - expected) < 4 * se, (paired, n, resolved, expected)
    assert expected >= 0.8


def test_seeds_to_resolve_sizes_the_expected_half_width_about_half_the_power():
  # the numbers: sd 0.91, difference 1, 8 seeds resolve in about half the
  # experiments (Welch's 52% of 20,000, paired 58% at its 6 seeds)
  rng = np.random.default_rng(1)
  n = stats.seeds_to_resolve(0.91, 1.0)
  assert n == 8
  a = rng.normal(1.0, 0.91, (20_000, n))
  b = rng.normal(0.0, 0.91, (20_000, n))
  welch = float(np.mean(scipy_stats.ttest_ind(a, b, axis=1, equal_var=False).pvalue < 0.05))
  assert welch == pytest.approx(0.52, abs=0.015)
  assert stats.resolution_power(0.91, 1.0, n) == pytest.approx(0.534, abs=1e-3)
  paired_n = stats.seeds_to_resolve(0.91, 1.0, paired=True)
  assert paired_n == 6
  assert stats.resolution_power(0.91, 1.0, paired_n, paired=True) == pytest.approx(0.582, abs=1e-3)


def test_seeds_for_power_refuses_bad_input():
  with pytest.raises(ValueError, match="max_seeds must be more than 10: resolving 1 at sd 1"):
    stats.seeds_for_power(1.0, 1.0, max_seeds=10)
  with pytest.raises(ValueError, match="power must be a finite real in \\(0, 1\\), got 1.0"):
    stats.seeds_for_power(1.0, 1.0, power=1.0)
  with pytest.raises(ValueError, match="n must be an integer >= 2, got 1"):
    stats.resolution_power(1.0, 1.0, 1)


def test_resolution_power_far_above_the_critical_value_is_one_not_nan():
  # scipy's nct.cdf of the lower tail is nan at df 9, nc 20.6; the power is 1
  assert stats.resolution_power(2.76, 18, 10, paired=True) == pytest.approx(1.0)
  # and the lower tail still counts where it matters: nc 2.0 against the mirrored form
  c = scipy_stats.t.ppf(0.975, 9)
  want = scipy_stats.nct.sf(c, 9, 2.0) + scipy_stats.nct.cdf(-c, 9, 2.0)
  assert stats.resolution_power(1.0, 2.0 / 10**0.5, 10, paired=True) == pytest.approx(
      want, rel=1e-9
  )
