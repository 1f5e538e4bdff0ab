"""The command line: bad input gets one line naming the value, exit status 2."""

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from easgd import cli
from easgd._util.flags import add_flags, option, overrides

BAD_INPUTS = [
    (["--tau", "0"], "tau (communication period) must be an integer in [1, 1073741824], got 0"),
    (["--momentum", "0.9"], "momentum=0.9 has no effect with optimizer 'sgd'"),
    (["--seed", "4294967296"], "seed must be an integer in [0, 4294967295]"),
    (["--alpha", "-0.1"], "alpha must be a finite real in [0, 1e+38], got -0.1"),
    (["--beta", "-1"], "beta must be a finite real in [0, 1e+38], got -1.0"),
    (
        ["--num-workers", "6", "--num-devices", "4"],
        "num_workers=6 is not a multiple of num_devices=4",
    ),
    (["--num-workers", "64", "--num-devices", "64"], "num_devices=64 but only"),
    (
        ["--global-batch-size", "130", "--num-workers", "4"],
        "global_batch_size=130 does not split over num_workers=4",
    ),
    (["--dataset", "fashion_mnist", "--data-dir", "{empty}"], "{empty}"),
    (["--dataset", "cifar100"], "unknown dataset 'cifar100'; allowed: mnist1d"),
    (["--model", "resnet"], "unknown model 'resnet'; allowed: mlp, cnn"),
    (["--learning-rate", "-1"], "learning_rate must be a finite real in (0, 1e+38]"),
    (["--tau", "two"], "argument --tau: invalid int value: 'two'"),
    (["--algorithm", "adam"], "unknown algorithm 'adam'"),
]


@pytest.mark.parametrize("flags,message", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(flags, message, tmp_path, capsys):
  empty = tmp_path / "empty"
  empty.mkdir()
  flags = [f.format(empty=empty) for f in flags]
  with pytest.raises(SystemExit) as exit_info:
    sys.exit(cli.main(["train", "--workdir", str(tmp_path / "run"), *flags]))
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("easgd: error: ")
  assert message.format(empty=empty) in err
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_cli_process_prints_no_traceback(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  for flags in (["--tau", "0"], ["--dataset", "fashion_mnist", "--data-dir", str(tmp_path)]):
    proc = subprocess.run(
        [sys.executable, "-m", "easgd.cli", "train", "--workdir", str(tmp_path / "run"), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("easgd: error: ")
    assert proc.stdout == ""


def test_config_file_and_train_end_to_end(tmp_path, capsys):
  cfg = tmp_path / "cfg.py"
  cfg.write_text(
      "from easgd import TrainConfig\n"
      "def get_config():\n"
      "  return TrainConfig(dataset='digits', model='mlp', num_epochs=1,\n"
      "                     global_batch_size=64, progress=False)\n"
  )
  code = cli.main(
      [
          "train",
          "--config",
          str(cfg),
          "--workdir",
          str(tmp_path / "r"),
          "--tau",
          "2",
          "--num-devices",
          "2",
      ]
  )
  assert code == 0
  out = capsys.readouterr().out
  assert '"tau": 2' in out and "2 device(s) x 2 vmapped" in out
  assert (tmp_path / "r" / "summary.json").exists()
  # a second run into the same workdir is refused, the first run kept
  before = (tmp_path / "r" / "summary.json").read_text()
  code = cli.main(["train", "--config", str(cfg), "--workdir", str(tmp_path / "r")])
  assert code == 2 and "already holds a run" in capsys.readouterr().err
  assert (tmp_path / "r" / "summary.json").read_text() == before


def test_missing_config_file(tmp_path, capsys):
  assert cli.main(["train", "--config", str(tmp_path / "nope.py"), "--workdir", str(tmp_path)]) == 2
  assert "config file" in capsys.readouterr().err


def test_broken_config_files_and_run_configs_are_one_line_errors(tmp_path, capsys):
  bad_py = tmp_path / "bad.py"
  bad_py.write_text("x =\n")
  assert cli.main(["train", "--config", str(bad_py), "--workdir", str(tmp_path / "r")]) == 2
  assert "failed to load: SyntaxError" in capsys.readouterr().err
  not_py = tmp_path / "cfg.json"
  not_py.write_text("{}")
  assert cli.main(["train", "--config", str(not_py), "--workdir", str(tmp_path / "r")]) == 2
  assert "must be a Python file" in capsys.readouterr().err
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text("[1, 2]")
  assert cli.main(["train", "--workdir", str(run), "--resume"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "is not a readable run config" in err


@pytest.mark.parametrize(
    "command", [["train"], ["compare"], ["sweep"], ["export", "--out", "x.msgpack"]]
)
@pytest.mark.parametrize("workdir", ["", " "])
def test_blank_workdir_is_refused_by_every_command(command, workdir, tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert cli.main([command[0], "--workdir", workdir, *command[1:]]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("easgd: error:") and "non-empty path" in err
  assert repr(workdir) in err and len(err.splitlines()) == 1
  assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------
# easgd._util.flags: flags from a dataclass's fields (easgd sweep uses it)
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Toy:
  steps: int = option(10, "steps to run")
  rate: float = option(0.5, "a rate, 100% at most")
  name: str = option("a", "one of a, b", choices=("a", "b"))
  plots: bool = option(True, "draw plots")
  limit: int | None = option(None, "a bound or none")
  taus: tuple[int, ...] = option((1, 4), "periods")
  rates: tuple[float, ...] = option((), "rates")
  plain: str = "x"


def _toy_parser():
  parser = argparse.ArgumentParser(prog="toy")
  add_flags(parser, _Toy, exclude=("plain",))
  return parser


def test_flags_from_a_dataclass_override_only_what_is_given():
  parse = lambda *a: overrides(_toy_parser().parse_args(list(a)), _Toy)
  assert parse() == {}
  assert parse(
      "--steps",
      "3",
      "--rate",
      "0.25",
      "--name",
      "b",
      "--no-plots",
      "--limit",
      "none",
      "--taus",
      "1,2,8",
      "--rates",
      "0.1, 0.2",
  ) == dict(steps=3, rate=0.25, name="b", plots=False, limit=None, taus=(1, 2, 8), rates=(0.1, 0.2))
  assert parse("--plots", "--limit", "7", "--taus", "") == dict(plots=True, limit=7, taus=())
  assert _Toy(**parse("--steps", "3")) == _Toy(steps=3)
  text = _toy_parser().format_help()
  assert "steps to run (default: 10)" in text and "--no-plots" in text
  assert "a rate, 100% at most (default: 0.5)" in text and "--plain" not in text
  assert "periods (default: 1,4)" in text and "(default: none)" in text


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
        (["--taus", "1,x"], "argument --taus: invalid int_list value: '1,x'"),
        (["--limit", "y"], "argument --limit: invalid int value: 'y'"),
        (["--name", "c"], "argument --name: invalid choice: 'c'"),
        (["--plain", "z"], "unrecognized arguments: --plain z"),
    ],
)
def test_flags_refuse_bad_values_in_one_line(argv, message, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _toy_parser().parse_args(argv)
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


def test_flags_refuse_annotations_they_cannot_parse():
  @dataclasses.dataclass(frozen=True)
  class Bad:
    pair: tuple[int, int] = (1, 2)

  with pytest.raises(TypeError, match="tuple"):
    add_flags(argparse.ArgumentParser(), Bad)
  with pytest.raises(TypeError, match="needs a dataclass"):
    add_flags(argparse.ArgumentParser(), dict)
