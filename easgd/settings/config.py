"""Run configuration: :class:`TrainConfig`, every field with its unit, validated.

The fields are declared in ``easgd.settings.fields``; this module holds what
relates them. :meth:`TrainConfig.validate` checks every value in plain Python,
before any data is loaded or anything is compiled, and raises
:class:`ConfigError` (a ``ValueError``) with a one-line message naming the
field, the value and what is allowed: each field against its declaration, the
rules between fields, the settings the run would not read
(``easgd.settings.reads``), the derived values (the learning rate after
``lr_scaling``, alpha from beta). What follows from the data's size is
:meth:`TrainConfig.resolve`'s. The CLI turns it into ``easgd: error: ...``
and exit status 2.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from easgd._util import checks
from easgd._util.files import json_text
from easgd.methods import registry
from easgd.parallel.names import backend_fits, backend_for, num_devices_fits, shard_params_fits
from easgd.settings import reads, runtime_table
from easgd.settings.fields import FLOAT32_TINY, MAX_REAL, MAX_TOTAL_STEPS, TrainFields
from easgd.tasks import datasets
from easgd.tasks.names import BATCH_NORM_MODELS

BUILTIN_TASK_FIELDS = (
    "dataset",
    "model",
    "data_dir",
    "crop_size",
    "random_flip",
    "param_dtype",
    "compute_dtype",
)
"""Fields read by the built-in tasks only (``easgd.settings.builtin_tasks``)."""


def _synchronous_spmd() -> tuple[str, ...]:
  """The algorithms a worker of several devices runs (``devices_per_worker`` > 1)."""
  return registry.names_where(lambda s: not s.asynchronous)


class ConfigError(ValueError):
  """A configuration value is outside its allowed range."""


def as_train_config(value) -> "TrainConfig":
  """``value`` if it is a :class:`TrainConfig` (not validated here).

  Raises:
    ConfigError: anything else, e.g. a dict (use ``TrainConfig.from_dict(d)``).
  """
  if not isinstance(value, TrainConfig):
    raise ConfigError(
        f"config must be an easgd.TrainConfig (from a dict: "
        f"TrainConfig.from_dict(d)), got {type(value).__name__}"
    )
  return value


# The checks of easgd._util.checks, raising ConfigError (one message format).
_int = functools.partial(checks.integer, error=ConfigError)
_real = functools.partial(checks.real, error=ConfigError)
_choice = functools.partial(checks.choice, error=ConfigError)


@dataclasses.dataclass(frozen=True)
class TrainConfig(TrainFields):
  """Everything a training run depends on.

  Every field is declared once, in :class:`~easgd.settings.fields.TrainFields`:
  its default, its meaning, unit and range in its help text
  (``dataclasses.fields(TrainConfig)[i].metadata["help"]``, what
  ``easgd train --help`` prints) and its allowed values
  (``metadata["allowed"]``). :meth:`validate` checks every value, the rules
  between fields, and refuses a setting the run would not read
  (``easgd.settings.reads``).
  """

  def replace(self, **changes) -> "TrainConfig":
    """A copy with ``changes``; unknown field names raise ConfigError."""
    names = {f.name for f in dataclasses.fields(self)}
    unknown = sorted(set(changes) - names)
    if unknown:
      raise ConfigError(f"unknown config field(s) {unknown}; allowed: {sorted(names)}")
    if "alpha" in changes and changes["alpha"] is not None and "beta" not in changes:
      changes["beta"] = None  # alpha given: it replaces the default beta
    return dataclasses.replace(self, **changes)

  @property
  def per_worker_batch_size(self) -> int:
    return self.global_batch_size // self.num_workers

  @property
  def lr_scale(self) -> float:
    """The factor ``lr_scaling`` applies to ``learning_rate`` (1 for 'none').

    'linear': G / G0, 'sqrt': sqrt(G / G0), with G = ``global_batch_size`` and
    G0 = ``lr_reference_batch``.
    """
    if self.lr_scaling == "none":
      return 1.0
    ratio = self.global_batch_size / self.lr_reference_batch
    return ratio if self.lr_scaling == "linear" else float(np.sqrt(ratio))

  @property
  def resolved_learning_rate(self) -> float:
    """The peak local step size the run uses: ``learning_rate * lr_scale``."""
    return self.learning_rate * self.lr_scale

  @property
  def resolved_mapping_backend(self) -> str:
    """The mapping backend the run uses: ``mapping_backend``, or for None
    'shard_map' when ``devices_per_worker`` > 1, else 'pmap'
    (``easgd.parallel.names.backend_for``)."""
    return backend_for(self.mapping_backend, self.devices_per_worker)

  @property
  def resolved_alpha(self) -> float:
    """alpha, or beta / num_workers when beta is given; for an algorithm that reads
    alpha but not beta (streaming_diloco's merge rate): alpha, 1 when None."""
    spec = registry.TABLE.get(self.algorithm) if isinstance(self.algorithm, str) else None
    if spec is not None and "alpha" in spec.reads and "beta" not in spec.reads:
      return 1.0 if self.alpha is None else self.alpha
    return self.alpha if self.alpha is not None else self.beta / self.num_workers

  def validate(self) -> "TrainConfig":
    """Checks every field; returns the config with NumPy scalars made Python
    scalars (so it can be written as JSON), otherwise self.

    First the values whose refusal another rule explains better than their
    range (:meth:`_refuse_explained`), then each field against its
    declaration (``option(..., allowed=...)``, in field order;
    ``easgd._util.checks.check_fields``), then the rules between fields
    (:meth:`_check_relations`), the settings the run would not read
    (:meth:`_refuse_unread`) and the derived values (:meth:`_validate_derived`).

    Raises:
      ConfigError: naming the first bad field, its value and what is allowed.
    """
    plain = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
    if any(plain[k] is not getattr(self, k) for k in plain):
      return dataclasses.replace(self, **plain).validate()
    self._refuse_explained()
    checks.check_fields(self, ConfigError)
    self._check_relations()
    self._refuse_unread()
    self._validate_derived()
    return self

  def _refuse_explained(self) -> None:
    """delta = 0 on a momentum algorithm (it is another algorithm), and alpha
    and beta both given or both None: refused before any range is checked."""
    spec = registry.TABLE.get(self.algorithm) if isinstance(self.algorithm, str) else None
    if spec is not None and spec.without_momentum is not None and self.delta == 0:
      raise ConfigError(
          f"delta=0 turns {self.algorithm} into {spec.without_momentum} (eq. 7 with "
          f"delta = 0 is the plain step); use algorithm {spec.without_momentum!r}, "
          f"or delta in (0, 1) (paper: 0.99)"
      )
    if (self.alpha is None) == (self.beta is None):
      raise ConfigError(
          f"give exactly one of alpha and beta (beta = num_workers * "
          f"alpha), got alpha={self.alpha!r}, beta={self.beta!r}"
      )

  def refuse_builtin_fields(self, task_name: str) -> None:
    """Refuses a built-in task's field (:data:`BUILTIN_TASK_FIELDS`) set away
    from its default beside a task that brings its own data and model.

    Raises:
      ConfigError: naming the field, its value and the task.
    """
    for name in BUILTIN_TASK_FIELDS:
      if reads.differs(self, name):
        raise ConfigError(
            f"{name}={getattr(self, name)!r} is read by the built-in tasks only; task "
            f"{task_name!r} brings its own data and model; leave {name} at its default "
            f"{reads.defaults(TrainConfig)[name]!r}"
        )

  def _check_relations(self) -> None:
    """The rules between fields (each field already inside its declaration)."""
    if self.task is not None:
      self.refuse_builtin_fields(self.task)
    elif self.task_args:
      raise ConfigError(
          f"task_args={tuple(self.task_args)!r} has no effect without a task; give "
          "task 'package.module:function' (--task) or drop them"
      )
    data = datasets.TABLE[self.dataset]
    if data.needs_data_dir and self.data_dir is None:
      raise ConfigError(
          f"dataset {self.dataset!r} needs data_dir, the directory of {data.data_dir} "
          "(it is never downloaded)"
      )
    if self.crop_size is not None and data.kind != "images":
      raise ConfigError(
          f"crop_size crops images; dataset {self.dataset!r} holds {data.kind}; allowed: "
          "crop_size None"
      )
    if self.random_flip and data.kind != "images":
      raise ConfigError(
          f"random_flip flips images; dataset {self.dataset!r} holds {data.kind}; allowed: "
          "random_flip False"
      )
    if self.shard_params and not shard_params_fits(self.devices_per_worker):
      raise ConfigError(
          "shard_params splits a worker's state over its devices; devices_per_worker=1 "
          "has one; allowed: shard_params with devices_per_worker > 1"
      )
    if self.devices_per_worker > 1:
      self._check_devices_per_worker()
    elif not num_devices_fits(self.num_workers, self.num_devices):
      raise ConfigError(
          f"num_workers={self.num_workers} is not a multiple of num_devices="
          f"{self.num_devices}; allowed: a multiple of the devices used"
      )
    if self.global_batch_size % self.num_workers:
      raise ConfigError(
          f"global_batch_size={self.global_batch_size} does not split over "
          f"num_workers={self.num_workers}; allowed: a multiple of {self.num_workers}"
      )
    if self.warmup_epochs >= self.num_epochs and self.warmup_epochs > 0:
      raise ConfigError(
          f"warmup_epochs={self.warmup_epochs} must be less than " f"num_epochs={self.num_epochs}"
      )
    if self.lr_decay_epochs and self.lr_schedule != "step":
      raise ConfigError(
          f"lr_decay_epochs={tuple(self.lr_decay_epochs)} has no effect "
          f"with lr_schedule {self.lr_schedule!r}; use lr_schedule 'step'"
      )
    if self.worker_speeds and self.max_worker_speed is not None:
      raise ConfigError("give worker_speeds or max_worker_speed, not both")
    if self.link_rates and self.link_rate is not None:
      raise ConfigError("give link_rate (every worker) or link_rates (each worker), not both")
    if self.link_burst is not None and self.link_rate is None and not self.link_rates:
      raise ConfigError(
          f"link_burst={self.link_burst!r} is the size of a rate's token bucket; give "
          "link_rate or link_rates, or leave link_burst None"
      )
    self._check_exchange_techniques()
    message = runtime_table.relation_error(self)  # the algorithm, an optional package
    if message is not None:
      raise ConfigError(message)
    if self.lr_reference_batch is None and self.lr_scaling != "none":
      raise ConfigError(
          f"lr_scaling {self.lr_scaling!r} scales learning_rate from a "
          "reference batch; give lr_reference_batch (the global batch "
          "at which learning_rate is stated)"
      )
    if self.lr_reference_batch is None and reads.reads_reference_batch(self):
      raise ConfigError(
          "lr_schedule_unit 'reference_steps' counts the schedule in steps of a "
          "reference batch; give lr_reference_batch (the global batch the schedule "
          "was written for)"
      )

  def _check_exchange_techniques(self) -> None:
    """The rules of fragments, delay and compression (``easgd.core.streaming``);
    the fragments against the model's leaves are checked where the parameters
    exist (``easgd.runtimes.training_run.Run``), before anything compiles."""
    if not any(reads.differs(self, name) for name in registry.STREAMING):
      return
    if self.fragments > self.tau:
      raise ConfigError(
          f"fragments={self.fragments} needs tau >= fragments (each fragment its own step "
          f"in the period); tau={self.tau}; allowed: fragments in [1, {self.tau}]"
      )
    if self.delay >= self.tau:
      raise ConfigError(
          f"delay={self.delay} must be below tau={self.tau} (one exchange of a fragment in "
          f"flight); allowed: delay in [0, {self.tau - 1}]"
      )
    for name, value, other in (
        ("reset_opt_state", self.reset_opt_state, False),
        ("sync_warmup_steps", self.sync_warmup_steps, 0),
        ("shard_params", self.shard_params, False),
    ):
      if value != other:
        raise ConfigError(
            f"{name}={value!r} is not defined with fragments, delay or compression; "
            f"allowed: {name} {other!r}, or fragments 1, delay 0, compression 'none'"
        )

  def _check_devices_per_worker(self) -> None:
    """The rules of a worker of D = devices_per_worker > 1 devices."""
    D, p = self.devices_per_worker, self.num_workers
    if not num_devices_fits(p, self.num_devices, D):
      raise ConfigError(
          f"num_devices={self.num_devices} with devices_per_worker={D}: {p} workers use "
          f"num_workers * devices_per_worker = {p * D} devices; allowed: {p * D} or None"
      )
    if not backend_fits(self.resolved_mapping_backend, D):
      raise ConfigError(
          f"devices_per_worker={D} needs the 2-D mesh of mapping_backend 'shard_map', got "
          f"mapping_backend {self.mapping_backend!r}; allowed: mapping_backend 'shard_map' "
          "or None (chosen from devices_per_worker), or devices_per_worker 1"
      )
    message = runtime_table.devices_per_worker_error(self)
    if message is not None:
      raise ConfigError(message)
    if registry.TABLE[self.algorithm].asynchronous:
      raise ConfigError(
          f"devices_per_worker={D} runs the synchronous algorithms; {self.algorithm!r} is "
          f"asynchronous; allowed: one of {', '.join(_synchronous_spmd())}, or "
          "devices_per_worker 1"
      )
    if self.task is None and self.model in BATCH_NORM_MODELS:
      raise ConfigError(
          f"devices_per_worker={D} averages a worker's gradient over its devices; model "
          f"{self.model!r} has BatchNorm statistics of each device's examples; allowed: a "
          "model without BatchNorm, or devices_per_worker 1"
      )
    if self.global_batch_size % p == 0 and self.per_worker_batch_size % D:
      raise ConfigError(
          f"per-worker batch {self.per_worker_batch_size} (global_batch_size / num_workers) "
          f"does not split over devices_per_worker={D}; allowed: a global_batch_size that "
          f"is a multiple of {p * D}"
      )

  def _validate_derived(self) -> None:
    """The values the run derives from other fields, checked as derived.

    The resolved learning rate (``lr_scaling`` applied), the largest rate the
    schedule reaches (warm-up, cosine and step decay never exceed it), as
    float32 holds it: in [float32's smallest normal, :data:`MAX_REAL`]; the
    resolved alpha (beta / num_workers when beta is given), in the same range
    (a smaller one is 0 in float32); and a center that some exchange moves
    (``easgd.methods.registry.center_update``: refused here when none ever does,
    alpha = 0; against the run's length in :meth:`resolve`). beta =
    num_workers * alpha is only recorded (the updates read alpha).
    """
    G, G0 = self.global_batch_size, self.lr_reference_batch
    how = {
        "none": "learning_rate, lr_scaling 'none'",
        "linear": f"learning_rate * global_batch_size / lr_reference_batch = "
        f"{self.learning_rate!r} * {G} / {G0}, lr_scaling 'linear'",
        "sqrt": f"learning_rate * sqrt(global_batch_size / lr_reference_batch) = "
        f"{self.learning_rate!r} * sqrt({G} / {G0}), lr_scaling 'sqrt'",
    }
    _real(
        "resolved_learning_rate",
        self.resolved_learning_rate,
        FLOAT32_TINY,
        MAX_REAL,
        what=how[self.lr_scaling],
    )
    spec = registry.TABLE[self.algorithm]
    if "alpha" not in spec.reads:
      return
    if "beta" not in spec.reads:  # a merge rate (streaming_diloco), not an elastic one
      _real("alpha", self.resolved_alpha, 0, 1, open_low=True, what="the merge's moving rate")
      return
    given = "alpha" if self.alpha is not None else "beta"
    if registry.center_update(self).local_step is None:
      raise ConfigError(
          f"{given}={getattr(self, given)!r} leaves the center untrained: "
          f"{registry.center_update(self).why}, so the center {self.algorithm} "
          f"evaluates and exports stays at the initial parameters; allowed: "
          f"{given} > 0"
      )
    _real(
        "resolved_alpha",
        self.resolved_alpha,
        FLOAT32_TINY,
        MAX_REAL,
        what="alpha"
        if given == "alpha"
        else f"beta / num_workers = {self.beta!r} / {self.num_workers}",
    )

  def resolve(self, steps_per_epoch: int, num_examples: int | None = None) -> dict[str, Any]:
    """The quantities a run derives from this config and its data's size, each
    checked after it is derived (before anything is compiled).

    Derived and checked: total_steps = num_epochs * steps_per_epoch (int32
    clocks); tau against it (at most the run; and
    ``easgd.methods.registry.center_update``: an exchange that moves the center within
    the steps the run gives a worker, total_steps - sync_warmup_steps);
    sync_warmup_steps below it; the learning-rate schedule in steps
    (:meth:`_schedule_steps`: warm-up, 'step' decay points, the cosine's
    length, converted with the steps per epoch of ``lr_schedule_unit``). The
    rates were checked by :meth:`validate`.

    Args:
      steps_per_epoch: global steps per epoch (``easgd.tasks.batches.steps_per_epoch``
        of the training set, the global batch and the workers), >= 1.
      num_examples: N, the training examples the run draws its batches from
        (after ``validation_examples``); needed by ``lr_schedule_unit``
        'reference_steps' only (its steps per epoch are N // lr_reference_batch).

    Returns:
      dict(learning_rate (the config's), lr_scaling, lr_reference_batch,
      lr_scale, resolved_learning_rate (the peak eta the run uses),
      steps_per_epoch, total_steps, lr_schedule_unit,
      schedule_steps_per_epoch (S, the steps per epoch that convert the
      schedule), schedule_steps (num_epochs * S, the schedule's length as
      written: total_steps in unit 'epochs'), lr_warmup_steps (the linear
      warm-up from 0), lr_decay_steps (the 'step' schedule's decay points, []
      otherwise), cosine_decay_steps (the cosine's length, None otherwise),
      sync_warmup_steps (the synchronous warm-up's K)): what summary.json
      records under "resolved".

    Raises:
      ConfigError: one line naming the derived value, how it was derived and
        what is allowed.
    """
    spe = _int("steps_per_epoch", steps_per_epoch, 1)
    total = spe * self.num_epochs
    length = f"{total} steps = {self.num_epochs} epochs x {spe} steps"
    if total > MAX_TOTAL_STEPS:
      raise ConfigError(
          f"num_epochs={self.num_epochs} gives {total} steps ({spe} per epoch); the "
          f"step clocks are int32: allowed num_epochs <= {MAX_TOTAL_STEPS // spe}"
      )
    spec = registry.TABLE[self.algorithm]
    if "tau" in spec.reads and self.tau > total:
      raise ConfigError(
          f"tau={self.tau} (communication period) is longer than the whole run "
          f"({length}); allowed: tau <= {total}"
      )
    k = self.sync_warmup_steps
    if k >= total:
      raise ConfigError(
          f"sync_warmup_steps={k} (global steps of synchronous warm-up) leaves nothing "
          f"of the run ({length}); allowed: sync_warmup_steps < {total}"
      )
    self._check_center_trained(total - k, length + (f", less sync_warmup_steps={k}" if k else ""))
    return dict(
        learning_rate=self.learning_rate,
        lr_scaling=self.lr_scaling,
        lr_reference_batch=self.lr_reference_batch,
        lr_scale=self.lr_scale,
        resolved_learning_rate=self.resolved_learning_rate,
        steps_per_epoch=spe,
        total_steps=total,
        **self._schedule_steps(spe, num_examples),
        sync_warmup_steps=k,
    )

  def _schedule_steps_per_epoch(self, steps_per_epoch: int, num_examples: int | None) -> int:
    """S, the steps per epoch that convert the learning-rate schedule to steps.

    'epochs': S = steps_per_epoch, the run's own (N // G, G =
    ``global_batch_size``). 'reference_steps': S = S_ref = N // B_ref with
    B_ref = ``lr_reference_batch``, the floor the run's own count takes
    (``easgd.tasks.batches.steps_per_epoch``). With G = p B_ref and N a
    multiple of G, S_ref = p S: the schedule of the reference run, step for
    step, at p times its epochs.

    Args:
      steps_per_epoch: the run's global steps per epoch, >= 1.
      num_examples: N, the training examples; needed by 'reference_steps'.

    Raises:
      ConfigError: 'reference_steps' without N, an N below B_ref (no step
        per epoch) or a schedule beyond the int32 step clocks.
    """
    if self.lr_schedule_unit == "epochs":
      return steps_per_epoch
    b = self.lr_reference_batch
    if num_examples is None:
      raise ConfigError(
          "lr_schedule_unit 'reference_steps' converts the schedule with N // "
          f"lr_reference_batch steps per epoch (N // {b}); give num_examples N, the "
          "run's training examples"
      )
    n = _int("num_examples", num_examples, 1)
    if n < b:
      raise ConfigError(
          f"lr_reference_batch={b} is more than the {n} training examples: the "
          f"reference batch takes no step per epoch ({n} // {b} = 0); allowed: "
          f"lr_reference_batch <= {n}"
      )
    s_ref = n // b
    if s_ref * self.num_epochs > MAX_TOTAL_STEPS:
      raise ConfigError(
          f"lr_schedule_unit 'reference_steps' gives a schedule of {s_ref * self.num_epochs} "
          f"steps (num_epochs={self.num_epochs} x {s_ref} steps per epoch of "
          f"lr_reference_batch={b}); the step clocks are int32: allowed "
          f"lr_reference_batch >= {n // (MAX_TOTAL_STEPS // self.num_epochs + 1) + 1}"
      )
    return s_ref

  def _schedule_steps(self, steps_per_epoch: int, num_examples: int | None) -> dict[str, Any]:
    r"""The learning-rate schedule in steps, checked against its own length.

    With S = :meth:`_schedule_steps_per_epoch` (the run's steps per epoch in
    ``lr_schedule_unit`` 'epochs', N // lr_reference_batch in
    'reference_steps'), the schedule written in epochs is, in steps
    (Python's ``round``, halves to even):

    * warm-up W = round(warmup_epochs * S);
    * decay epoch e of the 'step' schedule decays at step round(e * S);
    * the cosine decays from W to L = num_epochs * S, over L - W steps.

    Each is checked against the schedule's length L, the run it was written
    for: W in [1, L - 1] when warmup_epochs > 0, decay points distinct, after
    W and before L. In 'epochs' L is the run's total_steps. In
    'reference_steps' a point between the run's end and L is the schedule the
    user wrote and is kept: it never comes (a cosine is cut before 0).

    Returns:
      dict(lr_schedule_unit, schedule_steps_per_epoch (S), schedule_steps (L),
      lr_warmup_steps (W), lr_decay_steps, cosine_decay_steps (None unless
      'cosine')).

    Raises:
      ConfigError: from :meth:`_schedule_steps_per_epoch`; a warm-up or decay
        point rounded outside the schedule or onto another one.
    """
    s = self._schedule_steps_per_epoch(steps_per_epoch, num_examples)
    steps = s * self.num_epochs
    if self.lr_schedule_unit == "epochs":
      per, span, end = f"{s} steps per epoch", "in all", "the run"
    else:
      per = f"{s} steps per epoch of lr_reference_batch={self.lr_reference_batch}"
      span, end = "in the schedule", "the schedule"
    warmup = int(round(self.warmup_epochs * s))
    if self.warmup_epochs > 0 and not 0 < warmup < steps:
      raise ConfigError(
          f"warmup_epochs={self.warmup_epochs!r} gives a learning-rate warm-up of "
          f"{warmup} steps (round(warmup_epochs * {per}), {steps} "
          f"steps {span}); allowed: warmup_epochs 0, or one that gives 1 to "
          f"{steps - 1} steps"
      )
    decay = []
    if self.lr_schedule == "step":
      decay = [int(round(e * s)) for e in self.lr_decay_epochs]
      after = [t - warmup for t in decay]
      if len(set(after)) != len(after) or any(not 0 < t < steps - warmup for t in after):
        raise ConfigError(
            f"lr_decay_epochs={tuple(self.lr_decay_epochs)} fall on steps {decay} "
            f"({per}, warm-up {warmup} steps, {steps} steps {span}); "
            f"allowed: distinct steps after the warm-up and before the end of {end}"
        )
    return dict(
        lr_schedule_unit=self.lr_schedule_unit,
        schedule_steps_per_epoch=s,
        schedule_steps=steps,
        lr_warmup_steps=warmup,
        lr_decay_steps=decay,
        cosine_decay_steps=(max(steps - warmup, 1) if self.lr_schedule == "cosine" else None),
    )

  def _check_center_trained(self, steps: int, length: str) -> None:
    """Refuses a run whose returned model no exchange moves within ``steps``, the
    local steps the run is sure to give a worker (``easgd.methods.registry.center_update``)."""
    update = registry.center_update(self)
    if update.local_step is None or update.local_step < steps:
      return  # None: refused by validate (alpha = 0)
    # the rule's step grows with tau (the others are 0, below any run's steps)
    tau_max = steps - 1 - (update.local_step - self.tau)
    allowed = (
        f"tau <= {tau_max}"
        if tau_max >= 1
        else f"a run that gives {self.algorithm} at least "
        f"{update.local_step - self.tau + 2} steps"
    )
    raise ConfigError(
        f"tau={self.tau} leaves the center untrained: {self.algorithm} first moves it "
        f"at the exchange of a worker's local step {update.local_step} ({update.why}), "
        f"and the run is sure to give a worker only {steps} steps ({length}); "
        f"allowed: {allowed}"
    )

  def unread_fields(self) -> dict[str, Any]:
    """The fields set away from their default that this config's run never reads
    (``easgd.settings.reads.TRAIN_RULES``: the algorithm's ``reads``, the
    optimizer's momentum, the schedule's decay and unit, BatchNorm, the data set's
    files, the runtime's settings, the reference batch of the rate and the schedule; alpha
    and beta count as one setting).

    Returns:
      ``{field: value}`` in the rules' order (empty when every setting is read).
    """
    return reads.unread(self, reads.TRAIN_RULES)

  def _refuse_unread(self) -> None:
    """A setting the run would not read is refused, never silently ignored."""
    spec = registry.TABLE[self.algorithm]
    if spec.without_momentum is not None and self.optimizer != "sgd":
      raise ConfigError(
          f"algorithm {self.algorithm!r} has its own Nesterov momentum (delta); it "
          f"needs optimizer 'sgd', got {self.optimizer!r}"
      )
    reads.refuse_unread(self, reads.TRAIN_RULES, ConfigError)

  def for_algorithm(self, algorithm: str) -> tuple["TrainConfig", dict[str, Any]]:
    """This config for ``algorithm``, with the settings it does not read reset.

    Used by ``compare`` to run one shared config with several algorithms.

    Args:
      algorithm: a name of ``easgd.methods.registry.ALGORITHMS``.

    Returns:
      ``(config, dropped)``: the config with ``algorithm`` set and every field
      it would not read (:meth:`unread_fields`) back at its default, and
      ``{field: value}`` of the settings that were reset (to be reported).
      A momentum method given delta = 0 keeps it (and fails validation).

    Raises:
      ConfigError: unknown algorithm.
    """
    _choice("algorithm", algorithm, registry.ALGORITHMS)
    config = self.replace(algorithm=algorithm)
    dropped = config.unread_fields()
    defaults = reads.defaults(TrainConfig)
    resets = {k: defaults[k] for k in dropped}
    if "alpha" in dropped:
      resets["beta"] = defaults["beta"]
    return (dataclasses.replace(config, **resets) if resets else config), dropped

  def to_dict(self) -> dict[str, Any]:
    """The fields plus resolved values (alpha, per-worker batch), JSON-ready."""
    d = dataclasses.asdict(self)
    d["lr_decay_epochs"] = list(self.lr_decay_epochs)
    d["task_args"] = list(self.task_args)
    d["resolved_alpha"] = self.resolved_alpha
    d["resolved_beta"] = self.resolved_alpha * self.num_workers
    d["per_worker_batch_size"] = self.per_worker_batch_size
    d["lr_scale"] = self.lr_scale
    d["resolved_learning_rate"] = self.resolved_learning_rate
    return {k: _plain(v) for k, v in d.items()}  # NumPy scalars as Python numbers

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
    """Inverse of :meth:`to_dict` (resolved values are ignored)."""
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in d.items() if k in names}
    if "lr_decay_epochs" in kw:
      kw["lr_decay_epochs"] = tuple(kw["lr_decay_epochs"])
    if "worker_speeds" in kw:
      kw["worker_speeds"] = tuple(kw["worker_speeds"])
    if "task_args" in kw:
      kw["task_args"] = tuple(kw["task_args"])
    if "worker_delays" in kw:
      kw["worker_delays"] = tuple(kw["worker_delays"])
    if "link_rates" in kw:
      kw["link_rates"] = tuple(kw["link_rates"])
    return cls(**kw)

  def to_dict_fields(self) -> dict[str, Any]:
    """The fields alone (no resolved values): ``TrainConfig(**d)`` rebuilds it."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  def to_json(self) -> str:
    """:meth:`to_dict` as JSON text (sorted keys)."""
    return json_text(self.to_dict(), indent=2, sort_keys=True)


def _plain(value):
  """A NumPy scalar as the Python scalar, inside tuples and lists too; else value."""
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray) and value.ndim == 1:  # a sequence field
    return tuple(v.item() for v in value)
  if isinstance(value, (tuple, list)):
    items = [_plain(v) for v in value]
    if any(a is not b for a, b in zip(items, value)):
      return type(value)(items)
  return value
