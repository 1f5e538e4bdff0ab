"""The paper's Section 5 claims and the differences between arms, measured on results.json.

  :func:`claims`                each claim measured on the Figure 2 and 3 experiments'
                                results: the differences, their 95% intervals, n, a verdict.
  :func:`claims_markdown`       the claims as a Markdown table.
  :func:`differences_markdown`  every arm against a reference arm (Welch).

See docs/guides/protocol.md and docs/guides/results.md for how the verdicts read.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015, Section 5.
"""

from __future__ import annotations

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


def _paired(results, a: dict, b: dict) -> bool:
  """Whether two arms' report runs share seed i's initialisation and data
  order for every i (the same report seeds, workers and global batch: the
  batches of step t are fixed by the seed, the epoch and t), so that their
  difference is judged per seed."""
  default = results["protocol"]["report_seeds"]
  same_seeds = list(a.get("report", {}).get("seeds", default)) == list(
      b.get("report", {}).get("seeds", default)
  )
  same_order = all(
      a["config"].get(k) == b["config"].get(k) for k in ("num_workers", "global_batch_size")
  )
  return same_seeds and same_order


def _which(algorithm: str) -> str:
  """The registry's summary of an algorithm, e.g. "asynchronous EAMSGD, Algorithm 2"."""
  return registry.TABLE[algorithm].summary


def _as_run(algorithms) -> str:
  """``"as run: asynchronous EASGD, Algorithm 1; asynchronous EAMSGD, Algorithm 2"``."""
  return "as run: " + "; ".join(map(_which, algorithms)) if algorithms else "none run"


def _arms(results, algorithm=None, **config):
  out = {}
  for name, a in results["arms"].items():
    if algorithm is not None and a["algorithm"] != algorithm:
      continue
    if all(a["config"].get(k) == v for k, v in config.items()):
      out[name] = a
  return out


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


def _fmt_diff(d: dict, scale: float = 100.0, unit: str = " pp") -> str:
  """``+d unit [low, high], resolves r``: the difference, its interval, and the
  smallest difference the interval resolves from 0 (its half-width: a
  measured difference smaller in size is inconclusive)."""
  resolvable = (d["high"] - d["low"]) / 2
  return (
      f"{scale * d['difference']:+.2f}{unit} [{scale * d['low']:+.2f}, "
      f"{scale * d['high']:+.2f}], resolves {scale * resolvable:.2f}{unit}"
  )


def claims(fig2: dict | None, fig3: dict | None) -> list[dict[str, Any]]:
  """The paper's Section 5 claims measured on the Figure 2 and 3 experiments.

  Each claim is reduced to differences between arms over the report seeds,
  each with its 95% interval (``easgd.protocol.stats.difference_interval``):
  paired, the interval of the per-seed differences, where the two arms share
  their report seeds (the protocol's arms do: seed i, the same initialisation
  and data order) and always for the center against its own workers, else
  Welch's. EASGD and EAMSGD are the asynchronous ``async_easgd`` and
  ``async_eamsgd`` (Algorithms 1 and 2, as the paper ran them) where the
  results have such arms (every exchange order among them), else the
  synchronous ``easgd`` and ``eamsgd``. The verdict of each difference is "holds" when its
  interval lies wholly on the claimed side of 0, "does not hold" when wholly
  on the other side, else "inconclusive"; a claim holds when all its parts
  do, does not hold when any part does not (``combine_verdicts``).

  1. EAMSGD is fastest to a given test error (:data:`CLAIMS_TARGET`, modelled
     time on :data:`CLAIMS_NETWORK`): at each tau, EAMSGD's time minus each
     other arm's at that tau and of the tau-free references (a seed that never
     reaches the target counts the run's whole time, a lower bound: such a
     seed of EAMSGD's can make a part "does not hold" or "inconclusive", never
     "holds"); a time is known to one evaluation interval, so each interval is
     widened by the longer of the two arms' modelled time between evaluations.
  2. EASGD and EAMSGD are robust to large tau where DOWNPOUR breaks down: at
     tau = 16 and 64, DOWNPOUR's final test error minus EASGD's and EAMSGD's.
  3. More workers help EASGD (and EAMSGD): at the same local steps, the test
     error at p = 4 minus that at p = 8 and p = 16 (Figure 3 setting): the
     test error at the evaluation with the lowest validation error, or the
     final one for results without validation curves (:func:`selected_error`),
     never the lowest test error (chosen on the test set).
  4. The center beats the workers: EASGD's and EAMSGD's final center test
     error minus the mean of their workers', per seed (paired), every tau.

  Returns:
    One dict per claim: claim, measurement (text), parts (each with its
    interval and verdict), n (seeds per arm), verdict, source.

  Raises:
    ValueError: ``fig2`` has no time to :data:`CLAIMS_TARGET` (not among its
      targets).
    ProtocolError: results of a task without a per-example ``"correct"`` (no
      test error to speak of).
  """
  for results in (fig2, fig3):
    if results is not None:
      require_error(results, "the claims table")
  out = []
  if fig2 is not None:
    targets = fig2["protocol"]["targets"]
    if not any(abs(t - CLAIMS_TARGET) < 1e-12 for t in targets):
      raise ValueError(
          f"the claim 'EAMSGD is fastest' is measured at test error "
          f"{CLAIMS_TARGET}, which is not among the protocol's targets "
          f"{targets}; add it to ProtocolConfig.targets"
      )
    for a in fig2["arms"].values():
      a["_networks"] = fig2["protocol"]["networks"]
    out.append(_claim_fastest(fig2))
    out.append(_claim_tau(fig2))
  if fig3 is not None:
    out.append(_claim_workers(fig3))
  if fig2 is not None:
    out.append(_claim_center(fig2))
  return out


def _finish(res, claim, measurement, parts):
  """A claim's record; its verdict combines its parts' (``combine_verdicts``)."""
  verdict = stats.combine_verdicts([p["verdict"] for p in parts]) if parts else "inconclusive"
  n = len(res["protocol"]["report_seeds"])
  return dict(
      claim=claim,
      measurement=measurement,
      parts=parts,
      n=n,
      verdict=verdict,
      source=res["protocol"]["name"],
  )


def _part(what: str, d: dict, holds_if: str) -> dict:
  """One difference of a claim: its interval, text and verdict."""
  return dict(what=what, interval=d, text=_fmt_diff(d), verdict=stats.verdict(d, holds_if=holds_if))


def _claim_fastest(res):
  target, net = CLAIMS_TARGET, CLAIMS_NETWORK
  refs = {k: v for k, v in res["arms"].items() if "tau" not in registry.TABLE[v["algorithm"]].reads}
  eamsgd = [n for n in _paper_methods(res) if n in registry.PAPER_METHODS["EAMSGD"]]
  parts = []
  eamsgd_arms = {k: v for algo in eamsgd for k, v in _arms(res, algo).items()}
  for name, a in eamsgd_arms.items():
    tau = a["config"]["tau"]
    mine = _censored_times(a, target, net)
    missed = a["time_to_target"][str(target)]["n"] - a["time_to_target"][str(target)]["reached"]
    others = {
        k: v
        for k, v in _arms(res, tau=tau).items()
        if "tau" in registry.TABLE[v["algorithm"]].reads
        and v["algorithm"] not in registry.PAPER_METHODS["EAMSGD"]
    }
    others.update(refs)
    for other, b in others.items():
      d = stats.difference_interval(
          mine, _censored_times(b, target, net), paired=_paired(res, a, b)
      )
      # a time to target is known to one evaluation interval: widen by it
      resolution = max(_resolution(a, net), _resolution(b, net))
      d = dict(d, low=d["low"] - resolution, high=d["high"] + resolution, resolution=resolution)
      verdict = stats.verdict(d, holds_if="negative")
      text = _fmt_diff(d, 1.0, " s")
      if missed:
        # EAMSGD's censored times are lower bounds of its times: they can show
        # it slower ("does not hold"), never faster
        text += f"; EAMSGD missed the target on {missed} seed(s)"
        if verdict == "holds":
          verdict = "inconclusive"
      parts.append(dict(what=f"{name} - {other}", interval=d, text=text, verdict=verdict))
  return _finish(
      res,
      "EAMSGD reaches a given test error fastest, at every tau",
      f"modelled time to {100 * target:g}% test error on {net} (EAMSGD, "
      f"{_as_run(eamsgd)}, minus "
      f"each other method at the same tau and the tau-free references, "
      f"intervals widened by one evaluation interval; "
      f"{sum(p['verdict'] == 'holds' for p in parts)}/{len(parts)} "
      f"comparisons hold)",
      parts,
  )


def _claim_tau(res):
  parts = []
  for tau in (16, 64):
    down = _arms(res, "downpour", tau=tau)
    for algo in _paper_methods(res):
      mine = _arms(res, algo, tau=tau)
      if not down or not mine:
        continue
      for dn, d_arm in down.items():
        for mn, m_arm in mine.items():
          if d_arm["config"]["num_workers"] != m_arm["config"]["num_workers"]:
            continue
          d = stats.difference_interval(
              d_arm["final_test_errors"],
              m_arm["final_test_errors"],
              paired=_paired(res, d_arm, m_arm),
          )
          parts.append(_part(f"{dn} - {mn} (final test error)", d, "positive"))
  context = []
  for algo in _paper_methods(res) + ["downpour"]:
    lo, hi = _arms(res, algo, tau=1), _arms(res, algo, tau=64)
    if lo and hi:
      a_hi, a_lo = next(iter(hi.values())), next(iter(lo.values()))
      d = stats.difference_interval(
          a_hi["final_test_errors"], a_lo["final_test_errors"], paired=_paired(res, a_hi, a_lo)
      )
      context.append(f"{algo} tau=64 - tau=1: {_fmt_diff(d)}")
  return _finish(
      res,
      "EASGD and EAMSGD are robust to large tau where DOWNPOUR breaks down",
      f"final test error, DOWNPOUR minus EASGD / EAMSGD ({_as_run(_paper_methods(res))}) "
      "at tau = 16 and 64 "
      f"(context: {'; '.join(context)})",
      parts,
  )


def _claim_workers(res):
  key, what = selected_error(res)
  short = "test error at best val" if key == "test_errors_at_best_val" else "final test error"
  parts = []
  for algo in _paper_methods(res):
    arms = {a["config"]["num_workers"]: (k, a) for k, a in _arms(res, algo).items()}
    if 4 not in arms:
      continue
    base_name, base = arms[4]
    for p in sorted(arms):
      if p == 4:
        continue
      name, a = arms[p]
      d = stats.difference_interval(base[key], a[key], paired=_paired(res, base, a))
      parts.append(_part(f"{base_name} - {name} ({short})", d, "positive"))
  return _finish(
      res,
      "More workers help EASGD and EAMSGD (lower test error with larger p)",
      f"center {what} at p = 4 minus at p = 8 and 16, same local steps "
      f"({_as_run(_paper_methods(res))})",
      parts,
  )


def _claim_center(res):
  parts = []
  for algo in _paper_methods(res):
    for name, a in _arms(res, algo).items():
      diffs = np.asarray(a["final_test_errors"]) - np.asarray(a["final_worker_test_errors"])
      m = stats.mean_interval(diffs)
      d = dict(difference=m["mean"], low=m["low"], high=m["high"])
      parts.append(_part(f"{name}: center - mean worker (final test error, paired)", d, "negative"))
  return _finish(
      res,
      "The center beats the workers",
      "final test error of the center minus the mean of the workers', per "
      f"seed (paired), EASGD and EAMSGD ({_as_run(_paper_methods(res))}) at every tau",
      parts,
  )


def claims_markdown(items: Sequence[dict], detail: bool = True, max_parts: int = 6) -> str:
  """The claims table: claim, measurement, differences with intervals, n, verdict.

  Args:
    items: :func:`claims`' output.
    detail: every part of every claim; False: a claim with more than
      ``max_parts`` parts shows its counts and only the parts that do not hold.
  """
  lines = [
      "| claim (paper, Section 5) | our measurement | differences, 95% interval | n | "
      "verdict at this scale |",
      "|---|---|---|---|---|",
  ]
  for c in items:
    parts = c["parts"]
    shown = parts
    prefix = ""
    if not detail and len(parts) > max_parts:
      counts = {v: sum(p["verdict"] == v for p in parts) for v in stats.VERDICTS}
      prefix = (
          f"{counts['holds']} of {len(parts)} hold, {counts['does not hold']} do "
          f"not, {counts['inconclusive']} inconclusive; not holding:<br>"
      )
      shown = [p for p in parts if p["verdict"] != "holds"][:max_parts]
    text = prefix + "<br>".join(f"{p['what']}: {p['text']} ({p['verdict']})" for p in shown)
    lines.append(
        f"| {c['claim']} | {c['measurement']} ({c['source']}) | {text} | "
        f"{c['n']} seeds per arm | **{c['verdict']}** |"
    )
  return "\n".join(lines) + "\n"


def differences(
    results: dict[str, Any], reference: str, metric: str = "final_test_errors"
) -> dict[str, dict]:
  """Each arm's ``metric`` minus the reference arm's: Welch's 95% interval over
  the report seeds (``easgd.protocol.stats.difference_interval``)."""
  ref = results["arms"][reference][metric]
  return {
      name: stats.difference_interval(a[metric], ref)
      for name, a in results["arms"].items()
      if name != reference
  }


def differences_markdown(results: dict[str, Any], reference: str) -> str:
  """The seeds question's table: every arm's final test error and its
  difference to ``reference`` (percentage points, Welch's 95% interval).

  Raises:
    ProtocolError: results of a task without a per-example ``"correct"``.
  """
  require_error(results, "the differences table")
  diffs = differences(results, reference)
  ref = results["arms"][reference]
  lines = [
      f"| arm | rate (resolved) | final test err % | minus '{reference}' (pp, 95% CI) "
      f"| verdict |",
      "|---|---|---|---|---|",
      f"| {reference} | {ref['resolved_learning_rate']:.3g} | "
      f"{format_interval(ref['final_test_error'])} | - | - |",
  ]
  for name, d in diffs.items():
    a = results["arms"][name]
    v = stats.verdict(d, holds_if="positive")
    word = {
        "holds": "worse",
        "does not hold": "better",
        "inconclusive": "no difference " "resolved",
    }[v]
    lines.append(
        f"| {name} | {a['resolved_learning_rate']:.3g} | "
        f"{format_interval(a['final_test_error'])} | {_fmt_diff(d)} | {word} |"
    )
  return "\n".join(lines) + "\n"
