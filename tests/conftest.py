"""Fakes 8 CPU devices before JAX starts, and checks that it took effect."""
import os

NUM_FAKE_DEVICES = 8
_flag = f"--xla_force_host_platform_device_count={NUM_FAKE_DEVICES}"
if "jax" not in __import__("sys").modules:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402


def pytest_configure(config):
  n = len(jax.devices())
  if n < NUM_FAKE_DEVICES:
    raise pytest.UsageError(
        f"expected {NUM_FAKE_DEVICES} fake CPU devices, got {n}: XLA_FLAGS was set "
        "after JAX started")
