"""Distributed training algorithms as per-worker (init, step) pairs.

Each factory validates its hyperparameters in Python and returns an
:class:`Algorithm`: pure functions written for ONE worker, which use collectives
over ``axis_name`` (default :data:`easgd.workers.WORKER_AXES`) to talk to the
others. ``easgd.workers.map_workers`` runs them over all workers; nothing here
compiles or places anything.

State is split in two:
  worker state  one value per worker (EASGD: the worker's parameters x^i and its
                local optimizer state);
  shared state  one value for all workers, kept identical on every device
                because it is only ever updated from all-reduced quantities
                (EASGD: the center x~ and the step counter).

Algorithms here:
  :func:`easgd`      synchronous EASGD, eq. (5)-(6), communication period tau.
  :func:`pmean_sgd`  data-parallel synchronous SGD, gradients averaged with
                     ``lax.pmean`` every step (the baseline).
Elsewhere, on the same interface: ``easgd.momentum`` (EAMSGD),
``easgd.asynchronous`` (asynchronous EASGD/EAMSGD with exchange schedules) and
``easgd.baselines`` (DOWNPOUR family, sequential methods, local SGD, DiLoCo);
``easgd.registry`` builds them from a config.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from easgd import elastic
from easgd.workers import WORKER_AXES

Params = Any
LossFn = Callable[[Params, Any, jax.Array], jax.Array]
"""``loss_fn(params, batch, key) -> float32 scalar``: mean loss of one worker's
mini-batch; ``key`` is this worker's key for this step (dropout etc.)."""


class Communication(NamedTuple):
  """Communication of one worker, counted over a number of steps.

  Attributes:
    all_reduces: number of all-reduces the worker took part in.
    bytes: payload bytes the worker contributed to them (the size of the
      reduced buffers; what a ring all-reduce puts on the wire is
      2 (p - 1) / p times this).
  """
  all_reduces: int
  bytes: int


class Algorithm(NamedTuple):
  """A distributed algorithm written for one worker.

  Attributes:
    name: short name, e.g. ``"easgd"``.
    init: ``init(params) -> (worker_state, shared_state)`` for ONE worker from
      the common initial parameters (every worker gets the same values).
    step: ``step(worker_state, shared_state, batch, key) -> (worker_state,
      shared_state, loss)``, per worker, inside a mapping that binds the
      algorithm's axis name. ``key`` is the run's base key (the same for all);
      the step derives the worker's own key from it. ``loss`` is the worker's
      mini-batch loss at its parameters before the step (float32 scalar).
    center: ``center(shared_state) -> params``, the model the method evaluates.
    worker_params: ``worker_params(worker_state, shared_state) -> params``.
    communication: ``communication(num_steps, param_bytes) -> Communication``,
      the per-worker count over the first ``num_steps`` steps.
    hyperparameters: resolved hyperparameters, for logs.
    exchange_at: ``None``, or for synchronous algorithms that communicate only
      on some steps (EASGD, EAMSGD, local SGD, DiLoCo) the host-side schedule
      ``exchange_at(t: int) -> bool``: whether the step at clock t communicates.
      Such a ``step`` also takes a keyword ``exchange``: ``None`` (default)
      decides on the device from the clock (``lax.cond``); a Python bool, which
      must equal ``exchange_at(t)``, compiles the step with or without the
      communication and no conditional. ``easgd.workers.map_step`` uses it to
      run two programs, picked per step on the host; it also evaluates
      ``exchange_at`` on the shared state's int32 counter ``shared.step`` (so
      such algorithms keep one) to check the host's clock on the device.
  """
  name: str
  init: Callable
  step: Callable
  center: Callable
  worker_params: Callable
  communication: Callable
  hyperparameters: dict
  exchange_at: Callable[[int], bool] | None = None


def worker_key(key: jax.Array, step, axis_name=WORKER_AXES) -> jax.Array:
  """This worker's key at ``step``: fold_in(fold_in(key, step), worker index).

  Args:
    key: the run's base PRNG key (the same on every worker).
    step: int32 scalar clock (may be traced).
    axis_name: the mapped axis enumerating all workers; must be bound by the
      enclosing mapping (``lax.axis_index`` raises NameError otherwise).

  Returns:
    A PRNG key of the type of ``key``, distinct per (step, worker).
  """
  return jax.random.fold_in(jax.random.fold_in(key, step),
                            lax.axis_index(axis_name))


def _local_optimizer(optimizer, learning_rate):
  if optimizer is not None:
    if not isinstance(optimizer, optax.GradientTransformation):
      raise TypeError(f"optimizer must be an optax.GradientTransformation, "
                      f"got {type(optimizer).__name__}")
    return optimizer
  if learning_rate is None:
    raise elastic.HyperparameterError(
        "give an optimizer (optax.GradientTransformation) or a learning_rate "
        "for plain SGD")
  if (isinstance(learning_rate, numbers.Real) and
      not (learning_rate > 0 and learning_rate < float("inf"))):
    raise elastic.HyperparameterError(
        f"learning_rate must be a finite real > 0, got {learning_rate!r}")
  return optax.sgd(learning_rate)


def reset_optimizer_state(optimizer: optax.GradientTransformation, opt_state,
                          params: Params, reset):
  """``optimizer.init(params)`` where ``reset`` is True, else ``opt_state``.

  Every part of the state is re-initialised (moments, Adam's bias-correction
  count, momentum traces) except ``optax.ScaleByScheduleState`` nodes, so that
  a learning-rate schedule keeps its position in the run.

  Args:
    optimizer: the local optimizer.
    opt_state: its current state.
    params: the parameters to initialise from (shapes and dtypes only, for
      the optimizers in Optax).
    reset: bool scalar (may be traced or batched).

  Returns:
    A state of the structure of ``opt_state``.
  """
  is_schedule = lambda node: isinstance(node, optax.ScaleByScheduleState)
  fresh = jax.tree.map(lambda new, old: old if is_schedule(new) else new,
                       optimizer.init(params), opt_state, is_leaf=is_schedule)
  return jax.tree.map(lambda new, old: jnp.where(reset, new, old).astype(old.dtype),
                      fresh, opt_state)


def elastic_step_setup(optimizer: optax.GradientTransformation, params: Params, opt_state,
                       step, key: jax.Array, tau, reset_opt_state: bool, axis_name,
                       exchange: bool | None = None):
  """The start of an elastic worker step (EASGD, EAMSGD).

  Args:
    optimizer: the local optimizer; params: this worker's parameters x^i;
    opt_state: its optimizer state; step: the int32 worker clock t^i;
    key: the run's base key; tau: communication period (>= 1);
    reset_opt_state: re-initialise ``opt_state`` on exchange steps (Python bool);
    axis_name: the mapped axis enumerating all workers;
    exchange: ``None`` to compute the flag from the clock, or the host's
      Python bool for this step (see ``Algorithm.exchange_at``).

  Returns:
    ``(worker_key, exchange, opt_state)``: this worker's key for this step, the
    flag "tau divides t^i" (Algorithms 1-2; a bool array, or the given Python
    bool), and the optimizer state to use.
  """
  check_exchange_flag(exchange)
  key = worker_key(key, step, axis_name)
  if exchange is None:
    exchange = elastic.is_exchange_step(step, tau)
  if reset_opt_state and exchange is not False:
    opt_state = reset_optimizer_state(optimizer, opt_state, params, exchange)
  return key, exchange, opt_state


def every_tau_steps(tau: int, offset: int = 0) -> Callable[[int], bool]:
  """The host-side schedule ``t -> (t + offset) % tau == 0`` (``Algorithm.exchange_at``).

  EASGD and EAMSGD exchange at t = 0, tau, 2 tau, ... (offset 0, Algorithm 1);
  local SGD and DiLoCo average after steps tau - 1, 2 tau - 1, ... (offset 1).

  Args:
    tau: communication period in steps, an integer >= 1.
    offset: 0 or 1 (see above).

  Returns:
    ``exchange_at(t) -> bool`` for the step at clock t (steps taken); given an
    int32 array (the state's counter, traced) it returns a bool array, which
    ``easgd.workers.map_step`` uses to check the host's clock on the device.

  Raises:
    HyperparameterError: tau is not an integer >= 1, or offset not 0 or 1.

  References:
    Algorithm 1 of the paper ("if tau divides t^i").
  """
  tau = elastic.check_tau(tau)
  if offset not in (0, 1) or isinstance(offset, bool):
    raise elastic.HyperparameterError(f"offset must be 0 or 1, got {offset!r}")
  return lambda t: (t + offset) % tau == 0


def periodic_communication(tau: int, offset: int = 0) -> Callable[[int, int], Communication]:
  """``Algorithm.communication`` of an algorithm with schedule ``every_tau_steps(tau, offset)``.

  One parameter-sized all-reduce on each step t < num_steps with
  tau | (t + offset): ceil(num_steps / tau) exchanges for offset 0 (t = 0
  included), floor(num_steps / tau) for offset 1.

  Args:
    tau: communication period in steps, an integer >= 1.
    offset: 0 or 1, as in :func:`every_tau_steps`.

  Returns:
    ``communication(num_steps, param_bytes) -> Communication`` per worker
    (bytes = exchanges * param_bytes).
  """
  def communication(num_steps, param_bytes):
    n = int(num_steps)
    exchanges = (n - 1 + offset) // tau - (offset - 1) // tau if n > 0 else 0
    return Communication(exchanges, exchanges * int(param_bytes))
  return communication


def check_exchange_flag(exchange) -> None:
  """``exchange`` of a step: None (decided on the device) or a Python bool.

  Raises:
    TypeError: anything else (a traced flag belongs to ``exchange=None``).
  """
  if exchange is not None and not isinstance(exchange, bool):
    raise TypeError(f"exchange must be None or a Python bool (the host's schedule, "
                    f"Algorithm.exchange_at), got {exchange!r}")


class EASGDWorker(NamedTuple):
  """Per-worker state of EASGD: parameters x^i and local optimizer state."""
  params: Params
  opt_state: Any


class EASGDShared(NamedTuple):
  """Shared state of EASGD: the center x~ and the common worker clock t."""
  center: Params
  step: jax.Array  # int32 scalar, the number of steps taken


def easgd(loss_fn: LossFn, optimizer: optax.GradientTransformation | None = None,
          *, num_workers: int, tau: int = 1, alpha: float | None = None,
          beta: float | None = None, learning_rate: float | None = None,
          reset_opt_state: bool = False, axis_name=WORKER_AXES) -> Algorithm:
  """Synchronous Elastic Averaging SGD with communication period tau.

  Each worker i takes the local optimizer's step at its own parameters; on steps
  where tau divides the clock t (t = 0, tau, 2 tau, ...) it also feels the
  elastic force and the center moves by the sum of the opposite forces:

      x^i_{t+1} = x^i_t + u^i_t - alpha (x^i_t - x~_t)       [exchange steps]
      x~_{t+1}  = x~_t + alpha sum_i (x^i_t - x~_t)           [exchange steps]
      x^i_{t+1} = x^i_t + u^i_t,  x~_{t+1} = x~_t             [other steps]

  with u^i_t the optimizer's update (plain SGD: u = -eta g^i_t(x^i_t)). The
  local optimizer state stays per worker; it receives the worker's own params.

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar`` (see :data:`LossFn`).
    optimizer: the local optimizer; default ``optax.sgd(learning_rate)``.
    num_workers: number of workers p (for beta -> alpha and validation).
    tau: communication period in local steps, integer >= 1.
    alpha: moving rate; or give ``beta`` = num_workers * alpha (paper: 0.9).
    beta: center moving rate; alpha = beta / num_workers.
    learning_rate: eta of the default plain-SGD optimizer (> 0).
    reset_opt_state: re-initialise the local optimizer state at every exchange,
      before that step's update (see :func:`reset_optimizer_state`; schedules
      keep their position). Default False: the state persists across exchanges.
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`Algorithm` named ``"easgd"``, with the host-side schedule
    ``exchange_at(t) = (t % tau == 0)`` (so ``easgd.workers.map_step`` runs an
    exchange program and a local program without communication).

  Raises:
    HyperparameterError (a ValueError): tau < 1 or not an integer; alpha or beta
      negative, both or neither given; num_workers < 1; learning_rate <= 0.
    TypeError: optimizer is not an optax.GradientTransformation.

  Example:
    >>> algo = easgd(loss_fn, optax.sgd(0.1), num_workers=4, tau=4, beta=0.9)

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Algorithm 1.
  """
  tau = elastic.check_tau(tau)
  alpha = elastic.resolve_alpha(num_workers, alpha, beta)
  optimizer = _local_optimizer(optimizer, learning_rate)

  def init(params):
    return (EASGDWorker(params, optimizer.init(params)),
            EASGDShared(params, jnp.zeros((), jnp.int32)))

  def step(worker, shared, batch, key, exchange=None):
    key, exchange, opt_state = elastic_step_setup(
        optimizer, worker.params, worker.opt_state, shared.step, key, tau,
        reset_opt_state, axis_name, exchange)
    loss, grads = jax.value_and_grad(loss_fn)(worker.params, batch, key)
    updates, opt_state = optimizer.update(grads, opt_state, worker.params)
    params, center = elastic.easgd_update(
        worker.params, updates, shared.center, alpha, exchange, axis_name)
    return (EASGDWorker(params, opt_state), EASGDShared(center, shared.step + 1),
            loss)

  return Algorithm(
      name="easgd", init=init, step=step,
      center=lambda shared: shared.center,
      worker_params=lambda worker, shared: worker.params,
      communication=periodic_communication(tau),
      hyperparameters=dict(num_workers=int(num_workers), tau=tau, alpha=alpha,
                           beta=alpha * num_workers,
                           reset_opt_state=bool(reset_opt_state)),
      exchange_at=every_tau_steps(tau))


class PmeanShared(NamedTuple):
  """Shared state of data-parallel SGD: the one model, its optimizer state."""
  params: Params
  opt_state: Any
  step: jax.Array


def pmean_sgd(loss_fn: LossFn, optimizer: optax.GradientTransformation | None = None,
              *, learning_rate: float | None = None,
              axis_name=WORKER_AXES) -> Algorithm:
  """Synchronous data-parallel SGD: gradients averaged over workers every step.

      g_t = (1/p) sum_i g^i_t(x_t)          (lax.pmean, one all-reduce per step)
      x_{t+1} = x_t + optimizer_update(g_t)

  All workers hold the same model (it is shared state). With p workers of batch
  B and a loss that is a mean over the batch this is exactly one worker with
  batch p * B (up to float summation order).

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar`` (mean over the batch).
    optimizer: the optimizer; default ``optax.sgd(learning_rate)``.
    learning_rate: eta of the default plain-SGD optimizer (> 0).
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`Algorithm` named ``"pmean_sgd"``.

  Raises:
    HyperparameterError: learning_rate <= 0 or missing without an optimizer.
    TypeError: optimizer is not an optax.GradientTransformation.

  References:
    The synchronous baseline of the paper's Section 5 discussion; Dean et al.
    (2012) for the data-parallel setting.
  """
  optimizer = _local_optimizer(optimizer, learning_rate)

  def init(params):
    return (), PmeanShared(params, optimizer.init(params), jnp.zeros((), jnp.int32))

  def step(worker, shared, batch, key):
    key = worker_key(key, shared.step, axis_name)
    loss, grads = jax.value_and_grad(loss_fn)(shared.params, batch, key)
    grads = lax.pmean(grads, axis_name)
    updates, opt_state = optimizer.update(grads, shared.opt_state, shared.params)
    params = optax.apply_updates(shared.params, updates)
    return worker, PmeanShared(params, opt_state, shared.step + 1), loss

  def communication(num_steps, param_bytes):
    return Communication(int(num_steps), int(num_steps) * int(param_bytes))

  return Algorithm(
      name="pmean_sgd", init=init, step=step,
      center=lambda shared: shared.params,
      worker_params=lambda worker, shared: shared.params,
      communication=communication, hyperparameters={})


ALGORITHMS = ("easgd", "pmean_sgd",
              # easgd.momentum, easgd.asynchronous
              "eamsgd", "async_easgd", "async_eamsgd",
              # easgd.baselines
              "downpour", "mdownpour", "adownpour", "mvadownpour",
              "sgd", "msgd", "asgd", "mvasgd", "local_sgd", "diloco")
