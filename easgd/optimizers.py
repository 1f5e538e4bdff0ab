"""The local optimizer of a run: ``make_optimizer(config, steps_per_epoch)``.

Every worker steps with the same Optax optimizer; its learning-rate schedule is
set in epochs (warm-up, decay points, total length) and converted to steps
here, so the schedule over epochs does not change with the number of workers at
a fixed global batch.
"""

from __future__ import annotations

import optax

from easgd.config import ConfigError, TrainConfig


def make_schedule(config: TrainConfig, steps_per_epoch: int) -> optax.Schedule:
  """The learning-rate schedule of ``config``, converted from epochs to steps.

  Epoch-based settings (warm-up, decay points, total length) are multiplied by
  ``steps_per_epoch``, so the schedule over epochs does not change with the
  number of workers at a fixed global batch.

  Args:
    config: a validated config.
    steps_per_epoch: optimizer steps per epoch (one per global batch).

  Returns:
    An ``optax.Schedule`` of the step count (per worker).

  Raises:
    ConfigError: two decay epochs fall on the same step, or one falls inside
      the warm-up or at the end of the run (they would be merged or lost
      silently).
  """
  lr = config.learning_rate
  total = config.num_epochs * steps_per_epoch
  warmup = int(round(config.warmup_epochs * steps_per_epoch))
  if config.lr_schedule == "constant":
    main = optax.constant_schedule(lr)
  elif config.lr_schedule == "cosine":
    main = optax.cosine_decay_schedule(lr, max(total - warmup, 1))
  else:  # step
    steps = [int(round(e * steps_per_epoch)) - warmup for e in config.lr_decay_epochs]
    if len(set(steps)) != len(steps) or any(not 0 < t < total - warmup for t in steps):
      raise ConfigError(
          f"lr_decay_epochs={tuple(config.lr_decay_epochs)} fall on steps "
          f"{[t + warmup for t in steps]} ({steps_per_epoch} steps per epoch, warm-up "
          f"{warmup} steps, {total} steps in all); allowed: distinct steps after the "
          f"warm-up and before the end of the run")
    main = optax.piecewise_constant_schedule(
        lr, {t: config.lr_decay_factor for t in steps})
  if warmup == 0:
    return main
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), main], [warmup])


def make_optimizer(config: TrainConfig, steps_per_epoch: int
                   ) -> optax.GradientTransformation:
  """The local optimizer of ``config`` with its epoch-based schedule.

  "sgd", "momentum" and "nesterov" are ``optax.sgd``; "adam" and "adamw" the
  Optax ones. ``weight_decay`` is an L2 term added to the gradient
  (``optax.add_decayed_weights``) except for "adamw", which decouples it.

  Args:
    config: a validated config (optimizer, momentum, weight_decay, schedule).
    steps_per_epoch: optimizer steps per epoch, to convert the schedule.

  Returns:
    The ``optax.GradientTransformation`` each worker uses locally.

  Raises:
    ConfigError: from :func:`make_schedule`.
  """
  schedule = make_schedule(config, steps_per_epoch)
  name = config.optimizer
  if name == "adamw":
    return optax.adamw(schedule, weight_decay=config.weight_decay)
  if name == "adam":
    opt = optax.adam(schedule)
  else:
    opt = optax.sgd(schedule, momentum=config.momentum if name != "sgd" else None,
                    nesterov=name == "nesterov")
  if config.weight_decay:
    opt = optax.chain(optax.add_decayed_weights(config.weight_decay), opt)
  return opt
