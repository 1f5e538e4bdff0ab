"""The package's shape: one home for the algorithm names, imports that point down.

Layers, bottom to top (README, "Architecture"):

  core       the paper's rules as pure per-worker (init, step) pairs (and the
             synchronous warm-up that wraps them); knows no device
  parallel   where workers run (devices, processes)
  analysis   theory and grids (stability, Hessian, quadratic simulation, sweep engine)
  training   configs, data, models, the trainer and its run directory
  face       what a person calls (command line, comparisons, sweep command, plots)

A module may import modules of its own layer or of a layer below, never above,
including imports inside functions.
"""
import ast
from pathlib import Path

import pytest

from easgd import registry

PACKAGE = Path(__file__).resolve().parents[1] / "easgd"
LAYERS = ("core", "parallel", "analysis", "training", "face")
MODULES = {
    "files": "core", "progress": "core", "checks": "core", "flags": "core", "elastic": "core",
    "momentum": "core", "algorithms": "core", "async_schedule": "core",
    "asynchronous": "core", "async_log": "core", "baselines": "core", "registry": "core",
    "warmup": "core",
    "workers": "parallel", "distributed": "parallel",
    "async_shared": "parallel", "async_driver": "parallel", "async_threads": "parallel",
    "async_ray": "parallel",
    "stability": "analysis", "hessian": "analysis", "quadratic": "analysis",
    "sweep_engine": "analysis", "sweep_grid": "analysis",
    "sweep_curves": "analysis", "protocol_stats": "analysis",
    "config": "training", "data": "training", "batches": "training", "models": "training",
    "optimizers": "training", "checkpoint": "training", "rundir": "training",
    "runlock": "training",
    "trainer": "training", "export": "training", "async_trainer": "training",
    "protocol_config": "training", "protocol": "training",
    "compare": "face", "plotting": "face", "cli": "face",
    "sweep": "face", "sweep_network": "face", "sweep_report": "face",
    "protocol_report": "face",
}


def modules():
  return sorted(p for p in PACKAGE.glob("*.py") if p.name != "__init__.py")


def easgd_imports(path):
  """Names of the easgd modules ``path`` imports (top level and inside functions)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      if node.module == "easgd":
        found.update(a.name for a in node.names)
      elif node.module.startswith("easgd."):
        found.add(node.module.split(".")[1])
    elif isinstance(node, ast.Import):
      found.update(a.name.split(".")[1] for a in node.names
                   if a.name.startswith("easgd."))
  return found


def test_every_module_has_a_layer():
  missing = [p.stem for p in modules() if p.stem not in MODULES]
  assert not missing, f"give these modules a layer in MODULES (and the README): {missing}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.stem)
def test_imports_point_down(path):
  own = LAYERS.index(MODULES[path.stem])
  up = sorted(m for m in easgd_imports(path)
              if m in MODULES and LAYERS.index(MODULES[m]) > own)
  assert not up, f"{path.stem} ({MODULES[path.stem]}) imports from above: " + ", ".join(
      f"{m} ({MODULES[m]})" for m in up)


def test_the_algorithm_table_is_the_only_list_of_algorithm_names():
  """No module but the registry spells out two or more algorithm names together
  (a tuple, list, set or dict of names, or a chain of comparisons): everything
  else asks the table."""
  names = set(registry.ALGORITHMS)
  offenders = []
  for path in modules():
    if path.stem == "registry":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      items = None
      if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
      elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
      if items is None:
        continue
      found = {e.value for e in items if isinstance(e, ast.Constant) and e.value in names}
      if len(found) >= 2:
        offenders.append(f"{path.name}:{node.lineno} {sorted(found)}")
  assert not offenders, offenders
