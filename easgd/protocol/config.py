"""The comparison protocol's configuration: arms, grids, seeds, budget, targets.

A :class:`ProtocolConfig` names the arms of a comparison (an :class:`Arm` is one
algorithm in one setting: a ``TrainConfig`` = the protocol's ``base`` with the
arm's overrides), each arm's log-spaced learning-rate grid (or the arm whose
chosen rate it takes, scaled by its ``lr_scaling``), the seeds of the tuning
runs and the fresh seeds of the reported reruns, the evaluation steps, the
test errors of "time to target" and the networks of the modelled wall-clock
time. Every value is checked here, in Python, before any data is loaded or
anything is compiled (:meth:`ProtocolConfig.validate`, ``ProtocolError`` with
the one message format of ``easgd._util.checks``); every arm's config is validated
as a ``TrainConfig`` (so a setting an algorithm does not read is refused).

The budget of an arm is its config's ``num_epochs`` (``steps_per_epoch`` x
``num_epochs`` local steps per worker, on the training set less the
``validation_examples`` held out), so every run of the protocol is a run that
``easgd train`` reproduces: the arm's config with the chosen learning rate and
a seed.

A config file for ``easgd protocol --config FILE.py`` defines
``get_protocol() -> ProtocolConfig`` (and, so that ``easgd train --config``
runs its base setting, ``get_config() -> TrainConfig``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Sequence

import numpy as np

from easgd._util import checks
from easgd.methods import registry
from easgd.training.config import FLOAT32_TINY, MAX_REAL, ConfigError, TrainConfig
from easgd._util.flags import REQUIRED, call_config_file, option


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
    "task",
    "task_args",
    "runtime",
)
"""Fields an arm may not override: its algorithm is ``Arm.algorithm``; one task
(data set, split, model), and one runtime for every arm (the programs share
them); the rate and seed come from the protocol."""


MIN_SEEDS = 3
"""Seeds per grid point and per reported rerun (an interval needs n >= 3)."""


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
class Network:
  """A network of the modelled wall-clock time.

  One all-reduce of b bytes per worker costs ``latency_s + 2 (p - 1) / p * b /
  bandwidth_bytes_per_s`` (ring all-reduce traffic per worker). Every field
  carries its meaning and unit in its help text.
  """

  name: str = option("1GbE", "the network's name (keys the modelled times)")
  bandwidth_bytes_per_s: float = option(125e6, "link bandwidth per worker, bytes per second")
  latency_s: float = option(50e-6, "seconds added to every all-reduce")


GIGABIT_ETHERNET = Network("1GbE", 125e6, 50e-6)
"""1 Gbit/s = 125 MB/s, 50 us per all-reduce (a switched LAN)."""
HUNDRED_GIGABIT_ETHERNET = Network("100GbE", 12.5e9, 5e-6)
"""100 Gbit/s = 12.5 GB/s, 5 us per all-reduce (RDMA-class)."""


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
  targets: tuple[float, ...] = option(
      (0.3, 0.2), 'test errors (fractions in (0, 1)) of "time to target"'
  )
  networks: tuple[Network, ...] = option(
      (GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET),
      "the networks (Network) of the modelled wall-clock time",
  )
  max_grid_extensions: int = option(
      2,
      "rates an arm's grid may be extended by: while the chosen rate is the grid's "
      "lowest or highest, one more rate one log step beyond it is tuned on the same "
      "seeds, until the choice is interior, the new rate diverges, or this many were "
      "added (results.json: grid_extended, grid_extension); 0 = never",
  )
  divergence_factor: float = option(
      10.0,
      "a run whose center validation loss is non-finite or exceeds this "
      "factor times its initial value at its last evaluation counts as diverged "
      "(its error is taken as 1 when rates are compared); > 1",
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
      if not isinstance(value, tuple):
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
    if base.crop_size is not None:
      raise ProtocolError(
          "crop_size: the protocol gathers whole examples inside the "
          "program; allowed: crop_size None"
      )
    if base.runtime != "spmd":
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
    if not self.targets:
      raise ProtocolError("targets must hold at least one test error")
    for t in self.targets:
      _real("targets entry (test error)", t, 0, 1, open_low=True, open_high=True)
    if len(set(self.targets)) != len(self.targets):
      raise ProtocolError(f"targets has a test error twice: {self.targets!r}")
    if not self.networks:
      raise ProtocolError("networks must hold at least one Network")
    for n in self.networks:
      if not isinstance(n, Network):
        raise ProtocolError(f"networks entries must be easgd.protocol.config.Network, got {n!r}")
      if not isinstance(n.name, str) or not n.name:
        raise ProtocolError(f"a network's name must be a non-empty string, got {n.name!r}")
      _real(
          f"bandwidth_bytes_per_s of network {n.name!r}", n.bandwidth_bytes_per_s, 0, open_low=True
      )
      _real(f"latency_s of network {n.name!r}", n.latency_s, 0)
    names = [n.name for n in self.networks]
    if len(set(names)) != len(names):
      raise ProtocolError(
          f"two networks share a name: {names}; the modelled times are " "keyed by it"
      )
    _real("divergence_factor", self.divergence_factor, 1, open_low=True)
    if self.configs_per_batch is not None:
      _int("configs_per_batch", self.configs_per_batch, 1)
    _int("eval_chunk", self.eval_chunk, 1)
    self._validate_arms(base)
    return self

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
  """The protocol as JSON-ready data (the base config resolved, each arm's
  config resolved)."""
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
      targets=list(config.targets),
      networks=[dataclasses.asdict(n) for n in config.networks],
      divergence_factor=config.divergence_factor,
      configs_per_batch=config.configs_per_batch,
      eval_chunk=config.eval_chunk,
  )


UNTUNABLE = "untunable"
"""The start of a grid flag saying that the grid could not choose a rate."""


def lr_grid_edges(
    learning_rates: Sequence[float], chosen: float, tuning: Sequence[dict] | None = None
) -> str | None:
  """The flag of a chosen rate: at an edge of its grid, or a grid that cannot tune.

  Args:
    learning_rates: the arm's grid.
    chosen: the rate chosen from it.
    tuning: the tuning results per rate (``run_protocol``'s ``tuning``: each
      with ``diverged`` and ``val_error_final`` per tuning seed, a
      non-finite error written as ``None``); None: not known.

  Returns:
    "untunable: a single rate" (a grid of one rate chose nothing),
    "untunable: every rate diverged" (every tuning run of every rate
    diverged or ended non-finite, so the choice is the first rate, not the
    best), "low" or "high" when ``chosen`` is the grid's smallest or largest
    rate (the best may lie beyond it), else None. An untunable grid is never
    called an edge: it points to neither side.
  """
  if len(learning_rates) < 2:
    return f"{UNTUNABLE}: a single rate"
  if tuning and all(
      d or e is None or not math.isfinite(e)
      for r in tuning
      for d, e in zip(r["diverged"], r["val_error_final"])
  ):
    return f"{UNTUNABLE}: every rate diverged"
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
