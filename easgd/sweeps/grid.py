"""The (learning_rate, tau, alpha, num_workers) grid of an EASGD sweep and its results.

A :class:`SweepGrid` names the configurations, validated at this boundary
(the factories take the traced values unchecked); :func:`run_grid` runs one
compiled program of ``easgd.sweeps.engine`` per ``num_workers`` value over
every (learning_rate, tau, alpha) of the grid; :class:`SweepResult` holds one
record per configuration with the analytic period spectral radius of
``easgd.analysis.stability`` next to the simulated outcome (the theory columns):

  theory_radius            :func:`easgd.analysis.stability.sync_easgd_spectral_radius`
                           at eta*h, with h the known curvature (quadratic) or
                           the certified largest Hessian eigenvalue at the
                           start (network, ``easgd.analysis.hessian.certified_curvature``).
  theory_radius_trained    the same at h of the best final center (network).

The problems are ``easgd.sweeps.quadratic.sweep_quadratic`` and
``easgd.sweeps.network.sweep_network``; files, plots and summaries are
``easgd.sweeps.report``'s.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6), Section 4.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import numbers
from typing import Any, Callable

import numpy as np

from easgd._util import checks
from easgd.analysis import stability
from easgd.run.compare import collapsed
from easgd.sweeps.engine import MAX_STEPS, SweepError, run_timed

CSV_COLUMNS = (
    "problem",
    "num_workers",
    "learning_rate",
    "tau",
    "alpha",
    "beta",
    "diverged",
    "workers_diverged",
    "center_diverged",
    "diverged_step",
    "collapsed",
    "initial_loss",
    "final_loss",
    "initial_center_loss",
    "center_loss",
    "test_accuracy",
    "worker_center_distance",
    "eta_h",
    "theory_radius",
    "theory_stable",
    "eta_h_trained",
    "theory_radius_trained",
)
"""The keys of a record, in the CSV's column order: ``test_accuracy`` only
where the problem evaluates one (a task's ``"correct"``), and after it the
mean ``test_m`` of each other metric ``m`` a task evaluates (:func:`records`).
``collapsed``: a configuration that did not diverge but learned nothing
(``easgd.run.compare.collapsed``: its center's loss ended at or above
``initial_center_loss``, or its test error within 10% of chance)."""

MAX_SWEEP_BYTES = 4 * 2**30
"""The most bytes (4 GiB) a sweep may hold in its inputs and state, as
:func:`check_memory` estimates them; a larger sweep is refused before it starts."""


def _as_tuple(name, values) -> tuple:
  if isinstance(values, (numbers.Number, np.generic)):
    values = (values,)
  if not isinstance(values, (tuple, list, np.ndarray)) or np.ndim(values) != 1:
    raise SweepError(f"{name} grid must be a tuple of numbers, got {values!r}")
  values = tuple(v.item() if isinstance(v, np.generic) else v for v in values)
  if not values:
    raise SweepError(f"{name} grid must have at least one value, got none")
  return values


def _sorted_unique(name, values):
  if len(set(values)) != len(values):
    dup = next(v for v in values if values.count(v) > 1)
    raise SweepError(f"{name} grid has the value {dup!r} twice; give each value once")
  return tuple(sorted(values))


def _int_tuple(name: str, values, minimum: int) -> tuple[int, ...]:
  values = _as_tuple(name, values)
  return _sorted_unique(
      name,
      tuple(checks.integer(f"{name} grid value", v, minimum, error=SweepError) for v in values),
  )


def _real_tuple(name: str, values, minimum: float, strictly: bool) -> tuple[float, ...]:
  values = _as_tuple(name, values)
  return _sorted_unique(
      name,
      tuple(
          checks.real(f"{name} grid value", v, minimum, open_low=strictly, error=SweepError)
          for v in values
      ),
  )


@dataclasses.dataclass(frozen=True)
class SweepGrid:
  """The configurations of a sweep: the Cartesian product of four axes.

  Every axis is sorted ascending on validation. For each ``num_workers`` value
  the configurations are ordered learning_rate-major, then tau, then alpha
  (``np.meshgrid(..., indexing="ij")`` of (learning_rate, tau, alpha)).

  Attributes:
    tau: communication periods in local steps, integers >= 1.
    alpha: moving rates (beta = num_workers * alpha), finite reals >= 0.
    learning_rate: eta, the local plain-SGD step size, finite reals > 0.
    num_workers: p, integers >= 1; one compiled program per value.
  """

  tau: tuple[int, ...]
  alpha: tuple[float, ...]
  learning_rate: tuple[float, ...] = (0.1,)
  num_workers: tuple[int, ...] = (4,)

  def validate(self) -> "SweepGrid":
    """The grid with sorted tuples of Python numbers.

    Raises:
      SweepError: an axis that is not a number or a tuple (list, 1-D array)
        of numbers, empty axis, duplicate value, tau or num_workers not integers
        >= 1 (tau at most 2**30: int32 clocks), alpha negative or not finite,
        learning_rate not a finite real > 0.
    """
    tau = _int_tuple("tau", self.tau, 1)
    if max(tau) > 2**30:
      raise SweepError(f"tau values must be at most 2**30 (int32 clocks), got {max(tau)}")
    return SweepGrid(
        tau=tau,
        alpha=_real_tuple("alpha", self.alpha, 0.0, False),
        learning_rate=_real_tuple("learning_rate", self.learning_rate, 0.0, True),
        num_workers=_int_tuple("num_workers", self.num_workers, 1),
    )

  @property
  def configs_per_program(self) -> int:
    """Configurations in one compiled program (one num_workers value)."""
    return len(self.learning_rate) * len(self.tau) * len(self.alpha)

  def flat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(learning_rate, tau, alpha) of every configuration of one program.

    Returns:
      float32 [n], int32 [n], float32 [n] with n = :attr:`configs_per_program`.
    """
    lr, tau, alpha = np.meshgrid(
        np.asarray(self.learning_rate, np.float64),
        np.asarray(self.tau, np.int64),
        np.asarray(self.alpha, np.float64),
        indexing="ij",
    )
    return (
        lr.ravel().astype(np.float32),
        tau.ravel().astype(np.int32),
        alpha.ravel().astype(np.float32),
    )

  def hyperparameters(self) -> dict[str, np.ndarray]:
    """:meth:`flat` as the keyword arguments of ``easgd.core.algorithms.easgd``:
    ``dict(learning_rate=, tau=, alpha=)`` (the ``hyperparameters`` of an
    ``easgd.sweeps.engine.make_sweep_fn`` program)."""
    lr, tau, alpha = self.flat()
    return dict(learning_rate=lr, tau=tau, alpha=alpha)


def check_num_steps(grid: SweepGrid, num_steps) -> int:
  """``num_steps`` as a Python int in [1, MAX_STEPS], and at least every tau.

  A tau longer than the run would exchange only at step 0 (as ``easgd
  train`` refuses a tau longer than its run).

  Args:
    grid: a validated grid.
    num_steps: local steps per worker.

  Returns:
    ``int(num_steps)``.

  Raises:
    SweepError: num_steps not an integer in [1, 2**31 - 1] (int32 step
      counter), or a tau of the grid above it (names that tau).
  """
  num_steps = checks.integer(
      "num_steps",
      num_steps,
      1,
      MAX_STEPS,
      error=SweepError,
      what="local steps per worker; int32 step counter",
  )
  checks.integer(
      "tau grid value",
      max(grid.tau),
      1,
      num_steps,
      error=SweepError,
      what=f"communication period, at most the run's num_steps={num_steps}",
  )
  return num_steps


def check_memory(
    problem: str,
    grid: SweepGrid,
    num_steps: int,
    worker_step_bytes: int,
    state_bytes: int,
    inputs: str,
) -> int:
  """Refuses a sweep whose memory estimate exceeds :data:`MAX_SWEEP_BYTES`.

  A program (one num_workers value p) holds every step's inputs at once
  (``num_steps`` x (p x ``worker_step_bytes`` + a 4-byte step index)) and,
  for each of the grid's configurations, the state of p workers and a center
  ((p + 1) x ``state_bytes``). Nothing is recorded per step (only the end
  values and divergence flags), so the steps do not multiply with the
  configurations. The estimate is the largest program's; buffers of the
  computation itself (gradients, activations) come on top.

  Args:
    problem: ``"quadratic"`` or ``"network"`` (for the message).
    grid: a validated grid.
    num_steps: a checked step count (:func:`check_num_steps`).
    worker_step_bytes: input bytes of one worker's step.
    state_bytes: bytes of one parameter copy.
    inputs: what a worker's step input is (for the message).

  Returns:
    The estimate in bytes.

  Raises:
    SweepError: the estimate exceeds :data:`MAX_SWEEP_BYTES` (names both).
  """
  n = grid.configs_per_program
  need, p = max(
      (num_steps * (p * worker_step_bytes + 4) + n * (p + 1) * state_bytes, p)
      for p in grid.num_workers
  )
  if need > MAX_SWEEP_BYTES:
    raise SweepError(
        f"the {problem} sweep needs about {need / 2**30:.3g} GiB ({need} bytes: "
        f"num_steps={num_steps} x ({p} workers x {worker_step_bytes} bytes of {inputs} "
        f"+ a 4-byte step index) + {n} configurations x {p + 1} parameter copies x "
        f"{state_bytes} bytes); "
        f"allowed: at most {MAX_SWEEP_BYTES / 2**30:g} GiB (easgd.sweeps.grid."
        f"MAX_SWEEP_BYTES); use fewer steps, configurations or workers"
    )
  return need


def grid_config(grid: SweepGrid, index: int) -> dict[str, Any]:
  """learning_rate, tau, alpha of configuration ``index`` of :meth:`SweepGrid.flat`,
  as the grid's Python numbers (not float32 round trips)."""
  na, nt = len(grid.alpha), len(grid.tau)
  return dict(
      learning_rate=grid.learning_rate[index // (nt * na)],
      tau=grid.tau[(index // na) % nt],
      alpha=grid.alpha[index % na],
  )


def run_grid(
    grid: SweepGrid,
    program: Callable[[int], Callable],
    inputs: Callable[[int], tuple],
    divergence_factor: float,
) -> tuple[dict[int, dict], dict[int, dict]]:
  """Runs every configuration of ``grid``: one compiled program per num_workers.

  Args:
    grid: a validated grid.
    program: ``program(p)``, an ``easgd.sweeps.engine.make_sweep_fn`` program
      for p workers whose ``build`` takes learning_rate, tau and alpha.
    inputs: ``inputs(p) -> (worker_params, center, batches, eval_data, key)``
      of that program.
    divergence_factor: c > 1 (``easgd.sweeps.engine``).

  Returns:
    ``(outputs, programs)``: per num_workers value, the program's output dict
    (device arrays) and its wall and compile info (``sweep_engine.run_timed``).
  """
  outputs, programs = {}, {}
  hyper = grid.hyperparameters()
  for p in grid.num_workers:
    args = (hyper, *inputs(p), np.float32(divergence_factor))
    outputs[p], programs[p] = run_timed(program(p), args, grid.configs_per_program)
  return outputs, programs


def theory(learning_rate, alpha, tau, num_workers, h) -> tuple[float | None, float | None]:
  """(eta*h, radius) of the analytic period map at eta*h, or Nones without h."""
  if h is None or not math.isfinite(h):
    return None, None
  u = float(learning_rate) * float(h)
  return u, float(stability.sync_easgd_spectral_radius(u, float(alpha), int(tau), int(num_workers)))


def records(
    problem: str,
    grid: SweepGrid,
    num_workers: int,
    outputs: dict,
    curvature: float | None,
    curvature_trained: float | None,
    num_classes: int | None = None,
) -> list[dict[str, Any]]:
  """One record per configuration of a program's ``outputs`` (keys
  :data:`CSV_COLUMNS`; Python numbers, None where not applicable or not
  finite), with the theory columns at ``curvature`` and ``curvature_trained``.

  ``collapsed`` is ``easgd.run.compare.collapsed`` of the center's loss at the
  start and the end and its final test error (``1 - test_accuracy``) against
  ``num_classes`` (None: the loss criterion alone), False for a diverged
  configuration (whose state is frozen). A center that never moves (alpha = 0)
  ends at its start: collapsed.

  The test metrics are those of ``outputs``: ``test_accuracy`` where the
  problem evaluates one, then every other ``test_m`` in name order; a metric
  the problem lacks is absent."""
  host = {k: np.asarray(v) for k, v in outputs.items() if k != "center"}
  tests = (["test_accuracy"] if "test_accuracy" in host else []) + sorted(
      k for k in host if k.startswith("test_") and k != "test_accuracy"
  )
  p = num_workers
  rows = []
  for i in range(grid.configs_per_program):
    c = grid_config(grid, i)
    r_lr, r_tau, r_alpha = c["learning_rate"], c["tau"], c["alpha"]
    u, radius = theory(r_lr, r_alpha, r_tau, p, curvature)
    u2, radius2 = theory(r_lr, r_alpha, r_tau, p, curvature_trained)
    f = lambda k: (None if k not in host or not np.isfinite(host[k][i]) else float(host[k][i]))
    diverged = bool(host["diverged"][i])
    accuracy = f("test_accuracy")
    rows.append(
        dict(
            problem=problem,
            num_workers=p,
            learning_rate=r_lr,
            tau=r_tau,
            alpha=r_alpha,
            beta=p * r_alpha,
            diverged=diverged,
            workers_diverged=bool(host["workers_diverged"][i]),
            center_diverged=bool(host["center_diverged"][i]),
            diverged_step=int(host["diverged_step"][i]),
            collapsed=not diverged
            and collapsed(
                f("initial_center_loss"),
                f("center_loss"),
                None if accuracy is None else 1.0 - accuracy,
                num_classes,
            ),
            initial_loss=f("initial_loss"),
            final_loss=f("final_loss"),
            initial_center_loss=f("initial_center_loss"),
            center_loss=f("center_loss"),
            **{k: f(k) for k in tests},
            worker_center_distance=f("worker_center_distance"),
            eta_h=u,
            theory_radius=radius,
            theory_stable=None if radius is None else bool(radius < 1.0),
            eta_h_trained=u2,
            theory_radius_trained=radius2,
        )
    )
  return rows


@dataclasses.dataclass
class SweepResult:
  """Per-configuration results of a sweep.

  Attributes:
    problem: ``"quadratic"`` or ``"network"``.
    grid: the validated :class:`SweepGrid`.
    records: one dict per configuration (keys: :meth:`columns`; values
      Python numbers, ``None`` where not applicable), ordered by num_workers,
      then as :meth:`SweepGrid.flat`.
    curvature: h used for the theory columns (quadratic: the given
      curvature; network: the largest Hessian eigenvalue at the initial
      parameters, if its estimate converged), or None.
    info: wall times, compile counts, Hessian estimates, settings.
    centers: num_workers -> final centers (pytree, leading axis [n]) on the
      host; not written to disk.
  """

  problem: str
  grid: SweepGrid
  records: list[dict[str, Any]]
  curvature: float | None = None
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  centers: dict[int, Any] = dataclasses.field(default_factory=dict, repr=False)

  def table(
      self, metric: str, num_workers: int | None = None, learning_rate: float | None = None
  ) -> np.ndarray:
    """One metric as a float64 [len(alpha), len(tau)] array (rows: alpha).

    Args:
      metric: a record key; bools become 0/1, ``None`` becomes NaN.
      num_workers, learning_rate: the slice (default: the first grid value).

    Raises:
      KeyError: a metric not among the records' keys (:meth:`columns`).
    """
    if metric not in self.columns():
      raise KeyError(metric)
    p = self.grid.num_workers[0] if num_workers is None else num_workers
    lr = self.grid.learning_rate[0] if learning_rate is None else learning_rate
    out = np.full((len(self.grid.alpha), len(self.grid.tau)), np.nan)
    ti = {t: i for i, t in enumerate(self.grid.tau)}
    ai = {a: i for i, a in enumerate(self.grid.alpha)}
    for r in self.records:
      if r["num_workers"] == p and r["learning_rate"] == lr:
        v = r[metric]
        out[ai[r["alpha"]], ti[r["tau"]]] = np.nan if v is None else float(v)
    return out

  def columns(self) -> list[str]:
    """The records' keys in the CSV's order (:data:`CSV_COLUMNS`, with the test
    metrics the problem evaluates, :func:`records`)."""
    return list(dict.fromkeys(k for r in self.records for k in r)) or list(CSV_COLUMNS)

  def to_csv(self) -> str:
    """The records as CSV text (header :meth:`columns`)."""
    columns = self.columns()
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in self.records:
      w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    return buf.getvalue()

  def to_json(self) -> dict[str, Any]:
    """JSON-ready dict: problem, grid, curvature, info, records."""
    return dict(
        problem=self.problem,
        grid=dataclasses.asdict(self.grid),
        curvature=self.curvature,
        info=self.info,
        records=self.records,
    )


def sweep_result(
    problem: str,
    grid: SweepGrid,
    outputs: dict[int, dict],
    curvature: float | None,
    curvature_trained: float | None,
    info: dict[str, Any],
    centers: dict[int, Any],
    num_classes: int | None = None,
) -> SweepResult:
  """The :class:`SweepResult` of :func:`run_grid`'s ``outputs``.

  Args:
    problem: ``"quadratic"`` or ``"network"``.
    grid: the validated grid.
    outputs: num_workers -> the program's outputs, in :func:`run_grid`'s order.
    curvature, curvature_trained: h of the theory columns (:func:`records`).
    info, centers: as :class:`SweepResult`.
    num_classes: the task's classes, for ``collapsed`` (:func:`records`); None
      for a problem without them (the quadratic) or a task that records none.

  Returns:
    The result, with every program's :func:`records` in the order of ``outputs``.
  """
  result = SweepResult(problem, grid, [], curvature, info, centers)
  for p, out in outputs.items():
    result.records += records(problem, grid, p, out, curvature, curvature_trained, num_classes)
  return result
