"""Signals under the command line: never lost, never a crash at exit.

A signal handler's exception raised inside a garbage-collection callback (JAX
registers one), a ``__del__`` or a weakref callback is swallowed by Python
(``sys.unraisablehook``). These tests deliver SIGTERM and SIGINT exactly there,
at chosen points of ``train``, ``compare`` and ``protocol``: the command must
still stop (exit 143 / 130) and leave its files as an interrupt does.
``benchmarks/signals.py`` sends signals at random instants to whole processes.
"""

import gc
import json
import os
import signal
import sys

import pytest

from easgd import cli
from easgd._util import files
from easgd.protocol import runs
from easgd.run import rundir

SMALL = ["--dataset", "digits", "--model", "mlp", "--global-batch-size", "256", "--no-progress"]
PROTOCOL = """\
from easgd import TrainConfig
from easgd.protocol.config import Arm, ProtocolConfig
def get_protocol():
  base = TrainConfig(dataset="mnist1d", model="mlp", num_epochs=1, global_batch_size=384,
                     validation_examples=1000, progress=False)
  arms = (Arm("easgd", "easgd", {}, (0.05, 0.1)), Arm("pmean", "pmean_sgd", {}, (0.05, 0.1)))
  return ProtocolConfig("sig", "signals", base, arms, eval_every_steps=6, targets=(0.5,))
"""


def signal_inside_gc_callback(monkeypatch, owner, name, call, signum):
  """After the ``call``-th call of ``owner.name``, a garbage collection during
  which ``signum`` arrives: its handler runs inside a ``gc.callbacks`` function
  (as it can inside JAX's), where Python swallows the exception it raises.
  Returns the list of exceptions Python reported as swallowed there."""
  original = getattr(owner, name)
  calls, swallowed = [0], []

  def callback(phase, info):
    if phase == "start":
      gc.callbacks.remove(callback)
      os.kill(os.getpid(), signum)
      for _ in range(3):  # the handler runs here, at the loop's jump back
        pass

  def wrapper(*args, **kwargs):
    out = original(*args, **kwargs)
    calls[0] += 1
    if calls[0] == call:
      gc.callbacks.insert(0, callback)
      gc.collect()
    return out

  monkeypatch.setattr(owner, name, wrapper)
  monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(type(u.exc_value).__name__))
  return swallowed


@pytest.fixture
def python_signals():
  """SIGINT and SIGTERM unblocked and at their command-line defaults; restored after."""
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])
  yield
  signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
  for s, handler in handlers.items():
    signal.signal(s, handler)


# (command, the call after which the signal arrives, the signal, exit status)
CASES = [
    ("train", (rundir, "write_metrics", 2), signal.SIGTERM, 143),  # after epoch 1's record
    ("compare", (rundir, "write_metrics", 3), signal.SIGINT, 130),  # after easgd's last record
    ("protocol", (runs, "run_program", 1), signal.SIGTERM, 143),  # between programs
]


@pytest.mark.parametrize("command,point,signum,status", CASES, ids=[c[0] for c in CASES])
def test_a_signal_swallowed_inside_a_gc_callback_still_stops_the_command(
    tmp_path, monkeypatch, capsys, python_signals, command, point, signum, status
):
  work = tmp_path / "w"
  argv = [command, "--workdir", str(work)]
  if command == "train":
    argv += [*SMALL, "--num-epochs", "3"]
  elif command == "compare":
    argv += ["--algorithms", "easgd,pmean_sgd", *SMALL, "--num-epochs", "2"]
  else:
    (tmp_path / "proto.py").write_text(PROTOCOL)
    argv += ["--config", str(tmp_path / "proto.py")]
  swallowed = signal_inside_gc_callback(monkeypatch, *point, signum)
  code = cli.main(argv)
  err = capsys.readouterr().err
  expected = files.Terminated if signum == signal.SIGTERM else KeyboardInterrupt
  assert swallowed == [expected.__name__]  # the handler's exception did not propagate
  assert code == status, err[-2000:]
  last = "easgd: terminated (SIGTERM)" if status == 143 else "easgd: interrupted"
  assert err.rstrip().splitlines()[-1] == last
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
  assert files.pending_interrupt() is None
  # stopped, not finished: no summary or results; the records written are whole
  if command == "train":
    assert not (work / "summary.json").exists()
    steps = [json.loads(l)["step"] for l in (work / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 5]  # 1438 // 256 = 5 steps per epoch: step 0, epoch 1
    assert cli.main(["train", "--workdir", str(work), "--resume"]) == 0
    assert json.loads((work / "summary.json").read_text())["steps_done"] == 15
  elif command == "compare":
    assert (work / "easgd" / "summary.json").is_file()
    assert not (work / "pmean_sgd" / "summary.json").exists()
    assert not (work / "results.json").exists()
  else:
    assert not (work / "results.json").exists()
  assert not list(work.rglob(".easgd.lock*"))


def test_a_signal_amid_an_import_is_an_interrupt_not_an_import_error(monkeypatch, capsys):
  """SIGTERM while a module is half imported (the command's own imports take
  seconds): the command classifies its exception without importing anything
  more (importing the error classes would meet the half-imported module and
  fail with an AttributeError), and exits 143."""

  def terminated_amid_import(args):
    raise files.Terminated("signal 15")

  def no_import(*a):
    raise AssertionError("the error classes imported to classify a signal")

  monkeypatch.setattr(cli, "_run", terminated_amid_import)
  monkeypatch.setattr(cli, "_user_errors", no_import)
  monkeypatch.setattr(cli, "_run_errors", no_import)
  assert cli.main(["train", "--workdir", "unused"]) == 143
  assert capsys.readouterr().err == "easgd: terminated (SIGTERM)\n"


def test_a_signal_whose_exception_an_extension_turns_into_an_import_error_exits_143(
    monkeypatch, capsys
):
  """numpy's and jaxlib's extension set-up turn an exception raised inside it
  into an ImportError: with the signal recorded, the command still exits 143."""

  def import_interrupted(args):
    try:
      os.kill(os.getpid(), signal.SIGTERM)
    except files.Terminated as e:
      raise ImportError("numpy._core.multiarray failed to import") from e
    raise AssertionError("no signal arrived")

  monkeypatch.setattr(cli, "_run", import_interrupted)
  assert cli.main(["train", "--workdir", "unused"]) == 143
  assert capsys.readouterr().err == "easgd: terminated (SIGTERM)\n"
  assert files.pending_interrupt() is None  # cleared when the command ends
