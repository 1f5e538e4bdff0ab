"""The exchange techniques' option names and bounds, importable without JAX.

The config (``easgd.settings.fields``) declares its fields' allowed values from
these; ``easgd.core.streaming`` implements them (docs/guides/streaming.md).
"""

FRAGMENT_LAYOUTS = ("contiguous", "strided")
"""How the parameter leaves are split into fragments: consecutive leaves of about equal
size, or leaf k in fragment k mod P."""

COMPRESSIONS = ("none", "int8", "int4", "topk")
"""What an elastic exchange sends: the difference itself, 8- or 4-bit integers with a
float32 scale per block, or the largest entries of each leaf (with error feedback)."""

QUANTIZED_BITS = {"int8": 8, "int4": 4}
"""The bit width of each integer compression."""
