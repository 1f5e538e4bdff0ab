"""The tree is formatted with pyink and passes ruff, both pinned in the dev extra
and configured in pyproject.toml (``[tool.pyink]``, ``[tool.ruff]``)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "tool", [["pyink", "--check", "."], ["ruff", "check", "."]], ids=["pyink", "ruff"]
)
def test_the_tree_is_formatted_and_linted(tool):
  out = subprocess.run([sys.executable, "-m", *tool], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, f"{' '.join(tool)}:\n{out.stdout}\n{out.stderr}"
