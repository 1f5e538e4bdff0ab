"""EAMSGD: elastic averaging with Nesterov momentum local to each worker.

The momentum variant of EASGD (eq. 7, Algorithm 2 of the paper). Each worker
keeps a velocity v^i that never leaves the worker: it is not communicated, not
pulled towards the center and not reset at an exchange. The gradient is taken
at the Nesterov look-ahead point of the PRE-exchange snapshot x = x^i:

    x = x^i                                               (snapshot)
    if tau divides t:  x^i <- x^i - alpha (x - x~);  x~ <- x~ + alpha (x - x~)
    v^i <- delta v^i - eta g^i(x + delta v^i)
    x^i <- x^i + v^i

This module holds the synchronous form (every worker exchanges on the same
clock, the center moves by the SUM of the elastic differences, as in
:func:`easgd.algorithms.easgd`) and the look-ahead rule shared with the
asynchronous simulation (``easgd.asynchronous``) and the sequential and
DOWNPOUR baselines (``easgd.baselines``).

"-eta g" is generalised to the local optimizer's update: the optimizer receives
the look-ahead gradient and the look-ahead point as its params (so an L2 term
added by ``optax.add_decayed_weights`` is the gradient of the regularised loss
at the look-ahead point) and returns the step that is added to delta v. With
``optax.sgd(eta)`` this is exactly eq. (7). The optimizer's state stays with
the worker.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (7) and Algorithm 2.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax.tree_utils import tree_zeros_like

from easgd import elastic
from easgd.algorithms import (Algorithm, EASGDShared, LossFn,
                              _local_optimizer, elastic_step_setup, every_tau_steps,
                              periodic_communication)
from easgd.workers import WORKER_AXES

Params = Any


def check_momentum(momentum) -> float:
  """Checks the Nesterov momentum delta and returns it as a float.

  Args:
    momentum: delta, a real in [0, 1). The paper uses 0.99.

  Returns:
    ``float(momentum)``.

  Raises:
    HyperparameterError: if ``momentum`` is not a real in [0, 1).
  """
  if (isinstance(momentum, bool) or not isinstance(momentum, numbers.Real)
      or not 0 <= momentum < 1):
    raise elastic.HyperparameterError(
        f"momentum (delta) must be a real in [0, 1), got {momentum!r}")
  return float(momentum)


def lookahead_point(params: Params, velocity: Params, momentum) -> Params:
  """The Nesterov look-ahead point x + delta v, leaf by leaf."""
  return jax.tree.map(lambda x, v: (x + momentum * v).astype(x.dtype),
                      params, velocity)


def velocity_update(velocity: Params, step: Params, momentum) -> Params:
  """delta v + u, leaf by leaf (u the optimizer's step, -eta g for SGD)."""
  return jax.tree.map(lambda v, u: (momentum * v + u).astype(v.dtype),
                      velocity, step)


def nesterov_velocity(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                      momentum: float, params: Params, velocity: Params, opt_state,
                      batch, key, grad_fn=None):
  """The new velocity of eq. (7) from the look-ahead gradient; params unchanged.

      y = x + delta v
      u, opt_state = optimizer.update(g(y), opt_state, y)      (SGD: u = -eta g(y))
      v <- delta v + u

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: maps the look-ahead gradient to the step u.
    momentum: delta in [0, 1).
    params: the worker's parameters x (the pre-exchange snapshot).
    velocity: v, a pytree like ``params``.
    opt_state: the optimizer's state.
    batch: this worker's mini-batch.
    key: this worker's key for this step.
    grad_fn: optional ``grad_fn(grads) -> grads`` applied before the optimizer
      (e.g. ``lax.pmean`` for the data-parallel sequential baseline).

  With momentum = 0 the look-ahead and the zero terms are skipped (y = x and
  v = u exactly), so EAMSGD then runs EASGD's very float computation.

  Returns:
    ``(loss, new_velocity, new_opt_state)``; ``loss`` is the mini-batch loss at
    the look-ahead point y, where the gradient is taken (no extra forward pass).
  """
  if momentum == 0:
    # delta = 0: y = x and v = u exactly; the same float graph as EASGD, so that
    # XLA's fusion (it contracts a * b + c into FMAs) cannot tell them apart.
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, key)
    if grad_fn is not None:
      grads = grad_fn(grads)
    step, opt_state = optimizer.update(grads, opt_state, params)
    return loss, step, opt_state
  y = lookahead_point(params, velocity, momentum)
  loss, grads = jax.value_and_grad(loss_fn)(y, batch, key)
  if grad_fn is not None:
    grads = grad_fn(grads)
  step, opt_state = optimizer.update(grads, opt_state, y)
  return loss, velocity_update(velocity, step, momentum), opt_state


class EAMSGDWorker(NamedTuple):
  """Per-worker state of EAMSGD: x^i, the local velocity v^i, optimizer state."""
  params: Params
  velocity: Params
  opt_state: Any


def eamsgd(loss_fn: LossFn, optimizer: optax.GradientTransformation | None = None,
           *, num_workers: int, momentum: float, tau: int = 1,
           alpha: float | None = None, beta: float | None = None,
           learning_rate: float | None = None, reset_opt_state: bool = False,
           axis_name=WORKER_AXES) -> Algorithm:
  """Synchronous Elastic Averaging Momentum SGD (Nesterov momentum per worker).

  All workers share one clock t; on steps where tau divides t every worker
  exchanges with the center, reading the time-t values (eq. 5-6 with the
  momentum step of eq. 7):

      y^i   = x^i_t + delta v^i_t
      v^i_{t+1} = delta v^i_t + u^i_t,     u^i_t = -eta g^i(y^i)  (optimizer step)
      x^i_{t+1} = x^i_t - alpha (x^i_t - x~_t) + v^i_{t+1}     [exchange steps]
      x~_{t+1}  = x~_t + alpha sum_i (x^i_t - x~_t)             [exchange steps]
      x^i_{t+1} = x^i_t + v^i_{t+1},  x~_{t+1} = x~_t           [other steps]

  The velocity is local: never averaged, pulled or reset. ``momentum = 0``
  reproduces :func:`easgd.algorithms.easgd` bit for bit (same optimizer).

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: maps the look-ahead gradient to the step u; default
      ``optax.sgd(learning_rate)`` (then u = -eta g, eq. 7 exactly). It
      receives the look-ahead point as params; its state stays per worker.
    num_workers: number of workers p.
    momentum: delta in [0, 1) (paper: 0.99).
    tau: communication period in local steps, >= 1.
    alpha: moving rate; or give ``beta`` = num_workers * alpha (paper: 0.9).
    beta: center moving rate.
    learning_rate: eta of the default SGD optimizer (> 0).
    reset_opt_state: re-initialise the optimizer state at every exchange
      (before that step's update; the velocity is NOT reset, and learning-rate
      schedules keep their position). Default False: the state persists.
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.algorithms.Algorithm` named ``"eamsgd"``; one all-reduce
    of the parameters per exchange, like EASGD. The loss ``step`` returns is
    the one at the look-ahead point x^i + delta v^i, where the gradient is
    taken (for momentum > 0 not the loss at x^i).

  Raises:
    HyperparameterError: tau < 1, momentum outside [0, 1), alpha/beta invalid,
      learning_rate <= 0.
    TypeError: optimizer is not an optax.GradientTransformation.

  Example:
    >>> algo = eamsgd(loss_fn, num_workers=4, momentum=0.99, tau=10, beta=0.9,
    ...               learning_rate=0.01)

  References:
    Zhang, Choromanska, LeCun (2015), eq. (7) and Algorithm 2.
  """
  tau = elastic.check_tau(tau)
  alpha = elastic.resolve_alpha(num_workers, alpha, beta)
  momentum = check_momentum(momentum)
  optimizer = _local_optimizer(optimizer, learning_rate)

  def init(params):
    zeros = tree_zeros_like(params)
    return (EAMSGDWorker(params, zeros, optimizer.init(params)),
            EASGDShared(params, jnp.zeros((), jnp.int32)))

  def step(worker, shared, batch, key, exchange=None):
    key, exchange, opt_state = elastic_step_setup(
        optimizer, worker.params, worker.opt_state, shared.step, key, tau,
        reset_opt_state, axis_name, exchange)
    loss, velocity, opt_state = nesterov_velocity(
        loss_fn, optimizer, momentum, worker.params, worker.velocity, opt_state,
        batch, key)
    params, center = elastic.easgd_update(
        worker.params, velocity, shared.center, alpha, exchange, axis_name)
    return (EAMSGDWorker(params, velocity, opt_state),
            EASGDShared(center, shared.step + 1), loss)

  return Algorithm(
      name="eamsgd", init=init, step=step,
      center=lambda shared: shared.center,
      worker_params=lambda worker, shared: worker.params,
      communication=periodic_communication(tau),
      hyperparameters=dict(num_workers=int(num_workers), tau=tau, alpha=alpha,
                           beta=alpha * num_workers, momentum=momentum,
                           reset_opt_state=bool(reset_opt_state)),
      exchange_at=every_tau_steps(tau))
