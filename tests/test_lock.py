"""One workdir, one command (easgd.run.runlock): a held workdir is refused at once, in
one line naming its holder, before anything is built; a dead holder's lock is
taken over with one notice; the lock's files are no part of a run.

The fast tests hold the lock in this process (flock refuses a second open file
of the same lock, in one process as in two); the slow ones start real
``easgd`` processes. A first run is paused after its first evaluation (its
``rundir.write_metrics`` waits for a gate file) so that the second command
surely meets it running, whatever the machine's load.
"""

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from easgd import cli
from easgd.protocol import runs
from easgd.protocol.config import Arm, ProtocolConfig
from easgd.run import runlock, trainer
from easgd.run.runlock import HOLDER_FILE, LOCK_FILE, LOCK_FILES, WorkdirInUseError
from easgd.settings.config import TrainConfig
from easgd.sweeps import command

compare = importlib.import_module(
    "easgd.run.compare"
)  # the module (easgd.run.compare is its function)
ROOT = Path(__file__).resolve().parents[1]
TINY = TrainConfig(
    dataset="digits",
    model="mlp",
    num_workers=2,
    global_batch_size=64,
    num_epochs=1,
    eval_batch_size=64,
    progress=False,
)
FLAGS = [
    "--dataset",
    "digits",
    "--model",
    "mlp",
    "--num-workers",
    "2",
    "--global-batch-size",
    "64",
    "--num-epochs",
    "1",
    "--eval-batch-size",
    "64",
    "--no-progress",
]
PROTOCOL = ProtocolConfig(
    "lock",
    "a test",
    TINY.replace(dataset="mnist1d", validation_examples=200),
    (Arm("easgd", "easgd", {}, (0.1,)),),
    eval_every_steps=5,
)
SWEEP = command.SweepConfig(
    problem="quadratic", tau=(1, 4), alpha=(0.2,), num_workers=(2,), num_steps=7
)
NO_PID = 2**22 + 1  # above Linux's largest pid_max: no process has it
STARTUP_S = 600  # safety net for a loaded machine; no test asserts a time


def dead_holder(workdir: Path) -> None:
  """The files a SIGKILLed ``easgd train`` leaves: a lock nobody holds, its holder."""
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / LOCK_FILE).write_text("")
  (workdir / HOLDER_FILE).write_text(
      json.dumps(
          dict(
              pid=NO_PID,
              host="elsewhere",
              command="easgd train",
              argv=["easgd", "train", "--workdir", str(workdir)],
              started="2020-01-01T00:00:00+00:00",
          )
      )
  )


# -- in one process ------------------------------------------------------------
@pytest.mark.parametrize("runtime,algorithm", [("spmd", "easgd"), ("threads", "async_easgd")])
def test_a_held_workdir_stops_train_before_anything_is_built(
    tmp_path, monkeypatch, runtime, algorithm
):
  def never(*args, **kwargs):
    raise AssertionError("built a run in a held workdir")

  monkeypatch.setattr(trainer, "Run", never)
  config = TINY.replace(runtime=runtime, algorithm=algorithm)
  with runlock.hold_workdir(tmp_path, "train"):
    with pytest.raises(WorkdirInUseError) as e:
      trainer.train_and_evaluate(config, tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(LOCK_FILES)  # nothing written
  message = str(e.value)
  assert message.startswith(f"workdir '{tmp_path}' is in use by pid {os.getpid()} on host ")
  assert "(easgd train: " in message and message.endswith(
      "; wait for it to end or choose another workdir"
  )
  assert "\n" not in message
  assert not any(tmp_path.iterdir())  # released: the lock's files are gone


def test_a_held_workdir_stops_compare_protocol_and_sweep_before_they_start(tmp_path, monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("started in a held workdir")

  monkeypatch.setattr(compare, "train_and_evaluate", never)
  monkeypatch.setattr(runs, "SeedData", never)
  monkeypatch.setattr(command, "_run_parts", never)
  calls = {
      "compare": lambda: compare.compare(TINY, tmp_path, ["easgd", "pmean_sgd"], overwrite=True),
      "protocol": lambda: runs.run_protocol(PROTOCOL, tmp_path),
      "sweep": lambda: command.run_sweep(SWEEP, tmp_path, overwrite=True, plots=False),
  }
  with runlock.hold_workdir(tmp_path, "sweep"):
    for name, call in calls.items():
      with pytest.raises(
          WorkdirInUseError, match=rf"in use by pid {os.getpid()} .*\(easgd sweep: "
      ):
        call()
      assert sorted(p.name for p in tmp_path.iterdir()) == sorted(LOCK_FILES), name


def test_a_dead_processs_lock_is_taken_over_with_one_notice(tmp_path, capsys):
  work = tmp_path / "run"
  dead_holder(work)  # not a run's files: train starts without --overwrite
  assert cli.main(["train", "--workdir", str(work), *FLAGS]) == 0
  notices = [l for l in capsys.readouterr().err.splitlines() if "lock" in l]
  assert notices == [
      f"easgd: warning: took over the lock of workdir '{work}' from dead process {NO_PID} "
      f"on host elsewhere (easgd train: easgd train --workdir {work}, started "
      "2020-01-01T00:00:00+00:00)"
  ]
  assert json.loads((work / "summary.json").read_text())["status"] == "complete"
  assert not any((work / f).exists() for f in LOCK_FILES)  # released at the end


def test_compare_sets_aside_runs_not_a_dead_runs_lock(tmp_path):
  dead_holder(tmp_path / "easgd")  # compare killed inside its easgd run, before it wrote
  compare._set_aside_comparison(tmp_path)
  assert not (tmp_path / "previous_run").exists()  # no earlier comparison
  assert sorted(p.name for p in (tmp_path / "easgd").iterdir()) == sorted(LOCK_FILES)


# -- real processes --------------------------------------------------------------
PAUSED = """
import sys, time
from pathlib import Path
from easgd import cli
from easgd.run import rundir
gate = Path(sys.argv[1])
write = rundir.write_metrics
def paused(workdir, history):  # after the first evaluation, wait for the gate
  write(workdir, history)
  staged = gate.parent / "paused.tmp"  # renamed: the test never reads a half-written file
  staged.write_text(str(workdir))
  staged.replace(gate.parent / "paused")
  while not gate.exists():
    time.sleep(0.05)
rundir.write_metrics = paused
sys.exit(cli.main(sys.argv[2:]))
"""
HOLD = """
import sys
from easgd.run import runlock
with runlock.hold_workdir(sys.argv[1], "train"):
  print("held", flush=True)
  sys.stdin.readline()
"""


def env():
  out = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return dict(
      out,
      XLA_FLAGS="--xla_force_host_platform_device_count=2",
      JAX_PLATFORMS="cpu",
      PYTHONUNBUFFERED="1",
  )


def start(code, *args, **kwargs):
  return subprocess.Popen(
      [sys.executable, "-c", code, *map(str, args)], env=env(), cwd=ROOT, text=True, **kwargs
  )


def easgd(*argv):
  """Runs ``python -m easgd.cli ARGV`` to its end: (exit status, stderr)."""
  done = subprocess.run(
      [sys.executable, "-m", "easgd.cli", *map(str, argv)],
      env=env(),
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=STARTUP_S,
  )
  return done.returncode, done.stderr


def wait_paused(first, tmp_path):
  deadline = time.monotonic() + STARTUP_S
  while not (tmp_path / "paused").exists():
    assert first.poll() is None, first.communicate()
    assert time.monotonic() < deadline, "the first run never reached its first evaluation"
    time.sleep(0.1)


def finish(first, tmp_path):
  (tmp_path / "gate").write_text("")
  out, err = first.communicate(timeout=STARTUP_S)
  assert first.returncode == 0, err
  return out


def assert_refused(code, err, workdir, pid, verb):
  assert code == 2 and err.count("\n") == 1, err
  assert err.startswith(
      f"easgd: error: workdir '{workdir}' is in use by pid {pid} on " f"host "
  ), err
  assert f"(easgd {verb}: " in err, err


@pytest.mark.slow
def test_a_second_train_on_a_running_workdir_exits_2_and_the_first_completes(tmp_path):
  work = tmp_path / "run"
  first = start(
      PAUSED,
      tmp_path / "gate",
      "train",
      "--workdir",
      work,
      *FLAGS,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
  )
  try:
    wait_paused(first, tmp_path)
    config = (work / "config.json").read_text()
    # the most destructive second command: --overwrite would set the first run aside
    code, err = easgd("train", "--workdir", work, *FLAGS, "--overwrite")
    assert_refused(code, err, work, first.pid, "train")
    assert f"--workdir {work}" in err  # the holder's command line
    assert not (work / "previous_run").exists()
    summary = json.loads(finish(first, tmp_path).splitlines()[-1])
  finally:
    first.kill()
  assert summary["status"] == "complete"
  assert (work / "config.json").read_text() == config
  saved = json.loads((work / "summary.json").read_text())
  assert saved["steps_done"] == saved["total_steps"] > 0
  assert sorted(p.name for p in work.iterdir()) == [
      "checkpoints",
      "config.json",
      "events.out.tfevents.0000000001.easgd",
      "metrics.jsonl",
      "summary.json",
      "task.json",
      "times.jsonl",
  ]  # lock released


@pytest.mark.slow
def test_a_second_compare_and_a_train_into_its_run_exit_2(tmp_path):
  work = tmp_path / "cmp"
  first = start(
      PAUSED,
      tmp_path / "gate",
      "compare",
      "--workdir",
      work,
      "--algorithms",
      "easgd,pmean_sgd",
      *FLAGS,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
  )
  try:
    wait_paused(first, tmp_path)  # inside its easgd run
    assert (tmp_path / "paused").read_text() == str(work / "easgd")
    code, err = easgd(
        "compare", "--workdir", work, "--algorithms", "easgd,pmean_sgd", *FLAGS, "--overwrite"
    )
    assert_refused(code, err, work, first.pid, "compare")
    code, err = easgd("train", "--workdir", work / "easgd", *FLAGS, "--overwrite")
    assert_refused(code, err, work / "easgd", first.pid, "train")
    finish(first, tmp_path)
  finally:
    first.kill()
  rows = json.loads((work / "results.json").read_text())["rows"]
  assert len(rows) == 2
  assert not any(
      (d / f).exists() for d in (work, work / "easgd", work / "pmean_sgd") for f in LOCK_FILES
  )


@pytest.mark.slow
def test_protocol_and_sweep_refuse_a_held_workdir_and_take_over_a_killed_holder(tmp_path):
  work = tmp_path / "w"
  holder = start(HOLD, work, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  try:
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(WorkdirInUseError, match=rf"in use by pid {holder.pid} on host "):
      runs.run_protocol(PROTOCOL, work)
    with pytest.raises(WorkdirInUseError, match=rf"in use by pid {holder.pid} on host "):
      command.run_sweep(SWEEP, work, plots=False)
    holder.send_signal(signal.SIGKILL)  # the OS drops its flock; its holder file stays
    holder.wait(timeout=STARTUP_S)
  finally:
    holder.kill()
  assert sorted(p.name for p in work.iterdir()) == sorted(LOCK_FILES)
  with pytest.warns(runlock.WorkdirLockWarning) as caught:
    command.run_sweep(SWEEP, work, plots=False)
  notices = [str(w.message) for w in caught if w.category is runlock.WorkdirLockWarning]
  assert len(notices) == 1
  assert notices[0].startswith(
      f"took over the lock of workdir '{work}' from dead process {holder.pid} on host "
      f"{socket.gethostname()} (easgd train: -c {work}, started "
  )
  assert sorted(p.name for p in work.iterdir()) == ["sweep.csv", "sweep.json", "sweep_config.json"]
