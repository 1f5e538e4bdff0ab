"""Asynchronous EASGD/EAMSGD (Algorithms 1-2) and the DOWNPOUR engine, simulated in SPMD code.

The per-event rules of each method on the simulated engine (``easgd.asynchrony.simulator``):
ticks, speeds, exchange order, staleness and what is not modelled are in
docs/guides/algorithms.md ("Simulated asynchrony").

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Algorithms 1 and 2, eq. (12)-(13).
  The authors' code: github.com/sixin-zh/mpiT (commit c359666), ``asyncsgd/``.
"""

from __future__ import annotations

from typing import Callable

import optax
from optax.tree_utils import tree_add, tree_sub, tree_where, tree_zeros_like

from easgd._util import checks
from easgd.asynchrony.schedule import (
    ExchangeSchedule,
    exchange_schedule,
    mean_exchanges,
    push_offset,
)
from easgd.asynchrony.simulator import MasterRule, simulate
from easgd.core import elastic
from easgd.core.algorithms import elastic_hyperparameters
from easgd.core.base import (
    Algorithm,
    Communication,
    LossFn,
    every_tau_steps,
    local_optimizer,
    reset_optimizer_state,
)
from easgd.core.elastic import WORKER_AXES
from easgd.core.momentum import check_momentum, loss_and_grad, nesterov_velocity


def _resolve_schedule(schedule, num_workers):
  if schedule is None:
    return exchange_schedule(num_workers)
  if not isinstance(schedule, ExchangeSchedule):
    raise TypeError(
        f"schedule must be an ExchangeSchedule (see exchange_schedule), "
        f"got {type(schedule).__name__}"
    )
  if schedule.num_workers != num_workers:
    raise elastic.HyperparameterError(
        f"schedule is for {schedule.num_workers} workers, num_workers={num_workers}"
    )
  return schedule


def _async_elastic(
    name,
    loss_fn,
    optimizer,
    *,
    num_workers,
    tau,
    alpha,
    beta,
    learning_rate,
    schedule,
    momentum,
    reset_opt_state,
    axis_name,
    delay=0,
):
  tau = elastic.check_tau(tau, allow_array=True)
  delay = check_delay(delay, tau)
  alpha = elastic.resolve_alpha(num_workers, alpha, beta)
  optimizer = local_optimizer(optimizer, learning_rate)
  schedule = _resolve_schedule(schedule, num_workers)

  exchange_due = every_tau_steps(tau, offset=0)  # Algorithm 1: tau | t^i

  def local_step(worker, batch, key):
    due = exchange_due(worker.clock)
    opt_state = worker.opt_state
    if reset_opt_state:
      opt_state = reset_optimizer_state(optimizer, opt_state, worker.params, due)
    loss, step, opt_state, model_state = nesterov_velocity(
        loss_fn,
        optimizer,
        momentum,
        worker.params,
        worker.buffer,
        opt_state,
        batch,
        key,
        model_state=worker.model_state,
    )
    return loss, (step, opt_state, model_state), worker.params, due

  def master_rule(center, master, x, read, clock):
    del clock
    diff = elastic.elastic_difference(x, read, alpha)  # alpha (x - x~_read)
    return tree_add(center, diff), master, diff

  def finish(worker, proposal, diff, exchanged):
    del exchanged  # diff is zero when the worker did not exchange
    step, opt_state, model_state = proposal
    params = elastic.cast_like(  # diff in float32 for bfloat16 parameters
        tree_add(tree_sub(worker.params, diff), step), worker.params
    )
    return worker._replace(
        params=params,
        opt_state=opt_state,
        buffer=() if momentum is None else step,
        model_state=model_state,
    )

  def communication(num_steps, param_bytes):
    n = mean_exchanges(schedule, num_steps, _host_tau(tau), "step_start", offset=0)
    return Communication(n, n * int(param_bytes))

  hyper = elastic_hyperparameters(num_workers, tau, alpha, momentum, reset_opt_state)
  if delay:  # absent at 0: the records of runs without overlap stay as they were
    hyper["delay"] = delay
  algorithm = simulate(
      name,
      schedule=schedule,
      local_step=local_step,
      master_rule=master_rule,
      finish=finish,
      init_buffer=(lambda params: ())
      if momentum is None
      else (lambda params: tree_zeros_like(params)),
      init_opt_state=optimizer.init,
      init_master=lambda params: (),
      center=lambda shared: shared.center,
      communication=communication,
      hyperparameters=hyper,
      exchange_at="step_start",
      axis_name=axis_name,
      due=exchange_due,
  )
  if not delay:
    return algorithm

  def no_simulated_overlap(*args, **kwargs):
    raise elastic.HyperparameterError(
        f"{name} with delay={delay} runs on the real asynchronous runtimes and in "
        "easgd.asynchrony.log.replay only; the simulated engine (Algorithm.step) has no "
        "overlap: use delay 0 there"
    )

  return algorithm._replace(step=no_simulated_overlap)


def _host_tau(tau) -> int:
  """``tau`` for a count made on the host (``communication``).

  Raises:
    HyperparameterError: tau is a JAX array (an algorithm built inside a
      program, with its tau traced per configuration).
  """
  if elastic.is_array_hyperparameter(tau):
    raise elastic.HyperparameterError(
        "the exchange count needs a Python tau; got an array tau (build the algorithm "
        "from the config's int tau to count its exchanges)"
    )
  return tau


def check_delay(delay, tau) -> int:
  """Checks the overlap V of an asynchronous elastic exchange; returns it as an int.

  Args:
    delay: V, local steps between an exchange's send (clock s) and the step that
      applies its reply (clock s + V); an integer in [0, tau - 1].
    tau: the communication period (a checked int), or a JAX array (traced per
      configuration), which admits V = 0 only.

  Returns:
    ``int(delay)``.

  Raises:
    HyperparameterError: V is not an integer in [0, tau - 1] (one exchange per
      worker in flight), or not 0 with an array tau.
  """
  if elastic.is_array_hyperparameter(tau):
    return checks.integer(
        "delay", delay, 0, 0, error=elastic.HyperparameterError, what="0 with an array tau"
    )
  return checks.integer(
      "delay", delay, 0, tau - 1, error=elastic.HyperparameterError, what="local steps, < tau"
  )


def async_easgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    tau: int = 1,
    alpha: float | None = None,
    beta: float | None = None,
    learning_rate: float | None = None,
    schedule: ExchangeSchedule | None = None,
    reset_opt_state: bool = False,
    delay: int = 0,
    axis_name=WORKER_AXES,
) -> Algorithm:
  """Asynchronous EASGD (Algorithm 1), simulated with an exchange schedule.

  Each local step of worker i, in the order of events of the schedule
  (module docstring):

      x = x^i                                                  (snapshot)
      if tau divides t^i:                      (served one worker at a time)
        d = alpha (x - x~_read)          x~_read: the center, ``staleness`` late
        x^i <- x^i - d;    x~ <- x~ + d                        (the master)
      x^i <- x^i + u,   u = optimizer step at the snapshot (SGD: -eta g^i(x))
      t^i <- t^i + 1

  With the round-robin order, speeds 1 and tau = 1 one tick is p steps of
  the round-robin scheme of eq. (12)-(13).

  Overlap (``delay`` V >= 1; the real runtimes and :func:`~easgd.asynchrony.log.replay`
  only, docs/guides/streaming.md "Overlap in the asynchronous runtimes"): at an
  exchange clock s (tau | s) the worker sends x = x^i_s and takes its step
  without the elastic term, x^i_{s+1} = x^i_s + u_s; the master serves the
  message when it arrives (d = alpha (x^i_s - x~_read), x~ <- x~ + d); the
  worker applies the reply at its clock s + V:
  x^i_{s+V+1} = (x^i_{s+V} - d) + u_{s+V}. V = 0 is the rule above.

  Conventions and their sources:
    * Exchange at local clocks t = 0, tau, 2 tau, ... at the START of the
      step, before its gradient, and the gradient at the pre-exchange
      snapshot: the paper's Algorithm 1 (and the authors'
      ``optim-eamsgd.lua``: ``pversion % su == 0``, center received before
      ``localupdate``).
    * The exchange is served at that time among the other workers'
      exchanges (module docstring): with unequal speeds an earlier step start
      is served first; exchanges at the same time follow the tick's order.
    * The master's update is applied when the exchange is served (paper,
      Algorithm 1). In the authors' code the difference is sent without
      waiting and reaches the master during the gradient computation; not
      modelled (no network delay other than ``staleness``).

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the local optimizer (receives the worker's own params, state
      per worker); default ``optax.sgd(learning_rate)``.
    num_workers: p.
    tau: communication period, in the worker's local steps (>= 1); or an
      int32 JAX array (traced per configuration: the exchange is decided on the
      device from the clock; ``communication`` then raises, ``delay`` must be 0).
    alpha: moving rate; or give ``beta`` = num_workers * alpha.
    beta: center moving rate (paper: 0.9).
    learning_rate: eta of the default SGD optimizer.
    schedule: an :class:`ExchangeSchedule`; default round-robin, speeds 1,
      staleness 0.
    reset_opt_state: re-initialise the optimizer state at each of the worker's
      exchanges (schedules keep their position).
    delay: V, local steps from an exchange's send to the step that applies its
      reply (above), an integer in [0, tau - 1]; V >= 1 is run by the real
      runtimes and ``replay`` only (its ``step`` raises HyperparameterError),
      and is in ``hyperparameters["delay"]`` (absent at 0).
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"async_easgd"``. Its
    ``communication`` counts the worker's exchanges (each sends one
    parameter-sized message and receives one), mean over workers.

  Raises:
    HyperparameterError: tau, alpha/beta, learning_rate, delay or the schedule invalid.
    TypeError: optimizer or schedule of the wrong type.

  References:
    Zhang, Choromanska, LeCun (2015), Algorithm 1; eq. (12)-(13).
    github.com/sixin-zh/mpiT (commit c359666), ``asyncsgd/optim-eamsgd.lua``.
  """
  return _async_elastic(
      "async_easgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      alpha=alpha,
      beta=beta,
      learning_rate=learning_rate,
      schedule=schedule,
      momentum=None,
      reset_opt_state=reset_opt_state,
      axis_name=axis_name,
      delay=delay,
  )


def async_eamsgd(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    momentum: float,
    tau: int = 1,
    alpha: float | None = None,
    beta: float | None = None,
    learning_rate: float | None = None,
    schedule: ExchangeSchedule | None = None,
    reset_opt_state: bool = False,
    delay: int = 0,
    axis_name=WORKER_AXES,
) -> Algorithm:
  """Asynchronous EAMSGD (Algorithm 2), simulated with an exchange schedule.

      x = x^i                                                  (snapshot)
      if tau divides t^i:
        d = alpha (x - x~_read);   x^i <- x^i - d;   x~ <- x~ + d
      v^i <- delta v^i + u,   u = optimizer step at x + delta v^i
                              (SGD: u = -eta g^i(x + delta v^i))
      x^i <- x^i + v^i;   t^i <- t^i + 1

  The velocity is local (never communicated, pulled or reset); momentum = 0
  gives :func:`async_easgd`. Exchange times, serving order, the atomic
  exchange and the overlap (``delay`` V: the reply d applied at s + V,
  x^i <- x^i - d + v^i there) follow :func:`async_easgd`; the
  look-ahead gradient at the pre-exchange snapshot is the paper's Algorithm 2
  (and the authors' ``optim-eamsgd.lua``, ``localupdate``).

  Args:
    loss_fn, optimizer, num_workers, tau, alpha, beta, learning_rate, schedule, reset_opt_state, delay, axis_name: as
      :func:`async_easgd` (the optimizer receives the look-ahead point as params, see
      ``easgd.core.momentum``).
    momentum: delta in [0, 1) (paper: 0.99).

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"async_eamsgd"``.

  Raises:
    HyperparameterError: as :func:`async_easgd`, or momentum outside [0, 1).
    TypeError: optimizer or schedule of the wrong type.

  References:
    Zhang, Choromanska, LeCun (2015), Algorithm 2 and eq. (7).
    github.com/sixin-zh/mpiT (commit c359666), ``asyncsgd/optim-eamsgd.lua``.
  """
  return _async_elastic(
      "async_eamsgd",
      loss_fn,
      optimizer,
      num_workers=num_workers,
      tau=tau,
      alpha=alpha,
      beta=beta,
      learning_rate=learning_rate,
      schedule=schedule,
      momentum=check_momentum(momentum),
      reset_opt_state=reset_opt_state,
      axis_name=axis_name,
      delay=delay,
  )


def async_push(
    name: str,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    num_workers: int,
    tau: int,
    schedule: ExchangeSchedule | None,
    master_rule: MasterRule,
    init_master: Callable,
    center: Callable,
    hyperparameters: dict,
    push_timing: str = "authors",
    axis_name=WORKER_AXES,
) -> Algorithm:
  """A DOWNPOUR-type method on the simulated asynchronous engine.

  Each local step of worker i (t^i its clock at the step's start, the
  authors' ``pversion``):

      u = optimizer step at x^i (SGD: -eta g^i(x^i));  acc^i <- acc^i + u
      if tau divides t^i + offset:   (at the step's END; one worker at a time)
        the master applies ``master_rule`` to acc^i (DOWNPOUR: x~ <- x~ + acc^i),
        x^i <- the center fetched after the update (``staleness`` late), acc^i <- 0
      else:
        x^i <- x^i + u
      t^i <- t^i + 1

  Conventions and their sources:
    * Push steps. ``push_timing="authors"`` (default, offset 0): pushes after
      local steps t = 0, tau, 2 tau, ..., the authors' ``optim-downpour.lua``
      (``pversion % su == 0``, tested before ``pversion`` is incremented), so
      the first push carries one step and the later ones tau steps. With
      tau = 1 every step pushes (asynchronous SGD). ``"full_period"``
      (offset 1): pushes after t = tau - 1, 2 tau - 1, ..., so every push
      carries exactly tau steps; a convention of ours, not the authors'.
    * The pushed update includes the step just taken, and on a push step the
      worker's own move is replaced by the fetched center: authors' code
      (``config.dfdx:add(dfdx)`` before the send; ``w:add(dfdx)`` only on
      steps without a push; the center is received into ``w``).
    * The push happens at the step's end, after the gradient: authors' code
      and the paper's loop; it is served at that time among the other
      exchanges (module docstring, :func:`slot_table` "step_end").
    * The fetch reads the center after the worker's own push: our choice
      for a deterministic simulation. The authors' client sends and receives
      concurrently and the server reads without a lock ("expect inconsistent
      read", ``pserver.lua``); the paper describes the fetch as the center
      after the push.

  Args:
    name: the algorithm's name.
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the worker's optimizer (state per worker).
    num_workers: p.
    tau: push period in local steps (>= 1); or an int32 JAX array (traced per
      configuration; ``communication`` then raises).
    schedule: the exchange schedule; default round-robin, speeds 1.
    master_rule: see :data:`MasterRule`; return reply None for a fetch.
    init_master: ``init_master(params)``, the master's extra state.
    center: ``center(shared) -> params``, the evaluated model.
    hyperparameters: for logs.
    push_timing: "authors" (default) or "full_period" (above).
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm`; ``communication`` counts pushes
    (each sends one parameter-sized update and receives the center). Its
    hyperparameters hold ``tau`` and ``push_timing``.

  Raises:
    HyperparameterError: tau < 1, unknown push_timing, bad schedule.

  References:
    github.com/sixin-zh/mpiT (commit c359666), ``asyncsgd/optim-downpour.lua``
    and ``asyncsgd/pserver.lua``; Zhang, Choromanska, LeCun (2015), Section 5.
  """
  tau = elastic.check_tau(tau, allow_array=True)
  offset = push_offset(push_timing)
  schedule = _resolve_schedule(schedule, num_workers)
  push_due = every_tau_steps(tau, offset)

  def local_step(worker, batch, key):
    loss, grads, model_state = loss_and_grad(loss_fn, worker.params, batch, key, worker.model_state)
    step, opt_state = optimizer.update(grads, worker.opt_state, worker.params)
    params = optax.apply_updates(worker.params, step)
    acc = tree_add(worker.buffer, step)
    return loss, (params, acc, opt_state, model_state), acc, push_due(worker.clock)

  def finish(worker, proposal, fetched, exchanged):
    params, acc, opt_state, model_state = proposal
    return worker._replace(
        params=tree_where(exchanged, elastic.cast_like(fetched, params), params),
        buffer=tree_where(exchanged, tree_zeros_like(acc), acc),
        opt_state=opt_state,
        model_state=model_state,
    )

  def communication(num_steps, param_bytes):
    n = mean_exchanges(schedule, num_steps, _host_tau(tau), "step_end", offset)
    return Communication(n, n * int(param_bytes))

  return simulate(
      name,
      schedule=schedule,
      local_step=local_step,
      master_rule=master_rule,
      finish=finish,  # the accumulated update u is kept in float32 for bf16 params
      init_buffer=lambda params: tree_zeros_like(elastic.to_reduction_dtype(params)),
      init_opt_state=optimizer.init,
      init_master=init_master,
      center=center,
      communication=communication,
      hyperparameters=dict(
          hyperparameters, num_workers=int(num_workers), tau=tau, push_timing=push_timing
      ),
      exchange_at="step_end",
      axis_name=axis_name,
      due=push_due,
  )
