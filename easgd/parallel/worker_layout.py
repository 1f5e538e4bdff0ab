"""Where workers sit: p workers on d devices (rows of D), the mesh and the kinds of placed values.

A :class:`WorkerLayout` (from :func:`make_layout`) puts worker i on device
(row) i // w, local slot i % w, w = p / d workers vmapped per device; with
``devices_per_worker`` D > 1 each worker is a row of D devices of the 2-D mesh
``("devices", "data")``. See docs/guides/multi_device.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from easgd._util import checks
from easgd.core.elastic import DEVICE_AXIS
from easgd.parallel.names import BACKENDS, backend_fits, backend_for, num_devices_fits

KINDS = ("worker", "shared", "broadcast", "batch")
"""The kinds of a mapped function's values and their placed shapes (d device rows,
w workers per row):

  ``"worker"``    one value per worker, [d, w, ...];
  ``"shared"``    one value per device row, equal on all of them (e.g. the
                  center), [d, ...]; per-worker code returns it unbatched
                  (formed by collectives), so it stays replicated;
  ``"broadcast"`` the same value for everyone, no leading axis;
  ``"batch"``     a "worker" value [d, w, B, ...] whose B examples are split
                  over the D devices of the worker when D > 1.
"""
DATA_AXIS = "data"
"""The mesh axis of the devices of one worker (``devices_per_worker`` > 1)."""


class LayoutError(ValueError):
  """num_workers and the devices cannot be laid out as asked."""


@dataclasses.dataclass(frozen=True)
class WorkerLayout:
  """How ``num_workers`` workers sit on devices.

  Attributes:
    num_workers: total number of workers p.
    devices: the devices used, one shard each, ordered by process (devices of
      one process are contiguous, so its workers are a contiguous range).
    backend: ``"pmap"`` (``jax.pmap`` of ``vmap``) or ``"shard_map"``
      (``jax.jit`` of ``jax.shard_map`` of ``vmap``; arrays are global and
      sharded, which multi-process runs need).
    devices_per_worker: D, the devices of one worker (a row of the mesh);
      ``devices`` holds the workers' rows of D devices one after the other.
    param_leaves: ``()`` (every state value whole on each device of its
      worker), or ``(shape, axis)`` of every parameter leaf in the order of
      ``jax.tree.leaves(params)``: parameter-shaped state split over the
      worker's devices (``easgd.parallel.data_parallel.shard_params``; the loss
      gathers leaf by leaf, since two parameters may have slices of one shape).
  """

  num_workers: int
  devices: tuple[Any, ...]
  backend: str = "pmap"
  devices_per_worker: int = 1
  param_leaves: tuple[tuple[tuple[int, ...], int], ...] = ()

  @property
  def shard_params(self) -> bool:
    """True when parameter-shaped state is split over "data" (``data_parallel.shard_params``)."""
    return bool(self.param_leaves)

  def split_axis(self, shape, dtype) -> int | None:
    """The axis of a per-worker leaf of ``shape`` split over "data" (None: whole).

    With :attr:`param_leaves` (``data_parallel.shard_params``) a floating leaf of a
    parameter's shape is split on that parameter's axis (the same for every
    parameter of that shape); nothing else is.
    """
    if not self.param_leaves or not jnp.issubdtype(dtype, jnp.floating):
      return None
    return dict(self.param_leaves).get(tuple(shape))

  @property
  def num_devices(self) -> int:
    """All devices used, d * D."""
    return len(self.devices)

  @property
  def num_groups(self) -> int:
    """d, the leading axis of every placed value: devices / devices_per_worker."""
    return len(self.devices) // self.devices_per_worker

  @property
  def workers_per_device(self) -> int:
    """w, the workers vmapped on one device (on one row of D devices)."""
    return self.num_workers // self.num_groups

  # cached: the trainer places every step's batch with them
  @functools.cached_property
  def mesh(self) -> jax.sharding.Mesh:
    """The mesh over :attr:`devices`: 1-D ``("devices",)``, or with
    ``devices_per_worker`` D > 1 the 2-D ``("devices", "data")`` of shape [d, D]."""
    if self.devices_per_worker == 1:
      return jax.sharding.Mesh(np.array(self.devices), (DEVICE_AXIS,))
    grid = np.array(self.devices).reshape(self.num_groups, self.devices_per_worker)
    return jax.sharding.Mesh(grid, (DEVICE_AXIS, DATA_AXIS))

  @functools.cached_property
  def sharding(self) -> jax.sharding.NamedSharding:
    """Arrays split along their leading axis over :attr:`mesh`."""
    return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(DEVICE_AXIS))

  @functools.cached_property
  def batch_sharding(self) -> jax.sharding.NamedSharding:
    """The sharding of "batch" values [d, w, B, ...]: :attr:`sharding`, with B
    split over "data" when devices_per_worker > 1."""
    return jax.sharding.NamedSharding(self.mesh, self.spec("batch"))

  @functools.cached_property
  def num_processes(self) -> int:
    """Number of processes whose devices the layout uses."""
    return len({d.process_index for d in self.devices})

  @functools.cached_property
  def local_workers(self) -> slice:
    """The workers on this process's devices, as a slice of [0, num_workers).

    All workers in a single process; with several processes, the contiguous
    range of workers this process feeds (its devices are contiguous).
    """
    D = self.devices_per_worker
    local = [i // D for i, d in enumerate(self.devices) if d.process_index == jax.process_index()]
    if not local:
      return slice(0, 0)
    w = self.workers_per_device
    return slice(local[0] * w, (local[-1] + 1) * w)

  def spec(self, kind: str) -> jax.sharding.PartitionSpec:
    """The ``PartitionSpec`` of a placed value of ``kind`` (:data:`KINDS`):
    ``P()`` for "broadcast", else split over "devices" along the leading axis
    (and a "batch" value's B over "data" when devices_per_worker > 1)."""
    P = jax.sharding.PartitionSpec
    if kind == "broadcast":
      return P()
    if kind == "batch" and self.devices_per_worker > 1:
      return P(DEVICE_AXIS, None, DATA_AXIS)  # [d, w, B, ...]: B over the worker's devices
    return P(DEVICE_AXIS)

  def leaf_specs(self, tree, kind: str):
    """The ``PartitionSpec`` of every leaf of a placed "worker" ([d, w, ...]) or
    "shared" ([d, ...]) pytree: split over "devices", and a parameter-shaped
    leaf's axis over "data" (:meth:`split_axis`)."""
    P = jax.sharding.PartitionSpec
    lead = 2 if kind == "worker" else 1  # [d, w, ...] or [d, ...]

    def spec(x):
      axis = self.split_axis(x.shape[lead:], x.dtype)
      if axis is None:
        return P(DEVICE_AXIS)
      return P(DEVICE_AXIS, *([None] * (lead - 1 + axis)), DATA_AXIS)

    return jax.tree.map(spec, tree)

  def describe(self) -> str:
    """One line for logs, e.g. "4 workers = 2 device(s) x 2 vmapped worker(s) [cpu, pmap]"."""
    procs = f", {self.num_processes} processes" if self.num_processes > 1 else ""
    if self.devices_per_worker > 1:
      return (
          f"{self.num_workers} workers x {self.devices_per_worker} devices each "
          f"(data parallel inside a worker{', parameters sharded' if self.shard_params else ''})"
          f" [{self.devices[0].platform}, {self.backend}{procs}]"
      )
    return (
        f"{self.num_workers} workers = {self.num_devices} device(s) x "
        f"{self.workers_per_device} vmapped worker(s) "
        f"[{self.devices[0].platform}, {self.backend}{procs}]"
    )


def make_layout(
    num_workers: int,
    num_devices: int | None = None,
    devices: Sequence[Any] | None = None,
    backend: str | None = None,
    devices_per_worker: int = 1,
) -> WorkerLayout:
  """Chooses the devices for ``num_workers`` workers.

  With several processes (``jax.process_count() > 1``, see
  ``easgd.parallel.distributed``) the candidates are all processes' devices and the
  layout takes the same number from each process, so that every process owns a
  contiguous range of workers.

  Args:
    num_workers: number of workers p, an integer >= 1.
    num_devices: devices to use, in total over all processes; must divide
      ``num_workers``, be at most the number available and (with several
      processes) be a multiple of the process count. ``None`` takes the largest
      such count.
    devices: the candidate devices; default ``jax.devices()`` (all processes).
    backend: ``"pmap"`` or ``"shard_map"`` (:class:`WorkerLayout`); several
      processes need ``"shard_map"``. None: ``"shard_map"`` for
      ``devices_per_worker`` > 1, else ``"pmap"``
      (``easgd.parallel.names.backend_for``).
    devices_per_worker: D, the devices of each worker, an integer >= 1;
      D > 1 needs ``"shard_map"`` and uses num_workers * D devices
      (``num_devices``, if given, must be that count); with several
      processes, the same number k from each, and D a divisor of k (a
      worker inside a process; D = k: one worker per node) or a multiple
      of k (a worker spanning whole processes).

  Returns:
    A :class:`WorkerLayout`.

  Raises:
    LayoutError: if num_workers is not an integer >= 1, if num_devices is more
      than available, if num_workers is not a multiple of num_devices, for an
      unknown backend, or for pmap across processes; with devices_per_worker
      > 1: pmap, num_workers * D more devices than there are, or (several
      processes) a count not taken equally from each or a worker split
      unevenly between processes.
  """
  checks.integer("num_workers", num_workers, 1, error=LayoutError)
  checks.integer("devices_per_worker", devices_per_worker, 1, error=LayoutError)
  backend = backend_for(backend, devices_per_worker)
  if backend not in BACKENDS:
    raise LayoutError(f"unknown mapping backend {backend!r}; allowed: " f"{', '.join(BACKENDS)}")
  available = list(devices) if devices is not None else jax.devices()
  procs = sorted({d.process_index for d in available})
  if devices_per_worker > 1:
    return _data_parallel_layout(
        num_workers, num_devices, available, procs, backend, devices_per_worker
    )
  if len(procs) > 1:
    available.sort(key=lambda d: (d.process_index, d.id))
    return _multiprocess_layout(num_workers, num_devices, available, procs, backend)
  if num_devices is None:
    num_devices = max(
        d for d in range(1, min(num_workers, len(available)) + 1) if num_workers % d == 0
    )
  checks.integer("num_devices", num_devices, 1, error=LayoutError)
  if num_devices > len(available):
    raise LayoutError(
        f"num_devices={num_devices} but only {len(available)} "
        f"{available[0].platform} device(s) are available"
    )
  _check_num_devices_divides(num_workers, num_devices)
  return WorkerLayout(int(num_workers), tuple(available[:num_devices]), backend)


def _data_parallel_layout(num_workers, num_devices, available, procs, backend, D):
  """The layout of ``num_workers`` workers of ``D`` > 1 devices each (:func:`make_layout`).

  With several processes every process gives the same number k of devices
  (ordered by process, so a worker's row of D is contiguous): a worker lies
  on one process (D divides k; D = k: one worker per node) or spans whole
  processes (D a multiple of k)."""
  if not backend_fits(backend, D):
    raise LayoutError(
        f"devices_per_worker={D} needs the 'shard_map' mapping backend, got {backend!r}; "
        "allowed: backend 'shard_map' or None (chosen from devices_per_worker)"
    )
  need = int(num_workers) * int(D)
  if not num_devices_fits(num_workers, num_devices, D):
    raise LayoutError(
        f"num_devices={num_devices} with devices_per_worker={D}: the {num_workers} workers "
        f"use num_workers * devices_per_worker = {need} devices; allowed: {need} or None"
    )
  if need > len(available):
    raise LayoutError(
        f"num_workers * devices_per_worker = {num_workers} * {D} = {need} devices but only "
        f"{len(available)} {available[0].platform} device(s) are available; allowed: "
        f"num_workers * devices_per_worker at most {len(available)}"
    )
  if len(procs) == 1:
    return WorkerLayout(int(num_workers), tuple(available[:need]), backend, int(D))
  n = len(procs)
  per_proc = {
      p: sorted((d for d in available if d.process_index == p), key=lambda d: d.id) for p in procs
  }
  k, most = need // n, min(len(v) for v in per_proc.values())
  if need % n or k > most:
    raise LayoutError(
        f"num_workers * devices_per_worker = {num_workers} * {D} = {need} devices cannot be "
        f"taken equally from the {n} processes ({most} device(s) each at most); allowed: a "
        f"multiple of {n} up to {n * most}"
    )
  if k % D and D % k:
    raise LayoutError(
        f"devices_per_worker={D} with {k} device(s) from each of the {n} processes would split "
        f"a worker unevenly between processes; allowed: a divisor of {k} (workers inside a "
        f"process; {k}: one worker per process) or a multiple of {k} (workers spanning processes)"
    )
  chosen = tuple(d for p in procs for d in per_proc[p][:k])
  return WorkerLayout(int(num_workers), chosen, backend, int(D))


def _multiprocess_layout(num_workers, num_devices, available, procs, backend):
  if backend != "shard_map":
    raise LayoutError(
        f"{len(procs)} processes need the 'shard_map' mapping backend, got "
        f"{backend!r} (--mapping-backend shard_map)"
    )
  per_proc = {p: [d for d in available if d.process_index == p] for p in procs}
  most = min(len(v) for v in per_proc.values()) * len(procs)
  if num_devices is None:
    fits = [n for n in range(len(procs), most + 1, len(procs)) if num_workers % n == 0]
    if not fits:
      raise LayoutError(
          f"num_workers={num_workers} cannot be spread over {len(procs)} "
          f"processes; allowed: a multiple of {len(procs)}"
      )
    num_devices = max(fits)
  checks.integer("num_devices", num_devices, 1, error=LayoutError)
  if num_devices % len(procs) or num_devices > most:
    raise LayoutError(
        f"num_devices={num_devices} must be a multiple of the {len(procs)} "
        f"processes and at most {most} (the same number of devices from each)"
    )
  _check_num_devices_divides(num_workers, num_devices)
  k = num_devices // len(procs)
  chosen = tuple(d for p in procs for d in per_proc[p][:k])
  return WorkerLayout(int(num_workers), chosen, backend)


def _check_num_devices_divides(num_workers, num_devices):
  """Refuses (:class:`LayoutError`) ``num_devices`` that does not divide ``num_workers``."""
  if not num_devices_fits(num_workers, num_devices):
    raise LayoutError(
        f"num_workers={num_workers} is not a multiple of the {num_devices} "
        f"devices used; allowed: a multiple of {num_devices}"
    )
