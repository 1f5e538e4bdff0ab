"""Synchronous warm-up: pmean SGD for the first K steps, then the algorithm (post-local SGD).

The rule, the handover at t = K and the step keys: docs/guides/algorithms.md
("Synchronous warm-up").

References:
  T. Lin, S. U. Stich, K. K. Patel, M. Jaggi. Don't use large mini-batches,
  use local SGD. ICLR 2020 (post-local SGD).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from optax.tree_utils import tree_where

from easgd._util import checks
from easgd.core import algorithms, elastic
from easgd.core.base import WARMUP, Algorithm, Communication, Program, check_exchange_flag
from easgd.core.elastic import WORKER_AXES

MAIN_KEY_STREAM = 1
"""``fold_in(key, MAIN_KEY_STREAM)`` is the wrapped algorithm's base key."""


class WarmupShared(NamedTuple):
  """Shared state of a warmed-up algorithm.

  Attributes:
    warm: the warm-up's one model (``easgd.core.algorithms.SharedModel``: params,
      optimizer state, its own step counter); unused after step K.
    inner: the wrapped algorithm's shared state (its clock counts from K).
    step: int32 scalar, the global clock t (steps taken).
  """

  warm: Any
  inner: Any
  step: jax.Array


def check_warmup_steps(warmup_steps) -> int:
  """K, an integer >= 1 (0 means no wrapper); else HyperparameterError."""
  return checks.integer(
      "sync_warmup_steps",
      warmup_steps,
      1,
      error=elastic.HyperparameterError,
      what="global steps of synchronous warm-up",
  )


def sync_warmup(
    algorithm: Algorithm,
    loss_fn,
    optimizer: optax.GradientTransformation,
    *,
    num_workers: int,
    warmup_steps: int,
    axis_name=WORKER_AXES,
) -> Algorithm:
  """``algorithm`` after ``warmup_steps`` steps of synchronous pmean SGD.

  Args:
    algorithm: a synchronous algorithm whose worker state has an ``opt_state``
      field (EASGD, EAMSGD, local SGD, DiLoCo), built with the same
      ``optimizer`` and, for local SGD and DiLoCo, with ``num_steps`` = the
      run's steps minus K (so its last step is the run's).
    loss_fn: the loss the algorithm was built with.
    optimizer: the local optimizer the algorithm was built with (the warm-up
      steps with it, and hands its state over).
    num_workers: p.
    warmup_steps: K, an integer >= 1 (global steps).
    axis_name: the mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named like ``algorithm``:
    ``exchange_at(t) = t < K or algorithm.exchange_at(t - K)`` (every warm-up
    step communicates), None when ``algorithm.exchange_at`` is None (an array
    tau). Its ``phases`` declare the two programs a driver that knows the
    clock runs instead of ``step`` (:func:`warmup_phases`):
    ``easgd.core.base.WARMUP`` (pmean SGD) for t < K, and ``None``
    (the handover at K, a select on the clock, then the algorithm's step,
    which takes ``exchange`` as the algorithm's does) for t >= K. ``step``
    itself runs every clock: with ``exchange=False`` the algorithm's local
    step, with ``True`` or None a ``lax.cond`` on the clock picks the warm-up
    or the algorithm. ``communication(n)`` counts min(n, K) parameter-sized
    all-reduces of the warm-up (none for p = 1) plus the algorithm's own over
    its n - K steps. ``hyperparameters`` add ``sync_warmup_steps``.

  Raises:
    HyperparameterError: K not an integer >= 1.
    TypeError: ``algorithm`` is not an Algorithm, is asynchronous, or is a
      one-model method (nothing to warm up).

  Example:
    >>> import jax.numpy as jnp, optax
    >>> loss_fn = lambda params, batch, key: jnp.mean((batch @ params) ** 2)
    >>> inner = algorithms.easgd(loss_fn, optax.sgd(0.1), num_workers=4, tau=4,
    ...                          beta=0.9)
    >>> algo = sync_warmup(inner, loss_fn, optax.sgd(0.1), num_workers=4,
    ...                    warmup_steps=100)

  References:
    Lin et al. (2020), post-local SGD.
  """
  _check_wrappable(algorithm)
  k = check_warmup_steps(warmup_steps)
  warm = algorithms.pmean_sgd(loss_fn, optimizer, num_workers=num_workers, axis_name=axis_name)
  phases = warmup_phases(algorithm, warm, k)
  warm_step, main_step = phases[WARMUP].step, phases[None].step

  def init(params, model_state=()):
    worker, inner = algorithm.init(params, model_state)
    if not hasattr(worker, "_replace") or "opt_state" not in getattr(worker, "_fields", ()):
      raise TypeError(
          f"sync_warmup needs a worker state with an opt_state field; "
          f"{algorithm.name!r} has {type(worker).__name__}"
      )
    return worker, WarmupShared(warm.init(params, model_state)[1], inner, jnp.zeros((), jnp.int32))

  def step(worker, shared, batch, key, exchange=None):
    check_exchange_flag(exchange)
    if exchange is False:  # the host's local program: t >= K, no communication
      return main_step(worker, shared, batch, key, False)
    return lax.cond(
        shared.step < k,
        lambda w, s: warm_step(w, s, batch, key),
        lambda w, s: main_step(w, s, batch, key, exchange),
        worker,
        shared,
    )

  return Algorithm(
      name=algorithm.name,
      init=init,
      step=step,
      center=_until_handover(k, lambda shared: algorithm.center(shared.inner)),
      worker_params=_until_handover(
          k, lambda worker, shared: algorithm.worker_params(worker, shared.inner)
      ),
      communication=_warmup_communication(warm, algorithm, k),
      hyperparameters=dict(algorithm.hyperparameters, sync_warmup_steps=k),
      exchange_at=_warmup_schedule(algorithm.exchange_at, k),
      phases=phases,
  )


def _check_wrappable(algorithm) -> None:
  """TypeError unless ``algorithm`` is a synchronous Algorithm with per-worker models."""
  if not isinstance(algorithm, Algorithm):
    raise TypeError(
        f"algorithm must be an easgd.core.algorithms.Algorithm, got " f"{type(algorithm).__name__}"
    )
  if algorithm.shared_model or algorithm.async_rules is not None:
    raise TypeError(
        f"sync_warmup wraps a synchronous algorithm with per-worker "
        f"models; {algorithm.name!r} is "
        f"{'a one-model method' if algorithm.shared_model else 'asynchronous'}"
    )


def warmup_phases(algorithm: Algorithm, warm: Algorithm, k: int) -> dict:
  """The two phases of ``algorithm`` after K steps of ``warm`` (``Algorithm.phases``).

  Args:
    algorithm: the wrapped algorithm (its clock counts from K).
    warm: the warm-up (pmean SGD with the algorithm's optimizer).
    k: K >= 1.

  Returns:
    ``{WARMUP: Program(warm_step, t < K), None: Program(main_step, t >= K,
    exchange_at)}`` on the :class:`WarmupShared` state: ``warm_step`` is a
    pmean SGD step on the warm-up's model; ``main_step`` the handover (at K:
    the algorithm's start from the warm-up's model and optimizer state, a
    select) then the algorithm's step with base key ``fold_in(key, 1)``,
    taking ``exchange`` as the algorithm's step does, on the schedule
    ``algorithm.exchange_at(t - K)`` (None for an array tau).
  """

  def handover(worker, shared):
    """The algorithm's state at step K, as a select (no branch): where the clock
    is K, the algorithm's start from the warm-up's model and optimizer state,
    elsewhere the state as it is."""
    model = shared.warm
    fresh, inner = algorithm.init(elastic.cast_like(model.params, worker.params), model.model_state)
    fresh = fresh._replace(opt_state=model.opt_state)
    at = shared.step == k
    return (
        tree_where(at, fresh, worker),
        shared._replace(inner=tree_where(at, inner, shared.inner)),
    )

  def main_step(worker, shared, batch, key, exchange=None):
    """A step at t >= K: the handover (at K), then the algorithm's step."""
    worker, shared = handover(worker, shared)
    key = jax.random.fold_in(key, MAIN_KEY_STREAM)
    worker, inner, loss = algorithm.step(
        worker, shared.inner, batch, key, **({} if exchange is None else dict(exchange=exchange))
    )
    return worker, WarmupShared(shared.warm, inner, shared.step + 1), loss

  def warm_step(worker, shared, batch, key):
    """A step at t < K: pmean SGD on the warm-up's model."""
    _, model, loss = warm.step((), shared.warm, batch, key)
    return worker, WarmupShared(model, shared.inner, shared.step + 1), loss

  inner_at = algorithm.exchange_at
  return {
      WARMUP: Program(warm_step, lambda t: t < k),
      None: Program(
          main_step, lambda t: t >= k, None if inner_at is None else (lambda t: inner_at(t - k))
      ),
  }


def _until_handover(k: int, inner_fn):
  """``fn(..., shared)``: the warm-up's model (in the dtype of ``inner_fn``'s
  result) while the clock is <= K, then ``inner_fn``'s (``center``,
  ``worker_params`` of the wrapped algorithm)."""

  def fn(*args):
    shared = args[-1]
    inner = inner_fn(*args)
    model = jax.tree.map(lambda a, b: a.astype(b.dtype), shared.warm.params, inner)
    return jax.tree.map(lambda a, b: jnp.where(shared.step <= k, a, b), model, inner)

  return fn


def _warmup_communication(warm: Algorithm, algorithm: Algorithm, k: int):
  """``communication(n)``: min(n, K) steps of ``warm``, then n - K of ``algorithm``."""

  def communication(num_steps, param_bytes):
    n = int(num_steps)
    first = warm.communication(min(n, k), param_bytes)
    rest = algorithm.communication(max(n - k, 0), param_bytes)
    return Communication(*(a + b for a, b in zip(first, rest)))

  return communication


def _warmup_schedule(inner_at, k: int):
  """``exchange_at(t) = t < K or inner_at(t - K)``; None when ``inner_at`` is."""
  if inner_at is None:
    return None

  def exchange_at(t):
    if isinstance(t, int):
      return t < k or bool(inner_at(t - k))
    return (t < k) | inner_at(t - k)

  return exchange_at
