"""The ``easgd sweep`` config and flags: :class:`SweepConfig` and :func:`add_sweep_arguments`.

Imports no JAX, Flax or Optax: ``easgd sweep --help`` and the flags' parsing
stay light (the checks that need the engine, the grid or a problem import them
when :meth:`SweepConfig.validate` runs). The sweep itself is
``easgd.sweeps.command.run_sweep``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import TYPE_CHECKING, Any

from easgd._util import checks, flags
from easgd._util.flags import option
from easgd.settings import reads
from easgd.tasks import data, datasets
from easgd.tasks.sources import TaskError
from easgd.tasks.task import parse_task_args

if TYPE_CHECKING:
  from easgd.sweeps.grid import SweepGrid

PROBLEMS = ("quadratic", "network", "both")


QUADRATIC_FIELDS = ("curvature", "quadratic_spread", "quadratic_sigma")
"""The :class:`SweepConfig` fields only the quadratic reads."""
NETWORK_FIELDS = (
    "per_worker_batch_size",
    "task",
    "task_args",
    "dataset",
    "model",
    "hessian_iterations",
    "hessian_tol",
    "hessian_examples",
    "hessian_at_trained",
    "data_dir",
)
"""The :class:`SweepConfig` fields only the network reads."""
HESSIAN_FIELDS = ("hessian_tol", "hessian_examples", "hessian_at_trained")
"""The fields read only when there is a Hessian estimate (hessian_iterations >= 1)."""


def _not_read_by_problem(reader: str):
  def message(config, name, value) -> str:
    return (
        f"{name}={value!r} is not read by problem {config.problem!r}; leave it at "
        f"its default {reads.defaults(type(config))[name]!r}, or use problem {reader!r} "
        "or 'both'"
    )

  return message


RULES = (
    reads.Reads(
        QUADRATIC_FIELDS,
        lambda c: QUADRATIC_FIELDS if "quadratic" in c.problems else (),
        _not_read_by_problem("quadratic"),
    ),
    reads.Reads(
        NETWORK_FIELDS,
        lambda c: NETWORK_FIELDS if "network" in c.problems else (),
        _not_read_by_problem("network"),
    ),
    reads.Reads(
        HESSIAN_FIELDS,
        lambda c: HESSIAN_FIELDS if c.hessian_iterations != 0 else (),
        lambda c, name, value: (
            f"{name}={value!r} is not read with hessian_iterations=0 (no Hessian "
            f"estimate); leave it at its default {reads.defaults(type(c))[name]!r}, or give "
            "hessian_iterations >= 1"
        ),
    ),
    reads.DATA_DIR,
)
"""Who reads :class:`SweepConfig`'s settings (``easgd.settings.reads``)."""


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """Everything ``easgd sweep`` runs; written to ``sweep_config.json``.

  Each field's meaning and unit is its ``metadata["help"]`` (also the help
  of its flag, ``easgd sweep --help``). :data:`QUADRATIC_FIELDS` are read by
  problems "quadratic" and "both", :data:`NETWORK_FIELDS` by "network" and
  "both"; a field the chosen problem does not read must keep its default
  (:meth:`unread_fields`).
  """

  problem: str = option("network", "quadratic, network or both (subdirectories)", choices=PROBLEMS)
  tau: tuple[int, ...] = option(
      (1, 2, 4, 8, 16, 32, 64, 128), "communication periods (local steps)"
  )
  alpha: tuple[float, ...] = option(
      (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8), "moving rates (beta = num_workers * alpha)"
  )
  learning_rate: tuple[float, ...] = option((0.1,), "eta values (local SGD step size)")
  num_workers: tuple[int, ...] = option((4,), "p values (one compiled program each)")
  num_steps: int = option(300, "local steps per worker")
  per_worker_batch_size: int = option(32, "examples per worker per step (network)")
  task: str | None = option(
      None,
      "the network problem as an importable task factory 'package.module:function' "
      "returning an easgd.Task without BatchNorm (the working directory is searched "
      "first); none: the built-in dataset and model, which keep their defaults beside "
      "a task (network)",
  )
  task_args: tuple[str, ...] = option(
      (),
      "the task factory's keyword arguments as 'key=value' texts (JSON if it parses, "
      "else a string); on the command line --task-arg key=value, repeated (network)",
  )
  dataset: str = option("mnist1d", "data set name (network)")
  model: str = option("mlp", "mlp or cnn (network)")
  curvature: float = option(1.0, "h of the quadratic")
  quadratic_spread: float = option(0.5, "relative spread of the quadratic's worker starts")
  quadratic_sigma: float = option(0.0, "gradient-noise std of the quadratic")
  divergence_factor: float = option(
      1e3,
      "loss ratio that counts as diverged: the workers' mean loss to its step-0 "
      "value, the center's final loss to its initial one",
  )
  hessian_iterations: int = option(
      100, "budget of Hessian-vector products for h (0: skip; network)"
  )
  hessian_tol: float = option(
      1e-4,
      "relative residual tolerance of h: certified when ||H v - h v|| <= " "hessian_tol |h| (> 0)",
  )
  hessian_examples: int | None = option(
      None,
      "training examples in the Hessian's loss, at most the data set's "
      "training examples (none: 2000, or all of them if fewer)",
  )
  hessian_at_trained: bool = option(True, "also estimate h at the best final center")
  seed: int = option(0, "seed of data order, initialisation and noise, in [0, 2**32 - 1]")
  data_dir: str | None = option(None, "Fashion-MNIST or CIFAR-10 directory, or none")

  @property
  def grid(self) -> SweepGrid:
    from easgd.sweeps.grid import SweepGrid

    return SweepGrid(self.tau, self.alpha, self.learning_rate, self.num_workers)

  @property
  def problems(self) -> tuple[str, ...]:
    """The problems run, in order: ("quadratic", "network") for "both"."""
    return ("quadratic", "network") if self.problem == "both" else (self.problem,)

  def unread_fields(self) -> dict[str, Any]:
    """The fields set away from their default that this sweep never reads
    (:data:`RULES`): :data:`QUADRATIC_FIELDS` without the quadratic,
    :data:`NETWORK_FIELDS` without the network, :data:`HESSIAN_FIELDS` with
    ``hessian_iterations=0`` (no Hessian estimate), ``data_dir`` with a data
    set that has no files.

    Returns:
      ``{field: value}`` in field order (empty when every setting is read).
    """
    return reads.unread(self, RULES, _FIELD_ORDER)

  def validate(self) -> "SweepConfig":
    """Checks every field, without loading data or compiling anything.

    The data-dependent checks (the data set loads and the model takes its
    inputs, or the task builds and fits; batch and Hessian sizes fit the
    data, the network's memory) are
    ``easgd.sweeps.network.check_network``'s, which :func:`run_sweep` runs
    before any part of the sweep.

    Returns:
      The config with Python values (NumPy scalars made Python numbers, the
      grid's tuples sorted, a path-like data_dir a string).

    Raises:
      SweepError: a field of the wrong type or out of range (bools are not
        numbers, strings not numbers, only bools are flags), a tau longer
        than num_steps, a quadratic sweep above the memory limit
        (``easgd.sweeps.quadratic.check_quadratic``), or a setting the chosen
        problem does not read (:meth:`unread_fields`); the message names
        the field, its value and what is allowed. easgd.tasks.data.DataError,
        easgd.tasks.models.ModelError: unknown data set or model.
        easgd.tasks.task.TaskError: malformed task_args, or task_args
        without a task (the task itself is built by ``check_network``).
    """
    from easgd.sweeps import quadratic
    from easgd.sweeps.engine import SweepError, check_factor, check_int, check_real
    from easgd.sweeps.grid import check_num_steps
    from easgd.sweeps.network import check_model_name, refuse_builtin_args

    checks.choice("problem", self.problem, PROBLEMS, error=SweepError)
    g = self.grid.validate()
    data_dir = self.data_dir
    if data_dir is not None:
      if not isinstance(data_dir, (str, os.PathLike)):
        raise SweepError(f"data_dir must be a path string or None, got {data_dir!r}")
      data_dir = os.fspath(data_dir)
    plain = dict(
        tau=g.tau,
        alpha=g.alpha,
        learning_rate=g.learning_rate,
        num_workers=g.num_workers,
        num_steps=check_num_steps(g, self.num_steps),
        per_worker_batch_size=check_int("per_worker_batch_size", self.per_worker_batch_size, 1),
        hessian_iterations=check_int("hessian_iterations", self.hessian_iterations, 0),
        hessian_examples=(
            None
            if self.hessian_examples is None
            else check_int("hessian_examples", self.hessian_examples, 1)
        ),
        curvature=check_real("curvature", self.curvature, 0.0, True),
        quadratic_spread=check_real("quadratic_spread", self.quadratic_spread, 0.0, False),
        quadratic_sigma=check_real("quadratic_sigma", self.quadratic_sigma, 0.0, False),
        hessian_tol=check_real("hessian_tol", self.hessian_tol, 0.0, True),
        divergence_factor=check_factor(self.divergence_factor),
        hessian_at_trained=checks.flag(
            "hessian_at_trained", self.hessian_at_trained, error=SweepError
        ),
        dataset=checks.choice("dataset", self.dataset, datasets.DATASETS, error=data.DataError),
        model=check_model_name(self.model),
        seed=check_int("seed", self.seed, 0, 2**32 - 1),
        data_dir=data_dir,
        task=self.task,
        task_args=_task_args(self.task, self.task_args),
    )
    config = dataclasses.replace(self, **plain)
    reads.refuse_unread(config, RULES, SweepError, _FIELD_ORDER)
    if config.task is not None:
      refuse_builtin_args(
          config.task, dataset=config.dataset, model=config.model, data_dir=config.data_dir
      )
    if "quadratic" in config.problems:
      quadratic.check_quadratic(g, config.num_steps)
    return config


def _task_args(task, task_args) -> tuple[str, ...]:
  """``task_args`` as a tuple of ``"key=value"`` texts, checked (``parse_task_args``).

  Raises:
    SweepError: task not None or a string, task_args not a tuple or list of strings.
    easgd.tasks.task.TaskError: a malformed entry, a key given twice, or
      arguments without a task.
  """
  from easgd.sweeps.engine import SweepError

  if task is not None and not isinstance(task, str):
    raise SweepError(f"task must be 'package.module:function' or None, got {task!r}")
  if isinstance(task_args, str) or not isinstance(task_args, (tuple, list)):
    raise SweepError(f"task_args must be a tuple of 'key=value' texts, got {task_args!r}")
  texts = tuple(task_args)
  if any(not isinstance(t, str) for t in texts):
    raise SweepError(f"task_args must be a tuple of 'key=value' texts, got {task_args!r}")
  parse_task_args(texts)
  if texts and task is None:
    raise TaskError(
        f"task_args={texts!r} have no effect without a task; give task "
        "'package.module:function' (--task) or drop them"
    )
  return texts


_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(SweepConfig))


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
  """Adds the ``easgd sweep`` flags: --workdir, --overwrite, --no-plots and one
  flag per :class:`SweepConfig` field (``easgd._util.flags``; lists comma-separated)."""
  parser.add_argument("--workdir", required=True, help="output directory")
  parser.add_argument(
      "--overwrite", action="store_true", help="replace an earlier sweep in --workdir"
  )
  parser.add_argument("--no-plots", action="store_true", help="CSV and JSON only")
  group = flags.add_flags(
      parser,
      SweepConfig,
      title="sweep (SweepConfig fields; lists: 1,2,4; 'none' for no value)",
      exclude=("task_args",),
  )
  flags.add_task_arg(group)
