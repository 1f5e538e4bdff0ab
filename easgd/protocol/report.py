"""The protocol's report: results.md, the learning-curve figure, and the claims table.

Everything here is computed from a protocol's ``results.json``
(``easgd.protocol.runs.run_protocol``), never typed by hand:

  :func:`results_markdown`   the comparison table of one experiment (mean and
                             95% interval over the report seeds), the chosen
                             rates, time to target, the programs it ran.
  :func:`plot_curves`        center test error (else the chosen metric) against
                             local steps, mean over seeds with the 95% band, one
                             panel per setting.
  :func:`claims`             each claim of the paper's Section 5 measured on the
                             experiments' results: the measurement, its interval,
                             n, and a verdict (holds / does not hold /
                             inconclusive at this scale).
  :func:`claims_markdown`    the claims as a Markdown table.
  :func:`write_report`       every file of a protocol, its one writer (``easgd
                             protocol`` and ``run_protocol(config, workdir)``):
                             the TensorBoard runs, curves.png, results.md,
                             results.json.
  :func:`write_events`       the curves as TensorBoard runs (report/, tune/).
  :func:`selection`          the metric the rates were chosen on and the test
                             metrics reported (the error of a classifier; else
                             the chosen metric and the loss).
  :func:`compact_markdown`   the short table of one experiment (docs/guides/results.md).
  :func:`differences_markdown`  every arm against a reference arm (Welch).

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015, Section 5.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from easgd.protocol import stats as protocol_stats
from easgd.methods import registry
from easgd._util.files import write_text_atomic
from easgd.protocol.config import (
    RESULTS_JSON,
    ProtocolError,
    grid_note,
    lr_grid_edges,
    network_from_dict,
    reported_metrics,
)
from easgd.protocol.stats import format_interval
from easgd.run import tensorboard

RESULTS_MD = "results.md"
CURVES_PNG = "curves.png"
GROUP_BY = ("tau", "num_workers", "")
"""The panels of curves.png (:func:`plot_curves`): by tau, by p, or one panel."""
CLAIMS_TARGET = 0.3
"""The test error of the claim "EAMSGD is fastest to a given test error"."""
CLAIMS_NETWORK = "1GbE"
"""The network of that claim's modelled wall-clock time."""


def load_results(path) -> dict[str, Any]:
  """A protocol's results.json (a directory holding it, or the file).

  Raises:
    ProtocolError: the file is missing, unreadable, not JSON, or not a
      protocol's results (no "protocol" and "arms").
  """
  path = Path(path)
  if path.is_dir():
    path = path / RESULTS_JSON
  try:
    results = json.loads(path.read_text())
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise ProtocolError(
        f"'{path}' is not a readable protocol results file: " f"{type(e).__name__}: {e}"
    ) from None
  if not isinstance(results, dict) or not {"protocol", "arms"} <= set(results):
    raise ProtocolError(
        f"'{path}' is not a protocol's results (no 'protocol' and "
        "'arms'); write it with easgd protocol"
    )
  return results


def selection(results: dict[str, Any]) -> tuple[str, str, list[str]]:
  """(select_metric, select_better, the reported test metrics) of a protocol's
  results (``easgd.protocol.config.reported_metrics``); results that do not
  record the metric chose on the error, lower being better."""
  proto = results["protocol"]
  metric, better = proto.get("select_metric") or "error", proto.get("select_better") or "lower"
  classifier = all("final_test_errors" in a for a in results["arms"].values())
  return metric, better, reported_metrics(metric, classifier)


def _require_error(results: dict[str, Any], what: str) -> None:
  """Refuses results without test errors (a task without a per-example "correct").

  Raises:
    ProtocolError: naming the experiment and ``what`` needs the error.
  """
  if "error" not in selection(results)[2]:
    raise ProtocolError(
        f"{what} speaks of test error; the results of {results['protocol']['name']!r} are of "
        "a task without a per-example 'correct' (no test error)"
    )


def grid_flag(arm: dict, metric: str = "error") -> str | None:
  """The arm's grid flag, recomputed from its tuning results
  (``easgd.protocol.config.lr_grid_edges``: "low", "high", "untunable: ...",
  or None), so results written before a flag existed show it too.
  ``metric``: the protocol's ``select_metric``."""
  if arm["lr_from"]:
    return arm.get("grid_edge")  # "untunable: from ..." when its source was
  return lr_grid_edges(arm["learning_rates"], arm["chosen_learning_rate"], arm["tuning"], metric)


def selected_error(results: dict[str, Any]) -> tuple[str, str]:
  """The per-seed test error the claims compare, and its description.

  Results whose report runs recorded validation curves give the test error
  at the evaluation with the lowest validation error
  (``test_errors_at_best_val``); older results, without them, give the
  final test error (``final_test_errors``). Neither is chosen on the test set.

  Returns:
    (the arms' key, a description for the claims table).
  """
  if all("test_errors_at_best_val" in a for a in results["arms"].values()):
    return (
        "test_errors_at_best_val",
        "test error at the evaluation with the lowest " "validation error",
    )
  return (
      "final_test_errors",
      "final test error (the report runs recorded no " "validation curve, so nothing is selected)",
  )


def _has_best_val(results: dict[str, Any]) -> bool:
  q = selection(results)[2][0]
  return all(f"test_{q}_at_best_val" in a for a in results["arms"].values())


def _cell(q: str, interval: dict | None) -> str:
  """A reported metric's interval: an error in percent (2 decimals), another
  metric to 4 significant digits; "-" where none (a diverged seed's loss)."""
  if q == "error":
    return format_interval(interval)
  if interval is None or interval.get("mean") is None:
    return "-"
  return f"{interval['mean']:.4g} \u00b1 {interval['half_width']:.2g}"


def _column(q: str, what: str) -> str:
  """A column's title: "final test err %" (the error's, as ever), "final test loss"."""
  if q == "error":
    return {"final": "final test err %", "best": "test err at best val %"}[what]
  return {"final": f"final test {q}", "best": f"test {q} at best val"}[what]


def _setting(arm: dict) -> str:
  """The arm's distinguishing settings, e.g. "p=4 tau=16 K=54 lr x2 (linear)"."""
  c = arm["config"]
  reads = registry.TABLE[arm["algorithm"]].reads
  parts = [f"p={c['num_workers']}"]
  if "tau" in reads:
    parts.append(f"tau={c['tau']}")
  if c.get("sync_warmup_steps"):
    parts.append(f"K={c['sync_warmup_steps']}")
  if c.get("lr_scaling", "none") != "none":
    parts.append(f"{c['lr_scaling']} x{c['lr_scale']:.3g}")
  return " ".join(parts)


def _network_text(n: dict) -> str:
  """``"1GbE: 0.125 GB/s, 50 us"``; a two-level network with both links and its
  node size."""
  link = lambda n: "%g GB/s, %g us" % (n["bandwidth_bytes_per_s"] / 1e9, 1e6 * n["latency_s"])
  if "inside" in n:
    return (
        f"{n['name']}: {n['devices_per_node']} devices per node, inside {link(n['inside'])}, "
        f"between nodes {link(n['between'])} per device"
    )
  return f"{n['name']}: {link(n)}"


def _ttt(
    arm: dict,
    target: float,
    what: str = "steps",
    network: str | None = None,
    scale: float = 1.0,
    digits: int = 0,
) -> str:
  entry = arm["time_to_target"].get(str(target))
  if entry is None:
    return "-"
  if "summary" not in entry:
    return f"{entry['reached']}/{entry['n']} reached"
  s = entry["summary"][what]
  if network is not None:
    s = s[network]
  return format_interval(s, scale=scale, digits=digits)


def results_markdown(results: dict[str, Any]) -> str:
  """The Markdown report of one protocol experiment (results.md): per arm the
  reported test metrics (:func:`selection`) with their intervals, the chosen
  rates and their grids; a classifier's times to each target test error; the
  tuning scores and the programs."""
  proto = results["protocol"]
  metric, better, reported = selection(results)
  best_word = "lowest" if better == "lower" else "highest"
  chosen_by = (
      "Rates chosen by the mean final validation error"
      if metric == "error"
      else f"Rates chosen by the mean final validation {metric} ({better} is better)"
  )
  best_text = (
      "; the test error at the best validation error is read at the evaluation with "
      "the lowest validation error of each report run (nothing is chosen on the test "
      "set). "
      if metric == "error" and reported == ["error"]
      else f"; the test {' and '.join(reported)} at the best validation {metric} "
      f"{'is' if len(reported) == 1 else 'are'} read at "
      f"the evaluation with the {best_word} validation {metric} of each report run (nothing "
      "is chosen on the test set). "
  )
  base = proto["base"]
  lines = [f"# Protocol: {proto['name']}", "", proto["description"], ""]
  task = results.get("task")  # a task other than the built-in data sets and models
  problem = (
      f"Task: {task['name']}" + (f" ({task['factory']})" if task.get("factory") else "")
      if task
      else f"Data: {base['dataset']}, model {base['model']}"
  )
  lines += [
      f"{problem} ({results['num_params']} parameters), "
      f"{base['validation_examples']} training examples held out for validation. "
      f"{chosen_by} over tuning seeds "
      f"{proto['tune_seeds']}; reported on fresh seeds {proto['report_seeds']} "
      f"(mean \u00b1 95% Student-t half-width, n = {len(proto['report_seeds'])}). "
      f"Center evaluated every {proto['eval_every_steps']} local steps"
      + (best_text if _has_best_val(results) else ". ")
      + f"Total {results['wall_time_s']:.0f} s on {results['machine']['platform']} "
      f"({results['machine']['cpu_count']} cores, {results['machine']['note']}; "
      f"JAX {results['machine']['jax_version']}).",
      "",
  ]
  targets = proto["targets"]
  best_val = _has_best_val(results)
  worker = "error" if "error" in reported else "loss"
  header = ["arm", "setting", "epochs (steps)", "rate (grid)"]
  for q in reported:
    header += [_column(q, "final")] + ([_column(q, "best")] if best_val else [])
  header += ["workers' final err %" if worker == "error" else "workers' final test loss"]
  header += [f"steps to {100 * t:g}%" for t in targets]
  header += ["all-reduces / MB per worker"]
  lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for name, a in results["arms"].items():
    if a["lr_from"]:
      grid = f"from '{a['lr_from']}'"
    else:
      grid = (
          f"{min(a['learning_rates']):g}..{max(a['learning_rates']):g} ({len(a['learning_rates'])})"
      )
      added = a.get("grid_extended") or []
      if added:  # extended while its choice sat at an edge (easgd.protocol.runs)
        stop = {"interior": "interior", "diverged": "bracketed by a diverging rate"}
        grid += f", {len(added)} added: " + (
            stop.get(a["grid_extension"], f"stopped: {a['grid_extension']}")
        )
    rate = f"{a['resolved_learning_rate']:.4g}" + grid_note(grid_flag(a, metric))
    row = [name, _setting(a), f"{a['epochs']} ({a['num_steps']})", f"{rate}; {grid}"]
    for q in reported:
      row += [_cell(q, a[f"final_test_{q}"])]
      row += [_cell(q, a[f"test_{q}_at_best_val"])] if best_val else []
    row += [_cell(worker, a[f"final_worker_test_{worker}"])]
    row += [_ttt(a, t) for t in targets]
    row += [f"{a['all_reduces']} / {a['bytes_per_worker'] / 1e6:.1f}"]
    if any(a["diverged"]):
      row[4] += f" ({sum(a['diverged'])} diverged)"
    lines.append("| " + " | ".join(row) + " |")
  if targets:
    lines += _modelled_markdown(results)
  lines += _tuning_markdown(results)
  lines += [
      "",
      "Compiled programs (one per group of arms that differ only in the "
      "learning rate, the seed and their algorithm's array fields):",
      "",
      "| kind | algorithm | arms | configs | traced per config | wall s | compile s | "
      "why apart from the algorithm's other programs |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for p in results["programs"]:
    lines.append(
        f"| {p['kind']} | {p['algorithm']} | {', '.join(p['arms'])} | {p['configs']} "
        f"| {', '.join(p['traced_fields'])} | {p['wall_s']:.1f} | "
        f"{p['compile_s']:.1f} | {p['separate_because'] or '-'} |"
    )
  return "\n".join(lines) + "\n"


def _modelled_markdown(results: dict[str, Any]) -> list[str]:
  """results.md's lines of the modelled wall-clock time to each target (a classifier's)."""
  proto = results["protocol"]
  targets = proto["targets"]
  nets = [n["name"] for n in proto["networks"]]
  net_text = ", ".join(_network_text(n) for n in proto["networks"])
  step_text = ", ".join(
      "%.2f ms (batch %s)" % (1e3 * v, k) for k, v in results["compute_per_step_s"].items()
  )
  lines = [
      "",
      "Modelled wall-clock time to each target (seconds, mean \u00b1 95% "
      "half-width): measured compute per local step on this machine x steps + per "
      "all-reduce latency + 2(g-1)/g x bytes / bandwidth over its g devices (g = p "
      f"across workers, D within a worker of D devices) ({net_text}); compute per "
      f"step: {step_text}.",
      "",
  ]
  header = ["arm"] + [f"{100 * t:g}% on {n}" for t in targets for n in nets]
  lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for name, a in results["arms"].items():
    row = [name] + [_ttt(a, t, "modelled_s", n, digits=2) for t in targets for n in nets]
    lines.append("| " + " | ".join(row) + " |")
  return lines


def _tuning_markdown(results: dict[str, Any]) -> list[str]:
  """results.md's lines of the tuning scores per rate."""
  metric, better, _ = selection(results)
  if metric == "error":
    lines = [
        "",
        "Tuning (mean final validation error % over the tuning seeds per rate; "
        "a diverged run counts as 100%):",
        "",
    ]
    score = lambda v: f"{100 * v:.1f}"
  else:
    lines = [
        "",
        f"Tuning (mean final validation {metric} over the tuning seeds per rate, {better} is "
        "better; a diverged run counts as the worst value, shown as 'worst'):",
        "",
    ]
    score = lambda v: "worst" if v is None or not math.isfinite(v) else f"{v:.4g}"
  for name, a in results["arms"].items():
    if a["tuning"]:
      cells = ", ".join(
          f"{r['learning_rate']:g}: {score(r['score'])}"
          + (f" ({sum(r['diverged'])} div.)" if any(r["diverged"]) else "")
          for r in a["tuning"]
      )
      lines.append(f"- {name}: {cells}; chosen {a['chosen_learning_rate']:g}")
  return lines


def compact_markdown(
    results: dict[str, Any],
    target: float | None = None,
    network: str | None = None,
    arms: Sequence[str] | None = None,
) -> str:
  """A short table of one experiment (the results guide's): chosen rate (and its grid
  flag), the final center test error and, where the report runs recorded
  validation curves, the test error at the evaluation with the lowest
  validation error (mean \u00b1 95% half-width over the report seeds), steps
  and modelled seconds to ``target`` (default: the protocol's middle target)
  on ``network`` (default: the first), all-reduces and MB per worker."""
  _require_error(results, "the compact table")
  proto = results["protocol"]
  targets = proto["targets"]
  target = targets[len(targets) // 2] if target is None else target
  network = proto["networks"][0]["name"] if network is None else network
  best_val = _has_best_val(results)
  header = ["arm", "rate", "final test err %"]
  header += ["test err at best val %"] if best_val else []
  header += [
      f"steps to {100 * target:g}%",
      f"{network} s to {100 * target:g}%",
      "all-reduces / MB per worker",
  ]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for name, a in results["arms"].items():
    if arms is not None and name not in arms:
      continue
    row = [
        name,
        f"{a['resolved_learning_rate']:.3g}" + grid_note(grid_flag(a)),
        format_interval(a["final_test_error"]),
    ]
    row += [format_interval(a["test_error_at_best_val"])] if best_val else []
    row += [
        _ttt(a, target),
        _ttt(a, target, "modelled_s", network, digits=2),
        f"{a['all_reduces']} / {a['bytes_per_worker'] / 1e6:.1f}",
    ]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def differences(
    results: dict[str, Any], reference: str, metric: str = "final_test_errors"
) -> dict[str, dict]:
  """Each arm's ``metric`` minus the reference arm's: Welch's 95% interval over
  the report seeds (``easgd.protocol.stats.difference_interval``)."""
  ref = results["arms"][reference][metric]
  return {
      name: protocol_stats.difference_interval(a[metric], ref)
      for name, a in results["arms"].items()
      if name != reference
  }


def differences_markdown(results: dict[str, Any], reference: str) -> str:
  """The seeds question's table: every arm's final test error and its
  difference to ``reference`` (percentage points, Welch's 95% interval).

  Raises:
    ProtocolError: results of a task without a per-example ``"correct"``.
  """
  _require_error(results, "the differences table")
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
    v = protocol_stats.verdict(d, holds_if="positive")
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


def plot_curves(results: dict[str, Any], path, group_by: str = "tau") -> None:
  """Center test error (a classifier's; else the test ``select_metric``) against
  local steps, mean over report seeds with its 95% band, one panel per value of
  ``group_by`` ("tau", "num_workers", or "" for one panel)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from scipy import stats

  panels: dict[Any, list] = {}
  for name, a in results["arms"].items():
    c = a["config"]
    reads = registry.TABLE[a["algorithm"]].reads
    key = (
        (c[group_by] if group_by and (group_by != "tau" or "tau" in reads) else "any")
        if group_by
        else "all"
    )
    panels.setdefault(key, []).append((name, a))
  shared = panels.pop("any", [])
  q = selection(results)[2][0]  # "error" (a classifier's), else the chosen metric
  scale = 100 if q == "error" else 1
  keys = sorted(panels, key=str) or ["all"]
  fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), sharey=True, squeeze=False)
  for ax, key in zip(axes[0], keys):
    for i, (name, a) in enumerate(panels.get(key, []) + shared):
      rep = a["report"]
      curves = scale * np.asarray(
          [[np.nan if v is None else v for v in c] for c in rep[f"test_{q}_curve"]], np.float64
      )
      steps = np.asarray(rep["eval_steps"])
      mean = curves.mean(axis=0)
      n = curves.shape[0]
      half = stats.t.ppf(0.975, n - 1) * curves.std(axis=0, ddof=1) / math.sqrt(n)
      style = "--" if (name, a) in shared else "-"
      ax.plot(steps, mean, style, color=f"C{i % 10}", label=name)
      ax.fill_between(steps, mean - half, mean + half, color=f"C{i % 10}", alpha=0.15)
    ax.set(title=f"{group_by} = {key}" if group_by else "", xlabel="local steps per worker")
    if q == "error":
      ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  axes[0][0].set_ylabel("center test error (%)" if q == "error" else f"center test {q}")
  fig.suptitle(results["protocol"]["name"], fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_report(workdir, group_by: str = "tau", results: dict | None = None) -> dict:
  """Every file of a protocol in ``workdir``: its one writer.

  The TensorBoard runs of ``report/`` and ``tune/`` (:func:`write_events`), curves.png,
  results.md and, given ``results``, results.json; ``easgd protocol`` and
  ``easgd.protocol.runs.run_protocol(config, workdir)`` write through it, and
  ``easgd protocol --report-only`` rewrites the files made from results.json.
  Each file is written beside its final name and then renamed over it,
  results.json last, so an interrupted or failed write leaves the earlier
  results.json whole.

  Args:
    workdir: the protocol's directory (created if missing).
    group_by: the panels of curves.png (:func:`plot_curves`).
    results: a run's results (``easgd.protocol.runs.run_protocol``) to write;
      None: read ``workdir/results.json``.

  Returns:
    The results.

  Raises:
    ProtocolError: no readable results.json, or one that is not a protocol
      run's results as written (``results`` None).
    OSError: a file cannot be written.
  """
  from easgd.protocol.runs import results_json

  workdir = Path(workdir)
  fresh = results is not None
  if fresh:
    texts = {RESULTS_MD: results_markdown(results)}
  else:
    results = load_results(workdir)
    try:  # a file edited by hand or damaged: one line, nothing rewritten
      texts = {RESULTS_MD: results_markdown(results)}
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
      raise ProtocolError(
          f"'{workdir / RESULTS_JSON}' is not the results of a protocol run as written "
          f"({type(e).__name__}: {e}); allowed: the results.json easgd protocol wrote"
      ) from None
  workdir.mkdir(parents=True, exist_ok=True)
  write_events(workdir, results)
  if fresh:
    texts[RESULTS_JSON] = results_json(results)
  new_png = workdir / f".new-{CURVES_PNG}"
  plot_curves(results, new_png, group_by)
  os.replace(new_png, workdir / CURVES_PNG)
  for name in (RESULTS_MD, RESULTS_JSON):
    if name in texts:
      write_text_atomic(workdir / name, texts[name])
  return results


def write_events(workdir, results: dict[str, Any]) -> None:
  """The protocol's curves as TensorBoard runs in ``workdir``: ``report/<arm>/seed_<s>``
  and ``tune/<arm>/lr_<rate>/seed_<s>``, each with the curves its results hold
  (a classifier's errors and losses; else the losses and the chosen metric's),
  by ``easgd.run.tensorboard.write_protocol_events``."""
  tensorboard.write_protocol_events(workdir, results)


# ----------------------------------------------------------------------------
# The paper's claims
# ----------------------------------------------------------------------------


def _elastic(results) -> list[str]:
  """The elastic algorithms the claims are measured on: of EASGD and of EAMSGD
  (the registry's family "elastic", without and with momentum) the
  asynchronous ones, as the paper ran them (Algorithms 1 and 2), where the
  results have such arms, else the synchronous ones (eq. (5)-(7))."""
  present = {a["algorithm"] for a in results["arms"].values()}
  out = []
  for momentum in (False, True):
    group = registry.names_where(
        lambda s: s.family == "elastic" and (s.without_momentum is not None) == momentum
    )
    here = [n for n in group if n in present]
    asynchronous = [n for n in here if registry.TABLE[n].asynchronous]
    out += asynchronous or here
  return out


def _is_eamsgd(algorithm: str) -> bool:
  """An elastic algorithm with momentum (EAMSGD, synchronous or asynchronous)."""
  spec = registry.TABLE[algorithm]
  return spec.family == "elastic" and spec.without_momentum is not None


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
      _require_error(results, "the claims table")
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


def _finish(claim, measurement, parts, n, source):
  verdict = (
      protocol_stats.combine_verdicts([p["verdict"] for p in parts]) if parts else "inconclusive"
  )
  return dict(
      claim=claim, measurement=measurement, parts=parts, n=n, verdict=verdict, source=source
  )


def _claim_fastest(res):
  target, net = CLAIMS_TARGET, CLAIMS_NETWORK
  refs = {k: v for k, v in res["arms"].items() if "tau" not in registry.TABLE[v["algorithm"]].reads}
  eamsgd = [n for n in _elastic(res) if _is_eamsgd(n)]
  parts = []
  eamsgd_arms = {k: v for algo in eamsgd for k, v in _arms(res, algo).items()}
  for name, a in eamsgd_arms.items():
    tau = a["config"]["tau"]
    mine = _censored_times(a, target, net)
    missed = a["time_to_target"][str(target)]["n"] - a["time_to_target"][str(target)]["reached"]
    others = {
        k: v
        for k, v in _arms(res, tau=tau).items()
        if "tau" in registry.TABLE[v["algorithm"]].reads and not _is_eamsgd(v["algorithm"])
    }
    others.update(refs)
    for other, b in others.items():
      d = protocol_stats.difference_interval(
          mine, _censored_times(b, target, net), paired=_paired(res, a, b)
      )
      # a time to target is known to one evaluation interval: widen by it
      resolution = max(_resolution(a, net), _resolution(b, net))
      d = dict(d, low=d["low"] - resolution, high=d["high"] + resolution, resolution=resolution)
      verdict = protocol_stats.verdict(d, holds_if="negative")
      text = _fmt_diff(d, 1.0, " s")
      if missed:
        # EAMSGD's censored times are lower bounds of its times: they can show
        # it slower ("does not hold"), never faster
        text += f"; EAMSGD missed the target on {missed} seed(s)"
        if verdict == "holds":
          verdict = "inconclusive"
      parts.append(dict(what=f"{name} - {other}", interval=d, text=text, verdict=verdict))
  n = len(res["protocol"]["report_seeds"])
  return _finish(
      "EAMSGD reaches a given test error fastest, at every tau",
      f"modelled time to {100 * target:g}% test error on {net} (EAMSGD, "
      f"{_as_run(eamsgd)}, minus "
      f"each other method at the same tau and the tau-free references, "
      f"intervals widened by one evaluation interval; "
      f"{sum(p['verdict'] == 'holds' for p in parts)}/{len(parts)} "
      f"comparisons hold)",
      parts,
      n,
      res["protocol"]["name"],
  )


def _claim_tau(res):
  parts = []
  for tau in (16, 64):
    down = _arms(res, "downpour", tau=tau)
    for algo in _elastic(res):
      mine = _arms(res, algo, tau=tau)
      if not down or not mine:
        continue
      for dn, d_arm in down.items():
        for mn, m_arm in mine.items():
          if d_arm["config"]["num_workers"] != m_arm["config"]["num_workers"]:
            continue
          d = protocol_stats.difference_interval(
              d_arm["final_test_errors"],
              m_arm["final_test_errors"],
              paired=_paired(res, d_arm, m_arm),
          )
          parts.append(
              dict(
                  what=f"{dn} - {mn} (final test error)",
                  interval=d,
                  text=_fmt_diff(d),
                  verdict=protocol_stats.verdict(d, holds_if="positive"),
              )
          )
  context = []
  for algo in _elastic(res) + ["downpour"]:
    lo, hi = _arms(res, algo, tau=1), _arms(res, algo, tau=64)
    if lo and hi:
      a_hi, a_lo = next(iter(hi.values())), next(iter(lo.values()))
      d = protocol_stats.difference_interval(
          a_hi["final_test_errors"], a_lo["final_test_errors"], paired=_paired(res, a_hi, a_lo)
      )
      context.append(f"{algo} tau=64 - tau=1: {_fmt_diff(d)}")
  n = len(res["protocol"]["report_seeds"])
  return _finish(
      "EASGD and EAMSGD are robust to large tau where DOWNPOUR breaks down",
      f"final test error, DOWNPOUR minus EASGD / EAMSGD ({_as_run(_elastic(res))}) "
      "at tau = 16 and 64 "
      f"(context: {'; '.join(context)})",
      parts,
      n,
      res["protocol"]["name"],
  )


def _claim_workers(res):
  key, what = selected_error(res)
  short = "test error at best val" if key == "test_errors_at_best_val" else "final test error"
  parts = []
  for algo in _elastic(res):
    arms = {a["config"]["num_workers"]: (k, a) for k, a in _arms(res, algo).items()}
    if 4 not in arms:
      continue
    base_name, base = arms[4]
    for p in sorted(arms):
      if p == 4:
        continue
      name, a = arms[p]
      d = protocol_stats.difference_interval(base[key], a[key], paired=_paired(res, base, a))
      parts.append(
          dict(
              what=f"{base_name} - {name} ({short})",
              interval=d,
              text=_fmt_diff(d),
              verdict=protocol_stats.verdict(d, holds_if="positive"),
          )
      )
  n = len(res["protocol"]["report_seeds"])
  return _finish(
      "More workers help EASGD and EAMSGD (lower test error with larger p)",
      f"center {what} at p = 4 minus at p = 8 and 16, same local steps "
      f"({_as_run(_elastic(res))})",
      parts,
      n,
      res["protocol"]["name"],
  )


def _claim_center(res):
  parts = []
  for algo in _elastic(res):
    for name, a in _arms(res, algo).items():
      diffs = np.asarray(a["final_test_errors"]) - np.asarray(a["final_worker_test_errors"])
      m = protocol_stats.mean_interval(diffs)
      d = dict(difference=m["mean"], low=m["low"], high=m["high"])
      parts.append(
          dict(
              what=f"{name}: center - mean worker (final test error, paired)",
              interval=d,
              text=_fmt_diff(d),
              verdict=protocol_stats.verdict(d, holds_if="negative"),
          )
      )
  n = len(res["protocol"]["report_seeds"])
  return _finish(
      "The center beats the workers",
      "final test error of the center minus the mean of the workers', per "
      f"seed (paired), EASGD and EAMSGD ({_as_run(_elastic(res))}) at every tau",
      parts,
      n,
      res["protocol"]["name"],
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
      counts = {v: sum(p["verdict"] == v for p in parts) for v in protocol_stats.VERDICTS}
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
