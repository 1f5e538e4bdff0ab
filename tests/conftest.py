"""Test configuration: 8 fake CPU devices, a persistent compilation cache, markers.

* 8 CPU devices are faked before JAX starts (``XLA_FLAGS``), and
  ``pytest_configure`` checks that it took effect.
* JAX's persistent compilation cache is on, in ``.jax_cache/`` at the
  repository root (ignored by git; ``EASGD_TEST_CACHE_DIR`` overrides it):
  the many identical small programs the tests compile, in this process and in
  the CLI, multi-process and notebook subprocesses they start (which inherit
  the environment), are compiled once.
* Every ``.json`` and ``.jsonl`` file a test leaves under its ``tmp_path``
  must be strict JSON (no ``NaN`` or ``Infinity``): an autouse fixture
  parses them after the test (:func:`strict_json_files`) and fails the test
  otherwise, so every file the suite's runs write is checked.
* ``@pytest.mark.slow`` marks the tests that start subprocesses or kernels
  (multi-process runs, SIGKILL, notebooks): ``pytest -m "not slow"`` is the
  fast subset; the README's test command (what CI runs) runs everything.
"""

import json
import os
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
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: starts subprocesses or notebook kernels (deselect with " "-m 'not slow')"
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
