"""The local optimizer of a run: ``make_optimizer(config, steps_per_epoch, num_examples=N)``.

Every worker steps with the same Optax optimizer; its learning-rate schedule is
set in epochs (warm-up, decay points, total length) and converted to steps by
``TrainConfig.resolve``, with the steps per epoch of ``config.lr_schedule_unit``:
the run's own ('epochs': the schedule over epochs does not change with the
number of workers at a fixed global batch) or those of ``lr_reference_batch``
('reference_steps': the schedule of the reference run, step for step).
"""

from __future__ import annotations

import optax

from easgd.settings.config import TrainConfig


def make_schedule(
    config: TrainConfig, steps_per_epoch: int, learning_rate=None, *, num_examples=None
) -> optax.Schedule:
  r"""The learning-rate schedule of ``config``, converted from epochs to steps.

  With S the steps per epoch of ``config.lr_schedule_unit`` ('epochs': S =
  ``steps_per_epoch`` = N // G; 'reference_steps': S = N // B_ref, with N =
  ``num_examples`` and B_ref = ``lr_reference_batch``), warm-up W =
  round(warmup_epochs * S), the schedule's length L = num_epochs * S and the
  peak rate eta:

  .. math::

    \eta_t = \eta\, t / W \quad (t < W), \qquad
    \eta_t = \eta\, f(t - W) \quad (t \ge W),

  with f = 1 ('constant'), the cosine (1 + cos(pi (t - W) / (L - W))) / 2
  ('cosine', 0 from L on) or lr_decay_factor^k after k decay points ('step':
  decay epoch e at step round(e * S)). In 'epochs' the schedule over epochs
  does not change with the number of workers at a fixed global batch. In
  'reference_steps' a run of p times the reference batch (at fixed per-worker
  batch, p workers) decays at the reference run's steps, i.e. at about p
  times the epochs, and a decay or warm-up past its end never comes (the
  cosine is cut): the bug of counting a schedule in steps, reproduced. The
  lengths are ``TrainConfig.resolve``'s (recorded in summary.json).

  Args:
    config: a validated config.
    steps_per_epoch: optimizer steps per epoch of the run (one per global batch).
    learning_rate: the peak rate instead of ``config.resolved_learning_rate``,
      e.g. a JAX array (traced under a vmap over configurations,
      ``easgd.protocol.runs``); taken as given (no scaling applied).
    num_examples: N, the training examples of the run; needed by
      ``lr_schedule_unit`` 'reference_steps' only.

  Returns:
    An ``optax.Schedule`` of the step count (per worker).

  Raises:
    ConfigError: a length in steps the run cannot take
      (``TrainConfig.resolve``), e.g. two decay epochs on the same step, or one
      inside the warm-up or at the end of the schedule (they would be merged
      or lost silently); 'reference_steps' without ``num_examples``.

  Example:
    >>> cfg = TrainConfig(num_epochs=2, lr_schedule="step", lr_decay_epochs=(1.0,),
    ...     num_workers=2, global_batch_size=64, lr_schedule_unit="reference_steps",
    ...     lr_reference_batch=32).validate()
    >>> # 640 examples: 10 steps per epoch, 20 per epoch of the reference batch 32
    >>> sched = make_schedule(cfg, 10, num_examples=640)
    >>> round(float(sched(19)), 6), round(float(sched(20)), 6)  # the run ends at 20
    (0.1, 0.01)
  """
  lengths = config.resolve(steps_per_epoch, num_examples)
  lr = config.resolved_learning_rate if learning_rate is None else learning_rate
  warmup = lengths["lr_warmup_steps"]
  if config.lr_schedule == "constant":
    main = optax.constant_schedule(lr)
  elif config.lr_schedule == "cosine":
    main = optax.cosine_decay_schedule(lr, lengths["cosine_decay_steps"])
  else:  # step
    main = optax.piecewise_constant_schedule(
        lr, {t - warmup: config.lr_decay_factor for t in lengths["lr_decay_steps"]}
    )
  if warmup == 0:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), main], [warmup])


def make_optimizer(
    config: TrainConfig, steps_per_epoch: int, learning_rate=None, *, num_examples=None
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
    num_examples: N, the run's training examples (:func:`make_schedule`;
      needed by ``lr_schedule_unit`` 'reference_steps').

  Returns:
    The ``optax.GradientTransformation`` each worker uses locally.

  Raises:
    ConfigError: from :func:`make_schedule`.
  """
  schedule = make_schedule(config, steps_per_epoch, learning_rate, num_examples=num_examples)
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
