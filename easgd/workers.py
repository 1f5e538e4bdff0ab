"""Worker mapping: p workers on d devices, per-worker code written once.

Per-worker code names one axis, :data:`WORKER_AXES`, in its collectives and in
``lax.axis_index``. This module runs such code with ``jax.pmap`` over devices
(axis ``"devices"``) of ``jax.vmap`` over the workers that share a device (axis
``"local_workers"``); the pair enumerates all ``num_workers`` workers, worker
index = device_index * workers_per_device + local_index.

Argument kinds of a mapped function (see :func:`map_workers`):
  ``"worker"``  one value per worker: arrays of shape [d, w, ...]
                (d devices, w = num_workers / d workers per device);
  ``"shared"``  one value per device, equal on all devices (e.g. the center):
                arrays of shape [d, ...]; per-worker code must return it
                unbatched (computed by collectives), so it stays replicated;
  ``"broadcast"`` the same value for everyone, passed as is (no leading axis).

This is the only module that knows about devices; swapping the backend
(pmap built on shard_map in current JAX) happens here.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

DEVICE_AXIS = "devices"
LOCAL_AXIS = "local_workers"
WORKER_AXES = (DEVICE_AXIS, LOCAL_AXIS)
"""The axis name that per-worker collectives use: all workers, all devices."""

KINDS = ("worker", "shared", "broadcast")


class LayoutError(ValueError):
  """num_workers and the devices cannot be laid out as asked."""


@dataclasses.dataclass(frozen=True)
class WorkerLayout:
  """How ``num_workers`` workers sit on devices.

  Attributes:
    num_workers: total number of workers p.
    devices: the devices used, one pmap shard each.
  """
  num_workers: int
  devices: tuple[Any, ...]

  @property
  def num_devices(self) -> int:
    return len(self.devices)

  @property
  def workers_per_device(self) -> int:
    return self.num_workers // self.num_devices

  def describe(self) -> str:
    return (f"{self.num_workers} workers = {self.num_devices} device(s) x "
            f"{self.workers_per_device} vmapped worker(s) "
            f"[{self.devices[0].platform}]")


def make_layout(num_workers: int, num_devices: int | None = None,
                devices: Sequence[Any] | None = None) -> WorkerLayout:
  """Chooses the devices for ``num_workers`` workers.

  Args:
    num_workers: number of workers p, an integer >= 1.
    num_devices: devices to use; must divide ``num_workers`` and be at most the
      number available. ``None`` takes the largest available count that divides
      ``num_workers``.
    devices: the candidate devices; default ``jax.local_devices()``.

  Returns:
    A :class:`WorkerLayout`.

  Raises:
    LayoutError: if num_workers is not an integer >= 1, if num_devices is more
      than available, or if num_workers is not a multiple of num_devices.
  """
  if (isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral)
      or num_workers < 1):
    raise LayoutError(f"num_workers must be an integer >= 1, got {num_workers!r}")
  available = list(devices) if devices is not None else jax.local_devices()
  if num_devices is None:
    num_devices = max(d for d in range(1, min(num_workers, len(available)) + 1)
                      if num_workers % d == 0)
  if (isinstance(num_devices, bool) or not isinstance(num_devices, numbers.Integral)
      or num_devices < 1):
    raise LayoutError(f"num_devices must be an integer >= 1, got {num_devices!r}")
  if num_devices > len(available):
    raise LayoutError(
        f"num_devices={num_devices} but only {len(available)} "
        f"{available[0].platform} device(s) are available")
  if num_workers % num_devices:
    raise LayoutError(
        f"num_workers={num_workers} is not a multiple of the {num_devices} "
        f"devices used; allowed: a multiple of {num_devices}")
  return WorkerLayout(int(num_workers), tuple(available[:num_devices]))


def _vmap_axis(kind):
  return 0 if kind == "worker" else None


def _pmap_axis(kind):
  return None if kind == "broadcast" else 0


def map_workers(fn: Callable, layout: WorkerLayout, in_kinds: Sequence[str],
                out_kinds: Sequence[str], donate_argnums: Sequence[int] = ()
                ) -> Callable:
  """Maps per-worker ``fn`` over all workers of ``layout``.

  ``fn`` sees one worker's values (no leading axes) and may use collectives over
  :data:`WORKER_AXES`. The result is ``pmap(vmap(fn))``: compiled once per input
  shape, placed on ``layout.devices``.

  Args:
    fn: per-worker function of ``len(in_kinds)`` positional arguments returning a
      tuple of ``len(out_kinds)`` values.
    layout: the worker layout.
    in_kinds, out_kinds: one of ``"worker"``, ``"shared"``, ``"broadcast"`` per
      argument / output (module docstring). Outputs cannot be ``"broadcast"``.
    donate_argnums: arguments whose buffers may be reused for the outputs.

  Returns:
    The mapped function.

  Raises:
    ValueError: for an unknown kind.
  """
  for k in (*in_kinds, *out_kinds):
    if k not in KINDS:
      raise ValueError(f"unknown argument kind {k!r}; allowed: {KINDS}")
  if "broadcast" in out_kinds:
    raise ValueError("outputs are 'worker' or 'shared', not 'broadcast'")
  single = len(out_kinds) == 1
  inner = jax.vmap(fn, in_axes=tuple(_vmap_axis(k) for k in in_kinds),
                   out_axes=(_vmap_axis(out_kinds[0]) if single else
                             tuple(_vmap_axis(k) for k in out_kinds)),
                   axis_name=LOCAL_AXIS)
  return jax.pmap(inner, axis_name=DEVICE_AXIS,
                  in_axes=tuple(_pmap_axis(k) for k in in_kinds),
                  devices=layout.devices, donate_argnums=tuple(donate_argnums))


def _put(tree, layout: WorkerLayout):
  """Places arrays with leading axis num_devices, one slice per device."""
  mesh = jax.sharding.Mesh(np.array(layout.devices), (DEVICE_AXIS,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(DEVICE_AXIS))
  return jax.tree.map(lambda x: jax.device_put(np.asarray(x), sharding), tree)


def replicate_per_worker(tree, layout: WorkerLayout):
  """Copies one value to every worker: leaves become [d, w, ...], bitwise equal."""
  d, w = layout.num_devices, layout.workers_per_device
  return _put(jax.tree.map(
      lambda x: np.broadcast_to(np.asarray(x), (d, w, *np.shape(x))), tree), layout)


def replicate_per_device(tree, layout: WorkerLayout):
  """Copies one value to every device: leaves become [d, ...], bitwise equal."""
  d = layout.num_devices
  return _put(jax.tree.map(
      lambda x: np.broadcast_to(np.asarray(x), (d, *np.shape(x))), tree), layout)


def split_workers(tree, layout: WorkerLayout):
  """Reshapes host arrays with leading axis num_workers to [d, w, ...] on devices.

  Worker i goes to device i // w, local slot i % w (matching ``WORKER_AXES``).

  Raises:
    LayoutError: if a leaf's leading axis is not num_workers.
  """
  d, w = layout.num_devices, layout.workers_per_device

  def reshape(x):
    x = np.asarray(x)
    if x.shape[:1] != (layout.num_workers,):
      raise LayoutError(f"expected a leading axis of num_workers="
                        f"{layout.num_workers}, got shape {x.shape}")
    return x.reshape(d, w, *x.shape[1:])
  return _put(jax.tree.map(reshape, tree), layout)


def merge_workers(tree):
  """Inverse of :func:`split_workers`: [d, w, ...] -> host [num_workers, ...]."""
  return jax.tree.map(lambda x: np.asarray(x).reshape(-1, *x.shape[2:]), tree)


def first_copy(tree):
  """The copy on the first device of a ``"shared"`` value (host NumPy arrays).

  Shared values are bitwise equal on all devices (they are the outputs of the
  same all-reduces); tests check this with :func:`shared_copies_equal`.
  """
  return jax.tree.map(lambda x: np.asarray(x[0]), tree)


def shared_copies_equal(tree) -> bool:
  """True if every device holds a bitwise equal copy of a ``"shared"`` value."""
  def equal(x):
    x = np.asarray(x)
    return all(x[i].tobytes() == x[0].tobytes() for i in range(1, x.shape[0]))
  return all(equal(x) for x in jax.tree.leaves(tree))


def worker_index():
  """This worker's index in [0, num_workers), inside mapped per-worker code."""
  return jax.lax.axis_index(WORKER_AXES)


def num_mapped_workers():
  """The number of workers, inside mapped per-worker code."""
  return jax.lax.psum(jnp.int32(1), WORKER_AXES)
