r"""Statistics of the comparison protocol: intervals over seeds, time to target, network time.

Pure functions of host numbers (NumPy and ``scipy.stats``), no JAX:

  :func:`mean_interval`        mean and a Student-t interval over seeds.
  :func:`difference_interval`  the difference of two arms' means, Welch's (or the
                               paired) interval, and the difference it resolves.
  :func:`seeds_to_resolve`     seeds per arm whose expected interval resolves a
                               difference (about 50% power).
  :func:`resolution_power`     the probability that n seeds per arm resolve a
                               true difference (noncentral t).
  :func:`seeds_for_power`      the fewest seeds per arm that resolve it with a
                               stated probability.
  :func:`equivalence`          the two one-sided tests (TOST) of |difference| < bound.
  :func:`first_reach`          the first evaluation step at or below a target error.
  :func:`best_val_index`       the evaluation with the lowest validation error.
  :func:`error_at_best_val`    the test error there (selected on validation only).
  :func:`allreduce_seconds`    the network model of one worker's all-reduces.
  :func:`verdict`              "holds" / "does not hold" / "inconclusive" from an interval.

Intervals: the mean over n seeds with the Student-t interval
``mean +/- t_{n-1, 0.975} * s / sqrt(n)``,

.. math::

   \bar x \pm t_{n-1,\, 0.975}\, \frac{s}{\sqrt{n}}

(``scipy.stats.t.interval`` with
the standard error ``scipy.stats.sem``, ddof = 1); a difference of two arms
with Welch's interval (``scipy.stats.ttest_ind(..., equal_var=False)
.confidence_interval``), which does not assume equal variances. With n
seeds these are intervals over the seeds' randomness (initial parameters,
data order and, for MNIST-1D, the generated data set), not over
hyperparameters.

References:
  B. L. Welch. The generalization of "Student's" problem when several
  different population variances are involved. Biometrika 34, 1947.
  D. J. Schuirmann. A comparison of the two one-sided tests procedure and
  the power approach for assessing the equivalence of average
  bioavailability. J. Pharmacokinet. Biopharm. 15(6), 1987.
  J. Cohen. Statistical Power Analysis for the Behavioral Sciences, 2nd
  ed., 1988, Chapter 2 (power of the t test from the noncentral t).
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
from scipy import stats

from easgd._util import checks

CONFIDENCE = 0.95
"""The level of every interval the protocol reports."""

VERDICTS = ("holds", "does not hold", "inconclusive")


def _values(name, values) -> np.ndarray:
  arr = checks.real_array(name, values)
  if arr.ndim != 1:
    raise ValueError(f"{name} must be a 1-D sequence of reals, got shape {arr.shape}")
  return arr


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict:
  """Mean of ``values`` with its Student-t confidence interval.

  Args:
    values: one finite number per seed (n >= 1).
    confidence: the interval's level in (0, 1).

  Returns:
    dict(mean, low, high, half_width, n, std (ddof 1; None for n = 1)); for
    n = 1, or n values all equal, low = high = mean (no spread to measure).

  Raises:
    ValueError: an empty, non-finite or non-numeric input; confidence outside (0, 1).

  Example:
    >>> r = mean_interval([1.0, 2.0, 3.0])
    >>> round(r["low"], 4), round(r["high"], 4)   # 2 -/+ 4.3027 * 1 / sqrt(3)
    (-0.4841, 4.4841)
  """
  arr = _values("values", values)
  confidence = checks.real("confidence", confidence, 0, 1, open_low=True, open_high=True)
  n = len(arr)
  if n == 0:
    raise ValueError("values must hold at least one number, got none")
  mean = float(np.mean(arr))
  if n == 1 or np.all(arr == arr[0]):
    return dict(mean=mean, low=mean, high=mean, half_width=0.0, n=n, std=None if n == 1 else 0.0)
  low, high = stats.t.interval(confidence, n - 1, loc=mean, scale=stats.sem(arr))
  return dict(
      mean=mean,
      low=float(low),
      high=float(high),
      half_width=float(high - mean),
      n=n,
      std=float(np.std(arr, ddof=1)),
  )


def difference_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE, *, paired: bool = False
) -> dict:
  """mean(a) - mean(b) with its confidence interval: Welch's, or paired.

  Welch's interval (unequal variances, ``scipy.stats.ttest_ind`` with
  ``equal_var=False``) for independent samples; with ``paired`` (``a[i]`` and
  ``b[i]`` share seed i: the same data order and initialisation) the
  Student-t interval of the mean of the per-seed differences ``a[i] - b[i]``
  (``scipy.stats.ttest_rel``), narrower when the seeds' effects are shared.

  Returns:
    dict(difference, low, high, n_a, n_b, p_value, paired, resolvable):
    ``resolvable`` is the interval's half-width, ``(high - low) / 2``: the
    smallest difference of the means this comparison resolves from 0 at the
    measured spreads and numbers of seeds (a measured difference larger in
    size excludes 0). When the samples (or the differences) have no spread
    the interval is the point difference, ``resolvable`` 0 and p_value None.

  Raises:
    ValueError: a sample with fewer than 2 values, non-finite values, or
      ``paired`` samples of different lengths.
  """
  a, b = _values("a", a), _values("b", b)
  if len(a) < 2 or len(b) < 2:
    raise ValueError(f"each sample needs at least 2 values, got {len(a)} and {len(b)}")
  if paired and len(a) != len(b):
    raise ValueError(f"paired samples need one value per seed each, got {len(a)} and {len(b)}")
  diff = float(np.mean(a) - np.mean(b))
  out = dict(difference=diff, low=diff, high=diff, n_a=len(a), n_b=len(b), p_value=None)
  out.update(paired=bool(paired), resolvable=0.0)
  if (np.ptp(a - b) == 0) if paired else (np.ptp(a) == 0 and np.ptp(b) == 0):
    return out
  with warnings.catch_warnings():  # nearly equal samples: scipy warns, the values stand
    warnings.simplefilter("ignore", RuntimeWarning)
    test = stats.ttest_rel(a, b) if paired else stats.ttest_ind(a, b, equal_var=False)
    ci = test.confidence_interval(confidence)
  out.update(low=float(ci.low), high=float(ci.high), p_value=float(test.pvalue))
  out["resolvable"] = (out["high"] - out["low"]) / 2
  return out


def seeds_to_resolve(
    spread: float, difference: float, *, paired: bool = False, confidence: float = CONFIDENCE
) -> int:
  r"""The fewest seeds per arm whose interval resolves ``difference`` from 0.

  For two arms of n seeds each with the common standard deviation ``spread``
  (ddof 1), Welch's half-width is :math:`t_{2n-2}\, s \sqrt{2 / n}` (its
  degrees of freedom are 2n - 2 when the spreads are equal); paired, with
  ``spread`` the standard deviation of the per-seed differences, it is
  :math:`t_{n-1}\, s / \sqrt{n}` (s = ``spread``). Returns the smallest n >= 2 whose half-width
  is at most ``difference``. Example: spread 1 pp, difference 1 pp, unpaired:
  n = 8 gives 2.1448 * 0.5 = 1.072 pp, n = 9 gives 2.1199 * 0.4714 = 0.999
  pp, so 9.

  This sizes the *expected* half-width, not the power: when the true
  difference equals ``difference``, the measured one lands beyond the
  half-width (the interval excludes 0) only about half the time
  (:func:`resolution_power` at this n: 0.51 in the example above, 0.60
  paired at its 7 seeds; 0.53 at spread 0.91, where this gives 8). For a
  stated probability of resolving a true difference use
  :func:`seeds_for_power` (15 seeds for 80% power at spread 0.91).

  Args:
    spread: the seeds' standard deviation (> 0), in the units of ``difference``.
    difference: the difference to resolve (> 0).
    paired: the arms share seeds (``spread``: of the differences).
    confidence: the interval's level.

  Returns:
    n, at most 10**6.

  Raises:
    ValueError: a non-positive spread or difference, or more than 10**6 seeds needed.
  """
  spread = checks.real("spread", spread, 0, open_low=True)
  difference = checks.real("difference", difference, 0, open_low=True)
  q = 0.5 + confidence / 2

  def half_width(n):
    if paired:
      return stats.t.ppf(q, n - 1) * spread / math.sqrt(n)
    return stats.t.ppf(q, 2 * n - 2) * spread * math.sqrt(2 / n)

  n = 2
  while half_width(n) > difference:
    n += 1 if n < 64 else n // 8
    if n > 10**6:
      raise ValueError(f"resolving {difference:g} at spread {spread:g} needs more than 10**6 seeds")
  while n > 2 and half_width(n - 1) <= difference:  # back from a coarse step
    n -= 1
  return n


def _power(sd: float, difference: float, n: np.ndarray, paired: bool, confidence: float):
  """:func:`resolution_power` at each n of the integer array ``n`` (>= 2)."""
  n = np.asarray(n, np.float64)
  df = n - 1 if paired else 2 * n - 2
  nc = difference / (sd / np.sqrt(n)) if paired else difference / (sd * np.sqrt(2 / n))
  critical = stats.t.ppf(0.5 + confidence / 2, df)
  # P(T < -c) as P(T' > c) with T' of noncentrality -nc: scipy's nct.cdf is nan far
  # in the lower tail (e.g. df 9, nc 20.6), its mirrored sf is 0 there
  return stats.nct.sf(critical, df, nc) + stats.nct.sf(critical, df, -nc)


def resolution_power(
    sd: float, difference: float, n: int, *, paired: bool = False, confidence: float = CONFIDENCE
) -> float:
  r"""The probability that n seeds per arm resolve a true ``difference`` from 0.

  The two-sided ``confidence`` interval of the difference excludes 0 exactly
  when the t statistic exceeds the critical value :math:`c = t_{\nu,\,
  (1 + \mathrm{confidence}) / 2}`; with a true difference :math:`d` the
  statistic follows the noncentral t distribution with :math:`\nu` degrees of
  freedom and noncentrality :math:`\delta`, so

  .. math::

     \mathrm{power} = P(T_{\nu,\delta} > c) + P(T_{\nu,\delta} < -c)

  (``scipy.stats.nct``). Unpaired: two arms of n seeds with the common
  standard deviation ``sd``, :math:`\nu = 2n - 2`, :math:`\delta = d / (s
  \sqrt{2/n})` (the pooled t test; Welch's interval, which the protocol
  reports, has slightly fewer degrees of freedom when the spreads differ and
  so slightly less power). Paired: ``sd`` is the standard deviation of the
  per-seed differences, :math:`\nu = n - 1`, :math:`\delta = d / (s /
  \sqrt{n})`.

  Args:
    sd: the seeds' standard deviation (> 0; paired: of the differences), in
      the units of ``difference``.
    difference: the true difference of the arms' means (> 0).
    n: seeds per arm (>= 2; paired: the number of pairs).
    paired: the arms share seeds.
    confidence: the interval's level, in (0, 1).

  Returns:
    The power, a probability in (0, 1).

  Raises:
    ValueError: a non-positive sd or difference, n < 2, confidence outside (0, 1).

  Example:
    >>> round(resolution_power(1.0, 0.5, 64), 3)   # Cohen's d = 0.5, 64 seeds per arm
    0.801

  References:
    J. Cohen. Statistical Power Analysis for the Behavioral Sciences, 2nd
    ed., 1988, Section 2.3 and Table 2.4.1 (n = 64 per group at d = 0.5).
  """
  sd = checks.real("sd", sd, 0, open_low=True)
  difference = checks.real("difference", difference, 0, open_low=True)
  n = checks.integer("n", n, 2)
  confidence = checks.real("confidence", confidence, 0, 1, open_low=True, open_high=True)
  return float(_power(sd, difference, np.array([n]), bool(paired), confidence)[0])


def seeds_for_power(
    sd: float,
    difference: float,
    *,
    power: float = 0.8,
    confidence: float = CONFIDENCE,
    paired: bool = False,
    max_seeds: int = 1000,
) -> int:
  r"""The fewest seeds per arm that resolve a true ``difference`` with probability ``power``.

  The smallest n >= 2 whose :func:`resolution_power` (exact, from the
  noncentral t distribution: unpaired :math:`\nu = 2n - 2`, :math:`\delta = d
  / (s \sqrt{2/n})`; paired :math:`\nu = n - 1`, :math:`\delta = d / (s /
  \sqrt{n})`) is at least ``power``: with n seeds per arm and the true
  difference ``difference``, the two-sided ``confidence`` interval excludes 0
  in at least that fraction of experiments. For large n it approaches the
  normal approximation

  .. math::

     n \approx 2\, (z_{1 - \alpha/2} + z_{\mathrm{power}})^2\, s^2 / d^2

  (unpaired; paired without the 2), from above. Unlike
  :func:`seeds_to_resolve`, which makes the *expected* half-width equal to
  the difference (the measured difference then falls beyond it about half
  the time: about 50% power), this sizes for the stated power. Example: sd
  0.91 pp, difference 1 pp, unpaired: ``seeds_to_resolve`` gives 8 seeds
  (power 0.53), this 15 (power 0.83; 14 give 0.799); at sd 2.23 pp, 40
  against 80.

  Args:
    sd: the seeds' standard deviation (> 0; paired: of the per-seed
      differences), in the units of ``difference``.
    difference: the true difference to resolve (> 0).
    power: the probability to resolve it, in (0, 1).
    confidence: the interval's level, in (0, 1).
    paired: the arms share seeds.
    max_seeds: the most seeds per arm searched (>= 2).

  Returns:
    n, seeds per arm (paired: pairs), in [2, max_seeds].

  Raises:
    ValueError: a non-positive sd or difference, a power or confidence
      outside (0, 1), max_seeds < 2, or more than max_seeds seeds needed.

  Example:
    >>> seeds_for_power(1.0, 0.5), seeds_for_power(1.0, 0.5, paired=True)
    (64, 34)

  References:
    J. Cohen. Statistical Power Analysis for the Behavioral Sciences, 2nd
    ed., 1988, Chapter 2 (Table 2.4.1: 64 per group at d = 0.5, power 0.8).
  """
  sd = checks.real("sd", sd, 0, open_low=True)
  difference = checks.real("difference", difference, 0, open_low=True)
  power = checks.real("power", power, 0, 1, open_low=True, open_high=True)
  confidence = checks.real("confidence", confidence, 0, 1, open_low=True, open_high=True)
  max_seeds = checks.integer("max_seeds", max_seeds, 2)
  ns = np.arange(2, max_seeds + 1)
  enough = np.flatnonzero(_power(sd, difference, ns, bool(paired), confidence) >= power)
  if enough.size == 0:
    raise ValueError(
        f"max_seeds must be more than {max_seeds}: resolving {difference:g} at sd {sd:g} with "
        f"power {power:g} needs more seeds per arm"
    )
  return int(ns[enough[0]])


def equivalence(
    a: Sequence[float],
    b: Sequence[float],
    bound: float,
    *,
    paired: bool,
    confidence: float = CONFIDENCE,
) -> dict:
  r"""The two one-sided tests (TOST) that :math:`|\mathrm{mean}(a) - \mathrm{mean}(b)| < ` ``bound``.

  With :math:`\alpha = 1 - ` ``confidence``, the difference is declared
  equivalent to 0 within ``bound`` (a "no effect" statement) when both
  one-sided nulls :math:`\Delta \le -\mathrm{bound}` and :math:`\Delta \ge
  \mathrm{bound}` are rejected at level :math:`\alpha`, which is the same as
  the :math:`(1 - 2\alpha)` interval

  .. math::

     \bar d \pm t_{\nu,\, 1 - \alpha}\, \mathrm{se}

  lying inside :math:`(-\mathrm{bound}, +\mathrm{bound})`. Paired (``a[i]``
  and ``b[i]`` share seed i): :math:`\bar d` and se of the per-seed
  differences, :math:`\nu = n - 1` (``scipy.stats.ttest_rel``). Unpaired:
  Welch's :math:`\mathrm{se} = \sqrt{s_a^2/n_a + s_b^2/n_b}` with the
  Welch-Satterthwaite :math:`\nu = \mathrm{se}^4 / (\frac{(s_a^2/n_a)^2}{n_a
  - 1} + \frac{(s_b^2/n_b)^2}{n_b - 1})` (``scipy.stats.ttest_ind``,
  ``equal_var=False``). The p-value is the larger of the two one-sided ones,
  :math:`P(T_\nu > (\bar d + \mathrm{bound}) / \mathrm{se})` and
  :math:`P(T_\nu < (\bar d - \mathrm{bound}) / \mathrm{se})`; equivalent
  exactly when it is below :math:`\alpha`.

  Args:
    a, b: one value per seed each (>= 2; paired: the same length).
    bound: the equivalence margin (> 0), in the units of the values; e.g. the
      difference the comparison resolves (``difference_interval``'s
      ``resolvable``) or a stated smallest difference of interest.
    paired: the arms share seeds (required: the test differs).
    confidence: 1 - alpha, in (0.5, 1); the interval is at 1 - 2 alpha
      (0.90 for the default 0.95).

  Returns:
    dict(difference, low, high, bound, equivalent, p_value, df, level,
    paired): the (1 - 2 alpha) interval at ``level``. When the samples (or
    the differences) have no spread the interval is the point difference,
    ``equivalent`` is ``|difference| < bound`` and p_value and df are None.

  Raises:
    ValueError: a sample with fewer than 2 values, non-finite values,
      ``paired`` samples of different lengths, a non-positive bound, or
      confidence outside (0.5, 1).

  Example:
    >>> r = equivalence([1.0, 2.0, 3.0], [1.5, 2.0, 2.5], 2.0, paired=True)
    >>> round(r["low"], 4), round(r["high"], 4), r["equivalent"]   # 0 -/+ 2.92 * 0.5 / sqrt(3)
    (-0.8429, 0.8429, True)

  References:
    D. J. Schuirmann. A comparison of the two one-sided tests procedure and
    the power approach for assessing the equivalence of average
    bioavailability. J. Pharmacokinet. Biopharm. 15(6), 657-680, 1987.
  """
  a, b = _values("a", a), _values("b", b)
  if len(a) < 2 or len(b) < 2:
    raise ValueError(f"each sample needs at least 2 values, got {len(a)} and {len(b)}")
  if paired and len(a) != len(b):
    raise ValueError(f"paired samples need one value per seed each, got {len(a)} and {len(b)}")
  bound = checks.real("bound", bound, 0, open_low=True)
  confidence = checks.real("confidence", confidence, 0.5, 1, open_low=True, open_high=True)
  level = 1 - 2 * (1 - confidence)
  diff = float(np.mean(a) - np.mean(b))
  out = dict(difference=diff, low=diff, high=diff, bound=bound, p_value=None, df=None)
  out.update(equivalent=bool(abs(diff) < bound), level=level, paired=bool(paired))
  if (np.ptp(a - b) == 0) if paired else (np.ptp(a) == 0 and np.ptp(b) == 0):
    return out

  def test(x, y, alternative):
    if paired:
      return stats.ttest_rel(x, y, alternative=alternative)
    return stats.ttest_ind(x, y, equal_var=False, alternative=alternative)

  with warnings.catch_warnings():  # nearly equal samples: scipy warns, the values stand
    warnings.simplefilter("ignore", RuntimeWarning)
    two_sided = test(a, b, "two-sided")
    ci = two_sided.confidence_interval(level)
    above = test(a + bound, b, "greater")  # H0: difference <= -bound
    below = test(a - bound, b, "less")  # H0: difference >= +bound
  p_value = max(float(above.pvalue), float(below.pvalue))
  out.update(low=float(ci.low), high=float(ci.high), p_value=p_value, df=float(two_sided.df))
  out["equivalent"] = bool(-bound < out["low"] and out["high"] < bound)
  return out


def verdict(interval: dict, *, holds_if: str) -> str:
  """The verdict of a claim from the interval of a difference.

  Args:
    interval: dict with ``low`` and ``high`` (e.g. :func:`difference_interval`).
    holds_if: "negative" (the claim says the difference is below 0) or
      "positive".

  Returns:
    "holds" when the whole interval is on the claimed side of 0, "does not
    hold" when it is wholly on the other side, else "inconclusive".
  """
  checks.choice("holds_if", holds_if, ("negative", "positive"))
  low, high = interval["low"], interval["high"]
  claimed_low, claimed_high = (low, high) if holds_if == "positive" else (-high, -low)
  if claimed_low > 0:
    return "holds"
  if claimed_high < 0:
    return "does not hold"
  return "inconclusive"


def combine_verdicts(verdicts: Sequence[str]) -> str:
  """All parts hold: "holds"; any part does not hold: "does not hold"; else
  "inconclusive"."""
  for v in verdicts:
    checks.choice("verdict", v, VERDICTS)
  if verdicts and all(v == "holds" for v in verdicts):
    return "holds"
  if any(v == "does not hold" for v in verdicts):
    return "does not hold"
  return "inconclusive"


def first_reach(errors: Sequence[float], steps: Sequence[int], target: float) -> int | None:
  """The first evaluation step whose error is at or below ``target``, or None.

  Args:
    errors: the error at each evaluation (fractions; NaN never reaches).
    steps: the evaluation steps, ascending, same length.
    target: the target error.

  Example:
    >>> first_reach([0.9, 0.4, 0.25, 0.3], [0, 10, 20, 30], 0.3)
    20
  """
  errors = np.asarray(errors, np.float64)
  hit = np.flatnonzero(np.nan_to_num(errors, nan=np.inf) <= target)
  return None if hit.size == 0 else int(steps[hit[0]])


def best_val_index(val_error_curve: Sequence[float]) -> int:
  """The evaluation with the lowest validation error (the earliest of equal
  ones); the last evaluation when none is finite.

  Args:
    val_error_curve: the center's validation error at each evaluation
      (fractions; NaN or None where the run had diverged).

  Returns:
    The index into the evaluations.

  Example:
    >>> best_val_index([0.9, 0.3, 0.3, float("nan"), 0.4])
    1
  """
  curve = np.asarray([np.nan if v is None else v for v in val_error_curve], np.float64)
  finite = np.isfinite(curve)
  if not finite.any():
    return len(curve) - 1
  return int(np.argmin(np.where(finite, curve, np.inf)))


def error_at_best_val(test_error_curve: Sequence[float], val_error_curve: Sequence[float]) -> float:
  """The test error at the evaluation with the lowest validation error.

  The test set is read at the one evaluation the validation split chose
  (:func:`best_val_index`), never minimised over.

  Args:
    test_error_curve: the center's test error at each evaluation (NaN or
      None where the run had diverged).
    val_error_curve: its validation error at the same evaluations.

  Returns:
    That test error (a fraction); a non-finite one counts as 1 (a diverged run).

  Raises:
    ValueError: the curves differ in length.

  Example:
    >>> error_at_best_val([0.5, 0.2, 0.1], [0.5, 0.3, 0.35])   # not min(test) = 0.1
    0.2
  """
  if len(test_error_curve) != len(val_error_curve):
    raise ValueError(
        f"the test and validation curves must have one value per "
        f"evaluation, got {len(test_error_curve)} and {len(val_error_curve)}"
    )
  value = test_error_curve[best_val_index(val_error_curve)]
  return 1.0 if value is None or not math.isfinite(value) else float(value)


def allreduce_seconds(
    all_reduces: int,
    bytes_per_worker: int,
    num_workers: int,
    bandwidth_bytes_per_s: float,
    latency_s: float,
) -> float:
  r"""Seconds one worker spends in ``all_reduces`` ring all-reduces moving
  ``bytes_per_worker`` reduced bytes in all:

  .. math::

     N \ell + \frac{2 (p - 1)}{p}\, \frac{B}{b}

  (N = ``all_reduces``, l = ``latency_s``, B = ``bytes_per_worker``,
  b = ``bandwidth_bytes_per_s``)

  (a ring all-reduce sends and receives 2 (p - 1) / p times the buffer per
  worker); 0 for p = 1.
  """
  if num_workers <= 1:
    return 0.0
  return (
      all_reduces * latency_s
      + 2.0 * (num_workers - 1) / num_workers * bytes_per_worker / bandwidth_bytes_per_s
  )


def allgather_seconds(
    all_gathers: int,
    bytes_per_worker: int,
    num_workers: int,
    bandwidth_bytes_per_s: float,
    latency_s: float,
) -> float:
  r"""Seconds one worker spends in ``all_gathers`` ring all-gathers of the payloads it
  contributes, ``bytes_per_worker`` in all (compressed exchanges,
  ``easgd.core.streaming``):

  .. math::

     N \ell + (p - 1)\, \frac{M}{b}

  (N = ``all_gathers``, M = ``bytes_per_worker``; a ring all-gather sends and receives
  p - 1 payloads per worker); 0 for p = 1.
  """
  if num_workers <= 1:
    return 0.0
  return all_gathers * latency_s + (num_workers - 1) * bytes_per_worker / bandwidth_bytes_per_s


def modelled_seconds(steps: int, compute_per_step_s: float, *all_reduce) -> float:
  """Modelled wall-clock seconds of ``steps`` local steps: the measured compute per
  step times steps, plus ``allreduce_seconds(*all_reduce)`` (its arguments
  ``all_reduces, bytes_per_worker, num_workers, bandwidth_bytes_per_s, latency_s``;
  no overlap of compute and communication)."""
  return steps * compute_per_step_s + allreduce_seconds(*all_reduce)


def format_interval(
    summary: dict | None, scale: float = 100.0, digits: int = 2, unit: str = ""
) -> str:
  """``"12.34 +/- 0.56"`` (mean +/- half width, times ``scale``) or "-"."""
  if summary is None or summary.get("mean") is None or not math.isfinite(summary["mean"]):
    return "-"
  return (
      f"{scale * summary['mean']:.{digits}f} \u00b1 "
      f"{scale * summary['half_width']:.{digits}f}{unit}"
  )
