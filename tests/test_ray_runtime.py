"""The Ray runtime: workers and the center as actors of a local Ray with 2 CPUs.

A worker whose process is killed (it exits before its local step 7) is
restarted by Ray and from the current center, at its clock after its last
exchange; the other workers never stop and the run finishes. The whole log
(exchanges, the fault and the restart) replays the final checkpoint bit for
bit in this process, and each worker exchanged at exactly its due local steps.
A run interrupted right after a checkpoint resumes with the faults and
restarts its log holds.
A cluster address that cannot be reached is one line, exit status 3. Starting a local
Ray from a process where JAX runs prints nothing.
"""

import os
import subprocess
import sys

import jax
import pytest
from test_real_async import TINY, P, assert_bitwise, replays_its_checkpoint, restore

from easgd import cli
from easgd.run import checkpoint, trainer
from easgd.runtimes import async_runs, ray_actors, shared, training_run

from testutil import interrupt_once

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.own_process]  # Ray in the process: tests/conftest.py


@pytest.fixture(scope="module")
def local_ray():
  ray.init(num_cpus=2, include_dashboard=False)
  yield
  ray.shutdown()


def test_an_unreachable_cluster_is_one_line_and_exit_status_3(tmp_path, capsys):
  # first in this file: connect() reuses a Ray this process has already started
  assert not ray.is_initialized()
  status = cli.main(
      [
          "train",
          "--workdir",
          str(tmp_path / "w"),
          "--runtime",
          "ray",
          "--algorithm",
          "async_easgd",
          "--ray-address",
          "127.0.0.1:1",
          "--dataset",
          "digits",
          "--model",
          "mlp",
      ]
  )
  err = capsys.readouterr().err
  assert status == 3 and err.count("\n") == 1
  assert err.startswith("easgd: error: cannot reach the Ray cluster at '127.0.0.1:1'")
  with pytest.raises(ray_actors.distributed.StartupError):
    ray_actors.connect("ray://127.0.0.1:1")


def test_a_killed_worker_is_restarted_from_the_center_and_the_run_replays(tmp_path, local_ray):
  cfg = TINY.replace(runtime="ray", worker_delays=())
  s = trainer.train_and_evaluate_async(cfg, tmp_path, faults={2: 7})
  assert s["status"] == "complete" and s["steps_done"] == 44
  assert s["layout"] == "4 workers = 4 Ray actors [local Ray, ray; evaluation: pmap]"
  (fault,) = s["faults"]
  assert fault["worker"] == 2 and "process died" in fault["error"]
  assert fault["restarted_at"] == fault["local_step"] >= 7  # after its last exchange
  log = shared.read_log(tmp_path / "exchanges.jsonl")
  events = [(r["event"], r["worker"], r["local_step"]) for r in log if r["event"] != "exchange"]
  assert events == [("fault", 2, fault["local_step"]), ("restart", 2, fault["local_step"])]
  run = training_run.Run(cfg)
  final = restore(tmp_path, run)
  clocks = final["worker"].clock.tolist()
  assert sum(clocks) == 44 * P
  for i, n in enumerate(clocks):  # no exchange repeated or lost by the restart
    assert [r["local_step"] for r in log if r["event"] == "exchange" and r["worker"] == i] == list(
        range(0, n, 2)
    )
  # four worker processes and the center's, replayed here: the same bits
  out = shared.replay_run(async_runs.make_setup(run), log, clocks)
  assert_bitwise(jax.device_get(out.workers), shared.unstack_workers(final["worker"], P))
  assert_bitwise(out.shared.center, final["shared"].center)
  assert s["final"]["test_accuracy"] > 0.8


def test_workers_behind_an_emulated_link_replay_their_checkpoint(tmp_path, local_ray):
  cfg = TINY.replace(runtime="ray", worker_delays=(), num_epochs=1)
  cfg = cfg.replace(link_rates=("1gbit",) * (P - 1) + ("10mbit",), link_latency="1ms")
  s = trainer.train_and_evaluate_async(cfg, tmp_path)
  assert s["status"] == "complete" and s["steps_done"] == 22 and not s["faults"]
  assert sum(replays_its_checkpoint(tmp_path, cfg)) == 22 * P  # the link never changes results


def test_an_interrupted_run_with_a_restart_resumes_with_its_checkpoints_faults(
    tmp_path, local_ray, monkeypatch
):
  cfg = TINY.replace(runtime="ray", worker_delays=())
  with monkeypatch.context() as m:  # Ctrl-C right after step 22's checkpoint
    fired = interrupt_once(m, checkpoint.Checkpointer, "save", 1, after=True)
    with pytest.raises(KeyboardInterrupt):
      trainer.train_and_evaluate_async(cfg, tmp_path, faults={2: 7})
  assert fired
  done = trainer.train_and_evaluate(cfg, tmp_path, resume=True)
  assert done["status"] == "complete" and done["final_step"] == 44
  assert [r["step"] for r in done["history"]] == [0, 22, 44]
  (fault,) = done["faults"]  # the earlier invocation's, as its log holds it
  assert fault["worker"] == 2 and "process died" in fault["error"]
  assert fault["restarted_at"] == fault["local_step"] >= 7
  assert done["stopped_workers"] == []
  clocks = replays_its_checkpoint(tmp_path, cfg)
  assert done["worker_local_steps"] == clocks and sum(clocks) == 44 * P


def test_a_local_ray_started_where_jax_runs_prints_nothing(tmp_path):
  """No JAX warning of Ray's forks, no notice of Ray's authentication default, none of Ray's
  info lines: a fresh process (Ray not yet imported, a home without a Ray token)."""
  code = """
import jax
jax.devices()  # JAX's backends run, as in easgd train
from easgd.runtimes import ray_actors
connection = ray_actors.connect()
connection.close()
print("closed")
"""
  env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
  env["HOME"] = str(tmp_path)
  run = subprocess.run(
      [sys.executable, "-W", "default", "-c", code],
      capture_output=True,
      text=True,
      env=env,
      timeout=300,
  )
  assert run.returncode == 0 and run.stdout == "closed\n", run.stderr[-3000:]
  assert run.stderr == ""
  assert (tmp_path / ".ray" / "auth_token").is_file()  # Ray's token authentication is on
