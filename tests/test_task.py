"""The one seam for a problem (``easgd.tasks.task``): built-in and user tasks alike.

A user's Task written by hand (its own loss, evaluation and initialisation around
the package's MNIST-1D CNN and data) trains bit for bit as the built-in task of
the main job's config; the same data as NumPy arrays and as a ``__getitem__``
object give identical runs; ``--task`` factories are recorded in config.json and
rebuilt on resume; a bad task is one line, exit 2, nothing written.
"""

import json
import re
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd import cli
from easgd.run import trainer
from easgd.settings import builtin_tasks
from easgd.settings.config import TrainConfig
from easgd.tasks import datasets, models
from easgd.tasks.sources import ArraySource, ItemSource, TaskError, take
from easgd.tasks.task import Task, load_task

MAIN = TrainConfig(num_epochs=1, progress=False)
"""The main job's config (``easgd compare``'s defaults: MNIST-1D, the CNN), one epoch."""


def hand_written_mnist1d_task(source=lambda arrays: arrays) -> Task:
  """MNIST-1D and the CNN as a user would write them: no package helper but the model."""
  ds = datasets.load_dataset("mnist1d", seed=MAIN.seed)
  model = models.make_model("cnn", ds.num_classes)

  def loss(params, batch, key):
    x, y = batch
    logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

  def evaluate(params, batch):
    x, y = batch
    logits = model.apply({"params": params}, x, train=False).astype(jnp.float32)
    return {
        "loss": optax.softmax_cross_entropy_with_integer_labels(logits, y),
        "correct": (jnp.argmax(logits, -1) == y).astype(jnp.float32),
    }

  return Task(
      name="my-mnist1d",
      init=lambda key: model.init(key, jnp.zeros((1, 40, 1)), train=False)["params"],
      loss=loss,
      evaluate=evaluate,
      train=source((ds.train_x, ds.train_y)),
      test=source((ds.test_x, ds.test_y)),
      mean_of_examples=True,
  )


class Rows:
  """A random-access object (``__len__``, ``__getitem__``), not arrays: one (x, y) per item."""

  def __init__(self, arrays):
    self.x, self.y = arrays

  def __len__(self):
    return len(self.y)

  def __getitem__(self, i):
    return self.x[i], self.y[i]


def metrics_text(workdir):
  return (workdir / "metrics.jsonl").read_text()


@pytest.mark.parametrize("algorithm", ["easgd", "pmean_sgd"])
def test_a_hand_written_task_trains_bit_for_bit_as_the_builtin_main_job(tmp_path, algorithm):
  config = MAIN.for_algorithm(algorithm)[0]
  trainer.train_and_evaluate(config, tmp_path / "builtin")
  trainer.train_and_evaluate(config, tmp_path / "user", task=hand_written_mnist1d_task())
  builtin = [json.loads(l) for l in metrics_text(tmp_path / "builtin").splitlines()]
  user = [json.loads(l) for l in metrics_text(tmp_path / "user").splitlines()]
  assert len(builtin) == 2 and builtin == user  # every field of every record, bit for bit
  summary = json.loads((tmp_path / "user" / "summary.json").read_text())
  assert summary["task"]["name"] == "my-mnist1d" and summary["task"]["factory"] is None


def test_numpy_arrays_and_a_getitem_source_give_identical_runs(tmp_path):
  config = TrainConfig(num_epochs=1, num_workers=2, validation_examples=500, progress=False)
  arrays = hand_written_mnist1d_task()
  rows = hand_written_mnist1d_task(source=Rows)
  assert isinstance(arrays.train, ArraySource) and isinstance(rows.train, ItemSource)
  ix = np.array([[3, 1], [4, 1]])
  for a, b in zip(take(arrays.train, ix), take(rows.train, ix)):
    np.testing.assert_array_equal(a, b)
    assert a.dtype == b.dtype and a.shape[:2] == (2, 2)
  trainer.train_and_evaluate(config, tmp_path / "arrays", task=arrays)
  trainer.train_and_evaluate(config, tmp_path / "rows", task=rows)
  assert metrics_text(tmp_path / "arrays") == metrics_text(tmp_path / "rows")
  assert "val_error" in metrics_text(tmp_path / "rows")  # validation held out of any source


TASK_FILE = textwrap.dedent("""
    import numpy as np, optax, jax.numpy as jnp, flax.linen as nn
    from easgd.tasks.task import Task

    class Words:  # items of different lengths
      def __len__(self): return 64
      def __getitem__(self, i): return np.zeros(3 + (i >= 32), np.float32), np.int32(0)

    def make(n=256, width=8, seed=0, loss_shape=(), metric_shape=None, items="arrays"):
      rng = np.random.default_rng(seed)
      x = rng.normal(size=(n, 4)).astype(np.float32)
      y = (x.sum(-1) > 0).astype(np.int32)
      net = nn.Dense(2)
      def loss(p, batch, key):
        ce = optax.softmax_cross_entropy_with_integer_labels(net.apply({"params": p}, batch[0]), batch[1])
        return jnp.broadcast_to(ce.mean(), loss_shape)
      def evaluate(p, batch):
        logits = net.apply({"params": p}, batch[0])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch[1])
        return {"loss": ce if metric_shape is None else ce.mean(), "correct": (logits.argmax(-1) == batch[1]) * 1.0}
      train = (x[:200], y[:200])
      if items == "text":
        train = [("a", 0)] * 200
      if items == "ragged":
        train = Words()
      return Task(name="toy", init=lambda k: net.init(k, x[:1])["params"], loss=loss,
                  evaluate=evaluate, train=train, test=(x[200:], y[200:]))

    not_a_factory = 3

    def exits():
      raise SystemExit(3)

    def clashing_info():
      import dataclasses
      return dataclasses.replace(make(), info={"name": "x"})
    """)


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
  (tmp_path / "toytask.py").write_text(TASK_FILE)
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", list(sys.path))
  yield tmp_path
  sys.modules.pop("toytask", None)


def train(argv, capsys):
  code = cli.main(["train", "--no-progress", *argv])
  return code, capsys.readouterr().err.strip()


def test_a_task_factory_is_recorded_and_rebuilt_on_resume(task_dir, capsys):
  flags = ["--task", "toytask:make", "--task-arg", "width=8", "--task-arg", "n=256"]
  flags += ["--num-workers", "2", "--global-batch-size", "20", "--num-epochs", "3"]
  assert train([*flags, "--workdir", "whole"], capsys)[0] == 0
  config = json.loads((task_dir / "whole" / "config.json").read_text())
  assert config["task"] == "toytask:make" and config["task_args"] == ["width=8", "n=256"]
  lib = load_task("toytask:make", {"width": 8, "n": 256})  # the factory's own arguments
  assert lib.factory_args == {"width": 8, "n": 256}
  stopped = trainer.train_and_evaluate(
      TrainConfig.from_dict(config), task_dir / "part", stop_after_steps=13
  )
  assert stopped["status"] == "stopped"
  assert train(["--resume", "--workdir", "part"], capsys)[0] == 0  # rebuilt from config.json
  assert metrics_text(task_dir / "part") == metrics_text(task_dir / "whole")
  assert cli.main(["export", "--workdir", "part", "--out", "center.msgpack"]) == 0
  info = json.loads((task_dir / "center.msgpack.json").read_text())  # the task, rebuilt
  assert info["task"] == {
      "name": "toy",
      "factory": "toytask:make",
      "factory_args": lib.factory_args,
  }


BAD_TASKS = [
    (["--task", "nosuch.module:make"], "module 'nosuch.module' does not import"),
    (["--task", "toytask:nope"], "module 'toytask' has no 'nope'"),
    (["--task", "toytask:not_a_factory"], "is a int, not a factory function"),
    (["--task", "toytask"], "task must be 'package.module:function'"),
    (["--task", "toytask:make", "--task-arg", "depth=2"], "takes no argument 'depth'"),
    (["--task", "toytask:make", "--task-arg", "seed=2"], "seed is the run's seed"),
    (["--task-arg", "n=2"], "has no effect without a task"),
    (["--task", "toytask:make", "--dataset", "digits"], "read by the built-in tasks only"),
    (["--task", "toytask:make", "--task-arg", "loss_shape=[3]"], "loss returns"),
    (["--task", "toytask:make", "--task-arg", "metric_shape=1"], "not per-example|has shape ()"),
    (["--task", "toytask:make", "--task-arg", 'items="text"'], "not an array of numbers"),
    (
        ["--task", "toytask:make", "--task-arg", 'items="ragged"', "--num-epochs", "2"],
        "batch shapes differ",
    ),
    (["--task", "toytask:make", "--global-batch-size", "400"], "too few for num_workers=2"),
    (["--task", "toytask:make", "--bn-stats-examples", "64"], "no center_state"),
    (["--task", "toytask:exits"], "failed: SystemExit: 3"),
    (["--task", "toytask:clashing_info"], "info key 'name' is one the package records"),
    (["--task", "toytask:make", "--validation-examples", "190"], "validation_examples=190 leaves"),
]


@pytest.mark.parametrize("argv, message", BAD_TASKS, ids=[m for _, m in BAD_TASKS])
def test_a_bad_task_is_one_line_exit_2_and_nothing_written(task_dir, capsys, argv, message):
  sizes = ["--num-workers", "2", "--global-batch-size", "20", "--num-epochs", "1"]
  code, err = train([*sizes, *argv, "--workdir", "run"], capsys)  # (a later flag wins)
  assert code == 2, err
  assert len(err.splitlines()) == 1 and err.startswith("easgd: error: "), err
  assert re.search(message, err), err
  assert not (task_dir / "run").exists()


def test_a_task_refuses_info_that_json_cannot_hold():
  def f(*a):
    return None

  data = (np.zeros((2, 1)),)
  with pytest.raises(TaskError, match="info must hold JSON values"):
    Task(name="t", init=f, loss=f, evaluate=f, train=data, test=data, info={"f": object()})
  with pytest.raises(TaskError, match="info must be a dict with string keys"):
    Task(name="t", init=f, loss=f, evaluate=f, train=data, test=data, info=[1, 2])


def test_a_task_checks_its_fields_and_sources():
  def f(*a):
    return None

  with pytest.raises(TaskError, match="loss must be a function"):
    Task(name="t", init=f, loss=3, evaluate=f, train=(np.zeros((2, 1)),), test=(np.zeros((2, 1)),))
  with pytest.raises(TaskError, match="different lengths"):
    Task(name="t", init=f, loss=f, evaluate=f, train=(np.zeros((3, 1)), np.zeros(2)), test=[1])
  with pytest.raises(TaskError, match="train data is a int"):
    Task(name="t", init=f, loss=f, evaluate=f, train=5, test=(np.zeros((2, 1)),))


def test_the_builtin_tasks_name_their_factory_and_a_code_task_is_refused_on_ray(tmp_path):
  task = builtin_tasks.task_of(TrainConfig(dataset="digits", model="mlp"))
  assert task.factory == builtin_tasks.BUILTIN_FACTORY
  assert task.factory_args["dataset"] == "digits" and task.info["num_classes"] == 10
  with pytest.raises(TaskError, match="not the one the config names"):
    builtin_tasks.task_of(TrainConfig(), task)
  code_task = hand_written_mnist1d_task()
  ray = TrainConfig(algorithm="async_easgd", runtime="ray", num_epochs=1, progress=False)
  with pytest.raises(Exception, match="built in code"):
    trainer.train_and_evaluate(ray, tmp_path / "ray", task=code_task)
  assert not (tmp_path / "ray").exists()
