"""Progress off a terminal: one plain line per epoch (easgd._util.progress)."""

import io

from easgd._util import progress
from easgd.run.trainer import train_and_evaluate

from testutil import TINY_DIGITS

TINY = TINY_DIGITS.replace(tau=3, eval_batch_size=32, progress=True)


class Terminal(io.StringIO):

  def isatty(self):
    return True


def test_a_terminal_gets_a_bar_and_a_file_gets_lines():
  assert isinstance(progress.progress_bar(10, 5, file=Terminal()), progress.tqdm)
  assert isinstance(progress.progress_bar(10, 5, file=io.StringIO()), progress.EpochLines)


def test_lines_in_chunks_with_evaluations_every_other_epoch():
  # 3 epochs of 4 steps; updates arrive in chunks (the asynchronous loop's way);
  # epochs 2 and 3 are evaluated, epoch 1 is not: its line comes without metrics
  out = io.StringIO()
  bar = progress.progress_bar(12, 4, desc="x", file=out)
  bar.update(3)
  bar.update(1)  # epoch 1 ends: no evaluation follows
  bar.update(4)  # epoch 1's line, then epoch 2 ends
  bar.set_postfix(test_acc="0.5000", refresh=False)
  bar.update(4)  # epoch 3 ends
  bar.set_postfix(test_acc="0.7500", refresh=False)
  bar.close()
  assert out.getvalue().splitlines() == [
      "x: epoch 1/3 step 4/12",
      "x: epoch 2/3 step 8/12 test_acc 0.5000",
      "x: epoch 3/3 step 12/12 test_acc 0.7500",
  ]


def test_a_resumed_run_and_one_update_over_two_epochs():
  out = io.StringIO()
  bar = progress.progress_bar(12, 4, initial=2, file=out)
  bar.update(7)  # epochs 1 and 2 end in one update (step 9)
  bar.close()
  assert out.getvalue().splitlines() == ["epoch 1/3 step 4/12", "epoch 2/3 step 8/12"]
  silent = io.StringIO()
  bar = progress.progress_bar(12, 4, disable=True, file=silent)
  bar.update(12)
  bar.close()
  assert silent.getvalue() == ""


def test_training_with_stderr_not_a_terminal_prints_one_line_per_epoch(tmp_path, capsys):
  summary = train_and_evaluate(TINY, tmp_path)
  err = capsys.readouterr().err
  total = summary["total_steps"]
  lines = [l for l in err.splitlines() if l.startswith("easgd p=4:")]
  assert len(lines) == 2, err
  for epoch, (line, rec) in enumerate(zip(lines, summary["history"][1:]), start=1):
    assert line == (
        f"easgd p=4: epoch {epoch}/2 step {rec['step']}/{total} "
        f"test_acc {rec['test_accuracy']:.4f}"
    )
  assert "\r" not in err
