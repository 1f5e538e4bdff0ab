"""``easgd predict``: a run's training clock on a link, predicted from the run measured without it.

The inputs are one run directory (``config.json``, ``summary.json``, ``metrics.jsonl``,
``times.jsonl``; a real asynchronous run also ``exchanges.jsonl``), measured with no link or
a fast one, and the link (rate, latency, burst; the processes it joins). The output is the
clock ``times.jsonl`` would hold at each evaluation of the same run on that link
(``easgd.parallel.time_model``; docs/guides/slow_link.md, "The time model"), and from the
run's curve the time to a target test error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from easgd.parallel import link, time_model
from easgd.settings import runtime_table
from easgd.settings.config import ConfigError

# The run's files and the algorithms need JAX: imported where a prediction is made, so that
# `easgd predict --help` (add_predict_arguments) stays light.


def link_model(rate=None, latency=None, burst=None) -> tuple:
  """(``time_model.LinkModel``, burst bytes) of a link in tc's spellings
  (``easgd.parallel.link.Link.parse``: rate e.g. "10mbit", latency "5ms", burst "64kb";
  None rate: no limit; None latency: 0; None burst: ``Link.default_burst``).

  Raises:
    easgd.parallel.link.LinkError: a rate, latency or burst that is not a positive
      number with a unit (one line).
  """
  # rate and burst rounded as tc and the emulated link round them (Link.parse); the latency
  # is the model's delay per transfer (whole microseconds), not tbf's queue bound
  latency_s = 0.0 if latency is None else round(link.seconds(latency) * 1e6) / 1e6
  if rate is None:
    if burst is not None:
      link.size_bytes(burst)  # checked: a bad burst is refused whatever comes with it
    return time_model.LinkModel(math.inf, latency_s), math.inf
  shaped = link.Link.parse(rate, burst=burst)
  rate_b, burst_b = shaped.rate_bit_s / 8, shaped.burst_bytes
  return time_model.LinkModel(rate_b, latency_s), burst_b


def clock_communication(config, exchange_bytes: int, total_steps: int, steps) -> list:
  """The all-reduces across workers on an spmd run's clock at each of ``steps``:
  those of steps 2..s (``times.jsonl`` does not count the first step, which compiles),
  what the compiled programs send (``Algorithm.wire_communication`` of the run's
  algorithm, built once; ``easgd.parallel.accounting.communication_by_level``): the
  method's exchanges for a synchronous algorithm, every worker's message every slot for a
  simulated asynchronous one.

  Args:
    config: the run's validated TrainConfig.
    exchange_bytes: bytes of one exchange or gradient average (the summary's).
    total_steps: the run's total steps (local SGD and DiLoCo exchange at the last).
    steps: global steps, ints >= 0.

  Returns:
    list of ``easgd.core.base.Communication`` (all-reduces, payload bytes per device),
    zero for a step <= 1.
  """
  import optax

  from easgd.core.base import Communication
  from easgd.methods import registry
  from easgd.parallel import accounting

  algorithm = registry.make_algorithm(config, lambda p, b, k: 0.0, optax.sgd(0.0), total_steps)

  def across(n):
    return accounting.communication_by_level(
        algorithm, n, exchange_bytes, config.devices_per_worker, config.shard_params, program=True
    ).across_workers

  first = across(1)
  return [
      Communication(0, 0)
      if s <= 1
      else Communication(across(s).all_reduces - first.all_reduces, across(s).bytes - first.bytes)
      for s in steps
  ]


def spmd_clock(
    config,
    exchange_bytes: int,
    total_steps: int,
    step: int,
    step_s: float,
    num_processes: int,
    model: time_model.LinkModel,
) -> float:
  """The clock of an spmd run at global step ``step`` on a link: steps 2..step of
  ``step_s`` seconds each plus their all-reduces across workers
  (:func:`clock_communication`) crossing the link between ``num_processes`` processes
  (``time_model.spmd_seconds``).

  Args:
    config: the run's validated TrainConfig.
    exchange_bytes: bytes of one exchange or gradient average (the summary's).
    total_steps: the run's total steps (local SGD and DiLoCo exchange at the last).
    step: global step, an int >= 0.
    step_s: measured seconds per step without the link.
    num_processes: processes the workers' all-reduces span.
    model: the link.

  Returns:
    float, seconds (0 for step <= 1).
  """
  (comm,) = clock_communication(config, exchange_bytes, total_steps, [step])
  if step <= 1:
    return 0.0
  return time_model.spmd_seconds(
      step - 1, step_s, comm.all_reduces, comm.bytes, num_processes, model
  )


def seconds_per_step(workdir) -> float:
  """A run's measured seconds per step (of one worker) on its clock (``times.jsonl``).

  Synchronous runs: from the first evaluation after step 0 to the last (the clock does
  not count the first step, which compiles). Real asynchronous runs: the clock at the
  last evaluation over the mean of the workers' local steps.

  Raises:
    ConfigError: the run's files cannot be read; ValueError: no evaluation after step 0.
  """
  from easgd.run import rundir, timing

  workdir = Path(workdir)
  times = {r["step"]: r["time_s"] for r in timing.read_times(workdir)}
  history = rundir.read_history(workdir)
  steps = [r["step"] for r in history if r["step"] > 0]
  if "worker_local_steps" in history[-1]:
    if not steps:
      raise ValueError(f"run '{workdir}' has no evaluation after step 0: no step time")
    return times[history[-1]["step"]] / statistics.mean(history[-1]["worker_local_steps"])
  if len(steps) < 2:
    raise ValueError(f"run '{workdir}' has fewer than 2 evaluations after step 0: no step time")
  return (times[steps[-1]] - times[steps[0]]) / (steps[-1] - steps[0])


def predict_run(
    workdir,
    rate=None,
    latency=None,
    burst=None,
    num_processes=None,
    solo=None,
    clock_from=None,
    worker_delays=(),
) -> dict[str, Any]:
  """The run of ``workdir`` predicted on a link.

  Args:
    workdir: a finished (or stopped) run directory with ``times.jsonl``.
    rate, latency, burst: the link, in tc's spellings (:func:`link_model`).
    num_processes: the processes the link joins (spmd runs; None: the run's own).
    solo: real asynchronous runs: the directory of the same run with one worker, without
      the link (its seconds per step: a worker computing alone; None: every worker's
      step takes what it takes with all computing).
    clock_from: the run of the same configuration whose clock gives the seconds per step
      (:func:`seconds_per_step`; None: ``workdir``), e.g. one that evaluates seldom.
    worker_delays: real asynchronous runs: seconds each worker sleeps after each step
      (stragglers, as ``TrainConfig.worker_delays``), beyond what the measured run had.

  Returns:
    dict: ``steps`` (the evaluations' steps), ``measured_s`` (the run's clock at each),
    ``predicted_s`` (the clock on the link at each), ``all_reduces`` (spmd runs: those on
    the clock at each, :func:`clock_communication`), ``step_s`` (the measured seconds per
    step of each worker, a list), ``runtime``.

  Raises:
    FileNotFoundError: a file of the run is missing.
    easgd.parallel.link.LinkError: a bad rate, latency or burst.
  """
  from easgd.run import rundir, timing
  from easgd.runtimes.shared import read_log

  model, burst_b = link_model(rate, latency, burst)  # checked before anything is read
  if burst is not None and rate is None:
    raise ValueError(f"--burst {burst!r} is the bucket of a rate: give --rate too")
  workdir = Path(workdir)
  config = rundir.saved_config(workdir).validate()
  if config.link_rate or config.link_rates or config.link_latency:
    raise ValueError(
        f"run '{workdir}' was measured behind an emulated link (link_rate "
        f"{config.link_rate!r}, link_rates {list(config.link_rates)}, link_latency "
        f"{config.link_latency!r}): predict from the same run without one"
    )
  summary = json.loads((workdir / rundir.SUMMARY_FILE).read_text())
  times = {r["step"]: r["time_s"] for r in timing.read_times(workdir)}
  history = rundir.read_history(workdir)
  steps = [int(r["step"]) for r in history]
  measured = [times.get(s) for s in steps]
  spec = runtime_table.TABLE[config.runtime]
  if spec.backend is None:
    unread = dict(solo=solo, burst=burst, worker_delays=list(worker_delays) or None)
    for flag, value in unread.items():
      if value is not None:
        raise ValueError(
            f"--{flag.replace('_', '-')} applies to real asynchronous runs (threads, ray); "
            f"run '{workdir}' is an spmd run"
        )
    P = summary["num_processes"] if num_processes is None else num_processes
    if P > config.num_workers:
      raise ValueError(
          f"--num-processes {P} exceeds the run's {config.num_workers} workers (one process "
          "holds at least one worker)"
      )
    if P == 1 and (rate is not None or latency is not None):
      raise ValueError(
          f"run '{workdir}' ran in one process: a link between processes crosses none of its "
          "all-reduces; predict from the run measured in the processes the link joins "
          "(easgd link at a fast rate) or give --num-processes"
      )
    # the clock counts steps 2..s (the first step compiles): its seconds per step from the
    # first evaluation after step 0 to the last
    step_s = seconds_per_step(clock_from or workdir)
    nbytes = summary["exchange_bytes"]
    comms = clock_communication(config, nbytes, summary["total_steps"], steps)
    predicted = [
        0.0 if s <= 1 else time_model.spmd_seconds(s - 1, step_s, *c, P, model)
        for s, c in zip(steps, comms)
    ]
    return dict(
        runtime=config.runtime,
        steps=steps,
        measured_s=measured,
        predicted_s=predicted,
        step_s=[step_s] * config.num_workers,
        all_reduces=[c.all_reduces for c in comms],
    )
  if num_processes is not None:
    raise ValueError(
        f"--num-processes applies to spmd runs; run '{workdir}' is a {config.runtime} run "
        "(its workers are threads or actors behind emulated links)"
    )
  if (
      solo is not None
      and len(rundir.read_history(Path(solo))[-1].get("worker_local_steps", ())) != 1
  ):
    raise ValueError(f"--solo '{solo}' must be a real asynchronous run of one worker")
  if worker_delays and len(worker_delays) != config.num_workers:
    raise ValueError(
        f"worker delays {list(worker_delays)} must give one per worker "
        f"(num_workers {config.num_workers})"
    )
  model = dataclasses.replace(model, framing=False)  # the emulated link charges payload
  log = read_log(workdir / rundir.EXCHANGES_FILE)
  # the schedule: every tau local steps, at the offset of the run's first exchange
  offset = min((int(r["local_step"]) for r in log if "local_step" in r), default=0)
  step_s = [seconds_per_step(clock_from or workdir)]  # all p workers computing
  if solo is not None:  # one worker alone
    step_s.insert(0, seconds_per_step(solo))
  # the driver's boundaries (epoch ends, evaluations, checkpoints), where every worker stops
  # and their clocks sum to step x p
  spe, last = summary["steps_per_epoch"], steps[-1]
  every = [spe, config.eval_every_steps, config.checkpoint_every_steps]
  bounds = sorted({b for e in every if e for b in range(e, last + 1, e)} | set(steps[1:]))
  at = time_model.async_seconds(
      [b * config.num_workers for b in bounds],
      config.num_workers,
      step_s,
      config.tau,
      summary["exchange_bytes"],
      summary["exchange_bytes"],
      model,
      burst_b,
      chunk_steps=spec.chunk_steps,
      offset=offset % config.tau,
      delays_s=worker_delays,
  )
  predicted = [0.0] + [at[bounds.index(s)] for s in steps[1:]]
  return dict(
      runtime=config.runtime, steps=steps, measured_s=measured, predicted_s=predicted, step_s=step_s
  )


def add_predict_arguments(p) -> None:
  """The flags of ``easgd predict`` (no JAX at parse time)."""
  p.add_argument("--run", required=True, metavar="DIR", help="the run measured without the link")
  p.add_argument("--rate", default=None, help="the link's rate in tc's units, e.g. 10mbit")
  p.add_argument("--latency", default=None, help="seconds added to every transfer, e.g. 5ms")
  p.add_argument("--burst", default=None, help="emulated links: the bucket's size, e.g. 64kb")
  p.add_argument(
      "--num-processes",
      type=int,
      default=None,
      metavar="P",
      help="the processes the link joins (default: the run's own)",
  )
  p.add_argument(
      "--solo",
      default=None,
      metavar="DIR",
      help="real asynchronous runs: the same run with one worker (a worker's step alone)",
  )
  p.add_argument(
      "--worker-delays",
      default="",
      metavar="S,S,...",
      help="real asynchronous runs: seconds each worker sleeps after each step (stragglers)",
  )
  p.add_argument(
      "--target-error",
      type=float,
      default=None,
      metavar="E",
      help="also the predicted time to center test error E (0 < E < 1), from the run's curve",
  )


def main_predict(args) -> int:
  """``easgd predict``: prints one line per evaluation (step, measured, predicted seconds)
  and, with ``--target-error``, the time to target; returns 0, or 2 after one line
  ``easgd: error: ...`` on bad input (a rate, a missing run file, a target out of range)."""
  from easgd.run import rundir, timing

  try:
    if args.target_error is not None and not 0 < args.target_error < 1:
      raise ValueError(f"--target-error {args.target_error} must lie in (0, 1)")
    if args.num_processes is not None and args.num_processes < 1:
      raise ValueError(f"--num-processes {args.num_processes} must be an integer >= 1")
    try:
      delays = [float(d) for d in args.worker_delays.split(",")] if args.worker_delays else []
    except ValueError:
      raise ValueError(
          f"--worker-delays {args.worker_delays!r} must be seconds per worker, "
          "comma-separated (e.g. 0,0.01)"
      ) from None
    out = predict_run(
        args.run,
        args.rate,
        args.latency,
        args.burst,
        args.num_processes,
        args.solo,
        worker_delays=delays,
    )
    if args.target_error is not None:
      history = rundir.read_history(Path(args.run))
      times = [dict(step=s, time_s=t) for s, t in zip(out["steps"], out["predicted_s"])]
      out["time_to_target"] = timing.time_to_target(history, times, args.target_error)
  except (link.LinkError, ConfigError, OSError, ValueError, KeyError) as e:
    print(f"easgd: error: {_one_line(e)}", file=sys.stderr)
    return 2
  except (TypeError, ZeroDivisionError) as e:  # a run file edited by hand
    print(f"easgd: error: cannot predict from run '{args.run}': {_one_line(e)}", file=sys.stderr)
    return 2
  print("step  measured_s  predicted_s")
  for s, m, p in zip(out["steps"], out["measured_s"], out["predicted_s"]):
    print(f"{s:>6d}  {'-' if m is None else f'{m:.3f}':>10}  {p:11.3f}")
  if "time_to_target" in out:
    ttt = out["time_to_target"]
    print(
        f"time to test error {args.target_error}: "
        + (
            "not reached"
            if ttt["step"] is None
            else f"{ttt['time_s']:.3f} s (step {ttt['step']}; after {ttt['bracket_s']:.3f} s)"
        )
    )
  return 0


def _one_line(e: Exception) -> str:
  if isinstance(e, KeyError):
    return f"the run lacks {e}: is it a finished run directory of this package?"
  return " ".join(str(e).split())
