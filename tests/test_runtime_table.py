"""The runtime table (``easgd.settings.runtime_table``) and the ``Backend`` protocol."""

import re
from pathlib import Path

import pytest

from easgd.methods import registry
from easgd.runtimes import driver
from easgd.settings import runtime_table

RUNTIMES = Path(__file__).resolve().parents[1] / "easgd" / "runtimes"


def test_the_table_gives_the_runtimes_and_what_each_runs():
  assert runtime_table.NAMES == ("spmd", "threads", "ray")
  assert runtime_table.DEFAULT == "spmd" and runtime_table.REAL == ("threads", "ray")
  assert runtime_table.runs_on("spmd") == registry.ALGORITHMS
  assert runtime_table.runs_on("ray") == registry.ASYNC_ALGORITHMS
  assert runtime_table.runtimes_of("easgd") == ("spmd",)
  assert runtime_table.runtimes_of("downpour") == ("spmd", "threads", "ray")
  assert runtime_table.either(["a"]) == "'a'"
  assert runtime_table.either(["a", "b", "c"]) == "'a', 'b' or 'c'"


@pytest.mark.parametrize("name", runtime_table.NAMES)
def test_every_row_names_what_exists(name):
  spec = runtime_table.TABLE[name]
  for path in (spec.executor, spec.backend, spec.connect):
    if path is not None:
      module, _, attr = path.partition(":")
      source = (RUNTIMES / f"{module.rsplit('.', 1)[-1]}.py").read_text()
      assert re.search(rf"^(class|def) {attr}\b", source, re.M), path
  assert set(spec.reads) <= set(runtime_table.SETTINGS)
  assert (spec.chunk_steps is None) == (spec.backend is None)


def test_the_backend_protocol_names_every_method_called_on_a_backend():
  members = {n for n in vars(driver.Backend) if not n.startswith("_")} | set(
      driver.Backend.__annotations__
  )
  called = set()
  for module in ("driver.py", "async_runs.py"):
    called |= set(re.findall(r"\bbackend\.(\w+)", (RUNTIMES / module).read_text()))
  assert called and called <= members, sorted(called - members)
  from easgd.runtimes import ray_actors, threads

  for cls in (threads.ThreadBackend, ray_actors.RayBackend):
    missing = [m for m in members - {"num_workers"} if not hasattr(cls, m)]
    assert not missing, (cls.__name__, missing)
