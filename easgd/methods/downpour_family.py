"""The DOWNPOUR family (Dean et al. 2012), as the paper's authors ran it.

Asynchronous, on the simulated engine (docs/guides/algorithms.md, "Simulated
asynchrony"); a worker pushes after local steps 0, tau, 2 tau, ... at the step's end, as
in the authors' code, or with ``push_timing="full_period"`` after tau - 1, 2 tau - 1, ...

References:
  J. Dean et al. Large scale distributed deep networks. NeurIPS 2012 (DOWNPOUR).
  The authors' code: github.com/sixin-zh/mpiT (commit c359666),
  ``asyncsgd/optim-downpour.lua``.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from optax.tree_utils import tree_add, tree_zeros_like

from easgd.asynchrony.schedule import ExchangeSchedule
from easgd.asynchrony.simulation import async_push
from easgd.core.base import (
    Algorithm,
    LossFn,
    local_optimizer,
)
from easgd.core.elastic import WORKER_AXES
from easgd.core.momentum import check_momentum, velocity_update
from easgd.methods.averages import _average, _polyak_rate, check_average_rate

Params = Any


# --------------------------------------------------------------------------
# DOWNPOUR family (asynchronous).
# --------------------------------------------------------------------------


def downpour(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    tau: int = 1,
    learning_rate: float | None = None,
    schedule: ExchangeSchedule | None = None,
    push_timing: str = "authors",
    axis_name=WORKER_AXES,
) -> Algorithm:
  """DOWNPOUR with push period tau, as in the authors' code (simulated async).

  Each local step of worker i (t^i its clock at the step's start), the push
  served at the step's end, one worker at a time (``easgd.asynchrony.simulation``):

      u^i <- u^i - eta g^i(x^i)
      if tau divides t^i:     (push_timing="authors": after t^i = 0, tau, 2 tau, ...)
        x~ <- x~ + u^i         (the master adds the pushed update)
        x^i <- x~              (the worker overwrites its params with x~)
        u^i <- 0
      else:
        x^i <- x^i - eta g^i(x^i)
      t^i <- t^i + 1

  ("-eta g" is the local optimizer's step.) With tau = 1 this is asynchronous
  SGD. The center x~ is evaluated. Example (p = 1, tau = 2, x0 = 1,
  F(x) = 1.5 x^2 / 2, eta = 0.1): step 0 pushes -0.15, x~ = x = 0.85; step 1
  moves x to 0.7225 locally; x~ stays 0.85 until step 2 pushes.

  Conventions (sources in :func:`easgd.asynchrony.simulation.async_push`): push
  steps from the authors' code (``push_timing="full_period"``: after
  t^i = tau - 1, 2 tau - 1, ..., a convention of ours); the push at the
  step's end (authors' code, the paper's loop); the fetch after the worker's
  own push (our choice; the authors' code races the two).

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the worker's optimizer; default ``optax.sgd(learning_rate)``.
    num_workers: p.
    tau: push period in local steps (>= 1).
    learning_rate: eta of the default SGD optimizer.
    schedule: exchange schedule; default round-robin, speeds 1, staleness 0
      (with staleness s the fetched center lacks the last s master updates).
    push_timing: "authors" (default) or "full_period".
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"downpour"``.

  Raises:
    HyperparameterError: tau < 1, learning_rate <= 0, unknown push_timing,
      bad schedule.

  References:
    github.com/sixin-zh/mpiT (commit c359666), ``asyncsgd/optim-downpour.lua``;
    Dean et al. (2012); Zhang, Choromanska, LeCun (2015), Section 5.
  """
  optimizer = local_optimizer(optimizer, learning_rate)

  def master_rule(center, master, update, read, clock):
    del read, clock
    return tree_add(center, update), master, None

  return async_push(
      "downpour",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      schedule=schedule,
      master_rule=master_rule,
      init_master=lambda params: (),
      center=lambda shared: shared.center,
      hyperparameters={},
      push_timing=push_timing,
      axis_name=axis_name,
  )


def mdownpour(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    momentum: float,
    tau: int = 1,
    learning_rate: float | None = None,
    schedule: ExchangeSchedule | None = None,
    push_timing: str = "authors",
    axis_name=WORKER_AXES,
) -> Algorithm:
  """MDOWNPOUR: DOWNPOUR with Nesterov momentum on the master.

  Workers as in :func:`downpour` (plain SGD steps u accumulated and pushed,
  same push steps and timing; the paper uses tau = 1, i.e. u = -eta g^i at
  the fetched center). The master treats each push u as a step of Nesterov's
  method in the form of Sutskever et al. / Torch's
  ``optim.sgd(nesterov=true)``, whose parameters are the look-ahead point (so
  workers compute the Nesterov look-ahead gradient at the center they fetch);
  the authors' released code has no MDOWNPOUR, so this form is our choice
  for the paper's one-line description (Section 5):

      V  <- delta V + u
      x~ <- x~ + u + delta V
      x^i <- x~,   u^i <- 0

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the worker's optimizer; default ``optax.sgd(learning_rate)``.
    num_workers: p.
    momentum: delta in [0, 1) (paper: 0.99). momentum = 0 is :func:`downpour`.
    tau: push period (paper: 1).
    learning_rate: eta of the default SGD optimizer.
    schedule: exchange schedule (see :func:`downpour`).
    push_timing: as :func:`downpour`.
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"mdownpour"``; the center
    x~ is evaluated.

  Raises:
    HyperparameterError: momentum outside [0, 1), tau < 1, learning_rate <= 0,
      unknown push_timing.

  References:
    Zhang, Choromanska, LeCun (2015), Section 5; Sutskever et al. (2013).
  """
  momentum = check_momentum(momentum)
  optimizer = local_optimizer(optimizer, learning_rate)

  def master_rule(center, velocity, update, read, clock):
    del read, clock
    velocity = velocity_update(velocity, update, momentum)
    center = jax.tree.map(
        lambda c, u, v: (c + (u + momentum * v)).astype(c.dtype), center, update, velocity
    )
    return center, velocity, None

  return async_push(
      "mdownpour",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      schedule=schedule,
      master_rule=master_rule,
      init_master=lambda params: tree_zeros_like(params),
      center=lambda shared: shared.center,
      hyperparameters=dict(momentum=momentum),
      push_timing=push_timing,
      axis_name=axis_name,
  )


def _averaged_downpour(
    name,
    loss_fn,
    optimizer,
    *,
    num_workers,
    tau,
    learning_rate,
    schedule,
    rate,
    push_timing,
    axis_name,
):
  optimizer = local_optimizer(optimizer, learning_rate)

  def master_rule(center, average, update, read, clock):
    del read
    a = _polyak_rate(clock) if rate is None else rate
    average = _average(average, center, a)  # z_{t+1} from the pre-update x~_t
    return tree_add(center, update), average, None

  return async_push(
      name,
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      schedule=schedule,
      master_rule=master_rule,
      init_master=lambda params: params,
      center=lambda shared: shared.master,
      hyperparameters=dict(average_rate="1/(t+1)" if rate is None else rate),
      push_timing=push_timing,
      axis_name=axis_name,
  )


def adownpour(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    tau: int = 1,
    learning_rate: float | None = None,
    schedule: ExchangeSchedule | None = None,
    push_timing: str = "authors",
    axis_name=WORKER_AXES,
) -> Algorithm:
  r"""ADOWNPOUR: DOWNPOUR plus a running average of the center (z is evaluated).

  At every master update (push of worker i, master clock t = number of
  updates before this one):

  .. math::

     z_{t+1} &= (1 - a_{t+1})\, z_t + a_{t+1} \tilde x_t, \qquad a_{t+1} = \frac{1}{t + 1} \\
     \tilde x_{t+1} &= \tilde x_t + u^i, \qquad x^i \leftarrow \tilde x_{t+1}, \qquad u^i \leftarrow 0

  so z_t is the mean of x~_0 .. x~_{t-1} (z_0 = x~_0, the initial params).
  a_{t+1} and 1 - a_{t+1} are computed in the dtype of the parameters.
  Workers as in :func:`downpour` (push steps, push at the step's end). The
  average over master updates, from the pre-update center, is the paper's
  description (Section 5; the authors' released code has no ADOWNPOUR).

  Args:
    As :func:`downpour`.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"adownpour"``; ``center``
    is z.

  Raises:
    HyperparameterError: as :func:`downpour`.

  References:
    Zhang, Choromanska, LeCun (2015), Section 5; Polyak & Juditsky (1992).
  """
  return _averaged_downpour(
      "adownpour",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      learning_rate=learning_rate,
      schedule=schedule,
      rate=None,
      push_timing=push_timing,
      axis_name=axis_name,
  )


def mvadownpour(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    tau: int = 1,
    average_rate: float = 0.001,
    learning_rate: float | None = None,
    schedule: ExchangeSchedule | None = None,
    push_timing: str = "authors",
    axis_name=WORKER_AXES,
) -> Algorithm:
  r"""MVADOWNPOUR: DOWNPOUR plus a constant-rate moving average (z is evaluated).

  .. math::

     z_{t+1} &= (1 - a)\, z_t + a\, \tilde x_t \\
     \tilde x_{t+1} &= \tilde x_t + u^i, \qquad x^i \leftarrow \tilde x_{t+1}, \qquad u^i \leftarrow 0

  with a = ``average_rate`` (paper: 0.001).

  The paper's description (Section 5; not in the authors' released code);
  workers as in :func:`downpour`.

  Args:
    As :func:`downpour`, and
    average_rate: a in (0, 1].

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"mvadownpour"``; ``center``
    is z.

  Raises:
    HyperparameterError: average_rate outside (0, 1], or as :func:`downpour`.

  References:
    Zhang, Choromanska, LeCun (2015), Section 5.
  """
  return _averaged_downpour(
      "mvadownpour",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      learning_rate=learning_rate,
      schedule=schedule,
      rate=check_average_rate(average_rate),
      push_timing=push_timing,
      axis_name=axis_name,
  )
