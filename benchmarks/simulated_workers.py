"""Benchmark 2: p workers vmapped on ONE device against one worker with batch p*B.

Method. One device (the first CPU device; no fake devices), the trainer's MLP
on Fashion-MNIST-shaped random data, per-worker batch ``--batch`` B, plain SGD,
the same pre-placed batch every step. For each p in ``--workers``:

  vmapped_easgd   the library's EASGD step as the trainer runs it
                  (``mapping.map_step``) with p workers vmapped on the device
                  (layout 1 x p), on local steps (tau = 10**9: the program
                  without communication): p independent models, p matmuls per
                  layer, each of B rows;
  big_batch       the library's EASGD step with ONE worker (layout 1 x 1) and
                  batch p*B (the same examples): one model, one matmul of p*B
                  rows per layer. Same FLOPs as vmapped_easgd; p times fewer
                  weights to read and update;
  vmapped_pmean   the library's pmean SGD step as the trainer runs it with p
                  vmapped workers (one shared model: ``map_step`` merges the
                  device's workers into one batch, one gradient);
  pmean_big_batch the library's pmean SGD step with ONE worker and batch p*B;
  pmean_per_worker the pmean SGD step mapped per worker (``map_workers`` of
                  ``algo.step``: each vmapped worker forms its own weight
                  gradient before the sum), the layout before the merge;
  bare_big_batch  a hand-written jit SGD step of one model on batch p*B;
  bare_vmapped    the same hand-written step under ``jax.vmap`` over p models
                  of B examples each (no center, no library): what p
                  simulated workers cost by themselves. vmapped_easgd /
                  bare_vmapped is the library's overhead; bare_vmapped /
                  bare_big_batch the price of p sets of weights on the device.

All donate their state. Timing: ``benchmarks/common.py`` (warm-up, then
round-robin repeats of ``--steps`` steps, median of per-step wall time).
Samples/s = p*B / (seconds per step).

Targets: vmapped_easgd within 15% of the equivalent large batch (ratio
vmapped_easgd / big_batch <= 1.15); the synchronous baseline on one device,
vmapped_pmean / pmean_big_batch <= 1.10.

Run: ``python benchmarks/simulated_workers.py [--workers 2,4,8 --batch 32]``.
"""

from __future__ import annotations

import argparse
import datetime

from common import force_cpu_devices


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workers", default="2,4,8", help="values of p")
  ap.add_argument("--batch", type=int, default=32, help="examples per worker per step (B)")
  ap.add_argument("--hidden", default="256,256", help="MLP hidden widths")
  ap.add_argument("--steps", type=int, default=30, help="steps per timed call")
  ap.add_argument("--repeats", type=int, default=7, help="timed calls per candidate")
  ap.add_argument("--warmup", type=int, default=2, help="untimed calls per candidate")
  ap.add_argument("--backend", default="pmap", help="mapping backend")
  args = ap.parse_args()
  force_cpu_devices(1)

  import common
  import jax
  import optax

  from easgd.core import algorithms
  from easgd.parallel import mapping, placement, worker_layout
  from easgd.tasks import models

  lr, B = 0.01, args.batch
  _, params, loss_fn = common.mlp_setup(common.int_list(args.hidden))
  key = jax.random.key(0)

  def library(algo, p, batch_per_worker, x, y, per_worker=False):
    layout = worker_layout.make_layout(p, 1, backend=args.backend)
    state = dict(zip("ws", placement.place_state(algo, params, layout)))
    batch = placement.split_workers(
        (x.reshape(p, batch_per_worker, *x.shape[1:]), y.reshape(p, batch_per_worker)), layout
    )
    # the trainer's program for steps at clock >= 1 (no exchange with tau = 10**9)
    step_fn = mapping.map_step(algo, layout)
    f = step_fn.programs[None if algo.exchange_at is None else bool(algo.exchange_at(1))]
    if per_worker:  # every worker its own gradient (map_workers of the per-worker step)
      f = mapping.map_workers(
          algo.step, layout, mapping.STEP_IN_KINDS, mapping.STEP_OUT_KINDS, donate_argnums=(0, 1)
      )

    def run(steps):
      w, s = state["w"], state["s"]
      for _ in range(steps):
        w, s, loss = f(w, s, batch, key)
      jax.block_until_ready((w, s))
      state["w"], state["s"] = w, s

    return run

  def bare(x, y, p=None):
    def step(params, batch, key):
      loss, g = jax.value_and_grad(loss_fn)(params, batch, key)
      return jax.tree.map(lambda a, b: a - lr * b, params, g), loss

    if p is None:  # one model, the whole batch
      state = {"p": jax.tree.map(jax.numpy.array, params)}
      batch = jax.device_put((x, y))
    else:  # p models, B examples each: jax.vmap of the same step
      step = jax.vmap(step, in_axes=(0, 0, None))
      state = {"p": jax.tree.map(lambda a: jax.numpy.broadcast_to(a, (p, *a.shape)) + 0, params)}
      batch = jax.device_put((x.reshape(p, -1, *x.shape[1:]), y.reshape(p, -1)))
    step = jax.jit(step, donate_argnums=(0,))

    def run(steps):
      p = state["p"]
      for _ in range(steps):
        p, loss = step(p, batch, key)
      jax.block_until_ready(p)
      state["p"] = p

    return run

  print(f"# simulated workers  ({datetime.date.today()}; {common.machine()})")
  print(
      f"# MLP hidden={args.hidden} ({models.count_params(params)} params); B={B} per "
      f"worker; backend {args.backend}; {args.steps} steps x {args.repeats} repeats, "
      f"median"
  )
  print(f"{'p':>3s} {'candidate':16s} {'ms/step':>9s} {'spread':>7s} {'samples/s':>10s}")
  ratios = []
  for p in common.int_list(args.workers):
    x, y = common.random_batch((p * B,), seed=p)
    sgd = optax.sgd(lr)
    cands = {
        "vmapped_easgd": library(
            algorithms.easgd(loss_fn, sgd, num_workers=p, tau=10**9, beta=0.9), p, B, x, y
        ),
        "big_batch": library(
            algorithms.easgd(loss_fn, sgd, num_workers=1, tau=10**9, beta=0.9), 1, p * B, x, y
        ),
        "vmapped_pmean": library(algorithms.pmean_sgd(loss_fn, sgd, num_workers=p), p, B, x, y),
        "pmean_big_batch": library(
            algorithms.pmean_sgd(loss_fn, sgd, num_workers=1), 1, p * B, x, y
        ),
        "pmean_per_worker": library(
            algorithms.pmean_sgd(loss_fn, sgd, num_workers=p), p, B, x, y, per_worker=True
        ),
        "bare_big_batch": bare(x, y),
        "bare_vmapped": bare(x, y, p),
    }
    res = common.time_side_by_side(cands, args.steps, args.repeats, args.warmup)
    for name, r in res.items():
      print(
          f"{p:3d} {name:16s} {1e3 * r['median_s']:9.3f} {common.spread(r['all_s']):>7s} "
          f"{p * B / r['median_s']:10.0f}"
      )
    m = {k: v["median_s"] for k, v in res.items()}
    ratios.append(
        (
            p,
            m["vmapped_easgd"] / m["big_batch"],
            m["vmapped_easgd"] / m["bare_vmapped"],
            m["bare_vmapped"] / m["bare_big_batch"],
            m["vmapped_pmean"] / m["pmean_big_batch"],
            m["pmean_per_worker"] / m["pmean_big_batch"],
        )
    )
  print(
      f"{'p':>3s} {'vmapped_easgd/big_batch':>24s} {'easgd/bare_vmapped':>19s} "
      f"{'bare_vmapped/bare_big':>22s} {'vmapped_pmean/pmean_big':>24s} "
      f"{'pmean_per_worker/pmean_big':>27s}  targets"
  )
  for p, r1, r2, r3, r4, r5 in ratios:
    print(
        f"{p:3d} {r1:24.3f} {r2:19.3f} {r3:22.3f} {r4:24.3f} {r5:27.3f}  "
        f"easgd <= 1.15 {'met' if r1 <= 1.15 else 'NOT met'}; "
        f"pmean <= 1.10 {'met' if r4 <= 1.10 else 'NOT met'}"
    )


if __name__ == "__main__":
  main()
