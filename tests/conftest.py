"""Test configuration: 8 fake CPU devices, a persistent compilation cache, markers.

* 8 CPU devices are faked before JAX starts (``XLA_FLAGS``), and
  ``pytest_configure`` checks that it took effect.
* JAX's persistent compilation cache is on, in ``.jax_cache/`` at the
  repository root (ignored by git; ``EASGD_TEST_CACHE_DIR`` overrides it):
  the many identical small programs the tests compile, in this process and in
  the CLI, multi-process and notebook subprocesses they start (which inherit
  the environment), are compiled once. The MNIST-1D data sets they generate
  are kept the same way, in ``.data_cache/`` (``EASGD_DATA_CACHE``).
* Every ``.json`` and ``.jsonl`` file a test leaves under its ``tmp_path``
  must be strict JSON (no ``NaN`` or ``Infinity``): an autouse fixture
  parses them after the test (:func:`strict_json_files`) and fails the test
  otherwise, so every file the suite's runs write is checked.
* ``@pytest.mark.slow`` marks the tests that start subprocesses or kernels
  (multi-process runs, SIGKILL, notebooks): ``pytest -m "not slow"`` is the
  fast subset; the README's test command (what CI runs) runs everything.
* ``@pytest.mark.own_process`` runs a test in a fresh interpreter of its own
  (``python -m pytest NODEID``; its outcome and output are reported here): the
  tests that start Ray in their process. Ray's shutdown leaves C++ state and
  signal handlers behind, and its known fault (ray-project/ray#31145: threads
  of a shut-down session touching freed core-worker structures) crashes a
  later test of the same process with a segmentation fault; in a process of
  its own nothing runs after it. Anywhere else a test that connects to Ray
  fails, naming this marker.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

NUM_FAKE_DEVICES = 8
_flag = f"--xla_force_host_platform_device_count={NUM_FAKE_DEVICES}"
if "jax" not in __import__("sys").modules:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_cache = os.environ.setdefault(
    "EASGD_TEST_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".jax_cache")
)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache)
os.environ.setdefault(  # generated MNIST-1D data sets, made once for the whole run
    "EASGD_DATA_CACHE", str(Path(__file__).resolve().parents[1] / ".data_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: starts subprocesses or notebook kernels (deselect with " "-m 'not slow')"
  )
  config.addinivalue_line(
      "markers", "own_process: runs in a fresh interpreter of its own (the tests that start Ray)"
  )
  n = len(jax.devices())
  if n < NUM_FAKE_DEVICES:
    raise pytest.UsageError(
        f"expected {NUM_FAKE_DEVICES} fake CPU devices, got {n}: XLA_FLAGS was set "
        "after JAX started"
    )


def _refuse_constant(name):
  raise ValueError(f"{name} is not JSON (strict parsers refuse it)")


def strict_json_errors(root: Path) -> list[str]:
  """Every .json / .jsonl file under ``root`` that holds NaN or Infinity:
  ``["path: why", ...]``. A file that no JSON parser reads (a damaged file a
  test wrote on purpose; ``json.dumps`` never writes one) is not counted."""
  bad = []
  for path in sorted(root.rglob("*.json*")):
    if path.suffix not in (".json", ".jsonl") or not path.is_file():
      continue
    text = path.read_text(errors="replace")
    docs = [l for l in text.splitlines() if l.strip()] if path.suffix == ".jsonl" else [text]
    for doc in docs:
      try:
        json.loads(doc, parse_constant=_refuse_constant)
      except ValueError as e:
        try:
          json.loads(doc)  # JSON but for NaN / Infinity: what the strict parse refuses
        except ValueError:
          continue
        bad.append(f"{path.relative_to(root)}: {e}")
        break
  return bad


@pytest.fixture(autouse=True)
def strict_json_files(request):
  """After a test that used ``tmp_path``: no JSON file in it holds NaN or Infinity."""
  yield
  tmp_path = request.node.funcargs.get("tmp_path")
  if tmp_path is None:
    return
  bad = strict_json_errors(tmp_path)
  if bad:
    pytest.fail("files that are not strict JSON: " + "; ".join(bad), pytrace=False)


OWN_PROCESS_CHILD = "EASGD_TEST_OWN_PROCESS"
"""Set in the interpreter an ``own_process`` test runs in."""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
  """An ``own_process`` test runs as ``python -m pytest NODEID`` in a fresh
  interpreter; its setup, call and teardown are reported here as one call."""
  if item.get_closest_marker("own_process") is None or os.environ.get(OWN_PROCESS_CHILD):
    return None
  item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
  root = item.config.rootpath
  command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", item.nodeid]
  env = dict(os.environ, **{OWN_PROCESS_CHILD: "1"})
  began = time.perf_counter()
  done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
  seconds = time.perf_counter() - began  # reported as the call's duration (--durations)
  out = done.stdout + done.stderr
  summary = out.strip().splitlines()[-1] if out.strip() else ""
  if done.returncode == 0 and re.search(r"\b1 passed\b", summary):
    outcome, longrepr = "passed", None
  elif done.returncode == 0 and re.search(r"\b1 skipped\b", summary):
    reason = re.search(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", out, re.M)
    outcome = "skipped"
    longrepr = (str(item.path), item.location[1] or 0, reason.group(1) if reason else summary)
  else:
    outcome = "failed"
    longrepr = (
        f"in its own process ({' '.join(command[1:])}): exit {done.returncode}\n" + out[-8000:]
    )
  keywords = {k: 1 for k in item.keywords}
  for when in ("setup", "call", "teardown"):
    report = pytest.TestReport(
        item.nodeid,
        item.location,
        keywords,
        outcome if when == "call" else "passed",
        longrepr if when == "call" else None,
        when,
        sections=[("Captured output of its own process", out)] if when == "call" else [],
        duration=seconds if when == "call" else 0.0,
    )
    item.ihook.pytest_runtest_logreport(report=report)
  # what the previous test kept set up for this one (its module's fixtures) is
  # torn down as pytest's own protocol would after this test
  item.session._setupstate.teardown_exact(nextitem)
  item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
  return True


@pytest.fixture(autouse=True)
def ray_only_in_its_own_process(request, monkeypatch):
  """Outside an ``own_process`` test, connecting to Ray fails the test."""
  if os.environ.get(OWN_PROCESS_CHILD) or request.node.get_closest_marker("own_process"):
    return
  from easgd.runtimes import ray_actors

  def refuse(*args, **kwargs):
    raise AssertionError(
        f"{request.node.nodeid} connects to Ray in the test process: mark it "
        "@pytest.mark.own_process (see tests/conftest.py)"
    )

  monkeypatch.setattr(ray_actors, "connect", refuse)
