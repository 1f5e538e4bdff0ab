"""Benchmark: workers x data layouts 8x1, 4x2, 2x4 of 8 devices at one global batch.

Method. For each algorithm (``--algorithms``, default EASGD with ``--tau`` 4
and pmean SGD) and each layout p x D (``--layouts``, default 8x1, 4x2, 2x4)
the trainer's own run is built (``easgd.runtimes.training_run.Run``: digits, MLP,
``--global-batch`` examples per step, so the per-worker batch is global / p
and every device holds global / (p D) examples; ``mapping_backend``
shard_map, ``devices_per_worker`` D). The timed step is the trainer's
``Run.step_fn`` (the host picks the exchange or local program by the clock,
as in training) fed one pre-placed batch of the run's first step (no
host-to-device copy is timed). Timing: ``benchmarks/common.py`` (warm-up,
then every candidate round-robin ``--repeats`` times over ``--steps``
steps, median seconds per step); "ratio" is a candidate's median over the
8x1 layout's of the same algorithm.

Bytes, per device over ``N`` = ``--steps`` steps (a multiple of tau), in
reduced-buffer sizes (a ring all-reduce puts 2(k-1)/k times this on the
wire for k participants), from the package's accounting
(``easgd.parallel.accounting.communication_by_level``, the run summary's
``communication.by_axis``):

  across workers  the algorithm's own count (``Algorithm.communication``):
                  EASGD's parameter-sized all-reduce at every tau-th clock,
                  pmean SGD's gradient-sized one every step;
  inside a worker for D > 1, one all-reduce per step over the worker's D
                  devices of the gradient and the 4-byte loss (0 for D = 1).

"HLO AR B/step" is a check from the compiled programs: the mean over
the N steps' programs of the all-reduce result bytes per device
(``common.collectives``), both levels together; "check" says whether N times
it equals the two columns' sum.

Modelled time to target on a two-level network (second table). From a
protocol's ``results.json`` (``--results``, default the committed Figure 2
run: p = 4 workers of 32 examples) the mean local steps to the first
evaluation at or below ``--target`` test error of pmean SGD and of EASGD at
tau in {1, 4, 16}, over the report seeds that reached it; each modelled on
``easgd.protocol.networks.NVLINK_NODES_100GBE`` (nodes of 8 devices,
NVLink-class inside, 100 Gbit/s between) in three layouts of the same 4
workers: "4x1" one device per worker, the 4 workers on one node (every
all-reduce inside it); "4x8" one worker per node, its 32 examples split
over the node's 8 devices (the gradient averaged inside the node every
step, the algorithm's exchange between nodes); "32x1 flat" pmean SGD only,
the same global batch over 32 devices as 32 workers, one all-reduce group
spanning the 4 nodes every step. Compute per step: the results' measured
seconds of one worker's step on the machine that made them (not divided
among a worker's devices); the all-reduces: the steps' counts from the
accounting above, ``TwoLevelNetwork.modelled_seconds``. ``--model-bytes``
repeats the table with every all-reduce's bytes scaled to another parameter
size (default also 4e8 bytes, a 100M-parameter float32 model) at the same
steps and compute: what the same run would communicate with a large model,
where the slow link is the one that matters (a model, not a measurement).

On fake CPU devices every "device" is a slice of the same CPU cores, and a
collective is a copy in memory: the step times measure the programs (their
collectives' count and size and the work per device), not an interconnect.

With ``--real-devices`` the layouts run on the machine's own devices (a host
with 8 GPUs: the step times then measure its interconnect too);
``benchmarks/gpu_check.py`` runs it so on a machine of several GPUs.

Run: ``python benchmarks/mesh_layouts.py [--layouts 8x1,4x2,2x4 --steps 20]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from common import force_cpu_devices

NUM_DEVICES = 8
FIG2 = Path(__file__).resolve().parent.parent / "paper_notes/figures/protocol_fig2/results.json"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layouts", default="8x1,4x2,2x4", help="workers x data, comma-separated")
  ap.add_argument("--algorithms", default="easgd,pmean_sgd")
  ap.add_argument("--tau", type=int, default=4)
  ap.add_argument("--global-batch", type=int, default=256, help="examples per step, all workers")
  ap.add_argument("--steps", type=int, default=20, help="steps per timed call (N)")
  ap.add_argument("--repeats", type=int, default=5, help="timed calls per candidate")
  ap.add_argument("--warmup", type=int, default=1, help="untimed calls per candidate")
  ap.add_argument("--real-devices", action="store_true", help="the machine's devices, not fakes")
  ap.add_argument("--results", default=str(FIG2), help="protocol results.json (second table)")
  ap.add_argument("--target", type=float, default=0.3, help="test error of the second table")
  ap.add_argument(
      "--model-bytes",
      default="0,400000000",
      help="parameter bytes modelled in the second table (0: the results' own model)",
  )
  ap.add_argument("--modelled-only", action="store_true", help="the second table only")
  args = ap.parse_args(argv)
  if args.modelled_only:
    modelled_time_to_target(Path(args.results), args.target, common_ints(args.model_bytes))
    return
  if not args.real_devices:
    force_cpu_devices(NUM_DEVICES)

  import common

  from easgd.parallel import accounting
  from easgd.runtimes.spmd import SpmdExecutor
  from easgd.runtimes.training_run import Run
  from easgd.settings.config import TrainConfig

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
      levels = accounting.communication_by_level(run.algorithm, n, run.param_bytes, d)
      comm = levels.across_workers
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
          inside=levels.within_workers.bytes,
          hlo_per_step=sum(hlo[f] for f in flags) / n,
          check=sum(hlo[f] for f in flags) == comm.bytes + levels.within_workers.bytes,
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
      f"{'across-workers B (AR)':>22s} {'inside-worker B':>17s} {'HLO AR B/step':>14s} {'check':>6s}"
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
      " per worker); inside-worker B: one all-reduce of the gradient and the loss per step for"
      " D > 1 (workers.communication_by_level); HLO AR B/step: all-reduce bytes per device per"
      " step in the compiled programs, both levels"
  )
  for name, row in rows.items():
    print(f"#   {name}: {row['describe']}")
  modelled_time_to_target(Path(args.results), args.target, common_ints(args.model_bytes))


def common_ints(text: str) -> list[int]:
  return [int(float(v)) for v in text.split(",")]


def modelled_time_to_target(path: Path, target: float, model_bytes: list[int]) -> None:
  """The second table (module docstring): pmean SGD against EASGD at tau in
  {1, 4, 16}, modelled on nodes of 8 devices, from a protocol's results; for
  each parameter size of ``model_bytes`` (0: the results' own), the same
  steps and compute with every all-reduce's bytes scaled to that size."""
  from easgd.parallel import accounting
  from easgd.protocol.networks import NVLINK_NODES_100GBE as net

  results = json.loads(path.read_text())
  compute = results["compute_per_step_s"]
  arms = {
      name: a
      for name, a in results["arms"].items()
      if a["algorithm"] == "pmean_sgd"
      or (a["algorithm"] == "easgd" and a["config"].get("tau") in (1, 4, 16))
  }
  own = results["param_bytes"]
  for size in model_bytes:
    _modelled_table(results, arms, compute, net, accounting, target, path, size or own, own)


def _modelled_table(results, arms, compute, net, accounting, target, path, size, own):
  scale = size / own
  print(
      f"# modelled time to {100 * target:g}% test error on {net.name} (nodes of "
      f"{net.devices_per_node}: {net.inside.name} inside, {net.between.name} between), steps"
      f" from {path.name} of {results['protocol']['name']} (param bytes: {size}"
      + ("" if size == own else f", modelled: the run's {own} scaled x {scale:.4g}")
      + ")"
  )
  print(
      f"{'arm':16s} {'steps':>7s} {'reached':>7s} {'4x1 s':>8s} {'4x8 s':>8s} {'32x1 flat s':>11s}"
  )
  for name, a in arms.items():
    reach = a["time_to_target"].get(str(target))
    if not reach or not reach["reached"]:
      print(f"{name:16s} {'-':>7s} {'0/' + str(reach['n'] if reach else 0):>7s}")
      continue
    s_ = reach["summary"]
    steps = s_["steps"]["mean"]
    config = dict(a["config"])
    p = config["num_workers"]
    step_s = compute[str(config["global_batch_size"] // p)]
    times = {}
    if p != 4:
      raise SystemExit(f"{path}: the table's layouts are of 4 workers; {name} has {p}")
    for label, (workers_, d) in (("4x1", (p, 1)), ("4x8", (p, 8)), ("32x1", (8 * p, 1))):
      if label == "32x1" and a["algorithm"] != "pmean_sgd":
        continue
      n = int(round(steps))
      across = (s_["all_reduces"]["mean"], scale * s_["bytes"]["mean"])  # per worker, at target
      within = (n, n * (size + accounting.LOSS_BYTES)) if d > 1 else (0, 0)
      times[label] = net.modelled_seconds(
          n, step_s, across=across, within=within, num_workers=workers_, devices_per_worker=d
      )
    flat = f"{times['32x1']:11.3f}" if "32x1" in times else f"{'-':>11s}"
    print(
        f"{name:16s} {steps:7.1f} {reach['reached']:>3d}/{reach['n']:<3d} {times['4x1']:8.3f} "
        f"{times['4x8']:8.3f} {flat}"
    )
  print(
      "# steps: mean over the report seeds that reached the target; seconds: steps x the"
      " measured compute per step + each level's all-reduces on its link (ring model,"
      " TwoLevelNetwork docstring); the 4x8 and 32x1 layouts are modelled, not run here"
  )


if __name__ == "__main__":
  main()
