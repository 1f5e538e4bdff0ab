"""The data parallelism inside a worker of D > 1 devices: its loss and its sharded state.

:func:`data_parallel_loss` averages a worker's loss and gradient over the D
devices of its row (mesh axis "data"); :func:`shard_params` splits its
parameter-shaped state over them (FSDP / ZeRO-3 style). See
docs/guides/multi_device.md ("A worker of several devices", "Sharded
parameters inside a worker", "Precision").
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import numpy as np

from easgd.core import elastic
from easgd.parallel.names import shard_params_fits
from easgd.parallel.worker_layout import DATA_AXIS, LayoutError, WorkerLayout


def shard_params(layout: WorkerLayout, params) -> WorkerLayout:
  """The layout with each worker's parameter-shaped state split over its D devices.

  Every floating leaf of the worker and shared state whose shape is a
  parameter's (the parameters, the optimizer's and the algorithm's
  parameter-shaped state, the worker's copy of the center) is stored split
  over the worker's D devices along that parameter's first axis of a size
  divisible by D (1/D per device); the mapped step keeps the slices
  (``easgd.parallel.mapping.map_step``) and :func:`data_parallel_loss`
  gathers whole parameters for the loss. The algorithm's rules and the
  optimizer must be elementwise: an optimizer whose update reads the whole
  gradient (e.g. ``optax.clip_by_global_norm``) would see one device's
  slice. See docs/guides/multi_device.md ("Sharded parameters inside a worker").

  Args:
    layout: a layout of ``devices_per_worker`` D > 1 (backend "shard_map").
    params: one worker's parameters (a pytree of arrays; shapes only are read).

  Returns:
    The layout with ``param_leaves`` set: ``(shape, axis)`` per parameter leaf.

  Raises:
    LayoutError: D = 1, a layout of several processes (not supported: the
      host reads a worker's slices back on one process), or a parameter
      (named by its path) that is a scalar or has no axis whose size D
      divides.
  """
  D = layout.devices_per_worker
  if not shard_params_fits(D):
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
  r"""A worker's loss over its D devices: the mean of its devices' losses and gradients.

  With ``layout.devices_per_worker`` D > 1 each device of a worker holds B / D
  of its B examples ("batch" values). On every device of the worker

  .. math::

     L(x) = \frac{1}{D} \sum_k L_k(x), \qquad \nabla L(x) = \frac{1}{D} \sum_k \nabla L_k(x)

  (L_k: ``loss_fn`` on device k's examples), each mean one ``lax.pmean`` over
  :data:`DATA_AXIS` in ``easgd.core.elastic.reduction_dtype`` (float32 for
  bfloat16), cast back to the value's dtype. For a loss that is a mean over
  equal shards of the batch this is the worker's loss and gradient on its
  whole batch, up to the order of the sums. The key is folded with the
  device's index in the worker. With ``layout.shard_params`` the parameters
  arrive as slices: all-gathered for the forward pass, the gradient
  reduce-scattered (the same mean). See docs/guides/multi_device.md.

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> float32 scalar``
      (``easgd.core.base.LossFn``; no model state).
    layout: the worker layout.

  Returns:
    ``loss_fn`` itself for D = 1; else a loss function of the same
    signature, to be called only inside the layout's mapped steps
    (``easgd.parallel.mapping.map_step``).

  Raises:
    LayoutError (from the returned loss, at trace time): with
      ``shard_params``, parameters with another number of leaves than the
      layout was made for.
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
            f"for {len(layout.param_leaves)} (data_parallel.shard_params of these parameters)"
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
