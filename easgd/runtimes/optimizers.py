"""The local optimizer of a run: ``make_optimizer(config, steps_per_epoch)``.

Every worker steps with the same Optax optimizer; its learning-rate schedule is
set in epochs (warm-up, decay points, total length) and converted to steps
here, so the schedule over epochs does not change with the number of workers at
a fixed global batch.
"""

from __future__ import annotations

import optax

from easgd.settings.config import TrainConfig


def make_schedule(config: TrainConfig, steps_per_epoch: int, learning_rate=None) -> optax.Schedule:
  """The learning-rate schedule of ``config``, converted from epochs to steps.

  Epoch-based settings (warm-up, decay points, total length) are multiplied by
  ``steps_per_epoch``, so the schedule over epochs does not change with the
  number of workers at a fixed global batch. The peak rate is
  ``config.resolved_learning_rate`` (``learning_rate`` scaled by
  ``lr_scaling``).

  Args:
    config: a validated config.
    steps_per_epoch: optimizer steps per epoch (one per global batch).
    learning_rate: the peak rate instead of ``config.resolved_learning_rate``,
      e.g. a JAX array (traced under a vmap over configurations,
      ``easgd.protocol.runs``); taken as given (no scaling applied).

  Returns:
    An ``optax.Schedule`` of the step count (per worker).

  Raises:
    ConfigError: a length in steps the run cannot take
      (``TrainConfig.resolve``), e.g. two decay epochs on the same step, or one
      inside the warm-up or at the end of the run (they would be merged or
      lost silently).
  """
  lengths = config.resolve(steps_per_epoch)
  lr = config.resolved_learning_rate if learning_rate is None else learning_rate
  total, warmup = lengths["total_steps"], lengths["lr_warmup_steps"]
  if config.lr_schedule == "constant":
    main = optax.constant_schedule(lr)
  elif config.lr_schedule == "cosine":
    main = optax.cosine_decay_schedule(lr, max(total - warmup, 1))
  else:  # step
    main = optax.piecewise_constant_schedule(
        lr, {t - warmup: config.lr_decay_factor for t in lengths["lr_decay_steps"]}
    )
  if warmup == 0:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), main], [warmup])


def make_optimizer(
    config: TrainConfig, steps_per_epoch: int, learning_rate=None
) -> optax.GradientTransformation:
  """The local optimizer of ``config`` with its epoch-based schedule.

  "sgd", "momentum" and "nesterov" are ``optax.sgd``; "adam" and "adamw" the
  Optax ones. ``weight_decay`` is an L2 term added to the gradient
  (``optax.add_decayed_weights``) except for "adamw", which decouples it.

  Args:
    config: a validated config (optimizer, momentum, weight_decay, schedule).
    steps_per_epoch: optimizer steps per epoch, to convert the schedule.
    learning_rate: the peak rate instead of ``config.resolved_learning_rate``
      (:func:`make_schedule`), e.g. a traced JAX array.

  Returns:
    The ``optax.GradientTransformation`` each worker uses locally.

  Raises:
    ConfigError: from :func:`make_schedule`.
  """
  schedule = make_schedule(config, steps_per_epoch, learning_rate)
  name = config.optimizer
  if name == "adamw":
    return optax.adamw(schedule, weight_decay=config.weight_decay)
  if name == "adam":
    opt = optax.adam(schedule)
  else:
    opt = optax.sgd(
        schedule, momentum=config.momentum if name != "sgd" else None, nesterov=name == "nesterov"
    )
  if config.weight_decay:
    opt = optax.chain(optax.add_decayed_weights(config.weight_decay), opt)
  return opt
