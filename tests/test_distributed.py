"""Multi-process training on jax.distributed: 2 processes x 2 CPU devices.

Each process is ``easgd train`` in a subprocess with its own 2 fake CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``), gloo collectives and
a coordinator on 127.0.0.1 at a free port. Its result must equal one process
with 4 devices (this pytest process, pmap backend) after 20 steps: same center,
workers and losses within float32 tolerance |a - b| <= 1e-6 + 1e-5 |b| (gloo
sums in another order than the in-process all-reduce; observed differences are
~3e-8). Killing a process mid-run must stop the other with an error in bounded
time; so must a peer that never starts (``--startup-timeout``).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from easgd.parallel import distributed
from easgd.run import checkpoint, trainer
from easgd.runtimes import training_run
from easgd.settings.config import TrainConfig

from testutil import wait_all

pytestmark = pytest.mark.slow  # every test here starts processes

STEPS = 20
CONFIG = TrainConfig(
    dataset="digits",
    model="mlp",
    num_workers=4,
    global_batch_size=64,
    num_epochs=1,
    learning_rate=0.1,
    tau=4,
    beta=0.9,
    eval_batch_size=64,
    progress=False,
)
FLAGS = [
    "--dataset",
    "digits",
    "--model",
    "mlp",
    "--num-workers",
    "4",
    "--global-batch-size",
    "64",
    "--learning-rate",
    "0.1",
    "--tau",
    "4",
    "--beta",
    "0.9",
    "--eval-batch-size",
    "64",
    "--no-progress",
    "--mapping-backend",
    "shard_map",
]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(devices=2):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  env.update(
      XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
      JAX_PLATFORMS="cpu",
      PYTHONUNBUFFERED="1",
  )
  return env


def launch(workdir: Path, extra, peer_timeout=30, heartbeat_timeout=60, devices=2, flags=FLAGS):
  """Starts 2 ``easgd train`` processes of ``devices`` fake CPU devices each;
  returns them (stdout+stderr to files)."""
  port = free_port()
  env = process_env(devices)
  procs = []
  for i in range(2):
    log = open(workdir.parent / f"{workdir.name}.p{i}.log", "w")
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "easgd.cli",
                "train",
                "--workdir",
                str(workdir),
                "--coordinator-address",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--peer-timeout",
                str(peer_timeout),
                "--heartbeat-timeout",
                str(heartbeat_timeout),
                *flags,
                *extra,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parent.parent,
        )
    )
  return procs


def log_text(workdir: Path, i: int) -> str:
  return (workdir.parent / f"{workdir.name}.p{i}.log").read_text()


def assert_same_checkpoints(multi: Path, single: Path, config: TrainConfig):
  """The multi-process run's last checkpoint equals the single-process one's
  (float32 tolerance above), after STEPS steps that moved the center."""
  got, want = (checkpoint.Checkpointer(d).restore() for d in (multi, single))
  assert int(got["step"]) == int(want["step"]) == STEPS
  for key in ("center", "worker", "shared", "epoch_losses"):
    for a, b in zip(jax.tree.leaves(got[key]), jax.tree.leaves(want[key]), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=key)
  moved = [
      np.max(np.abs(a - b))
      for a, b in zip(
          jax.tree.leaves(got["center"]), jax.tree.leaves(training_run.Run(config).init_params)
      )
  ]
  assert max(moved) > 1e-3  # 20 steps moved the center: the comparison is not vacuous


@pytest.mark.parametrize("algorithm", ["easgd", "pmean_sgd"])
def test_two_processes_equal_one_process_with_four_devices(tmp_path, algorithm):
  multi = tmp_path / "multi"
  procs = launch(multi, ["--algorithm", algorithm, "--stop-after-steps", str(STEPS)])
  # meanwhile, the reference: 1 process x 4 devices (pmap), in this process
  ref = trainer.train_and_evaluate(
      CONFIG.replace(algorithm=algorithm, num_devices=4),
      tmp_path / "single",
      stop_after_steps=STEPS,
  )
  codes = wait_all(procs, timeout=240)
  assert codes == [0, 0], log_text(multi, 0)[-3000:] + log_text(multi, 1)[-3000:]
  out = [json.loads(log_text(multi, i).strip().splitlines()[-1]) for i in range(2)]
  assert "4 device(s) x 1 vmapped worker(s) [cpu, shard_map, 2 processes]" in out[0]["layout"]
  assert out[0] == {**out[1], "wall_time_s": out[0]["wall_time_s"]}  # same run everywhere
  summary = json.loads((multi / "summary.json").read_text())
  assert summary["steps_done"] == STEPS and summary["shared_copies_equal"]
  assert summary["communication"] == ref["communication"]
  # evaluation totals summed over both processes' workers: every test example once
  assert summary["final"]["test_count"] == ref["final"]["test_count"] == 359
  assert summary["final"]["test_accuracy"] == ref["final"]["test_accuracy"]
  # process 0 alone wrote the files (no temporary files of another process left)
  assert sorted(p.name for p in multi.iterdir()) == [
      "checkpoints",
      "config.json",
      "events.out.tfevents.0000000001.easgd",
      "metrics.jsonl",
      "summary.json",
      "task.json",
      "times.jsonl",
  ]
  assert_same_checkpoints(multi, tmp_path / "single", CONFIG)


@pytest.mark.parametrize(
    "algorithm, p, D",
    [
        ("easgd", 2, 4),  # one worker per process (per node): D = the process's 4 devices
        ("pmean_sgd", 1, 8),  # one worker spanning both processes
    ],
)
def test_workers_of_several_devices_on_two_processes_equal_one_process(tmp_path, algorithm, p, D):
  """2 processes x 4 fake CPU devices against this process's 8, the same
  mesh: workers x data = 2x4 (each worker one process's devices; its
  gradient average stays inside the process, the elastic exchange crosses)
  and 1x8 (the worker's batch split over both processes' devices: each
  process places its half). 20 steps, float32 tolerance as above."""
  multi = tmp_path / "multi"
  layout_flags = ["--num-workers", str(p), "--devices-per-worker", str(D)]
  i = FLAGS.index("--num-workers")
  flags = FLAGS[:i] + FLAGS[i + 2 :] + layout_flags
  procs = launch(
      multi, ["--algorithm", algorithm, "--stop-after-steps", str(STEPS)], devices=4, flags=flags
  )
  config = CONFIG.replace(
      algorithm=algorithm, num_workers=p, devices_per_worker=D, mapping_backend="shard_map"
  )
  ref = trainer.train_and_evaluate(config, tmp_path / "single", stop_after_steps=STEPS)
  codes = wait_all(procs, timeout=240)
  assert codes == [0, 0], log_text(multi, 0)[-3000:] + log_text(multi, 1)[-3000:]
  summary = json.loads((multi / "summary.json").read_text())
  assert f"{p} workers x {D} devices each" in summary["layout"]
  assert summary["steps_done"] == STEPS and summary["shared_copies_equal"]
  assert summary["communication"] == ref["communication"]
  within = summary["communication"]["by_axis"]["within_workers"]
  assert within["all_reduces"] == STEPS and within["group_size"] == D
  assert summary["final"]["test_count"] == ref["final"]["test_count"] == 359
  assert_same_checkpoints(multi, tmp_path / "single", config)


@pytest.mark.parametrize("victim", [1, 0])
def test_killing_a_process_stops_the_other_with_an_error(tmp_path, victim):
  work = tmp_path / "run"
  procs = launch(work, ["--num-epochs", "500"], peer_timeout=4, heartbeat_timeout=30)
  try:
    deadline = time.monotonic() + 120
    while not (work / "metrics.jsonl").exists():  # both are past the first evaluation
      assert time.monotonic() < deadline, log_text(work, 0)[-3000:]
      assert all(p.poll() is None for p in procs), log_text(work, 0)[-3000:]
      time.sleep(0.2)
    time.sleep(1.0)  # in the training loop, inside collectives
    survivor = procs[1 - victim]
    assert survivor.poll() is None
    procs[victim].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    code = survivor.wait(timeout=45)
    elapsed = time.monotonic() - killed_at
    print(f"victim {victim}: the survivor stopped {elapsed:.1f} s after the kill")
  finally:
    wait_all(procs, timeout=1)
  text = log_text(work, 1 - victim)
  assert code != 0 and elapsed < 4 + 6  # peer timeout 4 s; measured 4.3 s and 0.3 s
  if victim == 1:
    # the watchdog names the lost process; exit status 3
    assert code == distributed.EXIT_PEER_LOST, text[-3000:]
    assert "easgd: error: process 1 of 2 stopped responding" in text
  else:
    # process 0 hosts the coordination service: JAX's client terminates the
    # survivor itself as soon as the service is gone (SIGABRT), naming it
    assert (
        "easgd: error: process 1 of 2 lost the coordination service" in text
        or "leader task was preempted/died" in text
    ), text[-3000:]


@pytest.mark.parametrize("victim", [0, 1])
def test_sigterm_stops_a_process_with_143_and_its_checkpoints_intact(tmp_path, victim):
  """SIGTERM to one process of a running 2-process train: it stops as by Ctrl-C
  (exit 143), not ignored (JAX's preemption notifier took SIGTERM) nor waiting
  for its peers at JAX's shutdown barrier; the other stops with an error; the
  latest checkpoint (process 0 writes them) restores."""
  work = tmp_path / "run"
  procs = launch(work, ["--num-epochs", "500"], peer_timeout=4, heartbeat_timeout=30)
  try:
    deadline = time.monotonic() + 120
    while not list((work / "checkpoints").glob("[0-9]*")):  # past epoch 1's checkpoint
      assert time.monotonic() < deadline, log_text(work, 0)[-3000:]
      assert all(p.poll() is None for p in procs), log_text(work, 0)[-3000:]
      time.sleep(0.2)
    time.sleep(1.0)  # in the training loop, inside collectives
    procs[victim].send_signal(signal.SIGTERM)
    codes = wait_all(procs, timeout=60)
  finally:
    wait_all(procs, timeout=1)
  text, other = log_text(work, victim), log_text(work, 1 - victim)
  assert codes[victim] == 143, text[-3000:]
  assert text.rstrip().splitlines()[-1] == "easgd: terminated (SIGTERM)"
  if victim == 1:  # the watchdog names the stopped process
    assert codes[0] == distributed.EXIT_PEER_LOST, other[-3000:]
    assert "easgd: error: process 1 of 2 stopped responding" in other
  else:  # its coordination service gone, JAX's client ends process 1 (SIGABRT)
    assert codes[1] != 0, other[-3000:]
  assert not (work / "summary.json").exists()
  step = int(checkpoint.Checkpointer(work).restore()["step"])
  assert step > 0 and step % 22 == 0  # an epoch's end: 1438 // 64 = 22 steps an epoch
  assert step in [json.loads(l)["step"] for l in (work / "metrics.jsonl").read_text().splitlines()]


# -- start-up: processes that never join ---------------------------------------
# JAX 0.10.2 alone: every waiting process dies by SIGABRT with a C++ stack trace
# about 5 s after jax.distributed.initialize's initialization_timeout (305 s at
# JAX's default); a taken coordinator port crashes process 0 with SIGSEGV.

STARTUP_TIMEOUT = 3  # seconds; the start-up guard fires after this


def start_process(tmp_path, process_id, port, num_processes=2):
  """``easgd train`` as one process of a run whose other processes are absent."""
  return subprocess.Popen(
      [
          sys.executable,
          "-m",
          "easgd.cli",
          "train",
          "--workdir",
          str(tmp_path / f"run{process_id}"),
          "--coordinator-address",
          f"127.0.0.1:{port}",
          "--num-processes",
          str(num_processes),
          "--process-id",
          str(process_id),
          "--startup-timeout",
          str(STARTUP_TIMEOUT),
          *FLAGS,
      ],
      env=process_env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      cwd=Path(__file__).parent.parent,
  )


def finish(proc, timeout=60):
  """(exit status, stderr) of ``proc`` within ``timeout`` s (bounded wait)."""
  try:
    _, err = proc.communicate(timeout=timeout)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  return proc.returncode, err


def assert_one_line_error(code, err, expected):
  """Exit status 3, last stderr line ``easgd: error: <expected>...``, no C++ log."""
  assert code == distributed.EXIT_PEER_LOST, err[-3000:]
  assert err.strip().splitlines()[-1].startswith("easgd: error: " + expected), err[-3000:]
  assert "stack trace" not in err and not re.search(r"^[FEW]\d{4} ", err, re.M), err[-3000:]


@pytest.mark.parametrize(
    "process_id,expected",
    [
        (0, "process 1 of 2 did not join the run within 3 s (--startup-timeout)"),
        (
            1,
            "process 1 of 2 could not reach the coordinator (process 0) at 127.0.0.1:{port} "
            "within 3 s (--startup-timeout)",
        ),
    ],
)
def test_a_process_alone_stops_naming_the_missing_one(tmp_path, process_id, expected):
  port = free_port()
  code, err = finish(start_process(tmp_path, process_id, port))
  assert_one_line_error(code, err, expected.format(port=port))
  assert not (tmp_path / f"run{process_id}").exists()  # nothing written


def test_two_of_three_processes_both_stop_naming_the_third(tmp_path):
  # Process 0 (the coordinator) stops first; process 1, still waiting to be
  # admitted, must not be aborted by JAX when the coordinator goes away.
  port = free_port()
  procs = [start_process(tmp_path, i, port, num_processes=3) for i in (0, 1)]
  (code0, err0), (code1, err1) = (finish(p) for p in procs)
  assert_one_line_error(code0, err0, "one or more of processes 1, 2 of 3 did not join")
  assert_one_line_error(
      code1,
      err1,
      f"process 1 of 3 reached the coordinator (process 0) "
      f"at 127.0.0.1:{port} but the run did not start",
  )
  assert "process 2 of 3 did not join" in err1


def test_a_taken_coordinator_port_is_a_one_line_error(tmp_path):
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    code, err = finish(start_process(tmp_path, 0, port))
  assert_one_line_error(
      code, err, f"process 0 of 2 cannot start the coordination " f"service: port {port}"
  )


def test_startup_guard_names_the_processes_that_may_be_missing():
  reports = []
  with socket.socket() as coordinator:  # a listening port stands in for process 0
    coordinator.bind(("127.0.0.1", 0))
    coordinator.listen()
    up = f"127.0.0.1:{coordinator.getsockname()[1]}"
    guard = distributed.StartupGuard(
        distributed.ProcessSetup(up, 4, 2), timeout_s=0.3, poll_s=0.05, on_timeout=reports.append
    )
    guard.start()
    guard._thread.join(10)
  assert guard.fired and not guard.cancel()
  assert reports == [
      f"process 2 of 4 reached the coordinator (process 0) at {up} but the run did not "
      f"start within 0.3 s (--startup-timeout): one or more of processes 1, 3 of 4 did "
      f"not join, or another process already uses --process-id 2"
  ]
  down = f"127.0.0.1:{free_port()}"
  guard = distributed.StartupGuard(
      distributed.ProcessSetup(down, 4, 0), timeout_s=0.3, poll_s=0.05, on_timeout=reports.append
  )
  guard.start()
  guard._thread.join(10)
  assert reports[1].startswith(
      f"process 0 of 4 could not reach its own coordination " f"service at {down}"
  )
  # cancelled in time (start-up done): it never reports
  guard = distributed.StartupGuard(
      distributed.ProcessSetup(down, 2, 1), timeout_s=0.3, poll_s=0.05, on_timeout=reports.append
  )
  guard.start()
  assert guard.cancel()
  guard._thread.join(10)
  assert len(reports) == 2 and not guard.fired


# -- settings and watchdog, without processes --------------------------------


def test_resolve_reads_flags_then_environment():
  assert distributed.resolve(env={}) is None
  assert distributed.resolve(num_processes=1, env={}) is None
  env = {
      "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
      "JAX_NUM_PROCESSES": "4",
      "JAX_PROCESS_ID": "3",
  }
  s = distributed.resolve(env=env)
  assert (s.coordinator_address, s.num_processes, s.process_id) == ("10.0.0.1:1234", 4, 3)
  s = distributed.resolve("h:1", 2, 0, env=env, peer_timeout_s=5, heartbeat_timeout_s=20.4)
  assert (s.coordinator_address, s.num_processes, s.process_id) == ("h:1", 2, 0)
  assert (s.peer_timeout_s, s.heartbeat_timeout_s) == (5, 20)
  with pytest.raises(distributed.DistributedError, match="--process-id/JAX_PROCESS_ID"):
    distributed.resolve("h:1", 2, env={})
  with pytest.raises(distributed.DistributedError, match="outside \\[0, 2\\)"):
    distributed.resolve("h:1", 2, 2, env={})
  with pytest.raises(distributed.DistributedError, match="host:port"):
    distributed.resolve("h", 2, 0, env={})
  with pytest.raises(distributed.DistributedError, match="JAX_NUM_PROCESSES must be an integer"):
    distributed.resolve(env={"JAX_NUM_PROCESSES": "two"})
  with pytest.raises(distributed.DistributedError, match="peer_timeout_s"):
    distributed.resolve("h:1", 2, 0, env={}, peer_timeout_s=0)
  # the start-up wait: well under a minute by default, fractions of a second kept
  assert distributed.resolve("h:1", 2, 0, env={}).initialization_timeout_s == 30
  s = distributed.resolve("h:1", 2, 0, env={}, initialization_timeout_s=2.5)
  assert s.initialization_timeout_s == 2.5
  for bad in (0, -1, float("inf"), float("nan")):
    with pytest.raises(
        distributed.DistributedError,
        match="initialization_timeout_s \\(--startup-timeout, seconds\\)",
    ):
      distributed.resolve("h:1", 2, 0, env={}, initialization_timeout_s=bad)
  with pytest.raises(distributed.DistributedError, match="port in \\[1, 65535\\]"):
    distributed.resolve("h:70000", 2, 0, env={})


class FakeKV:
  """The coordination service's key-value store, in memory."""

  def __init__(self):
    self.data, self.lock = {}, threading.Lock()

  def key_value_set(self, key, value, allow_overwrite=False):
    with self.lock:
      self.data[key] = value

  def key_value_try_get(self, key):
    with self.lock:
      if key not in self.data:
        raise RuntimeError(f"NOT_FOUND: {key}")
      return self.data[key]


def test_watchdog_names_the_silent_peer_and_ignores_finished_ones():
  kv, reports = FakeKV(), []
  dogs = [
      distributed.Watchdog(kv, i, 3, peer_timeout_s=0.6, interval_s=0.05, on_lost=reports.append)
      for i in range(3)
  ]
  for d in dogs:
    d.start()
  time.sleep(0.3)
  dogs[2].stop()  # finished normally: "done", not lost
  time.sleep(1.0)
  assert reports == []
  dogs[1]._stop.set()  # process 1 dies: its heartbeat stops without "done"
  assert dogs[0].wait_for_lost(3.0) is not None
  assert reports[0].startswith("process 1 of 3 stopped responding")
  dogs[0].stop()


def test_cli_rejects_incomplete_process_flags(tmp_path, capsys):
  from easgd import cli

  assert (
      cli.main(["train", "--workdir", str(tmp_path), "--num-processes", "2", "--process-id", "1"])
      == 2
  )
  err = capsys.readouterr().err
  assert err.startswith(
      "easgd: error: a multi-process run needs " "--coordinator-address/JAX_COORDINATOR_ADDRESS"
  )
  assert (
      cli.main(
          [
              "train",
              "--workdir",
              str(tmp_path),
              "--coordinator-address",
              "127.0.0.1:1",
              "--num-processes",
              "2",
              "--process-id",
              "2",
          ]
      )
      == 2
  )
  assert "process id 2 is outside [0, 2)" in capsys.readouterr().err
  assert (
      cli.main(
          [
              "train",
              "--workdir",
              str(tmp_path),
              "--coordinator-address",
              "127.0.0.1:1",
              "--num-processes",
              "2",
              "--process-id",
              "1",
              "--startup-timeout",
              "0",
          ]
      )
      == 2
  )
  assert (
      "initialization_timeout_s (--startup-timeout, seconds) must be a finite real "
      "in (0, inf), got 0.0"
  ) in capsys.readouterr().err
  assert not any(tmp_path.iterdir())  # nothing written
