"""Benchmark 1: the cost of EASGD's step against bare hand-written pmap steps.

Method. One worker per device on ``--devices`` devices (default 2 fake CPU
devices), the trainer's MLP on Fashion-MNIST-shaped random data (28x28x1, 10
classes), per-worker batch ``--batch``, plain SGD. The same pre-placed batch is
fed every step (no host-to-device copy is timed). Every loop waits for the
previous step's loss before going on (one step late, as the trainer should:
XLA's in-process CPU all-reduce can deadlock with hundreds of queued steps). Candidates:

  bare_sgd          hand-written ``jax.pmap``: value_and_grad, p - lr*g, no
                    collective (the floor for a local step);
  bare_pmean        the same plus ``lax.pmean`` of the gradients (hand-written
                    data-parallel SGD);
  easgd_local/B     the library's EASGD step as the trainer runs it
                    (``easgd.parallel.mapping.map_step`` of ``algorithms.easgd``) on a
                    local step: the program without communication that the
                    host picks when tau does not divide the clock;
  easgd_exchange/B  the same on an exchange step (tau = 1): the program with
                    the elastic exchange (one parameter-sized all-reduce);
  pmean_sgd/B       the library's pmean SGD step;
  cond_local/pmap,  (diagnostic, ``--no-cond`` leaves them out) the single
  cond_exchange/pmap  program that decides on the device with a ``lax.cond``
                    (``map_workers(algo.step)``), local and exchange branch;
with B each mapping backend (pmap, shard_map). Every candidate donates its
state. Timing: ``benchmarks/common.py`` (warm-up, then round-robin repeats of
``--steps`` steps, median of per-step wall time).

Targets from the issue: easgd_local within 5% of bare_sgd; easgd_exchange
within 10% of the pmean step (bare_pmean and the library's pmean_sgd).

Run: ``python benchmarks/step_overhead.py [--devices 2 --batch 64 --steps 50]``.
"""

from __future__ import annotations

import argparse
import datetime

from common import force_cpu_devices


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--devices", type=int, default=2, help="fake CPU devices (workers)")
  ap.add_argument("--batch", type=int, default=64, help="examples per worker per step")
  ap.add_argument("--hidden", default="256,256", help="MLP hidden widths")
  ap.add_argument("--steps", type=int, default=50, help="steps per timed call")
  ap.add_argument("--repeats", type=int, default=7, help="timed calls per candidate")
  ap.add_argument("--warmup", type=int, default=2, help="untimed calls per candidate")
  ap.add_argument("--backends", default="pmap,shard_map")
  ap.add_argument(
      "--no-cond",
      dest="cond",
      action="store_false",
      help="leave out the single-program (lax.cond) EASGD candidates",
  )
  args = ap.parse_args()
  force_cpu_devices(args.devices)

  import common
  import jax
  import numpy as np
  import optax
  from jax import lax

  from easgd.core import algorithms
  from easgd.parallel import mapping, placement, worker_layout

  d, lr = args.devices, 0.01
  _, params, loss_fn = common.mlp_setup(common.int_list(args.hidden))
  x, y = common.random_batch((d, args.batch))
  devices = jax.devices()[:d]
  key = jax.random.key(0)

  hlo = {}  # candidate -> compiled HLO text (diagnostics)

  def bare(name, pmean):
    def step(p, batch, key):
      loss, g = jax.value_and_grad(loss_fn)(p, batch, key)
      if pmean:
        g = lax.pmean(g, "d")
      return jax.tree.map(lambda a, b: a - lr * b, p, g), loss

    f = jax.pmap(step, axis_name="d", in_axes=(0, 0, None), devices=devices, donate_argnums=(0,))
    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(devices), ("d",)), jax.sharding.PartitionSpec("d")
    )
    p0 = jax.tree.map(
        lambda a: jax.device_put(np.broadcast_to(np.asarray(a), (d, *a.shape)), sharding), params
    )
    batch = jax.device_put((x, y), sharding)
    hlo[name] = f.lower(p0, batch, key).compile().as_text()
    return common.step_loop(f, (p0,), batch, key)[0]

  def library(name, algo, backend, scheduled=True):
    layout = worker_layout.make_layout(d, d, backend=backend)
    w0, s0 = placement.place_state(algo, params, layout)
    batch = placement.split_workers((x, y), layout)  # [d, 1, B, ...]
    if scheduled:  # the trainer's step: the program exchange_at(clock) names
      step_fn = mapping.map_step(algo, layout)
      flag = None if algo.exchange_at is None else bool(algo.exchange_at(1))
      f = step_fn.programs[flag]  # the one this loop runs: clocks >= 1 alike
    else:  # one program, the exchange decided on the device by a lax.cond
      f = mapping.map_workers(
          algo.step, layout, mapping.STEP_IN_KINDS, mapping.STEP_OUT_KINDS, donate_argnums=(0, 1)
      )
    hlo[name] = f.lower(w0, s0, batch, key).compile().as_text()
    return common.step_loop(f, (w0, s0), batch, key)[0]

  def easgd(tau):
    return algorithms.easgd(loss_fn, optax.sgd(lr), num_workers=d, tau=tau, beta=0.9)

  cands = {"bare_sgd": bare("bare_sgd", False), "bare_pmean": bare("bare_pmean", True)}
  for b in args.backends.split(","):
    for name, algo in (
        ("easgd_local", easgd(10**9)),
        ("easgd_exchange", easgd(1)),
        ("pmean_sgd", algorithms.pmean_sgd(loss_fn, optax.sgd(lr))),
    ):
      cands[f"{name}/{b}"] = library(f"{name}/{b}", algo, b)
  if args.cond:
    for name, algo in (("cond_local", easgd(10**9)), ("cond_exchange", easgd(1))):
      cands[f"{name}/pmap"] = library(f"{name}/pmap", algo, "pmap", scheduled=False)
  res = common.time_side_by_side(cands, args.steps, args.repeats, args.warmup)

  from easgd.tasks import models

  print(f"# step overhead  ({datetime.date.today()}; {common.machine()})")
  print(
      f"# {d} workers = {d} devices x 1; MLP hidden={args.hidden} "
      f"({models.count_params(params)} params, {models.param_bytes(params)} bytes); "
      f"batch {args.batch}/worker; {args.steps} steps x {args.repeats} repeats, "
      f"median"
  )
  print(
      "# HLO columns, per device, from the compiled program: all-reduce ops and MB"
      " (always / inside the exchange conditional), copy ops and MB"
  )
  print(f"{'candidate':24s} {'ms/step':>9s} {'spread':>7s} {'all-reduce':>18s} " f"{'copies':>12s}")
  for name, r in res.items():
    c = common.collectives(hlo[name])
    n_copy, b_copy = common.op_bytes(hlo[name], "copy")
    ar = (
        f"{c['always']['count']}x{c['always']['bytes'] / 1e6:.2f}/"
        f"{c['conditional']['count']}x{c['conditional']['bytes'] / 1e6:.2f}"
    )
    print(
        f"{name:24s} {1e3 * r['median_s']:9.3f} {common.spread(r['all_s']):>7s} "
        f"{ar:>18s} {n_copy:>4d} {b_copy / 1e6:5.2f}MB"
    )
  m = {k: v["median_s"] for k, v in res.items()}
  print(f"{'ratio':44s} {'value':>7s}  target")
  for b in args.backends.split(","):
    rows = [
        (f"easgd_local/{b} / bare_sgd", m[f"easgd_local/{b}"] / m["bare_sgd"], 1.05),
        (f"easgd_exchange/{b} / bare_pmean", m[f"easgd_exchange/{b}"] / m["bare_pmean"], 1.10),
        (
            f"easgd_exchange/{b} / pmean_sgd/{b}",
            m[f"easgd_exchange/{b}"] / m[f"pmean_sgd/{b}"],
            1.10,
        ),
        (f"pmean_sgd/{b} / bare_pmean", m[f"pmean_sgd/{b}"] / m["bare_pmean"], None),
        (f"easgd_exchange/{b} / bare_sgd", m[f"easgd_exchange/{b}"] / m["bare_sgd"], None),
    ]
    if b == "pmap" and args.cond:
      rows += [
          ("cond_local/pmap / bare_sgd", m["cond_local/pmap"] / m["bare_sgd"], None),
          ("cond_exchange/pmap / bare_pmean", m["cond_exchange/pmap"] / m["bare_pmean"], None),
      ]
    for name, value, target in rows:
      verdict = (
          "" if target is None else (f"<= {target:.2f} {'met' if value <= target else 'NOT met'}")
      )
      print(f"{name:44s} {value:7.3f}  {verdict}")


if __name__ == "__main__":
  main()
