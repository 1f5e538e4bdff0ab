"""Prints the protocol config's fields table (docs/guides/protocol.md) from their declarations.

    python scripts/protocol_fields.py

One row per field of ``easgd.protocol.config.ProtocolConfig``, ``Arm`` and
``Network`` and ``TwoLevelNetwork``, in declaration order: its type (the annotation), its default and
its meaning and unit (the field's help text, ``easgd._util.flags.option``).
"""

import dataclasses
import sys

from easgd._util import flags
from easgd.protocol.config import Arm, ProtocolConfig
from easgd.protocol.networks import Network, TwoLevelNetwork

CLASSES = (ProtocolConfig, Arm, Network, TwoLevelNetwork)


def shown(value) -> str:
  """A default as Python source: floats with ``%g``, a Network by its fields."""
  if isinstance(value, Network):
    return (
        f"Network({value.name!r}, {shown(value.bandwidth_bytes_per_s)}, "
        f"{shown(value.latency_s)})"
    )
  if isinstance(value, tuple):
    return "(" + ", ".join(shown(v) for v in value) + ("," if len(value) == 1 else "") + ")"
  if isinstance(value, float):
    return format(value, "g")
  return repr(value)


def table() -> str:
  """The Markdown table: class, field, type, default, meaning."""
  lines = ["| of | field | type | default | meaning and unit |", "|---|---|---|---|---|"]
  for cls in CLASSES:
    for field in dataclasses.fields(cls):
      help_text = field.metadata.get(flags.HELP)
      if not help_text:
        raise ValueError(
            f"{cls.__name__}.{field.name} declares no help text " "(easgd._util.flags.option)"
        )
      default = flags.field_default(field)
      default = "required" if default is dataclasses.MISSING else f"`{shown(default)}`"
      kind = str(field.type).replace(" | ", " or ")
      lines.append(
          f"| `{cls.__name__}` | `{field.name}` | {kind} | {default} "
          f"| {help_text.replace('|', '/')} |"
      )
  return "\n".join(lines) + "\n"


def main() -> int:
  print(table(), end="")
  return 0


if __name__ == "__main__":
  sys.exit(main())
