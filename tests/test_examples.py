"""The examples of a user's own task (``examples/``): their errors, their data path,
the BatchNorm policy of the ResNet example, and both through ``easgd train`` and
``easgd compare`` (``--task``, from the repository root)."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from easgd.settings.config import TrainConfig
from easgd.tasks.sources import ItemSource, TaskError, take
from easgd.tasks.task import load_task

ROOT = Path(__file__).resolve().parents[1]
LM = "examples.transformer_lm:make_task"
RESNET = "examples.resnet_cnn:make_task"


def write_text(path: Path, n_bytes: int) -> Path:
  """A repetitive text of ``n_bytes`` bytes (a language model learns it fast)."""
  line = b"the center is an elastic average of the workers. "
  path.write_bytes((line * (n_bytes // len(line) + 1))[:n_bytes])
  return path


def write_npz(path: Path, n_train: int = 256, n_test: int = 64) -> Path:
  """A subset of scikit-learn's 8x8 digits as the ResNet example's .npz."""
  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
  from examples import make_data  # noqa: PLC0415

  make_data.write_images(str(path), "digits", n_train, n_test, seed=0)
  return path


def in_root(monkeypatch):
  monkeypatch.chdir(ROOT)  # load_task searches the working directory first


GPL3 = Path("/usr/share/common-licenses/GPL-3")


@pytest.mark.skipif(not GPL3.is_file(), reason="needs Debian's base-files")
def test_make_data_text_defaults_to_the_stable_gpl3(tmp_path):
  """The Transformer example's default text is Debian's GPL-3 (the size and
  sha256 examples/README.md gives), not files of this package that change."""
  import hashlib  # noqa: PLC0415

  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
  from examples import make_data  # noqa: PLC0415

  assert make_data.main(["text", "--out", str(tmp_path / "t.txt")]) == 0
  data = (tmp_path / "t.txt").read_bytes()
  assert len(data) == 35149
  digest = "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986"
  assert hashlib.sha256(data).hexdigest() == digest


def test_lm_missing_file_and_short_text_are_one_line(tmp_path, monkeypatch):
  in_root(monkeypatch)
  with pytest.raises(TaskError, match=r"path='.*nope.txt' is not a file") as e:
    load_task(LM, {"path": str(tmp_path / "nope.txt")})
  assert "\n" not in str(e.value)
  short = write_text(tmp_path / "short.txt", 20)
  with pytest.raises(TaskError, match=r"shorter than one window of context\+1 = 33 bytes"):
    load_task(LM, {"path": str(short)})
  with pytest.raises(TaskError, match=r"d_model=30 must be a multiple of num_heads=4"):
    load_task(LM, {"path": str(short), "d_model": 30})


def test_resnet_bad_files_are_one_line(tmp_path, monkeypatch):
  in_root(monkeypatch)
  with pytest.raises(TaskError, match=r"path='.*nope.npz' is not a file"):
    load_task(RESNET, {"path": str(tmp_path / "nope.npz")})
  np.savez(tmp_path / "part.npz", x_train=np.zeros((4, 8, 8)), y_train=np.zeros(4, np.int32))
  with pytest.raises(TaskError, match=r"has no 'x_test'"):
    load_task(RESNET, {"path": str(tmp_path / "part.npz")})
  npz = write_npz(tmp_path / "d.npz", 16, 8)
  with pytest.raises(TaskError, match=r"crop_size=9 must be in \[1, 8\]"):
    load_task(RESNET, {"path": str(npz), "crop_size": 9})


def test_lm_windows_go_through_the_item_source_path(tmp_path, monkeypatch):
  in_root(monkeypatch)
  text = write_text(tmp_path / "t.txt", 1000)
  task = load_task(LM, {"path": str(text), "context": 8, "test_fraction": 0.2})
  assert isinstance(task.train, ItemSource)  # not NumPy arrays
  raw = np.frombuffer(text.read_bytes(), np.uint8)
  # train: the first 800 bytes, windows of 9 every 8 bytes: (800 - 9) // 8 + 1
  assert len(task.train) == 99 and len(task.test) == (200 - 9) // 8 + 1
  batch = take(task.train, np.array([[0, 3], [98, 1]]))
  assert batch.shape == (2, 2, 9) and batch.dtype == np.int32
  np.testing.assert_array_equal(batch[1, 0], raw[98 * 8 : 98 * 8 + 9])
  np.testing.assert_array_equal(take(task.test, np.array([0])), raw[None, 800:809])
  params = task.init(jax.random.key(0))
  out = task.evaluate(params, take(task.test, np.arange(4)))
  assert out["loss"].shape == (4,) and out["correct"].shape == (4,)
  # an untrained byte model: near ln(256) = 5.5 nats per byte
  assert 4.5 < float(np.mean(out["loss"])) < 8


def test_resnet_center_is_evaluated_with_its_own_pooled_statistics(tmp_path, monkeypatch):
  """The run's evaluation of the center uses ``center_state`` over all workers'
  examples pooled (exactly the statistics of one pass over their union), not any
  one worker's: the example's module honours ``bn_axis_name``."""
  from easgd.runtimes.training_run import Run  # noqa: PLC0415

  in_root(monkeypatch)
  npz = write_npz(tmp_path / "d.npz")
  config = TrainConfig(
      task=RESNET,
      task_args=(f"path={json.dumps(str(npz))}", "width=8", "blocks=2"),
      num_workers=2,
      global_batch_size=32,
      num_epochs=1,
      bn_stats_examples=64,
      progress=False,
  )
  run = Run(config)
  assert run.batch_norm and run.task.center_state is not None
  params = run.init_params
  x, y = run.bn_stats_data  # [devices, workers per device, n, ...]
  pooled = (x.reshape(-1, *x.shape[3:]), y.reshape(-1))
  assert len(pooled[0]) == 64
  expected = run.task.center_state(params, pooled, None)
  got = run.center_batch_stats(params)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  worker0 = run.task.center_state(params, (x[0, 0], y[0, 0]), None)
  gap = max(float(np.max(np.abs(a - b))) for a, b in zip(*map(jax.tree.leaves, (worker0, got))))
  assert gap > 1e-3  # one worker's statistics are not the center's

  worker, shared = run.initial_state()
  record = run.evaluate(worker, shared, 0, 0, None)
  test = take(run.task.test, np.arange(len(run.task.test)))
  with_center = np.mean(run.task.evaluate(params, test, expected)["loss"])
  with_worker = np.mean(run.task.evaluate(params, test, worker0)["loss"])
  np.testing.assert_allclose(record["test_loss"], with_center, rtol=1e-4)
  assert abs(with_worker - with_center) > 1e-3


def cli(*args, progress_flag=True):
  """``easgd ARGS`` from the repository root (with ``--no-progress`` where the
  command takes it); asserts exit status 0."""
  proc = subprocess.run(
      [sys.executable, "-m", "easgd.cli", *args, *(["--no-progress"] if progress_flag else [])],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def records(path: Path):
  return [json.loads(line) for line in path.read_text().splitlines()]


SMALL = ("--num-workers", "2", "--global-batch-size", "32", "--num-epochs", "1")


@pytest.mark.slow
def test_lm_trains_through_easgd_train(tmp_path):
  text = write_text(tmp_path / "t.txt", 6000)  # (5400 - 17) // 16 + 1 training windows
  work = tmp_path / "run"
  task_args = ("--task-arg", f"path={text}", "--task-arg", "context=16", "--task-arg", "d_model=32")
  adam = ("--optimizer", "adam", "--learning-rate", "0.003")
  cli("train", "--task", LM, *task_args, "--workdir", str(work), *SMALL, *adam)
  summary = json.loads((work / "summary.json").read_text())
  assert summary["task"]["factory"] == LM and summary["task"]["context"] == 16
  assert summary["task"]["train_examples"] == 337 and summary["task"]["batch_norm"] is False
  first, last = records(work / "metrics.jsonl")[0], records(work / "metrics.jsonl")[-1]
  assert 4.5 < first["test_loss"] < 8  # untrained: near ln(256) = 5.5 nats per byte
  assert last["test_loss"] < first["test_loss"] - 1.0, (first, last)  # it learns the text
  assert 0 <= last["test_accuracy"] <= 1


@pytest.mark.slow
def test_lm_through_easgd_compare(tmp_path):
  text = write_text(tmp_path / "t.txt", 3000)
  work = tmp_path / "cmp"
  cli(
      "compare", "--task", LM, "--task-arg", f"path={text}", "--task-arg", "context=16",
      "--task-arg", "d_model=32", "--task-arg", "num_layers=1",
      "--workdir", str(work), "--algorithms", "easgd,pmean_sgd", *SMALL,
  )  # fmt: skip
  results = json.loads((work / "results.json").read_text())
  assert "easgd" in json.dumps(results) and "pmean_sgd" in json.dumps(results)
  for name in ("easgd", "pmean_sgd"):
    summary = json.loads((work / name / "summary.json").read_text())
    assert summary["task"]["factory"] == LM


@pytest.mark.slow
def test_resnet_trains_through_easgd_train_and_compare(tmp_path):
  npz = write_npz(tmp_path / "d.npz")
  args = ("--task", RESNET, "--task-arg", f"path={npz}", "--task-arg", "width=8")
  args += ("--task-arg", "blocks=2", "--task-arg", "crop_size=6", "--bn-stats-examples", "64")
  cli("train", *args, "--workdir", str(tmp_path / "run"), *SMALL)
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["task"]["batch_norm"] is True and summary["task"]["input_shape"] == [6, 6, 1]
  assert summary["final"]["test_accuracy"] > 0.2  # 10 classes, one epoch of 256 digits
  cli("compare", *args, "--workdir", str(tmp_path / "cmp"), "--algorithms", "easgd", *SMALL)
  summary = json.loads((tmp_path / "cmp" / "easgd" / "summary.json").read_text())
  assert summary["task"]["batch_norm"] is True and summary["task"]["factory"] == RESNET


def protocol_results(work: Path, config: str, *task_args: str) -> dict:
  """``easgd protocol`` of ``examples/<config>``'s protocol (its base task, budget,
  grids and seeds) with its first arm only and its grid never extended (one
  tuning and one report program; the extension is tests/test_protocol_grid.py's),
  its task arguments replaced by ``task_args`` (tiny sizes)."""
  module = config.removesuffix(".py")
  wrapper = work.parent / f"first_arm_{module}.py"
  wrapper.write_text(
      "import dataclasses\n"
      f"from examples.{module} import get_protocol as full\n"
      "def get_protocol():\n"
      "  p = full()\n"
      "  return dataclasses.replace(p, arms=p.arms[:1], max_grid_extensions=0)\n"
  )
  args = [a for kv in task_args for a in ("--task-arg", kv)]
  cli("protocol", "--config", str(wrapper), *args, "--workdir", str(work), progress_flag=False)
  assert (work / "results.md").is_file()
  results = json.loads((work / "results.json").read_text())
  assert [p["kind"] for p in results["programs"]] == ["tune", "report"]
  return results


def assert_every_arm_reported(results: dict, arms: tuple[str, ...]) -> None:
  """Every arm of ``arms`` (in order) has a chosen rate of its grid and a
  finite final test error on each of the 3 report seeds."""
  assert tuple(results["arms"]) == arms
  for name, arm in results["arms"].items():
    assert arm["chosen_learning_rate"] in arm["learning_rates"], name
    errors = arm["final_test_errors"]  # one per report seed
    assert len(errors) == 3 and np.isfinite(errors).all(), (name, errors)
    assert all(0 <= e <= 1 for e in errors) and np.isfinite(arm["final_test_error"]["mean"])


ARMS = ("easgd tau=4",)  # the protocol files' first arm


@pytest.mark.slow
def test_lm_through_easgd_protocol(tmp_path):
  """examples/protocol_lm.py end to end on a short text and a tiny model: 337
  training windows of 17 bytes, 128 of them validation, 3 steps per epoch."""
  text = write_text(tmp_path / "t.txt", 6000)
  results = protocol_results(
      tmp_path / "proto", "protocol_lm.py", f"path={text}", "context=16", "d_model=16",
      "num_heads=2", "num_layers=1",
  )  # fmt: skip
  assert_every_arm_reported(results, ARMS)
  assert results["protocol"]["base"]["task"] == LM


@pytest.mark.slow
def test_resnet_through_easgd_protocol(tmp_path):
  """examples/protocol_resnet.py end to end (BatchNorm's center_state, no crops)
  with a 1-block ResNet of 4 channels on the whole of the 8x8 digits."""
  npz = write_npz(tmp_path / "d.npz", None, None)
  results = protocol_results(
      tmp_path / "proto", "protocol_resnet.py", f"path={npz}", "width=4", "blocks=1"
  )
  assert_every_arm_reported(results, ARMS)
  assert results["protocol"]["base"]["task"] == RESNET
