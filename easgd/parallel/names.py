"""The worker mappings' names, importable without JAX.

The config (``easgd.settings.config``, ``mapping_backend``) declares its
allowed values from these; ``easgd.parallel.workers`` implements them.
"""

BACKENDS = ("pmap", "shard_map")
"""How workers are mapped onto devices: pmap of vmap, or jit of shard_map of vmap."""


def backend_for(backend: str | None, devices_per_worker: int = 1) -> str | None:
  """The mapping backend a layout of ``devices_per_worker`` D uses.

  Args:
    backend: one of :data:`BACKENDS` (returned as given, checked by the
      caller), or None: chosen from the layout.
    devices_per_worker: D, the devices of one worker (an int >= 1).

  Returns:
    ``backend`` itself when given; for None, ``"shard_map"`` (the 2-D
    ``("devices", "data")`` mesh a worker of several devices needs) when D > 1,
    else ``"pmap"``.
  """
  if backend is not None:
    return backend
  return "shard_map" if devices_per_worker > 1 else "pmap"
