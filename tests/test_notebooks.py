"""Every reproduction notebook runs top to bottom in quick mode (what CI checks), and
shows a reader only its results: no warnings, no local paths."""

import importlib.util
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
_spec = importlib.util.spec_from_file_location("nb_run", NOTEBOOKS / "run.py")
nb_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nb_run)

LOCAL_PATH = re.compile(r"(?<![\w.:/])/(?:work|tmp|home|root)/")
"""An absolute path of this machine (a virtual environment, a temporary file)."""


def noise(nb):
  """The outputs a reader need not see: warning streams and text naming a local path."""
  found = []
  for i, cell in enumerate(nb.cells):
    for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
      if o.get("output_type") == "stream":
        texts = [o.get("text", "")]
        if o.get("name") == "stderr" and "Warning" in texts[0]:
          found.append(f"cell {i}: a warning on stderr: {texts[0][:200]!r}")
      else:  # rich outputs: their text forms (not images, whose base64 holds '/')
        texts = [
            v if isinstance(v, str) else "".join(v)
            for k, v in o.get("data", {}).items()
            if k.startswith("text/")
        ]
        texts += o.get("traceback", [])
      found += [f"cell {i}: a local path in {t[:200]!r}" for t in texts if LOCAL_PATH.search(t)]
  return found


def test_there_are_notebooks():
  assert len(nb_run.notebooks()) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("path", nb_run.notebooks(), ids=lambda p: p.name)
def test_notebook_runs_in_quick_mode(path, monkeypatch):
  # a fresh kernel: it must not inherit the 8 fake devices of this test process
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  nb, _ = nb_run.execute(path, "quick", timeout=900)
  errors = [
      o
      for c in nb.cells
      if c.cell_type == "code"
      for o in c.get("outputs", [])
      if o.get("output_type") == "error"
  ]
  assert not errors
  assert not noise(nb)


@pytest.mark.parametrize("path", nb_run.notebooks(), ids=lambda p: p.name)
def test_committed_notebook_has_full_mode_outputs_and_a_conclusion(path):
  import nbformat

  nb = nbformat.read(path, as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(c.get("outputs") for c in code), "every code cell has committed outputs"
  text = "".join(o.get("text", "") for c in code for o in c["outputs"])
  assert "mode=full" in text, "the committed outputs come from full mode"
  assert nb.cells[-1].cell_type == "markdown" and "Conclusion" in nb.cells[-1].source
  assert "PLACEHOLDER" not in nb.cells[-1].source
  assert "to be written" not in nb.cells[-1].source.lower()
  assert any(ch.isdigit() for ch in nb.cells[-1].source), "the conclusion quotes numbers"


@pytest.mark.parametrize("path", nb_run.notebooks(), ids=lambda p: p.name)
def test_committed_outputs_hold_no_warning_and_no_local_path(path):
  import nbformat

  assert not noise(nbformat.read(path, as_version=4))
