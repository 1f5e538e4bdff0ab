"""GPU check: the paper's CIFAR model, p EASGD workers vmapped on one GPU.

Method. The 7-layer CIFAR-10 convnet of the paper's Section 5.1
(``easgd.tasks.models.CifarNet``: conv5x5(64)-pool-conv5x5(128)-pool-conv3x3(64)-
dense(256)-dropout-dense(10), 28x28x3 crops) on random 28x28x3 inputs, plain
SGD, per-worker batch ``--batch`` B (paper: 128), on the FIRST device (a GPU
when there is one). For each p in ``--workers``:

  easgd_vmapped  the library's EASGD step as the trainer runs it
                 (``easgd.parallel.mapping.map_step``: the exchange program on every
                 ``--tau``-th step, the local program otherwise), p workers
                 vmapped on the one device (layout 1 x p; the exchange is a sum
                 over the vmapped axis: no transfer between devices);
  bare_pB        a hand-written ``jax.jit`` SGD step of ONE model on batch p*B
                 (same examples, same FLOPs, one set of weights);
  bare_B         the same on batch B (one worker's step alone).

All donate their state; the loops wait for each step's loss one step late.
Timing: ``benchmarks/common.py`` (warm-up, then round-robin repeats of
``--steps`` steps, median of per-step wall time). Samples/s = examples per
step / seconds per step. Printed ratios: easgd_vmapped / bare_pB (time; the
issue's target for vmapped workers is <= 1.15) and p * time(bare_B) /
time(easgd_vmapped) (speed-up over running the p workers one after another).

Meant for a GPU, in under 2 minutes with the defaults. ``--quick`` shrinks
everything (p = 2, B = 8, few steps) so that it runs on a CPU in well under a
minute; its numbers only show that the script works.

On a machine of n >= 2 devices it then runs ``benchmarks/mesh_layouts.py`` on
them (``--real-devices``): the layouts n x 1, n/2 x 2, n/4 x 4, n/8 x 8 that
divide n, EASGD and pmean SGD at one global batch, step times and bytes per
level, and the modelled time to target on nodes of 8 devices.

Run: ``python benchmarks/gpu_check.py`` (GPU) or ``... --quick`` (CPU).
"""

from __future__ import annotations

import argparse
import datetime
import time


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workers", default="4,8", help="values of p")
  ap.add_argument("--batch", type=int, default=128, help="examples per worker per step")
  ap.add_argument("--tau", type=int, default=10, help="EASGD communication period")
  ap.add_argument("--steps", type=int, default=20, help="steps per timed call")
  ap.add_argument("--repeats", type=int, default=5, help="timed calls per candidate")
  ap.add_argument("--warmup", type=int, default=1, help="untimed calls per candidate")
  ap.add_argument("--quick", action="store_true", help="tiny settings for a CPU run")
  args = ap.parse_args()
  if args.quick:
    args.workers, args.batch, args.steps, args.repeats = "2", 8, 3, 3

  start = time.perf_counter()
  import common
  import jax
  import numpy as np
  import optax

  from easgd.core import algorithms
  from easgd.parallel import mapping, placement, worker_layout
  from easgd.settings import builtin_tasks
  from easgd.tasks import models

  lr, B, shape = 0.01, args.batch, (28, 28, 3)
  model = models.make_model("cifar", 10)
  params = models.init_params(model, shape, jax.random.key(0))
  loss_fn = builtin_tasks.make_loss_fn(model)  # dropout active, as in training
  key = jax.random.key(1)
  device = jax.devices()[0]

  def library(p, x, y):
    algo = algorithms.easgd(loss_fn, optax.sgd(lr), num_workers=p, tau=args.tau, beta=0.9)
    layout = worker_layout.make_layout(p, 1, devices=[device])
    batch = placement.split_workers((x.reshape(p, B, *shape), y.reshape(p, B)), layout)
    step_fn = mapping.map_step(algo, layout)  # as the trainer runs it, every tau-th
    return common.step_loop(
        step_fn, placement.place_state(algo, params, layout), batch, key, clock=True
    )  # step exchanging

  def bare(x, y):
    def step(p, batch, key):
      loss, g = jax.value_and_grad(loss_fn)(p, batch, key)
      return jax.tree.map(lambda a, b: a - lr * b, p, g), loss

    step = jax.jit(step, donate_argnums=(0,))
    p0 = jax.tree.map(lambda a: jax.device_put(np.asarray(a), device), params)
    return common.step_loop(step, (p0,), jax.device_put((x, y), device), key)

  print(f"# gpu_check  ({datetime.date.today()}; {common.machine()}; device {device})")
  print(
      f"# CifarNet ({models.count_params(params)} params), 28x28x3 random inputs, "
      f"B={B}/worker, tau={args.tau}; {args.steps} steps x {args.repeats} repeats, median"
      + ("; --quick" if args.quick else "")
  )
  print(f"{'p':>3s} {'candidate':14s} {'ms/step':>9s} {'spread':>7s} {'samples/s':>10s}")
  summary = []
  for p in common.int_list(args.workers):
    x, y = common.random_batch((p * B,), input_shape=shape, seed=p)
    runs = {"easgd_vmapped": library(p, x, y), "bare_pB": bare(x, y), "bare_B": bare(x[:B], y[:B])}
    res = common.time_side_by_side(
        {k: v[0] for k, v in runs.items()}, args.steps, args.repeats, args.warmup
    )
    for name, r in res.items():
      n = B if name == "bare_B" else p * B
      print(
          f"{p:3d} {name:14s} {1e3 * r['median_s']:9.2f} {common.spread(r['all_s']):>7s} "
          f"{n / r['median_s']:10.0f}"
      )
      loss = np.asarray(runs[name][1]["loss"])
      if not np.all(np.isfinite(loss)):
        print(f"    {name}: non-finite loss {loss}")
    m = {k: v["median_s"] for k, v in res.items()}
    summary.append((p, m["easgd_vmapped"] / m["bare_pB"], p * m["bare_B"] / m["easgd_vmapped"]))
  print(f"{'p':>3s} {'easgd_vmapped/bare_pB':>22s} {'speed-up vs p x bare_B':>23s}  target")
  for p, ratio, speedup in summary:
    print(
        f"{p:3d} {ratio:22.3f} {speedup:23.2f}  <= 1.15 " f"{'met' if ratio <= 1.15 else 'NOT met'}"
    )
  n = jax.device_count()
  if n >= 2 and not args.quick:  # several GPUs: the layouts of benchmarks/mesh_layouts.py
    import mesh_layouts

    layouts = [f"{n // d}x{d}" for d in (1, 2, 4, 8) if d <= n and n % d == 0 and n // d >= 1]
    mesh_layouts.main(["--real-devices", "--layouts", ",".join(layouts)])
  print(f"# total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
  main()
