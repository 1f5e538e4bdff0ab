"""Builds the algorithms of ``easgd.momentum``, ``easgd.asynchronous`` and
``easgd.baselines`` from a :class:`~easgd.config.TrainConfig`.

``easgd.trainer.make_algorithm`` builds ``easgd`` and ``pmean_sgd`` itself and
hands every other name of ``easgd.algorithms.ALGORITHMS`` to
:func:`make_algorithm` here. Which config fields each algorithm reads:

  eamsgd                      tau, alpha/beta, momentum (delta), reset_opt_state
  async_easgd                 tau, alpha/beta, schedule, worker_speeds /
                              max_worker_speed, staleness, reset_opt_state
  async_eamsgd                as async_easgd, and momentum
  downpour, adownpour         tau, schedule, worker_speeds / max_worker_speed,
                              staleness
  mdownpour                   as downpour, and momentum (on the master)
  mvadownpour                 as downpour, and average_rate
  sgd, asgd                   (num_workers: gradient averaged over workers)
  msgd                        momentum
  mvasgd                      average_rate
  local_sgd                   tau
  diloco                      tau, outer_learning_rate, outer_momentum

All of them take the local optimizer of the config (``optimizer``,
``learning_rate``, its schedule and ``weight_decay``); the momentum methods
(eamsgd, async_eamsgd, msgd, mdownpour) have their Nesterov momentum built in
and need ``optimizer = "sgd"`` (checked by ``TrainConfig.validate``).
"""

from __future__ import annotations

import optax

from easgd import asynchronous, baselines, momentum
from easgd.algorithms import Algorithm

MOMENTUM_ALGORITHMS = ("eamsgd", "async_eamsgd", "msgd", "mdownpour")
"""Algorithms whose Nesterov momentum is built in (``config.momentum``)."""

ASYNC_ALGORITHMS = ("async_easgd", "async_eamsgd", "downpour", "mdownpour",
                    "adownpour", "mvadownpour")
"""Algorithms simulated with an exchange schedule (``easgd.asynchronous``)."""


def exchange_schedule(config) -> asynchronous.ExchangeSchedule:
  """The exchange schedule of ``config`` (order, speeds, staleness).

  Args:
    config: a validated ``TrainConfig`` (num_workers, schedule, worker_speeds,
      max_worker_speed, staleness, seed).

  Returns:
    The ``easgd.asynchronous.ExchangeSchedule`` of the asynchronous algorithms
    (Algorithms 1-2 of the paper, simulated).
  """
  speeds = asynchronous.resolve_worker_speeds(
      config.num_workers, config.worker_speeds, config.max_worker_speed, config.seed)
  return asynchronous.exchange_schedule(config.num_workers, config.schedule, speeds,
                                        config.staleness)


def make_algorithm(config, loss_fn, optimizer: optax.GradientTransformation
                   ) -> Algorithm:
  """The algorithm ``config.algorithm`` with the local optimizer ``optimizer``.

  Args:
    config: a validated :class:`~easgd.config.TrainConfig`.
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the local optimizer (``easgd.trainer.make_optimizer``).

  Returns:
    An :class:`~easgd.algorithms.Algorithm`.

  Raises:
    ValueError: an algorithm name this module does not build.
  """
  name, p = config.algorithm, config.num_workers
  elastic_kw = dict(num_workers=p, tau=config.tau, alpha=config.alpha, beta=config.beta,
                    reset_opt_state=config.reset_opt_state)
  if name == "eamsgd":
    return momentum.eamsgd(loss_fn, optimizer, momentum=config.momentum, **elastic_kw)
  if name in ASYNC_ALGORITHMS:
    schedule = exchange_schedule(config)
    if name == "async_easgd":
      return asynchronous.async_easgd(loss_fn, optimizer, schedule=schedule,
                                      **elastic_kw)
    if name == "async_eamsgd":
      return asynchronous.async_eamsgd(loss_fn, optimizer, schedule=schedule,
                                       momentum=config.momentum, **elastic_kw)
    push_kw = dict(num_workers=p, tau=config.tau, schedule=schedule)
    if name == "downpour":
      return baselines.downpour(loss_fn, optimizer, **push_kw)
    if name == "mdownpour":
      return baselines.mdownpour(loss_fn, optimizer, momentum=config.momentum,
                                 **push_kw)
    if name == "adownpour":
      return baselines.adownpour(loss_fn, optimizer, **push_kw)
    return baselines.mvadownpour(loss_fn, optimizer, average_rate=config.average_rate,
                                 **push_kw)
  if name == "sgd":
    return baselines.sgd(loss_fn, optimizer, num_workers=p)
  if name == "msgd":
    return baselines.msgd(loss_fn, optimizer, num_workers=p, momentum=config.momentum)
  if name == "asgd":
    return baselines.asgd(loss_fn, optimizer, num_workers=p)
  if name == "mvasgd":
    return baselines.mvasgd(loss_fn, optimizer, num_workers=p,
                            average_rate=config.average_rate)
  if name == "local_sgd":
    return baselines.local_sgd(loss_fn, optimizer, num_workers=p, tau=config.tau)
  if name == "diloco":
    return baselines.diloco(loss_fn, optimizer, num_workers=p, tau=config.tau,
                            outer_learning_rate=config.outer_learning_rate,
                            outer_momentum=config.outer_momentum)
  raise ValueError(f"easgd.registry does not build algorithm {name!r}")


def simulated_ticks(num_steps: int, config) -> float:
  """Simulated time in ticks after ``num_steps`` trainer steps of ``config``.

  Asynchronous algorithms: one step is one slot, ``num_steps / K`` ticks with
  K the largest worker speed (``easgd.asynchronous``). Synchronous ones wait
  for the slowest worker at every step: ``num_steps / min_i k_i`` ticks (with
  the default speeds 1, a step is a tick for every algorithm).
  """
  speeds = asynchronous.resolve_worker_speeds(
      config.num_workers, config.worker_speeds, config.max_worker_speed, config.seed)
  if config.algorithm in ASYNC_ALGORITHMS:
    return num_steps / max(speeds)
  return num_steps / min(speeds)
