"""The time model against the shaped link: predicted / measured training clock, side by side.

Method. Each configuration runs three times in one invocation: once without a slow link
(the calibration: its measured seconds per step are the model's input), then once on each
link rate. Synchronous programs (pmean SGD, EASGD, DiLoCo) run as 2 processes of 1 worker
each in network namespaces joined by a veth pair shaped by tc's token-bucket filter
(``easgd link``; the calibration at 10gbit, which these processes cannot fill); asynchronous
EASGD runs in the threads runtime, 2 workers each behind its own emulated link
(``--link-rate``; the calibration without one, and a run of one worker alone for the
step time of a worker that computes while the other waits on its link). The measured value is the run's training
clock (``times.jsonl``: steps, evaluations and compilation excluded) at its last evaluation
(evaluations at the epochs' ends only: a real asynchronous run evaluates while its workers
take steps, which would slow the calibration's workers more than the link run's);
the prediction is ``easgd.run.predict.predict_run`` of the calibration run on the link. The
queue of the shaped link is deep enough for a whole exchange (``--latency 1s`` of tbf:
at 10mbit 1.25 MB, the exchange 0.32 MB), so that no packet is dropped (a drop costs TCP a
retransmission the model does not have; see docs/guides/slow_link.md).

Needs root (network namespaces). Writes ``--out`` (JSON) and prints a markdown table.

    sudo .venv/bin/python benchmarks/link_model.py --out benchmarks/link_model.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from easgd.run import predict

CALIBRATION_RATE = "10gbit"
QUEUE = "1s"  # tbf's latency: the queue (rate x 1 s) holds a whole exchange
PER_WORKER_BATCH = 64
TRAIN = ["--model", "mlp", "--no-progress", "--seed", "0"]
PROBE = ("easgd tau=4", "easgd", ["--tau", "4"])
"""The probe of each link's latency (not one of the configurations): its measured clock
minus the model's without latency, per exchange."""


def configurations(rates, taus):
  """(name, algorithm, train flags) of every configuration."""
  out = [("pmean_sgd", "pmean_sgd", [])]
  for algorithm in ("easgd", "diloco", "async_easgd"):
    for tau in taus:
      out.append((f"{algorithm} tau={tau}", algorithm, ["--tau", str(tau)]))
  return [(n, a, f, r) for n, a, f in out for r in rates]


def _run(cmd, log):
  with open(log, "a") as f:
    f.write("+ " + " ".join(cmd) + "\n")
    f.flush()
    rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
  if rc:
    raise SystemExit(f"failed ({rc}): {' '.join(cmd)}; see {log}")


def train(workdir, algorithm, flags, rate, epochs, eval_every, log, workers=2):
  """Runs one configuration on the link of ``rate`` (None: calibration)."""
  common = [
      "train",
      "--workdir",
      str(workdir),
      "--overwrite",
      "--algorithm",
      algorithm,
      "--num-epochs",
      str(epochs),
      "--eval-every-steps",
      str(eval_every),
      *TRAIN,
      *flags,
      "--num-workers",
      str(workers),
  ]
  easgd = [sys.executable, "-m", "easgd.cli"]
  if algorithm.startswith("async"):
    link = [] if rate is None else ["--link-rate", rate]
    _run([*easgd, *common, "--runtime", "threads", "--cpu-devices", "2", *link], log)
  else:
    _run(
        [
            *easgd,
            "link",
            "--rate",
            rate or CALIBRATION_RATE,
            "--latency",
            QUEUE,
            "--num-processes",
            "2",
            "--",
            *common,
            "--cpu-devices",
            "1",
            "--mapping-backend",
            "shard_map",
        ],
        log,
    )


def probe(root, rate, args, log) -> float:
  """The latency of the link of ``rate`` (seconds per exchange): the :data:`PROBE` run
  measured on it, minus the model's clock without latency, over its exchanges."""
  _, algorithm, flags = PROBE
  cal, shaped = root / "probe-calibration", root / f"probe-{rate}"
  if not (cal / "times.jsonl").exists():
    train(cal, algorithm, flags, None, args.epochs, args.eval_every_steps, log)
  train(shaped, algorithm, flags, rate, args.epochs, args.eval_every_steps, log)
  pred = predict.predict_run(cal, rate=rate, num_processes=2)
  meas = predict.predict_run(shaped, rate=rate, num_processes=2)["measured_s"][-1]
  exchanges = pred["all_reduces"][-1]  # those on the clock, to the last evaluation
  return max(0.0, (meas - pred["predicted_s"][-1]) / exchanges)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rates", default="100mbit,10mbit")
  p.add_argument("--taus", default="1,16")
  p.add_argument("--epochs", type=int, default=3)
  p.add_argument("--eval-every-steps", type=int, default=0)
  p.add_argument("--workdir", default="/tmp/easgd-link-model")
  p.add_argument("--out", default="benchmarks/link_model.json")
  args = p.parse_args(argv)
  root = Path(args.workdir)
  root.mkdir(parents=True, exist_ok=True)
  log = root / "log.txt"
  rates = args.rates.split(",")
  taus = [int(t) for t in args.taus.split(",")]
  rows, started = [], time.time()
  calibrated, solo, latency = {}, {}, {}
  for name, algorithm, flags, rate in configurations(rates, taus):
    key = name.replace(" ", "_").replace("=", "")
    # the runs with few exchanges are short: twice the epochs, for a clock of seconds
    epochs = args.epochs * (2 if "--tau" in flags and int(flags[1]) >= 16 else 1)
    if key not in calibrated:
      calibrated[key] = root / f"{key}-calibration"
      train(calibrated[key], algorithm, flags, None, epochs, args.eval_every_steps, log)
      if algorithm.startswith("async"):  # one worker computing alone: its step time
        solo[key] = root / f"{key}-solo"
        train(
            solo[key],
            algorithm,
            flags + ["--global-batch-size", str(PER_WORKER_BATCH)],
            None,
            epochs,
            args.eval_every_steps,
            log,
            1,
        )
    shaped = root / f"{key}-{rate}"
    train(shaped, algorithm, flags, rate, epochs, args.eval_every_steps, log)
    framing = not algorithm.startswith("async")
    if framing and rate not in latency:
      latency[rate] = probe(root, rate, args, log)
    pred = predict.predict_run(
        calibrated[key],
        rate=rate,
        latency=f"{round(latency[rate] * 1e6)}us" if framing else None,
        num_processes=2 if framing else None,
        solo=solo.get(key),
    )
    meas = predict.predict_run(shaped, rate=rate, num_processes=2 if framing else None)
    rows.append(
        dict(
            configuration=name,
            rate=rate,
            link="tbf (2 processes)" if framing else "emulated (threads)",
            step_ms=1e3 * statistics.mean(pred["step_s"]),
            latency_ms=1e3 * latency[rate] if framing else 0.0,
            predicted_s=pred["predicted_s"][-1],
            measured_s=meas["measured_s"][-1],
            calibration_s=pred["measured_s"][-1],
        )
    )
    rows[-1]["ratio"] = rows[-1]["predicted_s"] / rows[-1]["measured_s"]
    print(json.dumps(rows[-1]), flush=True)
  ratios = [r["ratio"] for r in rows]
  result = dict(
      rows=rows,
      median_ratio=statistics.median(ratios),
      min_ratio=min(ratios),
      max_ratio=max(ratios),
      seconds=round(time.time() - started),
      machine=f"{os.uname().machine}, {os.cpu_count()} CPU cores",
  )
  Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
  print(table(result))
  return 0


def table(result) -> str:
  """The markdown table of a result."""
  lines = [
      "| configuration | link | rate | step (ms, calibration) | latency (ms, probe) "
      "| predicted (s) | measured (s) "
      "| predicted / measured |",
      "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
  ]
  for r in result["rows"]:
    lines.append(
        f"| {r['configuration']} | {r['link']} | {r['rate']} | {r['step_ms']:.2f} "
        f"| {r['latency_ms']:.2f} "
        f"| {r['predicted_s']:.2f} | {r['measured_s']:.2f} | {r['ratio']:.3f} |"
    )
  lines.append(
      f"\nmedian {result['median_ratio']:.3f}, range [{result['min_ratio']:.3f}, "
      f"{result['max_ratio']:.3f}], {len(result['rows'])} configurations, "
      f"{result['seconds']} s ({result['machine']})"
  )
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
