"""Draws the two levels of a ``devices_per_worker`` run: docs/guides/images/two_levels.png.

p workers, one per node, each a row of D devices of the ("devices", "data")
mesh; inside a worker its devices average the gradient every step over
"data" (``easgd.parallel.data_parallel.data_parallel_loss``), across workers the
algorithm's exchange (EASGD: with the center every tau steps) reduces over
"devices". Matplotlib only (Agg), no date in the file: the same picture byte
for byte on the same Matplotlib.

python scripts/layout_picture.py [--out docs/guides/images/two_levels.png]
"""

import argparse
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "guides" / "images" / "two_levels.png"
SLOW, FAST = "#b03a2e", "#1f618d"  # the links between nodes, the links inside one


def draw(out: Path) -> None:
  """Writes the picture to ``out`` (PNG, 1500 x 780 pixels)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.patches import FancyBboxPatch

  fig = plt.figure(figsize=(10, 5.2), dpi=150)
  ax = fig.add_axes((0, 0, 1, 1))
  ax.set_xlim(0, 10)
  ax.set_ylim(0, 5.2)
  ax.axis("off")

  def box(x, y, w, h, face, edge, text=None, size=10, weight="normal", style="round,pad=0.02"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style, fc=face, ec=edge, lw=1.4))
    if text:
      ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", size=size, weight=weight)

  ax.text(
      5.0,
      5.0,
      "p workers x D devices: a (\u201cdevices\u201d, \u201cdata\u201d) mesh of shape [p, D]",
      ha="center",
      va="center",
      size=11,
  )
  # the center
  cx, cy, cw, ch = 3.9, 3.95, 2.2, 0.7
  box(cx, cy, cw, ch, "#fdebd0", "#7e5109", "center  x\u0303", size=12, weight="bold")
  # p nodes, each one worker of D devices
  nodes = [("node 1: worker 1", 0.35), ("node 2: worker 2", 3.1), ("node p: worker p", 7.1)]
  nw, nh, ny = 2.55, 1.55, 0.55
  for label, nx in nodes:
    box(nx, ny, nw, nh, "#eaf2f8", "#34495e")
    ax.text(nx + nw / 2, ny + nh - 0.22, label, ha="center", va="center", size=10, weight="bold")
    dw, gap = 0.5, 0.1
    x0 = nx + (nw - 4 * dw - 3 * gap) / 2
    for k, name in enumerate(("dev 1", "dev 2", "\u2026", "dev D")):
      box(x0 + k * (dw + gap), ny + 0.5, dw, 0.5, "white", FAST, name, size=7.5)
    # the fast link: one bar under the devices
    ax.plot([x0 + dw / 2, x0 + 3 * (dw + gap) + dw / 2], [ny + 0.33] * 2, color=FAST, lw=3)
    for k in range(4):
      xk = x0 + k * (dw + gap) + dw / 2
      ax.plot([xk, xk], [ny + 0.33, ny + 0.5], color=FAST, lw=1.5)
    # the slow link to the center
    ax.annotate(
        "",
        xy=(cx + cw / 2 + (nx - 3.7) * 0.15, cy),
        xytext=(nx + nw / 2, ny + nh + 0.05),
        arrowprops=dict(arrowstyle="<->", color=SLOW, lw=2, linestyle="--"),
    )
  ax.text(6.38, 1.33, "\u2026", ha="center", va="center", size=22)
  ax.text(
      5.0,
      3.15,
      "elastic exchange every \u03c4 steps, slow link between nodes\n(across workers: mesh axis \u201cdevices\u201d)",
      ha="center",
      va="center",
      size=10,
      color=SLOW,
      bbox=dict(fc="white", ec="none", pad=2),
  )
  ax.text(
      5.0,
      0.25,
      "inside each node: gradient all-reduce every step (mesh axis \u201cdata\u201d, fast link)",
      ha="center",
      va="center",
      size=10,
      color=FAST,
  )
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, metadata={"Software": None})
  plt.close(fig)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", type=Path, default=OUT)
  args = ap.parse_args()
  draw(args.out)
  print(args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
