"""The paper's Section 5 claims and the differences between arms, measured on results.json.

  :func:`claims`                 each claim measured on the Figure 2 and 3 experiments'
                                 results (and on a replication, e.g. Fashion-MNIST): every
                                 part with its 95% interval, verdict, comparator, equivalence
                                 bound and the seeds 80% power needs.
  :func:`claims_markdown`        the claims as the guide's compact table, or every part.
  :func:`claim_sentence`         one claim as a sentence (the guides and notebooks quote it).
  :func:`ranking`                which arms end lowest, ranked only where an interval resolves it.
  :func:`differences_markdown`   every arm against a reference arm (paired by seed where
                                 the arms pair, :func:`paired`; else Welch's).

See docs/guides/protocol.md and docs/guides/results.md for how the verdicts read.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015, Section 5.
  D. J. Schuirmann. A comparison of the two one-sided tests procedure and the power
  approach for assessing the equivalence of average bioavailability. 1987 (TOST).
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from easgd.methods import registry
from easgd.protocol import stats
from easgd.protocol.networks import network_from_dict
from easgd.protocol.report import require_error, selected_error
from easgd.protocol.stats import format_interval

CLAIMS_TARGET = 0.3
"""The test error of the claim "EAMSGD is fastest to a given test error"."""
CLAIMS_NETWORK = "1GbE"
"""The network of that claim's modelled wall-clock time."""
ERROR_BOUND = 0.01
"""The smallest difference of test error of interest (1 point): the equivalence
bound of a "no effect" statement (TOST) and the difference the seeds are sized
to resolve, for the claims on test error."""
TIME_BOUND = 0.1
"""The same for the claim on time, as a fraction of the two arms' mean modelled
time to the target (10%)."""
POWER = 0.8
"""The power the seeds a claim would need are sized for (``stats.seeds_for_power``)."""
SEED_FIXES = (
    "task",
    "task_args",
    "dataset",
    "data_dir",
    "crop_size",
    "model",
    "param_dtype",
    "validation_examples",
)
"""The config fields that, equal in two arms, make seed i give both the same
initial parameters and data set (:func:`paired`)."""
COMPARATORS = ("paper", "other")
"""A part's comparator: methods the paper ran (``AlgorithmSpec.paper``) or not."""
_COMPARATOR_TEXT = dict(paper="the paper's comparators", other="methods the paper did not run")
_CLAIM_KEYS = ("fastest", "robust", "larger_tau", "workers", "center")


def _paper_methods(results) -> list[str]:
  """The algorithms the claims' EASGD and EAMSGD are measured on
  (``registry.PAPER_METHODS``): of each, the asynchronous one as the paper ran it
  (Algorithms 1 and 2) where the results have its arms, else the synchronous one
  (eq. (5)-(7))."""
  present = {a["algorithm"] for a in results["arms"].values()}
  out = []
  for method in registry.PAPER_METHODS.values():
    here = [n for n in method if n in present]
    asynchronous = [n for n in here if registry.TABLE[n].asynchronous]
    out += asynchronous or here
  return out


def paired(results: dict, a: dict, b: dict) -> bool:
  """Whether two arms of ``results`` are compared per seed (paired).

  The rule: pairing by seed is valid whenever each seed is one unit of both
  arms. Run i of either arm is a function of seed i alone, so the per-seed
  differences ``a[i] - b[i]`` are independent across seeds whatever else the
  arms differ in (workers, batch, algorithm, rate, data order), and their
  Student-t interval is valid; it is narrower than Welch's by what seed i
  fixes in both arms. Two arms are paired when their report runs used the
  same seeds in the same order and agree on :data:`SEED_FIXES` (task, data
  set, model, parameter dtype, validation split), so that seed i gives both
  the same initial parameters and, for MNIST-1D, the same generated data set
  (the protocol's arms: ``easgd.protocol.runs``). Different workers or global
  batches (different data orders) do not unpair them: Figure 3's p = 4 and
  p = 8 arms pair (per-seed correlation 0.82 to 0.94).

  Args:
    results: a protocol's results.json (its ``report_seeds`` are the default
      seeds of an arm without its own).
    a, b: two of its arms.

  Returns:
    True when the arms pair by seed.
  """
  default = results["protocol"]["report_seeds"]
  seeds = [list(x.get("report", {}).get("seeds", default)) for x in (a, b)]
  same_unit = all(a["config"].get(k) == b["config"].get(k) for k in SEED_FIXES)
  return seeds[0] == seeds[1] and same_unit


def _arms(results, algorithm=None, **config):
  out = {}
  for name, a in results["arms"].items():
    if algorithm is not None and a["algorithm"] != algorithm:
      continue
    if all(a["config"].get(k) == v for k, v in config.items()):
      out[name] = a
  return out


def _comparator(*arms: dict) -> str:
  """ "paper" when every arm's algorithm is one the paper ran, else "other"."""
  return "paper" if all(registry.TABLE[a["algorithm"]].paper for a in arms) else "other"


def experiment_label(results: dict) -> str:
  """``"MNIST-1D, CNN"``: the data set (or task) and model of an experiment."""
  base = results["protocol"].get("base", {})
  names = dict(
      mnist1d="MNIST-1D", fashion_mnist="Fashion-MNIST", digits="digits", cifar10="CIFAR-10"
  )
  task = results.get("task") or {}
  if base.get("task"):  # a task factory: the data set and model it records, and its name
    data, model = task.get("dataset"), task.get("model")
    if not data:
      return f"task {task.get('name') or base['task']}"
    model = str(model or "").upper().replace("_", "-")
    head = f"{names.get(data, data)}, {model}" if model else names.get(data, data)
    return f"{head} (task {task.get('name') or base['task']})"
  data = names.get(base.get("dataset"), base.get("dataset") or "?")
  model = str(base.get("model") or "").upper().replace("_", "-")
  return f"{data}, {model}" if model else data


def _which(algorithm: str) -> str:
  """The registry's summary of an algorithm, e.g. "asynchronous EAMSGD, Algorithm 2"."""
  return registry.TABLE[algorithm].summary


def _as_run(algorithms) -> str:
  """``"as run: asynchronous EASGD, Algorithm 1; asynchronous EAMSGD, Algorithm 2"``."""
  return "as run: " + "; ".join(map(_which, algorithms)) if algorithms else "none run"


def _modelled_seconds(arm: dict, network: str, i: int, j: int | None = None) -> float:
  """Modelled seconds of the arm's steps up to evaluation ``i`` (with ``j``:
  from evaluation ``j`` to ``i``) on ``network`` (``Network.modelled_seconds``);
  an arm without within-worker counts (one device per worker) has none."""
  c = arm["config"]
  net = network_from_dict(next(n for n in arm["_networks"] if n["name"] == network))
  steps, comm = arm["report"]["eval_steps"], arm["communication_curve"]
  zeros = [0] * len(steps)
  curve = [
      comm["all_reduces"],
      comm["bytes"],
      comm.get("within_all_reduces", zeros),
      comm.get("within_bytes", zeros),
  ]
  at = lambda k: [v[k] for v in curve] if k is not None else [0, 0, 0, 0]
  (a, b, wa, wb), (a0, b0, wa0, wb0) = at(i), at(j)
  return net.modelled_seconds(
      steps[i] - (steps[j] if j is not None else 0),
      arm["compute_per_step_s"],
      (a - a0, b - b0),
      (wa - wa0, wb - wb0),
      c["num_workers"],
      c.get("devices_per_worker", 1),
  )


def _censored_times(arm: dict, target: float, network: str) -> list[float]:
  """Modelled seconds to ``target`` per seed; a seed that never reached it
  counts the run's whole modelled time (a lower bound of its time)."""
  entry = arm["time_to_target"][str(target)]
  steps = list(arm["report"]["eval_steps"])
  return [
      _modelled_seconds(arm, network, len(steps) - 1 if h is None else steps.index(h))
      for h in entry["steps"]
  ]


def _resolution(arm: dict, network: str) -> float:
  """Modelled seconds of the longest interval between two evaluations."""
  steps = arm["report"]["eval_steps"]
  return max(_modelled_seconds(arm, network, i + 1, i) for i in range(len(steps) - 1))


def _scale(unit: str) -> float:
  return 100.0 if unit == "pp" else 1.0


def _fmt_diff(d: dict, scale: float = 100.0, unit: str = " pp") -> str:
  """``+d unit [low, high], resolves r``: the difference, its interval, and the
  smallest difference the interval resolves from 0 (its half-width: a
  measured difference smaller in size is inconclusive)."""
  resolvable = (d["high"] - d["low"]) / 2
  return (
      f"{scale * d['difference']:+.2f}{unit} [{scale * d['low']:+.2f}, "
      f"{scale * d['high']:+.2f}], resolves {scale * resolvable:.2f}{unit}"
  )


def _spread(a, b, is_paired: bool) -> float:
  """The standard deviation ``stats.seeds_for_power`` takes: of the per-seed
  differences (paired), else the root mean square of the two arms' (ddof 1)."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  if is_paired:
    return float(np.std(a - b, ddof=1))
  return float(np.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2))


def _arms_part(res, what: str, a: dict, b: dict, metric: str, *, holds_if: str) -> dict:
  """:func:`_part` of ``a[metric] - b[metric]`` (per-seed test errors) of two arms of
  ``res``: paired where :func:`paired`, compared as :func:`_comparator`, bound
  :data:`ERROR_BOUND`."""
  return _part(
      what,
      a[metric],
      b[metric],
      holds_if=holds_if,
      is_paired=paired(res, a, b),
      comparator=_comparator(a, b),
      bound=ERROR_BOUND,
  )


def _part(
    what: str,
    a: Sequence[float],
    b: Sequence[float],
    *,
    holds_if: str,
    is_paired: bool,
    comparator: str,
    bound: float,
    unit: str = "pp",
    widen: float = 0.0,
    censored: int = 0,
) -> dict:
  """One difference of a claim, ``mean(a) - mean(b)``, read every way a reviewer asks.

  Args:
    what: the part's label ("a - b (final test error)").
    a, b: one value per report seed (fractions of error, or seconds).
    holds_if: the claimed sign ("negative" or "positive", ``stats.verdict``).
    is_paired: compare per seed (:func:`paired`).
    comparator: "paper" or "other" (:data:`COMPARATORS`).
    bound: the smallest difference of interest, in the values' units: the
      equivalence bound and the difference the seeds are sized for.
    unit: "pp" (values are fractions, shown x 100) or "s".
    widen: a known measurement error added to each side of the interval
      (a time to target is known to one evaluation interval).
    censored: seeds of ``a`` that never reached the target (their values are
      lower bounds: the part can then not "hold").

  Returns:
    dict(what, comparator, interval (``stats.difference_interval``, widened),
    verdict, unit, text, limited_by, equivalence, seeds_for_power):
    ``limited_by`` (an inconclusive part only) is "evaluation grid" when the
    seeds alone resolve the difference and the widening does not, else
    "seeds" (or "censored seeds"); ``equivalence`` is ``stats.equivalence`` at
    ``bound - widen`` with its interval widened (None where ``widen`` reaches
    the bound: no number of seeds can show it); ``seeds_for_power`` the
    seeds per arm whose interval resolves ``bound - widen`` with probability
    :data:`POWER` at the realised spread (None where not computable, -1 for
    more than 1000).
  """
  raw = stats.difference_interval(a, b, paired=is_paired)
  d = dict(raw)
  if widen:
    d.update(low=raw["low"] - widen, high=raw["high"] + widen, resolution=widen)
    d["resolvable"] = raw["resolvable"] + widen
  verdict = stats.verdict(d, holds_if=holds_if)
  scale = _scale(unit)
  text = _fmt_diff(d, scale, f" {unit}")
  if censored:
    # the censored times are lower bounds of the times: they can show the arm
    # slower ("does not hold"), never faster
    text += f"; missed the target on {censored} seed(s)"
    if verdict == "holds":
      verdict = "inconclusive"
  part = dict(what=what, comparator=comparator, interval=d, verdict=verdict, unit=unit, text=text)
  part.update(limited_by=None, equivalence=None, seeds_for_power=None, bound=bound)
  if verdict == "inconclusive":
    grid = raw["low"] > 0 or raw["high"] < 0
    part["limited_by"] = "censored seeds" if censored else "evaluation grid" if grid else "seeds"
  margin = bound - widen
  sd = _spread(a, b, is_paired)
  if margin > 0 and not censored:
    eq = stats.equivalence(a, b, margin, paired=is_paired)
    part["equivalence"] = dict(eq, low=eq["low"] - widen, high=eq["high"] + widen, bound=bound)
    if sd > 0:
      try:
        part["seeds_for_power"] = stats.seeds_for_power(sd, margin, power=POWER, paired=is_paired)
      except ValueError:  # more than its max_seeds
        part["seeds_for_power"] = -1
  return part


def claims(fig2: dict | None, fig3: dict | None, *replications: dict) -> list[dict[str, Any]]:
  """The paper's Section 5 claims measured on the Figure 2 and 3 experiments.

  Each claim is reduced to differences between arms over the report seeds,
  each with its 95% interval (``easgd.protocol.stats.difference_interval``):
  paired, the interval of the per-seed differences, where the two arms pair
  by seed (:func:`paired`: the same report seeds, task and model; the
  protocol's arms do) and always for the center against its own workers, else
  Welch's. EASGD and EAMSGD are the asynchronous ``async_easgd`` and
  ``async_eamsgd`` (Algorithms 1 and 2, as the paper ran them) where the
  results have such arms (every exchange order among them), else the
  synchronous ``easgd`` and ``eamsgd``. The verdict of each difference is
  "holds" when its interval lies wholly on the claimed side of 0, "does not
  hold" when wholly on the other side, else "inconclusive"; a claim holds
  when all its parts do, does not hold when any part does not
  (``combine_verdicts``), and its parts are counted apart against the paper's
  comparators (both arms run by the paper, ``AlgorithmSpec.paper``) and
  against methods the paper did not run. Each part also carries the TOST
  equivalence at the smallest difference of interest (:data:`ERROR_BOUND`,
  :data:`TIME_BOUND`) and the seeds :data:`POWER` needs to resolve it.

  1. EAMSGD is fastest to a given test error (:data:`CLAIMS_TARGET`, modelled
     time on :data:`CLAIMS_NETWORK`): at each tau, EAMSGD's time minus each
     other arm's at that tau and of the tau-free references (momentum
     baselines among them, e.g. pmean SGD with Nesterov momentum, a method the
     paper did not run, its optimizer in the part's label; a seed that never
     reaches the target counts the run's whole time, a lower bound: such a
     seed of EAMSGD's can make a part "does not hold" or "inconclusive", never
     "holds"); a time is known to one evaluation interval, so each interval is
     widened by the longer of the two arms' modelled time between evaluations.
  2. EASGD and EAMSGD are robust to large tau where DOWNPOUR breaks down: at
     tau = 16 and 64 (those run), DOWNPOUR's final test error minus EASGD's
     and EAMSGD's.
  3. EASGD tends to reach a lower test error with a larger tau: EASGD's final
     test error at each larger tau minus at each smaller one (every pair of
     taus run, arms equal but for tau).
  4. More workers help EASGD (and EAMSGD): at the same local steps, the test
     error at the smallest p (4 in Figure 3) minus that at each larger p run
     (a larger p then also processes p/4 times the samples); and, where the
     results hold an arm at the smallest p of the larger p's samples (within
     :data:`SAMPLES_TOLERANCE`: p = 4 run for p/4 times the epochs), that arm
     minus the larger p's, labelled "equal samples": more workers at equal
     samples. The test error at the evaluation with the lowest validation
     error, or the final one for results without validation curves
     (:func:`selected_error`), never the lowest test error (chosen on the test
     set).
  5. The center beats the workers: EASGD's and EAMSGD's final center test
     error minus the mean of their workers', per seed (paired), every tau.

  Args:
    fig2: the Figure 2 experiment's results (claims 1, 2, 3, 5), or None.
    fig3: the Figure 3 experiment's results (claim 4), or None.
    *replications: other experiments' results on which every claim they have
      the arms for is measured as well (e.g. Fashion-MNIST, tau in {4, 16}).

  Returns:
    One dict per claim and experiment, ordered by claim, then experiment (a
    claim an experiment has no arms for is left out): key (fastest, robust,
    larger_tau, workers, center), claim, measurement (text), parts (each
    :func:`_part`'s dict), n (seeds per arm), verdict, by_comparator
    ({"paper" | "other": {verdict: count}}), verdict_by_comparator, unit,
    bound, source (the experiment's name), experiment (data set and model),
    context (sentences of what the claim compares).

  Raises:
    ValueError: an experiment for claim 1 has no time to :data:`CLAIMS_TARGET`
      (not among its targets).
    ProtocolError: results of a task without a per-example ``"correct"`` (no
      test error to speak of).
  """
  for results in (fig2, fig3, *replications):
    if results is not None:
      require_error(results, "the claims table")
  measured = {key: [] for key in _CLAIM_KEYS}
  for results in (fig2, *replications):
    if results is None:
      continue
    for a in results["arms"].values():
      a["_networks"] = results["protocol"]["networks"]
    if results is fig2 or any(
        abs(t - CLAIMS_TARGET) < 1e-12 for t in results["protocol"]["targets"]
    ):
      measured["fastest"].append(_claim_fastest(results))
    measured["robust"].append(_claim_robust(results))
    measured["larger_tau"].append(_claim_larger_tau(results))
    measured["center"].append(_claim_center(results))
  for results in (fig3, *replications):
    if results is not None:
      measured["workers"].append(_claim_workers(results))
  return [c for key in _CLAIM_KEYS for c in measured[key] if c is not None]


def _finish(res, key, claim, measurement, parts, unit="pp", bound=ERROR_BOUND, context=()):
  """A claim's record; its verdict combines its parts' (``combine_verdicts``);
  None for a claim without parts (the experiment has no arms for it)."""
  if not parts:
    return None
  by = {
      c: {v: sum(p["verdict"] == v for p in parts if p["comparator"] == c) for v in stats.VERDICTS}
      for c in COMPARATORS
  }
  return dict(
      key=key,
      claim=claim,
      measurement=measurement,
      parts=parts,
      n=len(res["protocol"]["report_seeds"]),
      verdict=stats.combine_verdicts([p["verdict"] for p in parts]),
      by_comparator=by,
      verdict_by_comparator={
          c: stats.combine_verdicts([p["verdict"] for p in parts if p["comparator"] == c])
          for c in COMPARATORS
          if any(p["comparator"] == c for p in parts)
      },
      unit=unit,
      bound=bound,
      source=res["protocol"]["name"],
      experiment=experiment_label(res),
      context=list(context),
  )


def _label(name: str, arm: dict) -> str:
  """An arm's name in a part, with its local optimizer where the name does not
  carry it (``"pmean_sgd [nesterov 0.99]"``), so that a momentum baseline is not
  read as the plain method."""
  c = arm["config"]
  optimizer = c.get("optimizer") or "sgd"
  if optimizer == "sgd" or optimizer in name:
    return name
  return f"{name} [{optimizer} {c.get('momentum')}]"


def _claim_fastest(res):
  target, net = CLAIMS_TARGET, CLAIMS_NETWORK
  targets = res["protocol"]["targets"]
  if not any(abs(t - target) < 1e-12 for t in targets):
    raise ValueError(
        f"the claim 'EAMSGD is fastest' is measured at test error {target}, which is not among "
        f"the protocol's targets {targets}; add it to ProtocolConfig.targets"
    )
  refs = {k: v for k, v in res["arms"].items() if "tau" not in registry.TABLE[v["algorithm"]].reads}
  eamsgd = [n for n in _paper_methods(res) if n in registry.PAPER_METHODS["EAMSGD"]]
  parts = []
  eamsgd_arms = {k: v for algo in eamsgd for k, v in _arms(res, algo).items()}
  resolutions = []
  for name, a in eamsgd_arms.items():
    tau = a["config"]["tau"]
    mine = _censored_times(a, target, net)
    entry = a["time_to_target"][str(target)]
    others = {
        k: v
        for k, v in _arms(res, tau=tau).items()
        if "tau" in registry.TABLE[v["algorithm"]].reads
        and v["algorithm"] not in registry.PAPER_METHODS["EAMSGD"]
    }
    others.update(refs)
    for other, b in others.items():
      theirs = _censored_times(b, target, net)
      # a time to target is known to one evaluation interval: widen by it
      resolution = max(_resolution(a, net), _resolution(b, net))
      resolutions.append(resolution)
      part = _part(
          f"{_label(name, a)} - {_label(other, b)}",
          mine,
          theirs,
          holds_if="negative",
          is_paired=paired(res, a, b),
          comparator=_comparator(a, b),
          bound=TIME_BOUND * (np.mean(mine) + np.mean(theirs)) / 2,
          unit="s",
          widen=resolution,
          censored=entry["n"] - entry["reached"],
      )
      parts.append(part)
  every = res["protocol"].get("eval_every_steps")
  context = (
      [
          "a time is known to one evaluation interval ("
          + (f"every {every} steps: " if every else "")
          + f"{min(resolutions):.2f} to {max(resolutions):.2f} s), which widens each interval"
      ]
      if resolutions
      else []
  )
  return _finish(
      res,
      "fastest",
      "EAMSGD reaches a given test error fastest, at every tau",
      f"modelled time to {100 * target:g}% test error on {net} (EAMSGD, "
      f"{_as_run(eamsgd)}, minus each other method at the same tau and the tau-free "
      "references, intervals widened by one evaluation interval)",
      parts,
      unit="s",
      bound=TIME_BOUND,
      context=context,
  )


def _taus_of(res, algorithm) -> list[int]:
  return sorted({a["config"]["tau"] for a in _arms(res, algorithm).values()})


def _claim_robust(res):
  parts = []
  large = [t for t in _taus_of(res, "downpour") if t >= 16]
  for tau in large:
    down = _arms(res, "downpour", tau=tau)
    for algo in _paper_methods(res):
      mine = _arms(res, algo, tau=tau)
      for dn, d_arm in down.items():
        for mn, m_arm in mine.items():
          if d_arm["config"]["num_workers"] != m_arm["config"]["num_workers"]:
            continue
          parts.append(
              _arms_part(
                  res,
                  f"{dn} - {mn} (final test error)",
                  d_arm,
                  m_arm,
                  "final_test_errors",
                  holds_if="positive",
              )
          )
  context = [
      "DOWNPOUR's final test error: "
      + ", ".join(
          f"{format_interval(stats.mean_interval(a['final_test_errors']))}% "
          f"at tau = {a['config']['tau']}"
          for a in sorted(_arms(res, "downpour").values(), key=lambda a: a["config"]["tau"])
      )
  ]
  taus = " and ".join(map(str, large))
  return _finish(
      res,
      "robust",
      "EASGD and EAMSGD are robust to large tau where DOWNPOUR breaks down",
      f"final test error, DOWNPOUR minus EASGD / EAMSGD ({_as_run(_paper_methods(res))}) "
      f"at tau = {taus}",
      parts,
      context=context,
  )


_SAME_BUT_TAU = (
    "num_workers",
    "global_batch_size",
    "num_epochs",
    "exchange_order",
    "worker_speeds",
    "staleness",
    "beta",
    "alpha",
    "delta",
)


def _claim_larger_tau(res):
  easgd = [n for n in _paper_methods(res) if n in registry.PAPER_METHODS["EASGD"]]
  parts = []
  for algo in easgd:
    groups: dict[tuple, list] = {}
    for name, a in _arms(res, algo).items():
      key = tuple(repr(a["config"].get(k)) for k in _SAME_BUT_TAU)
      groups.setdefault(key, []).append((a["config"]["tau"], name, a))
    for group in groups.values():
      for (_, small_name, small), (_, large_name, large) in itertools.combinations(
          sorted(group), 2
      ):
        parts.append(
            _arms_part(
                res,
                f"{large_name} - {small_name} (final test error)",
                large,
                small,
                "final_test_errors",
                holds_if="negative",
            )
        )
  return _finish(
      res,
      "larger_tau",
      "EASGD tends to reach a lower test error with a larger tau",
      f"final test error of EASGD ({_as_run(easgd)}) at each larger tau minus at each "
      f"smaller one, tau in {{{', '.join(map(str, _taus_of(res, easgd[0]) if easgd else []))}}}",
      parts,
  )


SAMPLES_TOLERANCE = 0.05
"""Two arms of the "more workers" claim process equal samples when their samples
differ by at most this fraction of the larger-p arm's: whole epochs of a training
set that does not divide into global batches give no exact match (Figure 3's
p = 16 at 33 epochs of 13 steps x 512 examples, 219,648 samples, against p = 4
at 32 epochs of 54 x 128, 221,184)."""
_SAME_BUT_WORKERS = ("tau", "exchange_order", "staleness", "delta", "optimizer", "momentum")
"""The config fields two arms of the "more workers" claim agree on (the rest:
num_workers, global_batch_size, num_epochs and what p resolves, e.g. alpha)."""


def _samples(arm: dict) -> int | None:
  """Training examples one run of the arm processed, all workers: its recorded
  ``samples``, else ``num_steps`` x ``global_batch_size``; None where neither."""
  if arm.get("samples") is not None:
    return int(arm["samples"])
  if arm.get("num_steps") is None:
    return None
  return int(arm["num_steps"]) * int(arm["config"]["global_batch_size"])


def _equal_samples(a: dict, b: dict) -> bool:
  """Whether two arms' samples agree within :data:`SAMPLES_TOLERANCE` of ``b``'s."""
  sa, sb = _samples(a), _samples(b)
  return sa is not None and sb is not None and abs(sa - sb) <= SAMPLES_TOLERANCE * sb


def _steps_gap(a: dict, b: dict) -> int:
  """How many local steps per worker (``num_steps``) two arms differ by; 0 where
  either does not record them."""
  sa, sb = a.get("num_steps"), b.get("num_steps")
  return 0 if sa is None or sb is None else abs(int(sa) - int(sb))


def _claim_workers(res):
  """Claim 4: at the smallest p, the arm of the same local steps (the nearest
  ``num_steps``; ties, and results without it: the fewest samples) minus each
  larger p's arm; and, where the results hold one, the smallest p's arm of equal
  samples (:func:`_equal_samples`, not the same arm) minus that arm, labelled
  "equal samples": more workers at equal samples rather than more workers and
  more samples. Arms compared agree on :data:`_SAME_BUT_WORKERS`."""
  key, what = selected_error(res)
  short = "test error at best val" if key == "test_errors_at_best_val" else "final test error"
  parts = []
  ps, bases, controlled, sizes = set(), set(), set(), []
  for algo in _paper_methods(res):
    arms = _arms(res, algo)
    smallest = min((a["config"]["num_workers"] for a in arms.values()), default=None)
    small = {k: a for k, a in arms.items() if a["config"]["num_workers"] == smallest}
    larger = [(k, a) for k, a in arms.items() if a["config"]["num_workers"] != smallest]
    for name, a in sorted(larger, key=lambda x: x[1]["config"]["num_workers"]):
      same = {
          k: s
          for k, s in small.items()
          if all(s["config"].get(f) == a["config"].get(f) for f in _SAME_BUT_WORKERS)
      }
      if not same:
        continue
      base_name = min(same, key=lambda k: (_steps_gap(same[k], a), _samples(same[k]) or 0))
      base = same[base_name]
      bases.add(smallest)
      ps.add(a["config"]["num_workers"])
      parts.append(
          _arms_part(
              res,
              f"{base_name} - {name} ({short})",
              base,
              a,
              key,
              holds_if="positive",
          )
      )
      controls = [k for k in same if k != base_name and _equal_samples(same[k], a)]
      if not controls:
        continue
      control_name = min(controls, key=lambda k: abs(_samples(same[k]) - _samples(a)))
      control = same[control_name]
      controlled.add(a["config"]["num_workers"])
      sizes.append(f"{control_name} {_samples(control):,} against {name} {_samples(a):,}")
      parts.append(
          _arms_part(
              res,
              f"{control_name} - {name} ({short}, equal samples)",
              control,
              a,
              key,
              holds_if="positive",
          )
      )
  at = lambda values: " and ".join(map(str, sorted(values)))
  measurement = (
      f"center {what} at p = {at(bases)} minus at p = {at(ps)} (the values run), same local steps"
  )
  context = []
  if controlled:
    measurement += (
        f" (more workers and more samples); in the parts marked 'equal samples', at p = "
        f"{at(bases)} run for the samples of p = {at(controlled)} (within "
        f"{SAMPLES_TOLERANCE:.0%}) minus at that p: more workers at equal samples"
    )
    context.append("samples per run of the equal-samples parts: " + "; ".join(sizes))
  return _finish(
      res,
      "workers",
      "More workers help EASGD and EAMSGD (lower test error with larger p)",
      f"{measurement} ({_as_run(_paper_methods(res))})",
      parts,
      context=context,
  )


def _claim_center(res):
  parts = []
  for algo in _paper_methods(res):
    for name, a in _arms(res, algo).items():
      parts.append(
          _part(
              f"{name}: center - mean worker (final test error, paired)",
              a["final_test_errors"],
              a["final_worker_test_errors"],
              holds_if="negative",
              is_paired=True,
              comparator=_comparator(a),
              bound=ERROR_BOUND,
          )
      )
  return _finish(
      res,
      "center",
      "The center beats the workers",
      "final test error of the center minus the mean of the workers', per "
      f"seed (paired), EASGD and EAMSGD ({_as_run(_paper_methods(res))}) at every tau",
      parts,
  )


def _amount(value: float, unit: str) -> str:
  """``"1 pp"`` (a fraction of error) or ``"0.03 s"``."""
  return f"{100 * value:.3g} pp" if unit == "pp" else f"{value:.2f} s"


def _bound_text(c: dict) -> str:
  if c["unit"] == "s":
    return f"{100 * c['bound']:g}% of the time"
  return f"{100 * c['bound']:g} pp"


def _counts(counts: dict) -> str:
  return (
      f"{counts['holds']} hold, {counts['does not hold']} do not hold, "
      f"{counts['inconclusive']} inconclusive"
  )


def comparator_summary(c: dict) -> str:
  """``"against the paper's comparators: 13 hold, 0 do not hold, 22 inconclusive
  (inconclusive); against methods the paper did not run: ..."``."""
  out = []
  for group, counts in c["by_comparator"].items():
    if sum(counts.values()):
      out.append(
          f"against {_COMPARATOR_TEXT[group]}: {_counts(counts)} "
          f"({c['verdict_by_comparator'][group]})"
      )
  return "; ".join(out)


def _part_line(p: dict) -> str:
  """``what: text (verdict[; equivalence][; seeds])``."""
  return f"{p['what']}: {p['text']} ({p['verdict']}{_inconclusive_note(p)})"


def _inconclusive_note(p: dict) -> str:
  if p["verdict"] != "inconclusive":
    return ""
  bits = []
  if p["limited_by"] == "evaluation grid":
    bits.append("resolved by the seeds, not by the evaluation grid")
  eq = p["equivalence"]
  if eq is None:
    why = (
        "censored seeds"
        if p["limited_by"] == "censored seeds"
        else "one evaluation interval exceeds the bound"
    )
    bits.append(f"no equivalence test: {why}")
  else:
    word = "equivalent" if eq["equivalent"] else "not shown equivalent"
    bits.append(f"{word} within {_amount(eq['bound'], p['unit'])}")
  if p["seeds_for_power"]:
    n = p["seeds_for_power"]
    bits.append(f"{'more than 1000' if n < 0 else n} seeds for {POWER:.0%} power")
  return "; " + "; ".join(bits)


def _resolves(c: dict) -> str:
  scale = _scale(c["unit"])
  hw = [scale * p["interval"]["resolvable"] for p in c["parts"]]
  return (
      f"{min(hw):.2f} {c['unit']}"
      if min(hw) == max(hw)
      else f"{min(hw):.2f} to {max(hw):.2f} {c['unit']}"
  )


def _no_effect(c: dict) -> str:
  """What the inconclusive parts say: equivalence, the grid, the seeds power needs."""
  open_parts = [p for p in c["parts"] if p["verdict"] == "inconclusive"]
  if not open_parts:
    return "no part inconclusive"
  k = len(open_parts)
  tested = [p for p in open_parts if p["equivalence"] is not None]
  eq = sum(p["equivalence"]["equivalent"] for p in tested)
  grid = sum(p["limited_by"] == "evaluation grid" for p in open_parts)
  out = ["the inconclusive part" if k == 1 else f"of the {k} inconclusive parts"]
  verb = lambda m: ("is" if m == 1 else "are") if k > 1 else "is"
  if tested:
    if k == 1:
      out.append(f"{'' if eq else 'not '}equivalent within {_bound_text(c)} (TOST)")
    else:
      out.append(f"{eq} {verb(eq)} equivalent within {_bound_text(c)} (TOST)")
  if len(tested) < k:
    m = k - len(tested)
    out.append(
        f"{'' if k == 1 else f'{m} '}cannot be shown equivalent at any number of seeds "
        f"(one evaluation interval exceeds {_bound_text(c)}, or censored seeds)"
    )
  if grid:
    out.append(
        f"{'' if k == 1 else f'{grid} {verb(grid)} '}resolved by the seeds but not by the "
        "evaluation grid"
    )
  seeds = [p["seeds_for_power"] for p in open_parts if p["seeds_for_power"]]
  if seeds:
    worst = "more than 1000" if min(seeds) < 0 else str(max(seeds))
    out.append(
        f"resolving {_bound_text(c)} with {POWER:.0%} power at the realised spread needs "
        f"up to {worst} seeds per arm (here {c['n']})"
    )
  return out[0] + ": " + "; ".join(out[1:])


def claim_sentence(c: dict, max_parts: int = 6) -> str:
  """One claim of :func:`claims` as Markdown prose: verdict, the split by
  comparator, the parts (every one when at most ``max_parts``, else every one
  that does not hold), what it resolves, and what its inconclusive parts say
  (equivalence within the bound, the seeds :data:`POWER` needs)."""
  parts = c["parts"]
  shown = (
      parts if len(parts) <= max_parts else [p for p in parts if p["verdict"] == "does not hold"]
  )
  listing = "; ".join(_part_line(p) for p in shown)
  if len(parts) > max_parts:
    listing = ("Not holding: " + listing) if shown else "No part does not hold"
  else:
    listing = "Parts: " + listing
  context = "".join(f" {s[0].upper()}{s[1:]}." for s in c["context"])
  return (
      f"**{c['claim']}** ({c['experiment']}, `{c['source']}`, {c['n']} seeds per arm): "
      f"**{c['verdict']}**; {comparator_summary(c)}. {listing}.{context} "
      f"Each part resolves {_resolves(c)}; {_no_effect(c)}."
  )


def claims_markdown(items: Sequence[dict], detail: bool = True, max_parts: int = 6) -> str:
  """The claims as Markdown.

  Args:
    items: :func:`claims`' output.
    detail: every part of every claim, one table per claim with its
      comparator, interval, pairing, equivalence and the seeds :data:`POWER`
      needs; False: the guide's compact table, one row per claim and
      experiment with the counts per verdict split by comparator and every
      part that does not hold (every part when at most ``max_parts``).
  """
  if not detail:
    lines = [
        "| claim (paper, Section 5) | experiment | parts by comparator (verdict) | "
        "parts (all when 6 or fewer, else every one that does not hold) | resolves (95% half-width) | "
        "n | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in items:
      parts = c["parts"]
      shown = (
          parts
          if len(parts) <= max_parts
          else [p for p in parts if p["verdict"] == "does not hold"]
      )
      text = "<br>".join(_part_line(p) for p in shown) or "none does not hold"
      split = comparator_summary(c).replace("; ", ";<br>")
      lines.append(
          f"| {c['claim']} | {c['experiment']} (`{c['source']}`) | {split} | {text} | "
          f"{_resolves(c)} | {c['n']} seeds per arm | **{c['verdict']}** |"
      )
    return "\n".join(lines) + "\n"
  out = []
  for i, c in enumerate(items, 1):
    out += [
        f"## {i}. {c['claim']}: {c['experiment']} (`{c['source']}`)",
        "",
        f"Measured: {c['measurement']}. Verdict: **{c['verdict']}**; {comparator_summary(c)}.",
        "",
        f"Each part resolves {_resolves(c)} (the half-width of its 95% interval); "
        f"{_no_effect(c)}." + "".join(f" {s[0].upper()}{s[1:]}." for s in c["context"]),
        "",
        "| part | against | difference, 95% interval | paired | "
        f"equivalent within {_bound_text(c)} (90% interval) | seeds for {POWER:.0%} power | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    scale = _scale(c["unit"])
    for p in c["parts"]:
      eq = p["equivalence"]
      if eq is None:
        eq_text = "-"
      else:
        eq_text = (
            f"{'yes' if eq['equivalent'] else 'no'}: [{scale * eq['low']:+.2f}, "
            f"{scale * eq['high']:+.2f}] within ±{_amount(eq['bound'], c['unit'])}"
        )
      n = p["seeds_for_power"]
      n_text = "-" if not n else "more than 1000" if n < 0 else str(n)
      verdict = p["verdict"] + (f" ({p['limited_by']})" if p["limited_by"] else "")
      out.append(
          f"| {p['what']} | {_COMPARATOR_TEXT[p['comparator']]} | {p['text']} | "
          f"{'yes' if p['interval']['paired'] else 'no (Welch)'} | {eq_text} | {n_text} | {verdict} |"
      )
    out.append("")
  return "\n".join(out)


def _metric_values(results, name, metric):
  return results["arms"][name][metric]


def ranking(
    results: dict[str, Any],
    names: Sequence[str],
    metric: str = "final_test_errors",
    label: str = "final test error",
) -> str:
  """Which of ``names`` ends lowest on ``metric``, ranked only where an interval resolves it.

  The arm with the lowest mean is compared with every other (paired where
  :func:`paired`, else Welch's 95% interval): an arm whose difference from it
  excludes 0 is resolved above it; one whose interval contains 0 is "not
  resolved" from it, and the sentence names them together.

  Args:
    results: a protocol's results.json.
    names: at least two of its arms.
    metric: a per-seed list of the arms (fractions of error), e.g.
      ``final_test_errors`` or ``test_errors_at_best_val``.
    label: the metric's name in the sentence.

  Returns:
    A Markdown sentence without a final period, e.g. "lowest final test error
    not resolved among diloco tau=4 (13.30 ± 0.27%) and async_eamsgd tau=4
    (+0.13 pp [-0.13, +0.39]); every other arm resolved above (nearest: ...)".

  Raises:
    ValueError: fewer than two arms.
  """
  if len(names) < 2:
    raise ValueError(f"names must hold at least two arms to rank, got {list(names)}")
  arms = results["arms"]
  order = sorted(names, key=lambda n: float(np.mean(_metric_values(results, n, metric))))
  best = order[0]
  summary = {
      "final_test_errors": "final_test_error",
      "test_errors_at_best_val": "test_error_at_best_val",
  }
  mean = stats.mean_interval(_metric_values(results, best, metric))
  best_text = f"{best} ({format_interval(arms[best].get(summary.get(metric), mean))}%)"
  tied, above = [], []
  for other in order[1:]:
    d = stats.difference_interval(
        _metric_values(results, other, metric),
        _metric_values(results, best, metric),
        paired=paired(results, arms[other], arms[best]),
    )
    (above if d["low"] > 0 else tied).append(f"{other} ({_fmt_diff(d).split(', resolves')[0]})")
  if not tied:
    return f"{best_text} ends lowest in {label}, every other arm resolved above it (nearest: {above[0]})"
  rest = (
      f"; every other arm resolved above (nearest: {above[0]})"
      if above
      else "; no arm resolved above"
  )
  return (
      f"lowest {label} not resolved among {best_text} and {', '.join(tied)} "
      f"(each interval contains 0){rest}"
  )


def differences(
    results: dict[str, Any], reference: str, metric: str = "final_test_errors"
) -> dict[str, dict]:
  """Each arm's ``metric`` minus the reference arm's: the 95% interval over
  the report seeds (``easgd.protocol.stats.difference_interval``), paired by
  seed where the two arms pair (:func:`paired`), else Welch's; with the TOST
  equivalence at :data:`ERROR_BOUND` (``equivalence``)."""
  ref_arm = results["arms"][reference]
  out = {}
  for name, a in results["arms"].items():
    if name == reference:
      continue
    is_paired = paired(results, a, ref_arm)
    d = stats.difference_interval(a[metric], ref_arm[metric], paired=is_paired)
    d["equivalence"] = stats.equivalence(a[metric], ref_arm[metric], ERROR_BOUND, paired=is_paired)
    out[name] = d
  return out


def failed_seeds(arm: dict) -> str:
  """``"d + c/n"``: an arm's report seeds flagged diverged (d) and collapsed (c,
  ``easgd.run.compare.collapsed``; results written before the protocol recorded
  collapse have none: ``"d/n"``) of its n report seeds."""
  n = len(arm["final_test_errors"])
  d = sum(arm.get("diverged", []))
  if "collapsed" not in arm:
    return f"{d}/{n}"
  return f"{d} + {sum(arm['collapsed'])}/{n}"


def differences_markdown(results: dict[str, Any], reference: str) -> str:
  """The seeds question's table: every arm's final test error and its
  difference to ``reference`` (percentage points, 95% interval: paired by seed
  where the arms pair, :func:`paired`, else Welch's, marked), its reading
  ("worse", "better", or no difference resolved, then whether it is
  equivalent within :data:`ERROR_BOUND` by TOST) and the seeds flagged failed
  (:func:`failed_seeds`: diverged, and collapsed where the results record it).

  Raises:
    ProtocolError: results of a task without a per-example ``"correct"``.
  """
  require_error(results, "the differences table")
  diffs = differences(results, reference)
  ref = results["arms"][reference]
  bound = f"{100 * ERROR_BOUND:g} pp"
  lines = [
      f"| arm | rate (resolved) | final test err % | minus '{reference}' (pp, 95% CI) "
      f"| paired | verdict | failed seeds (diverged + collapsed) |",
      "|---|---|---|---|---|---|---|",
      f"| {reference} | {ref['resolved_learning_rate']:.3g} | "
      f"{format_interval(ref['final_test_error'])} | - | - | - | "
      f"{failed_seeds(ref)} |",
  ]
  for name, d in diffs.items():
    a = results["arms"][name]
    v = stats.verdict(d, holds_if="positive")
    word = {"holds": "worse", "does not hold": "better"}.get(v)
    if word is None:
      eq = d["equivalence"]["equivalent"]
      word = f"not resolved; {'equivalent' if eq else 'not shown equivalent'} within {bound}"
    lines.append(
        f"| {name} | {a['resolved_learning_rate']:.3g} | "
        f"{format_interval(a['final_test_error'])} | {_fmt_diff(d)} | "
        f"{'yes' if d['paired'] else 'no (Welch)'} | {word} | "
        f"{failed_seeds(a)} |"
    )
  return "\n".join(lines) + "\n"
