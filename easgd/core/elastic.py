"""The elastic-averaging update rules of EASGD as pure pytree functions.

Everything in this module is the paper's arithmetic and nothing else: no data, no
models, no device placement, no ``jit``. The functions take parameter pytrees
(any nesting of arrays; shapes and dtypes are preserved leaf by leaf) and, where
workers must talk, a named mapped axis over which they all-reduce. Callers
(``easgd.core.algorithms``) decide how to compile and place them.

Notation (``../paper_notes`` and the paper, Section 3):
  x^i     parameters of worker i (``params``)
  x~      center variable (``center``)
  alpha   moving rate, alpha = eta * rho (``alpha``)
  beta    center moving rate, beta = p * alpha (``beta``)
  tau     communication period (``tau``)

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651).
"""

from __future__ import annotations

import math
from typing import Any, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from optax.tree_utils import tree_add, tree_sub  # leafwise a + b and a - b

from easgd._util import checks

Params = Any  # a pytree of arrays
AxisName = Hashable | Sequence[Hashable]

DEVICE_AXIS = "devices"
LOCAL_AXIS = "local_workers"
WORKER_AXES = (DEVICE_AXIS, LOCAL_AXIS)
"""The axis name per-worker code uses for its collectives: all workers, all
devices (``easgd.parallel.mapping`` binds it: devices mapped, the workers of a device
vmapped). Every algorithm's default ``axis_name``."""


class HyperparameterError(ValueError):
  """A hyperparameter of an update rule is outside its allowed range."""


class MappingError(NameError):
  """Per-worker code ran outside a mapping that binds its worker axis."""


def _unmapped(axis_name) -> MappingError:
  return MappingError(
      f"easgd per-worker code ran outside a worker mapping: its axis {axis_name!r} "
      "is not bound; run an algorithm's step through easgd.parallel.mapping.map_step(algorithm, "
      "layout), any per-worker function through easgd.parallel.mapping.map_workers(fn, layout, "
      "in_kinds, out_kinds), or bind the axis yourself (jax.vmap(..., axis_name=...))"
  )


def worker_axis_size(axis_name: AxisName = WORKER_AXES) -> int:
  """The number of workers on the mapped axis ``axis_name`` (a Python int).

  Raises:
    MappingError: the axis is not bound (called outside a mapping).
  """
  try:
    return int(lax.axis_size(axis_name))
  except NameError:
    raise _unmapped(axis_name) from None


def worker_index(axis_name: AxisName = WORKER_AXES) -> jax.Array:
  """This worker's index in [0, num_workers) on ``axis_name`` (int32 scalar).

  Raises:
    MappingError: the axis is not bound (called outside a mapping).
  """
  try:
    return lax.axis_index(axis_name)
  except NameError:
    raise _unmapped(axis_name) from None


def reduction_dtype(dtype) -> jnp.dtype:
  """The dtype in which values of ``dtype`` are summed across workers and kept
  in a center: at least float32 (bfloat16 and float16 -> float32; float32 and
  float64 unchanged; non-float dtypes unchanged).

  A sum of p bfloat16 values rounds to 8 bits of mantissa at every exchange, so
  a center kept in bfloat16 drifts from the exact one; the precision policy of
  this package keeps centers, elastic differences and averaged gradients in
  this dtype whatever the parameters' dtype is.
  """
  dtype = jnp.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.floating):
    return dtype
  return jnp.promote_types(dtype, jnp.float32)


def to_reduction_dtype(tree: Params) -> Params:
  """``tree`` with every float leaf cast to :func:`reduction_dtype` of its dtype."""
  return jax.tree.map(lambda x: jnp.asarray(x).astype(reduction_dtype(jnp.result_type(x))), tree)


def reduced_bytes(tree: Params) -> int:
  """Bytes of one copy of ``tree`` held in :func:`reduction_dtype`: what one
  exchange or one gradient average of it moves per device.

  Args:
    tree: a pytree of arrays or ``jax.ShapeDtypeStruct`` leaves (any shapes).

  Returns:
    int, bytes: sum over leaves of elements times the itemsize of the leaf's
    reduction dtype (a bfloat16 leaf counts 4 bytes an element, a float32
    leaf 4, a float64 leaf 8, an integer leaf its own size).
  """
  return int(
      sum(
          math.prod(np.shape(x)) * reduction_dtype(jnp.result_type(x)).itemsize
          for x in jax.tree.leaves(tree)
      )
  )


def cast_like(tree: Params, like: Params) -> Params:
  """``tree`` with each leaf cast to the dtype of the matching leaf of ``like``."""
  return jax.tree.map(lambda x, ref: jnp.asarray(x).astype(jnp.result_type(ref)), tree, like)


def worker_sum(tree: Params, axis_name: AxisName | None = WORKER_AXES) -> Params:
  """The sum over all workers of ``tree``, in :func:`reduction_dtype`.

  One all-reduce (``lax.psum``) over ``axis_name``. ``axis_name=None`` means a
  single worker: there is nothing to reduce, no collective is emitted and the
  value is returned (cast). The algorithms pass None when ``num_workers`` is 1.

  Raises:
    MappingError: ``axis_name`` is not bound (called outside a mapping).
  """
  return _all_reduce(lax.psum, tree, axis_name)


def worker_mean(tree: Params, axis_name: AxisName | None = WORKER_AXES) -> Params:
  """The mean over all workers of ``tree``, in :func:`reduction_dtype`
  (``lax.pmean``; ``axis_name=None``: a single worker, no collective).

  Raises:
    MappingError: ``axis_name`` is not bound (called outside a mapping).
  """
  return _all_reduce(lax.pmean, tree, axis_name)


def _all_reduce(reduce, tree: Params, axis_name: AxisName | None) -> Params:
  """``reduce(tree, axis_name)`` (psum or pmean) in :func:`reduction_dtype`; the
  cast tree itself for ``axis_name=None``; MappingError when the axis is unbound."""
  tree = to_reduction_dtype(tree)
  if axis_name is None:
    return tree
  try:
    return reduce(tree, axis_name)
  except NameError:
    raise _unmapped(axis_name) from None


def reduce_axis(num_workers: int, axis_name: AxisName) -> AxisName | None:
  """The axis an algorithm of ``num_workers`` workers reduces over: None for
  a single worker (no collective, nothing communicated), else ``axis_name``."""
  return None if num_workers == 1 else axis_name


def is_array_hyperparameter(value) -> bool:
  """True for a hyperparameter given as a JAX array (a concrete array or a tracer).

  The factories check Python numbers (:class:`HyperparameterError`) and take JAX
  arrays unchecked (they may be traced): docs/guides/algorithms.md ("Array
  hyperparameters").
  """
  return isinstance(value, jax.Array)


def check_tau(tau, *, allow_array: bool = False) -> int | jax.Array:
  """Checks the communication period and returns it as an int.

  Args:
    tau: communication period in local steps; an integer >= 1, or (with
      ``allow_array``) an integer JAX array, returned unchecked (see
      :func:`is_array_hyperparameter`).
    allow_array: accept a JAX array (for algorithms whose exchange is also
      decided on the device from the clock).

  Returns:
    ``int(tau)``, or the array.

  Raises:
    HyperparameterError: if ``tau`` is not an integer >= 1 (nor an allowed
      array).
  """
  if allow_array and is_array_hyperparameter(tau):
    return tau
  return checks.integer("tau", tau, 1, error=HyperparameterError, what="communication period")


def resolve_alpha(
    num_workers: int, alpha: float | jax.Array | None = None, beta: float | jax.Array | None = None
) -> float | jax.Array:
  """Returns the moving rate alpha from either alpha or beta = num_workers * alpha.

  The paper (Section 3, "elastic symmetry") ties the center's moving rate to the
  workers': beta = p * alpha. Its experiments fix beta = 0.9, so alpha = 0.9 / p.
  Exactly one of ``alpha`` and ``beta`` must be given. There is no division by
  tau anywhere: alpha is the pull applied at each exchange.

  Args:
    num_workers: number of workers p; an integer >= 1.
    alpha: moving rate of each worker, a real >= 0 or a JAX array (unchecked,
      see :func:`is_array_hyperparameter`).
    beta: moving rate of the center, a real >= 0 or a JAX array (unchecked).

  Returns:
    alpha as a Python float, or as an array (``beta / num_workers`` for an
    array beta).

  Raises:
    HyperparameterError: if both or neither of alpha and beta are given, if
      a Python value is negative or not finite, or if num_workers is not an
      integer >= 1.
  """
  checks.integer("num_workers", num_workers, 1, error=HyperparameterError)
  if (alpha is None) == (beta is None):
    raise HyperparameterError(
        f"give exactly one of alpha and beta (beta = num_workers * alpha), "
        f"got alpha={alpha!r}, beta={beta!r}"
    )
  name, value = ("alpha", alpha) if alpha is not None else ("beta", beta)
  if is_array_hyperparameter(value):
    return value if alpha is not None else value / num_workers
  value = checks.real(name, value, 0, error=HyperparameterError)
  return value if alpha is not None else value / num_workers


def is_exchange_step(clock, tau):
  """True where the worker clock is a multiple of tau (clock 0 exchanges).

  Args:
    clock: int32 scalar or array, the worker's local step count t^i (from 0).
    tau: communication period (int or traced int32 scalar), >= 1.

  Returns:
    A bool array of the shape of ``clock``.

  References:
    Algorithm 1 and 2 of the paper ("if tau divides t^i").
  """
  return jnp.asarray(clock) % tau == 0


def on_exchange(exchange, sync, keep):
  """``sync()`` on an exchange step, ``keep()`` otherwise: the one switch of every
  algorithm that communicates on some steps only.

  A Python bool picks the branch while the step is traced (the host knows the
  schedule: one program with the communication, one without, and no
  conditional in either, see ``easgd.parallel.mapping.map_step``); a bool scalar array
  (the device's clock test) runs ``lax.cond``, so the communication in
  ``sync`` happens only on exchange steps. Under ``vmap`` with a batched flag
  the cond becomes a select (both branches run).

  Args:
    exchange: a Python bool or a bool scalar array.
    sync, keep: functions of no argument returning pytrees of the same
      structure, shapes and dtypes.

  Returns:
    What the chosen branch returns.
  """
  if isinstance(exchange, bool):
    return sync() if exchange else keep()
  return lax.cond(exchange, lambda _: sync(), lambda _: keep(), None)


def elastic_difference(params: Params, center: Params, alpha) -> Params:
  r"""The elastic force :math:`\alpha (x^i - \tilde x)`, leaf by leaf.

  Args:
    params: worker parameters x^i, a pytree of float arrays.
    center: center variable x~, a pytree of the same structure, shapes, dtypes.
    alpha: moving rate (float or traced scalar).

  Returns:
    A pytree like ``params``: alpha * (x^i - x~), computed and returned in
    :func:`reduction_dtype` (float32 for bfloat16 parameters).

  References:
    Eq. (5)-(6) and Algorithm 1 of the paper.
  """

  def diff(x, c):
    dtype = reduction_dtype(jnp.promote_types(jnp.result_type(x), jnp.result_type(c)))
    return (alpha * (x.astype(dtype) - c.astype(dtype))).astype(dtype)

  return jax.tree.map(diff, params, center)


def elastic_exchange(
    params: Params, center: Params, alpha, axis_name: AxisName | None
) -> tuple[Params, Params]:
  r"""One synchronous elastic exchange between every worker and the center.

  Every worker computes its elastic difference d^i = alpha * (x^i - x~) from the
  values it holds now; the worker moves by -d^i and the center by the SUM over
  workers of d^i (one all-reduce of a parameter-sized tree), the elastic terms
  of eq. (5)-(6), with beta = p * alpha:

  .. math::

     x^i &\leftarrow x^i - \alpha (x^i - \tilde x) \\
     \tilde x &\leftarrow \tilde x + \alpha \sum_{i=1}^{p} (x^i - \tilde x)
       = (1 - \beta)\, \tilde x + \beta\, \frac{1}{p} \sum_{i=1}^{p} x^i

  Must be called inside a mapped context (vmap/pmap/shard_map) that binds
  ``axis_name``; the returned center is identical on every worker. The
  differences and their sum are formed in :func:`reduction_dtype` (float32
  for bfloat16 parameters); the worker's result is cast back to its dtype,
  the center's to the center's.

  Args:
    params: this worker's parameters x^i (a pytree).
    center: the center x~ (same structure), the same value on all workers.
    alpha: moving rate, float >= 0 or traced scalar.
    axis_name: the mapped axis (or tuple of axes) that enumerates all workers;
      None for a single worker (no collective, see :func:`worker_sum`).

  Returns:
    ``(new_params, new_center)``, of the dtypes of ``params`` and ``center``.

  Raises:
    MappingError: ``axis_name`` is not bound (called outside a mapping).

  References:
    Eq. (5)-(6) (elastic terms only) of the paper.
  """
  diff = elastic_difference(params, center, alpha)
  return (
      cast_like(tree_sub(params, diff), params),
      cast_like(tree_add(center, worker_sum(diff, axis_name)), center),
  )


def easgd_update(
    params: Params, updates: Params, center: Params, alpha, exchange, axis_name: AxisName | None
) -> tuple[Params, Params]:
  r"""Synchronous EASGD step with communication period tau (eq. 5-6).

  With u^i_t = ``updates`` the local optimizer's step computed at x^i_t (for
  plain SGD, :math:`u^i_t = -\eta\, g^i_t(x^i_t)`), on exchange steps (tau
  divides the clock):

  .. math::

     x^i_{t+1} &= x^i_t + u^i_t - \alpha (x^i_t - \tilde x_t) \qquad (5) \\
     \tilde x_{t+1} &= \tilde x_t + \alpha \sum_{i=1}^{p} (x^i_t - \tilde x_t) \qquad (6)

  and otherwise :math:`x^i_{t+1} = x^i_t + u^i_t`, :math:`\tilde x_{t+1} = \tilde x_t`.

  Both updates read the time-t values. A Python bool ``exchange`` picks the
  branch while tracing: the program holds either the exchange (one all-reduce)
  or the local step, with no conditional (what callers use when the schedule
  is known on the host, see ``easgd.parallel.mapping.map_step``). Otherwise the exchange
  is a ``lax.cond`` on an unbatched ``exchange`` flag, so the all-reduce runs
  only on exchange steps. ``exchange`` must be the same on every worker (a
  shared clock); if it is batched under ``vmap`` the cond becomes a select and
  the all-reduce runs every step (still correct, no longer
  communication-saving).

  Args:
    params: worker parameters x^i_t (pytree of float arrays).
    updates: local optimizer update at x^i_t, same structure as ``params``.
    center: center x~_t, same structure, identical on all workers.
    alpha: moving rate (float or traced scalar) >= 0.
    exchange: True on steps where tau divides the clock (see
      :func:`is_exchange_step`): a Python bool (branch fixed at trace time) or
      a bool scalar array (``lax.cond``).
    axis_name: mapped axis (or tuple of axes) enumerating all workers; None
      for a single worker (no collective).

  Returns:
    ``(params_{t+1}, center_{t+1})`` in the dtypes of ``params`` and
    ``center``; the elastic differences and their sum are formed in
    :func:`reduction_dtype` (float32 for bfloat16 parameters).

  Raises:
    MappingError: ``axis_name`` is not bound (called outside a mapping).

  References:
    Eq. (5)-(6) of the paper, with the communication period of Algorithm 1.
  """

  def exchange_branch():
    diff = elastic_difference(params, center, alpha)
    new_params = cast_like(tree_add(tree_sub(params, diff), updates), params)
    return new_params, cast_like(tree_add(center, worker_sum(diff, axis_name)), center)

  def local_branch():
    return cast_like(tree_add(params, updates), params), center

  return on_exchange(exchange, exchange_branch, local_branch)


def tree_l2_distance(a: Params, b: Params) -> jax.Array:
  """Euclidean norm ||a - b||_2 over all leaves (float32 scalar)."""
  sq = [
      jnp.sum(jnp.square((x - y).astype(jnp.float32)))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  ]
  return jnp.sqrt(sum(sq)) if sq else jnp.float32(0)
