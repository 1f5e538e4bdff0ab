"""Communication by level: the algorithm's exchange across workers and the data-parallel
average within a worker of D devices (docs/guides/multi_device.md, "Communication by level").
"""

from __future__ import annotations

from typing import NamedTuple

from easgd._util import checks
from easgd.core.base import Algorithm, Communication
from easgd.core.elastic import DEVICE_AXIS
from easgd.parallel.worker_layout import DATA_AXIS

LOSS_BYTES = 4
"""Bytes of the loss ``data_parallel.data_parallel_loss`` averages over ``"data"``
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
      devices (``data_parallel.data_parallel_loss``), reduced over ``"data"``
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
    program: bool = False,
) -> LevelCommunication:
  r"""The all-reduces and bytes of ``num_steps`` steps, by level, per device.

  Across workers: the algorithm's own count (``algorithm.communication``),
  with P / D bytes in place of P under ``shard_params``; with ``program``,
  what its compiled programs send (``algorithm.wire_communication``: a
  simulated asynchronous method gathers every worker's message every slot). Within a worker of
  D > 1 devices, every step one all-reduce of the gradient and the loss over
  "data" (XLA combines the two means into one, ``tests/test_mesh.py`` reads
  the compiled programs; a backend that does not runs 2 of the same bytes;
  with ``shard_params`` the all-gather and reduce-scatter counted as the one
  all-reduce they replace):

  .. math::

     N_\text{within} = n, \qquad B_\text{within} = n\,(P + 4)

  (n = ``num_steps``, P = ``param_bytes``, 4 = :data:`LOSS_BYTES`); zero for
  D = 1. See docs/guides/multi_device.md ("Communication by level").

  Args:
    algorithm: the algorithm (its ``communication`` counts from a Python tau).
    num_steps: steps taken, an int >= 0.
    param_bytes: bytes of one copy of the parameters (the gradient's size).
    devices_per_worker: D, an int >= 1.
    shard_params: the parameter-shaped state is split over the D devices.
    program: count the compiled programs' traffic across workers
      (``Algorithm.wire_communication``) instead of the method's.

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
    Communication(all_reduces=2, bytes=200, all_gathers=0, gathered_bytes=0)
    >>> levels.within_workers   # every step: 100 gradient bytes + the 4-byte loss
    Communication(all_reduces=8, bytes=832, all_gathers=0, gathered_bytes=0)
  """
  n = checks.integer("num_steps", num_steps, 0)
  param_bytes = checks.integer("param_bytes", param_bytes, 0)
  D = checks.integer("devices_per_worker", devices_per_worker, 1)
  count = algorithm.wire_communication if program else algorithm.communication
  across = count(n, param_bytes // D if shard_params else param_bytes)
  within = Communication(n, n * (param_bytes + LOSS_BYTES)) if D > 1 else Communication(0, 0)
  return LevelCommunication(Communication(*map(int, across)), within)
