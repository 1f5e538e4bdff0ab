"""Benchmark 6: real asynchronous workers (threads runtime) against synchronous ones.

Two measurements, side by side in one run.

A. Time to a target test error with a straggler. MNIST-1D, the small 1-D CNN,
   4 workers of batch 32, plain SGD at learning rate --lr, EASGD with tau = 4
   and beta = 0.9, on --devices fake CPU devices. Candidates:
     async EASGD  the threads runtime (``easgd.runtimes.threads`` driven by
                  ``easgd.runtimes.driver``, what ``--runtime threads`` runs);
     sync EASGD   the SPMD trainer's mapped step (``easgd.runtimes.training_run.Run``);
     pmean SGD    likewise.
   Each runs with all workers at full speed, then with worker 3 slowed down
   --slowdown times: after each of its local steps it sleeps (slowdown - 1) *
   t_w, t_w being a worker's median local step time in the threads runtime at
   full speed (measured first, from the driver's per-chunk rates). A
   synchronous step waits for the slowest worker, so the synchronous runs
   sleep the same (slowdown - 1) * t_w after every step. The center is
   evaluated on all 2000 test signals every --eval-every-steps steps (a step
   = 4 local steps, the synchronous runs' step); the clock stops during
   evaluations (the workers are idle then, in every candidate), so the times
   are training time. Compilation happens before the clock starts. Reported:
   training seconds until the center's test error first reaches --target-error
   (median over --repeats runs of each candidate, run round-robin), and the
   ratio of each synchronous method's time to async EASGD's.
   On this shared 2-core CPU a sleeping worker leaves its share of the cores to
   the others, which a worker on its own device would not: the straggler costs
   the asynchronous run less here than it would on separate devices.

B. The threads runtime's local step against a bare jitted step. One worker,
   on one device: ``easgd.runtimes.shared.WorkerLoop.run`` (the runtime's local
   step: batch from the data contract, the compiled ``local`` program with its
   key and clock, the host waiting one step late) against a hand-written
   ``jax.jit`` SGD step (value_and_grad, optax update) fed the same batches in
   a plain loop with the same one-step-late wait, timed round-robin
   (``benchmarks/common.py``). Target <= 1.10.

Run: ``python benchmarks/real_async.py`` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

from common import force_cpu_devices


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--devices", type=int, default=2)
  ap.add_argument("--epochs", type=int, default=12, help="longest run, in epochs")
  ap.add_argument("--lr", type=float, default=0.1)
  ap.add_argument("--tau", type=int, default=4)
  ap.add_argument("--target-error", type=float, default=0.25)
  ap.add_argument(
      "--repeats", type=int, default=3, help="runs of each candidate in part A (median time)"
  )
  ap.add_argument("--eval-every-steps", type=int, default=31)
  ap.add_argument("--slowdown", type=float, default=3.0)
  ap.add_argument("--overhead-steps", type=int, default=50)
  ap.add_argument("--overhead-repeats", type=int, default=9)
  ap.add_argument("--skip", default="", help="comma list of parts to skip: A,B")
  args = ap.parse_args()
  force_cpu_devices(args.devices)
  import common

  skip = {s.strip().upper() for s in args.skip.split(",") if s.strip()}
  print(f"# real asynchronous workers  ({datetime.date.today()}; {common.machine()})")
  t0 = time.perf_counter()
  if "A" not in skip:
    part_a(args)
  if "B" not in skip:
    part_b(args)
  print(f"# total {time.perf_counter() - t0:.0f} s")


# -- A: time to target with a straggler --------------------------------------------


def _config(args, algorithm, runtime="spmd"):
  from easgd import TrainConfig

  cfg = TrainConfig(
      algorithm=algorithm,
      dataset="mnist1d",
      model="cnn",
      num_workers=4,
      num_devices=args.devices,
      global_batch_size=128,
      num_epochs=args.epochs,
      learning_rate=args.lr,
      progress=False,
      runtime=runtime,
      seed=0,
  )
  if algorithm == "pmean_sgd":
    cfg = cfg.replace(tau=TrainConfig().tau)
  else:
    cfg = cfg.replace(tau=args.tau, beta=0.9)
  return cfg.validate()


def _center_error(run):
  import jax
  import numpy as np

  evaluate = jax.jit(run.task.evaluate)
  batch = run.task.test.arrays

  def error(center):
    return 1.0 - float(np.mean(np.asarray(evaluate(center, batch)["correct"])))

  return error


def _sync_run(args, algorithm, delay):
  """(times, errors) of an SPMD run, evaluating every eval_every steps."""
  import jax

  from easgd.parallel import placement
  from easgd.runtimes import training_run
  from easgd.tasks import batches

  run = training_run.Run(_config(args, algorithm))
  error = _center_error(run)
  spe, p = run.steps_per_epoch, run.config.num_workers
  cfg = run.config

  def batch(step):
    epoch = step // spe + 1
    ix = batches.worker_batch_indices(
        len(run.task.train), p, cfg.per_worker_batch_size, cfg.seed, epoch
    )[step % spe]
    return placement.split_workers(run.task.train.take(ix), run.layout)

  warm = run.initial_state()
  for clock in (0, 1):  # compile the exchange and the local program
    warm = run.step_fn(*warm, batch(clock), run.step_key, clock)[:2]
  jax.block_until_ready(warm)
  worker, shared = run.initial_state()
  error(placement.first_copy(run.algorithm.center(shared)))  # compiles the evaluation
  times, errors, train_s, last = (
      [0.0],
      [error(placement.first_copy(run.algorithm.center(shared)))],
      0.0,
      None,
  )
  start = time.perf_counter()
  for step in range(run.total_steps):
    worker, shared, loss = run.step_fn(worker, shared, batch(step), run.step_key, step)
    if delay:  # the step ends when the slowest worker is done
      loss.block_until_ready()
      time.sleep(delay)
    else:
      last = common_one_step_late(last, loss)
    if (step + 1) % args.eval_every_steps == 0:
      jax.block_until_ready((worker, shared))
      train_s += time.perf_counter() - start
      times.append(train_s)
      errors.append(error(placement.first_copy(run.algorithm.center(shared))))
      if errors[-1] <= args.target_error:
        break
      start = time.perf_counter()
  return times, errors


def common_one_step_late(previous, current):
  import common

  return common.one_step_late(previous, current)


def _async_run(args, delays, measure=False):
  """(times, errors, exchanges, worker step seconds) of a threads-runtime run."""
  import jax

  from easgd.runtimes import async_runs, threads, training_run
  from easgd.runtimes.driver import Driver
  from easgd.settings import runtime_table

  run = training_run.Run(_config(args, "async_easgd", "threads"))
  error = _center_error(run)
  p = run.config.num_workers
  setup = async_runs.make_setup(run)
  backend = threads.ThreadBackend(
      setup, p, devices=threads.worker_devices(p, list(run.layout.devices)), delays_s=delays
  )
  try:
    backend.warm_up()
    driver = Driver(backend, [0] * p, chunk_steps=runtime_table.TABLE["threads"].chunk_steps)
    _, shared, _ = backend.state()
    error(shared.center)  # compiles the evaluation
    times, errors, exchanges, train_s = [0.0], [error(shared.center)], [0], 0.0
    step_s = []
    for boundary in range(args.eval_every_steps, run.total_steps + 1, args.eval_every_steps):
      start = time.perf_counter()
      before = list(driver.clocks)
      driver.run_to(boundary * p)
      seconds = time.perf_counter() - start
      train_s += seconds
      _, shared, log = backend.state()
      times.append(train_s)
      errors.append(error(jax.device_get(shared.center)))
      exchanges.append(len(log))
      if measure:  # a worker's time per local step, all running at full speed
        step_s += [seconds / (c - b) for c, b in zip(driver.clocks, before) if c > b]
      if errors[-1] <= args.target_error and not measure:
        break
      if measure and len(times) > 4:
        break
  finally:
    backend.close()
  return times, errors, exchanges, statistics.median(step_s) if step_s else None


def _time_to(times, errors, target):
  for t, e in zip(times, errors):
    if e <= target:
      return t
  return None


def part_a(args):
  print(
      f"# A. time to test error {args.target_error:.2f}: MNIST-1D, CNN, 4 workers x "
      f"batch 32, SGD lr {args.lr}, EASGD tau={args.tau} beta=0.9, {args.devices} "
      f"fake CPU devices; center evaluated every {args.eval_every_steps} steps "
      f"(4 local steps each), clock stopped during evaluations, compilation before"
  )
  _, _, _, t_w = _async_run(args, (0.0,) * 4, measure=True)
  delay = (args.slowdown - 1) * t_w
  print(
      f"# a worker's local step in the threads runtime, all 4 at full speed: "
      f"{1000 * t_w:.2f} ms; the straggler (worker 3) sleeps {1000 * delay:.2f} ms "
      f"after each local step ({args.slowdown:g}x); a synchronous step sleeps as much"
  )
  rows, reached = {}, {}
  for _ in range(args.repeats):
    for straggler in (False, True):
      d = delay if straggler else 0.0
      runs = [("async EASGD (threads)", lambda: _async_run(args, (0.0, 0.0, 0.0, d)))]
      runs += [
          (f"{label} (spmd)", lambda name=name: _sync_run(args, name, d) + (None,))
          for name, label in (("easgd", "sync EASGD"), ("pmean_sgd", "pmean SGD"))
      ]
      for label, go in runs:
        times, errors, exchanges = go()[:3]
        rows.setdefault((label, straggler), (times, errors, exchanges))  # first repeat
        reached.setdefault((label, straggler), []).append(
            _time_to(times, errors, args.target_error)
        )

  def median_time(key):
    ts = reached[key]
    return None if None in ts else statistics.median(ts)

  names = list(dict.fromkeys(n for n, _ in rows))
  base = {s: median_time((names[0], s)) for s in (False, True)}
  print(
      f"# training seconds to test error {args.target_error:.2f}, median of "
      f"{args.repeats} runs (each run's time in brackets below)"
  )
  print(
      f"{'candidate':24s} {'full speed s':>12s} {'/async':>7s} {'one 3x slow s':>13s} "
      f"{'/async':>7s} {'slow/full':>9s}"
  )
  for n in names:
    t = [median_time((n, s)) for s in (False, True)]
    cells = []
    for s, ts in zip((False, True), t):
      cells += [
          f"{ts:12.2f}" if ts is not None else f"{'not reached':>12s}",
          f"{ts / base[s]:7.2f}" if ts is not None and base[s] else f"{'-':>7s}",
      ]
    ratio = f"{t[1] / t[0]:9.2f}" if None not in t else f"{'-':>9s}"
    print(f"{n:24s} {cells[0]} {cells[1]} {cells[2].rjust(13)} {cells[3]} {ratio}")
  for (n, s), ts in reached.items():
    print(
        f"#   {n + (' slow' if s else ''):30s} "
        + " ".join("-" if t is None else f"{t:.2f}" for t in ts)
    )
  print(
      "# curves of the first run (training seconds: center test error; async also exchanges so far)"
  )
  for (n, s), (times, errors, exchanges) in rows.items():
    pts = " ".join(
        f"{t:.1f}:{e:.3f}" + (f"/{x}" if exchanges else "")
        for t, e, x in zip(times, errors, exchanges or [None] * len(times))
    )
    print(f"{n + (' slow' if s else ''):30s} {pts}")


# -- B: the runtime's local step against a bare jitted step -------------------------


def part_b(args):
  import common
  import jax
  import optax

  from easgd.asynchrony import simulation
  from easgd.asynchrony.log import async_rules, init_shared, init_worker
  from easgd.runtimes import async_runs, training_run
  from easgd.runtimes.optimizers import make_optimizer
  from easgd.runtimes.shared import AsyncSetup, CenterStore, WorkerLoop, WorkerPrograms

  print(
      f"# B. local step, one worker on one device: the threads runtime's "
      f"WorkerLoop.run against a bare jax.jit SGD step, same batches, both waiting one "
      f"step late; {args.overhead_steps} steps x {args.overhead_repeats} repeats, "
      f"median"
  )
  print(
      f"{'model':6s} {'batch':>5s} {'runtime ms':>10s} {'spread':>7s} {'bare ms':>8s} "
      f"{'spread':>7s} {'ratio':>6s} target"
  )
  for model, batch in (("cnn", 32), ("mlp", 32), ("cnn", 128)):
    cfg = _config(args, "async_easgd", "threads").replace(
        model=model, num_workers=1, num_devices=1, global_batch_size=batch, tau=1
    )
    run = training_run.Run(cfg)
    loss_fn = run.task.loss
    opt = make_optimizer(cfg, run.steps_per_epoch)
    algo = simulation.async_easgd(loss_fn, opt, num_workers=1, tau=2**30, beta=0.9)
    batch_fn = async_runs.make_batch_fn(run)
    setup = AsyncSetup(algo, run.init_params, batch_fn, run.step_key)
    rules = async_rules(algo)
    programs = WorkerPrograms(rules)
    device = jax.devices()[0]
    center = CenterStore(rules, programs, init_shared(rules, run.init_params), device)
    loop = WorkerLoop(
        0, programs, setup, init_worker(rules, run.init_params), center.exchange, device
    )
    loop.warm_up()
    loop.run(1)  # clock 0 exchanges; every later step is local

    @jax.jit
    def bare_step(params, opt_state, x, y, key):
      loss, grads = jax.value_and_grad(loss_fn)(params, (x, y), key)
      updates, opt_state = opt.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    state = {"params": jax.device_put(run.init_params, device), "clock": 1}
    state["opt"] = opt.init(state["params"])
    key = jax.device_put(run.step_key, device)

    def bare(steps):
      last = None
      for _ in range(steps):
        x, y = batch_fn(0, state["clock"])
        state["params"], state["opt"], loss = bare_step(state["params"], state["opt"], x, y, key)
        state["clock"] += 1
        last = common.one_step_late(last, loss)
      jax.block_until_ready(state["params"])

    def runtime(steps):
      loop.run(steps)
      jax.block_until_ready(loop.state)

    res = common.time_side_by_side(
        {"runtime": runtime, "bare": bare}, args.overhead_steps, args.overhead_repeats
    )
    r, b = res["runtime"], res["bare"]
    ratio = r["median_s"] / b["median_s"]
    print(
        f"{model:6s} {batch:5d} {1000 * r['median_s']:10.3f} "
        f"{common.spread(r['all_s']):>7s} {1000 * b['median_s']:8.3f} "
        f"{common.spread(b['all_s']):>7s} {ratio:6.3f} <= 1.10 "
        f"{'met' if ratio <= 1.10 else 'NOT met'}"
    )


if __name__ == "__main__":
  main()
