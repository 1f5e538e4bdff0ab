"""The public API: each subpackage's ``__all__``, the examples use only those names,
and ``import easgd`` / ``easgd --help`` import no module of JAX, Flax, Optax, Orbax or Ray."""

import ast
import contextlib
import importlib
import io
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = (
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
)
PUBLIC = ("easgd", *(f"easgd.{s}" for s in SUBPACKAGES))
"""The modules with an ``__all__``: the only ones examples import names from."""
HEAVY = {"jax", "jaxlib", "flax", "optax", "orbax", "ray"}


def all_of(module: str) -> list:
  return list(importlib.import_module(module).__all__)


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_resolves(module):
  package = importlib.import_module(module)
  names = all_of(module)
  assert len(names) == len(set(names)), f"{module}.__all__ lists a name twice"
  for name in names:
    assert not name.startswith("_") or name == "__version__", f"{module}: {name}"
    value = getattr(package, name)
    if isinstance(value, types.ModuleType):  # a namespace: one of the package's modules
      assert value.__name__ == f"{module}.{name}", (module, name, value.__name__)
  with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
    package.no_such_name  # noqa: B018 (the attribute access is what raises)


def test_the_top_level_names_are_the_functions_they_name():
  import easgd
  from easgd.core import algorithms
  from easgd.protocol import runs
  from easgd.run import compare, trainer
  from easgd.tasks import models

  assert easgd.easgd is algorithms.easgd and easgd.core.easgd is algorithms.easgd
  assert easgd.train_and_evaluate is trainer.train_and_evaluate
  assert easgd.param_bytes is models.param_bytes is easgd.tasks.param_bytes
  assert easgd.compare is compare.compare  # easgd.run.compare is the module
  assert easgd.run_protocol is runs.run_protocol
  assert set(SUBPACKAGES) <= set(easgd.__all__) and "__version__" in easgd.__all__


def examples():
  """(where, source) of every python block of the README and the guides
  (``docs/guides/``) and every notebook code cell."""
  docs = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
  found = [
      (f"{path.stem} block {i}", b)
      for path in docs
      for i, b in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
  ]
  for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
      if cell["cell_type"] == "code":
        source = "".join(cell["source"])
        source = "\n".join(
            "" if l.lstrip().startswith(("%", "!")) else l for l in source.splitlines()
        )
        found.append((f"{path.name} cell {i}", source))
  return found


def private_uses(source: str) -> list:
  """The ``from easgd... import X``, ``import easgd...`` and ``easgd.X`` (``easgd``
  or a subpackage bound to a name) of ``source`` that name no public name."""
  tree = ast.parse(source)
  bound = {}  # local name -> the public package it is
  bad = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "easgd":
      if node.module not in PUBLIC:
        bad.append(f"from {node.module} import ... (import from easgd or a subpackage)")
        continue
      for alias in node.names:
        if alias.name not in all_of(node.module):
          bad.append(f"from {node.module} import {alias.name}")
        elif f"{node.module}.{alias.name}" in PUBLIC:
          bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] != "easgd":
          continue
        if alias.name not in PUBLIC:
          bad.append(f"import {alias.name}")
        else:
          bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "easgd"
  for node in ast.walk(tree):  # easgd.X, easgd.sub.X
    if isinstance(node, ast.Attribute):
      chain, base = [], node
      while isinstance(base, ast.Attribute):
        chain.insert(0, base.attr)
        base = base.value
      if not (isinstance(base, ast.Name) and base.id in bound):
        continue
      module = bound[base.id]
      for attr in chain:
        if attr not in all_of(module):
          bad.append(f"{module}.{attr}")
          break
        if f"{module}.{attr}" not in PUBLIC:
          break
        module = f"{module}.{attr}"
  return bad


@pytest.mark.parametrize("where,source", examples(), ids=[w for w, _ in examples()])
def test_the_examples_use_only_public_names(where, source):
  assert not private_uses(source), f"{where}: {private_uses(source)}"


def test_the_check_of_the_examples_finds_private_names():
  assert private_uses("from easgd.protocol.runs import run_protocol")
  assert private_uses("from easgd.tasks import no_such_name")
  assert private_uses("import easgd.tasks.models")
  assert private_uses("import easgd\neasgd.training.no_such_name(1)")
  assert private_uses("import easgd as e\ne.no_such_name")
  assert not private_uses(
      "import easgd\nfrom easgd.tasks import models\n" "easgd.tasks.param_bytes(models.init_params)"
  )


def test_train_help_lists_the_config_flags():
  # the sub-commands' flags are added when they are needed, not when the parser is built
  from easgd import cli

  parser = cli.build_parser()
  train = parser._subparsers._group_actions[0].choices["train"]

  def options():
    return {o for action in train._actions for o in action.option_strings}

  assert options() == {"-h", "--help"}  # nothing of TrainConfig yet
  train.format_help()
  assert {"--workdir", "--num-workers", "--tau"} <= options()
  out = io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
    cli.main(["train", "--help"])
  assert stop.value.code == 0
  assert "--num-workers" in out.getvalue() and "--coordinator-address" in out.getvalue()
  args = cli.build_parser().parse_args(["sweep", "--workdir", "w", "--no-plots"])
  assert (args.command, args.no_plots) == ("sweep", True)


def imported_modules(*argv) -> set:
  """The top-level modules ``python -X importtime ARGV`` imports (a fresh process)."""
  run = subprocess.run(
      [sys.executable, "-X", "importtime", *argv],
      capture_output=True,
      text=True,
      cwd=ROOT,
      check=True,
  )
  names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \| +([\w.]+)$", run.stderr, re.M)
  assert "easgd" in names, run.stderr[-2000:]
  return {n.split(".")[0] for n in names}, run.stdout


@pytest.mark.slow
def test_import_and_help_import_no_heavy_module():
  modules, _ = imported_modules("-c", "import easgd")
  assert not modules & HEAVY, sorted(modules & HEAVY)
  modules, out = imported_modules("-m", "easgd.cli", "--help")
  assert "usage: easgd" in out and "sweep" in out
  assert not modules & HEAVY, sorted(modules & HEAVY)


@pytest.mark.slow
def test_every_sub_command_help_imports_no_heavy_module():
  """``easgd SUB --help`` for every sub-command the parser has, one after another in one
  process: none imports JAX, Flax, Optax, Orbax or Ray."""
  code = f"""
import contextlib, io, sys
from easgd import cli
commands = cli.build_parser()._subparsers._group_actions[0].choices
assert len(commands) >= 5, sorted(commands)
for name in commands:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    try:
      cli.main([name, "--help"])
    except SystemExit as stop:
      assert stop.code == 0, (name, stop.code)
  assert f"usage: easgd {{name}}" in out.getvalue(), (name, out.getvalue()[:300])
  heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({sorted(HEAVY)!r}))
  assert not heavy, f"easgd {{name}} --help imported {{heavy}}"
"""
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
  assert run.returncode == 0, run.stderr.strip().splitlines()[-1]
