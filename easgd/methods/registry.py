"""The algorithm table: the one place that names the algorithms.

Each entry of :data:`TABLE` is an :class:`AlgorithmSpec`: the algorithm's
factory (from a config), its family, whether it is simulated asynchronously,
the config fields it reads beyond the common ones, and the algorithm it turns
into when its own Nesterov momentum delta is 0. The trainer, the config's
validation, ``compare`` and the CLI all ask this table; adding an algorithm is
one entry here plus its module.

Which algorithm-specific config fields (:data:`ALGORITHM_FIELDS`) each one
reads, generated from the specs' ``reads`` (:func:`reads_table`):

{reads_table}

When the model each algorithm returns (its center) first takes in training
is its family's rule, :func:`center_update`; a run in which no exchange would
move it is refused (``TrainConfig.validate`` and ``TrainConfig.resolve``).

The synchronous elastic and averaging algorithms read ``sync_warmup_steps``
(``easgd.core.warmup``: pmean SGD for the first K steps). Each spec also names
its ``array_fields``: the fields its factory takes as JAX arrays, so that
configurations differing only in them (and in the learning rate, which every
algorithm takes as an array through its optimizer) run in one compiled
program vmapped over configurations (``easgd.protocol.runs``). The simulated
asynchronous algorithms take tau and ``exchange_order`` as arrays too (the
exchange is decided on the device from the clock, the order selected there:
:func:`field_array`); their ``worker_speeds``, ``staleness`` and
``push_timing`` stay Python values (the slot table's and the ring of centers'
shapes, the push offset of ``easgd.core.base.every_tau_steps``).

Every algorithm reads the common fields (data, model, num_workers, batch,
epochs, the local optimizer ``optimizer``/``learning_rate``/schedule/
``weight_decay``, and ``momentum`` when the optimizer is "momentum" or
"nesterov"). A field an algorithm does not read is refused by
``TrainConfig.validate`` when it differs from its default, never silently
ignored. The momentum methods (:data:`MOMENTUM_ALGORITHMS`) have their
Nesterov momentum built in (``delta``, the paper's 0.99 by default) and need
``optimizer = "sgd"``; delta = 0 would make each of them its
``without_momentum`` algorithm and is refused.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

if TYPE_CHECKING:  # annotations only: the table is read without JAX (the config)
  import numpy as np
  import optax

  from easgd.asynchrony.schedule import ExchangeSchedule
  from easgd.core.base import Algorithm


# The factories' modules, imported when a run builds its algorithm: the table
# itself is read by the config (``easgd.settings.config``), which imports no JAX.
def _algorithms():
  from easgd.core import algorithms

  return algorithms


def _simulation():
  from easgd.asynchrony import simulation

  return simulation


def _baselines():
  from easgd.methods import baselines

  return baselines


def _streaming_diloco():
  from easgd.methods import streaming_diloco

  return streaming_diloco


def _downpour_family():
  from easgd.methods import downpour_family

  return downpour_family


def _schedule():
  from easgd.asynchrony import schedule

  return schedule


FAMILIES = ("elastic", "averaging", "push", "sequential")
"""elastic: workers pulled to a center (eq. 5-7); averaging: gradients or
parameters averaged over workers; push: DOWNPOUR-type, workers push updates to
a master; sequential: one model (several workers share its mini-batch)."""

ALGORITHM_FIELDS = (
    "tau",
    "alpha",
    "beta",
    "delta",
    "reset_opt_state",
    "exchange_order",
    "worker_speeds",
    "max_worker_speed",
    "staleness",
    "push_timing",
    "outer_learning_rate",
    "outer_momentum",
    "average_rate",
    "curvature",
    "sync_warmup_steps",
    "fragments",
    "delay",
    "compression",
)
"""The ``TrainConfig`` fields that only some algorithms read."""

_ELASTIC = ("tau", "alpha", "beta", "reset_opt_state")
STREAMING = ("fragments", "delay", "compression")
"""The exchange techniques (``easgd.core.streaming``): read by the synchronous elastic
algorithms and Streaming DiLoCo; ``delay`` (:data:`OVERLAP`) also by the asynchronous
elastic ones."""
OVERLAP = ("delay",)
"""The exchange techniques the asynchronous elastic algorithms read: the overlap V of
an exchange with the worker's next local steps (``easgd.asynchrony.simulation.async_easgd``),
run by the real runtimes only (``easgd.settings.runtime_table``, ``async_reads``)."""
_ASYNC = ("exchange_order", "worker_speeds", "max_worker_speed", "staleness")
SCHEDULE_FIELDS = _ASYNC
"""The fields of the simulated exchange schedule: read only on the runtimes that
simulate it (``easgd.settings.runtime_table``; on a real runtime, order and
staleness come from timing)."""
_PUSH = ("tau", "push_timing") + _ASYNC
_PUSH_ARRAYS = ("tau", "exchange_order")
"""The array fields of every DOWNPOUR-type algorithm (``array_fields``)."""
CODED_FIELDS = {"exchange_order": "EXCHANGE_ORDERS"}
"""Array fields whose config values are names: :func:`field_array` passes the
index of the name in its tuple of ``easgd.asynchrony.names``."""


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One algorithm of the table.

  Attributes:
    name: the name used in configs and on the command line.
    family: one of :data:`FAMILIES`.
    asynchronous: simulated with an exchange schedule (``easgd.asynchrony.simulation``);
      its rules (``Algorithm.async_rules``) also run on the real runtimes
      (``easgd.settings.runtime_table``).
    reads: the fields of :data:`ALGORITHM_FIELDS` the algorithm reads.
    build: ``build(config, loss_fn, optimizer, num_steps, param_shapes) -> Algorithm``
      (``param_shapes``: the parameters' shapes or None, read by the algorithms that
      read :data:`STREAMING`);
      ``num_steps`` is the run's total number of steps (local SGD and DiLoCo
      end on an average).
    without_momentum: the algorithm this one becomes at delta = 0, or None.
    summary: one line for help texts.
    paper: the paper's method or one of the comparators its Section 5 ran
      (EASGD and EAMSGD in either form: the paper defines the synchronous
      rules, eq. (5)-(7), and ran the asynchronous ones; the DOWNPOUR family;
      SGD, MSGD, ASGD, MVASGD); False for the methods it did not run (pmean
      SGD, local SGD, DiLoCo, ...). The claims table reports its parts against
      the paper's comparators apart from the others (``easgd.protocol.claims``).
    array_fields: the fields of ``reads`` that ``build`` passes to the
      factory as they are, so that a JAX array there (traced under a vmap
      over configurations) builds the algorithm; the others must be Python
      values (they set shapes or host-side schedules).
  """

  name: str
  family: str
  asynchronous: bool
  reads: tuple[str, ...]
  build: Callable[..., Algorithm]
  without_momentum: str | None = None
  summary: str = ""
  array_fields: tuple[str, ...] = ()
  paper: bool = False


def exchange_schedule(config) -> ExchangeSchedule:
  """The exchange schedule of ``config`` (order, speeds, staleness).

  Args:
    config: a validated ``TrainConfig`` (num_workers, exchange_order,
      worker_speeds, max_worker_speed, staleness, seed).

  Returns:
    The ``easgd.asynchrony.schedule.ExchangeSchedule`` of the asynchronous algorithms
    (Algorithms 1-2 of the paper, simulated).
  """
  schedule = _schedule()
  speeds = schedule.resolve_worker_speeds(
      config.num_workers, config.worker_speeds, config.max_worker_speed, config.seed
  )
  return schedule.exchange_schedule(
      config.num_workers, config.exchange_order, speeds, config.staleness
  )


def _elastic_kw(c):
  return dict(num_workers=c.num_workers, **{name: getattr(c, name) for name in _ELASTIC})


def _exchange(c, shapes):
  """The ``exchange`` (``easgd.core.streaming.ExchangeTechniques``) of a config's
  :data:`STREAMING` settings."""
  from easgd.core import streaming

  return streaming.ExchangeTechniques(
      c.fragments,
      c.fragment_layout,
      c.delay,
      streaming.compression_of(c.compression, c.compression_block, c.topk_fraction),
      param_shapes=shapes,
  )


def _push_kw(c):
  return dict(
      num_workers=c.num_workers, tau=c.tau, schedule=exchange_schedule(c), push_timing=c.push_timing
  )


def _spec(
    name,
    family,
    reads,
    build,
    asynchronous_=False,
    without_momentum=None,
    summary="",
    array_fields=(),
    paper=False,
):
  return AlgorithmSpec(
      name,
      family,
      asynchronous_,
      tuple(reads),
      build,
      without_momentum,
      summary,
      tuple(array_fields),
      paper,
  )


def _warmed(c, loss, opt, n, make):
  """``make(num_steps)``, the algorithm, after ``c.sync_warmup_steps`` steps of
  pmean SGD (``easgd.core.warmup``) when that is > 0; its own run is then n - K
  steps long."""
  k = c.sync_warmup_steps
  if not k:
    return make(n)
  from easgd.core import warmup

  return warmup.sync_warmup(
      make(None if n is None else n - k), loss, opt, num_workers=c.num_workers, warmup_steps=k
  )


TABLE: dict[str, AlgorithmSpec] = {
    s.name: s
    for s in (
        _spec(
            "easgd",
            "elastic",
            _ELASTIC + ("curvature", "sync_warmup_steps") + STREAMING,
            lambda c, loss, opt, n, shapes=None: _warmed(
                c,
                loss,
                opt,
                n,
                lambda m: _algorithms().easgd(
                    loss, opt, exchange=_exchange(c, shapes), **_elastic_kw(c)
                ),
            ),
            summary="synchronous EASGD, eq. (5)-(6)",
            array_fields=("tau", "alpha", "beta"),
            paper=True,
        ),
        _spec(
            "pmean_sgd",
            "averaging",
            (),
            lambda c, loss, opt, n, shapes=None: _algorithms().pmean_sgd(
                loss, opt, num_workers=c.num_workers
            ),
            summary="data-parallel SGD, gradients averaged every step",
        ),
        _spec(
            "eamsgd",
            "elastic",
            _ELASTIC + ("delta", "sync_warmup_steps") + STREAMING,
            lambda c, loss, opt, n, shapes=None: _warmed(
                c,
                loss,
                opt,
                n,
                lambda m: _algorithms().eamsgd(
                    loss, opt, momentum=c.delta, exchange=_exchange(c, shapes), **_elastic_kw(c)
                ),
            ),
            without_momentum="easgd",
            summary="synchronous EAMSGD, eq. (7)",
            array_fields=("tau", "alpha", "beta", "delta"),
            paper=True,
        ),
        _spec(
            "async_easgd",
            "elastic",
            _ELASTIC + _ASYNC + OVERLAP,
            lambda c, loss, opt, n, shapes=None: _simulation().async_easgd(
                loss, opt, schedule=exchange_schedule(c), delay=c.delay, **_elastic_kw(c)
            ),
            asynchronous_=True,
            summary="asynchronous EASGD, Algorithm 1",
            array_fields=("tau", "alpha", "beta", "exchange_order"),
            paper=True,
        ),
        _spec(
            "async_eamsgd",
            "elastic",
            _ELASTIC + _ASYNC + ("delta",) + OVERLAP,
            lambda c, loss, opt, n, shapes=None: _simulation().async_eamsgd(
                loss,
                opt,
                schedule=exchange_schedule(c),
                momentum=c.delta,
                delay=c.delay,
                **_elastic_kw(c),
            ),
            asynchronous_=True,
            without_momentum="async_easgd",
            summary="asynchronous EAMSGD, Algorithm 2",
            array_fields=("tau", "alpha", "beta", "delta", "exchange_order"),
            paper=True,
        ),
        _spec(
            "downpour",
            "push",
            _PUSH,
            lambda c, loss, opt, n, shapes=None: _downpour_family().downpour(
                loss, opt, **_push_kw(c)
            ),
            asynchronous_=True,
            summary="DOWNPOUR (push every tau steps)",
            array_fields=_PUSH_ARRAYS,
            paper=True,
        ),
        _spec(
            "mdownpour",
            "push",
            _PUSH + ("delta",),
            lambda c, loss, opt, n, shapes=None: _downpour_family().mdownpour(
                loss, opt, momentum=c.delta, **_push_kw(c)
            ),
            asynchronous_=True,
            without_momentum="downpour",
            summary="DOWNPOUR with Nesterov momentum on the master",
            array_fields=_PUSH_ARRAYS + ("delta",),
            paper=True,
        ),
        _spec(
            "adownpour",
            "push",
            _PUSH,
            lambda c, loss, opt, n, shapes=None: _downpour_family().adownpour(
                loss, opt, **_push_kw(c)
            ),
            asynchronous_=True,
            summary="DOWNPOUR with a running average 1/(t+1)",
            array_fields=_PUSH_ARRAYS,
            paper=True,
        ),
        _spec(
            "mvadownpour",
            "push",
            _PUSH + ("average_rate",),
            lambda c, loss, opt, n, shapes=None: _downpour_family().mvadownpour(
                loss, opt, average_rate=c.average_rate, **_push_kw(c)
            ),
            asynchronous_=True,
            summary="DOWNPOUR with a constant-rate moving average",
            array_fields=_PUSH_ARRAYS + ("average_rate",),
            paper=True,
        ),
        _spec(
            "sgd",
            "sequential",
            (),
            lambda c, loss, opt, n, shapes=None: _baselines().sgd(
                loss, opt, num_workers=c.num_workers
            ),
            summary="sequential SGD",
            paper=True,
        ),
        _spec(
            "msgd",
            "sequential",
            ("delta",),
            lambda c, loss, opt, n, shapes=None: _baselines().msgd(
                loss, opt, num_workers=c.num_workers, momentum=c.delta
            ),
            without_momentum="sgd",
            summary="sequential Nesterov momentum SGD",
            array_fields=("delta",),
            paper=True,
        ),
        _spec(
            "asgd",
            "sequential",
            (),
            lambda c, loss, opt, n, shapes=None: _baselines().asgd(
                loss, opt, num_workers=c.num_workers
            ),
            summary="averaged SGD, rate 1/(t+1)",
            paper=True,
        ),
        _spec(
            "mvasgd",
            "sequential",
            ("average_rate",),
            lambda c, loss, opt, n, shapes=None: _baselines().mvasgd(
                loss, opt, num_workers=c.num_workers, average_rate=c.average_rate
            ),
            summary="SGD with a constant-rate moving average",
            array_fields=("average_rate",),
            paper=True,
        ),
        _spec(
            "local_sgd",
            "averaging",
            ("tau", "sync_warmup_steps"),
            lambda c, loss, opt, n, shapes=None: _warmed(
                c,
                loss,
                opt,
                n,
                lambda m: _baselines().local_sgd(
                    loss, opt, num_workers=c.num_workers, tau=c.tau, num_steps=m
                ),
            ),
            summary="local SGD: workers averaged every tau steps and at the end",
            array_fields=("tau",),
        ),
        _spec(
            "diloco",
            "averaging",
            ("tau", "outer_learning_rate", "outer_momentum", "sync_warmup_steps"),
            lambda c, loss, opt, n, shapes=None: _warmed(
                c,
                loss,
                opt,
                n,
                lambda m: _baselines().diloco(
                    loss,
                    opt,
                    num_workers=c.num_workers,
                    tau=c.tau,
                    num_steps=m,
                    outer_learning_rate=c.outer_learning_rate,
                    outer_momentum=c.outer_momentum,
                ),
            ),
            summary="DiLoCo: outer Nesterov step every tau steps and at the end",
            array_fields=("tau", "outer_learning_rate", "outer_momentum"),
        ),
        _spec(
            "streaming_diloco",
            "averaging",
            ("tau", "alpha", "outer_learning_rate", "outer_momentum") + STREAMING,
            lambda c, loss, opt, n, shapes=None: _streaming_diloco().streaming_diloco(
                loss,
                opt,
                num_workers=c.num_workers,
                tau=c.tau,
                num_steps=n,
                outer_learning_rate=c.outer_learning_rate,
                outer_momentum=c.outer_momentum,
                alpha=c.resolved_alpha,
                exchange=_exchange(c, shapes),
            ),
            summary="Streaming DiLoCo: fragments synced in turn, merged V steps later",
            array_fields=("outer_learning_rate", "outer_momentum"),
        ),
    )
}


class CenterUpdate(NamedTuple):
  """When the model an algorithm returns first takes in its workers' training.

  Attributes:
    local_step: the first local step of a worker (its clock, counted from the
      algorithm's own start, after any synchronous warm-up) whose exchange
      moves the returned model away from the initial parameters; None when no
      exchange ever moves it.
    why: the rule, one clause (for error messages).
  """

  local_step: int | None
  why: str


def _elastic_update(c) -> CenterUpdate:
  if c.resolved_alpha == 0:
    return CenterUpdate(None, "its elastic force alpha * (x^i - center) is 0")
  return CenterUpdate(
      c.tau, "at step 0 every worker still equals the center, the " "next exchange is at step tau"
  )


def _push_update(c) -> CenterUpdate:
  if _schedule().push_offset(c.push_timing):  # "full_period": after tau - 1, ...
    return CenterUpdate(c.tau - 1, "the first push follows local step tau - 1")
  return CenterUpdate(0, "the first push follows local step 0")


_CENTER_UPDATES: dict[str, Callable[[Any], CenterUpdate]] = {
    "elastic": _elastic_update,
    "push": _push_update,
    # pmean SGD trains its one model every step; local SGD and DiLoCo end on an
    # average (``num_steps``), so their center holds every step
    "averaging": lambda c: CenterUpdate(0, "it averages at the run's last step"),
    "sequential": lambda c: CenterUpdate(0, "it trains its one model every step"),
}
"""The rule of :func:`center_update`, by family (every family of :data:`FAMILIES`)."""


def center_update(config) -> CenterUpdate:
  """When ``config``'s returned model (``Algorithm.center``: what the trainer
  evaluates and exports) first takes in training; the rule is the family's.

  elastic (EASGD, EAMSGD, sync and async): every worker starts at the center,
  so the exchange at a worker's local step 0 moves nothing; the first that
  moves the center is at local step tau (Algorithm 1: tau divides t^i), and
  none ever does with alpha = 0. push (DOWNPOUR family): the first push, after
  local step 0 ("authors") or tau - 1 ("full_period"), carries a step's update
  to the master. averaging and sequential: step 0 (one model trained every
  step, or a final average at the run's last step).

  The synchronous warm-up's K steps train the shared model, not the
  algorithm's workers: at K the algorithm starts with every worker and the
  center at that model, its clock at 0 (``easgd.core.warmup``), so the rule counts
  from K. A run gives some worker at least ``total_steps - sync_warmup_steps``
  local steps of the algorithm: every worker exactly that many on the synchronous
  runtime; the fastest worker (speed max k_i, one step every slot) of the
  simulated asynchronous schedule; and on the real runtimes, whose clocks sum
  to total_steps * num_workers, at least one worker. So the returned model is
  trained iff ``local_step`` is not None and below that count
  (``TrainConfig.resolve`` refuses the rest).

  Args:
    config: a ``TrainConfig`` whose fields have been range-checked.

  Returns:
    A :class:`CenterUpdate`.
  """
  return _CENTER_UPDATES[TABLE[config.algorithm].family](config)


ALGORITHMS = tuple(TABLE)
"""Every algorithm name, in the table's order."""

DEFAULT_COMPARISON = ("easgd", "pmean_sgd")
"""What ``easgd compare`` runs when no names are given: EASGD against the
synchronous baseline it is measured against (the README's main job)."""

PAPER_METHODS = {
    "EASGD": ("easgd", "async_easgd"),
    "EAMSGD": ("eamsgd", "async_eamsgd"),
}
"""The algorithms that are the paper's EASGD and EAMSGD: the synchronous rules (eq. (5)-(7))
and the asynchronous ones (Algorithms 1 and 2); the protocol's claims measure these
(``easgd.protocol.claims``)."""


def names_where(predicate: Callable[[AlgorithmSpec], bool]) -> tuple[str, ...]:
  """The names of the algorithms whose spec satisfies ``predicate``."""
  return tuple(name for name, s in TABLE.items() if predicate(s))


def readers(field: str) -> tuple[str, ...]:
  """The algorithms that read the config field ``field`` (of :data:`ALGORITHM_FIELDS`)."""
  return names_where(lambda s: field in s.reads)


MOMENTUM_ALGORITHMS = names_where(lambda s: s.without_momentum is not None)
"""Algorithms whose Nesterov momentum is built in (``config.delta``)."""

ASYNC_ALGORITHMS = names_where(lambda s: s.asynchronous)
"""Algorithms simulated with an exchange schedule (``easgd.asynchrony.simulation``)."""


def reads_table() -> str:
  """The algorithm-specific fields each algorithm reads (its spec's ``reads``),
  as the text table of this module's docstring.

  Returns:
    One line (wrapped) per distinct ``reads``: the algorithms that have it,
    then its fields (alpha and beta shown as alpha/beta; "(none)" for none).
  """
  groups: dict[tuple[str, ...], list[str]] = {}
  for spec in TABLE.values():
    groups.setdefault(spec.reads, []).append(spec.name)
  lines = []
  for reads, names in groups.items():
    fields = ", ".join(reads).replace("alpha, beta", "alpha/beta") or "(none)"
    lines.append(
        textwrap.fill(
            fields, 80, initial_indent=f"  {', '.join(names):<26}  ", subsequent_indent=" " * 30
        )
    )
  return "\n".join(lines)


__doc__ = __doc__.replace("{reads_table}", reads_table())


def field_array(field: str, values) -> np.ndarray:
  """The values of an array field (``AlgorithmSpec.array_fields``) of n
  configurations, as the array a program passes to ``build``.

  Args:
    field: an array field of some algorithm.
    values: its n config values.

  Returns:
    A NumPy array [n]: int32 for ``tau``; int32 indices into the names'
    tuple for a named field (:data:`CODED_FIELDS`: ``exchange_order`` into
    ``EXCHANGE_ORDERS``); float32 for the others.

  Raises:
    ValueError: a name its tuple does not hold (one line, naming the field).
  """
  import numpy as np

  from easgd.asynchrony import names

  if field in CODED_FIELDS:
    allowed = getattr(names, CODED_FIELDS[field])
    unknown = [v for v in values if v not in allowed]
    if unknown:
      raise ValueError(f"unknown {field} {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return np.asarray([allowed.index(v) for v in values], np.int32)
  return np.asarray(values, np.int32 if field == "tau" else np.float32)


def array_fields_of(config) -> tuple[str, ...]:
  """The fields ``config``'s build may take as JAX arrays (``AlgorithmSpec.array_fields``),
  without ``tau`` where the config sets fragments, delay or compression (:data:`STREAMING`:
  the host schedules the fragments from a Python tau)."""
  fields = TABLE[config.algorithm].array_fields
  defaults = {f.name: f.default for f in dataclasses.fields(config)}
  if any(getattr(config, n) != defaults[n] for n in STREAMING if n in defaults):
    return tuple(f for f in fields if f != "tau")
  return fields


def make_algorithm(
    config,
    loss_fn,
    optimizer: optax.GradientTransformation,
    num_steps: int | None = None,
    param_shapes=None,
) -> Algorithm:
  """The algorithm ``config.algorithm`` with the local optimizer ``optimizer``.

  Args:
    config: a validated :class:`~easgd.settings.config.TrainConfig`.
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the local optimizer (``easgd.runtimes.optimizers.make_optimizer``).
    num_steps: the run's total number of steps (local SGD and DiLoCo average
      at the last one); None for a run of unknown length.
    param_shapes: the parameters (arrays or ``jax.ShapeDtypeStruct``): read where the
      config sets fragments, delay or compression (:data:`STREAMING`), whose
      fragments and bytes it fixes; None otherwise.

  Returns:
    An :class:`~easgd.core.base.Algorithm`.

  Raises:
    KeyError: a name that is not in :data:`TABLE` (``TrainConfig.validate``
      refuses it first, with the allowed names).
  """
  return TABLE[config.algorithm].build(config, loss_fn, optimizer, num_steps, param_shapes)


def simulated_ticks(num_steps: int, config) -> float:
  """Simulated time in ticks after ``num_steps`` trainer steps of ``config``.

  Asynchronous algorithms: one step is one slot, ``num_steps / K`` ticks with
  K the largest worker speed (``easgd.asynchrony.simulation``). Synchronous ones wait
  for the slowest worker at every step: ``num_steps / min_i k_i`` ticks (with
  the default speeds 1, a step is a tick for every algorithm).
  """
  speeds = _schedule().resolve_worker_speeds(
      config.num_workers, config.worker_speeds, config.max_worker_speed, config.seed
  )
  if TABLE[config.algorithm].asynchronous:
    return num_steps / max(speeds)
  return num_steps / min(speeds)


def describe(name: str) -> dict[str, Any]:
  """The spec of ``name`` as plain data (for logs and summaries)."""
  s = TABLE[name]
  return dict(
      name=s.name,
      family=s.family,
      asynchronous=s.asynchronous,
      reads=list(s.reads),
      without_momentum=s.without_momentum,
      array_fields=list(s.array_fields),
  )
