"""Diagnostic for benchmark 1: what an EASGD local step pays for its lax.cond.

Method. Hand-written ``jax.pmap`` steps on ``--devices`` fake CPU devices (one
worker each), the trainer's MLP on Fashion-MNIST-shaped random data, batch
``--batch`` per worker, built up one piece at a time towards the library's
EASGD step, all taking the LOCAL path (no exchange happens):

  bare            value_and_grad, p - lr*g (as ``step_overhead.py``);
  optax+key       + the worker key fold_in(fold_in(key, t), worker) and
                  ``optax.sgd``'s update (what ``algorithms.easgd`` adds);
  +center         + the center carried through the step, untouched;
  +cond(local)    + ``elastic.easgd_update``: the exchange as ``lax.cond`` on a
                  traced flag that is False (the library's form);
  cond(psum only) the alternative that keeps only the all-reduce inside the
                  cond and blends the elastic term with ``jnp.where``.

Columns: median ms per step (``benchmarks/common.py`` timing: warm-up, then
round-robin repeats, waiting one step late) and the compiled program's copy
ops and bytes.

Run: ``python benchmarks/cond_cost.py [--devices 2 --batch 64]``.
"""

from __future__ import annotations

import argparse
import datetime

from common import force_cpu_devices


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--devices", type=int, default=2)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--steps", type=int, default=40)
  ap.add_argument("--repeats", type=int, default=9)
  args = ap.parse_args()
  force_cpu_devices(args.devices)

  import common
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax import lax
  from optax.tree_utils import tree_add

  from easgd.core import elastic

  d, lr, alpha = args.devices, 0.01, 0.9 / args.devices
  _, params, loss_fn = common.mlp_setup()
  x, y = common.random_batch((d, args.batch))
  devices = jax.devices()[:d]
  key = jax.random.key(0)
  sharding = jax.sharding.NamedSharding(
      jax.sharding.Mesh(np.array(devices), ("d",)), jax.sharding.PartitionSpec("d")
  )
  put = lambda t: jax.tree.map(
      lambda a: jax.device_put(np.broadcast_to(np.asarray(a), (d, *np.shape(a))), sharding), t
  )
  batch = jax.device_put((x, y), sharding)
  opt = optax.sgd(lr)
  hlo = {}

  def make(name, step, n_state):
    f = jax.pmap(
        step,
        axis_name="d",
        in_axes=(0,) * n_state + (0, None, 0),
        devices=devices,
        donate_argnums=tuple(range(n_state)),
    )
    state = {
        "s": tuple(put(params) for _ in range(n_state)),
        "t": put(np.int32(1)),
    }  # clock 1: tau = 10**9 does not divide it
    hlo[name] = f.lower(*state["s"], batch, key, state["t"]).compile().as_text()

    def run(steps):
      s, last = state["s"], None
      for _ in range(steps):
        out = f(*s, batch, key, state["t"])
        s, last = out[:n_state], common.one_step_late(last, out[-1])
      jax.block_until_ready(s)
      state["s"] = s

    return run

  def local_update(p, b, k, t):
    k = jax.random.fold_in(jax.random.fold_in(k, t), lax.axis_index("d"))
    loss, g = jax.value_and_grad(loss_fn)(p, b, k)
    u, _ = opt.update(g, opt.init(p), p)
    return u, loss

  def bare(p, b, k, t):
    loss, g = jax.value_and_grad(loss_fn)(p, b, k)
    return jax.tree.map(lambda a, c: a - lr * c, p, g), loss

  def optax_key(p, b, k, t):
    u, loss = local_update(p, b, k, t)
    return optax.apply_updates(p, u), loss

  def with_center(p, c, b, k, t):
    p2, loss = optax_key(p, b, k, t)
    return p2, c, loss

  def cond_local(p, c, b, k, t):
    u, loss = local_update(p, b, k, t)
    p2, c2 = elastic.easgd_update(p, u, c, alpha, t % 10**9 == 0, "d")
    return p2, c2, loss

  def cond_psum_only(p, c, b, k, t):
    u, loss = local_update(p, b, k, t)
    exchange = t % 10**9 == 0
    diff = elastic.elastic_difference(p, c, alpha)
    summed = lax.cond(
        exchange, lambda v: lax.psum(v, "d"), lambda v: jax.tree.map(jnp.zeros_like, v), diff
    )
    p2 = jax.tree.map(lambda a, du, dd: a + du - jnp.where(exchange, dd, 0), p, u, diff)
    return p2, tree_add(c, summed), loss

  cands = {
      "bare": make("bare", bare, 1),
      "optax+key": make("optax+key", optax_key, 1),
      "+center": make("+center", with_center, 2),
      "+cond(local)": make("+cond(local)", cond_local, 2),
      "cond(psum only)": make("cond(psum only)", cond_psum_only, 2),
  }
  res = common.time_side_by_side(cands, args.steps, args.repeats)
  print(f"# cond cost of the EASGD local step  ({datetime.date.today()}; {common.machine()})")
  print(
      f"# {d} devices x 1 worker; MLP 256,256; batch {args.batch}/worker; "
      f"{args.steps} steps x {args.repeats} repeats, median; no step exchanges"
  )
  print(f"{'candidate':16s} {'ms/step':>8s} {'spread':>7s} {'/ bare':>7s} {'copies':>14s}")
  for name, r in res.items():
    n, b = common.op_bytes(hlo[name], "copy")
    print(
        f"{name:16s} {1e3 * r['median_s']:8.3f} {common.spread(r['all_s']):>7s} "
        f"{r['median_s'] / res['bare']['median_s']:7.3f} {n:4d} ({b / 1e6:.2f} MB)"
    )


if __name__ == "__main__":
  main()
