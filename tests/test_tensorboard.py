"""TensorBoard event files, read back with TensorBoard's own reader.

Each run's events are compared with its ``metrics.jsonl`` value by value (the
event format stores float32: compared with ``np.float32`` of the record's
value): a train run (its own wall time per record, its name the run
directory's), a loss-only run read by a loader opened while it runs, a run
interrupted past its checkpoint (its last event cut short) and resumed twice
under one loader, a threads run's per-worker scalars, ``compare`` (its runs
side by side in one logdir, by algorithm) and the protocol (the report and
tuning curves per arm and seed, a classifier's and a loss-only task's).
"""

import dataclasses
import json
import math

import numpy as np
import pytest
from tensorboard.backend.event_processing import (
    event_accumulator,
    event_file_loader,
    event_multiplexer,
)
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from easgd.protocol import runs
from easgd.protocol.config import Arm, ProtocolConfig
from easgd.run import checkpoint, tensorboard, trainer
from easgd.run.compare import compare
from easgd.settings.config import TrainConfig

from testutil import TINY_DIGITS, interrupt_once, linear_data, linear_task

# digits, tiny MLP: 1438 training images / 64 = 22 steps per epoch
TINY = TINY_DIGITS


def records(workdir):
  return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


def expected_scalars(history):
  """The tag scheme, written out: a number field -> its name, a list -> <name>/<i>;
  ``step`` is the x axis; null (None) and bools have no event."""
  out = {}

  def put(tag, step, value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      out.setdefault(tag, []).append((step, np.float32(value)))

  for r in history:
    for name, value in r.items():
      if name == "step":
        continue
      if isinstance(value, list):
        for i, v in enumerate(value):
          put(f"{name}/{i}", r["step"], v)
      else:
        put(name, r["step"], value)
  return out


def read_scalars(run_dir):
  """{tag: [(step, float32 value)]} as TensorBoard's EventAccumulator reads ``run_dir``."""
  acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
  acc.Reload()
  return {t: [(e.step, np.float32(e.value)) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def raw_events(run_dir):
  """Every event of every event file in ``run_dir`` (no purging): what the files hold."""
  files = sorted(p for p in run_dir.iterdir() if "tfevents" in p.name)
  loaded = [r for f in files for r in event_file_loader.RawEventFileLoader(str(f)).Load()]
  return files, [event_pb2.Event.FromString(r) for r in loaded]


def session_hparams(run_dir):
  """The hparams plugin's session start of ``run_dir``: {name: value}."""
  _, events = raw_events(run_dir)
  for e in events:
    for v in e.summary.value:
      if v.tag == "_hparams_/session_start_info":
        data = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
        return {
            k: getattr(x, x.WhichOneof("kind")) for k, x in data.session_start_info.hparams.items()
        }
  return None


def assert_events_are_the_records(run_dir, history, invocations=1):
  """TensorBoard's reader shows every record once; one file per invocation of
  the run, the records a single invocation wrote each once in its file."""
  got, want = read_scalars(run_dir), expected_scalars(history)
  assert got == want  # every tag, step and float32 value, each step once
  files, events = raw_events(run_dir)
  assert len(files) == invocations  # no file rewritten or left by another writer
  if invocations == 1:
    steps = {}
    for e in events:
      for v in e.summary.value:
        if v.HasField("simple_value"):
          steps.setdefault(v.tag, []).append(e.step)
    assert {t: s for t, s in steps.items()} == {t: [s for s, _ in p] for t, p in want.items()}


def record_wall_times(run_dir):
  """{step: wall time} of the record events TensorBoard's reader shows (every
  tag of a record at one wall time: asserted)."""
  acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
  acc.Reload()
  times = {}
  for tag in acc.Tags()["scalars"]:
    for e in acc.Scalars(tag):
      assert times.setdefault(e.step, e.wall_time) == e.wall_time
  return times


def assert_strictly_increasing(values):
  assert all(a < b for a, b in zip(values, values[1:])), values


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  work = tmp_path_factory.mktemp("full") / "digits_run"
  trainer.train_and_evaluate(TINY, work)
  return work


def test_a_runs_events_are_its_metrics_and_its_config_the_hparams(full_run):
  history = records(full_run)
  assert [r["step"] for r in history] == [0, 22, 44]
  assert_events_are_the_records(full_run, history)
  tags = read_scalars(full_run)
  assert "train_loss" in tags and [s for s, _ in tags["train_loss"]] == [22, 44]  # null at 0
  for r in history:  # per worker, and their mean is the recorded mean
    assert len(r["worker_center_distances"]) == 4
    assert r["worker_center_distance"] == pytest.approx(np.mean(r["worker_center_distances"]))
  assert history[-1]["worker_center_distances"][0] > 0
  hp = session_hparams(full_run)
  fields = TINY.to_dict()
  assert hp["algorithm"] == fields["algorithm"] == "easgd"
  assert hp["learning_rate"] == 0.1 and hp["num_workers"] == 4 and hp["progress"] is False
  assert hp["worker_delays"] == json.dumps(list(fields["worker_delays"]))  # a tuple: JSON
  assert {k for k, v in fields.items() if v is not None} == set(hp)


def test_each_record_has_its_own_wall_time_and_the_run_its_directorys_name(full_run):
  # the wall clock of each evaluation: strictly increasing over the records
  times = record_wall_times(full_run)
  assert sorted(times) == [0, 22, 44]
  assert_strictly_increasing([times[s] for s in sorted(times)])
  # TensorBoard over the runs' parent directory: the run is named as its directory
  mux = event_multiplexer.EventMultiplexer().AddRunsFromDirectory(str(full_run.parent))
  mux.Reload()
  assert mux.Runs() and sorted(mux.Runs()) == ["digits_run"]


def test_a_loader_reading_a_running_run_sees_each_record_as_it_is_appended(tmp_path, monkeypatch):
  # a task whose evaluation gives a loss and one other named metric, no
  # `correct` (no accuracy, no error); 768 examples / 64 = 12 steps per epoch
  task = linear_task(linear_data(768, 1), linear_data(200, 2), name="regress", correct=False)
  evaluate = task.evaluate
  task = dataclasses.replace(
      task, evaluate=lambda p, b: dict(evaluate(p, b), sq=evaluate(p, b)["loss"] ** 2)
  )
  config = TrainConfig(num_workers=2, global_batch_size=64, num_epochs=3, progress=False)
  work = tmp_path / "regress"
  # one loader, opened at the first checkpoint (records of steps 0 and 12 on
  # disk), reloaded at every checkpoint, after that boundary's record
  loader, seen = [], []
  save = checkpoint.Checkpointer.save

  def save_and_read(self, step, state):
    if not loader:
      loader.append(event_accumulator.EventAccumulator(str(work), size_guidance={"scalars": 0}))
    loader[0].Reload()
    seen.append((step, [e.step for e in loader[0].Scalars("test_loss")]))
    return save(self, step, state)

  monkeypatch.setattr(checkpoint.Checkpointer, "save", save_and_read)
  trainer.train_and_evaluate(config, work, task=task)
  assert seen == [(12, [0, 12]), (24, [0, 12, 24]), (36, [0, 12, 24, 36])]
  history = records(work)
  assert {k for k in history[-1] if k.startswith("test_")} == {"test_loss", "test_sq", "test_count"}
  assert_events_are_the_records(work, history)
  loader[0].Reload()
  assert {
      t: [(e.step, np.float32(e.value)) for e in loader[0].Scalars(t)]
      for t in loader[0].Tags()["scalars"]
  } == expected_scalars(history)
  times = record_wall_times(work)
  assert_strictly_increasing([times[s] for s in (0, 12, 24, 36)])


def test_a_run_interrupted_past_its_checkpoint_resumes_to_the_same_events(
    tmp_path, monkeypatch, full_run
):
  # the first checkpoint's save (step 22) never runs: the record of step 22 is
  # on disk (metrics.jsonl and its event) past the latest checkpoint, and its
  # event cut short (a kill while it was written); the resume drops and
  # redoes it, then a planned stop at step 30 and a second resume. One loader,
  # opened after the interrupt, reads the run throughout.
  with monkeypatch.context() as m:
    fired = interrupt_once(m, checkpoint.Checkpointer, "save", 1)
    with pytest.raises(KeyboardInterrupt):
      trainer.train_and_evaluate(TINY, tmp_path)
  assert fired
  assert [r["step"] for r in records(tmp_path)] == [0, 22]  # the stale record
  assert checkpoint.Checkpointer(tmp_path).latest_step() is None
  (first,) = raw_events(tmp_path)[0]
  first.write_bytes(first.read_bytes()[:-5])  # the last event (step 22) cut short
  loader = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
  loader.Reload()
  assert [e.step for e in loader.Scalars("test_accuracy")] == [0]

  def shown():
    loader.Reload()
    return {
        t: [(e.step, np.float32(e.value)) for e in loader.Scalars(t)]
        for t in loader.Tags()["scalars"]
    }

  stopped = trainer.train_and_evaluate(TINY, tmp_path, resume=True, stop_after_steps=30)
  assert stopped["status"] == "stopped"
  assert_events_are_the_records(tmp_path, records(tmp_path), invocations=2)
  assert shown() == expected_scalars(records(tmp_path))  # steps 0, 22 once each
  trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  history = records(tmp_path)
  assert [r["step"] for r in history] == [0, 22, 44]
  assert_events_are_the_records(tmp_path, history, invocations=3)
  assert shown() == expected_scalars(history)  # the loader that read every invocation
  times = record_wall_times(tmp_path)
  assert_strictly_increasing([times[s] for s in (0, 22, 44)])
  # equal to the uninterrupted run's events (spmd: bit for bit)
  assert read_scalars(tmp_path) == read_scalars(full_run)


def test_a_threads_run_has_per_worker_scalars(tmp_path):
  cfg = TINY.replace(
      algorithm="async_easgd",
      runtime="threads",
      num_epochs=1,
      tau=2,
      worker_delays=(0, 0, 0, 0.002),
  )
  trainer.train_and_evaluate(cfg, tmp_path)
  history = records(tmp_path)
  assert_events_are_the_records(tmp_path, history)
  tags = read_scalars(tmp_path)
  last = history[-1]
  for i in range(4):
    for field in ("worker_local_steps", "exchanges_per_worker", "worker_center_distances"):
      assert tags[f"{field}/{i}"][-1] == (22, np.float32(last[field][i]))
  assert sum(last["worker_local_steps"]) == 22 * 4
  assert sum(last["exchanges_per_worker"]) == last["exchanges"] > 0
  assert last["exchanges_per_worker"] == [-(-n // 2) for n in last["worker_local_steps"]]  # tau 2


def test_compare_runs_show_side_by_side_in_one_logdir(tmp_path):
  compare(TINY.replace(num_epochs=1), tmp_path, ["easgd", "pmean_sgd"])
  mux = event_multiplexer.EventMultiplexer().AddRunsFromDirectory(str(tmp_path))
  mux.Reload()
  assert sorted(mux.Runs()) == ["easgd", "pmean_sgd"]
  for a in ("easgd", "pmean_sgd"):
    assert_events_are_the_records(tmp_path / a, records(tmp_path / a))
    assert session_hparams(tmp_path / a)["algorithm"] == a


def test_the_protocols_curves_per_arm_and_seed(tmp_path):
  base = TrainConfig(
      num_epochs=1, num_workers=2, global_batch_size=64, validation_examples=128, progress=False
  )  # a user's task: 640 training examples, 8 steps; the default seeds (0, 1, 2; 100, 101, 102)
  task = linear_task(linear_data(768, 1), linear_data(200, 2))
  config = ProtocolConfig(
      "tb",
      "a test",
      base,
      (
          Arm("easgd", "easgd", dict(tau=2), (0.3, 1.0)),
          Arm("easgd/tau1", "easgd", dict(tau=1), lr_from="easgd"),
      ),
      eval_every_steps=2,
  )
  runs.run_protocol(config, tmp_path, log=lambda line: None, task=task)
  results = json.loads((tmp_path / "results.json").read_text())  # null: not finite or no step
  mux = event_multiplexer.EventMultiplexer().AddRunsFromDirectory(str(tmp_path))
  mux.Reload()
  report = [f"report/{a}/seed_{s}" for a in ("easgd", "easgd_tau1") for s in (100, 101, 102)]
  rates = results["arms"]["easgd"]["learning_rates"]  # the grid 0.3, 1 and its extension
  assert rates[:2] == [0.3, 1.0] and len(rates) == 2 + len(
      results["arms"]["easgd"]["grid_extended"]
  )
  tune = [f"tune/easgd/lr_{r:g}/seed_{s}" for r in rates for s in (0, 1, 2)]
  assert sorted(mux.Runs()) == sorted(report + tune)
  assert results["arms"]["easgd/tau1"]["tuning"] is None  # lr_from: no tuning runs
  for name, a in (("easgd", "easgd"), ("easgd_tau1", "easgd/tau1")):
    rep = results["arms"][a]["report"]
    steps = rep["eval_steps"]
    assert steps[0] == 0 and len(steps) > 2
    for i, s in enumerate((100, 101, 102)):
      got = read_scalars(tmp_path / "report" / name / f"seed_{s}")
      want = {
          c: [(t, np.float32(v)) for t, v in zip(steps, rep[f"{c}_curve"][i]) if v is not None]
          for c in ("test_error", "val_error", "test_loss", "val_loss", "train_loss")
      }
      assert got == want
      assert all(math.isfinite(v) for _, v in got["test_error"])
      hp = session_hparams(tmp_path / "report" / name / f"seed_{s}")
      assert (hp["arm"], hp["seed"], hp["phase"]) == (a, s, "report")
      assert hp["learning_rate"] == results["arms"][a]["chosen_learning_rate"]
    for rate in results["arms"][a]["tuning"] or ():
      for i, s in enumerate((0, 1, 2)):
        run = tmp_path / "tune" / name / f"lr_{rate['learning_rate']:g}" / f"seed_{s}"
        curve = rate["val_error_curve"][i]
        assert read_scalars(run) == {
            "val_error": [(t, np.float32(v)) for t, v in zip(steps, curve) if v is not None]
        }
  # written again (a second protocol in the same directory): no stale event file
  stale = tmp_path / "report" / "gone" / "seed_1"
  tensorboard.write_events(stale, [(0, {"x": 1.0})])
  tensorboard.write_protocol_events(tmp_path, results)
  assert not list(stale.iterdir())
  assert len(list(tmp_path.rglob("*tfevents*"))) == len(report + tune)


def test_a_loss_only_protocol_writes_the_curves_it_has(tmp_path):
  # the results of a protocol on a task without `correct`: loss curves only
  # (null: not measured), tuned on the validation loss
  curve = lambda *v: list(v)  # noqa: E731
  results = dict(
      protocol=dict(tune_seeds=[0, 1]),
      arms={
          "easgd/tau2": dict(
              config=dict(algorithm="easgd", tau=2),
              chosen_learning_rate=0.5,
              report=dict(
                  seeds=[100],
                  eval_steps=[0, 4, 8],
                  val_loss_curve=[curve(2.0, 1.5, 1.25)],
                  test_loss_curve=[curve(2.5, 1.75, 1.5)],
                  train_loss_curve=[curve(None, 1.0, 0.75)],
              ),
              tuning=[
                  dict(
                      learning_rate=0.5,
                      score=1.25,
                      val_loss_curve=[curve(2.0, 1.5, 1.25), curve(2.0, 1.0, 0.5)],
                  )
              ],
          )
      },
  )
  tensorboard.write_protocol_events(tmp_path, results)
  mux = event_multiplexer.EventMultiplexer().AddRunsFromDirectory(str(tmp_path))
  mux.Reload()
  assert sorted(mux.Runs()) == [
      "report/easgd_tau2/seed_100",
      "tune/easgd_tau2/lr_0.5/seed_0",
      "tune/easgd_tau2/lr_0.5/seed_1",
  ]
  f32 = np.float32
  assert read_scalars(tmp_path / "report" / "easgd_tau2" / "seed_100") == {
      "val_loss": [(0, f32(2.0)), (4, f32(1.5)), (8, f32(1.25))],
      "test_loss": [(0, f32(2.5)), (4, f32(1.75)), (8, f32(1.5))],
      "train_loss": [(4, f32(1.0)), (8, f32(0.75))],
  }
  assert read_scalars(tmp_path / "tune" / "easgd_tau2" / "lr_0.5" / "seed_1") == {
      "val_loss": [(0, f32(2.0)), (4, f32(1.0)), (8, f32(0.5))]
  }
