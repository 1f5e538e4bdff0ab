"""Diagnostic for benchmark 1: what the host-clock check of ``map_step`` costs.

Method. 2 fake CPU devices, one worker each, the trainer's MLP (256, 256) on
Fashion-MNIST-shaped random data, batch ``--batch`` per worker, plain SGD,
EASGD with tau = 10**9 so that every timed step is a local step. Candidates:

  bare       hand-written ``jax.pmap`` SGD step (as ``step_overhead.py``);
  checked    the local program of ``easgd.parallel.mapping.map_step`` (what the trainer
             runs: it compares ``exchange_at`` of the state's counter with its
             flag and returns a NaN loss on a mismatch);
  unchecked  the same step without the check:
             ``map_workers(partial(algo.step, exchange=False))``.

Timing: ``benchmarks/common.py`` (warm-up, then round-robin repeats of
``--steps`` steps, median of per-step wall time).

Run: ``python benchmarks/clock_check_cost.py [--batch 64 --repeats 15]``.
"""

from __future__ import annotations

import argparse
import datetime
import functools

from common import force_cpu_devices


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--steps", type=int, default=50)
  ap.add_argument("--repeats", type=int, default=15)
  args = ap.parse_args()
  force_cpu_devices(2)

  import common
  import jax
  import optax

  from easgd.core import algorithms
  from easgd.parallel import mapping, placement, worker_layout

  d, lr = 2, 0.01
  _, params, loss_fn = common.mlp_setup((256, 256))
  x, y = common.random_batch((d, args.batch))
  key = jax.random.key(0)
  devices = jax.devices()[:d]
  layout = worker_layout.make_layout(d, d)

  def bare():
    def step(p, batch, key):
      loss, g = jax.value_and_grad(loss_fn)(p, batch, key)
      return jax.tree.map(lambda a, b: a - lr * b, p, g), loss

    f = jax.pmap(step, axis_name="d", in_axes=(0, 0, None), devices=devices, donate_argnums=(0,))
    p0 = placement.replicate_per_device(params, layout)  # [d, ...]
    return common.step_loop(f, (p0,), jax.device_put((x, y), layout.sharding), key)[0]

  algo = algorithms.easgd(loss_fn, optax.sgd(lr), num_workers=d, tau=10**9, beta=0.9)

  def library(f):
    return common.step_loop(
        f, placement.place_state(algo, params, layout), placement.split_workers((x, y), layout), key
    )[0]

  checked = mapping.map_step(algo, layout).programs[False]
  unchecked = mapping.map_workers(
      functools.partial(algo.step, exchange=False),
      layout,
      mapping.STEP_IN_KINDS,
      mapping.STEP_OUT_KINDS,
      donate_argnums=(0, 1),
  )
  res = common.time_side_by_side(
      {"bare": bare(), "checked": library(checked), "unchecked": library(unchecked)},
      args.steps,
      args.repeats,
  )
  print(f"# clock check cost  ({datetime.date.today()}; {common.machine()})")
  print(
      f"# 2 devices x 1 worker; MLP 256,256; batch {args.batch}/worker; "
      f"{args.steps} steps x {args.repeats} repeats, median; local steps only"
  )
  print(f"{'candidate':10s} {'ms/step':>8s} {'spread':>7s} {'/ bare':>7s}")
  m = res["bare"]["median_s"]
  for name, r in res.items():
    print(
        f"{name:10s} {1e3 * r['median_s']:8.3f} {common.spread(r['all_s']):>7s} "
        f"{r['median_s'] / m:7.3f}"
    )


if __name__ == "__main__":
  main()
