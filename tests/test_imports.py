"""The config and the flags import no JAX, Flax, Optax, Orbax or Ray.

A command line that only parses flags or checks a config (``easgd --help``, a
bad value refused with exit 2) must not pay for the numerical stack: the
config's allowed values come from JAX-free name modules and the algorithm
table imports its factories only when a run builds one.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("jax", "flax", "optax", "orbax", "ray")

# The top-level package (easgd/__init__.py) is left out: its own imports are
# checked with the command line's; here only the module and what it imports.
PROBE = """
import sys, types
package = types.ModuleType("easgd"); package.__path__ = [{root!r} + "/easgd"]
sys.modules["easgd"] = package
import {module}
heavy = [m for m in {heavy!r} if m in sys.modules]
assert not heavy, f"import {module} imported {{heavy}}"
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "module", ["easgd.settings.config", "easgd._util.flags", "easgd.methods.registry"]
)
def test_the_config_imports_no_numerical_stack(module):
  code = PROBE.format(root=str(ROOT), module=module, heavy=HEAVY)
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
  assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
