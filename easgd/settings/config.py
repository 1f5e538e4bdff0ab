"""Run configuration: one frozen dataclass, every field with its unit, validated.

:meth:`TrainConfig.validate` checks every value in plain Python, before any data
is loaded or anything is compiled, and raises :class:`ConfigError` (a
``ValueError``) with a one-line message naming the field, the value and what is
allowed. A value derived from other fields (the learning rate after
``lr_scaling``, alpha from beta) is checked as derived, in :meth:`validate`;
what follows from the data's size (the run's steps, tau and the warm-ups
against them, the schedule in steps) in :meth:`TrainConfig.resolve`, which the
trainer, ``compare`` and the protocol call before anything is compiled. The CLI
turns it into ``easgd: error: ...`` and exit status 2.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from easgd._util import checks
from easgd._util.checks import Entries, Flag, Integer, OneOf, Real, Satisfies
from easgd.methods import registry
from easgd._util.flags import option
from easgd.asynchrony.names import EXCHANGE_ORDERS, PUSH_TIMINGS
from easgd.tasks.data import DATASETS
from easgd._util.files import json_text
from easgd.tasks.names import BATCH_NORM_MODELS, DTYPES, MODELS
from easgd.parallel.names import BACKENDS as MAPPING_BACKENDS
from easgd.parallel.names import backend_for

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")
LR_SCHEDULES = ("constant", "cosine", "step")
LR_SCALINGS = ("none", "linear", "sqrt")
"""``lr_scaling``: the peak learning rate's dependence on the global batch."""


# Upper bounds that keep values inside int32 clocks and memory that exists.
MAX_STEPS = 2**30  # tau, in steps (the clocks are int32)
MAX_WORKERS = 2**16  # num_workers
MAX_SPEED = 1024  # local steps per tick of the asynchronous schedules
MAX_STALENESS = 1024  # master updates (a buffer of that many centers is kept)
MAX_DELAY_S = 3600.0  # seconds: an injected delay per local step
MAX_TOTAL_STEPS = 2**31 - 1  # the steps of a whole run (int32 step clocks)
MAX_REAL = 1e38  # rates and coefficients: finite in float32 arithmetic
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
"""The smallest resolved learning rate (float32's smallest normal number: the
programs compute in float32, where a smaller rate is 0 or denormal)."""


def _listed(names) -> str:
  """``a, b and c`` (help texts naming the algorithms that read a field)."""
  names = list(names)
  return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def _is_text(value) -> bool:
  return isinstance(value, str)


def _is_task_path(value) -> bool:
  """``package.module:function`` (dotted Python names, one colon)."""
  if not isinstance(value, str) or value.count(":") != 1:
    return False
  module, _, attr = value.partition(":")
  return bool(module) and all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()


def _is_task_arg(value) -> bool:
  """``key=value`` with a Python name as the key."""
  key, sep, _ = value.partition("=") if isinstance(value, str) else ("", "", "")
  return bool(sep) and key.strip().isidentifier()


BUILTIN_TASK_FIELDS = ("dataset", "model", "data_dir", "crop_size", "param_dtype", "compute_dtype")
"""Fields read by the built-in tasks only (``easgd.settings.builtin_tasks``)."""


def _is_ray_address(value) -> bool:
  """``[ray://]host:port``, "auto" (or "local")."""
  text = value if isinstance(value, str) else ""
  host, sep, port = text.removeprefix("ray://").rpartition(":")
  return text in ("auto", "local") or bool(sep and host and port.isdigit())


def _synchronous_spmd() -> tuple[str, ...]:
  """The algorithms a worker of several devices runs (``devices_per_worker`` > 1)."""
  return tuple(n for n in registry.runs_on("spmd") if not registry.TABLE[n].asynchronous)


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
class TrainConfig:
  """Everything a training run depends on.

  Every field is declared once: its default, its meaning, unit and range in
  its help text (``dataclasses.fields(TrainConfig)[i].metadata["help"]``, what
  ``easgd train --help`` prints) and its allowed values (``metadata["allowed"]``,
  ``easgd._util.checks``), from which :meth:`validate` checks it; the algorithm
  table (``easgd.methods.registry``) says which algorithm-specific fields each
  algorithm reads. :meth:`validate` checks every value, the rules between
  fields, and refuses a setting the run would not read.
  """

  algorithm: str = option(
      "easgd",
      f"the algorithm, one of: {', '.join(registry.ALGORITHMS)} (the table "
      "easgd.methods.registry lists the settings each one reads; a setting it does "
      "not read must keep its default).",
      allowed=OneOf(registry.ALGORITHMS),
  )
  task: str | None = option(
      None,
      "the problem as an importable task factory, 'package.module:function' "
      "returning an easgd.Task (easgd.tasks.task; the working directory is "
      "searched first); None = the built-in task of dataset and model, which "
      "then must keep their defaults beside a task.",
      allowed=Satisfies(_is_task_path, "'package.module:function' or None"),
  )
  task_args: tuple[str, ...] = option(
      (),
      "the task factory's keyword arguments as 'key=value' texts (a value is "
      "JSON if it parses, else a string); on the command line --task-arg "
      "key=value, repeated.",
      allowed=Entries(Satisfies(_is_task_arg, "'key=value'"), "a tuple of 'key=value' texts"),
  )
  dataset: str = option(
      "mnist1d",
      "'mnist1d' (generated locally; the default), 'fashion_mnist' "
      "(Debian's IDX files), 'digits' (scikit-learn's 8x8 digits), or "
      "'cifar10' (the CIFAR-10 python batches in data_dir; never "
      "downloaded).",
      allowed=OneOf(DATASETS),
  )
  data_dir: str | None = option(
      None,
      "directory of the Fashion-MNIST IDX files (None: the Debian location "
      "/usr/share/datasets/fashion-mnist) or of the CIFAR-10 python batches "
      "(required for 'cifar10'); the other data sets read none. Its "
      "contents are checked when the data are loaded, not by validate().",
      allowed=Satisfies(_is_text, "a path string or None"),
  )
  crop_size: int | None = option(
      None,
      "side of the square image crops, in pixels: random crops for training "
      "(fixed by seed, epoch and step), the centre crop for evaluation "
      "(paper, CIFAR-10: 28 of 32); None = whole images. Images only.",
      allowed=Integer(1, what="pixels"),
  )
  model: str = option(
      "cnn",
      "'cnn', 'cnn_bn' (the CNN with BatchNorm), 'mlp' or 'cifar' "
      "(the paper's 7-layer CIFAR-10 net).",
      allowed=OneOf(MODELS),
  )
  num_workers: int = option(4, "number of workers p.", allowed=Integer(1, MAX_WORKERS))
  num_devices: int | None = option(
      None,
      "devices to spread the workers over (must divide num_workers); None = "
      "the largest available count that divides num_workers. With "
      "devices_per_worker D > 1: all devices, num_workers * D (or None).",
      allowed=Integer(1),
  )
  devices_per_worker: int = option(
      1,
      "devices of ONE worker, D: each worker's mini-batch is split over its D "
      "devices and its gradient averaged over them every step (synchronous "
      "data parallelism inside a worker, on a ('devices', 'data') mesh), the "
      "algorithm's exchange runs across workers as before. D > 1 uses "
      "num_workers * D devices on the 2-D mesh of mapping_backend 'shard_map' "
      "(chosen when mapping_backend is None, the default), runtime "
      "'spmd', a synchronous algorithm and a per-worker batch divisible by D; "
      "with several processes a worker lies inside one process (D divides each "
      "process's devices; one worker per node: D = the node's devices) or spans "
      "whole processes. 1 = one device (or a vmapped slot of one) per worker.",
      allowed=Integer(1, MAX_WORKERS),
  )
  shard_params: bool = option(
      False,
      "with devices_per_worker D > 1: store each worker's parameters, optimizer "
      "state and copy of the center split over its D devices (FSDP/ZeRO-3 "
      "style, 1/D per device; every parameter needs an axis divisible by D); "
      "the parameters are all-gathered for the loss and the gradient "
      "reduce-scattered. False: whole on each device of the worker.",
      allowed=Flag(),
  )
  global_batch_size: int = option(
      128,
      "examples per step summed over all workers; each worker takes "
      "global_batch_size / num_workers. The examples of global step t are "
      "fixed by (seed, epoch, t) alone; worker i reads rows i*B..(i+1)*B-1 of "
      "them (``easgd.tasks.batches.worker_batch_indices``).",
      allowed=Integer(1),
  )
  num_epochs: int = option(40, "passes over the training set (integer).", allowed=Integer(1))
  learning_rate: float = option(
      0.1,
      "peak local step size eta (per step of a worker).",
      allowed=Real(0, MAX_REAL, open_low=True),
  )
  lr_schedule: str = option(
      "constant",
      "'constant', 'cosine' (to 0 at the end) or 'step' (times "
      "lr_decay_factor at each epoch of lr_decay_epochs).",
      allowed=OneOf(LR_SCHEDULES),
  )
  warmup_epochs: float = option(0.0, "linear warm-up from 0, in epochs.", allowed=Real(0))
  lr_decay_epochs: tuple[float, ...] = option(
      (),
      "epochs at which the 'step' schedule decays, increasing, each in "
      "(0, num_epochs) (read by lr_schedule 'step' only).",
      allowed=Entries(
          Real(0, "num_epochs", open_low=True, open_high=True, what="a decay inside the run"),
          "a tuple of epochs",
          increasing=True,
      ),
  )
  lr_decay_factor: float = option(
      0.1,
      "multiplier of the 'step' schedule, in (0, 1] (read by lr_schedule " "'step' only).",
      allowed=Real(0, 1, open_low=True),
  )
  optimizer: str = option(
      "sgd",
      "local optimizer: 'sgd', 'momentum' (heavy ball), 'nesterov', " "'adam', 'adamw'.",
      allowed=OneOf(OPTIMIZERS),
  )
  momentum: float = option(
      0.0,
      "momentum coefficient of the local optimizer 'momentum' or "
      "'nesterov', in [0, 1); read by no other optimizer.",
      allowed=Real(0, 1, open_high=True),
  )
  delta: float = option(
      0.99,
      f"the Nesterov momentum delta built into {_listed(registry.readers('delta'))} "
      "(eq. 7; paper: 0.99), in (0, 1); read by those only (they need optimizer "
      "'sgd'). delta = 0 would turn each into "
      f"{_listed([registry.TABLE[a].without_momentum for a in registry.readers('delta')])}"
      " (in that order) and is refused.",
      allowed=Real(0, 1, open_low=True, open_high=True),
  )
  weight_decay: float = option(
      0.0, "L2 coefficient (added to the gradient; decoupled for adamw).", allowed=Real(0, MAX_REAL)
  )
  tau: int = option(
      4,
      "EASGD communication period, in local steps (>= 1).",
      allowed=Integer(1, MAX_STEPS, what="communication period"),
  )
  alpha: float | None = option(
      None,
      "EASGD moving rate, the elastic coefficient of each worker; giving "
      "alpha replaces the default beta (alpha = beta / num_workers).",
      allowed=Real(0, MAX_REAL),
  )
  beta: float | None = option(
      0.9,
      "EASGD center moving rate, beta = num_workers * alpha (paper: 0.9); "
      "used when alpha is not given. Giving both is refused.",
      allowed=Real(0, MAX_REAL),
  )
  reset_opt_state: bool = option(
      False,
      "EASGD/EAMSGD (sync and async): re-initialise the local optimizer state "
      "at every exchange (schedules keep their position).",
      allowed=Flag(),
  )
  exchange_order: str = option(
      "round_robin",
      "asynchronous algorithms: order in which the exchanges of a tick are "
      "served, 'round_robin' or 'random' (a permutation per tick).",
      allowed=OneOf(EXCHANGE_ORDERS),
  )
  worker_speeds: tuple[int, ...] = option(
      (),
      "asynchronous algorithms: local steps per tick of each worker, "
      "num_workers integers >= 1; () = all 1 (or drawn, below).",
      allowed=Entries(
          Integer(1, MAX_SPEED, what="local steps per tick", whole_floats=True),
          "a sequence (one integer per worker)",
          label="{name}[{i}]",
          per_worker="num_workers",
      ),
  )
  max_worker_speed: int | None = option(
      None,
      "asynchronous algorithms: if set (and worker_speeds is empty), speeds "
      "are drawn uniformly from {1, ..., max_worker_speed} with the seed.",
      allowed=Integer(1, MAX_SPEED),
  )
  staleness: int = option(
      0,
      "asynchronous algorithms: the center a worker reads is this many master "
      "updates old (integer >= 0).",
      allowed=Integer(0, MAX_STALENESS, what="in master updates"),
  )
  push_timing: str = option(
      "authors",
      "the DOWNPOUR family: 'authors' (push after local steps 0, tau, 2 "
      "tau, ..., the authors' released code) or 'full_period' (after steps "
      "tau - 1, 2 tau - 1, ...: every push carries tau full steps).",
      allowed=OneOf(PUSH_TIMINGS),
  )
  outer_learning_rate: float = option(
      0.7,
      "DiLoCo's outer SGD step size (> 0; DiLoCo: 0.7).",
      allowed=Real(0, MAX_REAL, open_low=True),
  )
  outer_momentum: float = option(
      0.9, "DiLoCo's outer Nesterov momentum, in [0, 1) (0.9).", allowed=Real(0, 1, open_high=True)
  )
  average_rate: float = option(
      0.001,
      f"constant moving-average rate of {_listed(registry.readers('average_rate'))}, "
      "in (0, 1] (paper: 0.001).",
      allowed=Real(0, 1, open_low=True),
  )
  seed: int = option(
      0,
      "seeds the initial parameters, the data order and the worker keys.",
      allowed=Integer(0, 2**32 - 1),
  )
  eval_every_epochs: int = option(
      1, "evaluate the center every this many epochs (and last).", allowed=Integer(1)
  )
  eval_batch_size: int = option(
      500, "test examples per worker per evaluation batch.", allowed=Integer(1)
  )
  bn_stats_examples: int = option(
      2048,
      "models with BatchNorm only: training examples (centre crops) over "
      "which the center's BatchNorm statistics are recomputed before each "
      "evaluation and at export: the first of a seeded permutation, split "
      "equally over the workers (min(this, training set) // num_workers each, "
      "at least 1), the same every time (``easgd.runtimes.training_run.bn_stats_indices``).",
      allowed=Integer(1),
  )
  curvature: float | None = option(
      None,
      "optional estimate of the loss's largest Hessian eigenvalue h (1 / "
      "parameter units squared, e.g. from "
      "``easgd.analysis.hessian.top_hessian_eigenvalue``); with it the trainer checks "
      "eta*h = learning_rate * curvature against synchronous EASGD's stable "
      "region on the quadratic model and warns once when outside (read by "
      f"{_listed(registry.readers('curvature'))} only).",
      allowed=Real(0, MAX_REAL, open_low=True),
  )
  checkpoint_every_steps: int = option(
      0,
      "also checkpoint every this many global steps inside an epoch (0: only "
      "at epoch ends, where a checkpoint is always written).",
      allowed=Integer(0),
  )
  keep_checkpoints: int = option(
      2, "number of most recent checkpoints kept (>= 1).", allowed=Integer(1)
  )
  progress: bool = option(True, "show a progress bar.", allowed=Flag())
  mapping_backend: str | None = option(
      None,
      "how workers are mapped onto devices (``easgd.parallel.workers``): 'pmap' "
      "(pmap of vmap) or 'shard_map' (jit of shard_map of vmap; needed for "
      "multi-process runs and for devices_per_worker > 1). Same results and "
      "array layouts. None = chosen from the layout: 'shard_map' when "
      "devices_per_worker > 1, else 'pmap' (resolved_mapping_backend).",
      allowed=OneOf(MAPPING_BACKENDS),
  )
  param_dtype: str = option(
      "float32",
      "dtype of the workers' parameters and optimizer state, 'float32' or "
      "'bfloat16' (Flax's ``param_dtype``). The center, the elastic "
      "differences and every sum across workers are kept in float32 whatever "
      "this is (``easgd.core.elastic.reduction_dtype``).",
      allowed=OneOf(DTYPES),
  )
  compute_dtype: str = option(
      "float32",
      "dtype of the model's forward and backward computation, 'float32' or "
      "'bfloat16' (Flax's ``dtype``); the loss is float32.",
      allowed=OneOf(DTYPES),
  )
  runtime: str = option(
      "spmd",
      "where the workers run (easgd.methods.registry.RUNTIMES): 'spmd' (one SPMD "
      "program: the synchronous methods, and the asynchronous ones simulated "
      "deterministically with exchange_order, worker_speeds and staleness), "
      "'threads' (real asynchronous workers, one thread each, in this "
      "process) or 'ray' (real asynchronous workers as Ray actors; needs pip "
      "install 'easgd[ray]'). The real runtimes run the asynchronous "
      "algorithms (the table's runtimes).",
      allowed=OneOf(registry.RUNTIMES),
  )
  ray_address: str | None = option(
      None,
      "runtime 'ray' only: the address of a running Ray cluster (e.g. "
      "'ray://head:10001', 'head:6379' or 'auto'); None starts a local Ray "
      "instance on this machine.",
      allowed=Satisfies(
          _is_ray_address, "[ray://]host:port (e.g. 'ray://head:10001'), 'auto' or None"
      ),
  )
  worker_delays: tuple[float, ...] = option(
      (),
      "real runtimes only: seconds each worker waits after each of its local "
      "steps, num_workers reals >= 0 (an injected straggler, e.g. "
      "0,0,0,0.01); () = none.",
      allowed=Entries(
          Real(0, MAX_DELAY_S, what="seconds per local step"),
          "a tuple (seconds per local step, one per worker)",
          per_worker="num_workers",
      ),
  )
  sync_warmup_steps: int = option(
      0,
      "synchronous warm-up, in global steps K: the first K steps run pmean SGD "
      "(the workers' gradients averaged every step, one model), then the "
      "algorithm starts from that model, with the local optimizer's state, and "
      "its exchange schedule counted from step K (post-local SGD, Lin et al. "
      "2020; easgd.core.warmup); 0 = none. Read by the synchronous elastic and "
      "averaging algorithms (the table easgd.methods.registry); K must be below the "
      "run's total steps.",
      allowed=Integer(0, MAX_STEPS, what="global steps of synchronous warm-up"),
  )
  lr_scaling: str = option(
      "none",
      "how the peak learning rate scales with the global batch G (examples per "
      "step, all workers): 'none' (eta = learning_rate), 'linear' (eta = "
      "learning_rate * G / lr_reference_batch, Goyal et al. 2017) or 'sqrt' "
      "(eta = learning_rate * sqrt(G / lr_reference_batch)); the resolved eta "
      "is in summary.json ('resolved') and in every metrics record.",
      allowed=OneOf(LR_SCALINGS),
  )
  lr_reference_batch: int | None = option(
      None,
      "the global batch (examples per step, all workers) at which "
      "learning_rate is stated; needed by lr_scaling 'linear' and 'sqrt', read "
      "by nothing else.",
      allowed=Integer(1, what="global batch at which learning_rate is stated"),
  )
  validation_examples: int = option(
      0,
      "examples held out of the training set for validation, never trained "
      "on: a seeded choice fixed by the training set's size alone "
      "(easgd.tasks.data.validation_split); the runs train on the rest, and every "
      "evaluation also reports the center's val_loss and its other metrics "
      "on them (val_error: a task with a 'correct' metric). "
      "0 = none.",
      allowed=Integer(0, what="examples held out of the training set"),
  )

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
    """alpha, or beta / num_workers when beta is given."""
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
      if _differs(self, name):
        raise ConfigError(
            f"{name}={getattr(self, name)!r} is read by the built-in tasks only; task "
            f"{task_name!r} brings its own data and model; leave {name} at its default "
            f"{_DEFAULTS[name]!r}"
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
    if self.dataset == "cifar10" and self.data_dir is None:
      raise ConfigError(
          "dataset 'cifar10' needs data_dir, the directory of the "
          "CIFAR-10 python batches (it is never downloaded)"
      )
    if self.crop_size is not None and self.dataset == "mnist1d":
      raise ConfigError(
          "crop_size crops images; dataset 'mnist1d' holds 1-D " "signals; allowed: crop_size None"
      )
    if self.shard_params and self.devices_per_worker == 1:
      raise ConfigError(
          "shard_params splits a worker's state over its devices; devices_per_worker=1 "
          "has one; allowed: shard_params with devices_per_worker > 1"
      )
    if self.devices_per_worker > 1:
      self._check_devices_per_worker()
    elif self.num_devices is not None and self.num_workers % self.num_devices:
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
    runtimes = registry.TABLE[self.algorithm].runtimes
    if self.runtime not in runtimes:
      raise ConfigError(
          f"algorithm {self.algorithm!r} does not run on runtime {self.runtime!r} "
          f"(it runs on: {', '.join(runtimes)}); "
          f"runtime {self.runtime!r} runs: {', '.join(registry.runs_on(self.runtime))}"
      )
    if self.runtime == "ray":
      import importlib.util

      if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "runtime 'ray' needs Ray, which is not installed; " "pip install 'easgd[ray]'"
        )
    if self.lr_reference_batch is None and self.lr_scaling != "none":
      raise ConfigError(
          f"lr_scaling {self.lr_scaling!r} scales learning_rate from a "
          "reference batch; give lr_reference_batch (the global batch "
          "at which learning_rate is stated)"
      )

  def _check_devices_per_worker(self) -> None:
    """The rules of a worker of D = devices_per_worker > 1 devices."""
    D, p = self.devices_per_worker, self.num_workers
    if self.num_devices is not None and self.num_devices != p * D:
      raise ConfigError(
          f"num_devices={self.num_devices} with devices_per_worker={D}: {p} workers use "
          f"num_workers * devices_per_worker = {p * D} devices; allowed: {p * D} or None"
      )
    if self.resolved_mapping_backend != "shard_map":
      raise ConfigError(
          f"devices_per_worker={D} needs the 2-D mesh of mapping_backend 'shard_map', got "
          f"mapping_backend {self.mapping_backend!r}; allowed: mapping_backend 'shard_map' "
          "or None (chosen from devices_per_worker), or devices_per_worker 1"
      )
    if self.runtime != "spmd":
      raise ConfigError(
          f"devices_per_worker={D} runs on runtime 'spmd' (one SPMD program), got runtime "
          f"{self.runtime!r}; allowed: runtime 'spmd', or devices_per_worker 1"
      )
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

  def resolve(self, steps_per_epoch: int) -> dict[str, Any]:
    """The quantities a run derives from this config and its data's size, each
    checked after it is derived (before anything is compiled).

    Derived and checked: total_steps = num_epochs * steps_per_epoch (int32
    clocks); tau against it (at most the run; and
    ``easgd.methods.registry.center_update``: an exchange that moves the center within
    the steps the run gives a worker, total_steps - sync_warmup_steps);
    sync_warmup_steps below it; the learning-rate warm-up in steps,
    round(warmup_epochs * steps_per_epoch) (at least 1 when warmup_epochs > 0,
    below total_steps); the 'step' decay points in steps (distinct, after the
    warm-up, before the end); the cosine's length. The rates were checked by
    :meth:`validate`.

    Args:
      steps_per_epoch: global steps per epoch (``easgd.tasks.batches.steps_per_epoch``
        of the training set, the global batch and the workers), >= 1.

    Returns:
      dict(learning_rate (the config's), lr_scaling, lr_reference_batch,
      lr_scale, resolved_learning_rate (the peak eta the run uses),
      steps_per_epoch, total_steps, lr_warmup_steps (the linear warm-up from
      0), lr_decay_steps (the 'step' schedule's decay points, [] otherwise),
      cosine_decay_steps (the cosine's length, None otherwise),
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
    warmup = int(round(self.warmup_epochs * spe))
    if self.warmup_epochs > 0 and not 0 < warmup < total:
      raise ConfigError(
          f"warmup_epochs={self.warmup_epochs!r} gives a learning-rate warm-up of "
          f"{warmup} steps (round(warmup_epochs * {spe} steps per epoch), {total} "
          f"steps in all); allowed: warmup_epochs 0, or one that gives 1 to "
          f"{total - 1} steps"
      )
    decay = []
    if self.lr_schedule == "step":
      decay = [int(round(e * spe)) for e in self.lr_decay_epochs]
      after = [t - warmup for t in decay]
      if len(set(after)) != len(after) or any(not 0 < t < total - warmup for t in after):
        raise ConfigError(
            f"lr_decay_epochs={tuple(self.lr_decay_epochs)} fall on steps {decay} "
            f"({spe} steps per epoch, warm-up {warmup} steps, {total} steps in all); "
            f"allowed: distinct steps after the warm-up and before the end of the run"
        )
    return dict(
        learning_rate=self.learning_rate,
        lr_scaling=self.lr_scaling,
        lr_reference_batch=self.lr_reference_batch,
        lr_scale=self.lr_scale,
        resolved_learning_rate=self.resolved_learning_rate,
        steps_per_epoch=spe,
        total_steps=total,
        lr_warmup_steps=warmup,
        lr_decay_steps=decay,
        cosine_decay_steps=(max(total - warmup, 1) if self.lr_schedule == "cosine" else None),
        sync_warmup_steps=k,
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
    """The fields set away from their default that this config's run never reads.

    Algorithm-specific fields (``easgd.methods.registry.ALGORITHM_FIELDS``) the
    algorithm does not read (alpha and beta count as one setting, default
    beta = 0.9); ``momentum`` with an optimizer other than "momentum" or
    "nesterov"; ``lr_decay_factor`` without the "step" schedule;
    ``bn_stats_examples`` with a model without BatchNorm; ``data_dir`` with
    a data set that has no files.

    Returns:
      ``{field: value}`` in field order (empty when every setting is read).
    """
    spec = registry.TABLE[self.algorithm]
    out = {}
    for name in registry.ALGORITHM_FIELDS:
      if name in spec.reads or not _differs(self, name):
        continue
      if name == "beta" and "alpha" in out:
        continue  # alpha given: beta was cleared with it, one setting
      out[name] = getattr(self, name)
    if self.optimizer not in ("momentum", "nesterov") and _differs(self, "momentum"):
      out["momentum"] = self.momentum
    if self.lr_schedule != "step" and _differs(self, "lr_decay_factor"):
      out["lr_decay_factor"] = self.lr_decay_factor
    if (
        self.task is None
        and self.model not in BATCH_NORM_MODELS
        and _differs(self, "bn_stats_examples")
    ):
      out["bn_stats_examples"] = self.bn_stats_examples
    if self.dataset not in ("fashion_mnist", "cifar10") and self.data_dir is not None:
      out["data_dir"] = self.data_dir
    real = self.runtime in registry.REAL_RUNTIMES
    for name in registry.SCHEDULE_FIELDS if real else ():
      if name in spec.reads and _differs(self, name):
        out[name] = getattr(self, name)  # the simulated schedule: spmd only
    if not real and _differs(self, "worker_delays"):
      out["worker_delays"] = self.worker_delays
    if self.runtime != "ray" and self.ray_address is not None:
      out["ray_address"] = self.ray_address
    if self.lr_scaling == "none" and self.lr_reference_batch is not None:
      out["lr_reference_batch"] = self.lr_reference_batch
    return out

  def _refuse_unread(self) -> None:
    """A setting the run would not read is refused, never silently ignored."""
    spec = registry.TABLE[self.algorithm]
    if spec.without_momentum is not None:
      if self.optimizer != "sgd":
        raise ConfigError(
            f"algorithm {self.algorithm!r} has its own Nesterov momentum (delta); it "
            f"needs optimizer 'sgd', got {self.optimizer!r}"
        )
    unread = self.unread_fields()
    if not unread:
      return
    name, value = next(iter(unread.items()))
    if name == "momentum":
      hint = "use optimizer 'momentum' or 'nesterov'" + (
          f", or delta for {self.algorithm}'s own Nesterov momentum"
          if spec.without_momentum
          else f" (the algorithms with their own Nesterov momentum take delta: "
          f"{', '.join(registry.MOMENTUM_ALGORITHMS)})"
      )
      raise ConfigError(
          f"momentum={value} has no effect with optimizer " f"{self.optimizer!r}; {hint}"
      )
    if name == "lr_decay_factor":
      raise ConfigError(
          f"lr_decay_factor={value} has no effect with lr_schedule "
          f"{self.lr_schedule!r}; use lr_schedule 'step'"
      )
    if name == "bn_stats_examples":
      raise ConfigError(
          f"bn_stats_examples={value} has no effect with model "
          f"{self.model!r} (no BatchNorm); allowed models: "
          f"{', '.join(BATCH_NORM_MODELS)}"
      )
    if name == "data_dir":
      raise ConfigError(
          f"data_dir={value!r} is not read by dataset {self.dataset!r} "
          "(generated or shipped); allowed: data_dir None"
      )
    if name == "worker_delays":
      raise ConfigError(
          f"worker_delays={value!r} is not read by runtime "
          f"{self.runtime!r} (the simulation's stragglers are "
          "worker_speeds); use runtime 'threads' or 'ray'"
      )
    if name == "ray_address":
      raise ConfigError(
          f"ray_address={value!r} is not read by runtime "
          f"{self.runtime!r}; use runtime 'ray' or leave it None"
      )
    if name == "lr_reference_batch":
      raise ConfigError(
          f"lr_reference_batch={value!r} has no effect with lr_scaling "
          f"'none'; use lr_scaling 'linear' or 'sqrt', or leave it None"
      )
    if name in registry.SCHEDULE_FIELDS and name in spec.reads:
      raise ConfigError(
          f"{name}={value!r} sets the simulated exchange schedule (runtime 'spmd'); "
          f"runtime {self.runtime!r} runs the workers for real, their order and "
          "staleness come from timing; for a straggler use worker_delays"
      )
    readers = registry.readers("alpha" if name == "beta" else name)
    default = _DEFAULTS[name]
    raise ConfigError(
        f"{name}={value!r} is not read by algorithm {self.algorithm!r}; leave it at "
        f"its default {default!r}, or use an algorithm that reads it: "
        f"{', '.join(readers)}"
    )

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
    resets = {k: _DEFAULTS[k] for k in dropped}
    if "alpha" in dropped:
      resets["beta"] = _DEFAULTS["beta"]
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
    return cls(**kw)

  def to_dict_fields(self) -> dict[str, Any]:
    """The fields alone (no resolved values): ``TrainConfig(**d)`` rebuilds it."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  def to_json(self) -> str:
    """:meth:`to_dict` as JSON text (sorted keys)."""
    return json_text(self.to_dict(), indent=2, sort_keys=True)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def _differs(config: TrainConfig, name: str) -> bool:
  """Whether field ``name`` of ``config`` is set away from its default."""
  value = getattr(config, name)
  default = _DEFAULTS[name]
  if isinstance(value, (tuple, list)) or isinstance(default, (tuple, list)):
    return tuple(value) != tuple(default)
  return value != default


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
