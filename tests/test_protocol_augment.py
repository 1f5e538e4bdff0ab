"""The comparison protocol on tasks that augment their batches (``Task.augment``).

The protocol trains on the global batches ``easgd train`` augments (made on the
host: the same indices, ``augment`` with ``crop_rng(seed, epoch, step)``), and a
BatchNorm center is evaluated with statistics over the trainer's centre-cropped
training examples; so one program gives each configuration its ``easgd train``
run. The data: a small CIFAR-10 directory written here in the python-batch
format (the built-in ``cifar10`` data set with ``crop_size``).
"""

import dataclasses
import pickle

import numpy as np
import pytest

from easgd import TrainConfig, train_and_evaluate
from easgd.protocol import programs
from easgd.protocol import runs as protocol
from easgd.protocol.config import Arm, ProtocolConfig, ProtocolError
from easgd.runtimes.training_run import Run, global_batch
from easgd.tasks import batches, loaders

from testutil import linear_data, linear_task

PER_FILE, NUM_TEST = 40, 40
"""Five training files of 40 images (200) and 40 test images."""

LOSS_RTOL = 1e-6
"""Relative tolerance on the validation and test losses, one program (one
configuration per call) against separate ``easgd train`` runs (float32; as
tests/test_protocol.py's LOSS_RTOL). A batch off by one step, epoch or crop
moves a loss by 1e-3 or more."""


def write_cifar(root):
  """A CIFAR-10 directory: random uint8 images ([N, 3072] rows: R, G, B
  planes) and labels, the official file names."""
  root.mkdir(parents=True, exist_ok=True)
  files = [*loaders.CIFAR10_TRAIN_FILES, loaders.CIFAR10_TEST_FILE]
  for i, name in enumerate(files):
    rng = np.random.default_rng(i)
    n = NUM_TEST if name == loaders.CIFAR10_TEST_FILE else PER_FILE
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, size=n)]
    with open(root / name, "wb") as f:
      pickle.dump({b"batch_label": b"test", b"data": data, b"labels": labels}, f)
  return str(root)


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
  return write_cifar(tmp_path_factory.mktemp("cifar"))


def base_config(data_dir, model="mlp", **changes):
  """160 training images (40 held out), 2 workers x 16, 28x28 random crops:
  5 steps per epoch, 10 steps in all."""
  return TrainConfig(
      dataset="cifar10",
      data_dir=data_dir,
      model=model,
      crop_size=28,
      num_workers=2,
      global_batch_size=32,
      num_epochs=2,
      tau=2,
      validation_examples=40,
      progress=False,
      **(dict(bn_stats_examples=64) if model == "cnn_bn" else {}),
  ).replace(**changes)


def assert_equals_train(config, configs, seed_data, tmp_path, task=None):
  """Runs ``configs`` as one report program (one per call) and each as ``easgd
  train``; asserts equal validation and test losses and errors at every epoch
  end. Returns the program's outputs."""
  (arm,) = config.arms
  run = programs.prepare(config, seed_data.num_train)[arm.name]
  one = dataclasses.replace(config, configs_per_batch=1)
  out, info = programs.run_program([run], configs, seed_data, "report", one)
  assert info["configs"] == len(configs)
  steps = list(run.eval_steps)
  for i, c in enumerate(configs):
    cfg = run.config.replace(learning_rate=c["learning_rate"], seed=c["seed"])
    history = train_and_evaluate(cfg, tmp_path / f"train{i}", task=task)["history"]
    epoch_ends = list(range(0, run.num_steps + 1, run.steps_per_epoch))
    assert [rec["step"] for rec in history] == epoch_ends
    for rec in history:
      k = steps.index(rec["step"])
      for split in ("val", "test"):
        got, want = out["curves"][f"{split}_loss"][i, k], rec[f"{split}_loss"]
        assert got == pytest.approx(want, rel=LOSS_RTOL), (c, split, rec["step"])
        assert out["curves"][f"{split}_error"][i, k] == pytest.approx(
            rec[f"{split}_error"], abs=1e-6
        )
  return out


def test_the_augmented_batches_are_easgd_trains_bit_for_bit(cifar_dir):
  base = base_config(cifar_dir)
  config = ProtocolConfig("aug", "", base, (Arm("easgd", "easgd", {}, (0.05,)),)).validate()
  seed_data = programs.SeedData(base, (3,))
  run = programs.prepare(config, seed_data.num_train)["easgd"]
  made = programs.augmented_batches(seed_data, run, 3)
  x, y = made
  assert x.shape == (10, 2, 16, 28, 28, 3) and y.shape == (10, 2, 16)  # [T, p, B, ...]
  trainer = Run(base.replace(seed=3))
  for t in range(run.num_steps):
    epoch = t // trainer.steps_per_epoch + 1  # as easgd.runtimes.spmd numbers them
    ix = batches.worker_batch_indices(160, 2, 16, 3, epoch)[t % trainer.steps_per_epoch]
    want = global_batch(trainer, ix, epoch, t)
    for got, w in zip(made, want):
      np.testing.assert_array_equal(got[t], w)
  # random crops: not the centre crops of the same images
  images, _ = seed_data.train_examples(3, programs.batch_indices(seed_data, run, 3))
  assert not np.array_equal(x, batches.center_crop(images, 28))
  # the center's BatchNorm examples: the trainer's, centre-cropped
  bn = base_config(cifar_dir, model="cnn_bn").replace(seed=3)
  bn_x, _ = programs.center_state_examples(programs.SeedData(bn, (3,)), bn, 3)
  want = Run(bn).bn_stats_data[0]
  np.testing.assert_array_equal(bn_x, np.asarray(want).reshape(bn_x.shape))
  assert bn_x.shape == (64, 28, 28, 3)


def test_a_cropping_task_through_the_protocol_equals_easgd_train(cifar_dir, tmp_path):
  base = base_config(cifar_dir)
  config = ProtocolConfig(
      "aug", "", base, (Arm("easgd", "easgd", {}, (0.02, 0.05)),), eval_every_steps=5
  ).validate()
  seed_data = programs.SeedData(base, (3, 4))
  # two rates of seed 3 share one slot of augmented batches
  configs = [
      dict(arm="easgd", learning_rate=0.02, seed=3),
      dict(arm="easgd", learning_rate=0.05, seed=3),
      dict(arm="easgd", learning_rate=0.05, seed=4),
  ]
  out = assert_equals_train(config, configs, seed_data, tmp_path)
  val = out["curves"]["val_loss"]
  assert not np.allclose(val[0, -1], val[1, -1]) and not np.allclose(val[1, -1], val[2, -1])


def test_a_batchnorm_model_with_crops_through_the_protocol_equals_easgd_train(cifar_dir, tmp_path):
  base = base_config(cifar_dir, model="cnn_bn")
  config = ProtocolConfig(
      "aug", "", base, (Arm("easgd", "easgd", {}, (0.05,)),), eval_every_steps=5
  ).validate()
  seed_data = programs.SeedData(base, (3, 4))
  assert seed_data.task.center_state is not None and seed_data.task.eval_transform is not None
  configs = [dict(arm="easgd", learning_rate=0.05, seed=s) for s in (3, 4)]
  assert_equals_train(config, configs, seed_data, tmp_path)


def test_run_protocol_on_a_cropping_task_reports_easgd_trains_run(cifar_dir, tmp_path):
  base = base_config(cifar_dir)
  config = ProtocolConfig(
      "aug",
      "",
      base,
      (Arm("easgd", "easgd", {}, (0.02, 0.05)),),
      eval_every_steps=5,
      tune_seeds=(0, 1, 2),
      report_seeds=(3, 4, 5),
      max_grid_extensions=0,
      configs_per_batch=1,
  )
  results = protocol.run_protocol(config, log=lambda line: None)
  arm = results["arms"]["easgd"]
  assert arm["chosen_learning_rate"] in (0.02, 0.05)
  cfg = base.replace(learning_rate=arm["chosen_learning_rate"], seed=3)
  history = train_and_evaluate(cfg, tmp_path / "train")["history"]
  assert arm["report"]["eval_steps"] == [rec["step"] for rec in history] == [0, 5, 10]
  got = arm["report"]["test_loss_curve"][0]  # report seed 3
  assert got == pytest.approx([rec["test_loss"] for rec in history], rel=LOSS_RTOL)


def test_any_augment_of_a_users_task_equals_easgd_train(tmp_path):
  """Not crops: noise drawn from the generator over the whole global batch."""

  def noisy(batch, rng):
    x, y = batch["x"], batch["y"]
    return {"x": x + rng.normal(0.0, 0.5, size=x.shape).astype(x.dtype), "y": y}

  task = linear_task(linear_data(640, 1), linear_data(200, 2), augment=noisy)
  base = TrainConfig(  # 8 steps per epoch: 640 examples, 128 held out, 2 x 32 per step
      num_epochs=2,
      global_batch_size=64,
      num_workers=2,
      tau=2,
      validation_examples=128,
      progress=False,
  )
  arm = Arm("easgd", "easgd", {}, (0.3,))
  config = ProtocolConfig("aug", "", base, (arm,), eval_every_steps=8).validate()
  seed_data = programs.SeedData(base, (5,), task)
  run = programs.prepare(config, seed_data.num_train)["easgd"]
  out, _ = programs.run_program(
      [run], [dict(arm="easgd", learning_rate=0.3, seed=5)], seed_data, "report", config
  )
  history = train_and_evaluate(
      run.config.replace(learning_rate=0.3, seed=5), tmp_path / "train", task=task
  )["history"]
  assert [rec["step"] for rec in history] == [0, 8, 16]
  for rec, k in zip(history, (0, 1, 2)):
    for split in ("val", "test"):
      assert out["curves"][f"{split}_loss"][0, k] == pytest.approx(
          rec[f"{split}_loss"], rel=LOSS_RTOL
      )


def test_augmented_batches_beyond_the_limit_are_refused_before_anything_compiles(
    cifar_dir, monkeypatch
):
  def never(*args, **kwargs):
    raise AssertionError("a program ran")

  monkeypatch.setattr(protocol, "run_program", never)
  base = base_config(cifar_dir, num_epochs=10**4)  # 5 x 10^4 steps
  config = ProtocolConfig(
      "aug",
      "",
      base,
      (Arm("easgd", "easgd", {}, (0.05,)),),
      tune_seeds=(0, 1, 2),
      report_seeds=(3, 4, 5),
  )
  # three seeds' 5 x 10^4 augmented global batches, each 32 crops (28 x 28 x 3
  # float32) and labels (int32): 3 x 50000 x 32 x 9412 bytes
  need = 3 * 50000 * 32 * (28 * 28 * 3 * 4 + 4)
  assert need == 45_177_600_000 and programs.MAX_AUGMENTED_BYTES == 2**31
  with pytest.raises(ProtocolError) as e:
    protocol.run_protocol(config, log=lambda line: None)
  assert str(e.value) == (
      "arm 'easgd': 3 seeds x 50000 steps x 301184 bytes of an augmented global batch "
      "need 45177600000 bytes (42.1 GiB); allowed: at most 2147483648 bytes "
      "(2 GiB; fewer epochs or seeds, or smaller examples)"
  )  # one line
  # within the limit: the same arm at 2 epochs is accepted (prepared, not run)
  seed_data = programs.SeedData(base.replace(num_epochs=2), (0, 1, 2))
  small = dataclasses.replace(config, base=base.replace(num_epochs=2)).validate()
  (run,) = programs.prepare(small, seed_data.num_train, seed_data.augmented_batch_bytes).values()
  assert run.num_steps == 10
  assert seed_data.augmented_batch_bytes(2, 16) == 32 * 9412


def test_the_cifar10_schedule_protocol_runs_the_schedule_experiments_arms_as_easgd_train(
    cifar_dir, tmp_path, monkeypatch
):
  """experiments/cifar10.py's get_protocol() on the fixture: the arms of
  experiments/protocol_schedule.py at 128 examples per worker; one of them
  (p = 2, a step decay counted in the 1-worker run's steps, random crops and
  flips, BatchNorm), shrunk to the fixture, through the protocol's program
  equals ``easgd train``."""
  import runpy
  from pathlib import Path

  monkeypatch.setenv("CIFAR10_DIR", cifar_dir)
  experiments = Path(__file__).resolve().parent.parent / "experiments"
  config = runpy.run_path(str(experiments / "cifar10.py"))["get_protocol"]().validate()
  schedule = runpy.run_path(str(experiments / "protocol_schedule.py"))
  assert [a.name for a in config.arms] == [a.name for a in schedule["schedule_arms"]()]
  assert config.base.data_dir == cifar_dir and config.base.random_flip
  arm = next(a for a in config.arms if a.name == "p=2 per step none")
  assert arm.config(config.base).lr_schedule_unit == "reference_steps"
  # the fixture: 160 training images, 1 worker of 8 -> 20 steps per epoch; at p = 2,
  # 10 steps per epoch and the decay at reference epoch 0.5 falls on step 10
  base = config.base.replace(
      global_batch_size=8,
      num_epochs=2,
      lr_decay_epochs=(0.5, 1.5),
      validation_examples=40,
      bn_stats_examples=64,
  )
  small = dataclasses.replace(
      arm,
      overrides=dict(arm.overrides, global_batch_size=16, lr_reference_batch=8),
      lr_from=None,
      learning_rates=(0.05,),
  )
  small = ProtocolConfig("cifar", "", base, (small,), eval_every_steps=10).validate()
  seed_data = programs.SeedData(base, (3,))
  configs = [dict(arm=small.arms[0].name, learning_rate=0.05, seed=3)]
  assert_equals_train(small, configs, seed_data, tmp_path)
