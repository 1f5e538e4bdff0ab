"""``easgd sweep``: the tau x alpha grid of EASGD, its files and heatmaps.

A :class:`SweepConfig` (one flag per field) names the grid
and the problem; :func:`run_sweep` runs it, on the quadratic
(``easgd.quadratic.sweep_quadratic``) and/or a network
(``easgd.sweep_network.sweep_network``), each grid as one compiled program per
num_workers (``easgd.sweep_engine``), and writes ``sweep.csv``, ``sweep.json``
and one heatmap PNG per metric (tau on the x axis, alpha on the y axis) with
the theory's stability boundary (radius = 1) drawn over it
(``easgd.sweep_report``).

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6), Algorithm 1, Section 4.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax

from easgd import data, models, quadratic, sweep_network, sweep_report
from easgd.checkpoint import write_text_atomic
from easgd.config import ConfigError
from easgd.sweep_engine import SweepError, check_factor, check_int, check_real
from easgd.sweep_grid import SweepGrid, SweepResult

PROBLEMS = ("quadratic", "network", "both")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """Everything ``easgd sweep`` runs; written to ``sweep_config.json``.

  Attributes:
    problem: ``"quadratic"``, ``"network"`` or ``"both"`` (subdirectories).
    tau: communication periods (local steps).
    alpha: moving rates (beta = num_workers * alpha).
    learning_rate: eta values (local SGD step size).
    num_workers: p values (one compiled program each).
    num_steps: local steps per worker.
    per_worker_batch_size: examples per worker per step (network).
    dataset: data set name (network).
    model: ``"mlp"`` or ``"cnn"`` (network).
    curvature: h of the quadratic.
    quadratic_spread: relative spread of the quadratic's worker starts.
    quadratic_sigma: gradient-noise std of the quadratic.
    divergence_factor: loss ratio that counts as diverged: the workers' mean
      loss to its step-0 value, the center's final loss to its initial one.
    hessian_iterations: budget of Hessian-vector products for h (0: skip;
      network).
    hessian_tol: relative residual tolerance of h: certified when
      ||H v - h v|| <= hessian_tol |h| (> 0).
    hessian_examples: training examples in the Hessian's loss.
    hessian_at_trained: also estimate h at the best final center.
    seed: seed of data order, initialisation and noise.
    data_dir: Fashion-MNIST directory, or None.
  """
  problem: str = "network"
  tau: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
  alpha: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
  learning_rate: tuple[float, ...] = (0.1,)
  num_workers: tuple[int, ...] = (4,)
  num_steps: int = 300
  per_worker_batch_size: int = 32
  dataset: str = "mnist1d"
  model: str = "mlp"
  curvature: float = 1.0
  quadratic_spread: float = 0.5
  quadratic_sigma: float = 0.0
  divergence_factor: float = 1e3
  hessian_iterations: int = 100
  hessian_tol: float = 1e-4
  hessian_examples: int = 2000
  hessian_at_trained: bool = True
  seed: int = 0
  data_dir: str | None = None

  @property
  def grid(self) -> SweepGrid:
    return SweepGrid(self.tau, self.alpha, self.learning_rate, self.num_workers)

  def validate(self) -> "SweepConfig":
    """The config with a validated grid; raises SweepError (one line)."""
    if self.problem not in PROBLEMS:
      raise SweepError(f"unknown problem {self.problem!r}; allowed: "
                       f"{', '.join(PROBLEMS)}")
    g = self.grid.validate()
    check_int("num_steps", self.num_steps, 1)
    check_int("per_worker_batch_size", self.per_worker_batch_size, 1)
    check_int("hessian_iterations", self.hessian_iterations, 0)
    check_int("hessian_examples", self.hessian_examples, 1)
    check_real("curvature", self.curvature, 0.0, True)
    check_real("quadratic_spread", self.quadratic_spread, 0.0, False)
    check_real("quadratic_sigma", self.quadratic_sigma, 0.0, False)
    check_real("hessian_tol", self.hessian_tol, 0.0, True)
    check_factor(self.divergence_factor)
    if self.dataset not in data.DATASETS:
      raise SweepError(f"unknown dataset {self.dataset!r}; allowed: "
                       f"{', '.join(data.DATASETS)}")
    if self.model not in models.MODELS:
      raise SweepError(f"unknown model {self.model!r}; allowed: {', '.join(models.MODELS)}")
    check_int("seed", self.seed, 0)
    return dataclasses.replace(self, tau=g.tau, alpha=g.alpha,
                               learning_rate=g.learning_rate, num_workers=g.num_workers)


def run_sweep(config: SweepConfig, workdir, *, overwrite: bool = False,
              plots: bool = True) -> dict[str, SweepResult]:
  """Runs ``config`` and writes results to ``workdir`` (``easgd sweep``).

  With ``problem="both"`` the quadratic goes to ``workdir/quadratic`` and the
  network to ``workdir/network``; otherwise straight into ``workdir``. Each
  directory gets ``sweep.csv``, ``sweep.json`` (records, grid, curvature, wall
  and compile times, Hessian estimates) and ``<metric>.png`` heatmaps
  (``easgd.sweep_report.write_result``); ``workdir/sweep_config.json`` holds
  the resolved config.

  Raises:
    SweepError: invalid config. easgd.config.ConfigError: workdir holds a sweep
      and not ``overwrite``. DataError/ModelError: unknown data set or model.
  """
  config = config.validate()
  workdir = Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise ConfigError(f"workdir '{workdir}' exists and is not a directory")
  if not overwrite and (workdir / "sweep_config.json").exists():
    raise ConfigError(f"workdir '{workdir}' already holds a sweep; choose another "
                      "directory or pass --overwrite")
  problems = ("quadratic", "network") if config.problem == "both" else (config.problem,)
  workdir.mkdir(parents=True, exist_ok=True)
  results = {}
  for problem in problems:
    start = time.perf_counter()
    if problem == "quadratic":
      res = quadratic.sweep_quadratic(
          config.grid, config.num_steps, curvature=config.curvature,
          spread=config.quadratic_spread, sigma=config.quadratic_sigma,
          seed=config.seed, divergence_factor=config.divergence_factor)
    else:
      res = sweep_network.sweep_network(
          config.grid, config.num_steps, dataset=config.dataset, model=config.model,
          per_worker_batch_size=config.per_worker_batch_size, seed=config.seed,
          divergence_factor=config.divergence_factor, data_dir=config.data_dir,
          hessian_iterations=config.hessian_iterations, hessian_tol=config.hessian_tol,
          hessian_examples=config.hessian_examples,
          hessian_at_trained=config.hessian_at_trained)
    res.info["total_wall_s"] = round(time.perf_counter() - start, 3)
    res.info["platform"] = jax.devices()[0].platform
    res.info["jax_version"] = jax.__version__
    sweep_report.write_result(res, workdir / problem if len(problems) > 1 else workdir,
                              plots)
    results[problem] = res
  # written last: a sweep that fails leaves an earlier sweep's files consistent
  write_text_atomic(workdir / "sweep_config.json",
                    json.dumps(dataclasses.asdict(config), indent=2) + "\n")
  return results


def int_list(text: str) -> tuple[int, ...]:
  """``"1,2,4"`` -> (1, 2, 4) (argparse type; ranges are checked later)."""
  return tuple(int(t) for t in text.split(",") if t.strip())


def float_list(text: str) -> tuple[float, ...]:
  """``"0.1,0.5"`` -> (0.1, 0.5) (argparse type; ranges are checked later)."""
  return tuple(float(t) for t in text.split(",") if t.strip())


def _bool(text: str) -> bool:
  if text.lower() in ("1", "true", "yes", "on"):
    return True
  if text.lower() in ("0", "false", "no", "off"):
    return False
  raise ValueError(text)


def _optional_str(text: str) -> str | None:
  return None if text.lower() == "none" else text


_FLAG_TYPES = {"tau": int_list, "num_workers": int_list, "alpha": float_list,
               "learning_rate": float_list, "hessian_at_trained": _bool,
               "data_dir": _optional_str}


def add_sweep_arguments(parser) -> None:
  """Adds the ``easgd sweep`` flags: --workdir, --overwrite, --no-plots and one
  flag per :class:`SweepConfig` field (lists comma-separated)."""
  parser.add_argument("--workdir", required=True, help="output directory")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace an earlier sweep in --workdir")
  parser.add_argument("--no-plots", action="store_true", help="CSV and JSON only")
  group = parser.add_argument_group("sweep (SweepConfig fields; lists: 1,2,4)")
  defaults = SweepConfig()
  for f in dataclasses.fields(SweepConfig):
    default = getattr(defaults, f.name)
    kind = _FLAG_TYPES.get(f.name, type(default))
    extra = dict(choices=PROBLEMS) if f.name == "problem" else {}
    shown = ",".join(f"{v:g}" for v in default) if isinstance(default, tuple) else default
    group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind,
                       default=argparse.SUPPRESS, metavar=f.name.upper(),
                       help=f"default: {shown}", **extra)


def main_sweep(args: argparse.Namespace) -> int:
  """Runs ``easgd sweep`` from parsed arguments; prints a summary; returns 0."""
  overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(SweepConfig)
               if hasattr(args, f.name)}
  config = SweepConfig(**overrides).validate()
  results = run_sweep(config, args.workdir, overwrite=args.overwrite,
                      plots=not args.no_plots)
  for res in results.values():
    print(sweep_report.summarize(res))
  print(f"results: {args.workdir}")
  return 0
