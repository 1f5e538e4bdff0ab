"""Synchronous EASGD and EAMSGD (eq. 5-7, one rule) and pmean SGD as per-worker (init, step) pairs.

Each factory checks its Python hyperparameters and returns an
``easgd.core.base.Algorithm`` of pure functions written for ONE worker, which talk to
the others by collectives over ``axis_name`` (``easgd.parallel.mapping.map_workers``
maps them); nothing here compiles or places anything. Array hyperparameters and
precision: docs/guides/algorithms.md ("Array hyperparameters", "Precision").
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from easgd._util import checks
from easgd.core import elastic, streaming
from easgd.core.base import (
    Algorithm,
    Communication,
    LossFn,
    Params,
    distinct_events,
    elastic_step_setup,
    event_programs,
    every_tau_steps,
    local_optimizer,
    periodic_communication,
    worker_key,
)
from easgd.core.elastic import WORKER_AXES
from easgd.core.momentum import check_momentum, has_model_state, nesterov_velocity

# Pending: easgd/sweeps/curves.py still imports these two from here (its split moves it
# to easgd.core.base); tests/test_layout.py lists it.


class ElasticWorker(NamedTuple):
  """Per-worker state of synchronous EASGD / EAMSGD.

  Attributes:
    params: x^i, the worker's parameters.
    velocity: v^i, EAMSGD's local Nesterov velocity (never communicated);
      ``()`` for EASGD.
    opt_state: the local optimizer's state.
  """

  params: Params
  velocity: Any
  opt_state: Any
  model_state: Any = ()
  stream: Any = ()
  """The streaming exchange's state (``easgd.core.streaming.StreamState``: error
  accumulator, exchanges in flight); ``()`` without fragments, delay or compression."""


class EASGDShared(NamedTuple):
  """Shared state of EASGD: the center x~ and the common worker clock t."""

  center: Params
  step: jax.Array  # int32 scalar, the number of steps taken
  pending: Any = ()
  """M = sum_i m^i of the fragments in flight (``easgd.core.streaming``, delay >= 1):
  shared, the same on every worker; ``()`` otherwise."""


def elastic_hyperparameters(num_workers, tau, alpha, momentum, reset_opt_state) -> dict:
  """The ``hyperparameters`` record of EASGD/EAMSGD, synchronous or asynchronous.

  Args:
    num_workers: p (int).
    tau: the communication period (int, or an int32 JAX array).
    alpha: the resolved moving rate (float or JAX array).
    momentum: EAMSGD's delta, or None for EASGD (then no ``momentum`` entry).
    reset_opt_state: whether an exchange resets the local optimizer's state.

  Returns:
    ``{num_workers, tau, alpha, beta = alpha * p, reset_opt_state[, momentum]}``,
    values as given (arrays for logs to convert).
  """
  hyper = dict(
      num_workers=int(num_workers),
      tau=tau,
      alpha=alpha,
      beta=alpha * num_workers,
      reset_opt_state=bool(reset_opt_state),
  )
  if momentum is not None:
    hyper["momentum"] = momentum
  return hyper


def _synchronous_elastic(
    name,
    loss_fn,
    optimizer,
    *,
    num_workers,
    tau,
    alpha,
    beta,
    learning_rate,
    reset_opt_state,
    momentum,
    axis_name,
    exchange=None,
):
  """The one body of :func:`easgd` (momentum None) and :func:`eamsgd`; ``exchange``:
  None or an :class:`ExchangeTechniques` (fragments, delay, compression)."""
  tau = elastic.check_tau(tau, allow_array=True)
  alpha = elastic.resolve_alpha(num_workers, alpha, beta)
  optimizer = local_optimizer(optimizer, learning_rate)
  reduce_over = elastic.reduce_axis(num_workers, axis_name)  # None: one worker
  if exchange is not None and not exchange.is_plain():
    return _streaming_elastic(
        name, loss_fn, optimizer, num_workers, tau, alpha, reset_opt_state, momentum,
        axis_name, reduce_over, exchange,
    )  # fmt: skip
  # Algorithm 1: tau divides t (t = 0 included); the host's copy only for a Python tau
  exchange_at = None if elastic.is_array_hyperparameter(tau) else every_tau_steps(tau)

  def init(params, model_state=()):
    velocity = () if momentum is None else jax.tree.map(jnp.zeros_like, params)
    return (
        ElasticWorker(params, velocity, optimizer.init(params), model_state),
        EASGDShared(elastic.to_reduction_dtype(params), jnp.zeros((), jnp.int32)),
    )

  def step(worker, shared, batch, key, exchange=None):
    key, exchange, opt_state = elastic_step_setup(
        optimizer,
        worker.params,
        worker.opt_state,
        shared.step,
        key,
        tau,
        reset_opt_state,
        axis_name,
        exchange,
    )
    loss, update, opt_state, model_state = nesterov_velocity(
        loss_fn,
        optimizer,
        momentum,
        worker.params,
        worker.velocity,
        opt_state,
        batch,
        key,
        model_state=worker.model_state,
    )
    # update: the optimizer step u (EASGD) or the new velocity (EAMSGD)
    params, center = elastic.easgd_update(
        worker.params, update, shared.center, alpha, exchange, reduce_over
    )
    velocity = () if momentum is None else update
    return (
        ElasticWorker(params, velocity, opt_state, model_state),
        EASGDShared(center, shared.step + 1),
        loss,
    )

  hyper = elastic_hyperparameters(num_workers, tau, alpha, momentum, reset_opt_state)
  return Algorithm(
      name=name,
      init=init,
      step=step,
      center=lambda shared: shared.center,
      worker_params=lambda worker, shared: worker.params,
      communication=periodic_communication(tau, num_workers=num_workers),
      hyperparameters=hyper,
      exchange_at=exchange_at,
  )


def easgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    tau: int = 1,
    alpha: float | None = None,
    beta: float | None = None,
    learning_rate: float | None = None,
    reset_opt_state: bool = False,
    axis_name=WORKER_AXES,
    exchange: streaming.ExchangeTechniques | None = None,
) -> Algorithm:
  r"""Synchronous Elastic Averaging SGD with communication period tau.

  Each worker i takes the local optimizer's step at its own parameters; on steps
  where tau divides the clock t (t = 0, tau, 2 tau, ...) it also feels the
  elastic force and the center moves by the sum of the opposite forces
  (eq. 5-6 of the paper):

  .. math::

     x^i_{t+1} &= x^i_t + u^i_t - \alpha (x^i_t - \tilde x_t) \qquad (5) \\
     \tilde x_{t+1} &= \tilde x_t + \alpha \sum_{i=1}^{p} (x^i_t - \tilde x_t) \qquad (6)

  on exchange steps, and :math:`x^i_{t+1} = x^i_t + u^i_t`,
  :math:`\tilde x_{t+1} = \tilde x_t` on the other steps, with u^i_t the
  optimizer's update (plain SGD: :math:`u^i_t = -\eta\, g^i_t(x^i_t)`). The
  local optimizer state stays per worker; it receives the worker's own params.
  The center, the elastic differences and their sum are kept in float32 for
  bfloat16 parameters (``easgd.core.elastic.reduction_dtype``). EASGD is
  :func:`eamsgd` with delta = 0: both are this one rule.

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar`` (see :data:`LossFn`).
    optimizer: the local optimizer; default ``optax.sgd(learning_rate)``.
    num_workers: number of workers p (for beta -> alpha and validation).
    tau: communication period in local steps, integer >= 1; or an int32 JAX
      array (unchecked, may be traced): then ``exchange_at`` is None, the
      step decides the exchange on the device, and ``communication`` raises
      (it counts from a Python tau).
    alpha: moving rate; or give ``beta`` = num_workers * alpha (paper: 0.9).
      Either may be a JAX array (unchecked, may be traced).
    beta: center moving rate; alpha = beta / num_workers.
    learning_rate: eta of the default plain-SGD optimizer (> 0), or a JAX
      array (unchecked, may be traced).
    reset_opt_state: re-initialise the local optimizer state at every exchange,
      before that step's update (see :func:`reset_optimizer_state`; schedules
      keep their position). Default False: the state persists across exchanges.
    axis_name: mapped axis enumerating all workers.
    exchange: fragments, delay and compression of the elastic exchange
      (``easgd.core.streaming.ExchangeTechniques``; equations there and in
      docs/guides/streaming.md); None or a plain one: eq. (5)-(6) as they are.

  Returns:
    An :class:`Algorithm` named ``"easgd"``, with the host-side schedule
    ``exchange_at(t) = (t % tau == 0)`` for a Python tau (so
    ``easgd.parallel.mapping.map_step`` runs an exchange program and a local program
    without communication).

  Raises:
    HyperparameterError (a ValueError): tau < 1 or not an integer; alpha or beta
      negative, both or neither given; num_workers < 1; learning_rate <= 0.
    TypeError: optimizer is not an optax.GradientTransformation.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> loss_fn = lambda params, batch, key: jnp.mean((batch @ params) ** 2)
    >>> algo = easgd(loss_fn, optax.sgd(0.1), num_workers=4, tau=4, beta=0.9)

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6) and Algorithm 1.
  """
  return _synchronous_elastic(
      "easgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      alpha=alpha,
      beta=beta,
      learning_rate=learning_rate,
      reset_opt_state=reset_opt_state,
      momentum=None,
      axis_name=axis_name,
      exchange=exchange,
  )


def eamsgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    momentum: float,
    tau: int = 1,
    alpha: float | None = None,
    beta: float | None = None,
    learning_rate: float | None = None,
    reset_opt_state: bool = False,
    axis_name=WORKER_AXES,
    exchange: streaming.ExchangeTechniques | None = None,
) -> Algorithm:
  r"""Synchronous Elastic Averaging Momentum SGD (Nesterov momentum per worker).

  All workers share one clock t; on steps where tau divides t every worker
  exchanges with the center, reading the time-t values (eq. 5-6 with the
  momentum step of eq. 7). With u^i_t the optimizer's step of the look-ahead
  gradient (SGD: :math:`u^i_t = -\eta\, g^i(y^i)`):

  .. math::

     y^i &= x^i_t + \delta v^i_t, \qquad v^i_{t+1} = \delta v^i_t + u^i_t \\
     x^i_{t+1} &= x^i_t - \alpha (x^i_t - \tilde x_t) + v^i_{t+1} \\
     \tilde x_{t+1} &= \tilde x_t + \alpha \sum_{i=1}^{p} (x^i_t - \tilde x_t)

  on exchange steps, and :math:`x^i_{t+1} = x^i_t + v^i_{t+1}`,
  :math:`\tilde x_{t+1} = \tilde x_t` on the other steps.

  The velocity is local: never averaged, pulled or reset. ``momentum = 0``
  is :func:`easgd` (the same rule, so the same computation bit for bit).

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: maps the look-ahead gradient to the step u; default
      ``optax.sgd(learning_rate)`` (then u = -eta g, eq. 7 exactly). It
      receives the look-ahead point as params; its state stays per worker.
    num_workers: number of workers p.
    momentum: delta in [0, 1) (paper: 0.99), or a JAX array (unchecked).
    tau: communication period in local steps, >= 1, or an int32 JAX array
      (as :func:`easgd`).
    alpha: moving rate; or give ``beta`` = num_workers * alpha (paper: 0.9);
      either may be a JAX array (unchecked).
    beta: center moving rate.
    learning_rate: eta of the default SGD optimizer (> 0), or a JAX array.
    reset_opt_state: re-initialise the optimizer state at every exchange
      (before that step's update; the velocity is NOT reset, and learning-rate
      schedules keep their position). Default False: the state persists.
    axis_name: mapped axis enumerating all workers.
    exchange: fragments, delay and compression of the elastic exchange
      (``easgd.core.streaming.ExchangeTechniques``; equations there and in
      docs/guides/streaming.md); None or a plain one: eq. (5)-(6) as they are.

  Returns:
    An :class:`Algorithm` named ``"eamsgd"``; one all-reduce of the parameters
    per exchange, like EASGD. The loss ``step`` returns is the one at the
    look-ahead point x^i + delta v^i, where the gradient is taken (for
    momentum > 0 not the loss at x^i).

  Raises:
    HyperparameterError: tau < 1, momentum outside [0, 1), alpha/beta invalid,
      learning_rate <= 0.
    TypeError: optimizer is not an optax.GradientTransformation.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> loss_fn = lambda params, batch, key: jnp.mean((batch @ params) ** 2)
    >>> algo = eamsgd(loss_fn, num_workers=4, momentum=0.99, tau=10, beta=0.9,
    ...               learning_rate=0.01)

  References:
    Zhang, Choromanska, LeCun (2015), eq. (7) and Algorithm 2.
  """
  return _synchronous_elastic(
      "eamsgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      alpha=alpha,
      beta=beta,
      learning_rate=learning_rate,
      reset_opt_state=reset_opt_state,
      momentum=check_momentum(momentum),
      axis_name=axis_name,
      exchange=exchange,
  )


def pmean_sgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int | None = None,
    learning_rate: float | None = None,
    axis_name=WORKER_AXES,
) -> Algorithm:
  r"""Synchronous data-parallel SGD: gradients averaged over workers every step.

  .. math::

     g_t = \frac{1}{p} \sum_{i=1}^{p} g^i_t(x_t), \qquad x_{t+1} = x_t + u_t

  with u_t the optimizer's update of g_t (``lax.pmean``: one all-reduce per
  step).

  All workers hold the same model (it is shared state). With p workers of batch
  B and a loss that is a mean over the batch this is exactly one worker with
  batch p * B (up to float summation order). The average is formed in
  float32 for bfloat16 gradients (``easgd.core.elastic.reduction_dtype``) and cast
  back to the parameters' dtype. ``shared_model`` is True: on one device,
  ``easgd.parallel.mapping.map_step`` computes the gradient of a device's workers in
  one pass over their examples.

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar`` (mean over the batch).
    optimizer: the optimizer; default ``optax.sgd(learning_rate)``.
    num_workers: p, an integer >= 1; with p = 1 nothing is averaged (no
      collective, no communication counted). None: unknown, counted as p > 1.
    learning_rate: eta of the default plain-SGD optimizer (> 0), or a JAX
      array (unchecked, may be traced).
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`Algorithm` named ``"pmean_sgd"``.

  Raises:
    HyperparameterError: learning_rate <= 0 or missing without an optimizer;
      num_workers not an integer >= 1.
    TypeError: optimizer is not an optax.GradientTransformation.

  References:
    The synchronous baseline of the paper's Section 5 discussion; Dean et al.
    (2012) for the data-parallel setting.
  """
  optimizer = local_optimizer(optimizer, learning_rate)
  if num_workers is not None:
    check_num_workers(num_workers)
  return shared_model_algorithm(
      "pmean_sgd", loss_fn, optimizer, num_workers=num_workers, axis_name=axis_name
  )


def check_num_workers(num_workers) -> int:
  """Checks the number of workers p; returns it as an int.

  Raises:
    HyperparameterError: not an integer >= 1.
  """
  return checks.integer("num_workers", num_workers, 1, error=elastic.HyperparameterError)


class SharedModel(NamedTuple):
  """Shared state of a one-model method (pmean SGD and the sequential family).

  Attributes:
    params: x_t, the one model.
    opt_state: the optimizer's state.
    velocity: v_t (Nesterov momentum methods) or ``()``.
    average: z_t (averaged methods) or ``()``.
    step: int32 scalar t.
  """

  params: Params
  opt_state: Any
  velocity: Any = ()
  average: Any = ()
  step: Any = None
  model_state: Any = ()


def shared_model_algorithm(
    name: str,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    num_workers: int | None,
    axis_name=WORKER_AXES,
    momentum: float | None = None,
    average: Callable | None = None,
    hyperparameters: dict | None = None,
) -> Algorithm:
  r"""The one core of every method with a single model: the gradient of the
  global mini-batch (the workers' gradients averaged), one optimizer step.

  .. math::

     g_t = \frac{1}{p} \sum_{i=1}^{p} g^i_t(y_t), \qquad x_{t+1} = x_t + u_t

  with y_t = x_t and u_t the optimizer's step of g_t; with Nesterov momentum
  delta, :math:`y_t = x_t + \delta v_t`, :math:`v_{t+1} = \delta v_t + u_t`
  and :math:`x_{t+1} = x_t + v_{t+1}`. The averaged methods also keep
  z_{t+1} = average(z_t, x_t, t) (z is evaluated, kept in float32 for
  bfloat16 parameters).

  Used by :func:`pmean_sgd` and ``easgd.methods.baselines``' sgd, msgd, asgd, mvasgd.

  Args:
    name: the algorithm's name.
    loss_fn: ``loss_fn(params, batch, key) -> scalar`` (mean over the batch).
    optimizer: the (validated) optimizer.
    num_workers: p; with p = 1 no collective runs and nothing is counted;
      None: counted as p > 1.
    axis_name: mapped axis enumerating all workers.
    momentum: Nesterov delta in [0, 1) (``easgd.core.momentum``; a JAX array
      unchecked), or None.
    average: ``average(z, x, t) -> z``, or None for no average.
    hyperparameters: for logs.

  Returns:
    An :class:`Algorithm` with ``shared_model=True``; ``center`` is z for
    averaged methods, else x.
  """
  reduce_over = elastic.reduce_axis(num_workers, axis_name)  # None: one worker

  def mean(grads):
    return elastic.cast_like(elastic.worker_mean(grads, reduce_over), grads)

  def init(params, model_state=()):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return (), SharedModel(
        params,
        optimizer.init(params),
        zeros if momentum is not None else (),
        elastic.to_reduction_dtype(params) if average is not None else (),
        jnp.zeros((), jnp.int32),
        model_state,
    )

  def step(worker, shared, batch, key):
    key = worker_key(key, shared.step, axis_name)
    velocity = shared.velocity
    loss, update, opt_state, model_state = nesterov_velocity(
        loss_fn,
        optimizer,
        momentum,
        shared.params,
        velocity,
        shared.opt_state,
        batch,
        key,
        grad_fn=mean,
        model_state=shared.model_state,
    )
    if momentum is not None:
      velocity = update
    if has_model_state(model_state):  # each worker's own statistics,
      model_state = mean(model_state)  # averaged: one shared state
    z = shared.average
    if average is not None:
      z = average(z, shared.params, shared.step)
    params = optax.apply_updates(shared.params, update)
    return worker, SharedModel(params, opt_state, velocity, z, shared.step + 1, model_state), loss

  def communication(num_steps, param_bytes):
    if num_workers == 1:
      return Communication(0, 0)
    return Communication(int(num_steps), int(num_steps) * int(param_bytes))

  return Algorithm(
      name=name,
      init=init,
      step=step,
      center=(lambda shared: shared.average)
      if average is not None
      else (lambda shared: shared.params),
      worker_params=lambda worker, shared: shared.params,
      communication=communication,
      hyperparameters=dict(hyperparameters or {}),
      shared_model=True,
  )


def _event_at(t, tau: int, offsets, delay: int, event):
  """Whether clock ``t`` (host int or traced int32) has ``event``: the ``runs_at`` of
  its program."""
  if isinstance(t, int):
    return streaming.events(t, tau, len(offsets), delay) == tuple(event)
  send, apply = event
  r, late = t % tau, (t - delay) % tau
  sends = [r == o for o in offsets]
  applies = [(late == o) & (t >= o + delay) for o in offsets]
  holds = jnp.bool_(True)
  for j in range(len(offsets)):
    holds &= sends[j] if j == send else ~sends[j]
    holds &= applies[j] if j == apply else ~applies[j]
  return holds


def _streaming_elastic(
    name, loss_fn, optimizer, num_workers, tau, alpha, reset_opt_state, momentum,
    axis_name, reduce_over, techniques,
):  # fmt: skip
  """EASGD/EAMSGD with fragments, delay and compression (``easgd.core.streaming``):
  one program per ``(send, apply)`` event of the host's clock."""
  if elastic.is_array_hyperparameter(tau):
    raise elastic.HyperparameterError(
        "fragments, delay and compression need a Python tau (the host schedules the "
        "fragments); got an array tau"
    )
  if reset_opt_state:
    raise elastic.HyperparameterError(
        "reset_opt_state=True is not defined with fragments, delay or compression (an "
        "exchange moves one fragment); leave it False"
    )
  shapes = techniques.param_shapes
  if shapes is None:
    raise elastic.HyperparameterError(
        "fragments, delay and compression need the parameters' shapes: give "
        "ExchangeTechniques(param_shapes=...) (e.g. jax.eval_shape of the model's init)"
    )
  fragments = streaming.fragment_leaves(shapes, techniques.fragments, techniques.fragment_layout)
  offsets = streaming.fragment_offsets(techniques.fragments, tau)
  delay = streaming.check_delay(techniques.delay, tau)
  compression = techniques.compression
  sizes = streaming.fragment_bytes(shapes, fragments, compression)
  events = distinct_events(
      lambda t: streaming.events(t, tau, len(offsets), delay), 2 * tau + delay
  )  # the pattern repeats from clock o_{P-1} + V < 2 tau

  def init(params, model_state=()):
    velocity = () if momentum is None else jax.tree.map(jnp.zeros_like, params)
    stream = streaming.init_stream_state(params, delay, compression)
    # the sum in flight is the same on every worker: shared state
    worker = ElasticWorker(
        params, velocity, optimizer.init(params), model_state, stream._replace(pending_sum=())
    )
    shared = EASGDShared(
        elastic.to_reduction_dtype(params), jnp.zeros((), jnp.int32), stream.pending_sum
    )
    return worker, shared

  def event_step(worker, shared, batch, key, event):
    key = worker_key(key, shared.step, axis_name)
    loss, update, opt_state, model_state = nesterov_velocity(
        loss_fn,
        optimizer,
        momentum,
        worker.params,
        worker.velocity,
        worker.opt_state,
        batch,
        key,
        model_state=worker.model_state,
    )
    params, center, stream = streaming.streaming_elastic_update(
        worker.params,
        update,
        shared.center,
        worker.stream._replace(pending_sum=shared.pending),
        alpha,
        event,
        fragments,
        compression,
        reduce_over,
    )
    velocity = () if momentum is None else update
    return (
        ElasticWorker(params, velocity, opt_state, model_state, stream._replace(pending_sum=())),
        EASGDShared(center, shared.step + 1, stream.pending_sum),
        loss,
    )

  phases, step = event_programs(
      events, event_step, lambda t, event: _event_at(t, tau, offsets, delay, event)
  )

  def communication(num_steps, param_bytes):
    """Per worker: one collective per send, of its fragment's bytes (all-reduce;
    all-gather of the compressed payload with compression); ``param_bytes`` is not
    read (the fragments' bytes come from the parameters' shapes)."""
    del param_bytes
    n = int(num_steps)
    if num_workers == 1 or n <= 0:
      return Communication(0, 0)
    count, nbytes = 0, 0
    for j, o in enumerate(offsets):
      sends = (n - 1 - o) // tau + 1 if n > o else 0
      count, nbytes = count + sends, nbytes + sends * sizes[j]
    return streaming.sends_communication(count, nbytes, compression)

  hyper = elastic_hyperparameters(num_workers, tau, alpha, momentum, reset_opt_state)
  hyper.update(
      streaming.technique_hyperparameters(
          techniques.fragments, techniques.fragment_layout, delay, compression
      )
  )
  return Algorithm(
      name=name,
      init=init,
      step=step,
      center=lambda shared: shared.center,
      worker_params=lambda worker, shared: worker.params,
      communication=communication,
      hyperparameters=hyper,
      phases=phases,
  )
