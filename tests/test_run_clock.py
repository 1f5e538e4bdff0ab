"""The run's training clock (times.jsonl), dense evaluation and the time to a target error."""

import json
import shutil
import sys

import pytest

from easgd import cli
from easgd.run import checkpoint, compare, rundir, timing, trainer
from easgd.settings.config import ConfigError, TrainConfig

from testutil import TINY_DIGITS, regression_task

# digits, tiny MLP: 1438 training images / 64 = 22 steps per epoch, 2 epochs (44 steps)
TINY = TINY_DIGITS
DENSE = TINY.replace(eval_every_steps=10)
# every 10 steps and at the epoch ends (22, 44); none repeated
DENSE_STEPS = [0, 10, 20, 22, 30, 40, 44]


def lines(path):
  return [json.loads(l) for l in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def dense_run(tmp_path_factory):
  work = tmp_path_factory.mktemp("dense") / "full"
  trainer.train_and_evaluate(DENSE, work)
  return work


def old_evaluation_steps(config, steps_per_epoch, up_to_step):
  """``rundir.evaluation_steps`` before eval_every_steps (epoch ends only)."""
  return [0] + [
      e * steps_per_epoch
      for e in range(1, up_to_step // steps_per_epoch + 1)
      if e % config.eval_every_epochs == 0 or e == config.num_epochs
  ]


def test_times_has_one_record_per_evaluation_and_the_clock_runs(dense_run):
  metrics, times = lines(dense_run / "metrics.jsonl"), lines(dense_run / "times.jsonl")
  assert [r["step"] for r in metrics] == DENSE_STEPS == [t["step"] for t in times]
  assert rundir.evaluation_steps(DENSE, 22, 44) == DENSE_STEPS
  # completed epochs: an int at an epoch's end, step / 22 (6 digits) inside one
  assert [r["epoch"] for r in metrics] == [0, 0.454545, 0.909091, 1, 1.363636, 1.818182, 2]
  assert [type(r["epoch"]) for r in metrics[2:4]] == [float, int]
  seconds = [t["time_s"] for t in times]
  assert seconds[0] == 0.0 and seconds == sorted(seconds) and seconds[-1] > 0
  assert all(set(t) == {"step", "time_s"} for t in times)


@pytest.mark.parametrize("every_epochs,epochs", [(1, 2), (2, 5), (3, 7), (1, 1)])
def test_without_eval_every_steps_the_evaluations_are_the_epoch_ends(every_epochs, epochs):
  config = TINY.replace(eval_every_epochs=every_epochs, num_epochs=epochs)
  for spe in (1, 7, 22):
    for up_to in (0, spe - 1, spe, 3 * spe + 2, epochs * spe):
      assert rundir.evaluation_steps(config, spe, up_to) == old_evaluation_steps(config, spe, up_to)
  # dense: the multiples of 5 and the epoch ends, each once
  dense = config.replace(eval_every_steps=5)
  assert rundir.evaluation_steps(dense, 7, 21) == (
      [0, 5, 7, 10, 14, 15, 20, 21]
      if every_epochs == 1
      else [0, 5, 10, 14, 15, 20]
      if every_epochs == 2
      else [0, 5, 10, 15, 20, 21]
  )
  assert rundir.record_epoch(14, 7) == 2 and rundir.record_epoch(5, 7) == 0.714286


def test_a_resumed_dense_run_has_the_same_metrics_and_its_clock_goes_on(tmp_path, dense_run):
  cut = tmp_path / "cut"
  trainer.train_and_evaluate(DENSE, cut, stop_after_steps=15)  # past the step-10 record
  first = lines(cut / "times.jsonl")
  assert [t["step"] for t in first] == [0, 10]
  trainer.train_and_evaluate(DENSE, cut, resume=True, stop_after_steps=33)
  second = lines(cut / "times.jsonl")
  assert second[:2] == first  # the earlier clock kept
  (cut / "times.jsonl").unlink()  # lost: the resume goes on, those times unknown
  trainer.train_and_evaluate(DENSE, cut, resume=True)
  assert (cut / "metrics.jsonl").read_text() == (dense_run / "metrics.jsonl").read_text()
  times = lines(cut / "times.jsonl")
  assert [t["step"] for t in times] == DENSE_STEPS
  assert [t["time_s"] for t in times[:5]] == [None] * 5  # steps 0-30, before the checkpoint 33
  # the clock goes on from the checkpoint's (33), past the records of the second invocation
  assert second[-1]["step"] == 30 and times[5]["time_s"] >= second[-1]["time_s"]
  assert times[6]["time_s"] >= times[5]["time_s"]


def test_a_checkpoint_saved_before_the_clock_resumes_with_the_clock_at_0(tmp_path, dense_run):
  work = tmp_path / "old"
  trainer.train_and_evaluate(DENSE, work, stop_after_steps=25)
  ckpt = checkpoint.Checkpointer(work)
  tree = ckpt.restore()
  assert float(tree.pop("train_seconds")) > 0
  shutil.rmtree(work / checkpoint.CHECKPOINT_DIR / "25")
  ckpt.save(25, tree)  # as runtime "spmd" saved it before it kept its clock
  ckpt.close()
  (work / "times.jsonl").unlink()
  trainer.train_and_evaluate(DENSE, work, resume=True)
  assert (work / "metrics.jsonl").read_text() == (dense_run / "metrics.jsonl").read_text()
  times = lines(work / "times.jsonl")
  assert [t["time_s"] for t in times[:4]] == [None] * 4  # steps 0-22: unknown
  assert 0 <= times[4]["time_s"] <= times[5]["time_s"] <= times[6]["time_s"]


def test_the_real_runtimes_clock_is_their_records_wall_time(tmp_path):
  config = TINY.replace(
      algorithm="async_easgd", tau=2, beta=0.9, runtime="threads", num_epochs=1, eval_every_steps=10
  )
  trainer.train_and_evaluate(config, tmp_path)
  metrics, times = lines(tmp_path / "metrics.jsonl"), lines(tmp_path / "times.jsonl")
  assert [r["step"] for r in metrics] == [0, 10, 20, 22] == [t["step"] for t in times]
  assert [r["epoch"] for r in metrics] == [0, 0.454545, 0.909091, 1]
  assert [t["time_s"] for t in times] == [r["wall_time_s"] for r in metrics]


def test_time_to_target_is_the_first_record_at_or_below_the_target():
  # errors 0.9, 0.5, 0.3 (1 - 0.7 is 0.30000000000000004 in floats), 0.2, 0.25
  history = [
      dict(step=s, test_accuracy=a)
      for s, a in [(0, 0.1), (10, 0.5), (20, 0.7), (30, 0.8), (40, 0.75)]
  ]
  times = [dict(step=s, time_s=t) for s, t in [(0, 0.0), (10, 1.5), (20, 3.0), (30, 4.5), (40, 6)]]
  reach = timing.time_to_target
  assert reach(history, times, 0.5) == dict(step=10, time_s=1.5, bracket_s=0.0)
  assert reach(history, times, 0.3) == dict(step=20, time_s=3.0, bracket_s=1.5)
  assert reach(history, times, 0.25) == dict(step=30, time_s=4.5, bracket_s=3.0)
  assert reach(history, times, 0.95) == dict(step=0, time_s=0.0, bracket_s=0.0)
  assert reach(history, times, 0.1) == dict(step=None, time_s=None, bracket_s=None)
  unknown = [dict(t, time_s=None) if t["step"] < 20 else t for t in times]
  assert reach(history, unknown, 0.3) == dict(step=20, time_s=3.0, bracket_s=None)
  with pytest.raises(ValueError, match="step 0 has no test_accuracy"):
    reach([dict(step=0, test_loss=1.0)], times[:1], 0.5)
  with pytest.raises(ValueError, match=r"target_error must be a number in \(0, 1\), got 1"):
    reach(history, times, 1)
  with pytest.raises(ValueError, match="do not match the metrics' steps"):
    reach(history, times[:4], 0.5)


def test_compare_gives_each_runs_time_to_target(tmp_path):
  config = TINY.replace(num_epochs=1, eval_every_steps=11)
  rows = compare.compare(config, tmp_path, ["pmean_sgd"], target_error=0.5)
  run = tmp_path / "pmean_sgd"
  expected = timing.time_to_target(lines(run / "metrics.jsonl"), timing.read_times(run), 0.5)
  assert expected["step"] in (0, 11, 22)  # digits: an error of 0.5 within one epoch
  row = rows[0]
  assert row["target_error"] == 0.5
  assert row["time_to_target_s"] == expected["time_s"]
  assert row["time_to_target_step"] == expected["step"]
  assert row["time_to_target_bracket_s"] == expected["bracket_s"]
  assert json.loads((tmp_path / "results.json").read_text())["rows"][0] == row
  table = (tmp_path / "results.md").read_text()
  assert "| time to 0.5 error (s) | at step |" in table


@pytest.mark.parametrize(
    "value,message",
    [
        (-1, "eval_every_steps (global steps) must be an integer in [0, 1073741824], got -1"),
        (1.5, "eval_every_steps (global steps) must be an integer in [0, 1073741824], got 1.5"),
    ],
)
def test_bad_eval_every_steps_is_one_line(value, message):
  with pytest.raises(ConfigError) as info:
    TINY.replace(eval_every_steps=value).validate()
  assert str(info.value) == message


def run_cli(argv, capsys):
  with pytest.raises(SystemExit) as exit_info:
    sys.exit(cli.main(argv))
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("easgd: error: ")
  return err


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["train", "--eval-every-steps", "-3"],
            "eval_every_steps (global steps) must be an integer in [0, ",
        ),
        (["compare", "--target-error", "1.5"], "target_error must be a finite real in (0, 1)"),
        (["compare", "--target-error", "0"], "target_error must be a finite real in (0, 1)"),
        (["compare", "--target-error", "x"], "argument --target-error: invalid float value"),
    ],
)
def test_bad_values_on_the_command_line_are_one_line_exit_2(flags, message, tmp_path, capsys):
  err = run_cli([flags[0], "--workdir", str(tmp_path / "w"), *flags[1:]], capsys)
  assert message in err
  assert not (tmp_path / "w" / "metrics.jsonl").exists()


def test_a_target_error_needs_a_task_with_accuracy(tmp_path):
  with pytest.raises(
      ConfigError, match="needs a task with test accuracy.*evaluates abs_error, loss"
  ):
    compare.compare(
        TrainConfig(num_workers=4, global_batch_size=32, num_epochs=1, progress=False),
        tmp_path,
        ["pmean_sgd"],
        target_error=0.1,
        task=regression_task(),
    )
  assert not (tmp_path / "pmean_sgd" / "metrics.jsonl").exists()
