"""Benchmark: workers x data layouts 8x1, 4x2, 2x4 of 8 devices at one global batch.

Method. For each algorithm (``--algorithms``, default EASGD with ``--tau`` 4
and pmean SGD) and each layout p x D (``--layouts``, default 8x1, 4x2, 2x4)
the trainer's own run is built (``easgd.training.spmd.Run``: digits, MLP,
``--global-batch`` examples per step, so the per-worker batch is global / p
and every device holds global / (p D) examples; ``mapping_backend``
shard_map, ``devices_per_worker`` D). The timed step is the trainer's
``Run.step_fn`` (the host picks the exchange or local program by the clock,
as in training) fed one pre-placed batch of the run's first step (no
host-to-device copy is timed). Timing: ``benchmarks/common.py`` (warm-up,
then every candidate round-robin ``--repeats`` times over ``--steps``
steps, median seconds per step); "ratio" is a candidate's median over the
8x1 layout's of the same algorithm.

Bytes, per worker over ``N`` = ``--steps`` steps (a multiple of tau), in
reduced-buffer sizes (a ring all-reduce puts 2(k-1)/k times this on the
wire for k participants):

  across workers  ``Algorithm.communication(N, param_bytes)``, the
                  ``communication`` of the run's ``summary.json``: EASGD's
                  parameter-sized all-reduce at every tau-th clock, pmean
                  SGD's gradient-sized one every step;
  inside a worker COMPUTED here, not read from the package's accounting:
                  for D > 1, one gradient (``param_bytes``) averaged over the
                  worker's D devices every step, ``N * param_bytes`` (0 for
                  D = 1); ``data_parallel_loss`` also averages the 4-byte
                  loss, left out.

"HLO AR B/step" is a check from the compiled programs: the mean over
the N steps' programs of the all-reduce result bytes per device
(``common.collectives``), both levels together; "check" says whether N times
it equals the two columns' sum plus, for D > 1, the 4-byte loss averaged over
"data" every step.

On fake CPU devices every "device" is a slice of the same CPU cores, and a
collective is a copy in memory: the step times measure the programs (their
collectives' count and size and the work per device), not an interconnect.

Run: ``python benchmarks/mesh_layouts.py [--layouts 8x1,4x2,2x4 --steps 20]``.
"""

from __future__ import annotations

import argparse
import datetime

from common import force_cpu_devices

NUM_DEVICES = 8


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layouts", default="8x1,4x2,2x4", help="workers x data, comma-separated")
  ap.add_argument("--algorithms", default="easgd,pmean_sgd")
  ap.add_argument("--tau", type=int, default=4)
  ap.add_argument("--global-batch", type=int, default=256, help="examples per step, all workers")
  ap.add_argument("--steps", type=int, default=20, help="steps per timed call (N)")
  ap.add_argument("--repeats", type=int, default=5, help="timed calls per candidate")
  ap.add_argument("--warmup", type=int, default=1, help="untimed calls per candidate")
  args = ap.parse_args()
  force_cpu_devices(NUM_DEVICES)

  import common
  from easgd.training.config import TrainConfig
  from easgd.training.spmd import Run, SpmdExecutor

  layouts = [tuple(int(v) for v in s.split("x")) for s in args.layouts.split(",")]
  algorithms = [a.strip() for a in args.algorithms.split(",")]
  n = args.steps
  if n % args.tau:
    raise SystemExit(f"--steps {n} must be a multiple of --tau {args.tau}")
  calls = args.warmup + args.repeats
  cands, rows = {}, {}
  for algorithm in algorithms:
    for p, d in layouts:
      config = TrainConfig(
          dataset="digits",
          model="mlp",
          algorithm=algorithm,
          num_workers=p,
          global_batch_size=args.global_batch,
          num_epochs=1000,  # longer than the timed steps: no end-of-run program
          tau=args.tau,
          mapping_backend="shard_map",
          devices_per_worker=d,
          progress=False,
      )
      run = Run(config)
      executor = SpmdExecutor(run)
      executor.initial_state()
      batch = executor._batch(0)
      worker, shared = executor.worker, executor.shared
      flags = [
          None if run.algorithm.exchange_at is None else bool(run.algorithm.exchange_at(t))
          for t in range(n)
      ]
      hlo = {
          flag: common.collectives(
              f.lower(worker, shared, batch, run.step_key).compile().as_text()
          )["always"]["bytes"]
          for flag, f in run.step_fn.programs.items()
      }
      comm = run.algorithm.communication(n, run.param_bytes)
      name = f"{algorithm} {p}x{d}"
      cands[name] = common.step_loop(
          run.step_fn, (worker, shared), batch, run.step_key, clock=True
      )[0]
      rows[name] = dict(
          algorithm=algorithm,
          layout=(p, d),
          describe=run.layout.describe(),
          per_device_batch=config.per_worker_batch_size // d,
          across=comm.bytes,
          across_count=comm.all_reduces,
          inside=n * run.param_bytes if d > 1 else 0,
          hlo_per_step=sum(hlo[f] for f in flags) / n,
          check=sum(hlo[f] for f in flags)
          == comm.bytes + (n * (run.param_bytes + 4) if d > 1 else 0),
          param_bytes=run.param_bytes,
      )
      if run.total_steps < calls * n:
        raise SystemExit(f"{name}: {run.total_steps} steps in the run, fewer than timed")
  timing = common.time_side_by_side(cands, n, args.repeats, args.warmup)
  first = next(iter(rows.values()))
  print(f"# mesh layouts  ({datetime.date.today()}; {common.machine()})")
  print(
      f"# digits MLP ({first['param_bytes']} param bytes), global batch {args.global_batch}, "
      f"tau={args.tau}; {n} steps x {args.repeats} repeats (after {args.warmup} warm-up), "
      "median; bytes per worker over N="
      f"{n} steps"
  )
  print(
      f"{'candidate':16s} {'B/device':>8s} {'ms/step':>8s} {'spread':>7s} {'ratio':>6s} "
      f"{'across-workers B (AR)':>22s} {'inside-worker B*':>17s} {'HLO AR B/step':>14s} {'check':>6s}"
  )
  for name, row in rows.items():
    base = f"{row['algorithm']} {layouts[0][0]}x{layouts[0][1]}"
    t = timing[name]
    across = f"{row['across']} ({row['across_count']})"
    print(
        f"{name:16s} {row['per_device_batch']:8d} {1e3 * t['median_s']:8.2f} "
        f"{common.spread(t['all_s']):>7s} {t['median_s'] / timing[base]['median_s']:6.2f} "
        f"{across:>22s} {row['inside']:17d} "
        f"{row['hlo_per_step']:14.1f} {'match' if row['check'] else 'DIFFER':>6s}"
    )
  print(
      "# ratio: median step time over the first layout's of the same algorithm; across-workers"
      " B (AR): the run summary's communication (Algorithm.communication: bytes and all-reduces"
      " per worker); *inside-worker B: computed as N x param_bytes for D > 1 (one gradient"
      " averaged over the worker's devices per step), not the package's accounting; HLO AR"
      " B/step: all-reduce bytes per device per step in the compiled programs, both levels"
  )
  for name, row in rows.items():
    print(f"#   {name}: {row['describe']}")


if __name__ == "__main__":
  main()
