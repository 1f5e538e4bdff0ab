"""TensorBoard event files (``tb/``), read back with TensorBoard's own reader.

Each run's events are compared with its ``metrics.jsonl`` value by value (the
event format stores float32: compared with ``np.float32`` of the record's
value): a train run, a run interrupted past its checkpoint and resumed twice,
a threads run's per-worker scalars, ``compare`` (its runs side by side in one
logdir) and the protocol (the report and tuning curves per arm and seed).
"""

import json
import math

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.backend.event_processing import event_multiplexer
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from easgd.protocol import runs as protocol
from easgd.protocol.config import Arm, ProtocolConfig
from easgd.training import checkpoint, tensorboard, trainer
from easgd.training.compare import compare
from easgd.training.config import TrainConfig
from testutil import interrupt_once, linear_data, linear_task

# digits, tiny MLP: 1438 training images / 64 = 22 steps per epoch
TINY = TrainConfig(
    dataset="digits",
    model="mlp",
    num_workers=4,
    num_devices=2,
    global_batch_size=64,
    num_epochs=2,
    learning_rate=0.1,
    tau=4,
    beta=0.9,
    eval_batch_size=64,
    progress=False,
)


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


def assert_events_are_the_records(run_dir, history):
  got, want = read_scalars(run_dir), expected_scalars(history)
  assert got == want  # every tag, step and float32 value
  files, events = raw_events(run_dir)
  assert len(files) == 1  # one file, no stale one beside it
  steps = {}
  for e in events:
    for v in e.summary.value:
      if v.HasField("simple_value"):
        steps.setdefault(v.tag, []).append(e.step)
  assert {t: s for t, s in steps.items()} == {t: [s for s, _ in p] for t, p in want.items()}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  work = tmp_path_factory.mktemp("full")
  trainer.train_and_evaluate(TINY, work)
  return work


def test_a_runs_events_are_its_metrics_and_its_config_the_hparams(full_run):
  history = records(full_run)
  assert [r["step"] for r in history] == [0, 22, 44]
  assert_events_are_the_records(full_run / tensorboard.TB_DIR, history)
  tags = read_scalars(full_run / tensorboard.TB_DIR)
  assert "train_loss" in tags and [s for s, _ in tags["train_loss"]] == [22, 44]  # null at 0
  for r in history:  # per worker, and their mean is the recorded mean
    assert len(r["worker_center_distances"]) == 4
    assert r["worker_center_distance"] == pytest.approx(np.mean(r["worker_center_distances"]))
  assert history[-1]["worker_center_distances"][0] > 0
  hp = session_hparams(full_run / tensorboard.TB_DIR)
  fields = TINY.to_dict()
  assert hp["algorithm"] == fields["algorithm"] == "easgd"
  assert hp["learning_rate"] == 0.1 and hp["num_workers"] == 4 and hp["progress"] is False
  assert hp["worker_delays"] == json.dumps(list(fields["worker_delays"]))  # a tuple: JSON
  assert {k for k, v in fields.items() if v is not None} == set(hp)


def test_a_run_interrupted_past_its_checkpoint_resumes_to_the_same_events(
    tmp_path, monkeypatch, full_run
):
  # the first checkpoint's save (step 22) never runs: the record of step 22 is
  # on disk (metrics.jsonl and tb/) past the latest checkpoint; the resume
  # drops and redoes it, then a planned stop at step 30 and a second resume
  with monkeypatch.context() as m:
    fired = interrupt_once(m, checkpoint.Checkpointer, "save", 1)
    with pytest.raises(KeyboardInterrupt):
      trainer.train_and_evaluate(TINY, tmp_path)
  assert fired
  assert [r["step"] for r in records(tmp_path)] == [0, 22]  # the stale record
  assert checkpoint.Checkpointer(tmp_path).latest_step() is None
  stopped = trainer.train_and_evaluate(TINY, tmp_path, resume=True, stop_after_steps=30)
  assert stopped["status"] == "stopped"
  assert_events_are_the_records(tmp_path / tensorboard.TB_DIR, records(tmp_path))
  trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  history = records(tmp_path)
  assert [r["step"] for r in history] == [0, 22, 44]
  assert_events_are_the_records(tmp_path / tensorboard.TB_DIR, history)
  # equal to the uninterrupted run's events (spmd: bit for bit)
  assert read_scalars(tmp_path / tensorboard.TB_DIR) == read_scalars(full_run / tensorboard.TB_DIR)


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
  assert_events_are_the_records(tmp_path / tensorboard.TB_DIR, history)
  tags = read_scalars(tmp_path / tensorboard.TB_DIR)
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
  assert sorted(mux.Runs()) == ["easgd/tb", "pmean_sgd/tb"]
  for a in ("easgd", "pmean_sgd"):
    assert_events_are_the_records(tmp_path / a / tensorboard.TB_DIR, records(tmp_path / a))
    assert session_hparams(tmp_path / a / tensorboard.TB_DIR)["algorithm"] == a


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
  protocol.run_protocol(config, tmp_path, log=lambda line: None, task=task)
  results = json.loads((tmp_path / "results.json").read_text())  # null: not finite or no step
  mux = event_multiplexer.EventMultiplexer().AddRunsFromDirectory(str(tmp_path / "tb"))
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
      got = read_scalars(tmp_path / "tb" / "report" / name / f"seed_{s}")
      want = {
          c: [(t, np.float32(v)) for t, v in zip(steps, rep[f"{c}_curve"][i]) if v is not None]
          for c in ("test_error", "val_error", "test_loss", "val_loss", "train_loss")
      }
      assert got == want
      assert all(math.isfinite(v) for _, v in got["test_error"])
      hp = session_hparams(tmp_path / "tb" / "report" / name / f"seed_{s}")
      assert (hp["arm"], hp["seed"], hp["phase"]) == (a, s, "report")
      assert hp["learning_rate"] == results["arms"][a]["chosen_learning_rate"]
    for rate in results["arms"][a]["tuning"] or ():
      for i, s in enumerate((0, 1, 2)):
        run = tmp_path / "tb" / "tune" / name / f"lr_{rate['learning_rate']:g}" / f"seed_{s}"
        curve = rate["val_error_curve"][i]
        assert read_scalars(run) == {
            "val_error": [(t, np.float32(v)) for t, v in zip(steps, curve) if v is not None]
        }
  # written again (a second protocol in the same directory): no stale event file
  stale = tmp_path / "tb" / "report" / "gone" / "seed_1"
  tensorboard.write_events(stale, [(0, {"x": 1.0})])
  tensorboard.write_protocol_events(tmp_path, results)
  assert not list(stale.iterdir())
  assert len(list((tmp_path / "tb").rglob("*tfevents*"))) == len(report + tune)
