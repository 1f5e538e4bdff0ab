"""``compare``: several algorithms on the same data budget, one plot and one table.

Every algorithm runs the same config and task (data and model: the built-in
data set and model, ``--task`` or a ``easgd.tasks.task.Task``; global
batch, epochs, learning-rate schedule, seed: the same initial parameters and
data order) in its own sub-directory of ``workdir``; then ``comparison.png``
and ``results.md`` / ``results.json`` (the table) are written beside them.

A shared setting applies to the algorithms that read it (the algorithm table,
``easgd.methods.registry``); for the others it is reset to its default
(``TrainConfig.for_algorithm``) and reported: ``results.md`` says which
setting was not read by which algorithm, and the table shows, per row, every
setting that differs between the rows (optimizer, learning rate, momentum,
delta, tau, beta, ...; "-" where the algorithm does not read it). A setting
that no algorithm of the list reads is refused.

``comparison.png`` has three panels: center test error (a task without a
``"correct"`` metric: center test loss; the table likewise) against epochs,
against the megabytes each worker communicated (``Algorithm.communication``:
the reduced buffers, what a ring all-reduce puts on the wire is 2 (p - 1) / p
times this), and against simulated time in ticks (``easgd.methods.registry.
simulated_ticks``: the asynchronous methods' clock with unequal worker speeds;
with equal speeds one tick is one step for every method).

With a target error (``--target-error E``, tasks with test accuracy) each row
also gives the measured time to it: the first evaluation whose center test
error is <= E, its training clock (``times.jsonl``) and step
(``easgd.run.timing.time_to_target``; ``eval_every_steps`` narrows it).

A run that finishes but learns nothing is flagged ``collapsed`` (:func:`collapsed`:
its center's test loss ends at or above its start, or its error within
:data:`COLLAPSE_MARGIN` of chance): one definition, which the protocol and the
sweeps report beside divergence too. A diverged run stops ``compare`` with its
``DivergenceError``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from easgd._util import checks
from easgd._util.files import json_text, write_text_atomic
from easgd.methods import registry
from easgd.run import timing
from easgd.run.rundir import check_workdir, drop_previous_run, move_aside, workdir_path
from easgd.run.runlock import LOCK_FILES, hold_workdir
from easgd.run.trainer import run_task, train_and_evaluate
from easgd.settings import builtin_tasks, reads
from easgd.settings.config import ConfigError, TrainConfig, as_train_config
from easgd.tasks.task import Task

RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"
PLOT_FILE = "comparison.png"
DEFAULT_ALGORITHMS = registry.DEFAULT_COMPARISON
"""What ``compare`` runs when no names are given (the CLI's default too)."""


COLLAPSE_MARGIN = 0.1
"""How near chance a classifier's final error may end before its run counts as
collapsed (:func:`collapsed`), as a fraction of the chance error: collapsed at
``error >= (1 - COLLAPSE_MARGIN) * chance``, a run that closed less than 10% of
the way from chance to no error (10 classes: error >= 0.81; 2 classes: >= 0.45).
Relative, so that the line means the same at any number of classes (an absolute
``chance - 0.1`` would call a 60%-accurate binary classifier collapsed). 10%:
far above the test-set noise of a run at chance (binomial sd of an error of 0.9
on 1,000 examples: 0.0095, so such a run lies 9 sd above the line). In the
committed MNIST-1D results (``paper_notes/figures/protocol_seeds``) the seeds
at chance end at 0.89 to 0.91 error with their loss at about ln 10 = 2.30; the
errors between 0.5 and 0.85 form a continuum, so no line separates cleanly, and
this one counts only runs that kept nine tenths of chance's error."""


def chance_error(num_classes: int) -> float:
  """``1 - 1/num_classes``: the error of a guess that ignores the input, with
  equally likely classes (every built-in data set; with unequal classes the
  majority class's guess errs less, and the loss criterion of
  :func:`collapsed` remains).

  Raises:
    ValueError: num_classes not an integer >= 2.
  """
  return 1.0 - 1.0 / checks.integer("num_classes", num_classes, 2)


def task_classes(info: Mapping[str, Any]) -> int | None:
  """The number of classes a task records: ``num_classes`` of its ``info``
  (``easgd.tasks.task.Task.info``, or ``Task.describe()`` as in ``summary.json``;
  every built-in task records it); None when it records none (an integer >= 2)."""
  k = info.get("num_classes") if isinstance(info, Mapping) else None
  ok = isinstance(k, int) and not isinstance(k, bool) and k >= 2
  return k if ok else None


COLLAPSED_NOTE = (
    f"Collapsed: the run finished, but its center's test loss ended at or above its "
    f"start, or its test error within {100 * COLLAPSE_MARGIN:g}% of chance "
    f"(1 - 1/classes; easgd.run.compare.collapsed)."
)
"""The note under a table with a collapsed row (``compare`` and the protocol's results.md)."""


def _finite(value) -> bool:
  return value is not None and math.isfinite(float(value))


def collapsed(
    loss_start: float | None,
    loss_final: float | None,
    final_error: float | None = None,
    num_classes: int | None = None,
) -> bool:
  r"""Whether a run finished (finite) but learned nothing: the one definition of
  collapse, which the protocol (``easgd.protocol.runs``), ``compare`` and the sweeps
  (``easgd.sweeps.grid``) report beside divergence.

  .. math::

     \mathrm{collapsed} \iff L_T \text{ finite} \wedge \big(L_T \ge L_0
     \;\vee\; e_T \ge (1 - m)\,(1 - 1/K)\big)

  with :math:`L_0, L_T` the center's evaluated loss at the start (step 0) and at
  the end, :math:`e_T` its final error, K the number of classes and m =
  :data:`COLLAPSE_MARGIN`: the loss ended at or above its start, or a
  classifier's error ended within 10% of chance (:func:`chance_error`). A run
  whose loss is not finite is diverged, not collapsed (divergence is the
  callers' test, against their ``divergence_factor``); a run that diverged by
  that factor with a finite loss is both, and the callers count it diverged.

  Args:
    loss_start: the center's loss at step 0 (None or non-finite: the loss
      criterion is not applied).
    loss_final: its loss at the last evaluation (None or non-finite: False).
    final_error: its final error, a fraction (None: not a classifier, or not
      known; the error criterion is not applied).
    num_classes: the task's classes (:func:`task_classes`; None: the error
      criterion is not applied).

  Returns:
    True if collapsed.

  Example:
    >>> collapsed(2.30, 2.25, final_error=0.85, num_classes=10)   # 0.85 >= 0.81
    True
    >>> collapsed(2.30, 1.10, final_error=0.57, num_classes=10)   # learned something
    False
    >>> collapsed(0.5, 0.5)                                       # loss never fell
    True
  """
  if not _finite(loss_final):
    return False
  if _finite(loss_start) and float(loss_final) >= float(loss_start):
    return True
  if num_classes is None or not _finite(final_error):
    return False
  return float(final_error) >= (1.0 - COLLAPSE_MARGIN) * chance_error(num_classes)


_HIDDEN = ("alpha", "push_timing", "curvature", "sync_warmup_steps")
"""Algorithm settings no column shows: alpha (beta shows the resolved value),
curvature (a check, the run computes the same without it), push_timing and
sync_warmup_steps (never columns so far: the tables stay as they were)."""

_OPTIMIZER = ("optimizer", "learning_rate", "momentum", "delta", "weight_decay")
SETTINGS = (
    *_OPTIMIZER,
    *(f for f in registry.ALGORITHM_FIELDS if f not in _OPTIMIZER + _HIDDEN),
    "lr_schedule",
    "param_dtype",
    "compute_dtype",
)
"""Config fields a comparison row can differ in (shown when they differ): the
local optimizer's (delta is the momentum built into some methods), the
algorithm-specific fields of ``easgd.methods.registry.ALGORITHM_FIELDS``, the
schedule and the dtypes."""


def _settings(config: TrainConfig) -> dict[str, Any]:
  """The settings of :data:`SETTINGS` that ``config``'s run reads (others absent:
  ``easgd.settings.reads.METHOD_RULES``, what the algorithm and its optimizer read)."""
  out = {}
  for name in SETTINGS:
    if not reads.is_read(config, name, reads.METHOD_RULES):
      continue
    out[name] = (
        config.resolved_alpha * config.num_workers if name == "beta" else getattr(config, name)
    )
  return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items()}


def _row(
    summary: dict[str, Any], config: TrainConfig, reached: dict[str, Any] | None = None
) -> dict[str, Any]:
  """A table row of a run's summary (``summary["history"]``: its records).

  ``test_accuracy`` and ``best_test_accuracy`` are absent for a task whose
  ``evaluate`` has no ``"correct"``; ``best_test_loss`` is the lowest center
  test loss of the evaluated epochs. ``reached``: the run's
  ``easgd.run.timing.time_to_target`` with its ``target_error``, given as
  ``target_error``, ``time_to_target_s``, ``time_to_target_step`` and
  ``time_to_target_bracket_s`` (None: not reached); None: absent.
  ``collapsed``: :func:`collapsed` of the center's test loss at step 0 and at
  the end, and of its final test error against the classes the task records
  (``summary["task"]``).
  """
  final, comm = summary["final"], summary["communication"]
  first = summary["history"][0]
  failed = collapsed(
      first["test_loss"] if first["step"] == 0 else None,
      final["test_loss"],
      1.0 - final["test_accuracy"] if "test_accuracy" in final else None,
      task_classes(summary.get("task", {})),
  )
  accuracy = (
      dict(test_accuracy=final["test_accuracy"], best_test_accuracy=summary["best_test_accuracy"])
      if "test_accuracy" in final
      else {}
  )
  return dict(
      algorithm=summary["algorithm"]["name"],
      num_workers=config.num_workers,
      settings=_settings(config),
      epochs=final["epoch"],
      steps=final["step"],
      **accuracy,
      test_loss=final["test_loss"],
      best_test_loss=min(r["test_loss"] for r in summary["history"]),
      collapsed=failed,
      center_lag_steps=summary.get("center_lag_steps"),
      all_reduces_per_worker=comm["all_reduces"],
      mb_per_worker=comm["bytes"] / 1e6,
      wall_time_s=summary["wall_time_s"],
      **(
          {}
          if reached is None
          else dict(
              target_error=reached["target_error"],
              time_to_target_s=reached["time_s"],
              time_to_target_step=reached["step"],
              time_to_target_bracket_s=reached["bracket_s"],
          )
      ),
  )


IDENTITY = ("tau", "beta", "delta")
"""Settings that tell the compared methods apart: a column whenever a row reads them."""


def differing_settings(rows: Sequence[dict[str, Any]]) -> list[str]:
  """The settings worth a column in a table of ``rows``.

  A setting of :data:`IDENTITY` that any row reads; any other setting whose
  value differs between the rows that read it, or that only some rows read,
  at a value other than its default. So a setting at its default that only
  some methods read (``reset_opt_state`` of EASGD beside pmean SGD) and a
  setting every row shares (the optimizer of all rows) stay out, and a
  learning rate that differs between rows gets a column.
  """
  from easgd.settings.config import TrainConfig  # the defaults

  defaults = TrainConfig()
  names = []
  for name in SETTINGS:
    read = [r["settings"][name] for r in rows if name in r["settings"]]
    if not read:
      continue
    default = getattr(defaults, name)
    default = list(default) if isinstance(default, tuple) else default
    if name == "beta":
      default = read[0]  # resolved per row (beta = p alpha): compared between rows
    differ = len({json.dumps(v) for v in read}) > 1
    partly_read = len(read) < len(rows) and any(v != default for v in read)
    if name in IDENTITY or differ or partly_read:
      names.append(name)
  return names


def results_table(rows: Sequence[dict[str, Any]], notes: Sequence[str] = ()) -> str:
  """A Markdown table of compare rows.

  Args:
    rows: one dict per algorithm, as :func:`_row` makes from a run summary
      (algorithm, num_workers, settings, epochs, test_accuracy (fraction,
      absent for a task without a ``"correct"`` metric), best_test_accuracy,
      test_loss, best_test_loss, all_reduces_per_worker, mb_per_worker,
      wall_time_s, collapsed; with a target error: target_error,
      time_to_target_s, time_to_target_step).
    notes: lines printed under the table (e.g. settings an algorithm did not
      read).

  Returns:
    The table as Markdown text, one line per row: the center's final and best
    test accuracy in percent, or, when a row has no accuracy (a task whose
    ``evaluate`` gives only losses), its final and lowest test loss (nats per
    example, as the task's ``"loss"``); one column per setting that differs
    between the rows ("-": not read); with a target error, the measured time
    to it (s) and its step ("-": not reached). A collapsed run (:func:`collapsed`;
    a diverged one stops ``compare`` with its error) has " (collapsed)" after
    its final value and a note under the table saying what that means.
  """
  diff = differing_settings(rows)
  target = next((r["target_error"] for r in rows if "target_error" in r), None)
  accuracy = all(r.get("test_accuracy") is not None for r in rows)
  fmt = (
      lambda v: "-"
      if v is None
      else (
          format(v, "g")
          if isinstance(v, float)
          else ",".join(map(str, v))
          if isinstance(v, list)
          else str(v)
      )
  )
  head = (
      ["algorithm", "p"]
      + diff
      + [
          "epochs",
          "center test acc. (final)" if accuracy else "center test loss (final)",
          "best",
          "all-reduces / worker",
          "MB / worker",
          "wall time (s)",
      ]
      + ([] if target is None else [f"time to {target:g} error (s)", "at step"])
  )
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  flag = lambda r: " (collapsed)" if r.get("collapsed") else ""
  for r in rows:
    cells = (
        [r["algorithm"], str(r["num_workers"])]
        + [fmt(r["settings"].get(name)) for name in diff]
        + [
            str(r["epochs"]),
            *(
                (
                    f"{100 * r['test_accuracy']:.2f}%" + flag(r),
                    f"{100 * r['best_test_accuracy']:.2f}%",
                )
                if accuracy
                else (f"{r['test_loss']:.4g}" + flag(r), f"{r['best_test_loss']:.4g}")
            ),
            str(r["all_reduces_per_worker"]),
            f"{r['mb_per_worker']:.1f}",
            f"{r['wall_time_s']:.0f}",
        ]
        + (
            []
            if target is None
            else [fmt(r.get("time_to_target_s")), fmt(r.get("time_to_target_step"))]
        )
    )
    lines.append("| " + " | ".join(cells) + " |")
  text = "\n".join(lines) + "\n"
  if any(r.get("collapsed") for r in rows):
    notes = [*notes, COLLAPSED_NOTE]
  if notes:
    text += "\n" + "\n".join(notes) + "\n"
  return text


def plan(config: TrainConfig, algorithms: Sequence[str]) -> tuple[list[TrainConfig], list[str]]:
  """The per-algorithm configs of a comparison, and its notes.

  Each algorithm gets ``config.for_algorithm(name)``: the shared settings it
  reads, the others at their defaults.

  Returns:
    ``(configs, notes)``: validated configs in the order of ``algorithms``;
    one note line per shared setting some algorithm does not read.

  Raises:
    ConfigError: a shared setting that no algorithm of the list reads, or a
      config that fails validation for one of them.
  """
  configs, unread_by = [], {}
  for a in algorithms:
    c, unread = config.for_algorithm(a)
    configs.append(c.validate())
    for name, value in unread.items():
      unread_by.setdefault(name, (value, []))[1].append(a)
  notes = []
  for name, (value, names) in unread_by.items():
    if len(names) == len(algorithms):
      raise ConfigError(
          f"{name}={value!r} is read by none of the compared algorithms "
          f"({', '.join(algorithms)}); leave it at its default or compare an "
          f"algorithm that reads it"
      )
    notes.append(f"Not read by {', '.join(names)} (run at its default): " f"{name}={value!r}.")
  return configs, notes


def resolve_runs(configs: Sequence[TrainConfig], task: Task | None = None) -> Task:
  """Every run's task and what each run derives from its data's size, checked
  for every run before the first one starts.

  Each config's task is checked as ``train_and_evaluate`` checks it
  (``easgd.run.trainer.run_task``: it builds, its data and functions fit
  the run, runtime "ray" has an import path), then ``TrainConfig.resolve``
  with the steps per epoch of its training data (validation held out), as
  ``easgd.runtimes.training_run.Run`` does.

  Args:
    configs: validated configs (:func:`plan`), sharing one task.
    task: the task, or None for the one the configs name (``config.task``,
      or the built-in ``dataset`` and ``model``), built once here.

  Returns:
    The task, for every run of the comparison.

  Raises:
    ConfigError: a derived value one of the runs refuses (tau or K against the
      run's length, a center no exchange moves, the schedule in steps), a
      task built in code with runtime "ray";
    easgd.tasks.task.TaskError, easgd.tasks.data.DataError: a task that
      does not build or does not fit a run (data too few for one step).
  """
  for c in configs:  # checked_task resolves what the data's size derives, before tracing
    _, task, _ = run_task(c, task)
  return task


def compare(
    config: TrainConfig,
    workdir,
    algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
    *,
    overwrite: bool = False,
    task: Task | None = None,
    target_error: float | None = None,
) -> list[dict[str, Any]]:
  """Runs ``algorithms`` on ``config``'s data budget; writes plot and table.

  Args:
    config: the shared configuration (its ``algorithm`` field is ignored).
    workdir: output directory; each run goes to ``workdir/<algorithm>``.
    algorithms: names from ``easgd.methods.registry.ALGORITHMS``, no repeats;
      default :data:`DEFAULT_ALGORITHMS`.
    overwrite: replace an earlier comparison in ``workdir``: it is moved to
      ``workdir/previous_run`` (table, plot and runs together) and deleted only
      once the new comparison is complete, so one that fails leaves it whole.
    task: the problem of every run (``easgd.tasks.task.Task``), built once
      and passed to each ``train_and_evaluate``; None: the one ``config``
      names (``config.task``, an import path, or the built-in ``dataset`` and
      ``model``). A task without a ``"correct"`` metric is compared by its
      center test loss (table and plot).
    target_error: a center test error in (0, 1): each row adds the measured
      time to reach it (``easgd.run.timing.time_to_target`` of the run's
      ``metrics.jsonl`` and ``times.jsonl``); a task with test accuracy only.
      None: not measured.

  Returns:
    One table row (dict) per algorithm, also in ``results.json`` (with the
    notes: ``{"rows": [...], "notes": [...]}``).

  Raises:
    ConfigError: ``config`` not a TrainConfig, ``algorithms`` not a list of
      names, unknown or repeated algorithm names, bad config values, a
      shared setting none of them reads, or a workdir that already holds runs
      (without ``overwrite``), or a value derived from the data's size that
      one run refuses (:func:`resolve_runs`), a ``target_error`` not in
      (0, 1) or with a task without test accuracy; checked for every
      algorithm before the first one starts.
    easgd.tasks.task.TaskError: a task that does not build or fit the runs
      (:func:`resolve_runs`), before the first one starts.
    easgd.run.runlock.WorkdirInUseError: another command holds ``workdir`` or one
      of its runs' directories.
  """
  config = as_train_config(config)
  overwrite = checks.flag("overwrite", overwrite, error=ConfigError)
  if isinstance(algorithms, str) or not isinstance(algorithms, Sequence):
    raise ConfigError(
        f"algorithms must be a list of names (e.g. " f"['easgd', 'pmean_sgd']), got {algorithms!r}"
    )
  algorithms = list(algorithms)
  if not algorithms:
    raise ConfigError(f"algorithms must name at least one of " f"{', '.join(registry.ALGORITHMS)}")
  for a in algorithms:
    if a not in registry.ALGORITHMS:
      raise ConfigError(f"unknown algorithm {a!r}; allowed: " f"{', '.join(registry.ALGORITHMS)}")
  if len(set(algorithms)) != len(algorithms):
    raise ConfigError(f"algorithms has repeats: {algorithms}")
  workdir = workdir_path(workdir)
  if target_error is not None:
    target_error = checks.real(
        "target_error", target_error, 0, 1, open_low=True, open_high=True, error=ConfigError
    )
  configs, notes = plan(config, algorithms)
  task = resolve_runs(configs, task)
  if target_error is not None:
    _check_accuracy(configs[0], task, target_error)
  with hold_workdir(workdir, "compare"):  # its own directory; each run locks its own
    return _compare(config, workdir, algorithms, configs, notes, overwrite, task, target_error)


def _check_accuracy(config: TrainConfig, task: Task, target_error: float) -> None:
  """Refuses a target error for a task whose evaluation gives no test accuracy."""
  from easgd.runtimes.training_run import checked_task

  metrics = checked_task(config, task)[1]
  if "correct" not in metrics:
    raise ConfigError(
        f"target_error={target_error:g} needs a task with test accuracy (a 'correct' metric); "
        f"task {task.name!r} evaluates {', '.join(metrics)}; allowed: no target error"
    )


def _compare(
    config, workdir, algorithms, configs, notes, overwrite, task, target_error=None
) -> list[dict[str, Any]]:
  """:func:`compare` in ``workdir``, whose lock the caller holds."""
  for a in algorithms:
    check_workdir(workdir / a, overwrite, resumable=False)  # compare cannot resume
  if not overwrite and any((workdir / f).exists() for f in (RESULTS_MD, RESULTS_JSON, PLOT_FILE)):
    raise ConfigError(
        f"workdir '{workdir}' already holds a comparison; choose another "
        "directory or pass overwrite (--overwrite)"
    )
  _set_aside_comparison(workdir)
  summaries = [train_and_evaluate(c, workdir / c.algorithm, task=task) for c in configs]
  reached = [None] * len(configs)
  if target_error is not None:  # each run's measured time to the target
    reached = [
        dict(
            timing.time_to_target(
                s["history"], timing.read_times(workdir / c.algorithm), target_error
            ),
            target_error=target_error,
        )
        for s, c in zip(summaries, configs)
    ]
  rows = [_row(s, c, r) for s, c, r in zip(summaries, configs, reached)]
  from easgd.run.plotting import plot_comparison
  # simulated time: with the shared worker speeds, a synchronous method waits
  # for the slowest worker at every step (registry.simulated_ticks)
  histories = {
      s["algorithm"]["name"]: [
          dict(
              r,
              simulated_time=registry.simulated_ticks(
                  r["step"], config.replace(algorithm=c.algorithm)
              ),
          )
          for r in s["history"]
      ]
      for c, s in zip(configs, summaries)
  }
  plot_comparison(histories, workdir / PLOT_FILE, title=_title(config, task))
  write_text_atomic(workdir / RESULTS_MD, results_table(rows, notes))
  write_text_atomic(
      workdir / RESULTS_JSON,  # last: it marks the comparison complete
      json_text(dict(rows=rows, notes=notes), indent=2) + "\n",
  )
  drop_previous_run(workdir)
  return rows


def _set_aside_comparison(workdir: Path) -> None:
  """Moves an earlier comparison in ``workdir`` to ``workdir/previous_run``.

  Its table, plot and every algorithm's run directory move together, and are
  deleted only once the new comparison has written ``results.json``: a new
  comparison that fails part-way leaves the earlier one whole (and no table
  mixing old and new rows). If ``previous_run`` is already there and
  ``results.json`` is not, an earlier overwrite failed: ``previous_run`` still
  holds the last complete comparison, so it is kept and the failed attempt's
  files are dropped instead. Empty directories (made by the checks) are removed;
  the lock files of a killed run (``easgd.run.runlock.LOCK_FILES``) are no run.
  """
  entries = [workdir / f for f in (RESULTS_MD, RESULTS_JSON, PLOT_FILE)]
  entries += [workdir / a for a in registry.ALGORITHMS]
  old = []
  for e in entries:
    if e.is_dir() and all(p.name in LOCK_FILES for p in e.iterdir()):
      if not any(e.iterdir()):  # made by the checks; a dead run's lock is no run,
        e.rmdir()  # its new run takes it over (easgd.run.runlock)
    elif e.exists():
      old.append(e)
  move_aside(workdir, old, finished=workdir / RESULTS_JSON)


def _title(config: TrainConfig, task: Task) -> str:
  builtin = task.factory == builtin_tasks.BUILTIN_FACTORY
  name = f"{config.dataset} / {config.model}" if builtin else task.name
  return (
      f"{name}, p={config.num_workers}, "
      f"global batch {config.global_batch_size}, lr {config.learning_rate:g}"
  )
