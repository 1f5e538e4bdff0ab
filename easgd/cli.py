"""Command line: ``easgd train``, ``easgd compare`` and ``easgd export``.

Every :class:`~easgd.config.TrainConfig` field is a flag (``--num-workers 4``,
``--tau 16``, ``--beta 0.9``, ``--lr-decay-epochs 10,15``; ``none`` for an
optional value). ``--config FILE.py`` starts from that file's ``get_config()``
(see ``experiments/``); flags override it. Bad input prints one line
``easgd: error: ...`` on stderr and exits with status 2, never a traceback.

``--cpu-devices N`` fakes N CPU devices (``jax_num_cpu_devices``) so that
workers can be spread over "devices" on a machine without accelerators.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import typing
from pathlib import Path

from easgd.config import ConfigError, TrainConfig


class _Parser(argparse.ArgumentParser):
  """argparse with one-line errors and exit status 2."""

  def error(self, message):
    self.exit(2, f"easgd: error: {message}\n")


def _convert(field: dataclasses.Field):
  hint = typing.get_type_hints(TrainConfig)[field.name]
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  base = args[0] if args else hint
  optional = type(None) in typing.get_args(hint)
  origin = typing.get_origin(base)

  def parse(text: str):
    if optional and text.lower() == "none":
      return None
    if origin is tuple:
      return tuple(float(t) for t in text.split(",") if t.strip())
    if base is bool:
      if text.lower() in ("1", "true", "yes", "on"):
        return True
      if text.lower() in ("0", "false", "no", "off"):
        return False
      raise ValueError(text)
    return base(text)
  parse.__name__ = getattr(base, "__name__", "value")
  return parse


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group("config (TrainConfig fields)")
  for f in dataclasses.fields(TrainConfig):
    if f.name == "algorithm" and parser.prog.endswith("compare"):
      continue
    group.add_argument("--" + f.name.replace("_", "-"), dest=f.name,
                       type=_convert(f), default=argparse.SUPPRESS,
                       metavar=f.name.upper(), help=f"default: {f.default!r}")


def load_config_file(path) -> TrainConfig:
  """``get_config()`` of a Python file, e.g. ``experiments/fashion_mnist.py``.

  Raises:
    ConfigError: the file is missing or has no ``get_config`` returning a
      TrainConfig.
  """
  path = Path(path)
  if not path.is_file():
    raise ConfigError(f"config file '{path}' does not exist")
  spec = importlib.util.spec_from_file_location(f"_easgd_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = getattr(module, "get_config", lambda: None)()
  if not isinstance(config, TrainConfig):
    raise ConfigError(f"config file '{path}' must define get_config() returning "
                      "an easgd.TrainConfig")
  return config


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog="easgd", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
  for name, help_text in (
      ("train", "train one algorithm; metrics.jsonl and summary.json in --workdir"),
      ("compare", "run several algorithms on the same data budget; plot + table")):
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--workdir", required=True, help="output directory")
    p.add_argument("--config", help="Python file with get_config() -> TrainConfig")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files of an earlier run in --workdir")
    if name == "train":
      p.add_argument("--resume", action="store_true",
                     help="continue the run in --workdir from its latest checkpoint "
                          "(its saved config, unless --config/flags are given)")
    p.add_argument("--cpu-devices", type=int, default=None, metavar="N",
                   help="fake N CPU devices (before JAX starts)")
    if name == "compare":
      p.add_argument("--algorithms", default="easgd,pmean_sgd",
                     help="comma-separated algorithm names (default: %(default)s)")
    _add_config_flags(p)
  p = sub.add_parser("export", help="write the center of a run's latest checkpoint "
                     "as a plain Flax parameter file (msgpack)")
  p.add_argument("--workdir", required=True, help="the run directory")
  p.add_argument("--out", required=True, help="output file, e.g. center.msgpack")
  return parser


def _user_errors():
  from easgd.data import DataError
  from easgd.elastic import HyperparameterError
  from easgd.models import ModelError
  from easgd.workers import LayoutError
  return (ConfigError, DataError, HyperparameterError, ModelError, LayoutError)


def _run_errors():
  from easgd.trainer import DivergenceError
  return (DivergenceError,)


def main(argv=None) -> int:
  """Entry point of the ``easgd`` command; returns the exit status."""
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    return _run(args)
  except _user_errors() as e:
    print(f"easgd: error: {e}", file=sys.stderr)
    return 2
  except _run_errors() as e:
    print(f"easgd: error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print("easgd: interrupted", file=sys.stderr)
    return 130


def _run(args) -> int:
  if args.command == "export":
    from easgd.trainer import export_center
    print(f"wrote {export_center(args.workdir, args.out)}")
    return 0
  if args.cpu_devices is not None:
    if args.cpu_devices < 1:
      raise ConfigError(f"--cpu-devices must be an integer >= 1, got {args.cpu_devices}")
    import jax
    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
  overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
               if hasattr(args, f.name)}
  resume = getattr(args, "resume", False)
  if args.config:
    base = load_config_file(args.config)
  elif resume:
    from easgd.trainer import saved_config
    base = saved_config(args.workdir)
  else:
    base = TrainConfig()
  config = base.replace(**overrides).validate()
  if args.command == "train":
    from easgd.trainer import train_and_evaluate
    summary = train_and_evaluate(config, args.workdir, overwrite=args.overwrite,
                                 resume=resume)
    final = summary["final"]
    print(json.dumps(dict(status=summary["status"], algorithm=summary["algorithm"],
                          layout=summary["layout"],
                          test_accuracy=final["test_accuracy"],
                          test_loss=final["test_loss"],
                          communication=summary["communication"],
                          wall_time_s=summary["wall_time_s"])))
    return 0
  from easgd.compare import RESULTS_MD, compare
  algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
  compare(config, args.workdir, algorithms, overwrite=args.overwrite)
  print((Path(args.workdir) / RESULTS_MD).read_text(), end="")
  print(f"plot: {Path(args.workdir) / 'comparison.png'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
