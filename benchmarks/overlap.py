"""Benchmark: overlap (delay V) of async EASGD's exchanges with the local steps.

Async EASGD, 2 workers on the threads runtime's pieces (``easgd.runtimes.threads.
ThreadBackend`` driven by ``easgd.runtimes.driver.Driver``, what ``--runtime threads``
runs), an MLP (--hidden) on random 28x28 batches of 32, plain SGD, tau = --tau. Each worker
sits behind an emulated link (``easgd.runtimes.link_emulation``, a token bucket of a
tiny burst, no latency) whose rate makes one exchange (push + pull of the float32
parameters) cost about --exchange-steps local steps' time (default tau / 2), the local step
time t_w being measured first without link and without exchanges (tau larger than the run:
one exchange, at clock 0). Candidates, run round-robin --repeats times (median):

  no link, no exchange   t_w, the local step alone;
  no link (exchanges)    "no communication": the exchanges every tau steps, served at
                         once (their computation: the center's rule, the messages' copies),
                         no link to cross: the reference of the ratio;
  V = 0                  Algorithm 1: the worker sleeps through each exchange;
  V = 1 .. 4             the exchange runs on the worker's sender thread beside its
                         next V local steps (docs/guides/streaming.md, "Overlap in the
                         asynchronous runtimes").

Reported per candidate: the local step time (training wall time / local steps per worker),
its ratio to "no communication" and to the step alone, and the seconds the workers waited for
replies in flight (the communication not hidden). On a machine with as many cores as
workers the exchange's own computation (on the sender's thread) competes with the local
steps: --workers below the core count leaves it a core. The issue's goal: with V >= 1 the ratio within 1.05, where V = 0
pays the link. Prints a markdown table and writes JSON (--out).

Run: ``python benchmarks/overlap.py`` (about a minute on 2 cores; timings on a shared
machine are noisy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import force_cpu_devices, machine, mlp_setup, random_batch


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tau", type=int, default=8)
  ap.add_argument("--steps", type=int, default=96, help="local steps per worker per run")
  ap.add_argument("--hidden", type=int, default=256, help="width of the MLP's two layers")
  ap.add_argument("--exchange-steps", type=float, default=None, help="default tau / 2")
  ap.add_argument("--delays", default="1,2,3,4")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--workers", type=int, default=2, help="p, threads computing at once")
  ap.add_argument("--out", default="overlap.json")
  args = ap.parse_args()
  force_cpu_devices(1)

  import jax

  from easgd.asynchrony import simulation
  from easgd.core import elastic
  from easgd.runtimes import threads
  from easgd.runtimes.driver import Driver
  from easgd.runtimes.link_emulation import LinkSpec
  from easgd.runtimes.shared import AsyncSetup

  p, b = args.workers, 32
  model, params, loss = mlp_setup(hidden=(args.hidden, args.hidden))
  del model
  xs, ys = random_batch((8, p, b))
  batch_fn = lambda i, t: (xs[t % 8, i], ys[t % 8, i])  # noqa: E731
  nbytes = elastic.reduced_bytes(params)
  delays = [int(v) for v in args.delays.split(",") if v]
  exchange_steps = args.tau / 2 if args.exchange_steps is None else args.exchange_steps

  def run(tau, delay, link):
    algo = simulation.async_easgd(
        loss, num_workers=p, tau=tau, beta=0.9, learning_rate=0.05, delay=delay
    )
    setup = AsyncSetup(algo, params, batch_fn, jax.random.key(0))
    backend = threads.ThreadBackend(setup, p, links=None if link is None else [link] * p)
    waited = [0.0]
    result = backend.result

    def counted(handle):
      r = result(handle)
      waited[0] += r.waited_s
      return r

    backend.result = counted
    try:
      backend.warm_up()
      driver = Driver(backend, [0] * p, chunk_steps=8)
      start = time.perf_counter()
      driver.run_to(args.steps * p)
      seconds = time.perf_counter() - start
    finally:
      backend.close()
    return seconds / args.steps, waited[0]

  base_tau = args.steps * p + 1  # one exchange, at clock 0
  t_w = statistics.median(run(base_tau, 0, None)[0] for _ in range(2))
  rate = 2 * nbytes / (exchange_steps * t_w)  # bytes/s: push + pull = exchange_steps * t_w
  link = LinkSpec(rate, 1.0, 0.0)
  candidates = [
      ("no link, no exchange", base_tau, 0, None),
      ("no link (exchanges, V = 0)", args.tau, 0, None),
      ("V = 0", args.tau, 0, link),
  ]
  candidates += [(f"V = {v}", args.tau, v, link) for v in delays]
  times = {name: [] for name, *_ in candidates}
  waits = {name: [] for name, *_ in candidates}
  for _ in range(args.repeats):
    for name, tau, delay, l in candidates:
      step_s, waited = run(tau, delay, l)
      times[name].append(step_s)
      waits[name].append(waited)
  base = statistics.median(times["no link (exchanges, V = 0)"])  # no communication
  bare = statistics.median(times["no link, no exchange"])
  rows = []
  for name, *_ in candidates:
    med = statistics.median(times[name])
    rows.append(
        dict(
            candidate=name,
            step_ms=1e3 * med,
            ratio=med / base,
            ratio_no_exchange=med / bare,
            waited_s=statistics.median(waits[name]),
            all_step_ms=[1e3 * t for t in times[name]],
        )
    )
  print(
      f"async EASGD, {p} workers (threads), tau = {args.tau}, MLP {args.hidden}x{args.hidden} "
      f"({nbytes} bytes per message), link {rate * 8 / 1e6:.1f} Mbit/s: one exchange ~ "
      f"{exchange_steps:g} local steps of t_w = {1e3 * t_w:.2f} ms; {args.steps} local steps "
      f"per worker, median of {args.repeats}; {machine()}\n"
  )
  print(
      "| candidate | local step (ms) | / no communication | / no exchange | "
      "waited for replies (s) |"
  )
  print("| --- | --- | --- | --- | --- |")
  for r in rows:
    print(
        f"| {r['candidate']} | {r['step_ms']:.2f} | {r['ratio']:.3f} | "
        f"{r['ratio_no_exchange']:.3f} | {r['waited_s']:.3f} |"
    )
  out = dict(
      tau=args.tau,
      workers=p,
      steps=args.steps,
      message_bytes=int(nbytes),
      link_bytes_s=rate,
      exchange_steps=exchange_steps,
      t_w_s=t_w,
      machine=machine(),
      rows=rows,
  )
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
