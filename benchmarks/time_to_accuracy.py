"""Benchmark 4: time to accuracy on Fashion-MNIST under a network cost model.

Method. The trainer's pieces (``easgd.runtimes.training_run.Run``: data, MLP, local SGD
optimizer, mapped step and exact center evaluation) train EASGD with each tau
of ``--taus`` and pmean SGD, ``--workers`` workers on ``--devices`` fake CPU
devices, global batch ``--global-batch``, constant learning rate ``--lr``, for
``--epochs`` epochs. The center's test accuracy (all 10000 test images) is
evaluated every ``--eval-every-steps`` steps, giving steps-to-target: the first
evaluated step with accuracy >= ``--target-accuracy``. Loops wait for each
step's loss one step late (``common.one_step_late``).

Time is modeled, because this machine's devices share memory (an all-reduce
costs almost nothing here):

  time(steps) = steps * step_s  +  A * latency  +  bytes / bandwidth

  step_s  the median wall time of one step of that algorithm ON THIS MACHINE,
          measured side by side after training (``benchmarks/common.py``:
          warm-up, round-robin repeats, median);
  A, bytes  all-reduces and payload bytes per worker after ``steps`` steps, from
          the trainer's accounting ``Algorithm.communication`` (checked against
          the compiled HLO by ``benchmarks/communication.py``);
  latency, bandwidth  per network, ``--network NAME:LATENCY_US:GBIT_PER_S``
          (repeatable); each all-reduce pays one latency plus its bytes over
          the bandwidth (the simple model of the issue; a ring all-reduce would
          put 2 (p - 1) / p times the bytes on the wire).

Run: ``python benchmarks/time_to_accuracy.py [--epochs 2 --taus 1,4,16]``.
"""

from __future__ import annotations

import argparse
import datetime

from common import force_cpu_devices

DEFAULT_NETWORKS = ("shared-memory:0:inf", "datacenter-100GbE:10:100", "1GbE:100:1")


def parse_network(text):
  name, lat, bw = text.split(":")
  return name, float(lat) * 1e-6, float(bw) * 1e9 / 8  # seconds, bytes/s


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--devices", type=int, default=2)
  ap.add_argument("--workers", type=int, default=4)
  ap.add_argument("--global-batch", type=int, default=128)
  ap.add_argument("--epochs", type=int, default=2)
  ap.add_argument("--lr", type=float, default=0.05)
  ap.add_argument("--taus", default="1,4,16")
  ap.add_argument("--model", default="mlp")
  ap.add_argument("--target-accuracy", type=float, default=0.84)
  ap.add_argument("--eval-every-steps", type=int, default=78)
  ap.add_argument(
      "--network",
      action="append",
      default=None,
      help="NAME:LATENCY_US:GBIT_PER_S (repeatable); default: " + ", ".join(DEFAULT_NETWORKS),
  )
  ap.add_argument("--data-dir", default=None, help="Fashion-MNIST IDX directory")
  ap.add_argument("--steps", type=int, default=30, help="steps per timed call")
  ap.add_argument("--repeats", type=int, default=7)
  args = ap.parse_args()
  force_cpu_devices(args.devices)

  import common
  import jax

  from easgd.parallel import placement
  from easgd.runtimes.training_run import Run
  from easgd.settings.config import TrainConfig
  from easgd.tasks import batches

  networks = [parse_network(n) for n in (args.network or DEFAULT_NETWORKS)]
  base = TrainConfig(
      dataset="fashion_mnist",
      data_dir=args.data_dir,
      model=args.model,
      num_workers=args.workers,
      num_devices=args.devices,
      global_batch_size=args.global_batch,
      num_epochs=args.epochs,
      learning_rate=args.lr,
      beta=0.9,
      eval_batch_size=500,
      progress=False,
  )
  configs = [
      (f"easgd tau={t}", base.replace(algorithm="easgd", tau=t)) for t in common.int_list(args.taus)
  ]
  configs.append(("pmean_sgd", base.replace(algorithm="pmean_sgd")))

  results, timers = [], {}
  for label, cfg in configs:
    run = Run(cfg)
    worker, shared = run.initial_state()
    curve = [(0, run.evaluate(worker, shared, 0, 0, None)["test_accuracy"])]
    step, last = 0, None
    for epoch in range(1, cfg.num_epochs + 1):
      order = batches.worker_batch_indices(
          len(run.task.train), cfg.num_workers, cfg.per_worker_batch_size, cfg.seed, epoch
      )
      for ix in order:
        batch = placement.split_workers(run.task.train.take(ix), run.layout)
        worker, shared, loss = run.step_fn(worker, shared, batch, run.step_key, step)
        last = common.one_step_late(last, loss)
        step += 1
        if step % args.eval_every_steps == 0 or step == run.total_steps:
          curve.append((step, run.evaluate(worker, shared, epoch, step, None)["test_accuracy"]))
    results.append((label, run, curve))
    timers[label] = _step_timer(run, worker, shared, batch, jax)
  step_s = {
      k: v["median_s"]
      for k, v in common.time_side_by_side(timers, args.steps, args.repeats).items()
  }

  run0 = results[0][1]
  print(f"# time to accuracy, Fashion-MNIST  ({datetime.date.today()}; {common.machine()})")
  print(
      f"# {run0.layout.describe()}; model {args.model} ({run0.param_bytes} param bytes);"
      f" global batch {args.global_batch}; lr {args.lr}; {args.epochs} epochs "
      f"({run0.total_steps} steps); center evaluated every {args.eval_every_steps} steps "
      f"on 10000 test images; target accuracy {args.target_accuracy}"
  )
  print(
      f"{'algorithm':14s} {'ms/step':>8s} {'final acc':>9s} {'best acc':>8s} "
      f"{'steps to target':>15s} {'all-reduces/step':>16s}"
  )
  reached = {}
  for label, run, curve in results:
    hit = next((s for s, a in curve if a >= args.target_accuracy), None)
    reached[label] = hit
    comm = run.algorithm.communication(run.total_steps, run.param_bytes)
    print(
        f"{label:14s} {1e3 * step_s[label]:8.3f} {curve[-1][1]:9.4f} "
        f"{max(a for _, a in curve):8.4f} {str(hit) if hit else 'not reached':>15s} "
        f"{comm.all_reduces / run.total_steps:16.4f}"
    )
  print(
      f"# modeled seconds to reach {args.target_accuracy} (compute here + network "
      f"model); in brackets: the network's share"
  )
  header = f"{'algorithm':14s}" + "".join(f" {n:>26s}" for n, _, _ in networks)
  print(header)
  for label, run, _ in results:
    cells = []
    for _, lat, bw in networks:
      hit = reached[label]
      if hit is None:
        cells.append("not reached")
        continue
      comm = run.algorithm.communication(hit, run.param_bytes)
      net = comm.all_reduces * lat + comm.bytes / bw
      cells.append(f"{hit * step_s[label] + net:.2f} s [{net:.2f} s]")
    print(f"{label:14s}" + "".join(f" {c:>26s}" for c in cells))
  print("# accuracy curve (step: center test accuracy)")
  for label, _, curve in results:
    print(f"{label:14s} " + " ".join(f"{s}:{a:.3f}" for s, a in curve))


def _step_timer(run, worker, shared, batch, jax):
  import common

  state = {"w": worker, "s": shared, "clock": 0}

  def timed(steps):
    w, s, last = state["w"], state["s"], None
    for _ in range(steps):
      w, s, loss = run.step_fn(w, s, batch, run.step_key, state["clock"])
      state["clock"] += 1
      last = common.one_step_late(last, loss)
    jax.block_until_ready((w, s))
    state["w"], state["s"] = w, s

  return timed


if __name__ == "__main__":
  main()
