"""The comparison protocol on a task whose evaluation gives only a loss (a user's MLP
regression): the rates chosen on the validation loss, the test loss reported with its
interval, the settings such a task cannot use refused before anything compiles, and the
protocol's files written by one writer, equal from the command line and the library."""

import dataclasses
import json
import re
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2

from easgd import TrainConfig, cli
from easgd.protocol import claims, report
from easgd.protocol import runs as protocol
from easgd.protocol import stats as protocol_stats
from easgd.protocol.config import Arm, ProtocolConfig, ProtocolError, load_protocol_file
from easgd.protocol.networks import Network
from easgd.tasks.task import Task

from testutil import regression_task

PROTOCOL_FILE = """
from easgd import TrainConfig
from easgd.protocol.config import Arm, ProtocolConfig

def get_protocol():
  base = TrainConfig(num_epochs=1, global_batch_size=64, num_workers=2, validation_examples=128,
                     progress=False, task="testutil:regression_task",
                     task_args=("train_examples=640", "test_examples=200"))
  return ProtocolConfig("regression", "an MLP regression", base,
                        (Arm("easgd", "easgd", dict(tau=2), (0.1, 0.3)),),
                        eval_every_steps=4, max_grid_extensions=0{extra})
"""
"""8 steps: 640 training examples, 128 held out, 2 x 32 per step; two rates. The task
(tests/testutil.py) evaluates a squared error ("loss") and "abs_error", no "correct"."""

TIMINGS = {"wall_s", "compile_s", "wall_time_s", "compute_per_step_s", "compiles", "compiles_all"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
  """The same protocol file run by ``easgd protocol`` and by ``run_protocol(config, workdir)``."""
  root = tmp_path_factory.mktemp("loss")
  (root / "proto.py").write_text(PROTOCOL_FILE.format(extra=""))
  by_cli, by_library = root / "cli", root / "library"
  assert cli.main(["protocol", "--config", str(root / "proto.py"), "--workdir", str(by_cli)]) == 0
  config = load_protocol_file(root / "proto.py")
  protocol.run_protocol(config, by_library, log=lambda line: None)
  return by_cli, by_library


def test_a_loss_only_task_is_tuned_on_its_validation_loss_and_reports_its_test_loss(written):
  results = json.loads((written[0] / "results.json").read_text())
  proto = results["protocol"]
  assert (proto["select_metric"], proto["select_better"]) == ("loss", "lower")
  assert proto["targets"] == [] and proto["networks"] == []  # no test error to reach
  arm = results["arms"]["easgd"]
  # the rate whose mean final validation loss over the tuning seeds is lowest
  scores = {}
  for rate in arm["tuning"]:
    assert rate["val_loss_final"] == [curve[-1] for curve in rate["val_loss_curve"]]
    assert rate["score"] == pytest.approx(np.mean(rate["val_loss_final"]), rel=1e-12)
    scores[rate["learning_rate"]] = rate["score"]
  assert len(scores) == 2 and arm["chosen_learning_rate"] == min(scores, key=scores.get)
  # the test loss: final, and at the evaluation with the lowest validation loss
  rep = arm["report"]
  final = [curve[-1] for curve in rep["test_loss_curve"]]
  best = [int(np.argmin(curve)) for curve in rep["val_loss_curve"]]
  at_best = [curve[i] for curve, i in zip(rep["test_loss_curve"], best)]
  assert arm["final_test_loss_by_seed"] == final
  assert arm["test_loss_at_best_val_by_seed"] == at_best
  assert arm["final_test_loss"] == protocol_stats.mean_interval(final)
  assert arm["test_loss_at_best_val"] == protocol_stats.mean_interval(at_best)
  interval = arm["final_test_loss"]
  assert interval["n"] == 3 and interval["low"] < interval["mean"] < interval["high"]
  # it learned (measured: at most 0.51 after the 8 steps, at least 0.61 at step 0)
  assert max(final) < 0.9 * min(curve[0] for curve in rep["test_loss_curve"])
  assert not [k for k in arm if "error" in k] and arm["time_to_target"] == {}
  text = (written[0] / "results.md").read_text()
  assert "| final test loss | test loss at best val | workers' final test loss |" in text
  assert f"| {interval['mean']:.4g} \u00b1 {interval['half_width']:.2g} |" in text
  assert "error" not in text and "err %" not in text and "Modelled" not in text
  for table in (lambda: claims.claims(results, None), lambda: report.compact_markdown(results)):
    with pytest.raises(ProtocolError, match="speaks of test error; the results of 'regression'"):
      table()


def _files(directory):
  """Every file under ``directory``, an event file named by its TensorBoard run
  directory (the writer numbers the files of a run as it rewrites them)."""
  return sorted(
      str(p.parent.relative_to(directory) / "<events>")
      if "tfevents" in p.name
      else str(p.relative_to(directory))
      for p in directory.rglob("*")
      if p.is_file()
  )


def _without_timings(tree):
  if isinstance(tree, dict):
    return {k: _without_timings(v) for k, v in tree.items() if k not in TIMINGS}
  if isinstance(tree, list):
    return [_without_timings(v) for v in tree]
  return tree


def _masked_markdown(text):
  """results.md with its measured times blanked: the total, the programs' wall and
  compile seconds."""
  lines = []
  for line in re.sub(r"Total \d+ s", "Total _ s", text).splitlines():
    if line.startswith(("| tune |", "| report |")):
      cells = line.split("|")
      cells[6:8] = [" _ ", " _ "]  # wall s, compile s
      line = "|".join(cells)
    lines.append(line)
  return lines


def _events(run):
  """The events of a TensorBoard run directory's event files, their wall times set to 0."""
  out = []
  for path in sorted(run.glob("*tfevents*")):
    for record in event_file_loader.RawEventFileLoader(str(path)).Load():
      event = event_pb2.Event.FromString(record)
      event.wall_time = 0
      out.append(event.SerializeToString())
  return out


def test_the_command_line_and_the_library_write_the_same_files(written, tmp_path, capsys):
  by_cli, by_library = written
  names = _files(by_cli)
  assert names == _files(by_library)
  assert {"results.json", "results.md", "curves.png"} <= set(names)
  runs = {n.rsplit("/", 1)[0] for n in names if n.endswith("<events>")}
  report = {f"report/easgd/seed_{s}" for s in (100, 101, 102)}
  tune = {f"tune/easgd/lr_{lr:g}/seed_{s}" for lr in (0.1, 0.3) for s in (0, 1, 2)}
  assert runs == report | tune
  cli_json, library_json = (json.loads((d / "results.json").read_text()) for d in written)
  assert _without_timings(cli_json) == _without_timings(library_json)
  cli_md, library_md = ((d / "results.md").read_text() for d in written)
  assert _masked_markdown(cli_md) == _masked_markdown(library_md)
  assert (by_cli / "curves.png").read_bytes() == (by_library / "curves.png").read_bytes()
  for run in runs:
    assert _events(by_cli / run) == _events(by_library / run), run
    assert len(_events(by_cli / run)) > 3  # the version, session start, hparams, points
  # --report-only rewrites the files made from results.json, through the same writer
  before = {n: (by_cli / n).read_bytes() for n in ("results.json", "results.md", "curves.png")}
  assert cli.main(["protocol", "--workdir", str(by_cli), "--report-only"]) == 0
  assert _files(by_cli) == names
  assert {n: (by_cli / n).read_bytes() for n in before} == before
  for run in runs:
    assert _events(by_cli / run) == _events(by_library / run), run
  # a results.json edited by hand: one line, exit 2, nothing rewritten
  edited = tmp_path / "edited"
  shutil.copytree(by_library, edited)
  results = json.loads((edited / "results.json").read_text())
  for change in ({"select_metric": "bogus"}, {"select_metric": None, "select_better": None}):
    (edited / "results.json").write_text(
        json.dumps({**results, "protocol": {**results["protocol"], **change}})
    )
    before = {p: p.read_bytes() for p in edited.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert cli.main(["protocol", "--workdir", str(edited), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("easgd: error: '") and err.count("\n") == 1, err
    assert "is not the results of a protocol run as written (KeyError: " in err
    assert {p: p.read_bytes() for p in edited.rglob("*") if p.is_file()} == before


def never(*args, **kwargs):
  raise AssertionError("a program ran")


def test_settings_a_loss_only_task_cannot_use_are_refused_before_anything_compiles(
    monkeypatch, tmp_path, capsys
):
  monkeypatch.setattr(protocol, "run_program", never)
  base = TrainConfig(
      num_epochs=1, global_batch_size=64, num_workers=2, validation_examples=128, progress=False
  )
  config = ProtocolConfig(
      "r", "", base, (Arm("easgd", "easgd", dict(tau=2), (0.1, 0.3)),), eval_every_steps=4
  )
  for changes, message in (
      (
          dict(select_metric="error"),
          r"select_metric 'error': the task's evaluate returns \['abs_error', 'loss'\] \(the "
          r"error is 1 - the mean of a per-example 'correct'\); allowed: 'abs_error', 'loss'$",
      ),
      (
          dict(select_metric="mae", select_better="lower"),
          r"select_metric 'mae': .* allowed: 'abs_error', 'loss'$",
      ),
      (
          dict(targets=(0.5,)),
          r"targets \(0.5,\): the times to a target test error need a per-example 'correct', "
          r"which the task's evaluate \(\['abs_error', 'loss'\]\) does not give; allowed: targets "
          r"None$",
      ),
      (dict(networks=(Network(),)), r"networks \(Network\(.*allowed: networks None$"),
  ):
    with pytest.raises(ProtocolError, match=message) as e:
      protocol.run_protocol(
          dataclasses.replace(config, **changes),
          tmp_path / "w",
          log=lambda line: None,
          task=regression_task(640, 200),
      )
    assert "\n" not in str(e.value)
    assert not (tmp_path / "w").exists()
  # a task's own metric named "error" (the protocol's name for 1 - mean "correct"), no "correct"
  task = regression_task(640, 200)
  own_error = dataclasses.replace(
      task, evaluate=lambda p, b: {**task.evaluate(p, b), "error": task.evaluate(p, b)["loss"]}
  )
  with pytest.raises(ProtocolError, match=r"among them 'error', the name the protocol keeps"):
    protocol.run_protocol(config, tmp_path / "w", log=lambda line: None, task=own_error)
  assert not (tmp_path / "w").exists()
  # refused whatever the task: a direction that is not stated or not read
  for changes, message in (
      (dict(select_metric="mae"), "select_metric 'mae' needs its direction: select_better"),
      (dict(select_better="higher"), "select_better 'higher' without select_metric"),
      (dict(select_metric="loss", select_better="higher"), "a lower loss is better"),
      (dict(select_metric="x", select_better="up"), "unknown select_better 'up'"),
      (dict(select_metric="correct"), "allowed: select_metric 'error'"),
      (dict(select_metric=""), "select_metric must be a metric's name"),
  ):
    with pytest.raises(ProtocolError, match=message):
      dataclasses.replace(config, **changes).validate()
  with pytest.raises(ProtocolError, match="group_by 'num_workers' without a workdir"):
    protocol.run_protocol(config, group_by="num_workers", task=regression_task(640, 200))
  # from the command line: one line, exit 2, no workdir
  (tmp_path / "proto.py").write_text(PROTOCOL_FILE.format(extra=", targets=(0.5,)"))
  workdir = tmp_path / "out"
  assert (
      cli.main(["protocol", "--config", str(tmp_path / "proto.py"), "--workdir", str(workdir)]) == 2
  )
  err = capsys.readouterr().err
  assert err.startswith("easgd: error: targets (0.5,): the times to a target test error")
  assert err.count("\n") == 1 and not workdir.exists()
  workdir.mkdir()
  (workdir / "report").write_text("")  # where the TensorBoard runs go
  assert (
      cli.main(["protocol", "--config", str(tmp_path / "proto.py"), "--workdir", str(workdir)]) == 2
  )
  assert "report' exists and is not a directory; the protocol writes" in capsys.readouterr().err


def closeness_task():
  """Gradient descent on 0.5 (w - 1)^2 from w = 0 (the batch is not read): after T
  steps at rate lr, w = 1 - (1 - lr)^T, so lr = 1 lands on 1 exactly. ``evaluate``
  gives the loss and ``closeness`` exp(-(w - 1)^2), better higher; no ``correct``."""

  def evaluate(params, batch):
    d2 = jnp.sum((params["w"] - 1.0) ** 2)
    b = batch.shape[0]
    return {"loss": jnp.full((b,), 0.5 * d2), "closeness": jnp.full((b,), jnp.exp(-d2))}

  rows = np.zeros((80, 1), np.float32)
  return Task(
      "closeness",
      lambda key: {"w": jnp.zeros(1)},
      lambda params, batch, key: jnp.mean(evaluate(params, batch)["loss"]),
      evaluate,
      rows,
      rows[:20],
      mean_of_examples=True,
  )


@pytest.mark.parametrize("better, chosen", [("higher", 1.0), ("lower", 0.25)])
def test_the_rates_are_chosen_on_the_named_metric_in_its_stated_direction(better, chosen):
  base = TrainConfig(
      num_epochs=1, global_batch_size=8, num_workers=2, validation_examples=16, progress=False
  )  # 8 steps of gradient descent (pmean SGD of a batch that is not read)
  config = ProtocolConfig(
      "closeness",
      "",
      base,
      (Arm("gd", "pmean_sgd", {}, (0.25, 0.5, 1.0)),),
      eval_every_steps=4,
      max_grid_extensions=0,
      select_metric="closeness",
      select_better=better,
  )
  results = protocol.run_protocol(config, log=lambda line: None, task=closeness_task())
  assert results["protocol"]["select_metric"] == "closeness"
  arm = results["arms"]["gd"]
  want = {lr: np.exp(-(((1 - lr) ** 8) ** 2)) for lr in (0.25, 0.5, 1.0)}  # w_8 = 1 - (1 - lr)^8
  for rate in arm["tuning"]:
    assert rate["val_closeness_final"] == pytest.approx([want[rate["learning_rate"]]] * 3, rel=1e-5)
  assert arm["chosen_learning_rate"] == chosen
  # reported: the chosen metric and the loss, each at the evaluation with the best closeness
  final = np.exp(-(((1 - chosen) ** 8) ** 2))
  assert arm["final_test_closeness"]["mean"] == pytest.approx(final, rel=1e-5)
  assert arm["final_test_loss"]["mean"] == pytest.approx(0.5 * (1 - chosen) ** 16, abs=1e-6)
  best_step = 4 if better == "higher" else 0  # from exp(-1) at step 0; lr 1: 1 from step 1
  assert arm["best_val_steps"] == [best_step] * 3
  assert arm["test_closeness_at_best_val_by_seed"] == pytest.approx(
      [final if best_step else np.exp(-1.0)] * 3, rel=1e-5
  )
  assert "| final test closeness | test closeness at best val |" in report.results_markdown(results)
