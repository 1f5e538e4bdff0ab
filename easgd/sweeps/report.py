"""The report of a sweep: files, the theory's contour and the heatmaps.

  :func:`write_result`    ``sweep.csv``, ``sweep.json`` and the heatmaps.
  :func:`plot_result`     one heatmap PNG per metric, the theory's stability
                          boundary (radius = 1) drawn over it.
  :func:`plot_tau_alpha_heatmap`  one (tau, alpha) heatmap with contours.
  :func:`theory_contour`  that boundary's radius on the heatmap's cells.
  :func:`summarize`       a short text: divergence and collapse counts, agreement
                          with the theory, compile counts, the best configuration.

The results themselves (``easgd.sweeps.grid.SweepResult``) come from
``easgd.sweeps.quadratic.sweep_quadratic`` and ``easgd.sweeps.network.sweep_network``.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Section 4.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from easgd._util.files import json_text, write_text_atomic
from easgd.analysis import stability
from easgd.analysis.hessian import certified_curvature
from easgd.run.compare import COLLAPSE_MARGIN
from easgd.sweeps.grid import SweepGrid, SweepResult

# Metrics drawn as heatmaps, with (colour-bar label, log colour scale).
HEATMAP_METRICS = {
    "diverged": ("diverged, workers or center (1) / not (0)", False),
    "center_loss": ("center loss", True),
    "test_accuracy": ("center test accuracy", False),
    "worker_center_distance": ("mean ||x^i - x~|| at the end", True),
    "final_loss": ("mean worker loss, last step", True),
}


def theory_contour(
    grid: SweepGrid, eta_h: float, num_workers: int, num_alpha: int = 241
) -> dict[str, np.ndarray]:
  """The analytic radius on a (tau, fine alpha) mesh in heatmap cell coordinates.

  The radius of :func:`easgd.analysis.stability.sync_easgd_spectral_radius` is
  evaluated at the grid's own tau values (columns; cell k at x = k, the edge
  columns repeated at x = -0.5 and n - 0.5 so a contour spans the plot) and
  at ``num_alpha`` alphas from half a cell below the first grid alpha to half
  a cell above the last (mapped to y by piecewise-linear interpolation between
  the grid values, linear extrapolation at the ends). Intermediate integer
  taus are deliberately not drawn: for eta*h > 1 the plain-step factor
  (1 - eta h)^(tau - 1) alternates in sign with tau, so the boundary between
  two grid taus says nothing about either.

  Returns:
    dict(x [len(tau) + 2], y [num_alpha], radius [num_alpha, len(tau) + 2])
    (float64).
  """
  tau = np.asarray(grid.tau, np.int64)
  a = np.asarray(grid.alpha, np.float64)
  cells = np.arange(len(a), dtype=np.float64)
  if len(a) > 1:
    lo = a[0] - 0.5 * (a[1] - a[0])
    hi = a[-1] + 0.5 * (a[-1] - a[-2])
    y_lo, y_hi = -0.5, len(a) - 0.5
    if lo < 0:  # alpha >= 0: stop at 0, at the matching cell coordinate
      y_lo, lo = -0.5 * a[0] / (0.5 * (a[1] - a[0])), 0.0
  else:
    lo, hi, y_lo, y_hi = a[0] * 0.9, a[0] * 1.1 + 1e-3, -0.5, 0.5
  alphas = np.linspace(lo, hi, num_alpha)
  y = np.interp(alphas, np.r_[lo, a, hi], np.r_[y_lo, cells, y_hi])
  radius = stability.sync_easgd_spectral_radius(eta_h, alphas[:, None], tau[None, :], num_workers)
  radius = np.concatenate([radius[:, :1], radius, radius[:, -1:]], axis=1)
  x = np.r_[-0.5, np.arange(len(tau), dtype=np.float64), len(tau) - 0.5]
  return dict(x=x, y=y, radius=np.minimum(radius, 1e6))


_DIVERGED_CMAP = "Greys"  # 0 = white (finished), 1 = black (diverged)


def plot_result(result: SweepResult, workdir, prefix: str | None = None) -> list[Path]:
  """One heatmap PNG per metric and per (num_workers, learning_rate) slice.

  File names: ``{prefix}{metric}[_p{p}][_lr{lr}].png`` (the suffixes only
  when that axis has several values); prefix default ``"{problem}_"``.
  Cells of diverged configurations (``diverged``: workers or center) are
  hatched out in the metric plots; the theory's boundary (radius = 1) is drawn
  at eta*h for h at the start (solid) and, for a network, at the trained point
  (dashed), each only when its Hessian estimate converged
  (``easgd.analysis.hessian.certified_curvature``).

  Returns:
    The written paths.
  """
  workdir = Path(workdir)
  prefix = f"{result.problem}_" if prefix is None else prefix
  g = result.grid
  h2 = certified_curvature(result.info.get("hessian_trained"))
  paths = []
  columns = result.columns()
  for p in g.num_workers:
    for lr in g.learning_rate:
      suffix = (f"_p{p}" if len(g.num_workers) > 1 else "") + (
          f"_lr{lr:g}" if len(g.learning_rate) > 1 else ""
      )
      contours = []
      for h, style, name in (
          (result.curvature, "-", "h at the start"),
          (h2, "--", "h at the trained point"),
      ):
        if h is not None and math.isfinite(h) and h > 0:
          c = theory_contour(g, lr * h, p)
          contours.append(
              dict(c, label=f"theory radius=1, {name} (eta*h={lr * h:.3g})", linestyle=style)
          )
      diverged = result.table("diverged", p, lr) > 0
      steps = result.table("diverged_step", p, lr)
      for metric, (label, log) in HEATMAP_METRICS.items():
        if metric not in columns:  # a metric the problem does not evaluate
          continue
        values = result.table(metric, p, lr)
        if np.all(np.isnan(values)):
          continue
        annot = None
        if metric == "diverged":
          annot = np.where(diverged, steps, np.nan)
        title = (
            f"{result.problem}: {metric}, p={p}, eta={lr:g}, "
            f"{result.info.get('num_steps')} steps"
            + (
                f"\n(numbers: step of divergence; {result.info.get('num_steps')}: "
                "the center's final loss only)"
                if metric == "diverged"
                else "\n(hatched: diverged; a workers' divergence freezes the state)"
                if diverged.any()
                else ""
            )
        )
        paths.append(
            plot_tau_alpha_heatmap(
                values,
                g.tau,
                g.alpha,
                workdir / f"{prefix}{metric}{suffix}.png",
                title=title,
                label=label,
                log=log,
                mask=None if metric == "diverged" else diverged,
                annotations=annot,
                contours=contours,
                cmap=_DIVERGED_CMAP if metric == "diverged" else "viridis",
            )
        )
  return paths


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
      is drawn (e.g. :func:`theory_contour`), and the region
      radius >= 1 of the first one is shaded.
    cmap: a Matplotlib colormap or its name (NaN cells are light grey).

  Returns:
    ``Path(path)``.
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
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


def write_result(result: SweepResult, workdir, plots: bool = True) -> list[Path]:
  """Writes ``sweep.csv``, ``sweep.json`` and the heatmaps into ``workdir``."""
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  write_text_atomic(workdir / "sweep.csv", result.to_csv())
  write_text_atomic(workdir / "sweep.json", json_text(result.to_json(), indent=1) + "\n")
  paths = [workdir / "sweep.csv", workdir / "sweep.json"]
  if plots:
    paths += plot_result(result, workdir, prefix="")
  return paths


def summarize(result: SweepResult) -> str:
  """A short text summary: divergence and collapse counts and agreement with the theory.

  ``diverged`` is the combined flag (workers or center, ``easgd.sweeps.engine``);
  ``collapsed`` counts the others that learned nothing (``easgd.run.compare.collapsed``,
  :func:`easgd.sweeps.grid.records`);
  the agreement counts configurations where it equals radius >= 1, for each
  certified curvature (at the start and, for a network, at the trained
  point). Hessian estimates that did not converge are reported as such.
  """
  recs = result.records
  div = sum(r["diverged"] for r in recs)
  workers = sum(r["workers_diverged"] for r in recs)
  center = sum(r["center_diverged"] for r in recs)
  center_only = sum(r["center_diverged"] and not r["workers_diverged"] for r in recs)
  lines = [
      f"{result.problem}: {len(recs)} configurations, {div} diverged "
      f"({workers} by the workers' loss, {center} by the center's, "
      f"{center_only} of them by the center's alone)"
  ]
  collapsed = [r for r in recs if r.get("collapsed")]
  lines.append(
      f"  {len(collapsed)} collapsed (finished, but the center's loss ended at or above its "
      f"start, or its test error within {100 * COLLAPSE_MARGIN:g}% of chance)"
  )
  for p, prog in result.info.get("programs", {}).items():
    lines.append(
        f"  p={p}: {prog['configs']} configs in one program, "
        f"{prog['wall_s']:.2f} s wall ({prog['compiles']} compilations, "
        f"{prog['compile_s']:.2f} s compiling)"
    )
  for name, where in (("hessian_init", "the start"), ("hessian_trained", "the trained point")):
    est = result.info.get(name)
    if est and est.get("converged"):
      lines.append(
          f"  h at {where}: {est['h']:.4g} (residual {est['residual']:.2g} "
          f"<= tol*|h|, {est['products']} Hessian-vector products)"
      )
    elif est:
      got = (
          "no Ritz value"
          if est["h"] is None
          else f"estimate {est['h']:.4g}, residual {est['residual']:.2g} > tol*|h|"
      )
      lines.append(
          f"  h at {where}: NOT converged in {est['products']} Hessian-vector "
          f"products ({got}); no theory from it"
      )
  for column, h, where in (
      ("theory_radius", result.curvature, "h"),
      (
          "theory_radius_trained",
          certified_curvature(result.info.get("hessian_trained")),
          "trained h",
      ),
  ):
    known = [r for r in recs if r[column] is not None]
    if h is not None and known:
      agree = sum(r["diverged"] == (r[column] >= 1.0) for r in known)
      lines.append(
          f"  theory at {where}={h:.4g}: divergence agrees with "
          f"radius >= 1 on {agree}/{len(known)} configurations"
      )
  ok = [
      r
      for r in recs
      if not r["diverged"] and not r.get("collapsed") and r["center_loss"] is not None
  ]
  if ok:
    best = min(ok, key=lambda r: r["center_loss"])
    extra = (
        f", test accuracy {best['test_accuracy']:.4f}"
        if best.get("test_accuracy") is not None
        else ""
    )
    lines.append(
        f"  best: tau={best['tau']}, alpha={best['alpha']:g}, "
        f"eta={best['learning_rate']:g}, p={best['num_workers']}: "
        f"center loss {best['center_loss']:.4g}{extra}"
    )
  return "\n".join(lines)
