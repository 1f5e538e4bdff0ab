"""Per-worker code mapped over a layout's workers: ``pmap`` or ``shard_map`` of ``vmap``.

Per-worker code names the axes :data:`WORKER_AXES` (``easgd.core.elastic``) in
its collectives; :func:`map_workers` binds them over devices ("devices": pmap
or shard_map, by ``WorkerLayout.backend``) of the workers vmapped on each
("local_workers"), worker index = device_index * workers_per_device +
local_index; :func:`vmap_workers` binds them with vmap alone;
:func:`map_step` compiles an algorithm's programs and runs the one its clock
names. See docs/guides/multi_device.md.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from easgd._util import checks
from easgd.core import elastic
from easgd.core.base import Algorithm, select_program
from easgd.core.elastic import DEVICE_AXIS, LOCAL_AXIS, WORKER_AXES
from easgd.parallel.worker_layout import DATA_AXIS, KINDS, WorkerLayout


def _vmap_axis(kind):
  return 0 if kind in ("worker", "batch") else None


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
      ``"batch"`` per argument / output (``worker_layout.KINDS``). Outputs cannot be
      ``"broadcast"`` or ``"batch"``.
    donate_argnums: arguments whose buffers may be reused for the outputs.
    keep_shards: with a layout that shards parameters
      (``easgd.parallel.data_parallel.shard_params``):
      ``fn`` is an algorithm's step (:data:`STEP_IN_KINDS` ->
      :data:`STEP_OUT_KINDS`) and sees, and returns, each device's slices of
      the split state (its rules elementwise, its loss
      ``data_parallel.data_parallel_loss``); False: split values are gathered before
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

  Each program of ``algorithm.programs()`` (``easgd.core.algorithms.Algorithm``:
  e.g. EASGD's step with the exchange and the one without any collective, a
  warm-up's pmean step) is mapped (:func:`map_workers`) and compiled once; each
  call runs the one ``algorithm.program_at(clock)`` names, so no ``lax.cond``
  and no all-reduce in a local step. ``clock`` is not read back from the
  device: with several programs each returns a NaN loss for every worker
  where its ``runs_at(shared.step)`` does not hold, so a clock that picks the
  wrong program shows as a non-finite loss. A shared-model algorithm
  (``algorithm.shared_model``) runs the workers of a device as one batch
  (one gradient per device: their gradients' mean for a loss that is a mean
  over the batch; each worker reports the device's mean loss). Results equal
  ``map_workers(algorithm.step, ...)``'s at the same clock up to float32
  rounding (``tests/test_map_step.py``).

  Args:
    algorithm: an ``easgd.core.algorithms.Algorithm``.
    layout: the worker layout.
    donate_state: donate the worker and shared state buffers (arguments 0, 1).
    merge_workers: run a shared-model algorithm's workers of a device as one
      batch (default); False: one pass per worker (models whose forward pass
      depends on the batch, e.g. BatchNorm).

  Returns:
    ``step_fn(worker, shared, batch, key, clock) -> (worker, shared, loss)``:
    worker values [d, w, ...], shared [d, ...], batch [d, w, B, ...], loss
    [d, w]; ``clock`` the host's int count of steps taken (the state's step
    counter). ``step_fn.programs`` maps each program's name (the exchange flag
    ``False``/``True``, ``None`` for a single program, ``"warmup"``) to the
    mapped function, e.g. for ``.lower(...)``.

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
        f"layout must be an easgd.parallel.worker_layout.WorkerLayout (make_layout), got "
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
  in_specs = tuple(layout.spec(k) for k in in_kinds)

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
  """:func:`_shard_map_workers` for a layout that shards parameters (``layout.shard_params``).

  The specs of "worker"/"shared" arguments are per leaf (``WorkerLayout.leaf_specs``,
  read from the arguments' shapes when the program is traced). With
  ``keep_shards`` (an algorithm's step) the per-device code sees each
  device's slices and the worker/shared outputs keep the inputs' specs;
  otherwise split leaves are all-gathered over "data" first and the outputs
  are whole (replicated along "data").
  """
  P = jax.sharding.PartitionSpec

  def specs_of(args):
    return tuple(
        layout.leaf_specs(a, k) if k in ("worker", "shared") else layout.spec(k)
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


def worker_index():
  """This worker's index in [0, num_workers), inside mapped per-worker code.

  Raises:
    easgd.core.elastic.MappingError: called outside a mapping.
  """
  return elastic.worker_index(WORKER_AXES)


def num_mapped_workers() -> int:
  """The number of workers, inside mapped per-worker code (a Python int).

  Raises:
    easgd.core.elastic.MappingError: called outside a mapping.
  """
  return elastic.worker_axis_size(WORKER_AXES)
