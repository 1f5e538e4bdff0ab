"""Bad input through the library API and the command line: one line in the package's
words, before anything is compiled; a failing run leaves earlier results whole.

Each test stands for a class of inputs: arguments of the wrong type, values a
float32 computation or an int32 step clock cannot hold, lists with holes,
combinations that contradict each other, unwritable or misnamed directories,
and interruptions in the middle of a write.
"""

import dataclasses
import json
import os
import re
import signal

import numpy as np
import pytest

from easgd import cli
from easgd._util import files, flags
from easgd.run import checkpoint, trainer
from easgd.run.compare import RESULTS_JSON, RESULTS_MD, compare
from easgd.runtimes import training_run
from easgd.settings.config import ConfigError, TrainConfig
from easgd.settings.fields import MAX_REAL
from easgd.tasks.data import DataError

# digits: 1438 training images; global batch 64 -> 22 steps per epoch
DIGITS = TrainConfig(
    dataset="digits",
    model="mlp",
    num_workers=2,
    global_batch_size=64,
    num_epochs=1,
    learning_rate=0.1,
    eval_batch_size=64,
    progress=False,
)


def no_compile(monkeypatch):
  """Makes any attempt to build a run's programs fail the test."""

  def refuse(*args, **kwargs):
    raise AssertionError("reached Run(): the input should have been refused before")

  monkeypatch.setattr(training_run.Run, "__init__", refuse)


# -- arguments of the wrong type ------------------------------------------------


@pytest.mark.parametrize(
    "config, match",
    [
        (dict(dataset="digits"), "config must be an easgd.TrainConfig .* got dict"),
        (None, "config must be an easgd.TrainConfig .* got NoneType"),
    ],
)
def test_train_refuses_a_config_that_is_not_a_train_config(tmp_path, config, match):
  with pytest.raises(ConfigError, match=match):
    trainer.train_and_evaluate(config, tmp_path)


@pytest.mark.parametrize("workdir", [None, 123, ["a"]])
def test_train_refuses_a_workdir_that_is_not_a_path(workdir, monkeypatch):
  no_compile(monkeypatch)
  with pytest.raises(
      ConfigError,
      match=r"workdir must be a path \(str or os.PathLike\), " f"got {re.escape(repr(workdir))}",
  ):
    trainer.train_and_evaluate(DIGITS, workdir)


@pytest.mark.parametrize("name", ["overwrite", "resume"])
def test_train_refuses_flags_that_are_not_bools(tmp_path, monkeypatch, name):
  no_compile(monkeypatch)
  with pytest.raises(ConfigError, match=f"{name} must be a bool .*got 'no'"):
    trainer.train_and_evaluate(DIGITS, tmp_path, **{name: "no"})


def test_resume_and_overwrite_together_are_refused(tmp_path, monkeypatch):
  no_compile(monkeypatch)
  with pytest.raises(ConfigError, match="overwrite and resume exclude each other"):
    trainer.train_and_evaluate(DIGITS, tmp_path, overwrite=True, resume=True)


@pytest.mark.parametrize(
    "algorithms, match",
    [
        ("easgd", r"algorithms must be a list of names .* got 'easgd'"),
        (None, "algorithms must be a list of names .* got None"),
        (3, "algorithms must be a list of names .* got 3"),
    ],
)
def test_compare_refuses_algorithms_that_are_not_a_list_of_names(tmp_path, algorithms, match):
  with pytest.raises(ConfigError, match=match):
    compare(DIGITS, tmp_path, algorithms)


def test_compare_refuses_a_config_that_is_not_a_train_config(tmp_path):
  with pytest.raises(ConfigError, match="config must be an easgd.TrainConfig"):
    compare({"dataset": "digits"}, tmp_path, ["easgd"])


def test_sequence_fields_take_numpy_arrays_as_tuples():
  cfg = DIGITS.replace(
      algorithm="async_easgd", num_workers=4, worker_speeds=np.array([1, 1, 1, 2])
  ).validate()
  assert cfg.worker_speeds == (1, 1, 1, 2)
  assert json.loads(cfg.to_json())["worker_speeds"] == [1, 1, 1, 2]


# -- values a float32 computation or an int32 clock cannot hold -----------------


@pytest.mark.parametrize("field", ["learning_rate", "alpha", "beta", "weight_decay", "curvature"])
def test_rates_beyond_float32_are_refused_by_validation(field):
  extra = dict(optimizer="adamw") if field == "weight_decay" else {}
  with pytest.raises(ConfigError, match=f"{field} must be a finite real in .*1e\\+38\\]"):
    DIGITS.replace(**extra, **{field: 1e39}).validate()
  DIGITS.replace(**extra, **{field: MAX_REAL}).validate()  # the bound itself is allowed


@pytest.mark.parametrize(
    "changes, match",
    [
        # DIGITS: global batch 64
        (
            dict(learning_rate=1e37, lr_scaling="linear", lr_reference_batch=1),
            r"resolved_learning_rate \(learning_rate \* global_batch_size / lr_reference_batch "
            r"= 1e\+37 \* 64 / 1, lr_scaling 'linear'\) must be a finite real in "
            r"\[1.17549.*e-38, 1e\+38\], got 6.4e\+38",
        ),
        (
            dict(learning_rate=3e37, lr_scaling="sqrt", lr_reference_batch=4),
            r"resolved_learning_rate \(learning_rate \* sqrt\(global_batch_size / "
            r"lr_reference_batch\) = 3e\+37 \* sqrt\(64 / 4\), lr_scaling 'sqrt'\) .* "
            r"got 1.2e\+38",
        ),
        (
            dict(learning_rate=1e-36, lr_scaling="linear", lr_reference_batch=2**20),
            r"resolved_learning_rate \(.* = 1e-36 \* 64 / 1048576, .*got 6.1035.*e-41",
        ),
        (
            dict(learning_rate=1e-40),
            r"resolved_learning_rate \(learning_rate, lr_scaling " r"'none'\) .* got 1e-40",
        ),  # 0 (denormal) in float32
        (
            dict(beta=1e-38),
            r"resolved_alpha \(beta / num_workers = 1e-38 / 2\) must be a "
            r"finite real in \[1.17549.*e-38, 1e\+38\], got 5e-39",
        ),
        (dict(alpha=1e-39), r"resolved_alpha \(alpha\) .* got 1e-39"),
    ],
)
def test_a_derived_rate_is_checked_as_the_run_uses_it(tmp_path, monkeypatch, changes, match):
  # each base value is in range; the value the run computes with is not
  no_compile(monkeypatch)
  with pytest.raises(ConfigError, match=f"^{match}$"):
    trainer.train_and_evaluate(DIGITS.replace(**changes), tmp_path)
  assert not any(tmp_path.iterdir())
  DIGITS.replace(
      learning_rate=1e38 / 64, lr_scaling="linear", lr_reference_batch=1
  ).validate()  # the bound itself is allowed


@pytest.mark.parametrize("warmup_epochs, steps", [(0.01, 0), (0.98, 22), (0.99, 22)])
def test_a_learning_rate_warm_up_rounded_to_no_steps_or_the_whole_run_is_refused(
    tmp_path, monkeypatch, warmup_epochs, steps
):
  # 22 steps per epoch: 0.01 epochs is 0 steps (the warm-up asked for would not
  # happen), 0.98 and 0.99 round to all 22 (the peak rate would never be reached)
  monkeypatch.setattr(trainer, "Run", lambda *a, **k: pytest.fail("built the run"))
  with pytest.raises(
      ConfigError,
      match=f"^warmup_epochs={warmup_epochs} gives a "
      f"learning-rate warm-up of {steps} steps "
      r"\(round\(warmup_epochs \* 22 steps per "
      r"epoch\), 22 steps in all\); allowed: "
      "warmup_epochs 0, or one that gives 1 to 21 "
      "steps$",
  ):
    trainer.train_and_evaluate(DIGITS.replace(warmup_epochs=warmup_epochs), tmp_path)
  assert not (tmp_path / "config.json").exists()
  DIGITS.replace(warmup_epochs=0.03).validate().resolve(22)  # 0.66: 1 step, the edge
  DIGITS.replace(warmup_epochs=0.95).validate().resolve(22)  # 20.9: 21 steps, the edge


def test_the_protocol_checks_each_grid_rate_and_arm_as_its_runs_derive_them():
  from easgd.protocol import programs
  from easgd.protocol.config import Arm, ProtocolConfig, ProtocolError

  base = TrainConfig(
      dataset="mnist1d",
      model="mlp",
      num_epochs=1,
      global_batch_size=384,
      num_workers=4,
      validation_examples=1000,
      progress=False,
  )
  scaled = dict(lr_scaling="linear", lr_reference_batch=1)  # lr_scale 384
  grid = ProtocolConfig("p", "", base, (Arm("a", "pmean_sgd", scaled, (1e35, 1e36)),))
  with pytest.raises(
      ProtocolError,
      match=r"^arm 'a', learning rate 1e\+36: " r"resolved_learning_rate .* got 3.84e\+38$",
  ):
    grid.validate()
  taken = ProtocolConfig(
      "p",
      "",
      base,
      (Arm("a", "pmean_sgd", {}, (1e36,)), Arm("b", "pmean_sgd", scaled, lr_from="a")),
  )
  with pytest.raises(
      ProtocolError, match=r"^arm 'b', learning rate 1e\+36: " r"resolved_learning_rate"
  ):
    taken.validate()
  # 7000 training signals / 384: 18 steps; tau = 18 never moves easgd's center
  edge = ProtocolConfig("p", "", base, (Arm("a", "easgd", dict(tau=18), (0.1,)),))
  with pytest.raises(
      ProtocolError,
      match=r"^arm 'a': tau=18 leaves the center " r"untrained: .*allowed: tau <= 17$",
  ):
    programs.prepare(edge.validate(), 7000)
  programs.prepare(
      dataclasses.replace(edge, arms=(Arm("a", "easgd", dict(tau=17), (0.1,)),)).validate(), 7000
  )


def test_a_run_longer_than_the_int32_step_clock_is_refused(tmp_path, monkeypatch):
  monkeypatch.setattr(trainer, "Run", lambda *a, **k: pytest.fail("built the run"))
  with pytest.raises(
      ConfigError,
      match=r"num_epochs=100000000000 gives 2200000000000 "
      r"steps \(22 per epoch\); the step clocks are "
      r"int32: allowed num_epochs <= 97612893",
  ):
    trainer.train_and_evaluate(DIGITS.replace(num_epochs=10**11), tmp_path)
  assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize(
    "epochs, match",
    [
        ((10,), r"lr_decay_epochs entry .* must be a finite real in \(0, 3\), got 10"),
        ((3,), r"lr_decay_epochs entry .* must be a finite real in \(0, 3\), got 3"),
        ((2, 1), r"lr_decay_epochs must be strictly increasing, got \(2, 1\)"),
        ((1, 1), r"lr_decay_epochs must be strictly increasing, got \(1, 1\)"),
    ],
)
def test_a_step_decay_that_would_never_happen_or_repeat_is_refused(epochs, match):
  with pytest.raises(ConfigError, match=match):
    DIGITS.replace(num_epochs=3, lr_schedule="step", lr_decay_epochs=epochs).validate()


def test_a_step_decay_rounded_onto_the_last_step_is_refused():
  from easgd.runtimes import optimizers

  cfg = DIGITS.replace(num_epochs=3, lr_schedule="step", lr_decay_epochs=(2.99,)).validate()
  with pytest.raises(
      ConfigError,
      match=r"fall on steps \[66\] .* 66 steps in all\); "
      "allowed: distinct steps after the warm-up and "
      "before the end of the run",
  ):
    optimizers.make_schedule(cfg, 22)


def test_delta_help_and_error_agree_on_the_open_interval():
  help_text = {f.name: f.metadata["help"] for f in TrainConfig.__dataclass_fields__.values()}
  assert "in (0, 1)" in help_text["delta"]
  with pytest.raises(ConfigError, match=r"delta must be a finite real in \(0, 1\), got 1.0"):
    DIGITS.replace(algorithm="eamsgd", optimizer="sgd", delta=1.0).validate()
  with pytest.raises(ConfigError, match="delta=0 turns eamsgd into easgd"):
    DIGITS.replace(algorithm="eamsgd", delta=0.0).validate()


# -- lists with holes --------------------------------------------------------------


@pytest.mark.parametrize("text", ["1,,2", "1,2,", ",1"])
def test_a_list_flag_with_an_empty_entry_is_refused(text):
  import argparse

  with pytest.raises(argparse.ArgumentTypeError, match="empty entry in"):
    flags.list_parser(int)(text)
  assert flags.list_parser(int)("") == ()
  assert flags.list_parser(int)(" 1, 2 ") == (1, 2)


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "--algorithms", "easgd,,pmean_sgd"],
        ["train", "--algorithm", "async_easgd", "--worker-speeds", "1,,1,1"],
    ],
)
def test_the_command_line_refuses_list_flags_with_holes(tmp_path, capsys, argv):
  with pytest.raises(SystemExit) as e:
    cli.main([argv[0], "--workdir", str(tmp_path / "w"), *argv[1:]])
  assert e.value.code == 2
  assert "empty entry in" in capsys.readouterr().err
  assert not (tmp_path / "w").exists()


def test_worker_speeds_are_shown_as_the_integers_typed(tmp_path, capsys):
  code = cli.main(["train", "--workdir", str(tmp_path / "w"), "--worker-speeds", "1,1,1,2"])
  assert code == 2
  assert "worker_speeds=(1, 1, 1, 2) is not read by algorithm 'easgd'" in capsys.readouterr().err


# -- directories ------------------------------------------------------------------


def test_a_data_dir_that_is_a_file_is_named_so(tmp_path):
  from easgd.tasks import datasets

  f = tmp_path / "afile"
  f.write_text("")
  for name in ("fashion_mnist", "cifar10"):
    with pytest.raises(DataError, match=f"'{f}' is a file, not a directory"):
      datasets.load_dataset(name, data_dir=str(f))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_resume_into_a_read_only_workdir_is_refused_before_training(tmp_path, monkeypatch):
  trainer.train_and_evaluate(DIGITS, tmp_path / "run", stop_after_steps=4)
  os.chmod(tmp_path / "run", 0o555)
  try:
    no_compile(monkeypatch)
    with pytest.raises(ConfigError, match="workdir '.*run' cannot be written"):
      trainer.train_and_evaluate(DIGITS, tmp_path / "run", resume=True)
  finally:
    os.chmod(tmp_path / "run", 0o755)


def test_resume_checks_that_the_workdir_can_be_written(tmp_path, monkeypatch):
  """Also as root (where permissions do not stop a write): the check is made."""
  trainer.train_and_evaluate(DIGITS, tmp_path / "run", stop_after_steps=4)
  checked = []
  from easgd.run import rundir

  real = rundir.ensure_writable_dir
  monkeypatch.setattr(rundir, "ensure_writable_dir", lambda p: checked.append(p.name) or real(p))
  no_compile(monkeypatch)
  with pytest.raises(AssertionError, match="reached Run"):
    trainer.train_and_evaluate(DIGITS, tmp_path / "run", resume=True)
  assert checked == ["run", "run", checkpoint.CHECKPOINT_DIR]  # the lock's, then resume's


# -- a failing comparison leaves the earlier one whole ----------------------------


def test_a_comparison_that_fails_part_way_leaves_the_earlier_one_whole(tmp_path):
  cfg = DIGITS.replace(num_workers=4, eval_every_epochs=1)
  compare(cfg, tmp_path, ["pmean_sgd", "easgd"])
  before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  # the second algorithm diverges (a huge elastic coefficient)
  with pytest.warns(trainer.StabilityWarning), pytest.raises(trainer.DivergenceError):
    compare(
        cfg.replace(learning_rate=0.05, beta=1e30), tmp_path, ["pmean_sgd", "easgd"], overwrite=True
    )
  aside = tmp_path / "previous_run"
  after = {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()}
  assert after == before  # every file of the earlier comparison, unchanged
  assert not (tmp_path / RESULTS_JSON).exists()  # no table mixing the two
  assert not (tmp_path / RESULTS_MD).exists()
  # a second failed attempt keeps the last complete comparison
  with pytest.warns(trainer.StabilityWarning), pytest.raises(trainer.DivergenceError):
    compare(
        cfg.replace(learning_rate=0.05, beta=1e30), tmp_path, ["pmean_sgd", "easgd"], overwrite=True
    )
  assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == before
  # a complete one replaces it, and the earlier one is gone
  rows = compare(cfg.replace(learning_rate=0.05), tmp_path, ["pmean_sgd", "easgd"], overwrite=True)
  assert not aside.exists()
  table = json.loads((tmp_path / RESULTS_JSON).read_text())
  assert table["rows"] == rows
  assert all(
      json.loads((tmp_path / a / "config.json").read_text())["learning_rate"] == 0.05
      for a in ("pmean_sgd", "easgd")
  )


# -- interruptions ------------------------------------------------------------------


@pytest.fixture
def python_sigint():
  """Ctrl-C as a command-line run has it: Python's own SIGINT handler, the
  signal not blocked. A test process need not start so (a test runner's worker,
  or a library a test loaded, may block or handle SIGINT); restored after."""
  handler = signal.signal(signal.SIGINT, signal.default_int_handler)
  blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
  yield
  if signal.SIGINT in blocked:
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
  signal.signal(signal.SIGINT, handler)


def test_ctrl_c_during_a_write_waits_for_it_to_finish(python_sigint):
  done = []
  with pytest.raises(KeyboardInterrupt):
    with files.interrupts_deferred():
      os.kill(os.getpid(), signal.SIGINT)
      done.append("the write went on")
  assert done == ["the write went on"]
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_checkpoint_save_is_never_cut_by_ctrl_c(tmp_path, python_sigint):
  ckpt = checkpoint.Checkpointer(tmp_path, max_to_keep=1)
  state = {"x": np.arange(4.0)}
  ckpt.save(1, state)
  real_save = ckpt.manager.save

  def save_then_interrupt(*args, **kwargs):
    out = real_save(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)  # arrives while the save is being finished
    return out

  ckpt.manager.save = save_then_interrupt
  with pytest.raises(KeyboardInterrupt):
    ckpt.save(2, state)
  assert ckpt.all_steps() == [2]  # saved whole, and the older one cleaned up
  np.testing.assert_array_equal(ckpt.restore(2)["x"], state["x"])
  ckpt.close()
  assert sorted(p.name for p in (tmp_path / checkpoint.CHECKPOINT_DIR).iterdir()) == ["2"]


# -- warnings ------------------------------------------------------------------------


def test_the_command_line_prints_a_stability_warning_as_one_line(tmp_path, capsys):
  code = cli.main(
      [
          "train",
          "--workdir",
          str(tmp_path / "w"),
          "--dataset",
          "digits",
          "--model",
          "mlp",
          "--num-epochs",
          "1",
          "--no-progress",
          "--beta",
          "1e30",
      ]
  )
  assert code == 1  # it diverges
  err = capsys.readouterr().err.strip().splitlines()
  assert err[0].startswith("easgd: warning: EASGD with alpha=2.5e+29 (beta=1e+30)")
  assert err[1].startswith("easgd: error: training diverged")
  assert len(err) == 2
