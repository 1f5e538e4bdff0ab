"""Start-up time: ``easgd --help`` and ``python -c "import easgd"``, BEFORE against AFTER.

BEFORE is a copy of the package at a git revision (default: the tag ``flat-layout``,
exported with ``git archive`` into a temporary folder) or the tree given as ``--before
PATH``; AFTER is this tree. Each command runs in a fresh process with ``PYTHONPATH`` set
to its tree (the script checks which ``easgd`` each process imports). Method: one untimed
warm-up run of each candidate (file caches), then ``--repeats`` rounds in
ROUND-ROBIN order (BEFORE help, AFTER help, BEFORE train help, ...), so that load
from other processes hits all alike; a candidate's figure is the MEDIAN wall time of its
runs (process start to exit), the spread the half-range of its runs. Ratios are of medians.

    python benchmarks/import_time.py [--before PATH | --revision REV] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AFTER = Path(__file__).resolve().parent.parent
HELP = [
    "-c",
    "import sys; from easgd.cli import main; sys.argv[0] = 'easgd'; sys.exit(main())",
    "--help",
]  # what the ``easgd`` console script runs
IMPORT = ["-c", "import easgd"]
COMMANDS = {
    "easgd --help": HELP,
    "easgd train --help": [*HELP[:2], "train", "--help"],
    "import easgd": IMPORT,
}


def export(revision: str, into: Path) -> Path:
  """The package's files at ``revision`` (``git archive``; the repository is untouched)."""
  out = subprocess.run(["git", "-C", str(AFTER), "archive", revision], capture_output=True)
  if out.returncode:
    sys.exit(
        f"import_time: git has no revision {revision!r} here; give --revision REV or --before PATH"
    )
  archive = out.stdout
  subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
  return into


def environment(tree: Path) -> dict:
  env = dict(os.environ, PYTHONPATH=str(tree))
  env.pop("XLA_FLAGS", None)
  return env


def imported_from(tree: Path) -> str:
  return subprocess.run(
      [sys.executable, "-c", "import easgd; print(easgd.__file__)"],
      cwd=tree,
      env=environment(tree),
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()


def run_once(tree: Path, argv: list) -> float:
  """Wall seconds of one fresh ``python ARGV`` in ``tree`` (its output discarded)."""
  start = time.perf_counter()
  subprocess.run(
      [sys.executable, *argv],
      cwd=tree,
      env=environment(tree),
      check=True,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  return time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
      "--before",
      type=Path,
      default=None,
      help="the BEFORE tree (default: --revision exported to a temp folder)",
  )
  parser.add_argument("--revision", default="flat-layout")
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory(prefix="easgd-before-") as tmp:
    before = args.before.resolve() if args.before else export(args.revision, Path(tmp))
    trees = {"BEFORE": before, "AFTER": AFTER}
    for name, tree in trees.items():
      where = imported_from(tree)
      assert where.startswith(str(tree)), f"{name} imports easgd from {where}, not {tree}"
    candidates = {(c, t): (trees[t], argv) for c, argv in COMMANDS.items() for t in trees}
    for tree, argv in candidates.values():  # warm-up
      run_once(tree, argv)
    times = {key: [] for key in candidates}
    for _ in range(args.repeats):
      for key, (tree, argv) in candidates.items():
        times[key].append(run_once(tree, argv))
  print(
      f"BEFORE: {args.before or args.revision}; AFTER: {AFTER}; {args.repeats} repeats, "
      f"{platform.machine()} {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
      f"load average {os.getloadavg()[0]:.1f}"
  )
  print(f"{'command':<20} {'BEFORE s':>10} {'AFTER s':>10} {'ratio':>7}   spread (BEFORE, AFTER)")
  for command in COMMANDS:
    b, a = (times[(command, t)] for t in trees)
    mb, ma = statistics.median(b), statistics.median(a)
    spread = lambda xs, m: (max(xs) - min(xs)) / 2 / m * 100
    print(
        f"{command:<20} {mb:>10.2f} {ma:>10.2f} {mb / ma:>6.1f}x   "
        f"+-{spread(b, mb):.0f}%, +-{spread(a, ma):.0f}%"
    )


if __name__ == "__main__":
  main()
