"""Benchmark 3: all-reduces and bytes per step of each algorithm, read from HLO.

Method. Every algorithm of ``easgd.algorithms.ALGORITHMS`` is built as the
trainer builds it (``easgd.trainer.make_algorithm``, plain SGD, ``--tau``,
beta 0.9, momentum 0.9 where used) for ``--workers`` workers on ``--devices``
fake CPU devices, and its mapped step (``easgd.workers.map_workers``) is
lowered and compiled. In the compiled program's HLO text we count the
``all-reduce`` ops and their result sizes (= operand sizes) per device, split
into those that run on every step (reachable from ENTRY without passing a
``conditional``) and those inside a conditional's branches (EASGD: the
exchange, taken when tau divides the clock). Other collectives (all-gather,
reduce-scatter, collective-permute, all-to-all) are counted too.

Check against the trainer's own accounting, ``Algorithm.communication(N,
param_bytes)`` over N = 8 tau steps: the HLO predicts
``N * always_bytes + (N / tau) * conditional_bytes`` bytes per device for the
algorithms whose exchange is a conditional every tau steps (easgd, eamsgd,
local_sgd, diloco) and ``N * always_bytes`` for the rest; with w workers per
device the vmapped workers' sum is formed before the cross-device all-reduce,
so the per-device payload equals the per-worker payload the accounting counts.
The asynchronous algorithms are simulations on synchronous hardware: their
accounting counts the modeled master messages, not this program's collectives,
so they are shown without a verdict.

Run: ``python benchmarks/communication.py [--devices 2 --workers 4 --tau 4]``.
"""

from __future__ import annotations

import argparse
import datetime

from common import force_cpu_devices

PERIODIC = ("easgd", "eamsgd", "local_sgd", "diloco")
OTHER_COLLECTIVES = ("all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--devices", type=int, default=2)
  ap.add_argument("--workers", type=int, default=4)
  ap.add_argument("--tau", type=int, default=4)
  ap.add_argument("--hidden", default="64", help="MLP hidden widths")
  ap.add_argument("--batch", type=int, default=8, help="examples per worker")
  ap.add_argument("--backend", default="shard_map")
  ap.add_argument("--algorithms", default="all", help="comma-separated, or all")
  args = ap.parse_args()
  force_cpu_devices(args.devices)

  import jax

  import common
  from easgd import algorithms, models, trainer, workers
  from easgd.asynchronous import SCHEDULES  # noqa: F401  (registry dependency)
  from easgd.config import TrainConfig
  from easgd.registry import ASYNC_ALGORITHMS, MOMENTUM_ALGORITHMS

  p, d, tau = args.workers, args.devices, args.tau
  _, params, loss_fn = common.mlp_setup(common.int_list(args.hidden))
  pbytes = models.param_bytes(params)
  layout = workers.make_layout(p, d, backend=args.backend)
  x, y = common.random_batch((p, args.batch))
  batch = workers.split_workers((x, y), layout)
  names = (algorithms.ALGORITHMS if args.algorithms == "all"
           else tuple(a.strip() for a in args.algorithms.split(",")))
  n_steps = 8 * tau

  print(f"# communication per step from compiled HLO  ({datetime.date.today()}; "
        f"{common.machine()})")
  print(f"# {layout.describe()}; tau={tau}; MLP hidden={args.hidden}: {pbytes} param "
        f"bytes; accounting over N={n_steps} steps; bytes are per device")
  print(f"{'algorithm':13s} {'always':>14s} {'in cond':>14s} {'other coll.':>11s} "
        f"{'HLO bytes/N':>12s} {'accounting':>18s} {'verdict':>8s}")
  for name in names:
    cfg = TrainConfig(algorithm=name, num_workers=p, tau=tau, beta=0.9,
                      momentum=0.9 if name in MOMENTUM_ALGORITHMS else 0.0)
    try:
      cfg.validate()
      algo = trainer.make_algorithm(cfg, loss_fn, trainer.make_optimizer(cfg, 100))
      worker, shared = algo.init(params)
      worker = workers.replicate_per_worker(worker, layout)
      shared = workers.replicate_per_device(shared, layout)
      step = workers.map_workers(algo.step, layout,
                                 ("worker", "shared", "worker", "broadcast"),
                                 ("worker", "shared", "worker"))
      text = step.lower(worker, shared, batch, jax.random.key(0)).compile().as_text()
    except Exception as e:  # report and go on with the others
      print(f"{name:13s} skipped: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
      continue
    c = common.collectives(text)
    other = sum(sum(v["count"] for v in common.collectives(text, op).values())
                for op in OTHER_COLLECTIVES)
    comm = algo.communication(n_steps, pbytes)
    periodic = name in PERIODIC
    hlo_bytes = (n_steps * c["always"]["bytes"]
                 + (n_steps // tau if periodic else 0) * c["conditional"]["bytes"])
    hlo_count = (n_steps * c["always"]["count"]
                 + (n_steps // tau if periodic else 0) * c["conditional"]["count"])
    if name in ASYNC_ALGORITHMS:
      verdict = "n/a"
    elif not periodic and c["conditional"]["count"]:
      verdict = "cond?"  # a conditional collective where none is expected
    else:
      verdict = "match" if (hlo_bytes, hlo_count) == (comm.bytes, comm.all_reduces) else "DIFFER"
    fmt = lambda v: f"{v['count']}x{v['bytes']}"
    print(f"{name:13s} {fmt(c['always']):>14s} {fmt(c['conditional']):>14s} "
          f"{other:>11d} {hlo_bytes / n_steps:12.1f} "
          f"{f'{comm.all_reduces}x / {comm.bytes / n_steps:.1f}':>18s} {verdict:>8s}")
  print("# always / in cond: all-reduce ops x bytes in one step's program; HLO bytes/N:"
        " predicted mean bytes per step; accounting: all-reduces over N steps / mean"
        " bytes per step")


if __name__ == "__main__":
  main()
