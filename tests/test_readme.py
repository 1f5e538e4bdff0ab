"""The README stays true: its code runs, and its tables are the outputs they quote."""
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAPER_NOTES = (ROOT / "paper_notes" / "README.md").read_text()


def python_blocks():
  return re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_first_lines_give_the_two_fresh_machine_commands():
  lines = README.splitlines()
  commands = [l.strip() for l in lines[:12] if l.startswith("    ")]
  assert commands[0].endswith(".venv/bin/easgd compare --workdir runs/main")
  assert commands[1].endswith(".venv/bin/python -m pytest -q")
  assert all(c.startswith('python3 -m venv .venv && .venv/bin/pip install -e ".[dev]"')
             for c in commands[:2])


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_python_example_runs(index, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the end-to-end example writes runs/digits
  with contextlib.redirect_stdout(io.StringIO()):
    exec(compile(python_blocks()[index], f"README block {index}", "exec"), {})


@pytest.mark.parametrize("output", ["mnist1d_main", "fashion_mnist"])
def test_the_results_tables_are_the_committed_outputs(output):
  table = (ROOT / "paper_notes" / "figures" / output / "results.md").read_text().strip()
  assert table in README


def test_the_protocol_sections_are_the_committed_outputs(tmp_path):
  # the claims table and every protocol table, printed from the committed results.json
  claims = tmp_path / "claims.md"
  out = subprocess.run([sys.executable, str(ROOT / "scripts" / "protocol_tables.py"),
                        "--claims-out", str(claims)],
                       capture_output=True, text=True, check=True).stdout.strip()
  assert out in README
  committed = ROOT / "paper_notes" / "figures" / "protocol_claims.md"
  assert committed.read_text() == claims.read_text()
  assert committed.read_text().split("\n", 4)[-1].strip() in PAPER_NOTES


def test_the_algorithm_table_is_the_registry():
  out = subprocess.run([sys.executable, str(ROOT / "scripts" / "algorithm_table.py")],
                       capture_output=True, text=True, check=True).stdout.strip()
  assert out in README


@pytest.mark.slow
def test_the_bad_input_table_is_what_the_command_line_prints():
  # a fresh process on the machine's own devices (not the tests' 8 fake ones)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bad_inputs_table.py")],
                       capture_output=True, text=True, check=True, cwd=ROOT,
                       env=env).stdout.strip()
  assert out in README
