"""``easgd sweep``: the tau x alpha grid of EASGD, its files and heatmaps.

A :class:`~easgd.sweeps.config.SweepConfig` (flags from its fields,
``easgd.sweeps.config``) names the grid and the problem; :func:`run_sweep` runs it, on the quadratic
(``easgd.sweeps.quadratic.sweep_quadratic``) and/or a network
(``easgd.sweeps.network.sweep_network``), each grid as one compiled program per
num_workers (``easgd.sweeps.engine``), and writes ``sweep.csv``, ``sweep.json``
and one heatmap PNG per metric (tau on the x axis, alpha on the y axis) with
the theory's stability boundary (radius = 1) drawn over it
(``easgd.sweeps.report``). The network problem is the built-in data set and
model, or a task (``--task package.module:factory``, ``--task-arg key=value``;
recorded in ``sweep_config.json`` and in ``sweep.json``'s ``info["task"]``).
Every check (the config, the data set, the model or the task, sizes, memory,
the workdir) comes before any part runs, and a sweep's files
replace an earlier sweep's only once every part has finished
(:func:`run_sweep`).

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6), Algorithm 1, Section 4.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import time
from pathlib import Path

import jax

from easgd._util import flags
from easgd._util.files import json_text, write_text_atomic
from easgd.run import rundir, runlock
from easgd.settings.config import ConfigError
from easgd.sweeps import network, quadratic
from easgd.sweeps.config import SweepConfig
from easgd.sweeps.grid import SweepResult
from easgd.sweeps.report import HEATMAP_METRICS, summarize, write_result

CONFIG_FILE = "sweep_config.json"
RESULT_FILES = ("sweep.csv", "sweep.json")
NEW_DIR = ".sweep-new"
"""Where a sweep writes until it completes (inside the workdir)."""
PREVIOUS_DIR = "previous_sweep"
"""Where an earlier sweep waits while a new one's files move in."""
_COMPLETE = ".complete"  # in PREVIOUS_DIR: the earlier sweep is wholly aside


def run_sweep(
    config: SweepConfig, workdir, *, overwrite: bool = False, plots: bool = True
) -> dict[str, SweepResult]:
  """Runs ``config`` and writes results to ``workdir`` (``easgd sweep``).

  With ``problem="both"`` the quadratic goes to ``workdir/quadratic`` and the
  network to ``workdir/network``; otherwise straight into ``workdir``. Each
  directory gets ``sweep.csv``, ``sweep.json`` (records, grid, curvature, wall
  and compile times, Hessian estimates) and ``<metric>.png`` heatmaps
  (``easgd.sweeps.report.write_result``); ``workdir/sweep_config.json`` holds
  the resolved config (``hessian_examples`` the number used, when there is
  a Hessian estimate).

  Every check comes first, before any part runs: the config
  (:meth:`SweepConfig.validate`), the network's data set and model or its
  task (built here, once), sizes and memory
  (``easgd.sweeps.network.check_network``), then the workdir
  (``easgd.run.rundir.ensure_writable_dir``; no earlier sweep unless
  ``overwrite``), whose lock is held from then on (``easgd.run.runlock``: one
  command per workdir). The sweep then writes into ``workdir/.sweep-new``, and only
  once every part has finished are its files moved in: an earlier sweep's
  files (``sweep_config.json``, ``sweep.csv``, ``sweep.json``, heatmaps,
  ``quadratic/``, ``network/``) are moved to ``workdir/previous_sweep``, the
  new ones take their place (``sweep_config.json`` last) and
  ``previous_sweep`` is deleted. A sweep that fails leaves ``workdir`` as it
  was (an earlier sweep whole, nothing new); if a process was killed while
  the files moved, the next sweep in ``workdir`` first puts the earlier
  sweep back (:func:`_recover`).

  Raises:
    SweepError, easgd.tasks.data.DataError, easgd.tasks.models.ModelError: invalid
      config, or one the data set or model cannot run (before anything is
      compiled). easgd.tasks.task.TaskError: a task that does not import,
      build or fit the sweep (before anything is compiled).
      easgd.settings.config.ConfigError: workdir is blank, a file, cannot
      be written, or holds a sweep and not ``overwrite``.
      easgd.run.runlock.WorkdirInUseError: another command holds ``workdir``.
  """
  config = config.validate()
  setup = None
  if "network" in config.problems:
    setup = network.check_network(
        **_network_args(config),
        model=config.model,
        hessian_examples=config.hessian_examples,
        task=config.task,
        task_args=config.task_args,
    )
  workdir = rundir.workdir_path(workdir)
  # the lock creates workdir, and removes it again if the sweep fails in it
  with runlock.hold_workdir(workdir, "sweep"):
    _recover(workdir)
    if not overwrite and _holds_sweep(workdir):
      raise ConfigError(
          f"workdir '{workdir}' already holds a sweep; choose another "
          "directory or pass --overwrite"
      )
    new = workdir / NEW_DIR
    shutil.rmtree(new, ignore_errors=True)  # left by a sweep that was killed
    new.mkdir()
    try:
      results = _run_parts(config, setup, new, plots)
      if setup is not None and config.hessian_iterations:  # the examples used
        config = dataclasses.replace(config, hessian_examples=setup.hessian_examples)
      write_text_atomic(new / CONFIG_FILE, json_text(dataclasses.asdict(config), indent=2) + "\n")
      _install(new, workdir)
    finally:
      shutil.rmtree(new, ignore_errors=True)
  return results


def _network_args(config: SweepConfig) -> dict:
  """The arguments ``check_network`` and ``sweep_network`` both take from ``config``."""
  names = ("dataset", "per_worker_batch_size", "seed", "data_dir", "hessian_iterations")
  return dict(
      grid=config.grid, num_steps=config.num_steps, **{n: getattr(config, n) for n in names}
  )


def _run_parts(config: SweepConfig, setup, out: Path, plots: bool) -> dict[str, SweepResult]:
  """Runs each problem of ``config`` and writes its results under ``out``.

  Raises:
    Whatever a part raises (:func:`run_sweep` then drops ``out``).
  """
  results = {}
  for problem in config.problems:
    start = time.perf_counter()
    if problem == "quadratic":
      res = quadratic.sweep_quadratic(
          config.grid,
          config.num_steps,
          curvature=config.curvature,
          spread=config.quadratic_spread,
          sigma=config.quadratic_sigma,
          seed=config.seed,
          divergence_factor=config.divergence_factor,
      )
    else:
      res = network.sweep_network(
          **_network_args(config),
          model="mlp" if setup.user_task else setup.model,  # a task: the default
          divergence_factor=config.divergence_factor,
          hessian_tol=config.hessian_tol,
          hessian_examples=setup.hessian_examples,
          hessian_at_trained=config.hessian_at_trained,
          task=setup.task if setup.user_task else None,  # built once, by check_network
      )
      if not setup.user_task:
        res.info["model"] = setup.model_name
    res.info["total_wall_s"] = round(time.perf_counter() - start, 3)
    res.info["platform"] = jax.devices()[0].platform
    res.info["jax_version"] = jax.__version__
    write_result(res, out / problem if len(config.problems) > 1 else out, plots)
    results[problem] = res
  return results


_HEATMAP = re.compile(r"(%s)(_p\d+)?(_lr[^/]*)?\.png" % "|".join(map(re.escape, HEATMAP_METRICS)))


def _sweep_entries(directory: Path) -> list[Path]:
  """The files and subdirectories of a sweep in ``directory``, sweep_config.json
  first."""
  names = (CONFIG_FILE, *RESULT_FILES, "quadratic", "network")
  found = [directory / n for n in names if (directory / n).exists()]
  return found + sorted(p for p in directory.glob("*.png") if _HEATMAP.fullmatch(p.name))


def _holds_sweep(workdir: Path) -> bool:
  """Whether ``workdir`` holds a sweep's results (whole or partial)."""
  return any(p.suffix != ".png" for p in _sweep_entries(workdir))


def _install(new: Path, workdir: Path) -> None:
  """Moves the completed sweep in ``new`` into ``workdir`` (see :func:`run_sweep`):
  the earlier sweep aside, the new one in, the earlier one deleted.
  ``previous_sweep/.complete`` marks the earlier sweep as wholly aside (for
  :func:`_recover`).

  Raises:
    OSError: a file cannot be moved (the earlier sweep is then whole in
      ``workdir`` or in ``previous_sweep``; the next sweep puts it back).
  """
  # sweep_config.json first: the workdir no longer claims a sweep (_recover has
  # put back or dropped any earlier previous_sweep)
  old = _sweep_entries(workdir)
  rundir.move_aside(workdir, old, workdir / CONFIG_FILE, PREVIOUS_DIR, marker=_COMPLETE)
  entries = [p for p in new.iterdir() if p.name != CONFIG_FILE]
  for p in entries + [new / CONFIG_FILE]:  # sweep_config.json last: now complete
    os.replace(p, workdir / p.name)
  rundir.drop_previous_run(workdir, PREVIOUS_DIR)


def _recover(workdir: Path) -> None:
  """Finishes or undoes an :func:`_install` that a killed process left.

  ``previous_sweep`` beside a ``sweep_config.json``: the new sweep was wholly
  moved in, the earlier one is deleted. Without one: the earlier sweep goes
  back (first deleting the new sweep's files that had moved in, when the
  earlier sweep was wholly aside).

  Raises:
    OSError: a file cannot be moved or deleted.
  """
  aside = workdir / PREVIOUS_DIR
  if not aside.is_dir():
    return
  if (workdir / CONFIG_FILE).exists():
    shutil.rmtree(aside)
    return
  if (aside / _COMPLETE).exists():
    for p in _sweep_entries(workdir):
      shutil.rmtree(p) if p.is_dir() else p.unlink()
  for p in _sweep_entries(aside):
    os.replace(p, workdir / p.name)
  shutil.rmtree(aside)


def main_sweep(args: argparse.Namespace) -> int:
  """Runs ``easgd sweep`` from parsed arguments; prints a summary; returns 0.

  Raises:
    As :func:`run_sweep` (the command line prints them as one line, exit 2).
  """
  overrides = flags.overrides(args, SweepConfig)
  if "task_args" in overrides:  # --task-arg, repeated
    overrides["task_args"] = tuple(overrides["task_args"])
  config = SweepConfig(**overrides)
  results = run_sweep(config, args.workdir, overwrite=args.overwrite, plots=not args.no_plots)
  for res in results.values():
    print(summarize(res))
  print(f"results: {args.workdir}")
  return 0
