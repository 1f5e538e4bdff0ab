"""Prints the algorithm table of docs/guides/algorithms.md from ``easgd.methods.registry.TABLE``.

python scripts/algorithm_table.py
"""

import sys

from easgd.methods import registry


def table() -> str:
  """The Markdown table: one row per algorithm of the registry, in its order."""
  lines = [
      "| algorithm | family | simulated asynchronously | settings it reads | what it is |",
      "|---|---|---|---|---|",
  ]
  for spec in registry.TABLE.values():
    reads = ", ".join(f"`{f}`" for f in spec.reads) or "-"
    lines.append(
        f"| `{spec.name}` | {spec.family} | {'yes' if spec.asynchronous else 'no'} "
        f"| {reads} | {spec.summary} |"
    )
  return "\n".join(lines) + "\n"


def main() -> int:
  print(table(), end="")
  return 0


if __name__ == "__main__":
  sys.exit(main())
