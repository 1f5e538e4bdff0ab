"""The worker mappings' names and the layout rules that need no device, importable without JAX.

The config (``easgd.settings.config``: ``mapping_backend``, ``num_devices``,
``devices_per_worker``, ``shard_params``) and the layout
(``easgd.parallel.worker_layout.make_layout``,
``easgd.parallel.data_parallel.shard_params``) check a request against these
rules, each in its own words (see docs/guides/multi_device.md).
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


def backend_fits(backend: str, devices_per_worker: int) -> bool:
  """Whether ``backend`` (resolved, :func:`backend_for`) maps workers of D devices:
  D = 1 any of :data:`BACKENDS`; D > 1 only ``"shard_map"`` (the 2-D mesh)."""
  return devices_per_worker == 1 or backend == "shard_map"


def num_devices_fits(
    num_workers: int, num_devices: int | None, devices_per_worker: int = 1
) -> bool:
  """Whether ``num_devices`` devices hold ``num_workers`` workers of D devices each.

  None (the layout chooses) fits; with D = 1 a divisor of ``num_workers``
  (the workers of a device are vmapped); with D > 1 exactly
  ``num_workers * D`` (a row of D devices per worker). Ints >= 1.
  """
  if num_devices is None:
    return True
  if devices_per_worker > 1:
    return num_devices == num_workers * devices_per_worker
  return num_workers % num_devices == 0


def shard_params_fits(devices_per_worker: int) -> bool:
  """Whether a worker's state can be split over its D devices (``shard_params``): D > 1."""
  return devices_per_worker > 1
