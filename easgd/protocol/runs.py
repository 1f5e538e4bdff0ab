"""The comparison protocol's runs: tune on the validation split, choose, report on fresh seeds.

:func:`run_protocol` runs a :class:`~easgd.protocol.config.ProtocolConfig` (tune every
rate of each grid on the tuning seeds, choose by the mean final validation
``select_metric``, rerun the chosen rate on the report seeds) and returns its results;
:func:`summarize_arm` reduces an arm's report runs to intervals and times to target. The
steps, the programs they share and what the results hold: docs/guides/protocol.md.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging
  SGD. NeurIPS 2015, Section 5 (learning rates from a grid per method,
  repeated runs, the center's test error against time).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from easgd._util import checks
from easgd._util.files import check_interrupt, json_text
from easgd.core import elastic
from easgd.methods import registry
from easgd.parallel import accounting
from easgd.protocol import stats
from easgd.protocol.config import (
    UNTUNABLE,
    ProtocolConfig,
    ProtocolError,
    lr_grid_edges,
    reported_metrics,
    to_dict,
)
from easgd.protocol.programs import (
    ArmRun,
    SeedData,
    check_task_for,
    group_programs,
    prepare,
    run_program,
    why_separate,
)
from easgd.protocol.report import GROUP_BY, write_report
from easgd.run import runlock
from easgd.run.compare import COLLAPSE_MARGIN, chance_error, collapsed, task_classes
from easgd.settings import builtin_tasks
from easgd.settings.config import ConfigError
from easgd.tasks import batches, models
from easgd.tasks.sources import TaskError, take
from easgd.tasks.task import Task, user_call

# ----------------------------------------------------------------------------
# The protocol
# ----------------------------------------------------------------------------


def _diverged(loss_curve: np.ndarray, factor: float) -> bool:
  last, first = loss_curve[-1], loss_curve[0]
  return bool(not np.isfinite(last) or last > factor * abs(first))


def _curve(values) -> np.ndarray:
  """A curve (a list with None where a value was not finite, or an array) as float64."""
  return np.asarray([np.nan if v is None else v for v in values], np.float64)


def _failures(loss_curves, error_curves, factor: float, num_classes: int | None):
  """(diverged, collapsed) per run: :func:`_diverged` of each loss curve (the
  center's, at the evaluations, step 0 first), and, of the others,
  ``easgd.run.compare.collapsed`` of its loss at the start and the end and its
  final error (``error_curves`` None: not a classifier). A run is at most one
  of the two."""
  div, col = [], []
  for i, loss in enumerate(loss_curves):
    loss = _curve(loss)
    d = _diverged(loss, factor)
    error = None if error_curves is None else _curve(error_curves[i])[-1]
    div.append(d)
    col.append(not d and collapsed(loss[0], loss[-1], error, num_classes))
  return div, col


def measure_step_seconds(task: Task, batch_size: int, repeats: int = 30) -> float:
  """Median seconds of one worker's local SGD step (forward, backward, update)
  at ``batch_size`` on this machine, jitted, after two warm-up calls.

  Args:
    task: the task (its ``init`` and ``loss``; the step reads its first
      ``batch_size`` training examples, augmented as one worker's global batch
      at seed 0, epoch 1, step 0 when the task has ``augment``).
    batch_size: examples per step (one worker's mini-batch).
    repeats: timed calls; the median is returned.

  Returns:
    Seconds (float) of one step: the compute term of the modelled wall clock
    (``Network.modelled_seconds`` and ``TwoLevelNetwork.modelled_seconds``).
  """
  params = task.init(jax.random.key(0))
  loss_fn = task.loss
  opt = optax.sgd(0.01)

  @jax.jit
  def step(params, state, batch, key):
    grads = jax.grad(loss_fn)(params, batch, key)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  batch = take(task.train, (np.arange(batch_size) % len(task.train))[None])  # [1, B, ...]
  if task.augment is not None:  # the shapes the model trains on (e.g. crops)
    batch = user_call(task, "augment", task.augment, batch, batches.crop_rng(0, 1, 0))
  batch = jax.tree.map(lambda a: jnp.asarray(a[0]), batch)
  state, key = opt.init(params), jax.random.key(1)
  for _ in range(2):
    params, state = jax.block_until_ready(step(params, state, batch, key))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    params, state = jax.block_until_ready(step(params, state, batch, key))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _communication(run: ArmRun, task: Task, param_bytes: int) -> Callable:
  """``comm(steps) -> (across, within)``, each (all_reduces, bytes, all_gathers,
  gathered_bytes) per device
  of the arm's layout (``easgd.parallel.accounting.communication_by_level``:
  across workers the algorithm's count from a Python tau; within a worker of
  ``devices_per_worker`` D > 1 devices its every-step gradient average)."""
  shapes = jax.eval_shape(task.init, jax.random.key(0))  # fragments' sizes (streaming)
  algo = registry.make_algorithm(run.config, task.loss, optax.sgd(0.1), run.num_steps, shapes)
  D = run.config.devices_per_worker
  # (all_reduces, bytes, all_gathers, gathered_bytes) per level
  return lambda t: tuple(
      tuple(level)
      for level in accounting.communication_by_level(
          algo, int(t), param_bytes, D, run.config.shard_params
      )
  )


def run_protocol(
    config: ProtocolConfig,
    workdir=None,
    *,
    log: Callable = print,
    task: Task | None = None,
    group_by: str = "tau",
) -> dict[str, Any]:
  """Tunes, chooses and reruns every arm of ``config``; returns (and writes) the results.

  The problem is an ``easgd.tasks.task.Task``: ``task`` (built in code,
  the same data for every seed) or, per seed s,
  ``easgd.settings.builtin_tasks.task_of(config.base, seed=s)`` (the base's
  ``task`` import path with ``task_args``, or its built-in data set and
  model; a factory that takes ``seed`` draws per-seed data). The data of the
  seeds are read whole and held in memory (:class:`SeedData`); the rates are
  tuned on ``validation_examples`` held out of the training data, never on
  the test set. A task with ``augment`` trains on the global batches ``easgd
  train`` augments (the same seed, epoch and step; made on the host,
  ``easgd.protocol.programs.augmented_batches``). Every task is checked
  before anything compiles (:func:`easgd.protocol.programs.check_task_kind`,
  :func:`check_task_for`).

  The rates are chosen on ``config.select_metric`` of the validation split
  (``ProtocolConfig.for_task``: by default the error of a task with a
  per-example ``"correct"``, else its loss); a task without ``"correct"``
  reports that metric and the test loss, and has no time to a target test
  error.

  Args:
    config: the protocol (validated here, before anything is loaded).
    workdir: if given, every file of the protocol is written there (created
      if missing) once every arm has run, by the one writer that ``easgd
      protocol`` uses too (``easgd.protocol.report.write_report``:
      ``results.json``, ``results.md``, ``curves.png`` and the TensorBoard
      runs of ``report/`` and ``tune/``); its lock is held for the whole run
      (``easgd.run.runlock``).
    log: called with one line per program (progress).
    task: a task built in code, or None for the one ``config.base`` names;
      its ``factory`` and ``factory_args`` are recorded in the results'
      ``protocol.base`` (``task``, ``task_args``), and a task other than the
      built-in ones is described under ``task`` (``Task.describe``).
    group_by: the panels of ``curves.png`` ("tau", "num_workers" or "": one);
      only with a ``workdir``.

  Returns:
    JSON-ready dict: ``protocol`` (the resolved config), ``machine``,
    ``collapse`` (the task's classes, chance error and the final error at
    which a run counts as collapsed: ``easgd.run.compare.collapsed``),
    ``arms`` (per arm: config, grid, tuning results per rate with ``diverged``
    and ``collapsed`` per seed, chosen rate, report per seed, summaries with
    intervals, ``diverged`` and ``collapsed`` per report seed, time to
    target), ``programs``
    (each compiled program: kind, arms, configurations, wall and compile
    seconds, the fields traced per configuration and why its arms run apart
    from others), ``compute_per_step_s``, ``wall_time_s``.

  Raises:
    ProtocolError, ConfigError: a bad setting (before anything runs), an
      arm whose batch indices or augmented batches exceed their limits
      (:func:`easgd.protocol.programs.prepare`), or a task the protocol
      cannot run: one with its own validation data, a split drawn from the
      seed, or a setting it cannot use (``ProtocolConfig.for_task``: a ``select_metric`` it does not
      give; ``targets`` or ``networks`` without a per-example ``"correct"``);
      before anything compiles, and a workdir the protocol created is removed.
    easgd.tasks.task.TaskError: ``task`` not a Task, a factory or data
      that cannot be used, seeds whose data differ in shapes
      (``easgd.tasks.task.check_task``; before anything compiles).
    easgd.run.runlock.WorkdirInUseError: another command holds ``workdir``.
    easgd.tasks.data.DataError: missing data files.
  """
  config = config.validate()
  checks.choice("group_by", group_by, GROUP_BY, error=ProtocolError)
  if workdir is None and group_by != "tau":
    raise ProtocolError(
        f"group_by {group_by!r} without a workdir: it sets the panels of curves.png, which "
        "is written only to a workdir; give workdir or leave group_by 'tau'"
    )
  if task is not None:
    if not isinstance(task, Task):
      raise TaskError(f"task must be an easgd.Task, got {type(task).__name__}")
    config = dataclasses.replace(config, base=builtin_tasks.make_task_config(config.base, task))
  if workdir is None:
    return _run_protocol(config, None, log, task, group_by)
  # the lock first (a held workdir stops the protocol before it reads anything);
  # a refusal below leaves no workdir it created (easgd.run.runlock)
  with runlock.hold_workdir(workdir, "protocol"):
    return _run_protocol(config, workdir, log, task, group_by)


def _run_protocol(config: ProtocolConfig, workdir, log: Callable, task, group_by) -> dict[str, Any]:
  """:func:`run_protocol` of a validated config (``workdir``'s lock held, if any)."""
  start = time.perf_counter()
  # the data and tasks of every seed, checked before anything compiles
  tune = SeedData(config.base, config.tune_seeds, task)
  # a task with augment: its batches made on the host, their bytes checked
  augmented = tune.augmented_batch_bytes if tune.task.augment is not None else None
  runs = prepare(config, tune.num_train, augmented)
  report = SeedData(config.base, config.report_seeds, task)
  unresolved = config
  for t in {id(tune.task): tune.task, id(report.task): report.task}.values():
    metrics = check_task_for(unresolved, t)
    config = unresolved.for_task(metrics)  # the chosen metric, targets, networks
  reported = reported_metrics(config.select_metric, "correct" in metrics)
  num_classes = task_classes(tune.task.info)  # chance, for collapse (None: not recorded)
  params = tune.task.init(jax.random.key(0))
  param_bytes = models.param_bytes(params)
  programs: list[dict] = []
  results: dict[str, dict] = {}

  # 1. tune: every (rate, tuning seed) of the arms with a grid, on validation
  tuned = [runs[a.name] for a in config.arms if a.lr_from is None]
  groups = group_programs(tuned)
  for group, reason in zip(groups, why_separate(groups)):
    configs = [
        dict(arm=r.arm.name, learning_rate=lr, seed=s)
        for r in group
        for lr in r.arm.learning_rates
        for s in config.tune_seeds
    ]
    out = _run_logged(group, reason, configs, tune, "tune", config, programs, log)
    per_rate = {}
    for r in group:
      rows = [i for i, c in enumerate(configs) if c["arm"] == r.arm.name]
      per_rate[r.arm.name] = [
          _tuning_entry(r, lr, configs, rows, out, config, num_classes)
          for lr in r.arm.learning_rates
      ]
    results.update(_extend_grids(group, per_rate, config, tune, programs, log))

  # 2. choose: the arms with lr_from take their source's base rate (and the
  # flag of a source whose grid could not tune)
  for a in config.arms:
    if a.lr_from is not None:
      source = results[a.lr_from]
      untuned = (source["grid_edge"] or "").startswith(UNTUNABLE)
      results[a.name] = dict(
          tuning=None,
          lr_from=a.lr_from,
          grid_edge=f"{UNTUNABLE}: from '{a.lr_from}'" if untuned else None,
          chosen_learning_rate=source["chosen_learning_rate"],
      )

  # 3. report: every arm at its chosen rate on the fresh seeds, on test
  groups = group_programs([runs[a.name] for a in config.arms])
  for group, reason in zip(groups, why_separate(groups)):
    configs = [
        dict(arm=r.arm.name, learning_rate=results[r.arm.name]["chosen_learning_rate"], seed=s)
        for r in group
        for s in config.report_seeds
    ]
    out = _run_logged(group, reason, configs, report, "report", config, programs, log)
    for r in group:
      idx = [i for i, c in enumerate(configs) if c["arm"] == r.arm.name]
      rows = lambda values: [values[i].tolist() for i in idx]
      curves = {  # per split: the reported metrics, the loss last
          f"{split}_{q}_curve": rows(out["curves"][f"{split}_{q}"])
          for split in ("val", "test")
          for q in [q for q in reported if q != "loss"] + ["loss"]
      }
      worker = "error" if "test_error" in out["curves"] else "loss"
      results[r.arm.name]["report"] = dict(
          seeds=list(config.report_seeds),
          eval_steps=r.eval_steps.tolist(),
          **curves,
          train_loss_curve=rows(out["train_loss"]),
          **{f"worker_test_{worker}": rows(out["final"][f"worker_test_{worker}"])},
          worker_center_distance=[float(out["final"]["worker_center_distance"][i]) for i in idx],
      )

  # 4. statistics: intervals over the report seeds, time to target
  step_s = {}
  arms_out = {}
  for a in config.arms:
    r = runs[a.name]
    res = results[a.name]
    key = (r.config.per_worker_batch_size,)
    if key not in step_s:
      step_s[key] = measure_step_seconds(tune.task, key[0])
    arms_out[a.name] = summarize_arm(
        r,
        res,
        config,
        step_s[key],
        _communication(r, tune.task, elastic.reduced_bytes(params)),
        reported,
        num_classes,
    )
  return _finish(
      config,
      arms_out,
      programs,
      step_s,
      param_bytes,
      models.count_params(params),
      time.perf_counter() - start,
      workdir,
      tune.task,
      group_by,
  )


def _worst(config: ProtocolConfig) -> float:
  """The score of a diverged or non-finite tuning run: an error of 1, else the
  worst value of the chosen metric (inf when lower is better, -inf when higher)."""
  if config.select_metric == "error":
    return 1.0
  return np.inf if config.select_better == "lower" else -np.inf


def _tuning_entry(
    r: ArmRun, lr: float, configs, rows, out, config, num_classes: int | None = None
) -> dict:
  """The tuning result of rate ``lr`` of arm ``r``: every tuning seed's final and
  best validation ``select_metric`` (``val_<metric>_final``, ``_best``, ``_curve``),
  divergence and collapse (:func:`_failures` of the validation loss and error;
  ``num_classes``: the task's, for chance), and the score rates are compared by
  (the mean final value, a diverged, collapsed or non-finite run counting
  :func:`_worst`)."""
  metric, lower = config.select_metric, config.select_better == "lower"
  curves = out["curves"][f"val_{metric}"]
  idx = [i for i in rows if configs[i]["learning_rate"] == lr]
  final = [float(curves[i, -1]) for i in idx]
  best = [float(np.nanmin(curves[i]) if lower else np.nanmax(curves[i])) for i in idx]
  errors = out["curves"].get("val_error")
  div, col = _failures(
      [out["curves"]["val_loss"][i] for i in idx],
      None if errors is None else [errors[i] for i in idx],
      config.divergence_factor,
      num_classes,
  )
  scored = [
      _worst(config) if d or c or not np.isfinite(e) else e for e, d, c in zip(final, div, col)
  ]
  entry = {
      "learning_rate": lr,
      "resolved_learning_rate": lr * r.config.lr_scale,
      f"val_{metric}_final": final,
      f"val_{metric}_best": best,
      "diverged": div,
      "collapsed": col,
      "score": float(np.mean(scored)),
      f"val_{metric}_curve": [curves[i].tolist() for i in idx],
  }
  if metric != "error" and "val_error" in out["curves"]:  # a classifier's error as well
    entry["val_error_curve"] = [out["curves"]["val_error"][i].tolist() for i in idx]
  return entry


def _extend_grids(group: list[ArmRun], per_rate: dict, config, tune, programs, log) -> dict:
  """The choices of one program's arms, each grid extended while its chosen rate
  sits at an edge.

  While an arm's best rate is its grid's lowest or highest, one more rate one
  log step beyond it (the grid's own ratio) is tuned on the same seeds, its
  runs added to those the arm has, until the chosen rate is interior, the new
  rate diverges or collapses on every tuning seed (the best then lies next to
  a failing rate: bracketed), its resolved rate leaves float32's range, or
  ``config.max_grid_extensions`` rates were added. The arms of one program
  that extend in the same round share that round's program (one compilation,
  one run over all their new configurations).

  Args:
    group: the arms of one tuning program.
    per_rate: arm name -> its tuning entries (:func:`_tuning_entry`), one per
      rate of its first grid; extended in place.

  Returns:
    Arm name -> its tuning entry: ``tuning`` (per rate, sorted),
    ``learning_rates`` (the grid as tuned), ``chosen_learning_rate``,
    ``grid_edge`` (of the extended grid), ``grid_extended`` (the rates added,
    in order) and ``grid_extension`` (why it stopped: "interior", "diverged"
    (every tuning run of the new rate diverged), "collapsed" (each diverged
    or collapsed, some collapsed), "range", "limit", or None when the first
    grid's choice was not at an edge).
  """
  num_classes = task_classes(tune.task.info)

  sign = 1.0 if config.select_better == "lower" else -1.0

  def choose(name, rates):
    entries = per_rate[name]
    chosen = entries[int(np.argmin([sign * p["score"] for p in entries]))]["learning_rate"]
    return chosen, lr_grid_edges(rates, chosen, entries, config.select_metric)

  state = {}
  for r in group:
    rates = list(r.arm.learning_rates)
    chosen, edge = choose(r.arm.name, rates)
    ratio = sorted(rates)[1] / sorted(rates)[0] if len(rates) > 1 else None
    state[r.arm.name] = dict(
        rates=rates, chosen=chosen, edge=edge, added=[], stop=None, ratio=ratio
    )
  while True:
    extending = []  # (arm run of the new rate alone, the new rate, the edge)
    for r in group:
      st = state[r.arm.name]
      if st["stop"] is not None or st["edge"] not in ("low", "high"):
        continue
      if len(st["added"]) >= config.max_grid_extensions:
        st["stop"] = "limit"
        continue
      edge = st["edge"]
      new = min(st["rates"]) / st["ratio"] if edge == "low" else max(st["rates"]) * st["ratio"]
      try:
        r.config.replace(learning_rate=new).validate()  # its resolved rate in float32's range
      except ConfigError:
        st["stop"] = "range"
        continue
      one = dataclasses.replace(r, arm=dataclasses.replace(r.arm, learning_rates=(new,)))
      extending.append((one, new, edge))
    if not extending:
      break
    configs = [
        dict(arm=one.arm.name, learning_rate=new, seed=s)
        for one, new, _ in extending
        for s in config.tune_seeds
    ]
    why = "grid extended at " + ", ".join(
        f"its {edge} edge" if len(extending) == 1 else f"the {edge} edge of '{one.arm.name}'"
        for one, _, edge in extending
    )
    out = _run_logged(
        [one for one, _, _ in extending], why, configs, tune, "tune", config, programs, log
    )
    for one, new, _ in extending:
      name = one.arm.name
      st = state[name]
      rows = [i for i, c in enumerate(configs) if c["arm"] == name]
      entry = _tuning_entry(one, new, configs, rows, out, config, num_classes)
      per_rate[name].append(entry)
      st["rates"].append(new)
      st["added"].append(new)
      st["chosen"], st["edge"] = choose(name, st["rates"])
      if all(d or c for d, c in zip(entry["diverged"], entry["collapsed"])):
        # the best lies next to a failing rate: bracketed
        st["stop"] = "diverged" if all(entry["diverged"]) else "collapsed"
  results = {}
  for r in group:
    st = state[r.arm.name]
    entries = per_rate[r.arm.name]
    order = np.argsort([p["learning_rate"] for p in entries])
    results[r.arm.name] = dict(
        tuning=[entries[i] for i in order],
        learning_rates=sorted(st["rates"]),
        chosen_learning_rate=st["chosen"],
        grid_edge=st["edge"],
        grid_extended=st["added"],
        grid_extension=st["stop"] or ("interior" if st["added"] else None),
    )
  return results


def _run_logged(group, reason, configs, seed_data, kind, config, programs, log):
  """:func:`run_program`, its info (and why its arms run apart) appended to
  ``programs`` and one progress line logged; returns its outputs."""
  check_interrupt()  # a signal whose exception was swallowed stops here
  out, info = run_program(group, configs, seed_data, kind, config)
  info["separate_because"] = reason
  programs.append(info)
  log(
      f"{kind:6s} {info['algorithm']:11s} {len(group):2d} arm(s) {info['configs']:4d} "
      f"configs  {info['wall_s']:7.1f} s ({info['compile_s']:.1f} s compiling)"
  )
  return out


def per_seed_key(key: str) -> str:
  """The key of the per-seed values of an interval's key of ``summarize_arm``:
  ``final_test_errors`` and ``test_errors_at_best_val`` (the error's, plural),
  else ``<key>_by_seed`` (``final_test_loss_by_seed``)."""
  plural = {
      "final_test_error": "final_test_errors",
      "test_error_at_best_val": "test_errors_at_best_val",
      "final_worker_test_error": "final_worker_test_errors",
  }
  return plural.get(key, f"{key}_by_seed")


def _interval(values) -> dict | None:
  """``mean_interval`` of per-seed values; None when one is not finite (a
  diverged seed's loss)."""
  values = np.asarray(values, np.float64)
  return stats.mean_interval(values) if np.all(np.isfinite(values)) else None


def summarize_arm(
    run: ArmRun,
    res: dict,
    config: ProtocolConfig,
    step_s: float,
    comm: Callable,
    reported: Sequence[str] = ("error",),
    num_classes: int | None = None,
) -> dict:
  """The arm's reported numbers with 95% intervals over the report seeds.

  ``config`` is resolved for its task (``ProtocolConfig.for_task``; an
  unresolved one is resolved here, a classifier's where the report has
  ``test_error_curve``). For each
  test metric Q of ``reported`` (``easgd.protocol.config.reported_metrics``):
  ``final_test_Q`` (the last evaluation) and ``test_Q_at_best_val`` (the
  evaluation with the best validation ``select_metric``, at step
  ``best_val_steps``), each the mean with its interval over the report seeds
  and per seed (:func:`per_seed_key`: ``final_test_errors``,
  ``test_errors_at_best_val``, ``final_test_loss_by_seed``, ...); a diverged
  seed counts as error 1, and makes another metric's interval None (its
  value null). The workers' final test error (a classifier's) or loss:
  ``final_worker_test_error`` or ``final_worker_test_loss``. No number is a
  minimum over the test evaluations. Per seed, ``diverged`` (the test loss
  non-finite or above ``divergence_factor`` times its start) and, of the
  others, ``collapsed`` (``easgd.run.compare.collapsed`` of the center's test
  loss at the start and the end and its final test error, chance from
  ``num_classes``, the task's number of classes; None: the loss criterion
  alone). The time to each target test error
  (``time_to_target``) is a classifier's only: empty for a task without
  ``"correct"`` (no targets).

  ``comm(steps) -> ((all_reduces, bytes[, all_gathers, gathered_bytes]) across
  workers, (the same) within a worker)`` per device (:func:`_communication`;
  missing all-gather counts are 0; where there are any, ``all_gathers`` and
  ``gathered_bytes_per_worker`` are reported beside the all-reduces): the
  across-workers counts are ``all_reduces`` and ``bytes_per_worker`` (and
  ``communication_curve``'s ``all_reduces`` and ``bytes`` at the
  evaluations), the within-worker ones ``within_worker_all_reduces``,
  ``within_worker_bytes`` (``within_all_reduces``, ``within_bytes``); the
  modelled seconds per network take both (``Network.modelled_seconds``,
  ``TwoLevelNetwork.modelled_seconds`` on the arm's layout of
  ``num_workers`` x ``devices_per_worker`` devices).
  """
  given = comm
  comm = lambda t: tuple(tuple(level) + (0,) * (4 - len(level)) for level in given(t))
  rep = res["report"]
  c = run.config
  if config.select_metric is None:  # not resolved for its task: as the report's curves say
    config = config.for_task(("loss", "correct") if "test_error_curve" in rep else ("loss",))
  sign = 1.0 if config.select_better == "lower" else -1.0
  at_val = [
      stats.best_val_index([None if v is None else sign * v for v in curve])
      for curve in rep[f"val_{config.select_metric}_curve"]
  ]
  intervals, by_seed = {}, {}
  for q in reported:
    curves = [[np.nan if v is None else v for v in curve] for curve in rep[f"test_{q}_curve"]]
    final = np.asarray([curve[-1] for curve in curves], np.float64)
    at_best_val = np.asarray([curve[i] for curve, i in zip(curves, at_val)], np.float64)
    if q == "error":  # a diverged seed's error counts 1
      final = np.nan_to_num(final, nan=1.0)
      at_best_val = np.where(np.isfinite(at_best_val), at_best_val, 1.0)
    for key, values in ((f"final_test_{q}", final), (f"test_{q}_at_best_val", at_best_val)):
      intervals[key] = _interval(values)
      by_seed[per_seed_key(key)] = [v if np.isfinite(v) else None for v in values.tolist()]
  worker = "error" if "worker_test_error" in rep else "loss"
  workers_final = np.asarray(rep[f"worker_test_{worker}"], np.float64).mean(axis=1)
  diverged, collapsed_seeds = _failures(
      rep["test_loss_curve"],
      rep.get("test_error_curve"),
      config.divergence_factor,
      num_classes,
  )
  steps = run.eval_steps
  ttt = {}
  for target in config.targets:  # a classifier's (none without "correct")
    curves = np.asarray(rep["test_error_curve"], np.float64)
    hits = [stats.first_reach(curve, steps, target) for curve in curves]
    entry = dict(steps=hits, reached=sum(h is not None for h in hits), n=len(hits))
    if all(h is not None for h in hits):
      comms = [comm(h) for h in hits]
      entry["summary"] = dict(
          steps=stats.mean_interval(hits),
          samples=stats.mean_interval([h * c.global_batch_size for h in hits]),
          all_reduces=stats.mean_interval([a[0] for a, _ in comms]),
          bytes=stats.mean_interval([a[1] for a, _ in comms]),
          **(
              dict(gathered_bytes=stats.mean_interval([a[3] for a, _ in comms]))
              if any(a[2] for a, _ in comms)
              else {}
          ),
          modelled_s={
              n.name: stats.mean_interval(
                  [
                      n.modelled_seconds(
                          h, step_s, across, within, c.num_workers, c.devices_per_worker
                      )
                      for h, (across, within) in zip(hits, comms)
                  ]
              )
              for n in config.networks
          },
      )
    ttt[str(target)] = entry
  total, total_within = comm(run.num_steps)
  at_evals = [comm(t) for t in steps]
  return dict(
      algorithm=c.algorithm,
      config=c.to_dict(),
      num_steps=run.num_steps,
      steps_per_epoch=run.steps_per_epoch,
      epochs=c.num_epochs,
      learning_rates=list(res.get("learning_rates", run.arm.learning_rates)),
      grid_extended=res.get("grid_extended", []),
      grid_extension=res.get("grid_extension"),
      lr_from=run.arm.lr_from,
      chosen_learning_rate=res["chosen_learning_rate"],
      resolved_learning_rate=res["chosen_learning_rate"] * c.lr_scale,
      lr_scale=c.lr_scale,
      grid_edge=res["grid_edge"],
      tuning=res["tuning"],
      report=rep,
      **intervals,
      **{f"final_worker_test_{worker}": _interval(workers_final)},
      **by_seed,
      best_val_steps=[int(steps[i]) for i in at_val],
      **{
          per_seed_key(f"final_worker_test_{worker}"): [
              v if np.isfinite(v) else None for v in workers_final.tolist()
          ]
      },
      diverged=diverged,
      collapsed=collapsed_seeds,
      time_to_target=ttt,
      compute_per_step_s=step_s,
      communication_curve=dict(
          all_reduces=[a[0] for a, _ in at_evals],
          bytes=[a[1] for a, _ in at_evals],
          within_all_reduces=[w[0] for _, w in at_evals],
          within_bytes=[w[1] for _, w in at_evals],
          # compressed exchanges (all-gathers of their payloads): only where there are any
          **(
              dict(
                  all_gathers=[a[2] for a, _ in at_evals],
                  gathered_bytes=[a[3] for a, _ in at_evals],
              )
              if total[2]
              else {}
          ),
      ),
      all_reduces=total[0],
      bytes_per_worker=total[1],
      within_worker_all_reduces=total_within[0],
      within_worker_bytes=total_within[1],
      **(dict(all_gathers=total[2], gathered_bytes_per_worker=total[3]) if total[2] else {}),
      samples=run.num_steps * c.global_batch_size,
  )


def _finish(
    config, arms, programs, step_s, param_bytes, num_params, seconds, workdir, task, group_by
):
  results = dict(
      protocol=to_dict(config),
      machine=dict(
          platform=jax.devices()[0].platform,
          jax_version=jax.__version__,
          cpu_count=os.cpu_count(),
          processor=platform.processor() or None,
          note="wall times from this machine, which other jobs may share",
      ),
  )
  if task.factory != builtin_tasks.BUILTIN_FACTORY:  # the base's dataset and model do not say it
    results["task"] = task.describe()
  k = task_classes(task.info)  # the line a run's final error collapses at (None: loss alone)
  results["collapse"] = dict(
      num_classes=k,
      chance_error=None if k is None else chance_error(k),
      margin=COLLAPSE_MARGIN,
      error_at_least=None if k is None else (1 - COLLAPSE_MARGIN) * chance_error(k),
  )
  results.update(
      num_params=num_params,
      param_bytes=param_bytes,
      compute_per_step_s={str(k[0]): v for k, v in step_s.items()},
      arms=arms,
      programs=programs,
      wall_time_s=round(seconds, 1),
  )
  if workdir is not None:  # every file of the protocol, by its one writer
    write_report(workdir, group_by, results)
  return results


def results_json(results: dict[str, Any]) -> str:
  """``results`` as the text of ``results.json``: strict JSON
  (``easgd._util.files.json_text``), NumPy values as Python ones, and ``null``
  where a number was not finite (a diverged run's loss or error) or was not
  measured (``train_loss_curve`` at step 0, before any step)."""
  return json_text(results, indent=1)
