"""A real slow link (easgd.parallel.link, ``easgd link``): parsing, bad input, teardown, results.

The namespace tests need root, ``ip`` and ``tc`` (CI has them: it runs as root on this kind
of machine); they are skipped, naming the reason, only where ``link.unavailable()`` says
namespaces cannot be made. A run across a link shaped to 20 Mbit/s must give the same
checkpoint (center, workers, losses), bit for bit, as the same 2-process run on loopback:
the link changes time, never results.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from easgd import cli
from easgd.parallel import link

from testutil import wait_all

ROOT = Path(__file__).resolve().parents[1]
needs_namespaces = pytest.mark.skipif(
    link.unavailable() is not None, reason=f"no network namespaces: {link.unavailable()}"
)
RATE_UNITS = "bit, kbit, mbit, gbit, tbit, kibit, mibit, gibit, tibit, bps, kbps, mbps, gbps, tbps"
TRAIN = ["train", "--workdir", "W"]


def nothing_left(pid: int) -> None:
  """No namespace, link or /etc/netns entry of a link made by process ``pid``
  (their names hold ``ez<pid><letter>``)."""
  ours = re.compile(f"ez{pid}[a-z]")
  spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
  assert not ours.search(spaces) and not ours.search(links), spaces + links
  assert not [p for p in link.NETNS_DIR.glob("*") if ours.search(p.name)]


def test_rates_latencies_and_bursts_parse_to_exact_values():
  got = link.Link.parse("100mbit", "5ms", "64kb")
  assert got == link.Link(rate_bit_s=100_000_000, latency_s=0.005, burst_bytes=65536)
  assert got.tbf() == [
      "tbf", "rate", "100000000bit", "burst", "65536b", "latency", "5000us",
  ]  # fmt: skip
  assert link.Link.parse("1gbit").rate_bit_s == 10**9
  assert link.Link.parse("10Mbit").rate_bit_s == 10**7
  assert link.Link.parse("1.5kibit").rate_bit_s == 1536
  assert link.Link.parse("2mbps").rate_bit_s == 16_000_000  # bytes/s, as tc spells it
  assert link.Link.parse("1gbit", "1msec").latency_s == 0.001
  assert link.Link.parse("1gbit", "250us").latency_s == 0.00025
  assert link.Link.parse("1gbit", "1s").latency_s == 1.0
  # defaults: 50 ms of queue, a burst of 1 ms at the rate but at least 16 KiB
  assert link.Link.parse("1gbit") == link.Link(10**9, 0.05, 125_000)
  assert link.Link.parse("10mbit") == link.Link(10**7, 0.05, 16384)


@pytest.mark.parametrize(
    "rate, latency, burst, expected",
    [
        ("10", None, None, f"--rate '10' is not a rate: a positive number (at least 1bit) "
         f"with a unit, one of {RATE_UNITS} (e.g. 100mbit, 1gbit)"),
        ("0mbit", None, None, "--rate '0mbit' is not a rate"),
        ("-5mbit", None, None, "--rate '-5mbit' is not a rate"),
        ("10mbits", None, None, "--rate '10mbits' is not a rate"),
        ("1e999gbit", None, None, "--rate '1e999gbit' is not a rate"),
        ("1gbit", "0ms", None, "--latency '0ms' is not a latency: a positive number (at least "
         "1us) with a unit, one of s, sec, secs, ms, msec, msecs, us, usec, usecs (e.g. 5ms)"),
        ("1gbit", "5", None, "--latency '5' is not a latency"),
        ("1gbit", "5ms", "64", "--burst '64' is not a size: a positive number (at least 1b) "
         "with a unit, one of b, k, kb, m, mb, g, gb (e.g. 64kb)"),
    ],
)  # fmt: skip
def test_a_bad_rate_latency_or_burst_is_one_line_naming_it(rate, latency, burst, expected):
  with pytest.raises(link.LinkError) as e:
    link.Link.parse(rate, latency, burst)
  assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def cli_link(capsys, *args):
  """(status, stderr) of ``easgd link ARGS`` in this process."""
  status = cli.main(["link", *args])
  return status, capsys.readouterr().err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--rate", "10", "--num-processes", "2", "--", *TRAIN], "--rate '10' is not a rate:"),
        (
            ["--rate", "1gbit", "--latency", "0ms", "--num-processes", "2", "--", *TRAIN],
            "--latency '0ms' is not a latency:",
        ),
        (
            ["--rate", "10mbit", "--num-processes", "1", "--", *TRAIN],
            "a link joins 2 or more processes; --num-processes 1 is the spmd single-process "
            "runtime, which no link can cross",
        ),
        (
            ["--rate", "10mbit", "--num-processes", "2"],
            "easgd link runs a train command given after '--' (e.g. easgd link --rate 10mbit "
            "--num-processes 2 -- train --workdir W --mapping-backend shard_map); got none",
        ),
        (
            ["--rate", "10mbit", "--num-processes", "2", "--", "compare", "--workdir", "W"],
            "easgd link runs a train command given after '--'",
        ),
        (
            ["--rate", "10mbit", "--num-processes", "2", "--port", "0", "--", *TRAIN],
            "--port 0 is not a port: an integer in [1, 65535]",
        ),
        (
            ["--rate", "10mbit", "--num-processes", "2", "--", *TRAIN, "--process-id", "1"],
            "the link sets --process-id itself; remove it from the train command",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_before_anything_is_made(capsys, args, expected):
  status, err = cli_link(capsys, *args)
  assert status == 2
  assert err.startswith(f"easgd: error: {expected}") and err.count("\n") == 1, err
  nothing_left(os.getpid())


def test_a_machine_without_namespaces_is_one_line_exit_2(capsys, monkeypatch):
  monkeypatch.setattr(link.os, "geteuid", lambda: 1000)
  status, err = cli_link(capsys, "--rate", "10mbit", "--num-processes", "2", "--", *TRAIN)
  assert (status, err) == (
      2,
      "easgd: error: cannot make network namespaces: network namespaces need root "
      "(this user has uid 1000)\n",
  )
  monkeypatch.setattr(link.os, "geteuid", lambda: 0)
  monkeypatch.setattr(link.shutil, "which", lambda tool: None if tool == "tc" else "/x/" + tool)
  status, err = cli_link(capsys, "--rate", "10mbit", "--num-processes", "2", "--", *TRAIN)
  assert (status, err) == (
      2,
      "easgd: error: cannot make network namespaces: no 'tc' command on PATH "
      "(package iproute2)\n",
  )


@needs_namespaces
def test_a_kernel_that_refuses_a_namespace_is_one_line_exit_2(capsys, monkeypatch):
  real = link._sh

  def refusing(cmd):
    if cmd[:3] == ["ip", "netns", "add"] and cmd[3].endswith("-1"):
      return subprocess.CompletedProcess(cmd, 1, "", "Cannot create namespace: Refused\n")
    return real(cmd)

  monkeypatch.setattr(link, "_sh", refusing)
  status, err = cli_link(capsys, "--rate", "10mbit", "--num-processes", "2", "--", *TRAIN)
  assert status == 2 and err.count("\n") == 1, err
  assert re.fullmatch(
      f"easgd: error: cannot make the link: 'ip netns add easgd-ez{os.getpid()}[a-z]-1' "
      "failed: Cannot create namespace: Refused\n",
      err,
  ), err
  nothing_left(os.getpid())  # namespace 0, made before, is removed


@needs_namespaces
@pytest.mark.parametrize("n", [2, 3])
def test_the_namespaces_are_made_shaped_and_removed_after_exit_or_error(n):
  shaped = link.Link.parse("10mbit", "5ms")
  with link.network(shaped, n) as net:
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert all(ns in spaces for ns in net.namespaces)
    assert [a.rsplit(".", 1)[1] for a in net.addresses] == [str(i + 1) for i in range(n)]
    for i, ns in enumerate(net.namespaces):
      hosts = (link.NETNS_DIR / ns / "hosts").read_text()
      assert f"{net.addresses[i]}\t{net.hostname}\n" in hosts
      qdisc = subprocess.run(
          [*net.exec_prefix(i), "tc", "qdisc", "show"], capture_output=True, text=True
      ).stdout
      assert "tbf" in qdisc and "rate 10Mbit" in qdisc and "lat 5ms" in qdisc, qdisc
  assert link.leftovers(net.tag) == []
  nothing_left(os.getpid())
  with pytest.raises(RuntimeError, match="inside the block"):
    with link.network(shaped, n) as net:
      assert link.leftovers(net.tag)
      raise RuntimeError("inside the block")
  assert link.leftovers(net.tag) == []
  nothing_left(os.getpid())


@needs_namespaces
@pytest.mark.parametrize("fail_at", [1, 3, 9])
def test_a_failure_midway_removes_what_was_made_first(monkeypatch, fail_at):
  calls, real = [], link._do

  def failing(cmd):
    calls.append(cmd)
    if len(calls) == fail_at:
      raise link.LinkError(f"'{' '.join(cmd)}' failed: refused")
    real(cmd)

  monkeypatch.setattr(link, "_do", failing)
  with pytest.raises(link.LinkError, match="failed: refused"):
    with link.network(link.Link.parse("10mbit"), 3):
      pass
  assert len(calls) == fail_at
  nothing_left(os.getpid())


# -- processes across the link -------------------------------------------------

FLAGS = [
    "--dataset", "digits", "--model", "mlp", "--num-workers", "4", "--global-batch-size", "64",
    "--learning-rate", "0.1", "--tau", "4", "--beta", "0.9", "--eval-batch-size", "64",
    "--no-progress", "--mapping-backend", "shard_map",
]  # fmt: skip
STEPS = 12


def process_env():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  env.update(
      XLA_FLAGS="--xla_force_host_platform_device_count=2",
      JAX_PLATFORMS="cpu",
      PYTHONUNBUFFERED="1",
      PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
  )
  return env


def start_link(workdir: Path, rate: str, extra) -> subprocess.Popen:
  """``easgd link --rate RATE --num-processes 2 -- train ...`` (output to workdir.log)."""
  log = open(f"{workdir}.log", "w")
  return subprocess.Popen(
      [sys.executable, "-m", "easgd.cli", "link", "--rate", rate, "--num-processes", "2",
       "--", "train", "--workdir", str(workdir), *FLAGS, *extra],
      env=process_env(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
  )  # fmt: skip


def start_loopback(workdir: Path, extra, port: int) -> list[subprocess.Popen]:
  """The same 2 processes on 127.0.0.1, as tests/test_distributed.py runs them."""
  return [
      subprocess.Popen(
          [sys.executable, "-m", "easgd.cli", "train", "--workdir", str(workdir), *FLAGS, *extra,
           "--num-processes", "2", "--process-id", str(i),
           "--coordinator-address", f"127.0.0.1:{port}"],
          env=process_env(), stdout=open(f"{workdir}.p{i}.log", "w"), stderr=subprocess.STDOUT,
          cwd=ROOT,
      )  # fmt: skip
      for i in range(2)
  ]


@pytest.mark.slow
@needs_namespaces
def test_a_shaped_link_changes_time_never_results(tmp_path):
  import socket

  from easgd.run import checkpoint

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  extra = ["--algorithm", "easgd", "--stop-after-steps", str(STEPS)]
  loopback = start_loopback(tmp_path / "loopback", extra, port)
  shaped = start_link(tmp_path / "shaped", "20mbit", extra)
  codes = wait_all([shaped, *loopback], timeout=400)
  logs = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("*.log")}
  assert codes == [0, 0, 0], logs
  nothing_left(shaped.pid)
  assert "egress of each shaped to tbf rate 20000000bit" in logs["shaped.log"]
  summaries = [
      json.loads((tmp_path / d / "summary.json").read_text()) for d in ("shaped", "loopback")
  ]
  for s in summaries:
    assert s["steps_done"] == STEPS and s["shared_copies_equal"]
  assert summaries[0]["communication"] == summaries[1]["communication"]
  assert summaries[0]["communication"]["bytes"] > 0
  assert summaries[0]["final"] == summaries[1]["final"]
  print("wall time s: shaped", summaries[0]["wall_time_s"], "loopback", summaries[1]["wall_time_s"])
  got, want = (checkpoint.Checkpointer(tmp_path / d).restore() for d in ("shaped", "loopback"))
  assert int(got["step"]) == int(want["step"]) == STEPS
  for key in ("center", "worker", "shared", "epoch_losses"):
    for a, b in zip(jax.tree.leaves(got[key]), jax.tree.leaves(want[key]), strict=True):
      np.testing.assert_array_equal(a, b, err_msg=key)


@pytest.mark.slow
@needs_namespaces
def test_sigterm_mid_run_stops_the_processes_and_removes_the_link(tmp_path):
  work = tmp_path / "run"
  proc = start_link(work, "20mbit", ["--num-epochs", "500"])
  try:
    deadline = time.monotonic() + 300
    while not (work / "metrics.jsonl").exists():  # both processes are training
      assert time.monotonic() < deadline and proc.poll() is None, Path(f"{work}.log").read_text()
      time.sleep(0.2)
    assert link.leftovers(f"ez{proc.pid}a")  # the link is up
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
  finally:
    wait_all([proc], timeout=1)
  text = Path(f"{work}.log").read_text()
  assert code == 143 and text.rstrip().endswith("easgd: terminated (SIGTERM)"), text[-3000:]
  nothing_left(proc.pid)
  running = [
      p for p in Path("/proc").glob("[0-9]*") if str(work) in _cmdline(p)
  ]  # no train process of the run is left
  assert running == []


def _cmdline(proc_dir: Path) -> str:
  try:
    return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
  except OSError:
    return ""
