"""The comparison protocol's configuration: arms, grids, seeds, budget, targets.

:class:`ProtocolConfig` and its :class:`Arm` s (each field's meaning and unit in its help
text), checked in Python before any data is loaded or anything compiled
(:meth:`ProtocolConfig.validate`, ``ProtocolError``); a protocol file defines
``get_protocol() -> ProtocolConfig`` (:func:`load_protocol_file`). See
docs/guides/protocol.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from easgd._util import checks
from easgd._util.flags import REQUIRED, call_config_file, option
from easgd.methods import registry
from easgd.settings import runtime_table
from easgd.settings.config import ConfigError, TrainConfig
from easgd.settings.fields import FLOAT32_TINY, MAX_REAL

if TYPE_CHECKING:  # easgd.protocol.networks raises this module's ProtocolError
  from easgd.protocol.networks import Network, TwoLevelNetwork


class ProtocolError(ConfigError):
  """A protocol setting is outside its allowed range (one-line message)."""


_int = functools.partial(checks.integer, error=ProtocolError)
_real = functools.partial(checks.real, error=ProtocolError)

RESULTS_JSON = "results.json"
"""The file a protocol's results are written to (``easgd protocol --workdir``)."""

FIXED_BY_BASE = (
    "algorithm",
    "learning_rate",
    "seed",
    "validation_examples",
    "dataset",
    "data_dir",
    "model",
    "param_dtype",
    "compute_dtype",
    "crop_size",
    "random_flip",
    "task",
    "task_args",
    "runtime",
)
"""Fields an arm may not override: its algorithm is ``Arm.algorithm``; one task
(data set, split, model), and one runtime for every arm (the programs share
them); the rate and seed come from the protocol."""


MIN_SEEDS = 3
"""Seeds per grid point and per reported rerun (an interval needs n >= 3)."""


DEFAULT_TARGETS = (0.3, 0.2)
"""The test errors of "time to target" of a task with a per-example "correct"
(``ProtocolConfig.targets`` None)."""

LOWER_IS_BETTER = ("error", "loss")
"""The metrics whose direction is known: lower is better."""

BETTER = ("lower", "higher")
"""The values of ``ProtocolConfig.select_better``."""


def log_grid(low: float, high: float, num: int) -> tuple[float, ...]:
  """``num`` learning rates log-spaced from ``low`` to ``high`` (both included),
  rounded to 4 significant digits, e.g. ``log_grid(0.01, 1, 5)`` = (0.01,
  0.03162, 0.1, 0.3162, 1.0).

  Raises:
    ProtocolError: low or high not a finite real > 0, high < low, num < 1.
  """
  low = _real("learning-rate grid low", low, 0, open_low=True)
  high = _real("learning-rate grid high", high, low)
  num = _int("learning-rate grid size", num, 1)
  values = np.geomspace(low, high, num) if num > 1 else np.asarray([low])
  return tuple(float(f"{v:.4g}") for v in values)


@dataclasses.dataclass(frozen=True)
class Arm:
  """One algorithm in one setting, and how its learning rate is chosen.

  Every field carries its meaning in its help text
  (``dataclasses.fields(Arm)[i].metadata["help"]``; the protocol guide's table of the
  protocol's fields is printed from it by ``scripts/protocol_fields.py``).
  """

  name: str = option(
      REQUIRED,
      "the arm's label, unique in the protocol (e.g. " "'easgd tau=4'); keys results.json's arms",
  )
  algorithm: str = option(REQUIRED, "a name of easgd.methods.registry.ALGORITHMS")
  overrides: Mapping[str, Any] = option(
      REQUIRED,
      "TrainConfig fields that differ from the protocol's base (tau, "
      "num_workers, global_batch_size, num_epochs, delta, beta, sync_warmup_steps, "
      "lr_scaling, ...); settings the algorithm does not read are reset to their "
      "defaults (TrainConfig.for_algorithm) before the overrides apply; not "
      f"allowed: {', '.join(FIXED_BY_BASE)}",
      factory=dict,
  )
  learning_rates: tuple[float, ...] = option(
      (),
      "the grid of base learning rates (learning_rate; the run's eta is it "
      "times lr_scale), log-spaced (log_grid); the best is chosen on the "
      "validation split; empty with lr_from",
  )
  lr_from: str | None = option(
      None,
      "instead of a grid, the arm whose chosen base rate this arm takes "
      "(then its own lr_scaling applies, e.g. the linear scaling rule from a "
      "1-worker arm); None: the arm's own grid",
  )

  def config(self, base: TrainConfig) -> TrainConfig:
    """The arm's ``TrainConfig`` (learning rate and seed still the base's)."""
    config, _ = base.for_algorithm(self.algorithm)
    return config.replace(**dict(self.overrides))


@dataclasses.dataclass(frozen=True)
class ProtocolConfig:
  """A comparison: arms, learning-rate grids, seeds, budget, targets, networks.

  Every field carries its meaning and unit in its help text
  (``dataclasses.fields(ProtocolConfig)[i].metadata["help"]``; the protocol guide's
  table of the protocol's fields is printed from it by
  ``scripts/protocol_fields.py``). :meth:`validate` checks every value.
  """

  name: str = option(REQUIRED, "the experiment's name, without '/' (files, titles)")
  description: str = option(
      REQUIRED, "what it asks, in a sentence or two (written to " "results.md)"
  )
  base: TrainConfig = option(
      REQUIRED,
      "the TrainConfig every arm starts from: the task (its import path and "
      "task_args, or the built-in data set and model), batch, "
      "num_epochs (the budget) and validation_examples > 0 (the held-out split the "
      "rates are chosen on)",
  )
  arms: tuple[Arm, ...] = option(REQUIRED, "the arms (Arm), at least one")
  tune_seeds: tuple[int, ...] = option(
      (0, 1, 2),
      f"seeds of the tuning runs, at least {MIN_SEEDS}; every rate of a " "grid runs with each",
  )
  report_seeds: tuple[int, ...] = option(
      (100, 101, 102),
      f"fresh seeds of the reported reruns at the chosen rate, at "
      f"least {MIN_SEEDS}, none of them a tuning seed; only these see the test set",
  )
  eval_every_steps: int = option(
      25,
      "the center is evaluated every this many local steps (and at the start " "and the last step)",
  )
  targets: tuple[float, ...] | None = option(
      None,
      'test errors (fractions in (0, 1)) of "time to target"; None: '
      f"{DEFAULT_TARGETS} for a task with a per-example 'correct', none for a task "
      "without (which has no test error; a tuple is refused there)",
  )
  networks: tuple[Network | TwoLevelNetwork, ...] | None = option(
      None,
      "the networks (Network: one link; TwoLevelNetwork: inside and between "
      "nodes) of the modelled wall-clock time to each target; None: 1GbE and 100GbE "
      "(GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET) for a task with a per-example "
      "'correct', none for a task without (a tuple is refused there)",
  )
  select_metric: str | None = option(
      None,
      "the validation metric the rates are chosen on and the best evaluation is read at: "
      "'error' (1 - the mean of the task's per-example 'correct'), 'loss', or another "
      "metric its evaluate returns (its mean over the examples); None: 'error' for a task "
      "with 'correct', else 'loss'",
  )
  select_better: str | None = option(
      None,
      "whether a 'lower' or 'higher' select_metric is better: required with a metric "
      "other than 'error' and 'loss' (for which it is 'lower'); None: 'lower'",
  )
  max_grid_extensions: int = option(
      2,
      "rates an arm's grid may be extended by: while the chosen rate is the grid's "
      "lowest or highest, one more rate one log step beyond it is tuned on the same "
      "seeds, until the choice is interior, the new rate diverges or collapses on every "
      "tuning seed, or this many were added (results.json: grid_extended, "
      "grid_extension); 0 = never",
  )
  divergence_factor: float = option(
      10.0,
      "a run whose center validation loss is non-finite or exceeds this "
      "factor times its initial value at its last evaluation counts as diverged; one "
      "that ends finite with its loss at or above its start, or a classifier's error "
      "within 10% of chance (COLLAPSE_MARGIN), as collapsed (easgd.run.compare.collapsed); "
      "either's score when rates are compared is the worst: an error of 1, else an infinite "
      "select_metric, lower or higher as select_better; > 1",
  )
  configs_per_batch: int | None = option(
      None,
      "configurations vmapped together inside a program (easgd.sweeps.curves); "
      "None: all of a program's configurations",
  )
  eval_chunk: int = option(500, "examples per forward pass of an evaluation")

  def arm(self, name: str) -> Arm:
    """The arm called ``name``; ProtocolError if there is none."""
    for a in self.arms:
      if a.name == name:
        return a
    checks.choice("arm", name, [a.name for a in self.arms], error=ProtocolError)
    raise AssertionError  # unreachable: choice raised

  def validate(self) -> "ProtocolConfig":
    """Checks every value; returns self.

    Raises:
      ProtocolError (a ConfigError): naming the first bad value, or
        ConfigError from an arm's ``TrainConfig``.
    """
    if not isinstance(self.name, str) or not self.name or "/" in self.name:
      raise ProtocolError(f"name must be a non-empty string without '/', got {self.name!r}")
    if not isinstance(self.description, str):
      raise ProtocolError(f"description must be a string, got {self.description!r}")
    for field in ("arms", "tune_seeds", "report_seeds", "targets", "networks"):
      value = getattr(self, field)
      if not isinstance(value, tuple) and not (value is None and field in ("targets", "networks")):
        raise ProtocolError(f"{field} must be a tuple, got {type(value).__name__} " f"{value!r}")
    if not isinstance(self.base, TrainConfig):
      raise ProtocolError(f"base must be an easgd.TrainConfig, got {type(self.base).__name__}")
    _int("max_grid_extensions", self.max_grid_extensions, 0, 64, what="rates added to a grid")
    base = self.base.validate()
    _int(
        "validation_examples (of base)",
        base.validation_examples,
        1,
        what="the rates are chosen on a held-out split",
    )
    if base.runtime != runtime_table.DEFAULT:
      raise ProtocolError(
          f"runtime {base.runtime!r}: the protocol simulates the "
          "workers in one program; allowed: runtime 'spmd'"
      )
    for field, seeds in (("tune_seeds", self.tune_seeds), ("report_seeds", self.report_seeds)):
      if not isinstance(seeds, tuple) or len(seeds) < MIN_SEEDS:
        raise ProtocolError(
            f"{field} must be a tuple of at least {MIN_SEEDS} seeds "
            f"(a 95% interval needs n >= {MIN_SEEDS}), got {seeds!r}"
        )
      for s in seeds:
        _int(f"{field} entry", s, 0, 2**32 - 1)
      if len(set(seeds)) != len(seeds):
        raise ProtocolError(f"{field} has a seed twice: {seeds!r}")
    shared = sorted(set(self.tune_seeds) & set(self.report_seeds))
    if shared:
      raise ProtocolError(
          f"report_seeds must be fresh: {shared} also tune the rates; "
          "give the reruns seeds the tuning never used"
      )
    _int("eval_every_steps", self.eval_every_steps, 1)
    self._validate_targets()
    self._validate_selection()
    _real("divergence_factor", self.divergence_factor, 1, open_low=True)
    if self.configs_per_batch is not None:
      _int("configs_per_batch", self.configs_per_batch, 1)
    _int("eval_chunk", self.eval_chunk, 1)
    self._validate_arms(base)
    return self

  def _validate_targets(self) -> None:
    if self.targets is not None:
      if not self.targets:
        raise ProtocolError("targets must hold at least one test error (or be None)")
      for t in self.targets:
        _real("targets entry (test error)", t, 0, 1, open_low=True, open_high=True)
      if len(set(self.targets)) != len(self.targets):
        raise ProtocolError(f"targets has a test error twice: {self.targets!r}")
    if self.networks is None:
      return
    if not self.networks:
      raise ProtocolError("networks must hold at least one Network (or be None)")
    from easgd.protocol.networks import Network, TwoLevelNetwork

    for n in self.networks:
      if not isinstance(n, (Network, TwoLevelNetwork)):
        raise ProtocolError(
            "networks entries must be easgd.protocol.networks.Network or TwoLevelNetwork, "
            f"got {n!r}"
        )
      n.validate()
    names = [n.name for n in self.networks]
    if len(set(names)) != len(names):
      raise ProtocolError(
          f"two networks share a name: {names}; the modelled times are " "keyed by it"
      )

  def _validate_selection(self) -> None:
    metric, better = self.select_metric, self.select_better
    if metric is not None and (not isinstance(metric, str) or not metric):
      raise ProtocolError(
          f"select_metric must be a metric's name (e.g. 'error', 'loss') or None, got {metric!r}"
      )
    if metric == "correct":
      raise ProtocolError(
          "select_metric 'correct': the rates are chosen on the error, 1 - the mean of "
          "'correct'; allowed: select_metric 'error'"
      )
    if better is not None:
      checks.choice("select_better", better, BETTER, error=ProtocolError)
      if metric is None:
        raise ProtocolError(
            f"select_better {better!r} without select_metric: the default metric ('error' "
            "or 'loss') is better lower; give select_better with select_metric only"
        )
    if metric in LOWER_IS_BETTER and better == "higher":
      raise ProtocolError(
          f"select_better 'higher' for select_metric {metric!r}: a lower {metric} is "
          "better; allowed: select_better 'lower' or None"
      )
    if metric is not None and metric not in LOWER_IS_BETTER and better is None:
      raise ProtocolError(
          f"select_metric {metric!r} needs its direction: select_better 'lower' or 'higher'"
      )

  def for_task(self, metrics: Sequence[str]) -> "ProtocolConfig":
    """The protocol resolved for a task whose ``evaluate`` returns ``metrics``:
    ``select_metric``, ``select_better``, ``targets`` and ``networks`` given
    their values (class docstring's fields).

    Args:
      metrics: the names of the per-example metrics of the task's ``evaluate``
        (``easgd.tasks.task.check_task``'s ``metrics``).

    Returns:
      A copy with those four fields set (none of them None).

    Raises:
      ProtocolError: a setting the task cannot use: ``select_metric`` not among
        its metrics ('error' without 'correct'), a metric of the task named
        'error' (the protocol's own name), or ``targets`` or ``networks``
        given for a task without 'correct' (it has no test error to reach).
    """
    from easgd.protocol.networks import DEFAULT_NETWORKS

    classifier = "correct" in metrics
    if "error" in metrics:  # the protocol's own name, with or without a 'correct'
      raise ProtocolError(
          f"the task's evaluate returns {list(metrics)}, among them 'error', the name the "
          "protocol keeps for 1 - the mean of a per-example 'correct'; allowed: the task's "
          "metric under another name"
      )
    # "error" is the protocol's own: 1 - the mean of "correct"
    choices = (["error"] if classifier else []) + [
        m for m in metrics if m not in ("correct", "error")
    ]
    metric = self.select_metric or ("error" if classifier else "loss")
    if metric not in choices:
      why = " (the error is 1 - the mean of a per-example 'correct')" if metric == "error" else ""
      raise ProtocolError(
          f"select_metric {metric!r}: the task's evaluate returns {list(metrics)}{why}; "
          f"allowed: {', '.join(map(repr, choices))}"
      )
    if not classifier:
      for field in ("targets", "networks"):
        if getattr(self, field) is not None:
          raise ProtocolError(
              f"{field} {getattr(self, field)!r}: the times to a target test error need a "
              f"per-example 'correct', which the task's evaluate ({list(metrics)}) does not "
              f"give; allowed: {field} None"
          )
    return dataclasses.replace(
        self,
        select_metric=metric,
        select_better=self.select_better or "lower",
        targets=(
            self.targets if self.targets is not None else (DEFAULT_TARGETS if classifier else ())
        ),
        networks=(
            self.networks if self.networks is not None else (DEFAULT_NETWORKS if classifier else ())
        ),
    )

  def _validate_arms(self, base: TrainConfig) -> None:
    if not self.arms:
      raise ProtocolError("arms must hold at least one Arm")
    for a in self.arms:
      if not isinstance(a, Arm):
        raise ProtocolError(f"arms entries must be easgd.protocol.config.Arm, got {a!r}")
      if not isinstance(a.overrides, Mapping):
        raise ProtocolError(
            f"overrides of arm {a.name!r} must be a dict of TrainConfig "
            f"fields, got {a.overrides!r}"
        )
      if not isinstance(a.learning_rates, tuple):
        raise ProtocolError(
            f"learning_rates of arm {a.name!r} must be a tuple (e.g. "
            f"log_grid(0.01, 1, 5)), got {a.learning_rates!r}"
        )
      if a.lr_from is not None and not isinstance(a.lr_from, str):
        raise ProtocolError(
            f"lr_from of arm {a.name!r} must be an arm's name or None, " f"got {a.lr_from!r}"
        )
    names = [a.name for a in self.arms]
    gives: dict[str, dict[str, str]] = {}  # algorithm -> "alpha"/"beta" -> an arm
    for a in self.arms:
      if not isinstance(a.name, str) or not a.name:
        raise ProtocolError(f"an arm's name must be a non-empty string, got {a.name!r}")
      if names.count(a.name) > 1:
        raise ProtocolError(f"two arms are called {a.name!r}; give each a unique name")
      checks.choice("algorithm", a.algorithm, registry.ALGORITHMS, error=ProtocolError)
      fixed = sorted(set(FIXED_BY_BASE) & set(a.overrides))
      if fixed:
        raise ProtocolError(
            f"arm {a.name!r} overrides {fixed}: the algorithm is the "
            "arm's own field, the learning rate comes from the grid, the "
            "seed from the protocol's seeds, and the task (data, split, crop, "
            "model, its dtypes) and the runtime are the base's for every arm"
        )
      arm_config = a.config(base).validate()  # tau, K vs the run's length: easgd.protocol.runs
      if "alpha" in registry.TABLE[a.algorithm].reads:
        given = "alpha" if arm_config.alpha is not None else "beta"
        gives.setdefault(a.algorithm, {}).setdefault(given, a.name)
        if len(gives[a.algorithm]) > 1:
          raise ProtocolError(
              f"arms of {a.algorithm} give alpha ({gives[a.algorithm]['alpha']!r}) and "
              f"beta ({gives[a.algorithm]['beta']!r}); their grids share one program: "
              "give the same one of the two in every arm"
          )
      if arm_config.max_worker_speed is not None:
        raise ProtocolError(
            f"arm {a.name!r}: max_worker_speed draws the speeds from the "
            "seed, which a program over seeds cannot follow; give "
            "worker_speeds"
        )
      if a.lr_from is None:
        if not a.learning_rates:
          raise ProtocolError(
              f"arm {a.name!r} needs learning_rates (a log-spaced grid, "
              "easgd.protocol.config.log_grid) or lr_from"
          )
        values = [
            _real(f"learning rate of arm {a.name!r}", v, FLOAT32_TINY, MAX_REAL)
            for v in a.learning_rates
        ]
        _check_resolved_rates(a, arm_config, values)
        if len(set(values)) != len(values):
          raise ProtocolError(f"arm {a.name!r} has a learning rate twice: {a.learning_rates}")
        if len(values) > 2 and not _log_spaced(sorted(values)):
          raise ProtocolError(
              f"arm {a.name!r}: learning_rates {a.learning_rates} are not "
              "log-spaced (equal ratios); use easgd.protocol.config.log_grid"
          )
      else:
        if a.learning_rates:
          raise ProtocolError(f"arm {a.name!r} gives both learning_rates and lr_from; " "give one")
        checks.choice(f"lr_from of arm {a.name!r}", a.lr_from, names, error=ProtocolError)
        source = self.arm(a.lr_from)
        if source.lr_from is not None:
          raise ProtocolError(
              f"arm {a.name!r} takes its rate from {source.name!r}, which "
              "takes its own from another arm; point at an arm with a grid"
          )
        _check_resolved_rates(a, arm_config, source.learning_rates)


def _check_resolved_rates(arm: Arm, config: TrainConfig, rates) -> None:
  """Each rate of the grid as the arm's runs use it, scaled by the arm's own
  ``lr_scaling`` (``TrainConfig.validate``'s check of the resolved rate).

  Raises:
    ProtocolError: a resolved rate outside float32's range, naming the arm.
  """
  for v in rates:
    try:
      config.replace(learning_rate=v).validate()
    except ConfigError as e:
      raise ProtocolError(f"arm {arm.name!r}, learning rate {v!r}: {e}") from None


def _log_spaced(values, rtol: float = 2e-3) -> bool:
  """Whether sorted positive values have (nearly) equal ratios."""
  ratios = np.diff(np.log(values))
  return bool(np.allclose(ratios, ratios[0], rtol=0, atol=rtol * max(1.0, abs(ratios[0]))))


def load_protocol_file(path) -> ProtocolConfig:
  """``get_protocol()`` of a Python file, e.g. ``experiments/protocol_fig2.py``.

  Raises:
    ProtocolError: the file is missing, is not Python, fails to load, or has
      no ``get_protocol`` returning a ProtocolConfig
      (``easgd._util.flags.call_config_file``).
  """
  return call_config_file(path, "get_protocol", ProtocolConfig, "protocol file", ProtocolError)


def to_dict(config: ProtocolConfig) -> dict[str, Any]:
  """The protocol as JSON-ready data: every field of :class:`ProtocolConfig` under
  its name (the base config resolved, each arm's config resolved, the networks
  as dicts, tuples as lists), so that results.json records every setting the
  results depend on."""
  base = config.base
  return dict(
      name=config.name,
      description=config.description,
      base=base.to_dict(),
      arms=[
          dict(
              name=a.name,
              algorithm=a.algorithm,
              overrides=dict(a.overrides),
              learning_rates=list(a.learning_rates),
              lr_from=a.lr_from,
              config=a.config(base).to_dict(),
          )
          for a in config.arms
      ],
      tune_seeds=list(config.tune_seeds),
      report_seeds=list(config.report_seeds),
      eval_every_steps=config.eval_every_steps,
      targets=list(config.targets or ()),
      networks=[dataclasses.asdict(n) for n in config.networks or ()],
      select_metric=config.select_metric,
      select_better=config.select_better,
      max_grid_extensions=config.max_grid_extensions,
      divergence_factor=config.divergence_factor,
      configs_per_batch=config.configs_per_batch,
      eval_chunk=config.eval_chunk,
  )


def reported_metrics(select_metric: str, classifier: bool) -> list[str]:
  """The test metrics the protocol reports with intervals, in its tables' order.

  Args:
    select_metric: the resolved ``ProtocolConfig.select_metric``.
    classifier: whether the task's ``evaluate`` gives a per-example ``"correct"``.

  Returns:
    ["error"] for a classifier whose rates are chosen on it (the error
    alone); else "error" (a classifier's), the chosen metric and "loss", each
    once, e.g. ["loss"] or ["mae", "loss"] for a task without "correct".
  """
  out = ["error"] if classifier else []
  out += [select_metric] if select_metric not in out else []
  out += ["loss"] if out != ["error"] and "loss" not in out else []
  return out


UNTUNABLE = "untunable"
"""The start of a grid flag saying that the grid could not choose a rate."""


def lr_grid_edges(
    learning_rates: Sequence[float],
    chosen: float,
    tuning: Sequence[dict] | None = None,
    metric: str = "error",
) -> str | None:
  """The flag of a chosen rate: at an edge of its grid, or a grid that cannot tune.

  Args:
    learning_rates: the arm's grid.
    chosen: the rate chosen from it.
    tuning: the tuning results per rate (``run_protocol``'s ``tuning``: each
      with ``diverged``, ``collapsed`` (absent in results written before it
      existed: none) and ``val_<metric>_final`` per tuning seed, a
      non-finite value written as ``None``); None: not known.
    metric: the protocol's ``select_metric`` (the tuning results' key).

  Returns:
    "untunable: a single rate" (a grid of one rate chose nothing),
    "untunable: every rate diverged" (every tuning run of every rate
    diverged or ended non-finite, so the choice is the first rate, not the
    best), "untunable: every rate diverged or collapsed" (the same, some
    collapsed: ``easgd.run.compare.collapsed``), "low" or "high" when
    ``chosen`` is the grid's smallest or largest
    rate (the best may lie beyond it), else None. An untunable grid is never
    called an edge: it points to neither side.
  """
  if len(learning_rates) < 2:
    return f"{UNTUNABLE}: a single rate"
  runs = [
      (d, c, e)
      for r in tuning or ()
      for d, c, e in zip(
          r["diverged"], r.get("collapsed", [False] * len(r["diverged"])), r[f"val_{metric}_final"]
      )
  ]
  if runs and all(d or c or e is None or not math.isfinite(e) for d, c, e in runs):
    some = any(c for _, c, _ in runs)
    return f"{UNTUNABLE}: every rate diverged" + (" or collapsed" if some else "")
  if math.isclose(chosen, min(learning_rates)):
    return "low"
  if math.isclose(chosen, max(learning_rates)):
    return "high"
  return None


def grid_note(edge: str | None) -> str:
  """The note a table puts after a chosen rate: " (low edge)", " (untunable:
  a single rate)", or "" (no flag)."""
  if not edge:
    return ""
  return f" ({edge})" if edge.startswith(UNTUNABLE) else f" ({edge} edge)"
