"""Lists the longest functions of the package (lines from ``def`` to the last line).

    python scripts/longest_functions.py            # the 15 longest
    python scripts/longest_functions.py -n 40      # more
    python scripts/longest_functions.py --over 100 # those longer than 100 lines

Nested functions are listed on their own (their lines also count for the
function that holds them). Paths are relative to the repository.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def functions(package: Path = ROOT / "easgd") -> list[tuple[int, str, str]]:
  """``(lines, "path:line", qualified name)`` of every function in ``package``."""
  found = []
  for path in sorted(package.rglob("*.py")):
    tree = ast.parse(path.read_text())

    def walk(node, prefix):
      for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
          name = f"{prefix}{child.name}"
          found.append(
              (
                  child.end_lineno - child.lineno + 1,
                  f"{path.relative_to(ROOT)}:{child.lineno}",
                  name,
              )
          )
          walk(child, name + ".")
        elif isinstance(child, ast.ClassDef):
          walk(child, f"{prefix}{child.name}.")

    walk(tree, "")
  return sorted(found, key=lambda f: (-f[0], f[1]))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("-n", type=int, default=15, help="how many to list")
  parser.add_argument(
      "--over",
      type=int,
      default=None,
      help="list every function longer than this many lines instead",
  )
  args = parser.parse_args()
  rows = functions()
  rows = [r for r in rows if r[0] > args.over] if args.over is not None else rows[: args.n]
  for lines, where, name in rows:
    print(f"{lines:5d}  {name:45s} {where}")


if __name__ == "__main__":
  main()
