"""The ``easgd`` command: train, compare, export, protocol, link, predict and sweep.

Every :class:`~easgd.settings.config.TrainConfig` field is a flag (``--num-workers 4``,
``--tau 16``, ``--beta 0.9``, ``--lr-decay-epochs 10,15``; ``none`` for an
optional value). ``--config FILE.py`` starts from that file's ``get_config()``
(see ``experiments/``); flags override it. Bad input prints one line
``easgd: error: ...`` on stderr and exits with status 2, never a traceback.

``--cpu-devices N`` fakes N CPU devices (``jax_num_cpu_devices``). Multi-process training:
the same ``easgd train`` once per process with ``--coordinator-address HOST:PORT
--num-processes N --process-id I`` (docs/guides/multi_device.md; exit status 3 when a
process does not join within ``--startup-timeout`` or is lost).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib
import os
import sys
import warnings
from pathlib import Path
from typing import NoReturn

from easgd._util import files, flags
from easgd._util.files import json_text

# Only the command functions import the heavy modules (TrainConfig, the sweep's
# flags and everything below them): ``easgd --help`` imports no module of JAX,
# Flax, Optax, Orbax or Ray; a sub-command's flags are added when that
# sub-command is parsed or its help is printed (_Parser.fill).


class _Parser(argparse.ArgumentParser):
  """argparse with one-line errors and exit status 2; a sub-command's parser can
  be given ``fill``, which adds its flags the first time they are needed."""

  def __init__(self, *args, fill=None, **kwargs):
    super().__init__(*args, **kwargs)
    self._fill = fill

  def _filled(self):
    if self._fill is not None:
      fill, self._fill = self._fill, None
      fill(self)
    return self

  def parse_known_args(self, args=None, namespace=None):
    self._filled()
    return super().parse_known_args(args, namespace)

  def format_help(self):
    self._filled()
    return super().format_help()

  def format_usage(self):
    self._filled()
    return super().format_usage()

  def error(self, message):
    self.exit(2, f"easgd: error: {message}\n")


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
  """One flag per TrainConfig field (``easgd._util.flags``: help from the field's metadata)."""
  from easgd.settings.config import TrainConfig

  group = flags.add_flags(
      parser,
      TrainConfig,
      title="config (TrainConfig fields; tuples comma-separated, e.g. 10,15; booleans "
      "--x / --no-x; 'none' for an optional value)",
      exclude=(("algorithm",) if parser.prog.endswith("compare") else ()) + ("task_args",),
  )
  flags.add_task_arg(group)


def load_config_file(path) -> "TrainConfig":  # noqa: F821 (imported when called)
  """``get_config()`` of a Python file, e.g. ``experiments/fashion_mnist.py``.

  Raises:
    ConfigError: the file is missing, fails to load, or has no ``get_config``
      returning a TrainConfig (``easgd._util.flags.call_config_file``).
  """
  from easgd.settings.config import ConfigError, TrainConfig

  return flags.call_config_file(path, "get_config", TrainConfig, "config file", ConfigError)


def build_parser() -> argparse.ArgumentParser:
  """The ``easgd`` argument parser: sub-commands train, compare, export, sweep.

  Errors while parsing print one line ``easgd: error: ...`` and exit with 2.
  """
  parser = _Parser(prog="easgd", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
  for name, help_text in (
      ("train", "train one algorithm; metrics.jsonl and summary.json in --workdir"),
      ("compare", "run several algorithms on the same data budget; plot + table"),
  ):
    sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        fill=lambda p, name=name: _add_run_arguments(p, name),
    )
  p = sub.add_parser(
      "export",
      help="write the center of a run's latest checkpoint "
      "as a plain Flax parameter file (msgpack; cnn_bn: "
      "and its BatchNorm statistics)",
  )
  p.add_argument("--workdir", required=True, help="the run directory")
  p.add_argument("--out", required=True, help="output file, e.g. center.msgpack")
  p = sub.add_parser(
      "protocol",
      help="tuned rates, seeds, intervals, time to target: the comparison "
      "protocol of a config file (easgd.protocol.runs); results.json, results.md, curves.png "
      "and TensorBoard runs (report/, tune/)",
      description="For each arm of the protocol file: its learning-rate grid x tuning "
      "seeds on the validation split, the best rate rerun on fresh seeds "
      "on the test set; one compiled program per group of arms",
  )
  p.add_argument(
      "--config",
      default=None,
      help="Python file with get_protocol() -> ProtocolConfig "
      "(e.g. experiments/protocol_fig2.py); required unless --report-only",
  )
  p.add_argument("--workdir", required=True, help="output directory")
  p.add_argument(
      "--task",
      default=None,
      metavar="PACKAGE.MODULE:FACTORY",
      help="the problem of every arm: an importable factory returning an easgd Task "
      "(the working directory is searched first), in place of the protocol file's "
      "base task; its data set and model fields must keep their defaults",
  )
  p.add_argument(
      "--task-arg",
      dest="task_args",
      action="append",
      default=None,
      metavar="KEY=VALUE",
      help="a keyword argument of the task factory (repeat for more; VALUE is JSON "
      "if it parses, else text); with --task its only arguments, else they replace "
      "the file's base task_args",
  )
  for which, first in (("tune", "0"), ("report", "100")):
    p.add_argument(
        f"--{which}-seeds",
        type=int,
        default=None,
        metavar="N",
        help=f"run N {which} seeds: the protocol file's first {which} seed (default "
        f"{first}) and the N - 1 after it, in place of the file's {which}_seeds (at "
        "least 3; the report seeds must stay apart from the tuning seeds)",
    )
  p.add_argument(
      "--overwrite",
      action="store_true",
      help="replace the results already in --workdir (they stay in place "
      "until the new run is complete)",
  )
  p.add_argument(
      "--report-only",
      action="store_true",
      help="rewrite results.md, curves.png and the TensorBoard runs from --workdir's results.json "
      "without running anything",
  )
  p.add_argument(
      "--group-by",
      default="tau",
      choices=("tau", "num_workers", ""),
      help="the panels of curves.png (default: %(default)s)",
  )
  for name, adder, help_text, description in _ELSEWHERE:
    sub.add_parser(
        name,
        help=help_text,
        description=description or help_text,
        fill=functools.partial(_fill, adder),
    )
  return parser


_ELSEWHERE = (  # (command, module:function adding its flags (lazily), help, description)
    ("link", "easgd.parallel.link:add_link_arguments", "run N train processes joined by a real "
     "slow link (network namespaces, tc tbf)", "easgd link --rate 10mbit --num-processes 2 -- "
     "train --workdir W ...: N network namespaces joined by veth links whose egress the kernel's "
     "token-bucket filter shapes; process i runs the train command in namespace i; everything "
     "is removed on any exit (needs root, ip and tc; docs/guides/slow_link.md)"),
    ("predict", "easgd.run.predict:add_predict_arguments", "a run's training clock on a link, "
     "predicted from the run measured without it (docs/guides/slow_link.md)", None),
    ("sweep", "easgd.sweeps.config:add_sweep_arguments", "tau x alpha grid as one compiled "
     "program; CSV, JSON, heatmaps", "tau x alpha (x learning rate x num_workers) sweep of "
     "EASGD on the quadratic and/or a network, one compiled program per num_workers; the "
     "theory's stability boundary on the heatmaps"),
)  # fmt: skip


def _fill(adder: str, p: argparse.ArgumentParser) -> None:
  module, function = adder.split(":")
  getattr(importlib.import_module(module), function)(p)


def _add_run_arguments(p: argparse.ArgumentParser, name: str) -> None:
  """The flags of ``easgd train`` / ``easgd compare`` (one per TrainConfig field)."""
  p.add_argument("--workdir", required=True, help="output directory")
  p.add_argument("--config", help="Python file with get_config() -> TrainConfig")
  p.add_argument(
      "--overwrite", action="store_true", help="replace the files of an earlier run in --workdir"
  )
  if name == "train":
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --workdir from its latest checkpoint "
        "(its saved config, unless --config/flags are given)",
    )
    p.add_argument(
        "--stop-after-steps",
        type=int,
        default=None,
        metavar="N",
        help="stop (with a checkpoint) after N global steps",
    )
    _add_process_flags(p)
  p.add_argument(
      "--cpu-devices",
      type=int,
      default=None,
      metavar="N",
      help="fake N CPU devices (before JAX starts)",
  )
  if name == "compare":
    from easgd.methods import registry

    p.add_argument(
        "--algorithms",
        type=flags.list_parser(str),
        default=registry.DEFAULT_COMPARISON,
        metavar="NAMES",
        help=f"comma-separated algorithm names, of: "
        f"{', '.join(registry.ALGORITHMS)} (default: "
        f"{','.join(registry.DEFAULT_COMPARISON)})",
    )
    p.add_argument("--target-error", type=float, metavar="E", help="time to test error E, 0<E<1")
  _add_config_flags(p)


def _add_process_flags(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group(
      "multi-process (easgd.parallel.distributed; default: one process)"
  )
  group.add_argument(
      "--coordinator-address",
      default=None,
      metavar="HOST:PORT",
      help="process 0's address (default: $JAX_COORDINATOR_ADDRESS)",
  )
  group.add_argument(
      "--num-processes",
      type=int,
      default=None,
      metavar="N",
      help="number of processes (default: $JAX_NUM_PROCESSES)",
  )
  group.add_argument(
      "--process-id",
      type=int,
      default=None,
      metavar="I",
      help="this process, 0..N-1 (default: $JAX_PROCESS_ID)",
  )
  group.add_argument(
      "--startup-timeout",
      type=float,
      default=None,
      metavar="S",
      help="seconds each process waits for all processes to connect "
      "before it stops with an error naming the missing ones "
      "(exit status 3; default: 30)",
  )
  group.add_argument(
      "--heartbeat-timeout",
      type=float,
      default=None,
      metavar="S",
      help="jax.distributed heartbeat timeout in seconds (JAX: 100)",
  )
  group.add_argument(
      "--peer-timeout",
      type=float,
      default=None,
      metavar="S",
      help="seconds of silence before a peer process is declared " "lost (default: 10)",
  )


def _user_errors():
  from easgd.core.elastic import HyperparameterError
  from easgd.parallel.distributed import DistributedError
  from easgd.parallel.worker_layout import LayoutError
  from easgd.run.checkpoint import CheckpointError
  from easgd.settings.config import ConfigError
  from easgd.tasks.data import DataError
  from easgd.tasks.models import ModelError
  from easgd.tasks.sources import TaskError

  return (
      ConfigError,
      DataError,
      HyperparameterError,
      ModelError,
      LayoutError,
      CheckpointError,
      TaskError,
      DistributedError,
  )


def _run_errors():
  from easgd.runtimes.divergence import DivergenceError
  from easgd.runtimes.driver import WorkersLostError

  return (DivergenceError, WorkersLostError)


def main(argv=None) -> int:
  """Entry point of the ``easgd`` command; returns the exit status.

  Exit status: 0 done (also a real asynchronous run in which some workers
  failed: a line on stderr says so for each, the summary lists them); 2 bad
  input (also an item of a task's data that cannot be read, on every runtime), or a workdir another command
  holds (``easgd.run.runlock``) (one line ``easgd: error: ...`` on stderr, before
  anything is compiled); 1 a run that failed
  (divergence, or every worker of a real asynchronous run stopped); 3
  (``easgd.parallel.distributed.EXIT_PEER_LOST``) a multi-process run whose processes did
  not all join within ``--startup-timeout``, that could not start, that lost
  a process, or a Ray cluster (``--runtime ray``) that cannot be reached; 130
  interrupted (Ctrl-C); 143 terminated (SIGTERM, handled as Ctrl-C: a
  checkpoint save in progress completes first, ``easgd._util.files.terminate_as_interrupt``).
  """
  # from the start: JAX's import alone takes seconds
  with warnings.catch_warnings(), files.terminate_as_interrupt():
    warnings.showwarning = _show_warning
    interrupt = None
    try:
      args = build_parser().parse_args(argv)
      if args.command == "link":  # no JAX in this process: its train processes import it
        from easgd.parallel.link import main_link

        status = main_link(args)
      elif args.command == "predict":
        from easgd.run.predict import main_predict

        status = main_predict(args)
      else:
        from easgd.parallel import distributed

        status = _main(args, distributed)
    except KeyboardInterrupt as e:  # raised where _main does not catch it (imports, reports)
      interrupt = e
    except Exception:  # what a signal's exception became (an extension's ImportError)
      if files.pending_interrupt() is None:
        raise
    # a signal whose exception was swallowed (a GC callback) is still this command's end
    interrupt = files.pending_interrupt() or interrupt
    return status if interrupt is None else _interrupted(interrupt)


def _interrupted(interrupt: KeyboardInterrupt) -> int:
  """Reports ``interrupt`` in one line on stderr; returns its exit status (143 or 130)."""
  if isinstance(interrupt, files.Terminated):
    print("easgd: terminated (SIGTERM)", file=sys.stderr)
    return 143
  print("easgd: interrupted", file=sys.stderr)
  return 130


def run() -> NoReturn:
  """The ``easgd`` program (console script, ``python -m easgd.cli``): :func:`main`, then exit.

  After :func:`main` the process ends without the interpreter's module teardown:
  standard output and error are flushed and the ``atexit`` functions run (the
  libraries' own shut-down: JAX waits for its runtime tokens and clears its
  backends, matplotlib, tensorboardX) with SIGINT and SIGTERM still handled, then
  ``os._exit``. The teardown that is skipped frees the rest of the modules, XLA's
  executables and buffers among them, in no set order: seconds of work during
  which Python runs no signal handler (a SIGTERM there would end the process by
  the default action, status -15), and where a crash at exit would occur. A
  signal received at any point from :func:`main`'s start to the exit ends the
  process with 143 (SIGTERM) or 130 (SIGINT), the command's files as
  :func:`main` left them.
  """
  status: int | None = None
  with files.terminate_as_interrupt():
    try:
      try:
        status = main()
      except SystemExit as e:  # argparse: --help, a bad flag
        if e.code is not None and not isinstance(e.code, int):
          raise
        status = e.code or 0
      with files.interrupts_deferred():  # from here a signal is recorded, never raised
        _flush()
        atexit._run_exitfuncs()  # the libraries' shut-down, which os._exit skips
        interrupt = files.pending_interrupt()
        if interrupt is not None and status not in (130, 143):
          status = _interrupted(interrupt)
        _flush()
        os._exit(status)
    except KeyboardInterrupt as e:  # between main's end and the deferral above
      status = _interrupted(e)
      _flush()
      os._exit(status)


def _flush() -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):  # a closed pipe or stream
      pass


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
  """A warning as one line in the package's words: ``easgd: warning: ...``."""
  kind = "" if category.__module__.startswith("easgd") else f"{category.__name__}: "
  print(f"easgd: warning: {kind}{message}", file=file or sys.stderr)


def _main(args, distributed) -> int:
  try:
    try:
      status = _run(args)
    except BaseException as e:  # multi-process: exits now, never waits for a peer
      if distributed.is_multiprocess():  # a signal (the error may be a peer's stop): no barrier
        if stop := e if isinstance(e, KeyboardInterrupt) else files.pending_interrupt():
          distributed.leave(_interrupted(stop))
        distributed.fail(e, code=2 if isinstance(e, _user_errors()) else 1)
      raise
    distributed.shutdown()
    return status
  except KeyboardInterrupt:  # a signal, perhaps amid an import: nothing imported to classify it
    raise
  except distributed.StartupError as e:
    print(f"easgd: error: {e}", file=sys.stderr)
    return distributed.EXIT_PEER_LOST
  except _user_errors() as e:
    print(f"easgd: error: {e}", file=sys.stderr)
    return 2
  except _run_errors() as e:
    print(f"easgd: error: {e}", file=sys.stderr)
    return 1


def _run(args) -> int:
  from easgd.run.rundir import workdir_path
  from easgd.settings.config import ConfigError, TrainConfig

  workdir_path(args.workdir, "--workdir")  # every command, before anything else
  if args.command == "sweep":
    from easgd.sweeps.command import main_sweep

    return main_sweep(args)
  if args.command == "protocol":
    return _run_protocol(args)
  if args.command == "export":
    from easgd.run.export import export_center

    print(f"wrote {export_center(args.workdir, args.out)}")
    return 0
  if args.cpu_devices is not None:
    from easgd._util import checks

    checks.integer("--cpu-devices", args.cpu_devices, 1, 1024, error=ConfigError)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
  if args.command == "train":
    from easgd.parallel import distributed

    distributed.initialize(
        distributed.resolve(
            args.coordinator_address,
            args.num_processes,
            args.process_id,
            heartbeat_timeout_s=args.heartbeat_timeout,
            peer_timeout_s=args.peer_timeout,
            initialization_timeout_s=args.startup_timeout,
        )
    )
  overrides = flags.overrides(args, TrainConfig)
  if "task_args" in overrides:  # --task-arg, repeated
    overrides["task_args"] = tuple(overrides["task_args"])
  resume = getattr(args, "resume", False)
  if args.config:
    base = load_config_file(args.config)
  elif resume:
    from easgd.run.rundir import saved_config

    base = saved_config(args.workdir)
  else:
    base = TrainConfig()
  config = base.replace(**overrides)  # train_and_evaluate / compare validate it
  if args.command == "train":
    from easgd.run.trainer import train_and_evaluate

    summary = train_and_evaluate(
        config,
        args.workdir,
        overwrite=args.overwrite,
        resume=resume,
        stop_after_steps=args.stop_after_steps,
    )
    final = summary["final"]
    print(
        json_text(
            dict(
                status=summary["status"],
                algorithm=summary["algorithm"],
                layout=summary["layout"],
                final_step=final["step"],
                # absent for a task without "correct"
                **{k: final[k] for k in ("test_accuracy",) if k in final},
                test_loss=final["test_loss"],
                communication=summary["communication"],
                wall_time_s=summary["wall_time_s"],
            )
        )
    )
    return 0
  from easgd.run.compare import RESULTS_MD, compare

  target = dict(target_error=args.target_error)  # --target-error: time to it in the table
  compare(config, args.workdir, list(args.algorithms), overwrite=args.overwrite, **target)
  print((Path(args.workdir) / RESULTS_MD).read_text(), end="")
  print(f"plot: {Path(args.workdir) / 'comparison.png'}")
  return 0


def _run_protocol(args) -> int:
  from easgd.protocol import report
  from easgd.protocol.config import RESULTS_JSON, load_protocol_file
  from easgd.run import rundir, runlock
  from easgd.settings.config import ConfigError

  workdir = rundir.workdir_path(args.workdir, "--workdir")
  results = workdir / RESULTS_JSON
  if args.report_only:
    if (
        args.config is not None
        or args.overwrite
        or args.task
        or args.task_args
        or args.tune_seeds is not None
        or args.report_seeds is not None
    ):
      raise ConfigError(
          "--report-only reads --workdir's results.json and runs nothing; "
          "it takes no --config, --task, --task-arg, --tune-seeds, --report-seeds or "
          "--overwrite"
      )
    if not results.is_file():
      raise ConfigError(
          f"--report-only: '{workdir}' holds no results.json; run the " "protocol first"
      )
    with runlock.hold_workdir(workdir, "protocol --report-only"):
      report.write_report(workdir, args.group_by)
  else:
    if args.config is None:
      raise ConfigError(
          "--config is required (a Python file defining get_protocol(), "
          "e.g. experiments/protocol_fig2.py) unless --report-only"
      )
    config = _with_task(load_protocol_file(args.config), args).validate()  # before anything runs
    with runlock.hold_workdir(workdir, "protocol"):  # before the checks of workdir
      _check_protocol_workdir(workdir, args.overwrite)
      from easgd.protocol.runs import run_protocol

      # nothing is written until every arm has run; then the protocol's one writer
      # (report.write_report) replaces each file whole, results.json last
      fresh = run_protocol(config, None, log=lambda line: print(line, file=sys.stderr, flush=True))
      report.write_report(workdir, args.group_by, fresh)
  print((workdir / report.RESULTS_MD).read_text(), end="")
  return 0


def _with_task(config, args):
  """The protocol ``config`` with ``--task`` and ``--task-arg`` in its base, and
  ``--tune-seeds`` / ``--report-seeds`` counts as its seeds."""
  import dataclasses

  from easgd._util import checks
  from easgd.protocol.config import ProtocolError

  for which in ("tune", "report"):
    n = getattr(args, f"{which}_seeds")
    if n is not None:
      n = checks.integer(f"--{which}-seeds", n, 1, 10**4, error=ProtocolError)
      first = getattr(config, f"{which}_seeds")[0]
      config = dataclasses.replace(config, **{f"{which}_seeds": tuple(range(first, first + n))})
  changes = {}
  if args.task is not None:
    changes = dict(task=args.task, task_args=tuple(args.task_args or ()))
  elif args.task_args is not None:
    changes = dict(task_args=tuple(args.task_args))
  if not changes:
    return config
  return dataclasses.replace(config, base=config.base.replace(**changes))


def _check_protocol_workdir(workdir: Path, overwrite: bool) -> None:
  """Refuses a workdir with a protocol's results (unless ``overwrite``) or with a
  directory where a result file goes; the lock has created ``workdir``."""
  from easgd.protocol import report
  from easgd.protocol.config import RESULTS_JSON
  from easgd.run.tensorboard import PROTOCOL_RUNS
  from easgd.settings.config import ConfigError

  if (workdir / RESULTS_JSON).exists() and not overwrite:
    raise ConfigError(
        f"workdir '{workdir}' already holds a protocol's results; "
        "choose another directory or pass --overwrite"
    )
  for name in (RESULTS_JSON, report.RESULTS_MD, report.CURVES_PNG):
    if (workdir / name).exists() and not (workdir / name).is_file():
      raise ConfigError(
          f"'{workdir / name}' exists and is not a file; the protocol " "writes its results there"
      )
  for name in PROTOCOL_RUNS:
    if (workdir / name).exists() and not (workdir / name).is_dir():
      raise ConfigError(
          f"'{workdir / name}' exists and is not a directory; the protocol writes its "
          "TensorBoard runs there"
      )


if __name__ == "__main__":
  run()
