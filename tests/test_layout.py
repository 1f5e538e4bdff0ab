"""The package's shape: one home for the algorithm names, imports that point down.

Layers, bottom to top, one subpackage of ``easgd/`` each (docs/guides/architecture.md):

  _util       private utilities: the validation vocabulary, atomic files, flags, progress
  core        the paper's synchronous rules as pure per-worker (init, step) pairs
              (and the synchronous warm-up that wraps them); knows no device
  asynchrony  simulated asynchrony: time model, the simulated methods, exchange log, replay
  methods     the comparators and the one algorithm table (registry)
  analysis    theory: analytic stability, the largest Hessian eigenvalue
  parallel    where workers run (devices, processes)
  runtimes    real asynchronous workers (center store, driver, threads, Ray)
  training    configs, data, models, checkpoints, the run directory, the run loop
  sweeps      the one-program engine, grids, curves, the sweep problems and command
  protocol    the comparison protocol
  (top)       ``easgd/cli.py`` and ``easgd/__init__.py``

A module may import modules of its own package or of a package below, never above,
including imports inside functions; no module sits outside a layer.
"""

import ast
from pathlib import Path

import pytest

from easgd.methods import registry

PACKAGE = Path(__file__).resolve().parents[1] / "easgd"
LAYERS = (
    "_util",
    "core",
    "asynchrony",
    "methods",
    "analysis",
    "parallel",
    "tasks",
    "settings",
    "runtimes",
    "run",
    "sweeps",
    "protocol",
    "",
)
"""The subpackages bottom up; "" is the top (``cli.py``, ``__init__.py``)."""


def modules():
  return sorted(PACKAGE.rglob("*.py"))


def layer_of(path: Path) -> str:
  """The subpackage of a module file ("" for the package's own top-level files)."""
  parts = path.relative_to(PACKAGE).parts
  return parts[0] if len(parts) > 1 else ""


def easgd_imports(path):
  """The easgd subpackages ``path`` imports from (top level and inside functions);
  "" for the top-level package itself (``from easgd import X`` of a top-level name)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    names = []
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      if node.module == "easgd":
        names = [f"easgd.{a.name}" for a in node.names]
      elif node.module.startswith("easgd."):
        names = [node.module]
    elif isinstance(node, ast.Import):
      names = [a.name for a in node.names if a.name.startswith("easgd.")]
    for name in names:
      head = name.split(".")[1]
      found.add(head if head in LAYERS else "")
  return found


def test_every_module_has_a_layer():
  missing = [str(p.relative_to(PACKAGE)) for p in modules() if layer_of(p) not in LAYERS]
  assert (
      not missing
  ), f"put these modules in a layer's folder (and LAYERS, docs/guides/architecture.md): {missing}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
  own = LAYERS.index(layer_of(path))
  up = sorted(m for m in easgd_imports(path) if LAYERS.index(m) > own)
  assert not up, f"{path.relative_to(PACKAGE)} ({layer_of(path) or 'top'}) imports from above: {up}"


def test_the_algorithm_table_is_the_only_list_of_algorithm_names():
  """No module but the registry spells out two or more algorithm names together
  (a tuple, list, set or dict of names, or a chain of comparisons): everything
  else asks the table."""
  names = set(registry.ALGORITHMS)
  offenders = []
  for path in modules():
    if path.relative_to(PACKAGE).as_posix() == "methods/registry.py":
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
