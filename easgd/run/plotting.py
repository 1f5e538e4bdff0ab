"""Matplotlib figures (Agg backend; files only, no screen needed)."""

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


def plot_tau_alpha_heatmap(
    values,
    tau,
    alpha,
    path,
    *,
    title: str = "",
    label: str = "",
    log: bool = False,
    mask=None,
    annotations=None,
    contours=(),
    cmap="viridis",
) -> Path:
  """A (tau, alpha) heatmap of one sweep metric, with theory contours on top.

  Cells are the grid values (tau on the x axis, alpha on the y axis, evenly
  spaced whatever the values), so a log-spaced tau grid reads naturally.

  Args:
    values: float [len(alpha), len(tau)], rows follow alpha (NaN: blank).
    tau, alpha: the grid values (ascending), for the tick labels.
    path: the PNG file to write.
    title: figure title.
    label: colour-bar label.
    log: logarithmic colour scale (values <= 0 take the lowest colour).
    mask: optional bool [len(alpha), len(tau)]; True cells are hatched and
      greyed (e.g. diverged configurations, whose metric is of a frozen state).
    annotations: optional float [len(alpha), len(tau)]; finite entries are
      written in their cell as integers (e.g. the divergence step).
    contours: dicts with ``x`` [nx], ``y`` [ny] (cell coordinates),
      ``radius`` [ny, nx], ``label`` and ``linestyle``: the level radius = 1
      is drawn (e.g. ``easgd.sweeps.report.theory_contour``), and the region
      radius >= 1 of the first one is shaded.
    cmap: a Matplotlib colormap or its name (NaN cells are light grey).

  Returns:
    ``Path(path)``.
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  from matplotlib.colors import LogNorm
  from matplotlib.lines import Line2D

  values = np.asarray(values, dtype=np.float64)
  shown = np.where(mask, np.nan, values) if mask is not None else values.copy()
  norm = None
  if log:
    pos = shown[np.isfinite(shown) & (shown > 0)]
    if pos.size:  # exact zeros (e.g. an underflowed loss) get the lowest colour
      shown = np.where(np.isfinite(shown), np.maximum(shown, pos.min()), np.nan)
      norm = LogNorm(vmin=pos.min(), vmax=max(pos.max(), pos.min() * 1.0001))
  fig, ax = plt.subplots(
      figsize=(max(5.0, 2.8 + 0.75 * len(tau)), max(3.6, 1.9 + 0.5 * len(alpha))),
      constrained_layout=True,
  )
  cmap = plt.get_cmap(cmap).with_extremes(bad="#dddddd")
  im = ax.imshow(
      np.ma.masked_invalid(shown),
      origin="lower",
      aspect="auto",
      cmap=cmap,
      norm=norm,
      interpolation="nearest",
  )
  fig.colorbar(im, ax=ax, label=label)
  if mask is not None and np.any(mask):
    ys, xs = np.nonzero(mask)
    for x, y in zip(xs, ys):
      ax.add_patch(
          plt.Rectangle(
              (x - 0.5, y - 0.5), 1, 1, fill=False, hatch="xx", edgecolor="#888888", linewidth=0
          )
      )
  if annotations is not None:
    for (y, x), v in np.ndenumerate(np.asarray(annotations, dtype=np.float64)):
      if np.isfinite(v):
        rgb = im.cmap(im.norm(shown[y, x]))[:3] if np.isfinite(shown[y, x]) else (1, 1, 1)
        dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 0.5
        ax.text(
            x,
            y,
            f"{int(v)}",
            ha="center",
            va="center",
            fontsize=7,
            color="white" if dark else "black",
        )
  handles = []
  for k, c in enumerate(contours):
    r = np.asarray(c["radius"])
    if k == 0 and np.nanmax(r) >= 1.0:  # shade where the first theory is unstable
      ax.contourf(c["x"], c["y"], r, levels=[1.0, np.inf], colors="red", alpha=0.12)
      handles.append(
          plt.Rectangle(
              (0, 0), 1, 1, color="red", alpha=0.12, label="shaded: theory radius >= 1 (first line)"
          )
      )
    if np.nanmin(r) < 1.0 < np.nanmax(r):
      ax.contour(
          c["x"],
          c["y"],
          r,
          levels=[1.0],
          colors="red",
          linestyles=c.get("linestyle", "-"),
          linewidths=1.6,
      )
    handles.append(
        Line2D(
            [],
            [],
            color="red",
            linestyle=c.get("linestyle", "-"),
            label=c.get("label", "theory radius = 1"),
        )
    )
  ax.set_xticks(range(len(tau)), [f"{t:g}" for t in tau])
  ax.set_yticks(range(len(alpha)), [f"{a:g}" for a in alpha])
  ax.set(
      xlabel="tau (communication period, local steps)",
      ylabel="alpha (moving rate)",
      xlim=(-0.5, len(tau) - 0.5),
      ylim=(-0.5, len(alpha) - 0.5),
  )
  if handles:
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, frameon=False)
  if title:
    ax.set_title(title, fontsize=9)
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
