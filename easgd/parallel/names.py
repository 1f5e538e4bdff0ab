"""The worker mappings' names, importable without JAX.

The config (``easgd.training.config``, ``mapping_backend``) declares its
allowed values from these; ``easgd.parallel.workers`` implements them.
"""

BACKENDS = ("pmap", "shard_map")
"""How workers are mapped onto devices: pmap of vmap, or jit of shard_map of vmap."""
