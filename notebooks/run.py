"""Executes the reproduction notebooks with nbclient.

    python notebooks/run.py --mode quick              # all notebooks, outputs discarded
    python notebooks/run.py --mode full --save 03_effect_of_tau.ipynb

The mode reaches the notebook as the environment variable EASGD_NOTEBOOK_MODE
("quick": small settings, what CI runs; "full": the committed outputs). With
--save the executed notebook replaces the file (outputs included).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def notebooks() -> list[Path]:
  """The notebooks of this folder, in order."""
  return sorted(HERE.glob("[0-9][0-9]_*.ipynb"))


def execute(path: Path, mode: str, timeout: int = 3600) -> tuple[nbformat.NotebookNode, float]:
  """Runs every cell of ``path`` top to bottom in a fresh kernel.

  Returns:
    (the executed notebook, seconds taken).

  Raises:
    nbclient.exceptions.CellExecutionError: a cell raised; the message holds
      the cell and the traceback.
  """
  os.environ["EASGD_NOTEBOOK_MODE"] = mode
  nb = nbformat.read(path, as_version=4)
  start = time.perf_counter()
  NotebookClient(
      nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
  ).execute()
  return nb, time.perf_counter() - start


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mode", choices=("quick", "full"), default="quick")
  parser.add_argument(
      "--save", action="store_true", help="write the executed notebooks back (outputs included)"
  )
  parser.add_argument("names", nargs="*", help="notebook file names (default: all)")
  args = parser.parse_args(argv)
  paths = [HERE / n for n in args.names] if args.names else notebooks()
  for path in paths:
    nb, seconds = execute(path, args.mode)
    print(f"{path.name}: {args.mode} mode, {seconds:.0f} s")
    if args.save:
      nbformat.write(nb, path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
