r"""The local step of every algorithm: Nesterov momentum of eq. (7), the one loss-and-gradient.

EAMSGD's velocity v^i never leaves the worker (not communicated, pulled or reset); the
gradient is taken at the look-ahead point of the pre-exchange snapshot. "-eta g" is
generalised to the local optimizer's update (``optax.sgd(eta)`` gives eq. (7) exactly).
Nothing here knows about workers.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (7) and Algorithm 2.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from easgd._util import checks
from easgd.core import elastic

Params = Any
LossFn = Callable[[Params, Any, jax.Array], jax.Array]


def check_momentum(momentum) -> float | jax.Array:
  """Checks the Nesterov momentum delta and returns it as a float.

  Args:
    momentum: delta, a real in [0, 1) (the paper uses 0.99), or a JAX array,
      returned unchecked (``easgd.core.elastic.is_array_hyperparameter``: it may be
      traced, e.g. vmapped over configurations).

  Returns:
    ``float(momentum)``, or the array.

  Raises:
    HyperparameterError: if ``momentum`` is not a real in [0, 1) (nor an array).
  """
  if elastic.is_array_hyperparameter(momentum):
    return momentum
  return checks.real(
      "momentum",
      momentum,
      0,
      1,
      open_high=True,
      error=elastic.HyperparameterError,
      what="Nesterov delta",
  )


def lookahead_point(params: Params, velocity: Params, momentum) -> Params:
  """The Nesterov look-ahead point x + delta v, leaf by leaf."""
  return jax.tree.map(lambda x, v: (x + momentum * v).astype(x.dtype), params, velocity)


def velocity_update(velocity: Params, step: Params, momentum) -> Params:
  """delta v + u, leaf by leaf (u the optimizer's step, -eta g for SGD)."""
  return jax.tree.map(lambda v, u: (momentum * v + u).astype(v.dtype), velocity, step)


def has_model_state(model_state) -> bool:
  """Whether a worker carries model state (e.g. BatchNorm statistics): a pytree
  with at least one leaf. ``()`` (the default everywhere) means no state."""
  return bool(jax.tree.leaves(model_state))


def loss_and_grad(loss_fn, params: Params, batch, key, model_state=()):
  """The mini-batch loss, its gradient and the updated model state: the one
  place every algorithm evaluates a worker's loss.

  Two kinds of loss function:

    loss_fn(params, batch, key) -> loss                        (no model state)
    loss_fn(params, batch, key, model_state) -> (loss, new_model_state)

  the second when ``model_state`` has leaves (:func:`has_model_state`), e.g.
  a Flax model's ``batch_stats`` updated by a train-mode BatchNorm
  (``model.apply({"params": p, **model_state}, x, train=True,
  mutable=["batch_stats"])``). The gradient is with respect to ``params``
  only; the new state is returned as the loss function computes it.

  Args:
    loss_fn: as above.
    params: the parameters (a pytree).
    batch: the mini-batch.
    key: this worker's key for this step.
    model_state: the model's state (a pytree), or ``()``.

  Returns:
    ``(loss, grads, new_model_state)``: a float scalar, a pytree like
    ``params``, and a pytree like ``model_state`` (``()`` without state).
  """
  if not has_model_state(model_state):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, key)
    return loss, grads, model_state
  (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, batch, key, model_state
  )
  return loss, grads, new_state


def nesterov_velocity(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    momentum: float | jax.Array | None,
    params: Params,
    velocity: Params,
    opt_state,
    batch,
    key,
    grad_fn=None,
    model_state=(),
):
  r"""The new velocity of eq. (7) from the look-ahead gradient; params unchanged.

  .. math::

     y = x + \delta v, \qquad v \leftarrow \delta v + u

  with ``u, opt_state = optimizer.update(g(y), opt_state, y)`` (SGD:
  :math:`u = -\eta\, g(y)`, eq. (7) exactly). The optimizer receives the look-ahead
  point as its params, so an L2 term of ``optax.add_decayed_weights`` is the gradient of
  the regularised loss there; its state stays with the worker.

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: maps the look-ahead gradient to the step u.
    momentum: delta in [0, 1), or None for the plain step (then ``velocity``
      is not read and the step u is returned in its place).
    params: the worker's parameters x (the pre-exchange snapshot).
    velocity: v, a pytree like ``params``.
    opt_state: the optimizer's state.
    batch: this worker's mini-batch.
    key: this worker's key for this step.
    grad_fn: optional ``grad_fn(grads) -> grads`` applied before the optimizer
      (e.g. ``lax.pmean`` for the data-parallel sequential baseline).
    model_state: the model's state, or ``()`` (see :func:`loss_and_grad`).

  With a Python momentum = 0 the look-ahead and the zero terms are skipped
  (y = x and v = u exactly), so EAMSGD then runs EASGD's very float
  computation. An array momentum (possibly traced) always takes the look-ahead
  path: at delta = 0 that gives the same values for finite velocities.

  Returns:
    ``(loss, new_velocity, new_opt_state, new_model_state)``; ``loss`` is the
    mini-batch loss at the look-ahead point y, where the gradient is taken (no
    extra forward pass), and the model state is the one that pass computed.
  """
  if momentum is None or (not elastic.is_array_hyperparameter(momentum) and momentum == 0):
    # delta = 0: y = x and v = u exactly; the same float graph as EASGD, so that
    # XLA's fusion (it contracts a * b + c into FMAs) cannot tell them apart.
    loss, grads, model_state = loss_and_grad(loss_fn, params, batch, key, model_state)
    if grad_fn is not None:
      grads = grad_fn(grads)
    step, opt_state = optimizer.update(grads, opt_state, params)
    return loss, step, opt_state, model_state
  y = lookahead_point(params, velocity, momentum)
  loss, grads, model_state = loss_and_grad(loss_fn, y, batch, key, model_state)
  if grad_fn is not None:
    grads = grad_fn(grads)
  step, opt_state = optimizer.update(grads, opt_state, y)
  return loss, velocity_update(velocity, step, momentum), opt_state, model_state
