"""Stop on one mesh shape, resume on another: checkpoints are layout-free.

A checkpoint holds whole host arrays (every worker's state [p, ...], the
shared state once; ``easgd.run.checkpoint``), never a device's shard, so
a run stopped on a ("devices", "data") mesh of shape [p, D] resumes on
another D: ``devices_per_worker`` (like ``num_devices`` and
``mapping_backend``) says where a worker runs, not what it computes, and is
one of ``easgd.run.rundir.RESUMABLE_CHANGES``. The number of workers,
the batch and the algorithm's settings are what the run computes and must
match.

Digits, MLP, easgd with p = 2 workers, tau = 4, global batch 64 (32 per
worker): 22 steps in one epoch. The run stops on 2x4 (8 devices) after 7
steps, resumes on 2x1 (one device per worker) to step 15, and ends on 2x2 (4
devices) with ``shard_params`` (each worker's state stored split over its 2
devices, its final evaluation gathering the center). It is compared with the
uninterrupted run on 2x4.

Tolerance: 1e-6 absolute on every worker's parameters and optimizer state and
on the center, 1e-5 on the per-step training losses, 1e-5 relative on the
evaluated test losses (float32: a worker of D devices sums its D partial
gradients in another order than one device sums its batch). Measured: 3.0e-8
on the state and the center, 2.4e-7 on the training losses, the test losses
equal (0 relative); the run moved the center by 0.087 (largest entry) from
its initial parameters.
"""

import json

import jax
import numpy as np
import pytest

from easgd.run import checkpoint, trainer
from easgd.runtimes.training_run import Run
from easgd.settings.config import ConfigError, TrainConfig

from testutil import max_abs_diff

# 1438 digits training images / 64 = 22 steps per epoch
CONFIG = TrainConfig(
    dataset="digits",
    model="mlp",
    num_workers=2,
    global_batch_size=64,
    num_epochs=1,
    learning_rate=0.1,
    tau=4,
    eval_batch_size=64,
    mapping_backend="shard_map",
    devices_per_worker=4,
    progress=False,
)
TOL = 1e-6


def latest_checkpoint(workdir):
  ck = checkpoint.Checkpointer(workdir)
  try:
    return ck.restore()
  finally:
    ck.close()


def records(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_stopped_on_2x4_resumes_on_2x1_and_2x2_sharded_to_the_uninterrupted_run(tmp_path):
  full = trainer.train_and_evaluate(CONFIG, tmp_path / "full")
  assert "2 workers x 4 devices each" in full["layout"]
  cut = tmp_path / "cut"
  first = trainer.train_and_evaluate(CONFIG, cut, stop_after_steps=7)
  assert first["status"] == "stopped" and first["steps_done"] == 7
  # the checkpoint is whole arrays: every worker's leaves [p, ...], on the host
  saved = latest_checkpoint(cut)
  assert int(saved["step"]) == 7
  for leaf in jax.tree.leaves(saved["worker"]):
    assert isinstance(leaf, np.ndarray) and leaf.shape[0] == CONFIG.num_workers
  second = trainer.train_and_evaluate(
      CONFIG.replace(devices_per_worker=1), cut, resume=True, stop_after_steps=15
  )
  assert "2 workers = 2 device(s) x 1 vmapped worker(s)" in second["layout"]
  assert second["steps_done"] == 15
  sharded = CONFIG.replace(devices_per_worker=2, shard_params=True)
  last = trainer.train_and_evaluate(sharded, cut, resume=True)
  assert last["status"] == "complete" and last["steps_done"] == full["steps_done"] == 22
  assert "2 workers x 2 devices each" in last["layout"]

  a, b = latest_checkpoint(tmp_path / "full"), latest_checkpoint(cut)
  assert int(a["step"]) == int(b["step"]) == 22
  assert max_abs_diff(b["worker"], a["worker"]) < TOL
  assert max_abs_diff(b["center"], a["center"]) < TOL
  np.testing.assert_allclose(b["epoch_losses"], a["epoch_losses"], rtol=0, atol=1e-5)
  ra, rb = records(tmp_path / "full"), records(cut)
  assert [r["step"] for r in rb] == [r["step"] for r in ra] == [0, 22]
  for x, y in zip(ra, rb):
    assert y["test_loss"] == pytest.approx(x["test_loss"], rel=1e-5)
    assert abs(y["test_accuracy"] - x["test_accuracy"]) <= 1 / x["test_count"]
  # the run moved the center (the comparison is not vacuous)
  assert max_abs_diff(a["center"], Run(CONFIG).init_params) > 0.05


@pytest.mark.parametrize(
    "changes, words",
    [
        # the same 8 devices as 4x2: other workers, not another layout of these
        (dict(num_workers=4, devices_per_worker=2), "num_workers: 2 -> 4"),
        (dict(global_batch_size=32, devices_per_worker=2), "global_batch_size: 64 -> 32"),
        (dict(tau=2, devices_per_worker=1), "tau: 4 -> 2"),
        (dict(algorithm="eamsgd", devices_per_worker=2), "algorithm: 'easgd' -> 'eamsgd'"),
        (dict(devices_per_worker=2), None),  # control: the layout alone is accepted
    ],
)
def test_resume_on_another_mesh_still_refuses_another_run(tmp_path, monkeypatch, changes, words):
  """Only the layout may change: a resume that changes what the run computes
  is refused with one line naming the field, before the run is built (nothing
  compiled), and the checkpoint is left as it was; the layout alone resumes."""
  trainer.train_and_evaluate(CONFIG, tmp_path, stop_after_steps=3)
  built = []
  monkeypatch.setattr(trainer, "Run", lambda *a, **k: built.append(a) or Run(*a, **k))
  config = CONFIG.replace(**changes)
  if words is None:
    done = trainer.train_and_evaluate(config, tmp_path, resume=True, stop_after_steps=4)
    assert len(built) == 1 and done["steps_done"] == 4
    return
  with pytest.raises(ConfigError) as e:
    trainer.train_and_evaluate(config, tmp_path, resume=True)
  assert built == []  # refused before the run (its programs) was built
  message = str(e.value)
  assert words in message and "\n" not in message
  assert "devices_per_worker:" not in message  # the layout change is not the complaint
  assert "allowed to change: " in message and "devices_per_worker" in message
  assert checkpoint.Checkpointer(tmp_path).latest_step() == 3
