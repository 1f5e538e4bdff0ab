"""Benchmark 3: all-reduces and bytes per step of each algorithm, read from HLO.

Method. Every algorithm of the table ``easgd.methods.registry.ALGORITHMS`` is built as the
trainer builds it (``easgd.methods.registry.make_algorithm``, plain SGD, ``--tau``,
beta 0.9, momentum 0.9 where used) for ``--workers`` workers on ``--devices``
fake CPU devices, and the programs the trainer runs (``easgd.parallel.mapping.map_step``)
are lowered and compiled: for EASGD, EAMSGD, local SGD and DiLoCo two, the step
without communication ("local") and the step with it ("exchange"), picked on
the host by ``Algorithm.exchange_at``; for the others one. In each compiled
program's HLO text we count the ``all-reduce`` ops and their result sizes
(= operand sizes) per device, split into those that run on every call
(reachable from ENTRY without passing a ``conditional``) and those inside a
conditional's branches (expected: none). Other collectives (all-gather,
reduce-scatter, collective-permute, all-to-all) are counted too.

Check against the trainer's own accounting, ``Algorithm.communication(N,
param_bytes)`` over N = 8 tau steps: the HLO predicts the sum over t < N of
the bytes and all-reduces of the program step t runs; with w workers per
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

  import common
  import jax

  from easgd.methods import registry
  from easgd.parallel import mapping, placement, worker_layout
  from easgd.runtimes import optimizers
  from easgd.settings.config import TrainConfig
  from easgd.tasks import models

  p, d, tau = args.workers, args.devices, args.tau
  _, params, loss_fn = common.mlp_setup(common.int_list(args.hidden))
  pbytes = models.param_bytes(params)
  layout = worker_layout.make_layout(p, d, backend=args.backend)
  x, y = common.random_batch((p, args.batch))
  batch = placement.split_workers((x, y), layout)
  names = (
      registry.ALGORITHMS
      if args.algorithms == "all"
      else tuple(a.strip() for a in args.algorithms.split(","))
  )
  n_steps = 8 * tau

  print(
      f"# communication per step from compiled HLO  ({datetime.date.today()}; "
      f"{common.machine()})"
  )
  print(
      f"# {layout.describe()}; tau={tau}; MLP hidden={args.hidden}: {pbytes} param "
      f"bytes; accounting over N={n_steps} steps; bytes are per device"
  )
  print(
      f"{'algorithm':13s} {'local prog.':>12s} {'exchange prog.':>14s} "
      f"{'in cond':>8s} {'other coll.':>11s} {'HLO bytes/N':>12s} {'accounting':>18s} "
      f"{'verdict':>8s}"
  )
  for name in names:
    try:
      cfg, _ = TrainConfig(num_workers=p, tau=tau, beta=0.9).for_algorithm(name)
      cfg = cfg.validate()
      algo = registry.make_algorithm(cfg, loss_fn, optimizers.make_optimizer(cfg, 100))
      worker, shared = placement.place_state(algo, params, layout)
      programs = mapping.map_step(algo, layout, donate_state=False).programs
      texts = {
          flag: f.lower(worker, shared, batch, jax.random.key(0)).compile().as_text()
          for flag, f in programs.items()
      }
    except Exception as e:  # report and go on with the others
      print(f"{name:13s} skipped: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
      continue
    counts = {flag: common.collectives(t) for flag, t in texts.items()}
    in_cond = sum(c["conditional"]["count"] for c in counts.values())
    other = sum(
        sum(v["count"] for v in common.collectives(t, op).values())
        for t in texts.values()
        for op in OTHER_COLLECTIVES
    )
    flags = [
        None if algo.exchange_at is None else bool(algo.exchange_at(t)) for t in range(n_steps)
    ]
    hlo_bytes = sum(counts[f]["always"]["bytes"] for f in flags)
    hlo_count = sum(counts[f]["always"]["count"] for f in flags)
    comm = algo.communication(n_steps, pbytes)
    if registry.TABLE[name].asynchronous:
      verdict = "n/a"
    elif in_cond:
      verdict = "cond?"  # a collective under a conditional: not expected any more
    else:
      verdict = "match" if (hlo_bytes, hlo_count) == (comm.bytes, comm.all_reduces) else "DIFFER"
    fmt = lambda f: (
        f"{counts[f]['always']['count']}x{counts[f]['always']['bytes']}" if f in counts else "-"
    )
    local, exchange = (fmt(None), "-") if None in counts else (fmt(False), fmt(True))
    print(
        f"{name:13s} {local:>12s} {exchange:>14s} {in_cond:>8d} {other:>11d} "
        f"{hlo_bytes / n_steps:12.1f} "
        f"{f'{comm.all_reduces}x / {comm.bytes / n_steps:.1f}':>18s} {verdict:>8s}"
    )
  print(
      "# local / exchange prog.: all-reduce ops x bytes per call of each program the"
      " trainer runs (one program: under 'local'); HLO bytes/N: mean bytes per step"
      " over the N steps' programs; accounting: all-reduces over N steps / mean bytes"
      " per step"
  )


if __name__ == "__main__":
  main()
