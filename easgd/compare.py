"""``compare``: several algorithms on the same data budget, one plot and one table.

Every algorithm runs the same config (data set, model, global batch, epochs,
learning-rate schedule, seed: the same initial parameters and data order) in
its own sub-directory of ``workdir``; then ``comparison.png`` (center test error
against epochs, against bytes communicated per worker and against simulated
time in ticks, see ``easgd.registry.simulated_ticks``) and ``results.md`` /
``results.json`` (the table) are written beside them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from easgd.algorithms import ALGORITHMS
from easgd.config import ConfigError, TrainConfig
from easgd.checkpoint import write_text_atomic
from easgd.trainer import check_workdir, train_and_evaluate

RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"
PLOT_FILE = "comparison.png"
DEFAULT_ALGORITHMS = ("easgd", "pmean_sgd")
"""What ``compare`` runs when no names are given (the CLI's default too)."""


def _row(summary: dict[str, Any]) -> dict[str, Any]:
  cfg, final, comm = summary["config"], summary["final"], summary["communication"]
  return dict(
      algorithm=summary["algorithm"]["name"],
      num_workers=cfg["num_workers"],
      tau=summary["algorithm"].get("tau"),  # None for methods without a period
      beta=summary["algorithm"].get("beta"),  # elastic methods only
      epochs=final["epoch"], steps=final["step"],
      test_accuracy=final["test_accuracy"],
      best_test_accuracy=summary["best_test_accuracy"],
      test_loss=final["test_loss"],
      all_reduces_per_worker=comm["all_reduces"],
      mb_per_worker=comm["bytes"] / 1e6,
      wall_time_s=summary["wall_time_s"])


def results_table(rows: Sequence[dict[str, Any]]) -> str:
  """A Markdown table of compare rows.

  Args:
    rows: one dict per algorithm, as :func:`_row` makes from a run summary
      (algorithm, num_workers, tau, beta, epochs, test_accuracy (fraction),
      best_test_accuracy, all_reduces_per_worker, mb_per_worker, wall_time_s).

  Returns:
    The table as Markdown text, one line per row, accuracies in percent.
  """
  head = ("| algorithm | p | tau | beta | epochs | center test acc. (final) | best | "
          "all-reduces / worker | MB / worker | wall time (s) |")
  lines = [head, "|" + "---|" * 10]
  for r in rows:
    lines.append(
        f"| {r['algorithm']} | {r['num_workers']} | {r['tau'] or '-'} | "
        f"{'-' if r['beta'] is None else format(r['beta'], 'g')} | {r['epochs']} | "
        f"{100 * r['test_accuracy']:.2f}% | {100 * r['best_test_accuracy']:.2f}% | "
        f"{r['all_reduces_per_worker']} | {r['mb_per_worker']:.1f} | "
        f"{r['wall_time_s']:.0f} |")
  return "\n".join(lines) + "\n"


def compare(config: TrainConfig, workdir,
            algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
            *, overwrite: bool = False) -> list[dict[str, Any]]:
  """Runs ``algorithms`` on ``config``'s data budget; writes plot and table.

  Args:
    config: the shared configuration (its ``algorithm`` field is ignored).
    workdir: output directory; each run goes to ``workdir/<algorithm>``.
    algorithms: names from ``easgd.algorithms.ALGORITHMS``, no repeats;
      default :data:`DEFAULT_ALGORITHMS`.
    overwrite: allow replacing earlier runs in these directories.

  Returns:
    One table row (dict) per algorithm, also in ``results.json``.

  Raises:
    ConfigError: unknown or repeated algorithm names, bad config values, or a
      workdir that already holds runs (without ``overwrite``); checked for every
      algorithm before the first one starts.
  """
  algorithms = list(algorithms)
  if not algorithms:
    raise ConfigError(f"algorithms must name at least one of {', '.join(ALGORITHMS)}")
  for a in algorithms:
    if a not in ALGORITHMS:
      raise ConfigError(f"unknown algorithm {a!r}; allowed: {', '.join(ALGORITHMS)}")
  if len(set(algorithms)) != len(algorithms):
    raise ConfigError(f"algorithms has repeats: {algorithms}")
  if not str(workdir).strip():
    raise ConfigError(f"workdir must be a non-empty path, got {str(workdir)!r}")
  workdir = Path(workdir)
  configs = [_for_algorithm(config, a).validate() for a in algorithms]
  for a in algorithms:
    check_workdir(workdir / a, overwrite)
  if not overwrite and any((workdir / f).exists() for f in (RESULTS_MD, RESULTS_JSON, PLOT_FILE)):
    raise ConfigError(f"workdir '{workdir}' already holds a comparison; choose another "
                      "directory or pass overwrite (--overwrite)")
  summaries = [train_and_evaluate(c, workdir / c.algorithm, overwrite=overwrite)
               for c in configs]
  rows = [_row(s) for s in summaries]
  write_text_atomic(workdir / RESULTS_JSON, json.dumps(rows, indent=2) + "\n")
  write_text_atomic(workdir / RESULTS_MD, results_table(rows))
  from easgd.plotting import plot_comparison
  from easgd.registry import simulated_ticks
  histories = {s["algorithm"]["name"]: [dict(r, simulated_time=simulated_ticks(
      r["step"], c)) for r in s["history"]] for c, s in zip(configs, summaries)}
  plot_comparison(histories, workdir / PLOT_FILE, title=_title(config))
  return rows


def _for_algorithm(config: TrainConfig, algorithm: str) -> TrainConfig:
  """``config`` for ``algorithm``: the shared momentum goes to the algorithms that
  use it (their own Nesterov delta, or a momentum optimizer), 0 elsewhere."""
  from easgd.registry import MOMENTUM_ALGORITHMS
  uses = (algorithm in MOMENTUM_ALGORITHMS
          or config.optimizer in ("momentum", "nesterov"))
  return config.replace(algorithm=algorithm,
                        momentum=config.momentum if uses else 0.0)


def _title(config: TrainConfig) -> str:
  return (f"{config.dataset} / {config.model}, p={config.num_workers}, "
          f"global batch {config.global_batch_size}, lr {config.learning_rate:g}")
