"""EASGD, EAMSGD, DOWNPOUR, local SGD, DiLoCo and pmean SGD at tau in {1, 4, 16}.

The comparison of the issue "Asynchronous EASGD, EAMSGD and the paper's comparators":
MNIST-1D, the small CNN, p = 4, 32 examples per worker per step, 8 epochs, one seed;
the settings of notebook 3 (``experiments/effect_of_tau.py``): eta = 0.1 for the SGD-type
methods, Nesterov delta = 0.9 with eta = 0.01 for EAMSGD; DiLoCo with its defaults (inner
SGD, outer Nesterov SGD, outer learning rate 0.7, outer momentum 0.9).

    python experiments/compare_mnist1d.py --out paper_notes/figures/compare_mnist1d

writes results.md (the table), results.json and comparison.png.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from easgd import train_and_evaluate
from easgd.runtimes.divergence import DivergenceError
from easgd.settings.config import TrainConfig

TAUS = (1, 4, 16)
ALGORITHMS = ("easgd", "eamsgd", "downpour", "local_sgd", "diloco")


def get_config() -> TrainConfig:
  return TrainConfig(
      dataset="mnist1d",
      model="cnn",
      num_workers=4,
      global_batch_size=128,
      num_epochs=8,
      learning_rate=0.1,
      optimizer="sgd",
      beta=0.9,
      keep_checkpoints=1,
      progress=False,
      seed=0,
  )


def get_grid() -> dict[str, TrainConfig]:
  base = get_config()
  grid = {}
  for a in ALGORITHMS:
    for t in TAUS:
      kw = dict(delta=0.9, learning_rate=0.01) if a == "eamsgd" else {}
      grid[f"{a} tau={t}"] = base.replace(algorithm=a, tau=t, **kw)
  grid["pmean_sgd"] = base.replace(algorithm="pmean_sgd")
  return grid


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  out = Path(parser.parse_args().out)
  out.mkdir(parents=True, exist_ok=True)
  rows, histories = [], {}
  start = time.time()
  with tempfile.TemporaryDirectory() as tmp:
    for name, cfg in get_grid().items():
      try:
        s = train_and_evaluate(cfg.validate(), Path(tmp) / name.replace(" ", "_"))
        h = s["history"]
        rows.append(
            dict(
                run=name,
                final_error=h[-1]["test_error"],
                best_error=min(r["test_error"] for r in h),
                all_reduces=s["communication"]["all_reduces"],
                mb=s["communication"]["bytes"] / 1e6,
            )
        )
        histories[name] = [(r["epoch"], r["test_error"]) for r in h]
      except DivergenceError as e:
        rows.append(
            dict(
                run=name,
                final_error=None,
                best_error=None,
                all_reduces=None,
                mb=None,
                diverged=str(e),
            )
        )
  lines = [
      "| run | center test error (final) | best | all-reduces / worker | MB / worker |",
      "|---|---|---|---|---|",
  ]
  for r in rows:
    if r["final_error"] is None:
      lines.append(f"| {r['run']} | diverged | - | - | - |")
    else:
      lines.append(
          f"| {r['run']} | {100 * r['final_error']:.2f}% | "
          f"{100 * r['best_error']:.2f}% | {r['all_reduces']} | {r['mb']:.1f} |"
      )
  table = "\n".join(lines) + "\n"
  (out / "results.md").write_text(table)
  (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(TAUS), figsize=(13, 4), sharey=True, constrained_layout=True)
  for ax, t in zip(axes, TAUS):
    for name, h in histories.items():
      if name.endswith(f"tau={t}") or name == "pmean_sgd":
        ax.plot(
            [e for e, _ in h],
            [100 * v for _, v in h],
            marker=".",
            label=name.replace(f" tau={t}", ""),
        )
    ax.set(title=f"tau = {t}", xlabel="epoch")
    ax.set_ylim(0, 60)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("center test error (%)")
  axes[0].legend()
  fig.suptitle("MNIST-1D, CNN, p = 4 (one seed)")
  fig.savefig(out / "comparison.png", dpi=100)
  print(table)
  print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
