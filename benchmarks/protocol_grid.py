"""How much faster is the protocol's one-program grid than the same configurations one by one?

Method (measured side by side in ONE process, interleaved, so that they share
the machine's load):

  Work: the EASGD arms of experiments/protocol_fig2.py, the tuning grid of
  tau in {1, 4, 16, 64} x 5 learning rates x 3 seeds = 60 configurations (or
  the first --configs of them), MNIST-1D, the small CNN, p = 4, 32 examples
  per worker per step, 8 epochs = 432 local steps, 1000 training signals held
  out for validation; --epochs shortens every run alike.

  A  one program   easgd.protocol.programs.run_program: every configuration in one
                   compiled step program (the rate, seed and tau traced),
                   called for chunks of --configs-per-batch configurations;
                   the validation error every 27 steps (what the protocol
                   runs to tune these arms).
  B  one by one,   easgd.train_and_evaluate for each configuration: its own
     the trainer   compiled programs (rate and tau Python constants), the
                   validation and test error every epoch, a checkpoint every
                   epoch: what running the grid with the package's trainer
                   costs.
  C  one by one,   easgd.protocol.programs.run_program with ONE configuration per call:
     own program   the protocol's own program, compiled for each configuration
                   (what the grid costs without batching configurations, and
                   without the trainer's checkpoints and host loop).

  No persistent compilation cache (every variant compiles what it needs, as a
  fresh grid would). The variants run in the order A, B, C (B and C in
  slices interleaved with each other); each is timed with time.perf_counter
  around calls that end on host values. The ratios B / A and C / A are
  reported, and the largest difference between A's and B's final validation
  errors over the configurations no variant saw diverge (the same
  configurations: equal up to float32 rounding; near divergence, rounding
  decides whether a run diverges, so those are counted, not compared). A run
  the trainer stops as diverged (its error NaN) counts the time until it
  stopped, so B's total is then a lower bound.

Run:  .venv/bin/python benchmarks/protocol_grid.py [--configs 60] [--epochs 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import common  # noqa: F401  (puts the repository on sys.path)
import numpy as np

from easgd import train_and_evaluate
from easgd.protocol import programs
from easgd.protocol import runs as protocol
from easgd.protocol.config import load_protocol_file
from easgd.runtimes.divergence import DivergenceError


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", type=int, default=60)
  parser.add_argument("--epochs", type=int, default=8)
  parser.add_argument("--configs-per-batch", type=int, default=4)
  parser.add_argument("--out", default=None, help="write the figures as JSON here")
  args = parser.parse_args(argv)
  import dataclasses

  config = load_protocol_file("experiments/protocol_fig2.py")
  config = dataclasses.replace(
      config,
      base=config.base.replace(num_epochs=args.epochs),
      configs_per_batch=args.configs_per_batch,
  )
  easgd_arms = tuple(a for a in config.arms if a.algorithm == "easgd")
  config = dataclasses.replace(config, arms=easgd_arms).validate()
  seeds = programs.SeedData(config.base, config.tune_seeds)
  runs = programs.prepare(config, seeds.num_train)
  group = [runs[a.name] for a in easgd_arms]
  configs = [
      dict(arm=r.arm.name, learning_rate=lr, seed=s)
      for r in group
      for lr in r.arm.learning_rates
      for s in config.tune_seeds
  ][: args.configs]
  print(f"{len(configs)} configurations x {group[0].num_steps} steps", flush=True)

  start = time.perf_counter()
  out, info = programs.run_program(group, configs, seeds, "tune", config)
  a_s = time.perf_counter() - start
  print(f"A one program: {a_s:.1f} s ({info['compile_s']:.1f} s compiling)", flush=True)

  b_s = c_s = 0.0
  b_err, c_err = [], []
  b_diverged = 0
  c_div = []
  for i, c in enumerate(configs):
    r = runs[c["arm"]]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
      try:
        summary = train_and_evaluate(
            r.config.replace(learning_rate=c["learning_rate"], seed=c["seed"]), workdir
        )
        b_err.append(summary["final"]["val_error"])
      except DivergenceError:  # the trainer stops there: B's time is then a lower bound
        b_err.append(float("nan"))
        b_diverged += 1
    b_s += time.perf_counter() - start
    start = time.perf_counter()
    one, _ = programs.run_program([r], [c], seeds, "tune", config)
    c_s += time.perf_counter() - start
    c_err.append(float(one["curves"]["val_error"][0, -1]))
    c_div.append(protocol._diverged(one["curves"]["val_loss"][0], config.divergence_factor))
    print(f"  {i + 1}/{len(configs)}: B {b_s:.1f} s, C {c_s:.1f} s", flush=True)
  a_err = out["curves"]["val_error"][:, -1]
  a_div = [protocol._diverged(loss, config.divergence_factor) for loss in out["curves"]["val_loss"]]
  b_err, c_err = np.asarray(b_err), np.asarray(c_err)
  # the runs no variant saw diverge (near divergence float32 rounding decides)
  calm = np.asarray([not (a or c) for a, c in zip(a_div, c_div)]) & np.isfinite(b_err)
  result = dict(
      configs=len(configs),
      steps=group[0].num_steps,
      one_program_s=round(a_s, 1),
      one_program_compile_s=info["compile_s"],
      trainer_one_by_one_s=round(b_s, 1),
      own_program_one_by_one_s=round(c_s, 1),
      ratio_trainer=round(b_s / a_s, 2),
      ratio_own_program=round(c_s / a_s, 2),
      trainer_runs_stopped_by_divergence=b_diverged,
      runs_diverged=dict(
          one_program=int(sum(a_div)), trainer=b_diverged, own_program=int(sum(c_div))
      ),
      max_val_error_difference_trainer=float(np.max(np.abs(a_err - b_err)[calm])),
      max_val_error_difference_own_program=float(np.max(np.abs(a_err - c_err)[calm])),
      val_errors=dict(
          one_program=a_err.tolist(), trainer=b_err.tolist(), own_program=c_err.tolist()
      ),
      machine=common.machine(),
  )
  print(json.dumps(result, indent=1))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
