"""``easgd sweep``: the tau x alpha grid of EASGD, its files and heatmaps.

A :class:`SweepConfig` (flags from its fields, ``easgd.flags``) names the grid
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

from easgd import data, flags, models, quadratic, sweep_network, sweep_report
from easgd.files import write_text_atomic
from easgd.config import ConfigError
from easgd.flags import option
from easgd.sweep_engine import SweepError, check_factor, check_int, check_real
from easgd.sweep_grid import SweepGrid, SweepResult

PROBLEMS = ("quadratic", "network", "both")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """Everything ``easgd sweep`` runs; written to ``sweep_config.json``.

  Each field's meaning and unit is its ``metadata["help"]`` (also the help
  of its flag, ``easgd sweep --help``).
  """
  problem: str = option("network", "quadratic, network or both (subdirectories)",
                        choices=PROBLEMS)
  tau: tuple[int, ...] = option((1, 2, 4, 8, 16, 32, 64, 128),
                                "communication periods (local steps)")
  alpha: tuple[float, ...] = option((0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8),
                                    "moving rates (beta = num_workers * alpha)")
  learning_rate: tuple[float, ...] = option((0.1,), "eta values (local SGD step size)")
  num_workers: tuple[int, ...] = option((4,), "p values (one compiled program each)")
  num_steps: int = option(300, "local steps per worker")
  per_worker_batch_size: int = option(32, "examples per worker per step (network)")
  dataset: str = option("mnist1d", "data set name (network)")
  model: str = option("mlp", "mlp or cnn (network)")
  curvature: float = option(1.0, "h of the quadratic")
  quadratic_spread: float = option(0.5, "relative spread of the quadratic's worker starts")
  quadratic_sigma: float = option(0.0, "gradient-noise std of the quadratic")
  divergence_factor: float = option(
      1e3, "loss ratio that counts as diverged: the workers' mean loss to its step-0 "
      "value, the center's final loss to its initial one")
  hessian_iterations: int = option(
      100, "budget of Hessian-vector products for h (0: skip; network)")
  hessian_tol: float = option(
      1e-4, "relative residual tolerance of h: certified when ||H v - h v|| <= "
      "hessian_tol |h| (> 0)")
  hessian_examples: int = option(2000, "training examples in the Hessian's loss")
  hessian_at_trained: bool = option(True, "also estimate h at the best final center")
  seed: int = option(0, "seed of data order, initialisation and noise")
  data_dir: str | None = option(None, "Fashion-MNIST directory, or none")

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


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
  """Adds the ``easgd sweep`` flags: --workdir, --overwrite, --no-plots and one
  flag per :class:`SweepConfig` field (``easgd.flags``; lists comma-separated)."""
  parser.add_argument("--workdir", required=True, help="output directory")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace an earlier sweep in --workdir")
  parser.add_argument("--no-plots", action="store_true", help="CSV and JSON only")
  flags.add_flags(parser, SweepConfig,
                  title="sweep (SweepConfig fields; lists: 1,2,4; 'none' for no value)")


def main_sweep(args: argparse.Namespace) -> int:
  """Runs ``easgd sweep`` from parsed arguments; prints a summary; returns 0."""
  config = SweepConfig(**flags.overrides(args, SweepConfig)).validate()
  results = run_sweep(config, args.workdir, overwrite=args.overwrite,
                      plots=not args.no_plots)
  for res in results.values():
    print(sweep_report.summarize(res))
  print(f"results: {args.workdir}")
  return 0
