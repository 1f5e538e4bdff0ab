"""`easgd sweep`'s bad input: one line, exit 2, before any part runs; results kept.

Every refusal here happens before a Hessian estimate, a compilation or a part
of the sweep starts (the parts are replaced by functions that fail the test),
and leaves the workdir exactly as it was. The few sweeps that do run are tiny
(5 steps, 2 workers, the 8x8 digits).
"""

import dataclasses
import json
import os

import numpy as np
import pytest

from easgd import cli
from easgd.sweeps import command
from easgd.sweeps.engine import SweepError
from easgd.sweeps.grid import SweepGrid, check_memory
from easgd.sweeps.network import check_network, sweep_network
from easgd.tasks import datasets, models

TINY = [
    "--no-plots",
    "--num-steps",
    "5",
    "--tau",
    "1,2",
    "--alpha",
    "0.1",
    "--num-workers",
    "2",
    "--hessian-iterations",
    "0",
]
NET = ["--dataset", "digits", "--per-worker-batch-size", "4"]


def snapshot(root):
  """Every file under root with its bytes and mtime, and every directory."""
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    for d in dirnames:
      out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
    for f in filenames:
      path = os.path.join(dirpath, f)
      with open(path, "rb") as fh:
        out[os.path.relpath(path, root)] = (fh.read(), os.stat(path).st_mtime_ns)
  return out


def cli_error(args, capsys):
  """Runs `easgd sweep ARGS`; asserts exit 2 and one line; returns the line."""
  assert cli.main(["sweep", *args]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("easgd: error: "), err
  return err


@pytest.fixture
def no_part_runs(monkeypatch):
  """Fails the test if a part of the sweep, a Hessian estimate or a grid starts."""

  def fail(*args, **kwargs):
    raise AssertionError("a part of the sweep started before every check passed")

  monkeypatch.setattr(command, "_run_parts", fail)
  monkeypatch.setattr("easgd.sweeps.network.hessian_curvature", fail)
  monkeypatch.setattr("easgd.sweeps.network.run_grid", fail)


@pytest.fixture(scope="module")
def earlier_sweep(tmp_path_factory):
  """A finished `--problem both` sweep (its tree is copied by each test)."""
  root = tmp_path_factory.mktemp("earlier")
  assert cli.main(["sweep", "--workdir", str(root / "sw"), "--problem", "both", *TINY, *NET]) == 0
  return root / "sw"


def copy_of(earlier, tmp_path):
  import shutil

  shutil.copytree(earlier, tmp_path / "sw", copy_function=shutil.copy2)
  return tmp_path / "sw"


# -- 1. overwrite: every check first; a failed sweep leaves the earlier one whole --
def test_overwrite_with_missing_data_changes_nothing(earlier_sweep, tmp_path, capsys, no_part_runs):
  workdir = copy_of(earlier_sweep, tmp_path)
  before = snapshot(workdir)
  assert {"sweep_config.json", "quadratic/sweep.csv", "network/sweep.csv"} <= set(before)
  err = cli_error(
      [
          "--workdir",
          str(workdir),
          "--overwrite",
          "--problem",
          "both",
          "--no-plots",
          "--num-steps",
          "7",
          "--tau",
          "1,4",
          "--alpha",
          "0.2",
          "--hessian-iterations",
          "0",
          "--dataset",
          "fashion_mnist",
          "--data-dir",
          str(tmp_path / "nonexistent"),
      ],
      capsys,
  )
  assert f"data directory '{tmp_path / 'nonexistent'}' does not exist" in err
  assert snapshot(workdir) == before  # old: quadratic/sweep.csv new, the rest old


def test_a_failure_mid_sweep_leaves_the_earlier_sweep_whole(earlier_sweep, tmp_path, monkeypatch):
  workdir = copy_of(earlier_sweep, tmp_path)
  before = snapshot(workdir)

  def broken(*args, **kwargs):
    raise RuntimeError("the network part broke")

  monkeypatch.setattr("easgd.sweeps.network.sweep_network", broken)
  config = command.SweepConfig(
      problem="both",
      tau=(1, 4),
      alpha=(0.2,),
      num_workers=(2,),
      num_steps=7,
      dataset="digits",
      per_worker_batch_size=4,
      hessian_iterations=0,
  )
  with pytest.raises(RuntimeError, match="the network part broke"):
    command.run_sweep(config, workdir, overwrite=True, plots=False)  # quadratic ran
  assert snapshot(workdir) == before  # no new quadratic/, no .sweep-new, no aside


def test_overwrite_replaces_the_whole_earlier_sweep(earlier_sweep, tmp_path):
  workdir = copy_of(earlier_sweep, tmp_path)
  config = command.SweepConfig(
      problem="quadratic", tau=(1, 4), alpha=(0.2,), num_workers=(2,), num_steps=7
  )
  command.run_sweep(config, workdir, overwrite=True, plots=False)
  assert sorted(os.listdir(workdir)) == ["sweep.csv", "sweep.json", "sweep_config.json"]
  assert json.loads((workdir / "sweep_config.json").read_text())["tau"] == [1, 4]
  assert "quadratic,2,0.1,4,0.2" in (workdir / "sweep.csv").read_text()


@pytest.mark.parametrize("aside_complete", [False, True])
def test_a_killed_swap_is_undone_by_the_next_sweep(earlier_sweep, tmp_path, capsys, aside_complete):
  # the state a process killed while moving files in leaves behind
  workdir = copy_of(earlier_sweep, tmp_path)
  before = snapshot(workdir)
  aside = workdir / command.PREVIOUS_DIR
  aside.mkdir()
  os.replace(workdir / "sweep_config.json", aside / "sweep_config.json")
  os.replace(workdir / "quadratic", aside / "quadratic")
  if aside_complete:  # the earlier sweep wholly aside, part of the new one moved in
    os.replace(workdir / "network", aside / "network")
    (aside / ".complete").write_text("")
    (workdir / "sweep.csv").write_text("new, partial\n")
  err = cli_error(
      ["--workdir", str(workdir), "--problem", "quadratic", "--tau", "1", "--num-steps", "5"],
      capsys,
  )
  assert "already holds a sweep; choose another directory or pass --overwrite" in err
  assert snapshot(workdir) == before


# -- 2. a workdir that cannot be written: one line, no traceback --------------------
def test_unwritable_workdir_is_one_line(tmp_path, capsys, no_part_runs):
  (tmp_path / "file").write_text("")
  err = cli_error(
      [
          "--workdir",
          str(tmp_path / "file" / "s"),
          "--problem",
          "quadratic",
          "--tau",
          "1",
          "--num-steps",
          "5",
      ],
      capsys,
  )
  assert f"workdir '{tmp_path / 'file' / 's'}' cannot be written" in err


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="needs a user whom file permissions bind"
)
def test_workdir_under_a_read_only_parent_is_one_line(tmp_path, capsys, no_part_runs):
  ro = tmp_path / "ro2"
  ro.mkdir()
  ro.chmod(0o555)
  try:
    err = cli_error(
        ["--workdir", str(ro / "s"), "--problem", "quadratic", "--tau", "1", "--num-steps", "5"],
        capsys,
    )
  finally:
    ro.chmod(0o755)
  assert f"workdir '{ro / 's'}' cannot be written: Permission denied" in err
  assert not (ro / "s").exists()


# -- 3. num_steps: int32 clock, memory limit -----------------------------------------
def test_num_steps_past_the_int32_clock_is_refused(tmp_path, capsys, no_part_runs):
  err = cli_error(
      ["--workdir", str(tmp_path / "s"), "--problem", "quadratic", "--num-steps", "99999999999"],
      capsys,
  )
  assert (
      "num_steps (local steps per worker; int32 step counter) must be an integer in "
      "[1, 2147483647], got 99999999999"
  ) in err
  assert not (tmp_path / "s").exists()


def test_a_sweep_above_the_memory_limit_is_refused(tmp_path, capsys, no_part_runs):
  err = cli_error(
      [
          "--workdir",
          str(tmp_path / "s"),
          "--problem",
          "quadratic",
          "--num-steps",
          "2147483647",
          "--tau",
          "1",
          "--alpha",
          "0.1",
      ],
      capsys,
  )
  assert (
      "the quadratic sweep needs about 72 GiB (77309411312 bytes: "
      "num_steps=2147483647 x (4 workers x 8 bytes"
  ) in err
  assert "allowed: at most 4 GiB (easgd.sweeps.grid.MAX_SWEEP_BYTES)" in err
  assert not (tmp_path / "s").exists()


def test_the_memory_estimate_counts_steps_workers_and_configurations(monkeypatch):
  grid = SweepGrid(tau=(1, 2), alpha=(0.1, 0.2, 0.3), num_workers=(2, 3)).validate()
  # largest program p = 3: 10 x (3 x 8 + 4) + 6 configurations x 4 copies x 4 bytes
  assert check_memory("quadratic", grid, 10, 8, 4, "x") == 280 + 96
  monkeypatch.setattr("easgd.sweeps.grid.MAX_SWEEP_BYTES", 375)
  with pytest.raises(
      SweepError,
      match=r"needs about .* \(376 bytes: num_steps=10 x "
      r"\(3 workers x 8 bytes of x \+ a 4-byte step index\) \+ 6 "
      r"configurations x 4 parameter copies x 4 bytes\)",
  ):
    check_memory("quadratic", grid, 10, 8, 4, "x")


def test_the_network_memory_is_checked_before_the_hessian(monkeypatch, no_part_runs):
  monkeypatch.setattr("easgd.sweeps.grid.MAX_SWEEP_BYTES", 10**6)
  grid = SweepGrid(tau=(1,), alpha=(0.1,), num_workers=(2,))
  with pytest.raises(SweepError, match="the network sweep needs about .* allowed: at most"):
    sweep_network(grid, 1000, dataset="digits", per_worker_batch_size=4)


# -- 4. sizes and models that the data set cannot run: before compiling ---------------
def test_a_batch_larger_than_the_data_set_is_refused_before_compiling(
    tmp_path, capsys, no_part_runs
):
  err = cli_error(
      [
          "--workdir",
          str(tmp_path / "s"),
          *TINY,
          "--dataset",
          "digits",
          "--per-worker-batch-size",
          "100000",
      ],
      capsys,
  )
  assert (
      "per_worker_batch_size (examples per worker per step; one step of 2 workers "
      "must fit in the 1438 training examples of dataset 'digits') must be an "
      "integer in [1, 719], got 100000"
  ) in err
  assert not (tmp_path / "s").exists()
  grid = SweepGrid(tau=(1,), alpha=(0.1,), num_workers=(2,))
  with pytest.raises(SweepError, match="must be an integer in \\[1, 719\\], got 1000"):
    sweep_network(grid, 5, dataset="digits", per_worker_batch_size=1000)


@pytest.mark.parametrize(
    "model,message",
    [
        ("cifar", "CifarNet input has shape (1, 8, 8, 1); expected images"),
        ("cnn_bn", "model 'cnn_bn' has BatchNorm, which the sweep does not support"),
        ("resnet", "unknown model 'resnet'; allowed: mlp, cnn, cnn_bn, cifar"),
    ],
)
def test_a_model_the_sweep_cannot_run_is_refused_before_compiling(
    model, message, tmp_path, capsys, no_part_runs
):
  err = cli_error(["--workdir", str(tmp_path / "s"), *TINY, *NET, "--model", model], capsys)
  assert message in err
  assert not (tmp_path / "s").exists()


def test_a_flax_error_of_a_model_is_one_line():
  import flax.linen as nn

  class Needs3d(nn.Module):

    @nn.compact
    def __call__(self, x, train=False):
      return nn.Dense(10)(x.reshape(x.shape[0], 7, -1))  # not divisible: error

  grid = SweepGrid(tau=(1,), alpha=(0.1,), num_workers=(2,))
  with pytest.raises(models.ModelError) as info:
    check_network(grid, 5, dataset="digits", model=Needs3d(), per_worker_batch_size=4)
  assert str(info.value).startswith(
      "model 'Needs3d' cannot take the inputs of dataset 'digits' (shape (8, 8, 1)): "
  )
  assert "\n" not in str(info.value)


# -- 5. a setting the chosen problem does not read is refused -------------------------
@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--problem", "quadratic", "--dataset", "cifar10"],
            "dataset='cifar10' is not read by problem 'quadratic'; leave it at its default "
            "'mnist1d', or use problem 'network' or 'both'",
        ),
        (
            ["--problem", "quadratic", "--model", "cnn"],
            "model='cnn' is not read by problem 'quadratic'",
        ),
        (
            ["--problem", "quadratic", "--hessian-iterations", "5"],
            "hessian_iterations=5 is not read by problem 'quadratic'",
        ),
        (
            ["--problem", "network", "--quadratic-spread", "2"],
            "quadratic_spread=2.0 is not read by problem 'network'; leave it at its default "
            "0.5, or use problem 'quadratic' or 'both'",
        ),
        (
            ["--problem", "network", "--hessian-iterations", "0", "--hessian-examples", "100"],
            "hessian_examples=100 is not read with hessian_iterations=0 (no Hessian estimate)",
        ),
        (
            ["--problem", "network", "--data-dir", "/tmp"],
            "data_dir='/tmp' is not read by dataset 'mnist1d' (generated or shipped)",
        ),
    ],
)
def test_a_setting_the_problem_does_not_read_is_refused(
    args, message, tmp_path, capsys, no_part_runs
):
  err = cli_error(
      ["--workdir", str(tmp_path / "s"), "--tau", "1", "--num-steps", "5", *args], capsys
  )
  assert message in err
  assert not (tmp_path / "s").exists()


def test_the_config_api_refuses_unread_settings_too():
  with pytest.raises(SweepError, match="model='cnn' is not read by problem 'quadratic'"):
    command.SweepConfig(problem="quadratic", model="cnn").validate()
  with pytest.raises(SweepError, match="curvature=2.0 is not read by problem 'network'"):
    command.SweepConfig(problem="network", curvature=2.0).validate()
  config = command.SweepConfig(problem="both", model="cnn", curvature=2.0)
  assert config.unread_fields() == {} and config.validate().model == "cnn"
  assert command.SweepConfig(problem="quadratic").validate().unread_fields() == {}


# -- 6. a tau longer than the run ------------------------------------------------------
def test_a_tau_longer_than_the_run_is_refused(tmp_path, capsys, no_part_runs):
  err = cli_error(
      [
          "--workdir",
          str(tmp_path / "s"),
          "--problem",
          "quadratic",
          "--tau",
          "1,1000",
          "--num-steps",
          "5",
      ],
      capsys,
  )
  assert (
      "tau grid value (communication period, at most the run's num_steps=5) must be "
      "an integer in [1, 5], got 1000"
  ) in err
  assert not (tmp_path / "s").exists()
  with pytest.raises(SweepError, match="at most the run's num_steps=5"):
    command.SweepConfig(problem="quadratic", tau=(8,), num_steps=5).validate()
  with pytest.raises(SweepError, match="got 8"):
    from easgd.sweeps import quadratic

    quadratic.sweep_quadratic(SweepGrid(tau=(8,), alpha=(0.1,)), 5)


# -- 7. more Hessian examples than the data set has ------------------------------------
def test_more_hessian_examples_than_the_data_set_has_are_refused(tmp_path, capsys, no_part_runs):
  err = cli_error(
      [
          "--workdir",
          str(tmp_path / "s"),
          "--tau",
          "1",
          "--num-steps",
          "5",
          *NET,
          "--num-workers",
          "2",
          "--hessian-examples",
          "10000000",
      ],
      capsys,
  )
  assert (
      "hessian_examples (training examples in the Hessian's loss; dataset 'digits' "
      "has 1438) must be an integer in [1, 1438], got 10000000"
  ) in err
  assert not (tmp_path / "s").exists()
  # none (the default): 2000, or the whole training set if it is smaller
  grid = SweepGrid(tau=(1,), alpha=(0.1,), num_workers=(2,))
  setup = check_network(grid, 5, dataset="digits", per_worker_batch_size=4)
  assert setup.hessian_examples == 1438 == datasets.load_dataset("digits").num_train
  assert command.SweepConfig(dataset="digits").validate().hessian_examples is None


# -- 8. SweepConfig's field types --------------------------------------------------------
@pytest.mark.parametrize(
    "field,value,message",
    [
        (
            "hessian_at_trained",
            "no",
            "hessian_at_trained must be a bool (True or False), " "got 'no'",
        ),
        ("hessian_at_trained", 1, "hessian_at_trained must be a bool"),
        (
            "num_steps",
            True,
            "num_steps (local steps per worker; int32 step counter) must be "
            "an integer in [1, 2147483647], got True",
        ),
        ("num_steps", "5", "got '5'"),
        ("num_steps", 5.0, "got 5.0"),
        ("curvature", "1", "curvature must be a finite real in (0.0, inf), got '1'"),
        ("curvature", True, "curvature must be a finite real in (0.0, inf), got True"),
        ("seed", 2**32, "seed must be an integer in [0, 4294967295], got 4294967296"),
        ("tau", "1,2", "tau grid must be a tuple of numbers, got '1,2'"),
        ("tau", None, "tau grid must be a tuple of numbers, got None"),
        ("alpha", (True,), "alpha grid value must be a finite real in [0.0, inf), got True"),
        ("problem", 1, "unknown problem 1; allowed: quadratic, network, both"),
        ("dataset", ["digits"], "unknown dataset ['digits']; allowed:"),
        ("data_dir", 3, "data_dir must be a path string or None, got 3"),
        ("hessian_examples", 0, "hessian_examples must be an integer >= 1, got 0"),
    ],
)
def test_every_config_field_is_checked_by_type(field, value, message):
  with pytest.raises(ValueError) as info:  # SweepError, DataError, ...
    command.SweepConfig(**{field: value}).validate()
  assert message in str(info.value)


def test_numpy_values_are_accepted_and_made_python(tmp_path):
  config = command.SweepConfig(
      problem="quadratic",
      tau=np.array([1, 2]),
      alpha=(np.float32(0.25),),
      num_workers=(np.int64(2),),
      num_steps=np.int64(5),
      curvature=np.float32(2.0),
      seed=np.uint32(3),
      divergence_factor=np.float64(10.0),
  ).validate()
  assert config.tau == (1, 2) and type(config.num_steps) is int
  assert type(config.curvature) is float and type(config.seed) is int
  json.dumps(dataclasses.asdict(config))  # sweep_config.json can be written
  network = command.SweepConfig(hessian_at_trained=np.bool_(False), data_dir=None).validate()
  assert network.hessian_at_trained is False
