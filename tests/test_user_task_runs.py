"""A user's task (a module file, imported by path) through compare, the sweep and
the real asynchronous runtimes.

The task: 8-feature synthetic data (256 training, 64 test examples, 3 classes
of a fixed linear rule), a tiny Flax Dense model; ``correct=false`` drops the
``"correct"`` metric (a loss-only task), ``items=true`` serves the training
data through ``__getitem__`` instead of arrays (``bad_item=k``: whose item k
cannot be read).

* ``easgd compare --task usertask:make``: every run trains the task and records
  it; a loss-only task's table and plot show the center test loss; the sizes
  of the task (not of the built-in data set) are checked before the first run.
* ``easgd sweep --task``: the task is recorded; a classifier given as a task
  sweeps exactly as the built-in data set and model (every record equal).
* runtimes "threads" and "ray" (a local Ray): a run of the task stopped and
  resumed continues its exchange log, and the whole log replays the final
  checkpoint bit for bit (the runtimes' promise, ``tests/test_real_async.py``),
  whose evaluation is the run's final record. A task built in code with
  runtime "ray" is refused before anything is written.
  An item the source cannot read is the user's error on every runtime (one
  line, exit 2, the same line as spmd's), never a worker's fault; a worker's
  (machine) fault is one line on stderr.
* a loss-only regression task (``testutil.regression_task``: mean-squared
  error and a named ``"abs_error"``, no ``"correct"``): stopped and resumed
  on spmd (its metrics.jsonl and exported center equal an uninterrupted run's
  bit for bit), threads and Ray (as above); its summaries, compare rows and
  sweep records hold the metrics it evaluates, no accuracy (absent, not null).
"""

import dataclasses
import json
import os
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from easgd import cli
from easgd.parallel import placement
from easgd.run import compare, trainer
from easgd.runtimes import shared, training_run
from easgd.settings import builtin_tasks
from easgd.settings.config import ConfigError, TrainConfig
from easgd.sweeps import command, network
from easgd.sweeps.grid import SweepGrid
from easgd.tasks import datasets, models
from easgd.tasks.sources import TaskError, take
from easgd.tasks.task import load_task

from testutil import regression_task

TASK_MODULE = textwrap.dedent('''
    """A user's task: 8 features, 3 classes, a tiny Flax Dense model."""
    import flax.linen as nn
    import jax.numpy as jnp
    import numpy as np
    import optax

    from easgd.tasks.task import Task


    class Net(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(3)(jnp.tanh(nn.Dense(8)(x)))


    def _data(n, seed):
      x = np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)
      w = np.random.default_rng(99).normal(size=(8, 3))
      return x, np.argmax(x @ w, axis=1).astype(np.int32)


    class Items:
      def __init__(self, x, y, bad_item=None):
        self.x, self.y, self.bad_item = x, y, bad_item

      def __len__(self):
        return len(self.x)

      def __getitem__(self, i):
        if i == self.bad_item:
          raise ValueError(f"row {i} is damaged")
        return self.x[i], self.y[i]


    def make(train_examples=256, correct=True, items=False, bad_item=None):
      net = Net()
      train, test = _data(train_examples, 1), _data(64, 2)

      def init(key):
        return net.init(key, jnp.zeros((1, 8)))["params"]

      def loss(params, batch, key):
        x, y = batch
        logits = net.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

      def evaluate(params, batch):
        x, y = batch
        logits = net.apply({"params": params}, x)
        out = {"loss": optax.softmax_cross_entropy_with_integer_labels(logits, y)}
        if correct:
          out["correct"] = (jnp.argmax(logits, -1) == y).astype(jnp.float32)
        return out

      return Task(
          name="tiny8",
          init=init,
          loss=loss,
          evaluate=evaluate,
          train=Items(*train, bad_item) if items else train,
          test=test,
          mean_of_examples=True,
      )
''')


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
  """A directory holding ``usertask.py``, on sys.path for this module's tests."""
  root = tmp_path_factory.mktemp("usertask")
  (root / "usertask.py").write_text(TASK_MODULE)
  sys.path.insert(0, str(root))
  yield root
  sys.path.remove(str(root))
  sys.modules.pop("usertask", None)


@pytest.fixture
def in_task_dir(task_dir, monkeypatch):
  """The working directory is the task's (as ``easgd ... --task usertask:make``)."""
  monkeypatch.chdir(task_dir)
  return task_dir


# 256 examples / 32 = 8 steps per epoch
SMALL = dict(num_workers=2, global_batch_size=32, num_epochs=1, learning_rate=0.1, progress=False)


# -- compare ----------------------------------------------------------------------------


def test_compare_runs_a_loss_only_user_task_and_tables_its_loss(in_task_dir, capsys):
  work = in_task_dir / "cmp"
  argv = ["compare", "--workdir", str(work), "--algorithms", "easgd,pmean_sgd"]
  argv += ["--task", "usertask:make", "--task-arg", "correct=false", "--tau", "2"]
  argv += ["--num-workers", "2", "--global-batch-size", "32", "--num-epochs", "1"]
  assert cli.main(argv + ["--no-progress"]) == 0
  out = capsys.readouterr().out
  assert "| center test loss (final) | best |" in out
  rows = json.loads((work / "results.json").read_text())["rows"]
  assert [r["algorithm"] for r in rows] == ["easgd", "pmean_sgd"]
  for r in rows:
    run = work / r["algorithm"]
    summary = json.loads((run / "summary.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert config["task"] == "usertask:make" and config["task_args"] == ["correct=false"]
    assert summary["task"]["name"] == "tiny8" and summary["steps_done"] == 8
    # a metric the task lacks is absent, never null
    assert "test_accuracy" not in r and "best_test_accuracy" not in r
    assert "best_test_accuracy" not in summary and "test_accuracy" not in summary["final"]
    assert r["test_loss"] == summary["final"]["test_loss"]
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert r["best_test_loss"] == min(m["test_loss"] for m in metrics)
    assert f"| {r['test_loss']:.4g} | {r['best_test_loss']:.4g} |" in out
  assert (work / "comparison.png").stat().st_size > 0


def test_compare_checks_the_tasks_size_before_the_first_run(in_task_dir, monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("a run started before every run was checked")

  monkeypatch.setattr(compare, "train_and_evaluate", never)
  # 256 examples / 32 = 8 steps in all: tau 20 is longer than the run (the
  # built-in data set's 8000 examples would give 250 steps)
  cfg = TrainConfig(task="usertask:make", tau=20, **SMALL)
  with pytest.raises(ConfigError, match=r"tau=20 \(communication period\) is longer than"):
    compare.compare(cfg, in_task_dir / "c", ["easgd", "pmean_sgd"])
  assert not (in_task_dir / "c").exists()


def test_compare_passes_a_task_built_in_code_to_every_run(task_dir, tmp_path):
  task = load_task("usertask:make", {"train_examples": 128})
  task = dataclasses.replace(task, factory=None, factory_args={})  # built in code
  rows = compare.compare(TrainConfig(tau=2, **SMALL), tmp_path, ["easgd", "pmean_sgd"], task=task)
  for r in rows:
    summary = json.loads((tmp_path / r["algorithm"] / "summary.json").read_text())
    assert summary["task"]["name"] == "tiny8" and summary["train_examples"] == 128
    assert summary["steps_done"] == 4 and r["test_accuracy"] is not None


def test_a_task_built_in_code_with_runtime_ray_is_refused_before_anything_is_written(
    task_dir, tmp_path
):
  task = load_task("usertask:make")
  task = dataclasses.replace(task, factory=None, factory_args={})  # built in code
  cfg = TrainConfig(algorithm="async_easgd", runtime="ray", tau=2, beta=0.9, **SMALL)
  match = "runtime 'ray' builds the task in each worker's process from an import path"
  with pytest.raises(ConfigError, match=match):
    trainer.train_and_evaluate(cfg, tmp_path / "t", task=task)
  with pytest.raises(ConfigError, match=match):
    compare.compare(cfg, tmp_path / "c", ["async_easgd", "downpour"], task=task)
  assert not (tmp_path / "t").exists() and not (tmp_path / "c").exists()


def test_train_prints_the_summary_of_a_loss_only_task(in_task_dir, capsys):
  argv = ["train", "--workdir", str(in_task_dir / "t"), "--task", "usertask:make"]
  argv += ["--task-arg", "correct=false", "--num-workers", "2", "--global-batch-size", "32"]
  assert cli.main(argv + ["--num-epochs", "1", "--no-progress"]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert "test_accuracy" not in printed and printed["final_step"] == 8
  summary = json.loads((in_task_dir / "t" / "summary.json").read_text())
  assert printed["test_loss"] == summary["final"]["test_loss"]


# -- a changed task: resume and export refuse it ---------------------------------------

EDITABLE = textwrap.dedent('''
    """A user's task whose module the user edits between runs."""
    import flax.linen as nn
    import numpy as np
    import optax

    from easgd.tasks.task import Task

    ROWS, SCALE, WIDTH = {rows}, {scale}, {width}


    def make():
      x = SCALE * np.random.default_rng(0).normal(size=(ROWS, 8)).astype(np.float32)
      test = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
      net = nn.Sequential([nn.Dense(WIDTH), nn.Dense(2)])

      def evaluate(params, batch):
        logits = net.apply({{"params": params}}, batch[0])
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch[1])
        return {{"loss": xent, "correct": 1.0 * (logits.argmax(-1) == batch[1])}}

      return Task(
          name="edited",
          init=lambda key: net.init(key, x[:1])["params"],
          loss=lambda params, batch, key: evaluate(params, batch)["loss"].mean(),
          evaluate=evaluate,
          train=(x, (x[:, 0] > 0).astype(np.int32)),
          test=(test, (test[:, 0] > 0).astype(np.int32)),
      )
''')


def test_a_resume_and_an_export_refuse_a_changed_task_in_one_line(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(str(tmp_path))

  def edit(rows=256, scale=1.0, width=64):
    (tmp_path / "edited.py").write_text(EDITABLE.format(rows=rows, scale=scale, width=width))
    sys.modules.pop("edited", None)

  edit()
  work, out = tmp_path / "run", tmp_path / "out" / "center.msgpack"
  argv = ["train", "--workdir", str(work), "--task", "edited:make", "--num-workers", "2"]
  argv += ["--global-batch-size", "32", "--validation-examples", "64", "--no-progress"]
  assert cli.main(argv + ["--stop-after-steps", "2"]) == 0
  capsys.readouterr()
  files = {p: p.read_bytes() for p in work.rglob("*") if p.is_file()}
  for change, says in [
      (dict(rows=258), "train: 192 -> 194 examples"),
      (dict(scale=3.0), "train: other items (digest of 8 evenly spaced items); validation: other"),
      (dict(width=32), "parameter ['layers_0']['bias']: (64,) float32 -> (32,) float32"),
  ]:
    edit(**change)
    for args in (argv + ["--resume"], ["export", "--workdir", str(work), "--out", str(out)]):
      assert cli.main(args) == 2
      err = capsys.readouterr().err
      action = "resume" if args[0] == "train" else "export"
      assert err.startswith(f"easgd: error: cannot {action}: the task differs from the one the ")
      assert err.count("\n") == 1 and says in err, err
      assert {p: p.read_bytes() for p in work.rglob("*") if p.is_file()} == files
      assert not out.parent.exists()  # nothing written
  # the task as it was: a run that recorded none (written before task.json) resumes
  # and records it; the export goes on
  edit()
  recorded = (work / "task.json").read_text()
  (work / "task.json").unlink()
  assert cli.main(argv + ["--resume", "--stop-after-steps", "3"]) == 0
  assert (work / "task.json").read_text() == recorded
  assert cli.main(["export", "--workdir", str(work), "--out", str(out)]) == 0


def assert_loss_only(summary):
  """A loss-only run's summary: the metrics its task evaluates, no accuracy or
  error (absent, not null)."""
  final = summary["final"]
  assert {"test_loss", "test_abs_error"} <= set(final) and "best_test_accuracy" not in summary
  assert not {"test_accuracy", "test_error", "validation_error"} & set(final)


# 256 examples / 32 = 8 steps per epoch, 2 epochs: 16 steps
LOSS_ONLY = ["--task", "testutil:regression_task", "--num-workers", "2", "--tau", "2"]
LOSS_ONLY += ["--global-batch-size", "32", "--num-epochs", "2", "--no-progress"]


def test_a_loss_only_task_stopped_and_resumed_equals_an_uninterrupted_run(tmp_path, capsys):
  full, part = tmp_path / "full", tmp_path / "part"
  assert cli.main(["train", "--workdir", str(full), *LOSS_ONLY]) == 0
  assert cli.main(["train", "--workdir", str(part), *LOSS_ONLY, "--stop-after-steps", "5"]) == 0
  assert cli.main(["train", "--workdir", str(part), "--resume"]) == 0  # mid-epoch 1
  printed = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
  assert [p["status"] for p in printed] == ["complete", "stopped", "complete"]
  assert all("test_accuracy" not in p for p in printed)
  assert printed[2]["test_loss"] == printed[0]["test_loss"]
  assert (part / "metrics.jsonl").read_text() == (full / "metrics.jsonl").read_text()
  records = [json.loads(l) for l in (part / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 8, 16]
  summary = json.loads((part / "summary.json").read_text())
  assert summary["status"] == "complete" and summary["steps_done"] == 16
  assert summary["final"] == records[-1] == json.loads((full / "summary.json").read_text())["final"]
  assert_loss_only(summary)
  for run in (full, part):  # the same center, bit for bit
    argv = ["export", "--workdir", str(run), "--out", str(run / "center.msgpack")]
    assert cli.main(argv) == 0
  assert (part / "center.msgpack").read_bytes() == (full / "center.msgpack").read_bytes()


# -- sweep ------------------------------------------------------------------------------

SWEEP = ["--no-plots", "--tau", "1,2", "--alpha", "0.1,0.4", "--num-workers", "2"]
SWEEP += ["--num-steps", "4", "--per-worker-batch-size", "4", "--hessian-tol", "1e-2"]
SWEEP += ["--hessian-iterations", "20"]


def test_sweep_of_a_user_task_records_it(in_task_dir):
  work = in_task_dir / "sw"
  argv = ["sweep", "--workdir", str(work), *SWEEP[1:], "--task", "usertask:make"]  # plots
  assert cli.main(argv + ["--task-arg", "items=true", "--task-arg", "correct=false"]) == 0
  config = json.loads((work / "sweep_config.json").read_text())
  assert config["task"] == "usertask:make"
  assert config["task_args"] == ["items=true", "correct=false"]
  result = json.loads((work / "sweep.json").read_text())
  task = result["info"]["task"]
  assert task["factory"] == "usertask:make" and task["name"] == "tiny8"
  assert task["factory_args"] == {"items": True, "correct": False}
  assert "dataset" not in result["info"] and "model" not in result["info"]
  assert len(result["records"]) == 4
  for r in result["records"]:
    assert "test_accuracy" not in r and np.isfinite(r["center_loss"])
  assert result["info"]["hessian_init"]["examples"] == 256
  assert (work / "center_loss.png").is_file() and not (work / "test_accuracy.png").exists()


def test_a_sweep_records_the_metrics_a_loss_only_task_evaluates(tmp_path):
  from easgd.sweeps import report

  task = regression_task()
  grid = SweepGrid(tau=(1, 2), alpha=(0.1, 0.4), num_workers=(2,))
  kw = dict(per_worker_batch_size=4, hessian_iterations=0)
  res = network.sweep_network(grid, 4, task=task, **kw)
  test = take(task.test, np.arange(len(task.test)))
  for i, r in enumerate(res.records):  # the final center's mean test metrics
    center = jax.tree.map(lambda a: a[i], res.centers[2])
    m = task.evaluate(center, test)
    np.testing.assert_allclose(r["center_loss"], np.mean(m["loss"]), rtol=1e-6)
    np.testing.assert_allclose(r["test_abs_error"], np.mean(m["abs_error"]), rtol=1e-6)
    assert "test_accuracy" not in r
  report.write_result(res, tmp_path, plots=False)  # plots: the sweep's CLI test above
  header = (tmp_path / "sweep.csv").read_text().splitlines()[0].split(",")
  assert header[header.index("center_loss") + 1] == "test_abs_error"
  assert "test_accuracy" not in header and res.columns() == header
  assert "test accuracy" not in report.summarize(res)


def test_a_classifier_given_as_a_task_sweeps_exactly_as_the_builtin_problem():
  grid = SweepGrid(tau=(1, 3), alpha=(0.1, 0.4), learning_rate=(0.1,), num_workers=(2, 3))
  kw = dict(per_worker_batch_size=4, seed=5, hessian_iterations=30, hessian_tol=1e-3)
  builtin = network.sweep_network(grid, 6, dataset="digits", model="mlp", **kw)
  ds = datasets.load_dataset("digits", seed=5)
  task = builtin_tasks.classifier_task(
      models.make_model("mlp", ds.num_classes),
      (ds.train_x, ds.train_y),
      (ds.test_x, ds.test_y),
      info=dict(num_classes=ds.num_classes),  # chance, for collapse, as the built-in records it
  )
  mine = network.sweep_network(grid, 6, task=task, **kw)
  assert mine.records == builtin.records  # every metric, the theory columns included
  for at in ("hessian_init", "hessian_trained"):  # certified estimates, equal
    assert builtin.info[at]["converged"] and mine.info[at]["h"] == builtin.info[at]["h"]
  assert mine.info["task"]["name"] == "classifier"
  for p in (2, 3):
    for a, b in zip(jax.tree.leaves(mine.centers[p]), jax.tree.leaves(builtin.centers[p])):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            ["--task-arg", "correct=false"],
            "task_args=('correct=false',) have no effect without a task",
        ),
        (
            ["--task", "usertask:make", "--dataset", "digits"],
            "dataset='digits' is read by the built-in problem only; task 'usertask:make'",
        ),
        (["--task", "usertask:make", "--task-arg", "colour=1"], "takes no argument 'colour'"),
        (["--task", "nosuchmodule:make"], "module 'nosuchmodule' does not import"),
    ],
)
def test_a_bad_task_of_the_sweep_is_one_line_before_anything_runs(
    extra, message, in_task_dir, capsys, monkeypatch
):
  def fail(*args, **kwargs):
    raise AssertionError("a part of the sweep started before every check passed")

  monkeypatch.setattr(command, "_run_parts", fail)
  work = in_task_dir / "bad"
  assert cli.main(["sweep", "--workdir", str(work), *SWEEP, *extra]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("easgd: error: ") and message in err, err
  assert not work.exists()


def test_a_task_with_batch_norm_is_refused_by_the_sweep():
  ds = datasets.load_dataset("digits")
  task = builtin_tasks.classifier_task(
      models.make_model("cnn_bn", ds.num_classes), (ds.train_x, ds.train_y), (ds.test_x, ds.test_y)
  )
  grid = SweepGrid(tau=(1,), alpha=(0.1,), num_workers=(2,))
  with pytest.raises(TaskError, match="has a center_state \\(BatchNorm\\), which the sweep"):
    network.check_network(grid, 4, per_worker_batch_size=4, task=task)


# -- the real asynchronous runtimes -----------------------------------------------------

# 4 workers, 256 examples / 32 = 8 steps per epoch, 2 epochs: 16 steps
ASYNC = TrainConfig(
    algorithm="async_easgd",
    task="usertask:make",
    task_args=("items=true",),
    num_workers=4,
    num_devices=2,
    global_batch_size=32,
    num_epochs=2,
    learning_rate=0.1,
    tau=2,
    beta=0.9,
    eval_batch_size=64,
    progress=False,
    runtime="threads",
    worker_delays=(0, 0, 0, 0.002),
)


def stopped_resumed_and_replayed(workdir, cfg, stops=(5, 11)):
  """Runs ``cfg`` to the first of ``stops``, resumes it to each other, then
  to the end; checks the log goes on, the whole log replays the final
  checkpoint bit for bit and the run's final record is that checkpoint's
  evaluation."""
  from test_real_async import replays_its_checkpoint, restore

  first = trainer.train_and_evaluate(cfg, workdir, stop_after_steps=stops[0])
  assert first["status"] == "stopped" and first["steps_done"] == stops[0]
  log5 = shared.read_log(workdir / "exchanges.jsonl")
  for stop in stops[1:]:
    trainer.train_and_evaluate(cfg, workdir, resume=True, stop_after_steps=stop)
  done = trainer.train_and_evaluate(cfg, workdir, resume=True)
  assert done["status"] == "complete" and done["steps_done"] == 16
  assert [r["step"] for r in done["history"]] == [0, 8, 16]
  assert done["task"]["factory"] == cfg.task
  log = shared.read_log(workdir / "exchanges.jsonl")
  assert log[: len(log5)] == log5  # the log goes on
  assert [r["version"] for r in log] == list(range(len(log)))
  clocks = replays_its_checkpoint(workdir, cfg)
  assert sum(clocks) == 16 * 4 and done["worker_local_steps"] == clocks
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["task"] == cfg.task and saved["task_args"] == list(cfg.task_args)
  run = training_run.Run(cfg)  # the replayed (uninterrupted) state's evaluation: the final record
  final = restore(workdir, run)
  inputs = placement.split_workers(final["worker"], run.layout)
  record = run.evaluate(
      inputs, placement.replicate_per_device(final["shared"], run.layout), 2, 16, None
  )
  assert {k: v for k, v in record.items() if k.startswith("test_")} == {
      k: v for k, v in done["final"].items() if k.startswith("test_")
  }
  return done


# the loss-only task on the asynchronous runtimes: 256 training examples as ASYNC
LOSS_ONLY_ASYNC = ASYNC.replace(task="testutil:regression_task", task_args=())


def test_threads_run_a_user_task_stopped_resumed_and_replayed(in_task_dir, tmp_path):
  done = stopped_resumed_and_replayed(tmp_path, ASYNC)
  assert done["layout"].startswith("4 workers = 4 threads on 2 device(s)")


def test_threads_run_a_loss_only_task_stopped_resumed_and_replayed(tmp_path):
  assert_loss_only(stopped_resumed_and_replayed(tmp_path, LOSS_ONLY_ASYNC))


def test_threads_read_the_spmd_trainers_batches_of_a_user_task(task_dir):
  from easgd.runtimes import async_runs
  from easgd.tasks import batches

  run = training_run.Run(ASYNC)
  batch_fn = async_runs.make_batch_fn(run)
  for clock in (0, 7, 8, 13):  # both epochs
    epoch, t = clock // 8 + 1, clock % 8
    ix = batches.worker_batch_indices(256, 4, 8, 0, epoch)[t]
    spmd_batch = training_run.global_batch(run, ix, epoch, clock)
    for worker in range(4):
      for a, b in zip(batch_fn(worker, clock), spmd_batch):
        np.testing.assert_array_equal(a, b[worker])


# item 100 is read in the first epoch, never by the task's check (items 0-31, 224-255)
BAD_ITEM = "task 'tiny8': train data: item 100 cannot be read (ValueError: row 100 is damaged)"
TWO = ["--task", "usertask:make", "--task-arg", "items=true", "--num-workers", "2"]
TWO += ["--global-batch-size", "32", "--num-epochs", "1", "--tau", "2", "--no-progress"]


def test_a_bad_item_is_the_users_error_in_one_line_on_threads_as_on_spmd(in_task_dir, capsys):
  for runtime, algorithm in [("threads", "async_easgd"), ("spmd", "easgd")]:
    work = in_task_dir / f"bad-{runtime}"
    argv = ["train", "--workdir", str(work), *TWO, "--task-arg", "bad_item=100"]
    status = cli.main(argv + ["--runtime", runtime, "--algorithm", algorithm])
    err = capsys.readouterr().err
    assert (status, err) == (2, f"easgd: error: {BAD_ITEM}\n"), runtime
    assert not (work / "summary.json").exists()


def test_a_workers_fault_is_one_line_on_stderr(in_task_dir, capsys, monkeypatch):
  executor = trainer._executor
  monkeypatch.setattr(trainer, "_executor", lambda run, workdir, _: executor(run, workdir, {1: 3}))
  argv = ["train", "--workdir", str(in_task_dir / "fault"), *TWO, "--runtime", "threads"]
  assert cli.main(argv + ["--algorithm", "async_easgd"]) == 0
  assert capsys.readouterr().err == (
      "easgd: warning: worker 1 failed at local step 3 (InjectedFault: fault injected into "
      "worker 1 before its local step 3); it stays stopped, the other workers take its share "
      "of the steps\n"
  )


@pytest.mark.slow
@pytest.mark.own_process  # Ray in the process: tests/conftest.py
def test_ray_runs_a_user_task_stopped_resumed_and_replayed(in_task_dir, tmp_path, monkeypatch):
  ray = pytest.importorskip("ray")
  assert not ray.is_initialized()
  # the actors' processes import testutil (the loss-only task) as the driver does
  tests = str(Path(__file__).parent)
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.getenv("PYTHONPATH")])))
  ray.init(num_cpus=2, include_dashboard=False)
  try:
    cfg = ASYNC.replace(runtime="ray", worker_delays=())
    done = stopped_resumed_and_replayed(tmp_path / "classifier", cfg)
    assert done["layout"].startswith("4 workers = 4 Ray actors")
    # an item the source cannot read: the user's error, as on threads, not a fault
    bad = cfg.replace(task_args=("items=true", "bad_item=100"), num_workers=2, num_epochs=1)
    with pytest.raises(TaskError) as error:
      trainer.train_and_evaluate(bad, tmp_path / "bad")
    assert str(error.value) == BAD_ITEM
    assert not (tmp_path / "bad" / "summary.json").exists()
    cfg = LOSS_ONLY_ASYNC.replace(runtime="ray", worker_delays=())
    done = stopped_resumed_and_replayed(tmp_path / "loss_only", cfg, stops=(5,))
    assert done["layout"].startswith("4 workers = 4 Ray actors")
    assert_loss_only(done)
  finally:
    ray.shutdown()
