"""The protocol's report, computed from its ``results.json``, never typed by hand.

  :func:`write_report`       every file of a protocol, its one writer: the TensorBoard
                             runs, curves.png, results.md, results.json.
  :func:`results_markdown`   results.md: one experiment's comparison table.
  :func:`compact_markdown`   the short table of one experiment (docs/guides/results.md).
  :func:`plot_curves`        curves.png: center test error (else the chosen metric)
                             against local steps, mean over seeds with its 95% band.
  :func:`selection`          the metric the rates were chosen on and the test metrics
                             reported.

The paper's claims and the differences between arms: ``easgd.protocol.claims``. What the
files hold: docs/guides/protocol.md.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from easgd._util.files import write_text_atomic
from easgd.methods import registry
from easgd.protocol.config import (
    RESULTS_JSON,
    ProtocolError,
    grid_note,
    lr_grid_edges,
    reported_metrics,
)
from easgd.protocol.stats import format_interval
from easgd.run import tensorboard

RESULTS_MD = "results.md"
CURVES_PNG = "curves.png"
GROUP_BY = ("tau", "num_workers", "")
"""The panels of curves.png (:func:`plot_curves`): by tau, by p, or one panel."""


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


def require_error(results: dict[str, Any], what: str) -> None:
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
  rates and their grids, the report seeds that diverged or collapsed
  (``easgd.run.compare.collapsed``); a classifier's times to each target test
  error; the tuning scores and the programs."""
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
        stop = {
            "interior": "interior",
            "diverged": "bracketed by a diverging rate",
            "collapsed": "bracketed by a collapsing rate",
        }
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
    row[4] += _failed(a, "diverged", "collapsed")
    lines.append("| " + " | ".join(row) + " |")
  if any(any(a.get("collapsed") or ()) for a in results["arms"].values()):
    lines += ["", _collapse_note(results)]
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


def _failed(runs: dict, diverged: str, collapsed: str) -> str:
  """ " (2 diverged, 1 collapsed)" of an arm's (or a rate's) runs, each word given;
  "" when none failed (results written before collapse was counted: none
  collapsed)."""
  counts = [(sum(runs["diverged"]), diverged), (sum(runs.get("collapsed") or ()), collapsed)]
  parts = [f"{n} {word}" for n, word in counts if n]
  return f" ({', '.join(parts)})" if parts else ""


def _collapse_note(results: dict[str, Any]) -> str:
  """The line under results.md's table that says what "collapsed" means there."""
  c = results.get("collapse") or {}
  line = (
      f", or its final test error at least {100 * c['error_at_least']:.1f}% "
      f"({100 * (1 - c['margin']):g}% of chance, {100 * c['chance_error']:.1f}% for "
      f"{c['num_classes']} classes)"
      if c.get("error_at_least") is not None
      else ""
  )
  return (
      "Collapsed: a report run that finished, but whose center's test loss ended at or "
      f"above its start{line} (easgd.run.compare.collapsed); not counted as diverged."
  )


def _tuning_markdown(results: dict[str, Any]) -> list[str]:
  """results.md's lines of the tuning scores per rate."""
  metric, better, _ = selection(results)
  collapse = "collapse" in results  # results written since collapse was counted
  if metric == "error":
    lines = [
        "",
        "Tuning (mean final validation error % over the tuning seeds per rate; "
        f"a diverged{' or collapsed' if collapse else ''} run counts as 100%):",
        "",
    ]
    score = lambda v: f"{100 * v:.1f}"
  else:
    lines = [
        "",
        f"Tuning (mean final validation {metric} over the tuning seeds per rate, {better} is "
        f"better; a diverged{' or collapsed' if collapse else ''} run counts as the worst "
        "value, shown as 'worst'):",
        "",
    ]
    score = lambda v: "worst" if v is None or not math.isfinite(v) else f"{v:.4g}"
  for name, a in results["arms"].items():
    if a["tuning"]:
      cells = ", ".join(
          f"{r['learning_rate']:g}: {score(r['score'])}" + _failed(r, "div.", "coll.")
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
  require_error(results, "the compact table")
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
