"""Time to a target test error on a real slow link, measured, with the time model beside it.

pmean SGD, EASGD and asynchronous EASGD (tau = 16) train the MLP on MNIST-1D with 2 workers
at two link rates. pmean SGD and EASGD run as 2 processes joined by a veth pair shaped by
tc's token-bucket filter (``easgd link``); asynchronous EASGD runs in the threads runtime,
each worker behind an emulated link of the same rate (``--link-rate``). Each configuration
also runs once without the slow link (the calibration); the time model
(``easgd.run.predict``) turns the calibration's measured step time and curve into the
predicted time to the target at any rate, with the link latency measured by the probe of
``benchmarks/link_model.py``. Writes ``results.json``, ``results.md`` and ``slow_link.png``
to ``--out``; needs root (network namespaces):

    sudo .venv/bin/python experiments/slow_link.py --out paper_notes/figures/slow_link
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from easgd.parallel import link
from easgd.run import predict, rundir, timing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import link_model  # noqa: E402  (the benchmark's runner and latency probe)

ARMS = (
    ("pmean SGD", "pmean_sgd", []),
    ("EASGD tau=16", "easgd", ["--tau", "16"]),
    ("async EASGD tau=16", "async_easgd", ["--tau", "16"]),
)
RATES = ("100mbit", "10mbit")
TARGET_ERROR = 0.55
EPOCHS = 8
EVAL_EVERY_STEPS = 8
GRID_BIT_S = np.logspace(6, 10, 41)  # 1 Mbit/s to 10 Gbit/s, for the predicted curves


def _rate(bit_s: float) -> str:
  return f"{round(bit_s)}bit"


def _ttt(workdir, times) -> dict:
  return timing.time_to_target(rundir.read_history(Path(workdir)), times, TARGET_ERROR)


def predicted_ttt(calibration, rate, latency_s, solo=None, clock_from=None) -> float:
  """Predicted seconds to the target on a link of ``rate``, from the calibration's curve."""
  sync = solo is None
  out = predict.predict_run(
      calibration,
      rate=rate,
      latency=f"{round(latency_s * 1e6)}us" if sync and latency_s else None,
      num_processes=2 if sync else None,
      solo=solo,
      clock_from=clock_from,
  )
  times = [dict(step=s, time_s=t) for s, t in zip(out["steps"], out["predicted_s"])]
  got = _ttt(calibration, times)["time_s"]
  return math.nan if got is None else got


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default="paper_notes/figures/slow_link")
  p.add_argument("--workdir", default="/tmp/easgd-slow-link")
  p.add_argument(
      "--reuse",
      action="store_true",
      help="keep the runs already complete in --workdir (recompute the predictions only)",
  )
  args = p.parse_args(argv)
  if args.reuse:
    link_model.train = _reusing(link_model.train)
  out, root = Path(args.out), Path(args.workdir)
  out.mkdir(parents=True, exist_ok=True)
  root.mkdir(parents=True, exist_ok=True)
  log = root / "log.txt"
  started = time.time()
  bench = argparse.Namespace(epochs=EPOCHS, eval_every_steps=EVAL_EVERY_STEPS)
  latency = {rate: link_model.probe(root, rate, bench, log) for rate in RATES}
  rows, curves = [], {}
  for name, algorithm, flags in ARMS:
    key = algorithm
    cal = root / f"{key}-calibration"
    link_model.train(cal, algorithm, flags, None, EPOCHS, EVAL_EVERY_STEPS, log)
    solo = clock = None
    if algorithm.startswith("async"):
      # the step times from runs that evaluate at the epochs' ends only (a real asynchronous
      # run evaluates while its workers step): 2 workers, and 1 alone with the same batch
      clock, solo = root / f"{key}-clock", root / f"{key}-solo"
      link_model.train(clock, algorithm, flags, None, EPOCHS, 0, log)
      link_model.train(
          solo,
          algorithm,
          flags + ["--global-batch-size", str(link_model.PER_WORKER_BATCH)],
          None,
          EPOCHS,
          0,
          log,
          1,
      )
    for rate in RATES:
      shaped = root / f"{key}-{rate}"
      link_model.train(shaped, algorithm, flags, rate, EPOCHS, EVAL_EVERY_STEPS, log)
      measured = _ttt(shaped, timing.read_times(shaped))
      rows.append(
          dict(
              algorithm=name,
              rate=rate,
              measured_step=measured["step"],
              measured_s=measured["time_s"],
              bracket_s=measured["bracket_s"],
              predicted_s=predicted_ttt(cal, rate, latency[rate], solo, clock),
              final_test_error=1 - rundir.read_history(shaped)[-1]["test_accuracy"],
          )
      )
      print(json.dumps(rows[-1]), flush=True)
    # the predicted curve over rates: the latency of the nearer probed rate
    lat = [
        latency[min(RATES, key=lambda r: abs(math.log(link.rate_bit_s(r) / b)))] for b in GRID_BIT_S
    ]
    curves[name] = [predicted_ttt(cal, _rate(b), l, solo, clock) for b, l in zip(GRID_BIT_S, lat)]
  result = dict(
      target_error=TARGET_ERROR,
      epochs=EPOCHS,
      eval_every_steps=EVAL_EVERY_STEPS,
      latency_s=latency,
      rows=rows,
      grid_bit_s=GRID_BIT_S.tolist(),
      predicted_curves=curves,
      crossover_bit_s=crossover(curves),
      seconds=round(time.time() - started) + _earlier_seconds(out, args.reuse),
      machine=f"{os.uname().machine}, {os.cpu_count()} CPU cores",
  )
  (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
  (out / "results.md").write_text(table(result) + "\n")
  plot(result, out / "slow_link.png")
  print(table(result))
  return 0


def _earlier_seconds(out: Path, reuse: bool) -> int:
  """The seconds of the runs an invocation with ``--reuse`` keeps (its results.json's)."""
  path = out / "results.json"
  return json.loads(path.read_text())["seconds"] if reuse and path.exists() else 0


def _reusing(train):
  """``train`` that skips a run whose directory holds a complete summary."""

  def run(workdir, *a, **k):
    summary = Path(workdir) / rundir.SUMMARY_FILE
    if summary.exists() and json.loads(summary.read_text()).get("status") == "complete":
      return
    train(workdir, *a, **k)

  return run


def crossover(curves) -> dict:
  """For each elastic arm, the predicted rates (bit/s) where it and pmean SGD reach the
  target at the same time (sign changes of their difference on the grid, interpolated in
  log rate), with which is sooner below the first."""
  out = {}
  base = np.asarray(curves["pmean SGD"])
  for name, values in curves.items():
    if name == "pmean SGD":
      continue
    diff = np.asarray(values) - base  # < 0: the elastic arm is sooner
    x = np.log(GRID_BIT_S)
    crossings = [
        float(np.exp(x[i] + (x[i + 1] - x[i]) * diff[i] / (diff[i] - diff[i + 1])))
        for i in range(len(diff) - 1)
        if np.isfinite(diff[i : i + 2]).all() and diff[i] * diff[i + 1] < 0
    ]
    out[name] = dict(
        crossings_bit_s=crossings,
        sooner_at_lowest_rate=name if diff[0] < 0 else "pmean SGD",
        sooner_at_highest_rate=name if diff[-1] < 0 else "pmean SGD",
    )
  return out


def table(result) -> str:
  """The markdown table of a result."""
  lines = [
      f"Time to test error {result['target_error']} (seconds of the training clock), "
      f"{result['machine']}, {result['seconds']} s in all.",
      "",
      "| algorithm | rate | measured (s) | reached at step | evaluation before (s) "
      "| predicted (s) | predicted / measured |",
      "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
  ]
  for r in result["rows"]:
    m, pr = r["measured_s"], r["predicted_s"]
    lines.append(
        f"| {r['algorithm']} | {r['rate']} | {_f(m)} | {r['measured_step'] or '-'} "
        f"| {_f(r['bracket_s'])} | {_f(pr)} | {_f(pr / m if m else None, 3)} |"
    )
  lines.append("")
  for name, c in result["crossover_bit_s"].items():
    where = ", ".join(f"{x / 1e6:.1f} Mbit/s" for x in c["crossings_bit_s"]) or "none"
    lines.append(
        f"- {name} against pmean SGD (predicted, 1 Mbit/s to 10 Gbit/s): crossings {where}; "
        f"sooner at 1 Mbit/s: {c['sooner_at_lowest_rate']}, at 10 Gbit/s: "
        f"{c['sooner_at_highest_rate']}"
    )
  return "\n".join(lines)


def _f(x, digits=2) -> str:
  return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def plot(result, path) -> None:
  """Predicted time to target against the rate (lines), measured points (markers)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  grid = np.asarray(result["grid_bit_s"]) / 1e6
  for (name, values), color in zip(result["predicted_curves"].items(), ("C0", "C1", "C2")):
    ax.plot(grid, values, color=color, label=f"{name} (predicted)")
    pts = [r for r in result["rows"] if r["algorithm"] == name and r["measured_s"]]
    ax.plot(
        [link.rate_bit_s(r["rate"]) / 1e6 for r in pts],
        [r["measured_s"] for r in pts],
        "o",
        color=color,
        label=f"{name} (measured)",
    )
  ax.set(
      xscale="log",
      yscale="log",
      xlabel="link rate (Mbit/s)",
      ylabel=f"seconds to test error {result['target_error']}",
  )
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  sys.exit(main())
