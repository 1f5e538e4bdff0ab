"""Test configuration: 8 fake CPU devices, a persistent compilation cache, markers.

* 8 CPU devices are faked before JAX starts (``XLA_FLAGS``), and
  ``pytest_configure`` checks that it took effect.
* JAX's persistent compilation cache is on, in ``.jax_cache/`` at the
  repository root (ignored by git; ``EASGD_TEST_CACHE_DIR`` overrides it):
  the many identical small programs the tests compile, in this process and in
  the CLI, multi-process and notebook subprocesses they start (which inherit
  the environment), are compiled once.
* ``@pytest.mark.slow`` marks the tests that start subprocesses or kernels
  (multi-process runs, SIGKILL, notebooks): ``pytest -m "not slow"`` is the
  fast subset; the README's test command (what CI runs) runs everything.
"""
import os
from pathlib import Path

NUM_FAKE_DEVICES = 8
_flag = f"--xla_force_host_platform_device_count={NUM_FAKE_DEVICES}"
if "jax" not in __import__("sys").modules:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_cache = os.environ.setdefault(
    "EASGD_TEST_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".jax_cache"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: starts subprocesses or notebook kernels (deselect with "
                 "-m 'not slow')")
  n = len(jax.devices())
  if n < NUM_FAKE_DEVICES:
    raise pytest.UsageError(
        f"expected {NUM_FAKE_DEVICES} fake CPU devices, got {n}: XLA_FLAGS was set "
        "after JAX started")
