"""The comparison's figure (``easgd.run.compare``; Matplotlib's Agg backend, files only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence


def comparison_figure(histories: Mapping[str, Sequence[Mapping[str, Any]]], title: str = ""):
  """The figure of :func:`plot_comparison` (a Matplotlib ``Figure``, open).

  The error axes are logarithmic and span every error of every history, from
  the start (epoch 0, near chance) to the lowest, so neither the first epochs
  nor the differences between the final errors are cut off. Histories whose
  records lack ``test_error`` (a task without a ``"correct"`` metric) show the
  center test loss instead, on the same kind of axes (linear if a loss is not
  positive).

  Args:
    histories, title: as :func:`plot_comparison`.

  Returns:
    The figure; its axes in order: error against epochs, against MB per
    worker, and (asynchronous schedules) against simulated time. Close it with
    ``matplotlib.pyplot.close(fig)``.
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import FuncFormatter

  timed = bool(histories) and all("simulated_time" in r for h in histories.values() for r in h)
  records = [r for h in histories.values() for r in h]
  if all("test_error" in r for r in records):
    key, scale, cap, ylabel = "test_error", 100.0, 100.0, "center test error (%)"
  else:
    key, scale, cap, ylabel = "test_loss", 1.0, float("inf"), "center test loss"
  fig, axes = plt.subplots(
      1, 3 if timed else 2, figsize=(15 if timed else 10, 4), constrained_layout=True
  )
  ax_e, ax_b = axes[0], axes[1]
  for name, hist in histories.items():
    epochs = [r["epoch"] for r in hist]
    err = [scale * r[key] for r in hist]
    mb = [r["bytes_communicated"] / 1e6 for r in hist]
    ax_e.plot(epochs, err, marker=".", label=name)
    ax_b.plot(mb, err, marker=".", label=name)
    if timed:
      axes[2].plot([r["simulated_time"] for r in hist], err, marker=".", label=name)
  ax_e.set(xlabel="epoch", ylabel=ylabel)
  ax_b.set(xlabel="MB communicated per worker", ylabel=ylabel)
  if timed:
    axes[2].set(xlabel="simulated time (ticks)", ylabel=ylabel)
  errors = [scale * r[key] for r in records]
  positive = [e for e in errors if e > 0]
  if key == "test_loss" and len(positive) < len(errors):
    positive = []  # a loss at or below 0 (e.g. a log-likelihood): linear axes
  percent = FuncFormatter(lambda v, _: f"{v:g}")
  some = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "235" else "")  # minor ticks
  for ax in axes:
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    if positive:  # log scale: every error from the start's to the lowest (0: at the floor)
      ax.set_yscale("log")
      ax.set_ylim(0.8 * min(positive), min(cap, 1.25 * max(positive)))
      ax.yaxis.set_major_formatter(percent)
      ax.yaxis.set_minor_formatter(some)
  if title:
    fig.suptitle(title)
  return fig


def plot_comparison(
    histories: Mapping[str, Sequence[Mapping[str, Any]]], path, title: str = ""
) -> Path:
  """Center test error against epochs, MB per worker and simulated time.

  Args:
    histories: algorithm name -> list of metric records (``metrics.jsonl``
      rows with ``epoch``, ``test_error`` (or, in none or not all of them,
      ``test_loss``: then the loss is shown), ``bytes_communicated``; with a
      ``simulated_time`` in every record of every history, in ticks, a third
      panel shows the error against it: asynchronous schedules).
    path: the PNG file to write.
    title: figure title.

  Returns:
    ``Path(path)``.
  """
  import matplotlib.pyplot as plt

  fig = comparison_figure(histories, title)
  path = Path(path)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
