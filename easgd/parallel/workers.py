"""Worker mapping: p workers on d devices, per-worker code written once.

Per-worker code names one axis, :data:`WORKER_AXES` (owned by the core,
``easgd.core.elastic``), in its collectives and in ``lax.axis_index``. This module runs such code mapped over devices (``jax.pmap``
or ``jax.shard_map``, axis ``"devices"``) of ``jax.vmap`` over the workers that
share a device (axis ``"local_workers"``); the pair enumerates all
``num_workers`` workers, worker index = device_index * workers_per_device +
local_index.

Argument kinds of a mapped function (see :func:`map_workers`):
  ``"worker"``  one value per worker: arrays of shape [d, w, ...]
                (d devices, w = num_workers / d workers per device);
  ``"shared"``  one value per device, equal on all devices (e.g. the center):
                arrays of shape [d, ...]; per-worker code must return it
                unbatched (computed by collectives), so it stays replicated;
  ``"broadcast"`` the same value for everyone, passed as is (no leading axis).
  ``"batch"``   a "worker" value whose first per-worker axis is the worker's
                mini-batch [d, w, B, ...]: with ``devices_per_worker`` D > 1
                split over the D devices of its worker (B / D examples each),
                otherwise exactly a "worker" value.

A worker of several devices (``WorkerLayout.devices_per_worker`` D > 1,
``TrainConfig.devices_per_worker``; backend "shard_map" only, chosen for it
when no backend is named): the mesh is 2-D,
``("devices", "data")`` of shape [d, D], one row of D devices per worker.
"worker"/"shared" values are split along "devices" and replicated along
:data:`DATA_AXIS`; "batch" values are also split along their batch axis over
it. Inside a worker the step is synchronous data parallelism: each device
computes the gradient of its B / D examples and :func:`data_parallel_loss`
averages the gradients (and the loss) over :data:`DATA_AXIS` before the
algorithm's own rule reads them, so for a loss that is a mean over the batch
every worker's step is the one it takes on one device with its whole batch B
(up to the order of the sums; every collective reduces in
``easgd.core.elastic.reduction_dtype``, float32 for bfloat16; where results
are bitwise equal: docs/guides/multi_device.md). The algorithm's
collectives name :data:`WORKER_AXES` only, so they reduce across workers,
never over "data". With several processes (``easgd.parallel.distributed``) a
worker's row lies inside one process (one worker per node) or spans whole
processes (:func:`make_layout`). D = 1 is the 1-D mesh and the programs of one device per
worker, unchanged. :func:`communication_by_level` counts the two levels: the
algorithm's exchange across workers, and within a worker one all-reduce of
the gradient and the loss over "data" every step.

Two backends run the same per-worker code with the same array layouts, chosen
by ``WorkerLayout.backend`` (:func:`make_layout`, ``TrainConfig.mapping_backend``):
  ``"pmap"``       ``jax.pmap(jax.vmap(fn))`` (the design card's mapping; in
                   JAX >= 0.8 pmap is itself built on shard_map);
  ``"shard_map"``  ``jax.jit(jax.shard_map(vmap(fn)))`` over a 1-D mesh
                   ``("devices",)``; each device's block [1, w, ...] is squeezed
                   and vmapped over its w local workers, so collectives over
                   :data:`WORKER_AXES` = ("devices", "local_workers") mean the
                   same thing. Arrays are global ``jax.Array``s sharded along
                   their leading axis, which is what makes multi-process runs
                   (``easgd.parallel.distributed``) work: each process holds the shards of
                   its own devices. pmap is single-process only here.

:func:`vmap_workers` binds the same axes with ``vmap`` alone (one simulated
device), so that an algorithm's step also runs inside a ``vmap`` over
configurations (``easgd.sweeps.engine``).

This is the only module that knows about devices.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from easgd._util import checks
from easgd.core.algorithms import Algorithm, Communication, select_program
from easgd.core import elastic
from easgd.core.elastic import DEVICE_AXIS, LOCAL_AXIS, WORKER_AXES
from easgd.parallel.names import BACKENDS  # re-exported
from easgd.parallel.names import backend_for

KINDS = ("worker", "shared", "broadcast", "batch")
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
    backend: ``"pmap"`` or ``"shard_map"`` (module docstring).
    devices_per_worker: D, the devices of one worker (module docstring);
      ``devices`` holds the workers' rows of D devices one after the other.
    param_leaves: ``()`` (every state value whole on each device of its
      worker), or ``(shape, axis)`` of every parameter leaf in the order of
      ``jax.tree.leaves(params)``: parameter-shaped state split over the
      worker's devices (:func:`shard_params`; the loss gathers leaf by
      leaf, since two parameters may have slices of one shape).
  """

  num_workers: int
  devices: tuple[Any, ...]
  backend: str = "pmap"
  devices_per_worker: int = 1
  param_leaves: tuple[tuple[tuple[int, ...], int], ...] = ()

  @property
  def shard_params(self) -> bool:
    """True when parameter-shaped state is split over "data" (:func:`shard_params`)."""
    return bool(self.param_leaves)

  def split_axis(self, shape, dtype) -> int | None:
    """The axis of a per-worker leaf of ``shape`` split over "data" (None: whole).

    With :attr:`param_leaves` (:func:`shard_params`) a floating leaf of a
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
    return jax.sharding.NamedSharding(self.mesh, _spec("batch", self.devices_per_worker))

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
    backend: ``"pmap"`` or ``"shard_map"`` (module docstring); several
      processes need ``"shard_map"``. None: ``"shard_map"`` for
      ``devices_per_worker`` > 1, else ``"pmap"``
      (``easgd.parallel.names.backend_for``).
    devices_per_worker: D, the devices of each worker (module docstring);
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
  if num_workers % num_devices:
    raise LayoutError(
        f"num_workers={num_workers} is not a multiple of the {num_devices} "
        f"devices used; allowed: a multiple of {num_devices}"
    )
  return WorkerLayout(int(num_workers), tuple(available[:num_devices]), backend)


def _data_parallel_layout(num_workers, num_devices, available, procs, backend, D):
  """The layout of ``num_workers`` workers of ``D`` > 1 devices each (:func:`make_layout`).

  With several processes every process gives the same number k of devices
  (ordered by process, so a worker's row of D is contiguous): a worker lies
  on one process (D divides k; D = k: one worker per node) or spans whole
  processes (D a multiple of k)."""
  if backend != "shard_map":
    raise LayoutError(
        f"devices_per_worker={D} needs the 'shard_map' mapping backend, got {backend!r}; "
        "allowed: backend 'shard_map' or None (chosen from devices_per_worker)"
    )
  need = int(num_workers) * int(D)
  if num_devices is not None and num_devices != need:
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
  if num_workers % num_devices:
    raise LayoutError(
        f"num_workers={num_workers} is not a multiple of the {num_devices} "
        f"devices used; allowed: a multiple of {num_devices}"
    )
  k = num_devices // len(procs)
  chosen = tuple(d for p in procs for d in per_proc[p][:k])
  return WorkerLayout(int(num_workers), chosen, backend)


def shard_params(layout: WorkerLayout, params) -> WorkerLayout:
  """The layout with each worker's parameter-shaped state split over its D devices.

  FSDP / ZeRO-3 style inside a worker (``TrainConfig.shard_params``): every
  floating leaf of the worker and shared state whose shape is a parameter's
  (the parameters, the optimizer's and the algorithm's parameter-shaped
  state, the worker's copy of the center) is stored split over the
  worker's D devices along that parameter's first axis of a size divisible
  by D, so each device holds 1/D of it. The step program keeps them split:
  the algorithm's update rules are elementwise, so each device updates its
  slice and the exchange across workers reduces slices (1/D of the bytes per
  device); only the loss sees whole parameters: :func:`data_parallel_loss`
  all-gathers them over "data" for the forward pass and reduce-scatters the
  gradient (the mean of the D devices' gradients, the two halves of the
  ring all-reduce it replaces, so a step moves the same bytes inside a
  worker). Other mapped functions (the evaluation) gather the split values
  first. Values equal the replicated run's (bitwise on CPU, float32 and
  bfloat16: docs/guides/multi_device.md). The optimizers of ``TrainConfig.optimizer``
  (SGD, momentum, Nesterov, Adam, AdamW, weight decay) are elementwise; an
  optimizer passed from code whose update reads the whole gradient (e.g.
  ``optax.clip_by_global_norm``) would see one device's slice, and must
  not run on a layout that shards.

  Args:
    layout: a layout of ``devices_per_worker`` D > 1 (backend "shard_map").
    params: one worker's parameters (a pytree of arrays; shapes only are read).

  Returns:
    The layout with ``param_leaves`` set.

  Raises:
    LayoutError: D = 1, a layout of several processes (not supported: the
      host reads a worker's slices back on one process), or a parameter
      (named by its path) that is a scalar or has no axis whose size D
      divides.
  """
  D = layout.devices_per_worker
  if D == 1:
    raise LayoutError(
        "shard_params splits a worker's state over its devices; allowed with "
        "devices_per_worker > 1 only"
    )
  if layout.num_processes > 1:
    raise LayoutError(
        f"shard_params runs in one process (a worker's slices are read back on one host); "
        f"allowed with {layout.num_processes} processes: shard_params False"
    )
  leaves = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    shape = tuple(np.shape(leaf))
    fits = [i for i, n in enumerate(shape) if n % D == 0]
    if not fits:
      name = f"parameter {jax.tree_util.keystr(path)} of shape {shape}"
      if not shape:
        raise LayoutError(
            f"shard_params: {name} is a scalar, which cannot be split over "
            f"devices_per_worker={D}; allowed: parameters of at least one axis"
        )
      raise LayoutError(
          f"shard_params: {name} has no axis divisible by devices_per_worker={D}; allowed: "
          f"parameters with an axis of a size divisible by {D}, or devices_per_worker "
          f"dividing one of {list(shape)}"
      )
    leaves.append((shape, fits[0]))
  return dataclasses.replace(layout, param_leaves=tuple(leaves))


def _leaf_specs(tree, kind, layout: WorkerLayout):
  """The ``PartitionSpec`` of every leaf of a placed "worker"/"shared" value:
  :func:`_spec`, with a parameter-shaped leaf's axis over "data" (:func:`shard_params`)."""
  P = jax.sharding.PartitionSpec
  lead = 2 if kind == "worker" else 1  # [d, w, ...] or [d, ...]

  def spec(x):
    axis = layout.split_axis(x.shape[lead:], x.dtype)
    if axis is None:
      return P(DEVICE_AXIS)
    return P(DEVICE_AXIS, *([None] * (lead - 1 + axis)), DATA_AXIS)

  return jax.tree.map(spec, tree)


def _vmap_axis(kind):
  return 0 if kind in ("worker", "batch") else None


def _spec(kind, devices_per_worker):
  """The ``PartitionSpec`` of a placed value of ``kind`` (module docstring)."""
  P = jax.sharding.PartitionSpec
  if kind == "broadcast":
    return P()
  if kind == "batch" and devices_per_worker > 1:
    return P(DEVICE_AXIS, None, DATA_AXIS)  # [d, w, B, ...]: B over the worker's devices
  return P(DEVICE_AXIS)


def _pmap_axis(kind):
  return None if kind == "broadcast" else 0


def map_workers(
    fn: Callable,
    layout: WorkerLayout,
    in_kinds: Sequence[str],
    out_kinds: Sequence[str],
    donate_argnums: Sequence[int] = (),
    *,
    keep_shards: bool = False,
) -> Callable:
  """Maps per-worker ``fn`` over all workers of ``layout``.

  ``fn`` sees one worker's values (no leading axes) and may use collectives over
  :data:`WORKER_AXES`. The result is ``pmap(vmap(fn))`` or
  ``jit(shard_map(vmap(fn)))`` by ``layout.backend``: compiled once per input
  shape, placed on ``layout.devices``; both take and return the same layouts
  ([d, w, ...] worker values, [d, ...] shared values) and give the same values.

  Args:
    fn: per-worker function of ``len(in_kinds)`` positional arguments returning a
      tuple of ``len(out_kinds)`` values.
    layout: the worker layout.
    in_kinds, out_kinds: one of ``"worker"``, ``"shared"``, ``"broadcast"``,
      ``"batch"`` per argument / output (module docstring). Outputs cannot be
      ``"broadcast"`` or ``"batch"``.
    donate_argnums: arguments whose buffers may be reused for the outputs.
    keep_shards: with a layout that shards parameters (:func:`shard_params`):
      ``fn`` is an algorithm's step (:data:`STEP_IN_KINDS` ->
      :data:`STEP_OUT_KINDS`) and sees, and returns, each device's slices of
      the split state (its rules elementwise, its loss
      :func:`data_parallel_loss`); False: split values are gathered before
      ``fn`` sees them.

  Returns:
    The mapped function.

  Raises:
    ValueError: for an unknown kind.
  """
  _check_kinds(in_kinds, out_kinds)
  single = len(out_kinds) == 1
  inner = _vmap_local(fn, in_kinds, out_kinds, alone=layout.num_workers == 1)
  return _map_devices(inner, layout, in_kinds, single, tuple(donate_argnums), keep_shards)


def vmap_workers(
    fn: Callable, num_workers: int, in_kinds: Sequence[str], out_kinds: Sequence[str]
) -> Callable:
  """Maps per-worker ``fn`` over ``num_workers`` simulated workers with ``vmap`` only.

  The same binding of :data:`WORKER_AXES` as :func:`map_workers` on one
  device (a ``vmap`` of size 1 over :data:`DEVICE_AXIS` around the ``vmap``
  over :data:`LOCAL_AXIS`), without ``pmap``, ``shard_map`` or placement: the
  result composes with ``jax.vmap`` (e.g. over configurations), ``lax.scan``
  and ``jax.jit``, and runs an algorithm's own step, unchanged, on the
  simulated workers of one program (``easgd.sweeps.engine``).

  Args:
    fn: per-worker function (collectives over :data:`WORKER_AXES`).
    num_workers: p, the size of the worker axis (a Python int >= 1).
    in_kinds, out_kinds: ``"worker"`` (leading axis [p]), ``"shared"`` (no
      worker axis; outputs formed by collectives) or ``"broadcast"`` (inputs
      only), as :func:`map_workers` without the device axis.

  Returns:
    The mapped function; "worker" outputs have the leading axis [p].

  Raises:
    ValueError: for an unknown kind.
  """
  _check_kinds(in_kinds, out_kinds)
  local = _vmap_local(fn, in_kinds, out_kinds, alone=num_workers == 1, axis_size=num_workers)
  # one simulated device: the device axis (size 1) binds the name; no input is
  # batched along it, so only what depends on the device index (the workers'
  # keys, through worker_index) is computed with a leading axis of size 1
  device = jax.vmap(local, in_axes=None, out_axes=0, axis_name=DEVICE_AXIS, axis_size=1)
  return lambda *args: jax.tree.map(lambda x: x[0], device(*args))


def _vmap_local(fn, in_kinds, out_kinds, alone: bool, axis_size: int | None = None):
  """``vmap(fn)`` over the workers of one device (axis :data:`LOCAL_AXIS`; its
  size ``axis_size``, if given, for functions without a "worker" input).

  "shared" outputs are unbatched (per-worker code forms them with
  collectives over all workers, which vmap checks). A single worker in all
  (``alone``) has nothing to reduce and emits no collective
  (``easgd.core.elastic.reduce_axis``), so its shared outputs are batched along
  the vmap axis of size 1 and taken from it.
  """
  single = len(out_kinds) == 1
  out_axes = tuple(0 if alone else _vmap_axis(k) for k in out_kinds)
  inner = jax.vmap(
      fn,
      in_axes=tuple(_vmap_axis(k) for k in in_kinds),
      out_axes=out_axes[0] if single else out_axes,
      axis_name=LOCAL_AXIS,
      axis_size=axis_size,
  )
  if not alone:
    return inner

  def squeeze_shared(*args):
    out = inner(*args)
    outs = (out,) if single else out
    outs = tuple(
        jax.tree.map(lambda x: x[0], o) if k == "shared" else o for o, k in zip(outs, out_kinds)
    )
    return outs[0] if single else outs

  return squeeze_shared


def _check_kinds(in_kinds, out_kinds):
  for k in (*in_kinds, *out_kinds):
    if k not in KINDS:
      raise ValueError(f"unknown argument kind {k!r}; allowed: {KINDS}")
  if "broadcast" in out_kinds or "batch" in out_kinds:
    raise ValueError("outputs are 'worker' or 'shared', not 'broadcast' or 'batch'")


def _map_devices(per_device, layout, in_kinds, single, donate_argnums, keep_shards=False):
  """``per_device`` (one device's values: worker values [w, ...]) mapped over the
  devices of ``layout`` by its backend."""
  if layout.backend == "shard_map":
    if layout.shard_params:
      return _sharded_state_workers(per_device, layout, in_kinds, donate_argnums, keep_shards)
    return _shard_map_workers(per_device, layout, in_kinds, single, donate_argnums)
  return jax.pmap(
      per_device,
      axis_name=DEVICE_AXIS,
      in_axes=tuple(_pmap_axis(k) for k in in_kinds),
      devices=layout.devices,
      donate_argnums=donate_argnums,
  )


def _merged_workers_step(step: Callable, alone: bool) -> Callable:
  """One device's step of a shared-model algorithm, its workers as one batch.

  The workers of a device hold no state of their own and read the same model,
  so the step runs ONCE per device on the concatenation of their mini-batches
  ([w, B, ...] -> [1, w B, ...]), under a ``vmap`` of size 1 over
  :data:`LOCAL_AXIS` (so collectives over :data:`WORKER_AXES` reduce over the
  devices only). For a loss that is a mean over the batch, the gradient of
  the device's w B examples is the mean of its workers' gradients: one
  forward and backward pass instead of w weight gradients summed after. Every
  worker of the device reports the device's mean loss; the step's key is
  folded with the device's index (dropout masks are drawn per device).
  """
  inner = _vmap_local(step, STEP_IN_KINDS, STEP_OUT_KINDS, alone)
  per_worker = _vmap_local(step, STEP_IN_KINDS, STEP_OUT_KINDS, alone)

  def per_device(worker, shared, batch, key):
    if jax.tree.leaves(getattr(shared, "model_state", ())):
      # model state (BatchNorm statistics) depends on each worker's own batch:
      # one pass per worker, the states averaged by the algorithm
      return per_worker(worker, shared, batch, key)
    w = jax.tree.leaves(batch)[0].shape[0]
    merged = jax.tree.map(lambda x: x.reshape(1, w * x.shape[1], *x.shape[2:]), batch)
    one = jax.tree.map(lambda x: x[:1], worker)
    worker_out, shared_out, loss = inner(one, shared, merged, key)
    worker_out = jax.tree.map(lambda x: jnp.broadcast_to(x, (w, *x.shape[1:])), worker_out)
    return worker_out, shared_out, jnp.broadcast_to(loss, (w,))

  return per_device


STEP_IN_KINDS = ("worker", "shared", "batch", "broadcast")
STEP_OUT_KINDS = ("worker", "shared", "worker")
"""Kinds of an algorithm step ``step(worker, shared, batch, key) -> (worker,
shared, loss)`` (``easgd.core.algorithms.Algorithm``)."""


def map_step(
    algorithm, layout: WorkerLayout, donate_state: bool = True, merge_workers: bool = True
) -> Callable:
  """An algorithm's step mapped over all workers, with its program chosen per step.

  The result is ``step_fn(worker, shared, batch, key, clock) -> (worker,
  shared, loss)``, where ``clock`` is the host's int count of steps taken
  (the value of the state's step counter). Each program of
  ``algorithm.programs()`` (``easgd.core.algorithms.Algorithm``) is mapped
  and compiled once, and each call runs the one ``program_at(clock)`` names.
  For algorithms with a host-side schedule (``algorithm.exchange_at``: EASGD,
  EAMSGD, local SGD, DiLoCo) these are the step with its communication and
  the step without: no ``lax.cond`` in either, no all-reduce in the local
  one; a synchronous warm-up (``easgd.core.warmup``) adds its pmean program
  for the first K steps. Other algorithms run their one step program and
  ignore ``clock``. Algorithms with one shared model
  (``algorithm.shared_model``: pmean SGD, the sequential methods) run the
  workers of each device as one batch (:func:`_merged_workers_step`: one
  gradient per device, equal to the workers' gradients averaged for a loss
  that is a mean over its batch; ``merge_workers=False`` keeps one pass per
  worker, as models whose forward pass depends on the batch need: BatchNorm
  normalises each worker's own mini-batch, on any layout). The results are
  those of ``map_workers(algorithm.step, ...)`` at the same clock up to
  float32 rounding (XLA fuses the update differently without the
  conditional; ``tests/test_map_step.py``). ``clock`` must be the state's
  step count. It is not read back from the device (that would wait for
  every step); instead, with several programs, each compares its
  ``runs_at`` of the state's counter ``shared.step`` and returns a NaN loss
  for every worker where it should not run, so a clock that picks the wrong
  program shows as a non-finite loss (a wrong clock that picks the right
  program computes the right step; the trainer always passes the right clock).

  Args:
    algorithm: an ``easgd.core.algorithms.Algorithm``.
    layout: the worker layout.
    donate_state: donate the worker and shared state buffers (arguments 0, 1).
    merge_workers: run a shared-model algorithm's workers of a device as one
      batch (default); False: one pass per worker.

  Returns:
    ``step_fn`` as above; ``step_fn.programs`` maps each program's name
    (``algorithm.programs()``: the exchange flag ``False``/``True``, ``None``
    for a single program, ``"warmup"`` for the warm-up) to the mapped
    function, e.g. for ``.lower(...)``.

  Raises:
    TypeError: ``algorithm`` is not an ``easgd.core.algorithms.Algorithm``, or
      ``layout`` not a :class:`WorkerLayout`.
    ValueError (from ``step_fn``): ``clock`` is not an int in [0, 2**31 - 1]
      (the int32 step counter's range; a traced or device value cannot pick a
      program on the host).

  References:
    Algorithm 1 of the paper ("if tau divides t"), decided on the host.
  """
  if not isinstance(algorithm, Algorithm):
    raise TypeError(
        f"algorithm must be an easgd.core.algorithms.Algorithm, got " f"{type(algorithm).__name__}"
    )
  if not isinstance(layout, WorkerLayout):
    raise TypeError(
        f"layout must be an easgd.parallel.workers.WorkerLayout (make_layout), got "
        f"{type(layout).__name__}"
    )
  donate = (0, 1) if donate_state else ()

  def mapped(fn):
    if algorithm.shared_model and merge_workers:
      return _map_devices(
          _merged_workers_step(fn, layout.num_workers == 1),
          layout,
          STEP_IN_KINDS,
          False,
          donate,
          keep_shards=True,
      )
    return map_workers(fn, layout, STEP_IN_KINDS, STEP_OUT_KINDS, donate, keep_shards=True)

  table = algorithm.programs()
  if len(table) == 1:  # nothing to pick: the one program as it is
    programs = {name: mapped(program.step) for name, program in table.items()}
  else:
    programs = {name: mapped(_clock_checked(program)) for name, program in table.items()}

  def step_fn(worker, shared, batch, key, clock):
    checks.integer("clock", clock, 0, 2**31 - 1, what="the number of steps taken")
    return programs[select_program(table, clock)](worker, shared, batch, key)

  step_fn.programs = programs
  return step_fn


def _clock_checked(program) -> Callable:
  """``program.step`` whose loss is NaN where ``program.runs_at(shared.step)``
  does not hold (the host's clock picked the wrong program)."""

  def step(worker, shared, batch, key):
    worker_out, shared_out, loss = program.step(worker, shared, batch, key)
    return worker_out, shared_out, jnp.where(program.runs_at(shared.step), loss, jnp.nan)

  return step


def _shard_map_workers(inner, layout, in_kinds, single, donate_argnums):
  """``jit(shard_map(inner))`` over the layout's mesh, pmap's layouts.

  Every "worker"/"shared"/"batch" argument and every output is split along
  its leading axis over "devices" (block [1, ...] per device, squeezed before
  ``inner`` and restored after); "broadcast" arguments are replicated
  (``P()``). With ``devices_per_worker`` > 1 (2-D mesh) "batch" arguments are
  also split along their batch axis over "data", the rest is replicated
  along it, and outputs are taken as replicated along it (every device of a
  worker computes the same values from the data-averaged gradient).
  """
  P = jax.sharding.PartitionSpec
  in_specs = tuple(_spec(k, layout.devices_per_worker) for k in in_kinds)

  def per_device(*args):
    args = [
        a if k == "broadcast" else jax.tree.map(lambda x: x[0], a) for a, k in zip(args, in_kinds)
    ]
    out = inner(*args)
    return jax.tree.map(lambda x: x[None], out)

  # check_vma=False as in JAX's own pmap-on-shard_map: the varying-axes type
  # check rejects a psum over ("devices", "local_workers") where the second
  # axis is vmap's, not the mesh's, although the collective is well defined.
  mapped = jax.shard_map(
      per_device, mesh=layout.mesh, in_specs=in_specs, out_specs=P(DEVICE_AXIS), check_vma=False
  )
  return jax.jit(mapped, donate_argnums=donate_argnums)


def _sharded_state_workers(inner, layout, in_kinds, donate_argnums, keep_shards):
  """:func:`_shard_map_workers` for a layout that shards parameters (:func:`shard_params`).

  The specs of "worker"/"shared" arguments are per leaf (:func:`_leaf_specs`,
  read from the arguments' shapes when the program is traced). With
  ``keep_shards`` (an algorithm's step) the per-device code sees each
  device's slices and the worker/shared outputs keep the inputs' specs;
  otherwise split leaves are all-gathered over "data" first and the outputs
  are whole (replicated along "data").
  """
  P = jax.sharding.PartitionSpec
  D = layout.devices_per_worker

  def specs_of(args):
    return tuple(
        _leaf_specs(a, k, layout) if k in ("worker", "shared") else _spec(k, D)
        for a, k in zip(args, in_kinds)
    )

  def gathered(a, spec):
    def gather(x, p):
      if DATA_AXIS not in tuple(p):
        return x
      axis = tuple(p).index(DATA_AXIS) - 1  # the block's leading device axis is squeezed
      return jax.lax.all_gather(x, DATA_AXIS, axis=axis, tiled=True)

    return jax.tree.map(gather, a, spec, is_leaf=lambda x: isinstance(x, P))

  def call(*args):
    in_specs = specs_of(args)
    if keep_shards:  # STEP_IN_KINDS -> STEP_OUT_KINDS: worker and shared keep their specs
      out_specs = (in_specs[0], in_specs[1], P(DEVICE_AXIS))
    else:
      out_specs = P(DEVICE_AXIS)

    def per_device(*blocks):
      blocks = [
          b if k == "broadcast" else jax.tree.map(lambda x: x[0], b)
          for b, k in zip(blocks, in_kinds)
      ]
      if not keep_shards:
        blocks = [
            gathered(b, sp) if k in ("worker", "shared") else b
            for b, k, sp in zip(blocks, in_kinds, in_specs)
        ]
      out = inner(*blocks)
      return jax.tree.map(lambda x: x[None], out)

    mapped = jax.shard_map(
        per_device, mesh=layout.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
    )
    return mapped(*args)

  return jax.jit(call, donate_argnums=donate_argnums)


@jax.custom_vjp
def _data_mean_gradient(params):
  """The identity on ``params`` whose backward pass averages the cotangent over
  :data:`DATA_AXIS` (one all-reduce of the gradient inside a worker)."""
  return params


def _data_mean_gradient_fwd(params):
  return params, None


def _data_mean_gradient_bwd(_, cotangent):
  # the package's reduction policy: the mean in float32 for bfloat16 gradients
  # (easgd.core.elastic.reduction_dtype), rounded once to the gradient's dtype
  return (elastic.cast_like(elastic.worker_mean(cotangent, DATA_AXIS), cotangent),)


_data_mean_gradient.defvjp(_data_mean_gradient_fwd, _data_mean_gradient_bwd)


@jax.custom_vjp
def _data_mean_value(loss):
  """``lax.pmean(loss, DATA_AXIS)`` whose backward pass is the identity (each
  device differentiates its own examples' loss; the parameters' cotangent is
  averaged by :func:`_data_mean_gradient`); in float32 for a bfloat16 loss."""
  return elastic.cast_like(elastic.worker_mean(loss, DATA_AXIS), loss)


def _data_mean_value_fwd(loss):
  return _data_mean_value(loss), None


def _data_mean_value_bwd(_, cotangent):
  return (cotangent,)


_data_mean_value.defvjp(_data_mean_value_fwd, _data_mean_value_bwd)


def data_parallel_loss(loss_fn: Callable, layout: WorkerLayout) -> Callable:
  """A worker's loss over its D devices: the mean of its devices' losses, and
  the mean of their gradients.

  With ``layout.devices_per_worker`` D > 1 each device of a worker holds B / D
  of its B examples ("batch" values, module docstring). The returned loss
  is, on every device of the worker,

      L(x) = (1/D) sum_k L_k(x),      grad L(x) = (1/D) sum_k grad L_k(x)

  (L_k: ``loss_fn`` on device k's examples; both means one ``lax.pmean`` over
  :data:`DATA_AXIS` in ``easgd.core.elastic.reduction_dtype``, float32 for
  bfloat16, the result cast back, written as ``jax.custom_vjp`` identities, so no
  transposition rule of a collective is relied on). For a loss that is a
  mean over equal shards of the batch this is the loss and gradient of the
  worker's whole batch, so an algorithm's per-worker step, unchanged, takes
  the step of a worker of one device. The step's key is folded with the
  device's index in the worker (dropout masks differ between its devices).
  D = 1: ``loss_fn`` itself.

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> float32 scalar``
      (``easgd.core.base.LossFn``; no model state).
    layout: the worker layout.

  Returns:
    A loss function of the same signature, for the layout's mapped steps
    (:func:`map_step`) only when D > 1.
  """
  if layout.devices_per_worker == 1:
    return loss_fn
  if layout.shard_params:

    def sharded_loss(params, batch, key):
      key = jax.random.fold_in(key, jax.lax.axis_index(DATA_AXIS))
      leaves, tree = jax.tree.flatten(params)
      if len(leaves) != len(layout.param_leaves):
        raise LayoutError(
            f"shard_params: the loss got {len(leaves)} parameter leaves, the layout was made "
            f"for {len(layout.param_leaves)} (workers.shard_params of these parameters)"
        )
      whole = [_gather_slices(x, axis) for x, (_, axis) in zip(leaves, layout.param_leaves)]
      return _data_mean_value(loss_fn(jax.tree.unflatten(tree, whole), batch, key))

    return sharded_loss

  def loss(params, batch, key):
    key = jax.random.fold_in(key, jax.lax.axis_index(DATA_AXIS))
    return _data_mean_value(loss_fn(_data_mean_gradient(params), batch, key))

  return loss


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _gather_slices(x, axis):
  """The whole parameter from its D devices' slices (all-gather over "data"),
  whose backward pass reduce-scatters the cotangent as the mean over "data".
  Both carry :func:`easgd.core.elastic.reduction_dtype` values (float32 for
  bfloat16; exact for the gather), so the pair moves the bytes of the float32
  all-reduce it replaces, and the result has ``x``'s dtype."""
  wide = elastic.to_reduction_dtype(x)
  return jax.lax.all_gather(wide, DATA_AXIS, axis=axis, tiled=True).astype(x.dtype)


def _gather_slices_fwd(x, axis):
  return _gather_slices(x, axis), None


def _gather_slices_bwd(axis, _, cotangent):
  size = jax.lax.psum(1, DATA_AXIS)
  wide = elastic.to_reduction_dtype(cotangent)
  mean = jax.lax.psum_scatter(wide, DATA_AXIS, scatter_dimension=axis, tiled=True) / size
  return (mean.astype(cotangent.dtype),)


_gather_slices.defvjp(_gather_slices_fwd, _gather_slices_bwd)


LOSS_BYTES = 4
"""Bytes of the loss :func:`data_parallel_loss` averages over :data:`DATA_AXIS`
each step: one float32 scalar (``easgd.core.base.LossFn``)."""

LEVELS = {"across_workers": DEVICE_AXIS, "within_workers": DATA_AXIS}
"""The two levels of communication and the mesh axis each reduces over."""


class LevelCommunication(NamedTuple):
  """Communication by level: across workers and within each worker.

  Attributes:
    across_workers: the algorithm's own exchange
      (``Algorithm.communication``), reduced over the workers axis
      (``"devices"``: groups of p devices, one per worker, or with
      vmapped workers the d devices).
    within_workers: the data-parallel average inside a worker of D > 1
      devices (:func:`data_parallel_loss`), reduced over :data:`DATA_AXIS`
      (groups of the D devices of a worker); zero for D = 1.
  """

  across_workers: Communication
  within_workers: Communication


def communication_by_level(
    algorithm: Algorithm,
    num_steps: int,
    param_bytes: int,
    devices_per_worker: int = 1,
    shard_params: bool = False,
) -> LevelCommunication:
  r"""The all-reduces and bytes of ``num_steps`` steps, by level.

  Counted per device: every device of a worker runs the same program, and
  for D = 1 a device's count is its workers' (the vmapped workers' sum is
  formed before the cross-device all-reduce). Across workers, the
  algorithm's own count, unchanged (the layout decides where the rule runs,
  not how often it communicates); within a worker of D > 1 devices, every
  step one all-reduce over :data:`DATA_AXIS` of the gradient and the loss:

  .. math::

     N_\text{within} = n, \qquad B_\text{within} = n\,(P + 4)

  (n = ``num_steps``, P = ``param_bytes``, 4 = :data:`LOSS_BYTES`). The
  traced step holds two ``lax.pmean`` over "data" (the gradient in the
  backward pass, the loss in the forward one); no value of one depends on
  the other, and XLA's all-reduce combiner compiles them as one variadic
  all-reduce, which is what this counts (``tests/test_mesh.py`` reads the
  compiled programs' ``replica_groups``). A backend that does not combine
  them runs 2 all-reduces of the same bytes.

  With ``shard_params`` (:func:`shard_params`) each device holds 1/D of the
  parameter-shaped state: across workers it exchanges its slice, P / D
  bytes where the algorithm's count has P; within a worker the gradient's
  all-reduce becomes an all-gather of the parameters and a reduce-scatter
  of the gradient, the two halves of a ring all-reduce of P bytes, counted
  as the one all-reduce they replace (N and B as above).

  Args:
    algorithm: the algorithm (its ``communication`` counts from a Python tau).
    num_steps: steps taken, an int >= 0.
    param_bytes: bytes of one copy of the parameters (the gradient's size).
    devices_per_worker: D, an int >= 1.
    shard_params: the parameter-shaped state is split over the D devices.

  Returns:
    :class:`LevelCommunication` of ``easgd.core.base.Communication`` records.

  Raises:
    ValueError: num_steps < 0, param_bytes < 0 or devices_per_worker < 1
      (not an int).
    TypeError: from ``algorithm.communication`` built with an array tau.

  Example:
    >>> import optax
    >>> from easgd.core import algorithms
    >>> algo = algorithms.easgd(lambda p, b, k: 0.0, optax.sgd(0.1), num_workers=4, tau=4, beta=0.9)
    >>> levels = communication_by_level(algo, 8, 100, devices_per_worker=2)
    >>> levels.across_workers   # exchanges at t = 0 and 4
    Communication(all_reduces=2, bytes=200)
    >>> levels.within_workers   # every step: 100 gradient bytes + the 4-byte loss
    Communication(all_reduces=8, bytes=832)
  """
  n = checks.integer("num_steps", num_steps, 0)
  param_bytes = checks.integer("param_bytes", param_bytes, 0)
  D = checks.integer("devices_per_worker", devices_per_worker, 1)
  across = algorithm.communication(n, param_bytes // D if shard_params else param_bytes)
  within = Communication(n, n * (param_bytes + LOSS_BYTES)) if D > 1 else Communication(0, 0)
  return LevelCommunication(Communication(*map(int, across)), within)


def _put(tree, layout: WorkerLayout, kind: str = "worker", state: bool = False):
  """Places host arrays with leading axis num_groups, one slice per device
  (row of devices); ``kind`` "batch": :attr:`WorkerLayout.batch_sharding`;
  ``state`` (an algorithm's "worker" or "shared" state): parameter-shaped
  leaves split over "data" where the layout shards them (:func:`shard_params`).

  Every process passes the whole host array and places the slices of its own
  devices (``jax.make_array_from_callback``), so this works across processes.
  """
  sharding = layout.batch_sharding if kind == "batch" else layout.sharding
  tree = jax.tree.map(np.asarray, tree)
  if state and layout.shard_params:
    specs = _leaf_specs(tree, kind, layout)
    shardings = jax.tree.map(lambda p: jax.sharding.NamedSharding(layout.mesh, p), specs)
  else:
    shardings = jax.tree.map(lambda _: sharding, tree)

  def put(x, sharding):
    if jax.process_count() == 1:
      return jax.device_put(x, sharding)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, tree, shardings)


def replicate_per_worker(tree, layout: WorkerLayout):
  """Copies one value to every worker: leaves become [d, w, ...], bitwise equal.

  Args:
    tree: a pytree of arrays (any shapes and dtypes), e.g. ``Algorithm.init``'s
      worker state.
    layout: d = ``layout.num_groups`` devices (rows of D), w = workers per device.

  Returns:
    The pytree with leaves [d, w, *shape] (dtype kept), sharded over the devices.
  """
  d, w = layout.num_groups, layout.workers_per_device
  return _put(
      jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (d, w, *np.shape(x))), tree),
      layout,
      state=True,
  )


def replicate_per_device(tree, layout: WorkerLayout):
  """Copies one value to every device: leaves become [d, ...], bitwise equal.

  Args:
    tree: a pytree of arrays, e.g. ``Algorithm.init``'s shared state.
    layout: d = ``layout.num_groups`` devices (rows of D).

  Returns:
    The pytree with leaves [d, *shape] (dtype kept), sharded over the devices.
  """
  d = layout.num_groups
  return _put(
      jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (d, *np.shape(x))), tree),
      layout,
      "shared",
      state=True,
  )


def place_state(algorithm, params, layout: WorkerLayout, model_state=()):
  """An algorithm's initial state, placed on the layout's devices.

  ``algorithm.init(params)`` gives one worker's state and the shared state
  from the common initial parameters; every worker gets the same values
  (:func:`replicate_per_worker`) and every device the same shared state
  (:func:`replicate_per_device`).

  Args:
    algorithm: an ``easgd.core.algorithms.Algorithm``.
    params: the initial parameters (a pytree of arrays), the same for all.
    layout: the worker layout.
    model_state: the model's initial state (e.g. ``{"batch_stats": ...}``),
      the same for all, or ``()`` (``Algorithm.init``).

  Returns:
    ``(worker, shared)``: leaves [d, w, ...] and [d, ...] on the devices,
    ready for :func:`map_step`'s ``step_fn``.
  """
  worker, shared = algorithm.init(params, model_state)
  return replicate_per_worker(worker, layout), replicate_per_device(shared, layout)


def split_workers(tree, layout: WorkerLayout, kind: str = "worker", state: bool = False):
  """Reshapes host arrays with leading axis num_workers to [d, w, ...] on devices.

  Worker i goes to device i // w, local slot i % w (matching ``WORKER_AXES``).
  ``kind`` "batch" (leaves [num_workers, B, ...], a step's mini-batches):
  with ``devices_per_worker`` D > 1 each worker's B examples are split over
  its D devices (:attr:`WorkerLayout.batch_sharding`). ``state``: the
  algorithm's worker state (a checkpoint's), placed as :func:`place_state`
  places it (split over "data" where the layout shards parameters).

  Raises:
    LayoutError: if a leaf's leading axis is not num_workers.
  """
  d, w = layout.num_groups, layout.workers_per_device

  def reshape(x):
    x = np.asarray(x)
    if x.shape[:1] != (layout.num_workers,):
      raise LayoutError(
          f"expected a leading axis of num_workers=" f"{layout.num_workers}, got shape {x.shape}"
      )
    return x.reshape(d, w, *x.shape[1:])

  return _put(jax.tree.map(reshape, tree), layout, kind, state)


def split_local_workers(tree, layout: WorkerLayout, kind: str = "worker"):
  """Like :func:`split_workers`, from this process's workers only.

  Each process passes the values of its own workers, ``layout.local_workers``
  (all workers in a single process), and gets back the global [d, w, ...]
  arrays (``jax.make_array_from_process_local_data``; with
  ``devices_per_worker`` > 1, ``jax.make_array_from_callback`` over the
  process's workers: a worker spanning processes has its values on each of
  them, and each places the part its devices hold): the per-process data
  path of multi-process training: no process places another's batches.

  Args:
    tree: host arrays whose leading axis is this process's workers, in
      order (``layout.local_workers``; all workers in a single process).
    layout: the worker layout.
    kind: "worker" or "batch" (:func:`split_workers`).

  Returns:
    Global arrays [d, w, ...] sharded over ``layout.devices``.

  Raises:
    LayoutError: if a leaf's leading axis is not this process's worker count.
  """
  if layout.num_processes == 1:
    return split_workers(tree, layout, kind)
  sl = layout.local_workers
  n_local, w = sl.stop - sl.start, layout.workers_per_device
  sharding = layout.batch_sharding if kind == "batch" else layout.sharding

  def put(x):
    x = np.asarray(x)
    if x.shape[:1] != (n_local,):
      raise LayoutError(
          f"expected a leading axis of this process's {n_local} " f"workers, got shape {x.shape}"
      )
    local = x.reshape(n_local // w, w, *x.shape[1:])
    shape = (layout.num_groups, w, *x.shape[1:])
    if layout.devices_per_worker == 1:
      return jax.make_array_from_process_local_data(sharding, local, shape)
    # a worker of D devices may span processes: each process holds its
    # workers' whole values and places the slices its own devices hold (of a
    # "batch" value, a part of the worker's examples)
    first = sl.start // w

    def block(index):
      rows = index[0]
      start = (rows.start or 0) - first
      stop = (shape[0] if rows.stop is None else rows.stop) - first
      return local[(slice(start, stop), *index[1:])]

    return jax.make_array_from_callback(shape, sharding, block)

  return jax.tree.map(put, tree)


def to_host(tree):
  """Host NumPy copies of (global) arrays, gathered across processes if needed.

  Leaves that this process cannot address fully (multi-process runs) are
  gathered with ``multihost_utils.process_allgather``: a collective, so every
  process must call this at the same point. Others are ``np.asarray``.

  Args:
    tree: a pytree of arrays (jax.Array or NumPy).

  Returns:
    The pytree with NumPy leaves of the same global shapes and dtypes.
  """

  def host(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      from jax.experimental import multihost_utils

      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)

  return jax.tree.map(host, tree)


def merge_workers(tree):
  """Inverse of :func:`split_workers`: [d, w, ...] -> host [num_workers, ...].

  Gathers across processes (see :func:`to_host`).

  Args:
    tree: a pytree of "worker" values, leaves [d, w, *shape].

  Returns:
    The pytree with NumPy leaves [d * w, *shape], worker i at index i.
  """
  return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), to_host(tree))


def first_copy(tree):
  """The copy on the first local device of a ``"shared"`` value (host NumPy).

  Shared values are bitwise equal on all devices (they are the outputs of the
  same all-reduces); tests check this with :func:`shared_copies_equal`. No
  communication: in a multi-process run each process reads its own copy.

  Args:
    tree: a pytree of "shared" values, leaves [d, *shape].

  Returns:
    The pytree with NumPy leaves [*shape] (dtype kept).
  """

  def first(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      shard = min(x.addressable_shards, key=lambda s: s.index[0].start or 0)
      return np.asarray(shard.data)[0]
    return np.asarray(x[0])

  return jax.tree.map(first, tree)


def shared_copies_equal(tree) -> bool:
  """True if every device holds a bitwise equal copy of a ``"shared"`` value.

  Gathers across processes (see :func:`to_host`).
  """

  def equal(x):
    return all(x[i].tobytes() == x[0].tobytes() for i in range(1, x.shape[0]))

  return all(equal(x) for x in jax.tree.leaves(to_host(tree)))


def worker_index():
  """This worker's index in [0, num_workers), inside mapped per-worker code.

  Raises:
    easgd.core.elastic.MappingError: called outside a mapping.
  """
  from easgd.core import elastic

  return elastic.worker_index(WORKER_AXES)


def num_mapped_workers() -> int:
  """The number of workers, inside mapped per-worker code (a Python int).

  Raises:
    easgd.core.elastic.MappingError: called outside a mapping.
  """
  from easgd.core import elastic

  return elastic.worker_axis_size(WORKER_AXES)
