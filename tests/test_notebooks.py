"""Every reproduction notebook runs top to bottom in quick mode (what CI checks)."""
import importlib.util
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
_spec = importlib.util.spec_from_file_location("nb_run", NOTEBOOKS / "run.py")
nb_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nb_run)


def test_there_are_notebooks():
  assert len(nb_run.notebooks()) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("path", nb_run.notebooks(), ids=lambda p: p.name)
def test_notebook_runs_in_quick_mode(path, monkeypatch):
  # a fresh kernel: it must not inherit the 8 fake devices of this test process
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  nb, _ = nb_run.execute(path, "quick", timeout=900)
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors


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
