"""The README and the guides stay true: their code runs, and their tables are the
outputs they quote (each generated table lives in one guide, ``docs/guides/``)."""

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
GUIDES = ROOT / "docs" / "guides"


def guide(name: str) -> str:
  return (GUIDES / f"{name}.md").read_text()


def documents():
  """(name, text) of the README and of every guide: where the examples are."""
  return [("README", README)] + [(p.stem, p.read_text()) for p in sorted(GUIDES.glob("*.md"))]


def python_blocks():
  """(where, source) of every python block of the README and the guides."""
  return [
      (f"{name} block {i}", block)
      for name, text in documents()
      for i, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S))
  ]


def test_the_first_lines_give_the_two_fresh_machine_commands():
  # the main job installs the package alone; the tests install the dev extra
  lines = README.splitlines()
  commands = [l.strip() for l in lines[:12] if l.startswith("    ")]
  assert commands[0] == (
      "python3 -m venv .venv && .venv/bin/pip install -e . && "
      ".venv/bin/easgd compare --workdir runs/main"
  )
  assert commands[1] == (
      'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && '
      ".venv/bin/python -m pytest -q -n 2 --dist worksteal"
  )
  # .ci/run runs the first indented line within 3 lines after "run the tests"
  assert "grep -A3 -m1 'run the tests' README.md" in (ROOT / ".ci" / "run").read_text()
  after = README.split("run the tests", 1)[1].splitlines()[1:4]
  assert next(l[4:] for l in after if l.startswith("    ")) == commands[1]


def test_the_guides_hold_the_examples():
  # every guide with a python block is read (the count guards the extraction)
  where = {w.split(" block")[0] for w, _ in python_blocks()}
  assert {"README", "library", "task", "protocol"} <= where


@pytest.mark.parametrize("where,source", python_blocks(), ids=[w for w, _ in python_blocks()])
def test_every_python_example_runs(where, source, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the end-to-end example writes runs/digits
  with contextlib.redirect_stdout(io.StringIO()):
    exec(compile(source, where, "exec"), {})


@pytest.mark.parametrize("output", ["mnist1d_main", "fashion_mnist"])
def test_the_results_tables_are_the_committed_outputs(output):
  table = (ROOT / "paper_notes" / "figures" / output / "results.md").read_text().strip()
  assert table in guide("results")
  if output == "mnist1d_main":  # the README's one table
    assert table in README


def test_the_protocol_sections_are_the_committed_outputs():
  # the claims, every protocol table and the sentences that read them, printed from the
  # committed results.json: the guides, the paper notes, the benchmarks' wall times and
  # notebooks 03/04's conclusions (tests/test_claims.py plants mismatches in copies)
  run = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "protocol_tables.py"), "--check"],
      capture_output=True,
      text=True,
  )
  assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
  out = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "protocol_tables.py")],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()
  assert out in guide("results")


def test_the_protocol_fields_table_is_their_declarations():
  out = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "protocol_fields.py")],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()
  assert out in guide("protocol")
  import dataclasses

  from easgd.protocol.config import Arm, ProtocolConfig
  from easgd.protocol.networks import Network, TwoLevelNetwork

  for cls in (ProtocolConfig, Arm, Network, TwoLevelNetwork):  # every field has a row
    for field in dataclasses.fields(cls):
      assert f"| `{cls.__name__}` | `{field.name}` |" in out


def test_the_task_guide_has_a_row_for_every_field_of_a_task():
  import dataclasses

  from easgd.tasks.task import Task

  rows = re.findall(r"^\| ((?:`\w+`(?:, )?)+) \|", guide("task"), re.M)
  assert {n for row in rows for n in re.findall(r"`(\w+)`", row)} == {
      f.name for f in dataclasses.fields(Task)
  }


def test_the_algorithm_table_is_the_registry():
  out = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "algorithm_table.py")],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()
  assert out in guide("algorithms")


@pytest.mark.slow
def test_the_bad_input_table_is_what_the_command_line_prints():
  # a fresh process on the machine's own devices (not the tests' 8 fake ones)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "bad_inputs_table.py")],
      capture_output=True,
      text=True,
      check=True,
      cwd=ROOT,
      env=env,
  ).stdout.strip()
  assert out in guide("bad_input")


def test_the_architecture_table_lists_every_folder_and_module():
  """Each row of the architecture guide's table names a folder of ``easgd/`` and
  exactly the modules in it (``__init__`` aside for the subpackages)."""
  section = guide("architecture").split("# Architecture", 1)[1].split("\n## ", 1)[0]
  rows = re.findall(r"^\| `(easgd/[a-z_]*/?)` \| ([^|]*) \|", section, re.M)
  listed = {folder.rstrip("/"): set(re.findall(r"`([a-z_]+)`", mods)) for folder, mods in rows}
  package = ROOT / "easgd"
  actual = {"easgd": {p.stem for p in package.glob("*.py")} - {"__init__"} | {"__init__"}}
  for sub in package.iterdir():
    if sub.is_dir() and (sub / "__init__.py").exists():
      actual[f"easgd/{sub.name}"] = {p.stem for p in sub.glob("*.py")} - {"__init__"}
  assert listed == actual


def test_the_readme_links_every_guide():
  linked = set(re.findall(r"\]\(docs/guides/([a-z_]+)\.md\)", README))
  assert linked == {p.stem for p in GUIDES.glob("*.md")}
