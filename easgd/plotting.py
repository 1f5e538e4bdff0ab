"""Matplotlib figures (Agg backend; files only, no screen needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence


def plot_comparison(histories: Mapping[str, Sequence[Mapping[str, Any]]], path,
                    title: str = "") -> Path:
  """Center test error against epochs, MB per worker and simulated time.

  Args:
    histories: algorithm name -> list of metric records (``metrics.jsonl``
      rows with ``epoch``, ``test_error``, ``bytes_communicated``; with a
      ``simulated_time`` in every record of every history, in ticks, a third
      panel shows the error against it: asynchronous schedules).
    path: the PNG file to write.
    title: figure title.

  Returns:
    ``Path(path)``.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  timed = bool(histories) and all(
      "simulated_time" in r for h in histories.values() for r in h)
  fig, axes = plt.subplots(1, 3 if timed else 2, figsize=(15 if timed else 10, 4),
                           constrained_layout=True)
  ax_e, ax_b = axes[0], axes[1]
  for name, hist in histories.items():
    epochs = [r["epoch"] for r in hist]
    err = [100 * r["test_error"] for r in hist]
    mb = [r["bytes_communicated"] / 1e6 for r in hist]
    ax_e.plot(epochs, err, marker=".", label=name)
    ax_b.plot(mb, err, marker=".", label=name)
    if timed:
      axes[2].plot([r["simulated_time"] for r in hist], err, marker=".", label=name)
  ax_e.set(xlabel="epoch", ylabel="center test error (%)")
  ax_b.set(xlabel="MB communicated per worker", ylabel="center test error (%)")
  if timed:
    axes[2].set(xlabel="simulated time (ticks)", ylabel="center test error (%)")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend()
    lows = [100 * min(r["test_error"] for r in h) for h in histories.values()]
    if lows:
      ax.set_ylim(max(0, min(lows) - 2), min(100, 4 * max(lows) + 5))
  if title:
    fig.suptitle(title)
  path = Path(path)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
