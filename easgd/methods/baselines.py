"""The paper's one-model comparators and periodic averaging, on the same Algorithm interface.

Sequential SGD, MSGD (Nesterov), ASGD and MVASGD (one model; with p > 1 workers the
gradient is averaged over workers every step, which equals one worker with batch p * B),
local SGD and DiLoCo. The DOWNPOUR family is ``easgd.methods.downpour_family``; the
table of all algorithms and the settings each reads: docs/guides/algorithms.md. For the
averaged methods ``Algorithm.center`` returns the average (what the trainer evaluates)
and ``worker_params`` the iterate. Array hyperparameters (traced, unchecked) as
docs/guides/algorithms.md ("Array hyperparameters"): learning_rate, the momentum delta,
average_rate, DiLoCo's outer rate and momentum, and local SGD's and DiLoCo's tau.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Section 5 (comparators).
  B. T. Polyak, A. B. Juditsky. Acceleration of stochastic approximation by
  averaging. SIAM J. Control Optim. 1992 (ASGD).
  T. Lin et al. Don't use large mini-batches, use local SGD. ICLR 2020.
  A. Douillard et al. DiLoCo: distributed low-communication training of
  language models. 2023 (arXiv:2311.08105).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from optax.tree_utils import tree_sub

from easgd._util import checks
from easgd.core import algorithms, elastic
from easgd.core.base import (
    Algorithm,
    LossFn,
    check_exchange_flag,
    every_tau_steps,
    local_optimizer,
    periodic_communication,
    worker_key,
)
from easgd.core.elastic import WORKER_AXES
from easgd.core.momentum import check_momentum, loss_and_grad
from easgd.methods.averages import _average, _polyak_rate, check_average_rate

Params = Any


# --------------------------------------------------------------------------
# Sequential methods.
# --------------------------------------------------------------------------


def _sequential(
    name, loss_fn, optimizer, *, num_workers, learning_rate, momentum, rate, averaged, axis_name
):
  optimizer = local_optimizer(optimizer, learning_rate)
  num_workers = algorithms.check_num_workers(num_workers)

  def average(z, x, t):  # z_{t+1} from x_t, rate 1/(t+1) or constant
    return _average(z, x, _polyak_rate(t) if rate is None else rate)

  hyper = dict(num_workers=num_workers)
  if momentum is not None:
    hyper["momentum"] = momentum
  if averaged:
    hyper["average_rate"] = "1/(t+1)" if rate is None else rate
  return algorithms.shared_model_algorithm(
      name,
      loss_fn,
      optimizer,
      num_workers=num_workers,
      axis_name=axis_name,
      momentum=momentum,
      average=average if averaged else None,
      hyperparameters=hyper,
  )


def sgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int = 1,
    learning_rate: float | None = None,
    axis_name=WORKER_AXES,
) -> Algorithm:
  r"""Sequential SGD (with the given optimizer; p > 1: on the global batch).

  .. math::

     x_{t+1} = x_t - \eta\, g(x_t)

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar`` (mean over the batch).
    optimizer: the optimizer; default ``optax.sgd(learning_rate)``.
    num_workers: p; the gradient is averaged over the p workers' batches every
      step (one all-reduce), which is the sequential method with batch p * B.
      p = 1 is the paper's sequential baseline (no communication).
    learning_rate: eta of the default SGD optimizer.
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"sgd"``.

  References:
    Zhang, Choromanska, LeCun (2015), Section 5 (SGD).
  """
  return _sequential(
      "sgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      learning_rate=learning_rate,
      momentum=None,
      rate=None,
      averaged=False,
      axis_name=axis_name,
  )


def msgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    momentum: float,
    num_workers: int = 1,
    learning_rate: float | None = None,
    axis_name=WORKER_AXES,
) -> Algorithm:
  r"""Sequential momentum SGD with Nesterov's look-ahead (eq. 7 without elastic).

  .. math::

     v_{t+1} = \delta v_t - \eta\, g(x_t + \delta v_t), \qquad x_{t+1} = x_t + v_{t+1}

  Args:
    momentum: delta in [0, 1) (paper: 0.99); the other arguments as
      :func:`sgd` (the optimizer maps the look-ahead gradient to -eta g).

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"msgd"``.

  Raises:
    HyperparameterError: momentum outside [0, 1), learning_rate <= 0.

  References:
    Zhang, Choromanska, LeCun (2015), Section 5 (MSGD); Sutskever et al. (2013).
  """
  return _sequential(
      "msgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      learning_rate=learning_rate,
      momentum=check_momentum(momentum),
      rate=None,
      averaged=False,
      axis_name=axis_name,
  )


def asgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int = 1,
    learning_rate: float | None = None,
    axis_name=WORKER_AXES,
) -> Algorithm:
  r"""Averaged SGD: SGD plus the running average of its iterates (z evaluated).

  .. math::

     z_{t+1} &= (1 - a_{t+1})\, z_t + a_{t+1} x_t, \qquad a_{t+1} = \frac{1}{t + 1} \\
     x_{t+1} &= x_t - \eta\, g(x_t)

  so z_t is the mean of x_0 .. x_{t-1} (z_0 = x_0). a_{t+1} and 1 - a_{t+1}
  are computed in the dtype of the parameters.

  Args: as :func:`sgd`.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"asgd"``; ``center`` is z.

  References:
    Zhang, Choromanska, LeCun (2015), Section 5 (ASGD); Polyak & Juditsky (1992).
  """
  return _sequential(
      "asgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      learning_rate=learning_rate,
      momentum=None,
      rate=None,
      averaged=True,
      axis_name=axis_name,
  )


def mvasgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int = 1,
    average_rate: float = 0.001,
    learning_rate: float | None = None,
    axis_name=WORKER_AXES,
) -> Algorithm:
  r"""Moving-average SGD: SGD plus a constant-rate average of its iterates.

  .. math::

     z_{t+1} = (1 - a)\, z_t + a\, x_t, \qquad x_{t+1} = x_t - \eta\, g(x_t)

  with a = ``average_rate``.

  Args:
    average_rate: a in (0, 1]; the other arguments as :func:`sgd`.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"mvasgd"``; ``center`` is z.

  Raises:
    HyperparameterError: average_rate outside (0, 1].

  References:
    Zhang, Choromanska, LeCun (2015), Section 5 (MVASGD).
  """
  return _sequential(
      "mvasgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      learning_rate=learning_rate,
      momentum=None,
      rate=check_average_rate(average_rate),
      averaged=True,
      axis_name=axis_name,
  )


# --------------------------------------------------------------------------
# Synchronous periodic averaging.
# --------------------------------------------------------------------------


class LocalWorker(NamedTuple):
  """Per-worker state of local SGD / DiLoCo: x^i, the inner optimizer state and
  the model's state (``()`` without, see ``easgd.core.momentum.loss_and_grad``)."""

  params: Params
  opt_state: Any
  model_state: Any = ()


class LocalShared(NamedTuple):
  """Shared state of local SGD / DiLoCo.

  Attributes:
    center: local SGD: the mean at the last averaging; DiLoCo: the outer
      model x~.
    outer_state: DiLoCo's outer optimizer state, ``()`` for local SGD.
    step: int32 scalar, the common clock t.
  """

  center: Params
  outer_state: Any
  step: jax.Array


def _periodic(
    name,
    loss_fn,
    optimizer,
    *,
    num_workers,
    tau,
    learning_rate,
    outer,
    hyperparameters,
    num_steps,
    axis_name,
):
  tau = elastic.check_tau(tau, allow_array=True)
  num_workers = algorithms.check_num_workers(num_workers)
  last_step = None
  if num_steps is not None:
    last_step = (
        checks.integer(
            "num_steps",
            num_steps,
            1,
            error=elastic.HyperparameterError,
            what="the run's length in steps",
        )
        - 1
    )
  # every tau steps, and the run's last step: on the device, and on the host
  # (Algorithm.exchange_at) for a Python tau
  schedule = every_tau_steps(tau, offset=1, last_step=last_step)
  optimizer = local_optimizer(optimizer, learning_rate)
  reduce_over = elastic.reduce_axis(num_workers, axis_name)  # None: one worker

  def init(params, model_state=()):
    center = elastic.to_reduction_dtype(params)
    return (
        LocalWorker(params, optimizer.init(params), model_state),
        LocalShared(center, () if outer is None else outer.init(center), jnp.zeros((), jnp.int32)),
    )

  def step(worker, shared, batch, key, exchange=None):
    check_exchange_flag(exchange)
    key = worker_key(key, shared.step, axis_name)
    loss, grads, model_state = loss_and_grad(loss_fn, worker.params, batch, key, worker.model_state)
    update, opt_state = optimizer.update(grads, worker.opt_state, worker.params)
    params = optax.apply_updates(worker.params, update)

    def sync():
      mean = elastic.worker_mean(params, reduce_over)  # in the center's dtype
      if outer is None:
        return elastic.cast_like(mean, params), mean, shared.outer_state
      pseudo_grad = tree_sub(shared.center, mean)
      outer_update, outer_state = outer.update(pseudo_grad, shared.outer_state, shared.center)
      center = optax.apply_updates(shared.center, outer_update)
      return elastic.cast_like(center, params), center, outer_state

    def keep():
      return params, shared.center, shared.outer_state

    # decided on the device from the clock, or fixed by the host's flag
    flag = schedule(shared.step) if exchange is None else exchange
    params, center, outer_state = elastic.on_exchange(flag, sync, keep)
    return (
        LocalWorker(params, opt_state, model_state),
        LocalShared(center, outer_state, shared.step + 1),
        loss,
    )

  return Algorithm(
      name=name,
      init=init,
      step=step,
      center=lambda shared: shared.center,
      worker_params=lambda worker, shared: worker.params,
      communication=periodic_communication(
          tau, offset=1, num_workers=num_workers, last_step=last_step
      ),
      hyperparameters=dict(
          hyperparameters,
          num_workers=num_workers,
          tau=tau,
          **({} if num_steps is None else dict(num_steps=int(num_steps))),
      ),
      exchange_at=None if elastic.is_array_hyperparameter(tau) else schedule,
  )


def local_sgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    tau: int,
    learning_rate: float | None = None,
    num_steps: int | None = None,
    axis_name=WORKER_AXES,
) -> Algorithm:
  """Local SGD (periodic model averaging): average all workers every tau steps.

      x^i <- x^i + u^i        (local optimizer step; SGD: u = -eta g^i(x^i))
      if tau divides t + 1, or t + 1 = num_steps (the run's last step):
                              x^i <- (1/p) sum_j x^j  for every i;   x~ <- that mean

  The local optimizer state stays per worker (not averaged). ``center`` is the
  mean at the last averaging (the initial params before the first), which is
  what the trainer evaluates; with ``num_steps`` the run ends on an average,
  so the model it returns and exports is the mean of the final workers. The
  mean is formed in float32 for bfloat16 parameters (the center keeps it).

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the local optimizer; default ``optax.sgd(learning_rate)``.
    num_workers: p.
    tau: averaging period in steps (>= 1); tau = 1 with SGD is pmean SGD. An
      int32 JAX array is taken unchecked (may be traced): then
      ``exchange_at`` is None (the step decides the average on the device)
      and ``communication`` raises (it counts from a Python tau).
    learning_rate: eta of the default SGD optimizer (a JAX array unchecked).
    num_steps: the run's total number of steps (>= 1), whose last one
      averages too; None: periodic averaging only.
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"local_sgd"``; one
    parameter all-reduce every tau steps (and at the last step).

  Raises:
    HyperparameterError: tau < 1, learning_rate <= 0, num_steps < 1.

  References:
    Lin et al. (2020); PyTorch ``PeriodicModelAverager``.
  """
  return _periodic(
      "local_sgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      learning_rate=learning_rate,
      outer=None,
      hyperparameters={},
      num_steps=num_steps,
      axis_name=axis_name,
  )


def diloco(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    tau: int,
    outer_learning_rate: float = 0.7,
    outer_momentum: float = 0.9,
    outer_optimizer: optax.GradientTransformation | None = None,
    learning_rate: float | None = None,
    num_steps: int | None = None,
    axis_name=WORKER_AXES,
) -> Algorithm:
  """DiLoCo: inner optimizer for tau steps, then an outer step on the center.

      x^i <- x^i + u^i                         (inner optimizer, e.g. AdamW)
      if tau divides t + 1, or t + 1 = num_steps (the run's last step):
        Delta = x~ - (1/p) sum_i x^i           (mean pseudo-gradient)
        m  <- mu m + Delta                     (outer SGD, Nesterov momentum mu)
        x~ <- x~ - eta_out (Delta + mu m)
        x^i <- x~ for every i                  (inner states are kept)

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the inner optimizer (state per worker, never reset); default
      ``optax.sgd(learning_rate)``.
    num_workers: p.
    tau: inner steps per round (>= 1), or an int32 JAX array (as
      :func:`local_sgd`).
    outer_learning_rate: eta_out > 0 (DiLoCo: 0.7), or a JAX array (unchecked).
    outer_momentum: Nesterov momentum mu in [0, 1) of the outer SGD (0.9), or
      a JAX array (unchecked; the momentum trace is then kept even at 0).
    outer_optimizer: any Optax optimizer instead of the outer SGD (then the
      two outer_* values are ignored).
    learning_rate: eta of the default inner SGD optimizer (a JAX array
      unchecked).
    num_steps: the run's total number of steps (>= 1); its last step ends a
      (possibly shorter) round with an outer step, so the run ends on the
      outer model; None: periodic rounds only.
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"diloco"``; ``center`` is
    x~ (kept in float32 for bfloat16 parameters); one parameter all-reduce
    every tau steps (and at the last step).

  Raises:
    HyperparameterError: tau < 1, outer_learning_rate <= 0, outer_momentum
      outside [0, 1), learning_rate <= 0.

  References:
    Douillard et al. (2023), Algorithm 1.
  """
  outer_optimizer, hyper = outer_sgd(outer_learning_rate, outer_momentum, outer_optimizer)
  return _periodic(
      "diloco",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      learning_rate=learning_rate,
      outer=outer_optimizer,
      hyperparameters=hyper,
      num_steps=num_steps,
      axis_name=axis_name,
  )


def outer_sgd(outer_learning_rate, outer_momentum, outer_optimizer=None):
  """DiLoCo's outer optimizer and its hyperparameters record.

      m  <- mu m + Delta;   x~ <- x~ - eta_out (Delta + mu m)

  ``optax.sgd(eta_out, momentum=mu, nesterov=True)`` (no momentum trace for a
  Python mu = 0), or ``outer_optimizer`` as given.

  Args:
    outer_learning_rate: eta_out > 0, or a JAX array (unchecked).
    outer_momentum: mu in [0, 1), or a JAX array (unchecked; the trace is kept).
    outer_optimizer: None, or any ``optax.GradientTransformation`` (then the
      two values above are ignored).

  Returns:
    ``(optimizer, hyperparameters)``.

  Raises:
    HyperparameterError: outer_learning_rate <= 0, outer_momentum outside [0, 1).
    TypeError: outer_optimizer is not an ``optax.GradientTransformation``.
  """
  if outer_optimizer is None:
    if not elastic.is_array_hyperparameter(outer_learning_rate):  # arrays: unchecked
      outer_learning_rate = checks.real(
          "outer_learning_rate",
          outer_learning_rate,
          0,
          open_low=True,
          error=elastic.HyperparameterError,
      )
    outer_momentum = check_momentum(outer_momentum)
    trace = (
        outer_momentum
        if elastic.is_array_hyperparameter(outer_momentum)
        else outer_momentum or None
    )  # a Python 0: no momentum trace
    outer_optimizer = optax.sgd(outer_learning_rate, momentum=trace, nesterov=True)
    hyper = dict(outer_learning_rate=outer_learning_rate, outer_momentum=outer_momentum)
  elif not isinstance(outer_optimizer, optax.GradientTransformation):
    raise TypeError(
        f"outer_optimizer must be an optax.GradientTransformation, "
        f"got {type(outer_optimizer).__name__}"
    )
  else:
    hyper = dict(outer_optimizer="custom")
  return outer_optimizer, hyper
