"""The docstrings' examples run: every ``>>>`` example of the package, under doctest.

Each module whose source holds an example is collected from the files (no import
at collection); its examples run in the module's namespace, as a reader would run
them after ``from <module> import *``.
"""

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules_with_examples() -> list:
  found = []
  for path in sorted((ROOT / "easgd").rglob("*.py")):
    if ">>> " in path.read_text():
      parts = path.relative_to(ROOT).with_suffix("").parts
      found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
  return found


def test_the_examples_are_found():
  # the modules known to hold examples are collected (the scan guards itself)
  assert {"easgd.core.algorithms", "easgd.tasks.data", "easgd.protocol.stats"} <= set(
      modules_with_examples()
  )


@pytest.mark.parametrize("name", modules_with_examples())
def test_the_docstring_examples_run(name):
  module = importlib.import_module(name)
  finder = doctest.DocTestFinder(exclude_empty=True)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  tests = [t for t in finder.find(module, name) if t.examples]
  assert tests, f"{name}: no example found by doctest"
  for test in tests:
    runner.run(test)
  result = runner.summarize(verbose=False)
  assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
