"""Host values on a layout's devices and back: place, split and merge workers, read copies.

Placed values have a leading axis of ``layout.num_groups`` d device rows:
"worker" values [d, w, ...], "shared" values [d, ...]
(``easgd.parallel.worker_layout.KINDS``); worker i is at [i // w, i % w].
Each process places and reads the slices of its own devices.
"""

from __future__ import annotations

import jax
import numpy as np

from easgd.parallel.worker_layout import LayoutError, WorkerLayout


def _put(tree, layout: WorkerLayout, kind: str = "worker", state: bool = False):
  """Places host arrays with leading axis num_groups, one slice per device
  (row of devices); ``kind`` "batch": :attr:`WorkerLayout.batch_sharding`;
  ``state`` (an algorithm's "worker" or "shared" state): parameter-shaped
  leaves split over "data" where the layout shards them (``layout.shard_params``).

  Every process passes the whole host array and places the slices of its own
  devices (``jax.make_array_from_callback``), so this works across processes.
  """
  sharding = layout.batch_sharding if kind == "batch" else layout.sharding
  tree = jax.tree.map(np.asarray, tree)
  if state and layout.shard_params:
    specs = layout.leaf_specs(tree, kind)
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
    ready for ``easgd.parallel.mapping.map_step``'s ``step_fn``.
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
