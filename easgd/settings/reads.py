"""Which settings a run reads, declared once, and the one refusal of the others.

A :class:`Reads` rule names some fields of a config dataclass and, for a
config, which of them its run reads (e.g. the algorithm table's
``AlgorithmSpec.reads``). A field set away from its default that some rule
says is not read is refused with that rule's one-line message
(:func:`refuse_unread`), never silently ignored. ``TrainConfig``
(:data:`TRAIN_RULES`; ``compare`` and the protocol's arms through
``TrainConfig.unread_fields`` and ``for_algorithm``) and ``SweepConfig`` use
it. Imports no JAX.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Collection, Mapping, Sequence

from easgd.methods import registry
from easgd.settings import runtime_table
from easgd.tasks import datasets
from easgd.tasks.names import BATCH_NORM_MODELS


@dataclasses.dataclass(frozen=True)
class Reads:
  """Who reads some settings.

  Attributes:
    fields: the config fields the rule is about, in the order they are refused.
    read: ``read(config)``, the fields of ``fields`` that ``config``'s run reads.
    message: ``message(config, name, value)``, the one-line refusal of field
      ``name`` set to ``value`` that the run does not read.
    one_setting: ``{field: other}``: ``field`` is not reported beside ``other``
      (alpha and beta are one setting, beta = num_workers * alpha).
  """

  fields: tuple[str, ...]
  read: Callable[[Any], Collection[str]]
  message: Callable[[Any, str, Any], str]
  one_setting: Mapping[str, str] = dataclasses.field(default_factory=dict)


@functools.cache
def defaults(cls) -> dict[str, Any]:
  """``{field: default}`` of the dataclass ``cls`` (fields with a plain default)."""
  return {f.name: f.default for f in dataclasses.fields(cls)}


def differs(config, name: str) -> bool:
  """Whether field ``name`` of ``config`` is set away from its default (a tuple and a
  list of the same values are equal)."""
  value, default = getattr(config, name), defaults(type(config))[name]
  if isinstance(value, (tuple, list)) or isinstance(default, (tuple, list)):
    return tuple(value) != tuple(default)
  return value != default


def _unread(config, rules: Sequence[Reads], order) -> dict[str, Reads]:
  found: dict[str, Reads] = {}
  for rule in rules:
    read = rule.read(config)
    for name in rule.fields:
      if name in found or name in read or not differs(config, name):
        continue
      if rule.one_setting.get(name) in found:
        continue
      found[name] = rule
  return found if order is None else {n: found[n] for n in order if n in found}


def unread(config, rules: Sequence[Reads], order: Sequence[str] | None = None) -> dict[str, Any]:
  """The fields set away from their default that ``config``'s run does not read.

  Args:
    config: a config dataclass.
    rules: its rules; a field is unread when any rule that names it says so.
    order: the order of the result (e.g. the dataclass's fields); None: the
      rules' order.

  Returns:
    ``{field: value}`` (empty when every setting is read).
  """
  return {name: getattr(config, name) for name in _unread(config, rules, order)}


def refuse_unread(
    config, rules: Sequence[Reads], error: type[Exception], order: Sequence[str] | None = None
) -> None:
  """Refuses the first field of :func:`unread` with its rule's message.

  Raises:
    error: ``rule.message(config, name, value)`` of the first unread field.
  """
  for name, rule in _unread(config, rules, order).items():
    raise error(rule.message(config, name, getattr(config, name)))


def is_read(config, name: str, rules: Sequence[Reads]) -> bool:
  """Whether ``config``'s run reads field ``name``: no rule that names it says not."""
  return all(name in r.read(config) for r in rules if name in r.fields)


# -- the rules of TrainConfig, in the order they are refused ----------------
def _not_read_by_algorithm(c, name, value) -> str:
  readers = registry.readers(name)
  return (
      f"{name}={value!r} is not read by algorithm {c.algorithm!r}; leave it at "
      f"its default {defaults(type(c))[name]!r}, or use an algorithm that reads it: "
      f"{', '.join(readers)}"
  )


def _read_by_algorithm(c) -> tuple[str, ...]:
  read = registry.TABLE[c.algorithm].reads
  # an algorithm that reads alpha but not beta (streaming_diloco): alpha given
  # cleared beta to None (TrainConfig.replace), which is alpha's setting, not beta's
  return read + ("beta",) if "alpha" in read and c.beta is None else read


ALGORITHM = Reads(
    registry.ALGORITHM_FIELDS,
    _read_by_algorithm,
    _not_read_by_algorithm,
    one_setting={"beta": "alpha"},  # alpha given: beta was cleared with it
)
"""The algorithm-specific fields: read by the algorithms whose ``reads`` name them."""

MOMENTUM_OPTIMIZERS = ("momentum", "nesterov")
"""The local optimizers that read ``momentum``."""


def _momentum_message(c, name, value) -> str:
  spec = registry.TABLE[c.algorithm]
  hint = "use optimizer 'momentum' or 'nesterov'" + (
      f", or delta for {c.algorithm}'s own Nesterov momentum"
      if spec.without_momentum
      else f" (the algorithms with their own Nesterov momentum take delta: "
      f"{', '.join(registry.MOMENTUM_ALGORITHMS)})"
  )
  return f"momentum={value} has no effect with optimizer {c.optimizer!r}; {hint}"


MOMENTUM = Reads(
    ("momentum",),
    lambda c: ("momentum",) if c.optimizer in MOMENTUM_OPTIMIZERS else (),
    _momentum_message,
)

METHOD_RULES = (ALGORITHM, MOMENTUM)
"""What the algorithm and its local optimizer read (the settings ``compare`` shows)."""

DATA_DIR = Reads(
    ("data_dir",),
    lambda c: ("data_dir",) if datasets.reads_data_dir(c.dataset) else (),
    lambda c, name, value: (
        f"data_dir={value!r} is not read by dataset {c.dataset!r} "
        "(generated or shipped); allowed: data_dir None"
    ),
)
"""``data_dir``: read by the data sets whose row names one (``easgd.tasks.datasets``)."""

_OTHER_TRAIN_RULES = (
    Reads(
        ("fragment_layout",),
        lambda c: ("fragment_layout",) if c.fragments > 1 else (),
        lambda c, name, value: (
            f"fragment_layout={value!r} has no effect with fragments {c.fragments}; "
            "use fragments > 1"
        ),
    ),
    Reads(
        ("compression_block", "topk_fraction"),
        lambda c: {"int8": ("compression_block",), "int4": ("compression_block",)}.get(
            c.compression, ("topk_fraction",) if c.compression == "topk" else ()
        ),
        lambda c, name, value: (
            f"{name}={value!r} has no effect with compression {c.compression!r}; use "
            + (
                "compression 'int8' or 'int4'"
                if name == "compression_block"
                else "compression 'topk'"
            )
        ),
    ),
    Reads(
        ("lr_decay_factor",),
        lambda c: ("lr_decay_factor",) if c.lr_schedule == "step" else (),
        lambda c, name, value: (
            f"lr_decay_factor={value} has no effect with lr_schedule "
            f"{c.lr_schedule!r}; use lr_schedule 'step'"
        ),
    ),
    Reads(
        ("bn_stats_examples",),
        lambda c: ("bn_stats_examples",)
        if c.task is not None or c.model in BATCH_NORM_MODELS
        else (),
        lambda c, name, value: (
            f"bn_stats_examples={value} has no effect with model {c.model!r} (no "
            f"BatchNorm); allowed models: {', '.join(BATCH_NORM_MODELS)}"
        ),
    ),
    DATA_DIR,
)


def has_schedule(c) -> bool:
  """Whether the learning rate changes over the run (a decay or a warm-up): what
  ``lr_schedule_unit`` counts."""
  return c.lr_schedule != "constant" or c.warmup_epochs > 0


def reads_reference_batch(c) -> bool:
  """Whether ``lr_reference_batch`` is read: by ``lr_scaling`` 'linear' or 'sqrt'
  and by a schedule counted in ``lr_schedule_unit`` 'reference_steps'."""
  return c.lr_scaling != "none" or (c.lr_schedule_unit == "reference_steps" and has_schedule(c))


def _read_by_runtime(name: str, c) -> tuple[str, ...]:
  return (name,) if name in runtime_table.TABLE[c.runtime].reads else ()


def _async_read_by_runtime(name: str, c) -> tuple[str, ...]:
  """``(name,)`` unless an asynchronous algorithm runs on a runtime without it."""
  spec = runtime_table.TABLE[c.runtime]
  if registry.TABLE[c.algorithm].asynchronous and name not in spec.async_reads:
    return ()
  return (name,)


RUNTIME_RULES = (
    Reads(
        registry.SCHEDULE_FIELDS,
        lambda c: registry.SCHEDULE_FIELDS
        if runtime_table.TABLE[c.runtime].simulated_schedule
        else (),
        runtime_table.schedule_refusal,
    ),
    *(
        Reads((name,), functools.partial(_read_by_runtime, name), runtime_table.setting_refusal)
        for name in runtime_table.SETTINGS
    ),
    *(
        Reads(
            (name,),
            functools.partial(_async_read_by_runtime, name),
            runtime_table.async_setting_refusal,
        )
        for name in runtime_table.ASYNC_SETTINGS
    ),
)
"""The runtimes' settings: read as the runtime table's rows say (``easgd.settings.runtime_table``)."""

TRAIN_RULES = (
    *METHOD_RULES,
    *_OTHER_TRAIN_RULES,
    *RUNTIME_RULES,
    Reads(
        ("lr_schedule_unit",),
        lambda c: ("lr_schedule_unit",) if has_schedule(c) else (),
        lambda c, name, value: (
            f"lr_schedule_unit={value!r} has no effect with lr_schedule 'constant' and "
            "warmup_epochs 0 (no schedule to count); use lr_schedule 'step' or 'cosine', "
            "or warmup_epochs > 0"
        ),
    ),
    Reads(
        ("lr_reference_batch",),
        lambda c: ("lr_reference_batch",) if reads_reference_batch(c) else (),
        lambda c, name, value: (
            f"lr_reference_batch={value!r} has no effect with lr_scaling 'none' and "
            f"lr_schedule_unit {c.lr_schedule_unit!r}; use lr_scaling 'linear' or 'sqrt' "
            "or lr_schedule_unit 'reference_steps', or leave it None"
        ),
    ),
)
"""Who reads ``TrainConfig``'s settings, in the order they are refused."""
