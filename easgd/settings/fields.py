"""The fields of a run's configuration: each declared once, with its unit and range.

:class:`TrainFields` declares every field of ``easgd.settings.config.TrainConfig``
(its default, its help text, what ``easgd train --help`` prints, and its
allowed values, ``easgd._util.checks``); the checks between fields, the
refusal of unread settings and the derived values are ``TrainConfig``'s
(``easgd.settings.config``). Imports no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from easgd._util.checks import Entries, Flag, Integer, OneOf, Real, Satisfies
from easgd._util.flags import option
from easgd.asynchrony.names import EXCHANGE_ORDERS, PUSH_TIMINGS
from easgd.core.names import COMPRESSIONS, FRAGMENT_LAYOUTS
from easgd.methods import registry
from easgd.parallel import link
from easgd.parallel.names import BACKENDS
from easgd.settings import runtime_table
from easgd.tasks import datasets
from easgd.tasks.names import DTYPES, MODELS

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")
LR_SCHEDULES = ("constant", "cosine", "step")
LR_SCALINGS = ("none", "linear", "sqrt")
"""``lr_scaling``: the peak learning rate's dependence on the global batch."""
LR_SCHEDULE_UNITS = ("epochs", "reference_steps")
"""``lr_schedule_unit``: the steps per epoch that convert the schedule's epochs to steps."""


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


def _is_ray_address(value) -> bool:
  """``[ray://]host:port``, "auto" (or "local")."""
  text = value if isinstance(value, str) else ""
  host, sep, port = text.removeprefix("ray://").rpartition(":")
  return text in ("auto", "local") or bool(sep and host and port.isdigit())


@dataclasses.dataclass(frozen=True)
class _LinkQuantity:
  """A text of ``easgd.parallel.link``'s spelling: its parser's one-line refusal."""

  parse: Callable[[str, str], float]

  def check(self, name: str, value, values: dict, error: type[Exception]) -> None:
    try:
      self.parse(value, name)
    except link.LinkError as e:
      raise error(str(e)) from None


def _dataset_help(default: str) -> str:
  """The help of ``dataset``, from the data set table (``easgd.tasks.datasets``)."""
  named = [
      f"{n!r} ({s.summary}{'; the default' if n == default else ''})"
      for n, s in datasets.TABLE.items()
  ]
  return ", ".join(named[:-1]) + ", or " + named[-1] + "."


def _data_dir_help() -> str:
  """The help of ``data_dir``, from the rows that read one (``easgd.tasks.datasets``)."""
  dirs = [
      s.data_dir + (f" (required for {n!r})" if s.needs_data_dir else "")
      for n, s in datasets.TABLE.items()
      if s.data_dir is not None
  ]
  return (
      f"directory of {' or of '.join(dirs)}; the other data sets read none. Its "
      "contents are checked when the data are loaded, not by validate()."
  )


@dataclasses.dataclass(frozen=True)
class TrainFields:
  """The fields of :class:`~easgd.settings.config.TrainConfig` (which adds the checks).

  Each field's meaning, unit and range is its help text
  (``dataclasses.fields(TrainConfig)[i].metadata["help"]``) and its allowed
  values ``metadata["allowed"]``; the algorithm table (``easgd.methods.registry``)
  says which algorithm-specific fields each algorithm reads.
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
      _dataset_help("mnist1d"),
      allowed=OneOf(datasets.DATASETS),
  )
  data_dir: str | None = option(
      None,
      _data_dir_help(),
      allowed=Satisfies(_is_text, "a path string or None"),
  )
  crop_size: int | None = option(
      None,
      "side of the square image crops, in pixels: random crops for training "
      "(fixed by seed, epoch and step), the centre crop for evaluation "
      "(paper, CIFAR-10: 28 of 32); None = whole images. Images only.",
      allowed=Integer(1, what="pixels"),
  )
  random_flip: bool = option(
      False,
      "random horizontal flips for training: each image mirrored left-right "
      "with probability 1/2, drawn from the generator of the crops (fixed by "
      "seed, epoch and step, after the crop); evaluation unflipped. Images only.",
      allowed=Flag(),
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
  lr_schedule_unit: str = option(
      "epochs",
      "what converts warmup_epochs, lr_decay_epochs and the cosine's length "
      "(num_epochs) to steps: 'epochs' (the run's own steps per epoch, N // "
      "global_batch_size for N training examples) or 'reference_steps' (the "
      "steps per epoch of lr_reference_batch, N // lr_reference_batch: a "
      "schedule written for that batch and reused at a p times larger one "
      "decays at the same step, at p times the epochs, the bug of counting a "
      "schedule in steps; a decay or warm-up past the run's end never comes, a "
      "cosine is cut). Read when there is a schedule (lr_schedule 'step' or "
      "'cosine', or warmup_epochs > 0).",
      allowed=OneOf(LR_SCHEDULE_UNITS),
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
      "alpha replaces the default beta (alpha = beta / num_workers). "
      "streaming_diloco: the merge's moving rate in (0, 1] (None: 1, replace).",
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
  fragments: int = option(
      1,
      "elastic exchange in P fragments of the parameter leaves: fragment j at "
      "clocks o_j + k tau (o_j = floor(j tau / P)), so every parameter is exchanged "
      "once per tau and one exchange moves about 1/P of the bytes; 1 <= P <= tau "
      "and at most the number of leaves (docs/guides/streaming.md).",
      allowed=Integer(1, MAX_STEPS, what="fragments"),
  )
  fragment_layout: str = option(
      "contiguous",
      "which leaves form a fragment (fragments > 1): 'contiguous' (consecutive "
      "leaves of about equal size) or 'strided' (leaf k in fragment k mod P).",
      allowed=OneOf(FRAGMENT_LAYOUTS),
  )
  delay: int = option(
      0,
      "overlap: an exchange sent at local step s is applied V steps later, at "
      "s + V (the elastic difference taken at s); 0 <= V < tau.",
      allowed=Integer(0, MAX_STEPS, what="local steps"),
  )
  compression: str = option(
      "none",
      "what an elastic exchange sends, with error feedback: 'none', 'int8' or "
      "'int4' (integers with a float32 scale per block), 'topk' (the largest "
      "entries of each leaf).",
      allowed=OneOf(COMPRESSIONS),
  )
  compression_block: int = option(
      256,
      "compression 'int8'/'int4': entries per block that share one scale (>= 1).",
      allowed=Integer(1, MAX_STEPS, what="entries"),
  )
  topk_fraction: float = option(
      0.01,
      "compression 'topk': the fraction of each leaf's entries sent, in (0, 1] "
      "(at least one entry per leaf).",
      allowed=Real(0, 1, open_low=True),
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
  eval_every_steps: int = option(
      0,
      "also evaluate the center every this many global steps, inside epochs too "
      "(0: only at the epochs of eval_every_epochs); a mid-epoch record's epoch is "
      "step / steps per epoch, its train_loss the epoch's mean so far (spmd).",
      allowed=Integer(0, MAX_STEPS, what="global steps"),
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
      "how workers are mapped onto devices (``easgd.parallel.mapping``): 'pmap' "
      "(pmap of vmap) or 'shard_map' (jit of shard_map of vmap; needed for "
      "multi-process runs and for devices_per_worker > 1). Same results and "
      "array layouts. None = chosen from the layout: 'shard_map' when "
      "devices_per_worker > 1, else 'pmap' (resolved_mapping_backend).",
      allowed=OneOf(BACKENDS),
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
      runtime_table.DEFAULT,
      runtime_table.help_text(),
      allowed=OneOf(runtime_table.NAMES),
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
  link_rate: str | None = option(
      None,
      "real runtimes only: the rate of an emulated link between each worker and "
      "the center, bit/s in tc's spelling (e.g. '10mbit', '1gbit'; bps, kbps, ... "
      "are bytes/s): a token bucket charges every push and pull of an exchange "
      "its bytes, and the worker sleeps for the delay (easgd.runtimes.link_emulation; "
      "it changes time, never results); None = no bandwidth limit.",
      allowed=_LinkQuantity(link.rate_bit_s),
  )
  link_rates: tuple[str, ...] = option(
      (),
      "real runtimes only: each worker's link rate (as link_rate, num_workers "
      "texts, replacing link_rate; e.g. 1gbit,1gbit,1gbit,10mbit puts worker 3 "
      "behind a slow link); () = link_rate for every worker.",
      allowed=Entries(
          _LinkQuantity(link.rate_bit_s),
          "a tuple of rates (one per worker)",
          label="{name}[{i}]",
          per_worker="num_workers",
      ),
  )
  link_latency: str | None = option(
      None,
      "real runtimes only: the emulated link's fixed latency of every push and "
      "pull, in tc's spelling (e.g. '5ms'; s, ms, us); None = 0 s.",
      allowed=_LinkQuantity(link.seconds),
  )
  link_burst: str | None = option(
      None,
      "real runtimes only: the emulated link's bucket size, bytes in tc's spelling "
      "(e.g. '64kb'; b, k, kb, m, mb, g, gb of 1024); None = 1 ms of traffic at the "
      "rate, at least 16 KiB. Needs link_rate or link_rates.",
      allowed=_LinkQuantity(link.size_bytes),
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
      "learning_rate and the schedule are stated; needed by lr_scaling 'linear' "
      "and 'sqrt' and by lr_schedule_unit 'reference_steps', read by nothing "
      "else.",
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
