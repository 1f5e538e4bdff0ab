"""The comparison protocol on a user's task (easgd.tasks.task.Task): data from
NumPy arrays or a __getitem__ object give the same results, pytree batches, the
tasks the protocol cannot run refused before anything compiles (an augmenting
one accepted), and
``easgd protocol --task`` from the command line."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from easgd import TrainConfig, train_and_evaluate
from easgd.protocol import programs
from easgd.protocol import runs as protocol
from easgd.protocol.config import Arm, ProtocolConfig, ProtocolError

from testutil import CLASSES, FEATURES, Items, linear_data, linear_task

TIMINGS = {"wall_s", "compile_s", "wall_time_s", "compute_per_step_s", "modelled_s"}
COMPILES = {"compiles", "compiles_all"}  # a second run in a process finds helpers compiled


BASE = TrainConfig(
    num_epochs=1, global_batch_size=64, num_workers=2, validation_examples=128, progress=False
)
"""8 steps per epoch: 640 training examples, 128 held out, 2 x 32 per step."""


def small_protocol(base=BASE):
  arms = (Arm("easgd", "easgd", dict(tau=2), (0.3, 1.0)),)
  return ProtocolConfig("task", "a user task", base, arms, eval_every_steps=4, targets=(0.5,))


def values(tree, path=""):
  """Every value of results.json (strict JSON: null for NaN) but the wall times
  and compile counts, by path."""
  if not path:
    tree = json.loads(protocol.results_json(tree))
  if isinstance(tree, dict):
    return {
        p: v
        for k, sub in tree.items()
        if k not in TIMINGS | COMPILES
        for p, v in values(sub, f"{path}/{k}").items()
    }
  if isinstance(tree, list):
    return {p: v for i, sub in enumerate(tree) for p, v in values(sub, f"{path}/{i}").items()}
  return {path: tree}


def test_a_user_task_from_arrays_and_from_getitem_gives_the_same_results():
  train, test = linear_data(640, 1), linear_data(200, 2)
  by_arrays = protocol.run_protocol(
      small_protocol(), log=lambda line: None, task=linear_task(train, test)
  )
  by_items = protocol.run_protocol(
      small_protocol(), log=lambda line: None, task=linear_task(Items(train), Items(test))
  )
  a, b = values(by_arrays), values(by_items)
  assert a.keys() == b.keys() and len(a) > 300
  assert {p: v for p, v in a.items() if b[p] != v} == {}  # every value, bit for bit
  arm = by_arrays["arms"]["easgd"]
  assert arm["final_test_error"]["mean"] < 0.3  # learned (chance: 2/3)
  assert by_arrays["task"]["name"] == "linear" and by_arrays["task"]["factory"] is None
  assert by_arrays["task"]["train_examples"] == 640
  assert by_arrays["num_params"] == FEATURES * CLASSES + CLASSES


def test_tasks_the_protocol_cannot_run_are_refused_before_anything_compiles(monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("a program ran")

  monkeypatch.setattr(protocol, "run_program", never)
  train, test = linear_data(640, 1), linear_data(200, 2)
  for task, message in (
      (
          linear_task(train, test, name="nocorrect", correct=False),
          r"targets \(0.5,\): the times to a target test error need a per-example 'correct'",
      ),
      (
          linear_task(train, test, validation=linear_data(50, 3)),
          "task 'linear' has validation data of its own",
      ),
      (
          linear_task(train, test, split_from_seed=True),
          "task 'linear' draws its train/test split from the seed",
      ),
  ):
    with pytest.raises(ProtocolError, match=message) as e:
      protocol.run_protocol(small_protocol(), log=lambda line: None, task=task)
    assert "\n" not in str(e.value)
  # augmenting tasks and a center_state over transformed examples run as easgd
  # train runs them (tests/test_protocol_augment.py): not refused
  for task in (
      linear_task(train, test, augment=lambda batch, rng: batch),
      linear_task(train, test, center_state=lambda p, b, axis: None, eval_transform=lambda b: b),
  ):
    assert programs.check_task_kind(task, BASE) is None
  # the built-in digits draw their split from the seed (Task.split_from_seed)
  digits = BASE.replace(dataset="digits", model="mlp", validation_examples=200)
  with pytest.raises(ProtocolError, match="task 'digits/mlp' draws its train/test split"):
    protocol.run_protocol(small_protocol(digits), log=lambda line: None)
  with pytest.raises(ProtocolError, match=r"overrides \['task'\]"):
    dataclasses.replace(
        small_protocol(), arms=(Arm("a", "easgd", dict(task="m:f"), (0.1,)),)
    ).validate()


TASK_FILE = """
import numpy as np, jax, jax.numpy as jnp, optax
from easgd.tasks.task import Task

def make(n=640, classes=3, seed=0):
  rng = np.random.default_rng(seed)   # per-seed data: the protocol passes seed
  w = np.random.default_rng(99).normal(size=(8, classes))
  def split(m):
    x = rng.normal(size=(m, 8)).astype(np.float32)
    return {"x": x, "y": np.argmax(x @ w, 1).astype(np.int32)}
  train, test = split(n), split(200)
  def logits(p, x):
    return x @ p["w"]
  def init(key):
    return {"w": 0.1 * jax.random.normal(key, (8, classes))}
  def loss(p, b, key):
    return optax.softmax_cross_entropy_with_integer_labels(logits(p, b["x"]), b["y"]).mean()
  def evaluate(p, b):
    z = logits(p, b["x"])
    return {"loss": optax.softmax_cross_entropy_with_integer_labels(z, b["y"]),
            "correct": (z.argmax(-1) == b["y"]).astype(jnp.float32)}
  return Task("filetask", init, loss, evaluate, train, test)
"""

PROTOCOL_FILE = """
from easgd import TrainConfig, train_and_evaluate
from easgd.protocol.config import Arm, ProtocolConfig
def get_protocol():
  base = TrainConfig(num_epochs=1, global_batch_size=64, num_workers=2,
                     validation_examples=128, progress=False)
  return ProtocolConfig("cli-task", "a task from a file", base,
                        (Arm("pmean", "pmean_sgd", {}, (0.3, 1.0)),),
                        eval_every_steps=4, targets=(0.5,))
"""


@pytest.mark.slow
def test_cli_protocol_runs_a_task_from_a_file_in_the_working_directory(tmp_path):
  (tmp_path / "mytask.py").write_text(TASK_FILE)
  (tmp_path / "proto.py").write_text(PROTOCOL_FILE)
  command = [sys.executable, "-m", "easgd.cli", "protocol", "--config", "proto.py"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = lambda *flags: subprocess.run(
      [*command, *flags], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600
  )
  bad = run("--task", "mytask:make", "--task-arg", "size=3", "--workdir", "bad")
  assert bad.returncode == 2 and "Traceback" not in bad.stderr
  assert bad.stderr.startswith("easgd: error: ") and bad.stderr.count("\n") == 1
  assert "takes no argument 'size'; allowed: n, classes" in bad.stderr
  assert not (tmp_path / "bad").exists()  # refused before the workdir is locked
  ok = run("--task", "mytask:make", "--task-arg", "n=600", "--workdir", "out")
  assert ok.returncode == 0, ok.stderr
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  base = results["protocol"]["base"]
  assert base["task"] == "mytask:make" and base["task_args"] == ["n=600"]
  assert results["task"]["factory"] == "mytask:make"
  assert results["task"]["factory_args"] == {"n": 600}
  assert results["task"]["train_examples"] == 600
  assert results["arms"]["pmean"]["final_test_error"]["mean"] < 0.4
  assert "Task: filetask (mytask:make)" in (tmp_path / "out" / "results.md").read_text()


def test_a_batchnorm_task_is_evaluated_with_the_center_statistics_the_trainer_uses(tmp_path):
  """The protocol's one program against ``easgd train`` on the built-in BatchNorm CNN:
  the same validation and test losses at every evaluation (statistics recomputed
  from the evaluated center over the trainer's examples)."""
  base = TrainConfig(
      dataset="mnist1d",
      model="cnn_bn",
      num_epochs=1,
      global_batch_size=384,
      num_workers=4,
      validation_examples=1000,
      bn_stats_examples=512,
      progress=False,
  )
  arm = Arm("easgd", "easgd", dict(tau=4), (0.05,))
  config = ProtocolConfig("bn", "", base, (arm,), eval_every_steps=18).validate()
  seeds = programs.SeedData(base, (5,))
  run = programs.prepare(config, seeds.num_train)["easgd"]
  configs = [dict(arm="easgd", learning_rate=0.05, seed=5)]
  out, _ = programs.run_program([run], configs, seeds, "report", config)
  history = train_and_evaluate(run.config.replace(learning_rate=0.05, seed=5), tmp_path / "train")[
      "history"
  ]
  steps = list(run.eval_steps)
  for rec in history:  # steps 0 and 18
    k = steps.index(rec["step"])
    for split in ("val", "test"):
      assert out["curves"][f"{split}_loss"][0, k] == pytest.approx(rec[f"{split}_loss"], rel=1e-5)
