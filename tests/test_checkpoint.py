"""Checkpoints: exact resume, SIGKILL during a save, no recompilation, divergence."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from easgd import cli
from easgd.methods.registry import ALGORITHMS
from easgd.run import checkpoint, trainer
from easgd.run.export import export_center
from easgd.runtimes import spmd, training_run
from easgd.settings.config import ConfigError
from easgd.sweeps.engine import CompileCounter

from testutil import TINY_DIGITS, interrupt_once

# digits, tiny MLP: 1438 training images / 64 = 22 steps per epoch, 2 epochs
TINY = TINY_DIGITS

RESUMABLE = [a for a in ALGORITHMS if a in ("easgd", "pmean_sgd", "eamsgd", "async_easgd")]


def metrics_text(path):
  return (path / "metrics.jsonl").read_text()


@pytest.mark.parametrize("algorithm", RESUMABLE)
def test_interrupted_and_resumed_run_is_bitwise_identical(tmp_path, algorithm):
  cfg = TINY.replace(algorithm=algorithm)
  if algorithm == "eamsgd":
    cfg = cfg.replace(delta=0.9)
  trainer.train_and_evaluate(cfg, tmp_path / "full")
  # 7 steps: inside the first epoch and not a multiple of tau = 4
  partial = trainer.train_and_evaluate(cfg, tmp_path / "cut", stop_after_steps=7)
  assert partial["status"] == "stopped" and partial["steps_done"] == 7
  assert partial["final_step"] == 0  # the summary's `final` is step 0's record
  assert checkpoint.Checkpointer(tmp_path / "cut").latest_step() == 7
  # 30 steps: inside the second epoch, resumed from the first stop
  trainer.train_and_evaluate(cfg, tmp_path / "cut", resume=True, stop_after_steps=30)
  done = trainer.train_and_evaluate(cfg, tmp_path / "cut", resume=True)
  assert done["status"] == "complete"
  assert metrics_text(tmp_path / "cut") == metrics_text(tmp_path / "full")


def test_wall_time_of_a_resumed_run_adds_up_its_invocations(tmp_path):
  first = trainer.train_and_evaluate(TINY, tmp_path, stop_after_steps=5)
  second = trainer.train_and_evaluate(TINY, tmp_path, resume=True, stop_after_steps=9)
  assert second["wall_time_s"] > first["wall_time_s"] > 0
  # resuming a complete run trains nothing: its time is the earlier one plus a moment
  done = trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  again = trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  assert again["status"] == "complete" and again["wall_time_s"] >= done["wall_time_s"]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["wall_time_s"] == again["wall_time_s"]


@pytest.mark.parametrize(
    "damage", ["truncate", "delete", "no_step_0", "not_utf8", "no_metrics", "lost_record"]
)
def test_resume_refuses_a_damaged_or_missing_history_before_compiling(
    tmp_path, damage, monkeypatch
):
  # 26 steps: the step-0 and epoch-1 (step 22) evaluations are recorded
  trainer.train_and_evaluate(TINY, tmp_path, stop_after_steps=26)
  path = tmp_path / "metrics.jsonl"
  lines = path.read_text().splitlines(keepends=True)
  assert len(lines) == 2
  if damage == "truncate":
    path.write_text(path.read_text()[:40])
  elif damage == "delete":
    path.unlink()
  elif damage == "no_step_0":
    path.write_text("")
  elif damage == "not_utf8":
    path.write_bytes(path.read_bytes() + b"\xff\n")
  elif damage == "no_metrics":
    path.write_text(lines[0] + '{"step": 22}\n')
  else:  # a whole record gone, the file still well formed
    path.write_text(lines[0])
  steps_run = []
  map_step = training_run.mapping.map_step

  def recording_map_step(*args, **kwargs):  # records every call of the training step
    step_fn = map_step(*args, **kwargs)
    return lambda *a: steps_run.append(a[-1]) or step_fn(*a)

  monkeypatch.setattr(training_run.mapping, "map_step", recording_map_step)
  before = (tmp_path / "summary.json").read_text()
  with CompileCounter() as compiles:  # backend compilations while open
    with pytest.raises(ConfigError, match="cannot resume: '.*metrics.jsonl'"):
      trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  assert steps_run == []  # the training step never ran (nor compiled)
  if damage != "lost_record":  # found from the file alone, before building the run
    assert compiles.count == 0
  assert checkpoint.Checkpointer(tmp_path).latest_step() == 26  # left as it was
  assert (tmp_path / "summary.json").read_text() == before


def test_same_seed_twice_gives_identical_metrics_files(tmp_path):
  trainer.train_and_evaluate(TINY, tmp_path / "a")
  trainer.train_and_evaluate(TINY, tmp_path / "b")
  assert metrics_text(tmp_path / "a") == metrics_text(tmp_path / "b")
  trainer.train_and_evaluate(TINY.replace(seed=1), tmp_path / "c")
  assert metrics_text(tmp_path / "a") != metrics_text(tmp_path / "c")


def test_resume_on_another_device_count(tmp_path):
  trainer.train_and_evaluate(TINY, tmp_path / "full")
  trainer.train_and_evaluate(TINY, tmp_path / "cut", stop_after_steps=13)
  trainer.train_and_evaluate(TINY.replace(num_devices=4), tmp_path / "cut", resume=True)
  a = [json.loads(l) for l in metrics_text(tmp_path / "full").splitlines()]
  b = [json.loads(l) for l in metrics_text(tmp_path / "cut").splitlines()]
  assert [r["step"] for r in a] == [r["step"] for r in b]
  for ra, rb in zip(a, b):
    assert rb["test_loss"] == pytest.approx(ra["test_loss"], rel=1e-5)
    assert abs(rb["test_accuracy"] - ra["test_accuracy"]) <= 2 / ra["test_count"]


def test_resume_refuses_a_different_config(tmp_path):
  trainer.train_and_evaluate(TINY, tmp_path, stop_after_steps=3)
  with pytest.raises(ConfigError, match=r"tau: 4 -> 8"):
    trainer.train_and_evaluate(TINY.replace(tau=8), tmp_path, resume=True)
  with pytest.raises(ConfigError, match="holds no run"):
    trainer.train_and_evaluate(TINY, tmp_path / "empty", resume=True)


def test_restored_state_runs_through_the_compiled_step_without_recompiling(tmp_path):
  run = training_run.Run(TINY)
  with CompileCounter() as compiles:  # backend compilations while open
    worker, shared = run.initial_state()
    ix = np.arange(64).reshape(4, 16)
    batch = jax.tree.map(
        lambda a: a,
        __import__("easgd").parallel.placement.split_workers(
            jax.tree.map(lambda a: a[ix], run.task.train.arrays), run.layout
        ),
    )
    # clocks 0 (an exchange, tau=4) and 1 (a local step): both step programs
    worker, shared, loss0 = run.step_fn(worker, shared, batch, run.step_key, 0)
    worker, shared, loss = run.step_fn(worker, shared, batch, run.step_key, 1)
    jax.block_until_ready(loss)
    ckpt = checkpoint.Checkpointer(tmp_path)
    ckpt.save(2, spmd.to_checkpoint(run, worker, shared, 2, [loss0, loss]))
    after_first = compiles.count
    assert after_first >= 2
    w2, s2, step, losses = spmd.from_checkpoint(
        run, ckpt.restore(target=spmd.checkpoint_target(run))
    )
    assert step == 2 and len(losses) == 2
    for clock in (2, 3, 4):  # local, local, exchange
      w2, s2, loss2 = run.step_fn(w2, s2, batch, run.step_key, clock)
    jax.block_until_ready(loss2)
    assert compiles.count == after_first  # no new backend compilation
    # and the restored state is the saved one: the same steps agree with the original
    for clock in (2, 3, 4):
      worker, shared, loss3 = run.step_fn(worker, shared, batch, run.step_key, clock)
    np.testing.assert_array_equal(np.asarray(loss2), np.asarray(loss3))
    for a, b in zip(jax.tree.leaves((w2, s2)), jax.tree.leaves((worker, shared))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ckpt.close()


def test_divergence_stops_with_step_and_worker_and_keeps_last_checkpoint(tmp_path):
  # warm-up from 0 to an absurd peak: step 0 is harmless, then it blows up
  cfg = TINY.replace(learning_rate=1e30, warmup_epochs=1.0, checkpoint_every_steps=1)
  with pytest.raises(trainer.DivergenceError) as err:
    trainer.train_and_evaluate(cfg, tmp_path)
  msg = str(err.value)
  assert "non-finite" in msg and "at step" in msg or "parameters" in msg
  assert "worker" in msg and "learning_rate=1e+30" in msg and "tau=4" in msg
  assert "stable at alpha=0.225, tau=4, num_workers=4 only for eta*h < 1.948" in msg
  ckpt = checkpoint.Checkpointer(tmp_path)
  last = ckpt.latest_step()
  assert last is not None and last >= 1
  restored = ckpt.restore()
  for leaf in jax.tree.leaves(restored["worker"]):
    if np.issubdtype(leaf.dtype, np.floating):
      assert np.all(np.isfinite(leaf))
  ckpt.close()


def _start_train(tmp_path, cfg):
  """``easgd train`` of ``cfg`` (via a --config file) in a subprocess writing to
  ``tmp_path/run`` on 2 fake CPU devices; returns (workdir, Popen with stderr piped)."""
  (tmp_path / "cfg.py").write_text(
      "from easgd import TrainConfig\n"
      f"def get_config():\n  return TrainConfig(**{cfg.to_dict_fields()!r})\n"
  )
  work = tmp_path / "run"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  proc = subprocess.Popen(
      [
          sys.executable,
          "-m",
          "easgd.cli",
          "train",
          "--config",
          str(tmp_path / "cfg.py"),
          "--workdir",
          str(work),
      ],
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
  )
  return work, proc


@pytest.mark.slow
def test_sigkill_during_checkpoint_write_then_resume_finishes(tmp_path):
  cfg = TINY.replace(checkpoint_every_steps=1, num_epochs=2)
  work, proc = _start_train(tmp_path, cfg)
  ckdir = work / checkpoint.CHECKPOINT_DIR
  caught_in_write = False
  deadline = time.time() + 120
  while proc.poll() is None and time.time() < deadline:
    names = os.listdir(ckdir) if ckdir.exists() else []
    if any("tmp" in n for n in names) and any(n.isdigit() for n in names):
      proc.send_signal(signal.SIGKILL)  # a save is in progress right now
      caught_in_write = True
      break
    time.sleep(0.001)
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
  assert caught_in_write
  done = trainer.train_and_evaluate(cfg, work, resume=True)
  assert done["status"] == "complete"
  trainer.train_and_evaluate(cfg, tmp_path / "full")
  assert metrics_text(work) == metrics_text(tmp_path / "full")


def test_damaged_checkpoint_and_bad_export_path_are_clear_errors(tmp_path):
  trainer.train_and_evaluate(TINY.replace(num_epochs=1), tmp_path)
  with pytest.raises(ConfigError, match="is a directory"):
    export_center(tmp_path, tmp_path)
  step = checkpoint.Checkpointer(tmp_path).latest_step()
  damaged = 0
  for root, _, files in os.walk(tmp_path / "checkpoints" / str(step)):
    for f in files:
      p = os.path.join(root, f)
      if os.path.getsize(p) > 64:
        with open(p, "r+b") as fh:
          fh.truncate(16)
        damaged += 1
  assert damaged
  with pytest.raises(checkpoint.CheckpointError, match=f"checkpoint {step} in"):
    trainer.train_and_evaluate(TINY.replace(num_epochs=1), tmp_path, resume=True)


# Each point of an evaluated epoch end's sequence (check, evaluate, record,
# checkpoint), the step-0 evaluation first: (what is interrupted, which call,
# whether it completed). TINY's calls: evaluate/write_metrics 1 = step 0,
# 2 = step 22; save 1 = step 22, 2 = step 44 (the end).
INTERRUPTS = [
    ("evaluate", 1, False),
    ("evaluate", 2, False),
    ("write_metrics", 2, False),
    ("write_metrics", 2, True),
    ("save", 1, False),
    ("save", 1, True),
    ("save", 2, True),
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  work = tmp_path_factory.mktemp("full")
  trainer.train_and_evaluate(TINY, work)
  return metrics_text(work)


@pytest.mark.parametrize("point,call,after", INTERRUPTS)
def test_an_interrupt_at_any_point_resumes_to_the_same_metrics(
    tmp_path, monkeypatch, uninterrupted, point, call, after
):
  owner = {
      "evaluate": training_run.Run,
      "write_metrics": trainer.rundir,
      "save": checkpoint.Checkpointer,
  }[point]
  with monkeypatch.context() as m:
    fired = interrupt_once(m, owner, point, call, after)
    with pytest.raises(KeyboardInterrupt):
      trainer.train_and_evaluate(TINY, tmp_path)
  assert fired
  done = trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  assert done["status"] == "complete" and done["final_step"] == 44
  assert metrics_text(tmp_path) == uninterrupted  # bit for bit


def test_a_non_finite_evaluation_is_the_divergence_error_exit_1(tmp_path, capsys):
  # one step per epoch (1438 // 1436): the training loss of step 0 is finite, the
  # parameters after it finite but huge, the evaluated loss NaN
  work = tmp_path / "run"
  status = cli.main(
      [
          "train",
          "--workdir",
          str(work),
          "--dataset",
          "digits",
          "--model",
          "mlp",
          "--algorithm",
          "pmean_sgd",
          "--learning-rate",
          "1e30",
          "--global-batch-size",
          "1436",
          "--num-epochs",
          "1",
          "--no-progress",
      ]
  )
  err = capsys.readouterr().err
  assert status == 1 and err.count("\n") == 1, err
  assert err.startswith(
      "easgd: error: training diverged: the evaluated center's "
      "test_loss is nan at step 1 (epoch 1); algorithm=pmean_sgd"
  )
  # the diverged state's record and checkpoint are not written; step 0's stays
  assert [json.loads(l)["step"] for l in metrics_text(work).splitlines()] == [0]
  assert checkpoint.Checkpointer(work).latest_step() is None
  assert not (work / "summary.json").exists()


def test_a_non_finite_validation_loss_is_a_divergence():
  run = training_run.Run(TINY)
  record = dict(epoch=1, step=22, test_loss=0.3, val_loss=float("inf"))
  with pytest.raises(
      trainer.DivergenceError,
      match=r"the evaluated center's val_loss is inf at step 22 \(epoch 1\)",
  ):
    run.check_finite_record(record)
  run.check_finite_record(dict(record, val_loss=0.4))  # finite: no error


@pytest.mark.slow
def test_sigterm_stops_like_ctrl_c_and_the_run_resumes(tmp_path):
  cfg = TINY.replace(checkpoint_every_steps=1)
  work, proc = _start_train(tmp_path, cfg)
  ckdir = work / checkpoint.CHECKPOINT_DIR
  deadline = time.time() + 120
  while proc.poll() is None and time.time() < deadline:
    if ckdir.exists() and any(n.isdigit() for n in os.listdir(ckdir)):
      proc.send_signal(signal.SIGTERM)  # training, checkpointing at every step
      break
    time.sleep(0.01)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 143, err.decode()[-2000:]  # not killed: a clean stop
  assert err.decode().rstrip().splitlines()[-1] == "easgd: terminated (SIGTERM)"
  done = trainer.train_and_evaluate(cfg, work, resume=True)
  assert done["status"] == "complete"
  trainer.train_and_evaluate(cfg, tmp_path / "full")
  assert metrics_text(work) == metrics_text(tmp_path / "full")


def test_the_checkpoint_tree_is_declared_once():
  """Both executors' trees come from ``executor.checkpoint_tree``: the common entries,
  the runtime's own ones in their declared dtypes, and nothing undeclared."""
  from types import SimpleNamespace

  from easgd.runtimes import executor

  algo = SimpleNamespace(center=lambda shared: shared["c"])
  tree = executor.checkpoint_tree(
      algo, {"w": np.zeros((2, 3))}, {"c": np.ones(3)}, 5, loss_sum=[1, 2], log_length=7
  )
  assert sorted(tree) == ["center", "log_length", "loss_sum", "shared", "step", "worker"]
  assert tree["step"].dtype == np.int64 and int(tree["step"]) == 5
  assert tree["loss_sum"].dtype == np.float64 and tree["loss_sum"].tolist() == [1.0, 2.0]
  assert tree["log_length"].dtype == np.int64 and tree["center"].tolist() == [1.0, 1.0, 1.0]
  with pytest.raises(KeyError, match="undeclared"):
    executor.checkpoint_tree(algo, {}, {"c": 0}, 0, undeclared=1)
  target = executor.checkpoint_target(
      algo, {"w": np.ones(3, np.float32)}, {"c": np.ones(3)}, 4, epoch_losses=(2, 4)
  )
  assert target["worker"]["w"].shape == (4, 3) and target["worker"]["w"].dtype == np.float32
  assert target["epoch_losses"].shape == (2, 4) and target["epoch_losses"].dtype == np.float32
  assert not target["epoch_losses"].any() and int(target["step"]) == 0
  # what each executor saves is the declared tree (keys as the checkpoints on disk)
  run = training_run.Run(TINY)
  assert sorted(spmd.checkpoint_target(run)) == [
      "center",
      "epoch_losses",
      "shared",
      "step",
      "train_seconds",
      "worker",
  ]
