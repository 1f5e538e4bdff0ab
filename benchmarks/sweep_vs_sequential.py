"""How much faster is the one-program tau x alpha sweep than 64 runs one after another?

Method (all three measured side by side in ONE process, interleaved per repeat,
so that they share the machine's load):

  Work: the 8 x 8 grid tau in {1, 2, 4, ..., 128} x alpha in {0.05, ..., 0.8}
  (the grid of paper_notes/figures/sweep_mnist1d), learning rate 0.2, 4 workers,
  the MNIST-1D MLP of easgd.tasks.models (78,858 parameters), plain-SGD local steps on
  batches of 32 per worker, --num-steps steps, then the center evaluated on the
  2,000 test signals. Every variant sees the same initial parameters and the
  same batches.

  A  one program   easgd.sweeps.engine.make_sweep_fn: all 64 configurations
                   vmapped in one jitted program, each building
                   easgd.core.algorithms.easgd from its traced tau, alpha, eta.
                   "cold" = the first call (trace + compile + run);
                   "warm" = later calls (run only).
  B  sequential,   easgd.sweeps.engine.run_with_algorithm for each configuration
     own program   in turn: easgd.core.algorithms.easgd + optax.sgd with tau and alpha
                   Python constants, vmapped over workers, scanned over steps,
                   jitted; every configuration is its own compiled program
                   (what one gets by looping over the trainer's pieces), so
                   every repeat pays 64 compilations.
  C  sequential,   the sweep program with a grid of ONE configuration, compiled
     one program   once in warm-up and called 64 times: the gain of batching
                   alone, without any compile cost.

  Warm-up: A once (that call is the cold time), B for one configuration,
  C once. Then --repeats rounds of (A, B, C), each timed with
  time.perf_counter around calls that end in jax.block_until_ready; reported:
  the median over rounds. Ratios: B / A-warm, B / A-cold, C / A-warm.

Run:  .venv/bin/python benchmarks/sweep_vs_sequential.py [--num-steps 100]
      [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from easgd._util import flags
from easgd._util.flags import option
from easgd.core import algorithms
from easgd.sweeps import engine, network
from easgd.sweeps.engine import CompileCounter
from easgd.sweeps.grid import SweepGrid
from easgd.tasks import datasets, models

TAU = (1, 2, 4, 8, 16, 32, 64, 128)
ALPHA = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)


@dataclasses.dataclass(frozen=True)
class Options:
  """The benchmark's settings (flags from the fields, ``easgd._util.flags``)."""

  num_steps: int = option(100, "steps per configuration")
  repeats: int = option(3, "timed rounds of (A, B, C) after the warm-up")
  learning_rate: float = option(0.2, "eta of every configuration")
  num_workers: int = option(4, "p")
  batch: int = option(32, "examples per worker per step")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  flags.add_flags(parser, Options)
  args = Options(**flags.overrides(parser.parse_args(), Options))
  p, steps = args.num_workers, args.num_steps

  ds = datasets.load_dataset("mnist1d")
  model = models.make_model("mlp", ds.num_classes)
  init_key, key = jax.random.split(jax.random.key(0))
  params0 = models.init_params(model, ds.input_shape, init_key)
  x, y = network.network_batches(ds, p, args.batch, steps, seed=0)
  batches = (jnp.asarray(x), jnp.asarray(y))
  test = (jnp.asarray(ds.test_x), jnp.asarray(ds.test_y))
  loss_fn, eval_fn = network.network_fns(model)
  grid = SweepGrid(TAU, ALPHA, (args.learning_rate,), (p,)).validate()
  hyper = grid.hyperparameters()
  lr, tau, alpha = hyper["learning_rate"], hyper["tau"], hyper["alpha"]
  n = lr.size
  workers0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (p, *a.shape)), params0)
  run = engine.make_sweep_fn(
      functools.partial(algorithms.easgd, loss_fn, num_workers=p), p, steps, eval_fn
  )

  def one_program():
    return jax.block_until_ready(run(hyper, workers0, params0, batches, test, key, 1e3))

  def own_programs(indices=range(n)):
    for i in indices:
      algo = algorithms.easgd(
          loss_fn, optax.sgd(float(lr[i])), num_workers=p, tau=int(tau[i]), alpha=float(alpha[i])
      )
      engine.run_with_algorithm(
          algo, params0, batches, key, num_workers=p, eval_fn=eval_fn, eval_data=test
      )

  def one_config(i):
    return {k: v[i : i + 1] for k, v in hyper.items()}

  def one_compiled_program_each():
    for i in range(n):
      jax.block_until_ready(run(one_config(i), workers0, params0, batches, test, key, 1e3))

  def timed(fn):
    start = time.perf_counter()
    with CompileCounter() as cc:
      fn()
    return time.perf_counter() - start, cc.count

  print(
      f"jax {jax.__version__}, {jax.devices()[0].platform} "
      f"({jax.devices()[0].device_kind}); {n} configurations = 8 tau x 8 alpha, "
      f"p={p}, eta={args.learning_rate}, {steps} steps, batch {args.batch}/worker, "
      f"MLP {models.count_params(params0)} params; median of {args.repeats} "
      f"rounds after warm-up",
      flush=True,
  )
  cold, cold_compiles = timed(one_program)
  print(f"warm-up: A cold {cold:.2f} s ({cold_compiles} compilations)", flush=True)
  t_b1, _ = timed(lambda: own_programs([0]))
  t_c1, _ = timed(
      lambda: jax.block_until_ready(run(one_config(0), workers0, params0, batches, test, key, 1e3))
  )
  print(f"warm-up: B one configuration {t_b1:.2f} s, C compile {t_c1:.2f} s", flush=True)
  times = {"A": [], "B": [], "C": []}
  compiles = {"A": [], "B": [], "C": []}
  for r in range(args.repeats):
    for name, fn in (("A", one_program), ("B", own_programs), ("C", one_compiled_program_each)):
      t, c = timed(fn)
      times[name].append(t)
      compiles[name].append(c)
    print(
        f"round {r + 1}: A {times['A'][-1]:.2f} s, B {times['B'][-1]:.2f} s, "
        f"C {times['C'][-1]:.2f} s",
        flush=True,
    )
  med = {k: statistics.median(v) for k, v in times.items()}
  print(
      f"A  one program, 64 configs vmapped   : warm {med['A']:8.2f} s "
      f"(compilations per round {compiles['A'][-1]}), cold {cold:.2f} s"
  )
  print(
      f"B  64 runs, each its own program      : {med['B']:8.2f} s "
      f"(compilations per round {compiles['B'][-1]})"
  )
  print(
      f"C  64 runs of one compiled program    : {med['C']:8.2f} s "
      f"(compilations per round {compiles['C'][-1]})"
  )
  print(
      f"speed-up B / A-warm = {med['B'] / med['A']:.1f}x, "
      f"B / A-cold = {med['B'] / cold:.1f}x, C / A-warm = {med['C'] / med['A']:.1f}x"
  )


if __name__ == "__main__":
  main()
