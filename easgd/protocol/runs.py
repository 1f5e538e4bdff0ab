"""The comparison protocol: tuned rates, seeds, intervals, time to target.

:func:`run_protocol` runs a :class:`~easgd.protocol.config.ProtocolConfig` the
way the paper chose its numbers, at whatever scale the machine allows:

1. **Tune.** For every arm with a learning-rate grid, every (rate, tuning
   seed) runs for the arm's budget; the center's error on the validation
   split (``TrainConfig.validation_examples`` held out of the training set,
   never trained on) is recorded along the way. The test set is not passed to
   these programs at all.
2. **Choose.** Each arm's rate is the one with the lowest mean final
   validation error over the tuning seeds (a diverged run counts as error 1);
   an arm with ``lr_from`` takes the chosen base rate of another arm, scaled
   by its own ``lr_scaling``. A rate at the edge of its grid is flagged, and
   so is a grid that cannot tune (a single rate; every rate diverged:
   ``easgd.protocol.config.lr_grid_edges``).
3. **Report.** Each arm reruns at its chosen rate on the fresh report seeds;
   these runs evaluate the center on the validation split and the test set
   along the way and every worker on the test set at the end. Nothing is
   selected on the test set: an arm reports its final test error and its
   test error at the evaluation with the lowest validation error (the
   earliest of equal ones), and the time to a target test error.

Grids as one program: the configurations of an arm (rate x seed) and of the
arms that differ only in fields their algorithm takes as arrays (the
table's ``array_fields``: tau of EASGD, EAMSGD, local SGD and DiLoCo, beta,
delta, ...) run as ONE compiled program (``easgd.sweeps.curves``): the
algorithm's ``Algorithm.step`` built by ``easgd.methods.registry`` from traced
hyperparameters and vmapped over configurations. Arms that differ in
anything else (p or the batch: array shapes; the epochs: the scan's length;
the DOWNPOUR family's tau: a host-side exchange table; the warm-up's K:
the program's control flow) run as separate programs, and the results name
the fields that kept them apart.

Every run is the run ``easgd train`` makes of the arm's config with that rate
and seed, up to float32 rounding: the same initial parameters and step key (``split(key(seed))``),
the same data set (MNIST-1D is generated from the seed), the same training
examples (the validation split removed, ``easgd.training.data.validation_split``),
the same data order (``easgd.training.batches.worker_batch_indices``, epochs 1, 2, ...),
the same local optimizer and schedule (``easgd.training.optimizers``), the same
algorithm (``easgd.methods.registry``); ``tests/test_protocol.py`` checks the
per-configuration equality with ``train_and_evaluate``. With one configuration
per call (``configs_per_batch=1``) the program computes what the trainer
computes (measured: equal validation errors on all 20 configurations of
``benchmarks/protocol_grid.py``); batching configurations lets XLA round
differently, and where a ReLU pre-activation lies within rounding of zero
that last bit picks the side of the kink. At high rates such events grow: in
that benchmark, up to 0.3 points of validation error at rates up to 0.1 and
5.3 points at 0.316, where the one-by-one runs of three seeds themselves
end 8.9 to 17.4% apart. The intervals over seeds take this in;
``configs_per_batch=1`` removes it at about 1.8 times the run time.

Time to target: for each report seed, the first evaluation step whose center
test error is at or below a target, and at that step the samples processed
(steps x global batch), the all-reduces and bytes per worker
(``Algorithm.communication``) and a modelled wall-clock time per network:
steps x the measured compute time of one worker's local step on this machine,
plus ``latency + 2 (p - 1) / p x bytes / bandwidth`` per all-reduce
(``easgd.protocol.stats``).

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
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from easgd.training import batches, data, models, runlock
from easgd.core import elastic
from easgd.protocol import stats as protocol_stats
from easgd.methods import registry
from easgd.training.config import ConfigError, TrainConfig
from easgd._util.files import json_text, write_text_atomic
from easgd.training.optimizers import make_optimizer
from easgd.protocol.config import (RESULTS_JSON, UNTUNABLE, Arm, ProtocolConfig,
                                   ProtocolError, lr_grid_edges, to_dict)
from easgd.sweeps.curves import make_curve_fn
from easgd.sweeps.engine import CompileCounter
from easgd.training.spmd import make_loss_fn

TRACED_ALWAYS = ("learning_rate", "seed", "lr_scaling", "lr_reference_batch")
"""Fields every program takes per configuration: the rate (resolved with the
arm's scaling, traced) and the seed (initial parameters, data, key)."""

WHY_STATIC = {
    "num_workers": "p sets the workers' array shapes",
    "global_batch_size": "the batch sets the array shapes",
    "num_epochs": "the budget sets the scan's length",
    "sync_warmup_steps": "the warm-up's K sets the program's control flow",
    "tau": "its tau is a Python int (a host-side exchange table or schedule)",
}
"""Why arms that differ in a field run as separate programs."""

MAX_INDEX_BYTES = 2 * 2**30
"""The most bytes (2 GiB) of batch indices an arm's grid may hold (every step's
examples of every configuration are gathered on the host before its program
runs); a larger budget is refused before anything is compiled."""


# ----------------------------------------------------------------------------
# Arms resolved to runs
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class ArmRun:
  """An arm with what its runs need: config, steps, evaluation steps."""
  arm: Arm
  config: TrainConfig          # the arm's config (learning rate: the base's)
  steps_per_epoch: int
  num_steps: int
  eval_steps: np.ndarray


def eval_steps_of(num_steps: int, every: int) -> np.ndarray:
  """The steps after which the center is evaluated.

  Args:
    num_steps: the run's local steps T (> 0).
    every: the evaluation period in local steps (> 0).

  Returns:
    int64 [E]: 0, every, 2 every, ... below T, and T, sorted and distinct.
  """
  steps = list(range(0, num_steps, every)) + [num_steps]
  return np.asarray(sorted(set(steps)), np.int64)


def prepare(config: ProtocolConfig, num_train: int) -> dict[str, ArmRun]:
  """Each arm's run length and evaluation steps; checks what the arm derives
  from the run's length as the trainer does (``TrainConfig.resolve``: tau, K,
  the center's first exchange, the schedule in steps).

  Raises:
    ProtocolError: a quantity ``TrainConfig.resolve`` refuses (naming the
      arm), or an arm's batch indices (int32, every step of every configuration of its
      grid) beyond :data:`MAX_INDEX_BYTES`.
  """
  runs = {}
  for arm in config.arms:
    cfg = arm.config(config.base).validate()
    spe = batches.steps_per_epoch(num_train, cfg.num_workers, cfg.per_worker_batch_size)
    total = spe * cfg.num_epochs
    try:  # tau, K and the center's first exchange against the run: the trainer's checks
      cfg.resolve(spe)
    except ConfigError as e:
      raise ProtocolError(f"arm {arm.name!r}: {e}") from None
    # every configuration of a program holds its batch indices of every step
    configs = max(len(arm.learning_rates) * len(config.tune_seeds),
                  len(config.report_seeds))
    index_bytes = configs * total * cfg.global_batch_size * 4
    if index_bytes > MAX_INDEX_BYTES:
      raise ProtocolError(
          f"arm {arm.name!r}: {configs} configurations x {total} steps x "
          f"{cfg.global_batch_size} examples of batch indices need "
          f"{index_bytes / 2**30:.1f} GiB; allowed: at most {MAX_INDEX_BYTES / 2**30:g} "
          f"GiB (fewer epochs, rates or seeds)")
    runs[arm.name] = ArmRun(arm, cfg, spe, total,
                            eval_steps_of(total, config.eval_every_steps))
  return runs


def program_key(run: ArmRun) -> tuple:
  """Arms with equal keys run in one program: everything but the rate, the
  seed and the algorithm's array fields is equal."""
  traced = set(TRACED_ALWAYS) | set(registry.TABLE[run.config.algorithm].array_fields)
  fields = run.config.to_dict_fields()
  return tuple(sorted((k, v) for k, v in fields.items() if k not in traced))


def group_programs(runs: list[ArmRun]) -> list[list[ArmRun]]:
  """The arms of each program, in the order of ``runs``."""
  groups: dict[tuple, list[ArmRun]] = {}
  for r in runs:
    groups.setdefault(program_key(r), []).append(r)
  return list(groups.values())


def why_separate(groups: list[list[ArmRun]]) -> list[str]:
  """For each program, why its arms do not run with another program's arms of
  the same algorithm ("" when it is its algorithm's only program)."""
  out = []
  for g in groups:
    algo = g[0].config.algorithm
    mine = dict(program_key(g[0]))
    reasons = set()
    for other in groups:
      if other is g or other[0].config.algorithm != algo:
        continue
      theirs = dict(program_key(other[0]))
      for k in sorted(set(mine) | set(theirs)):
        if mine.get(k) != theirs.get(k):
          why = WHY_STATIC.get(k, f"{k} is not an array field of {algo} "
                                  "(easgd.methods.registry)")
          reasons.add(f"{k} differs: {why}")
    out.append("; ".join(sorted(reasons)))
  return out


# ----------------------------------------------------------------------------
# Data of the seeds
# ----------------------------------------------------------------------------


class SeedData:
  """The data sets of some seeds, stacked once per distinct data set.

  MNIST-1D is generated from the seed (one data set per seed); Fashion-MNIST
  and the others are the same for every seed (one slot). ``slot[seed]`` is
  the seed's index into the stacked arrays; the training and validation
  indices are :func:`easgd.training.data.validation_split`'s (the same for every seed:
  they depend on the training set's size only).
  """

  def __init__(self, base: TrainConfig, seeds):
    sets, self.slot = [], {}
    for s in seeds:
      ds = data.load_dataset(base.dataset, data_dir=base.data_dir, seed=s)
      for i, other in enumerate(sets):
        if other is ds:
          self.slot[s] = i
          break
      else:
        self.slot[s] = len(sets)
        sets.append(ds)
    first = sets[0]
    self.num_classes, self.input_shape = first.num_classes, first.input_shape
    self.train_idx, self.val_idx = data.validation_split(first.num_train,
                                                         base.validation_examples)
    self.num_train = len(self.train_idx)
    self.sets = sets

  def train(self):
    """(x [S, N, ...], y [S, N]): every training example (the held-out ones
    too: the runs gather only their training indices)."""
    return (np.stack([d.train_x for d in self.sets]),
            np.stack([d.train_y for d in self.sets]))

  def num_examples(self, split: str) -> int:
    """How many validation ("val") or test ("test") examples each seed has."""
    return len(self.val_idx) if split == "val" else len(self.sets[0].test_y)

  def num_chunks(self, split: str, chunk: int) -> int:
    """C of :meth:`chunks` without ``num_chunks``: ceil(n / min(chunk, n))."""
    n = self.num_examples(split)
    return -(-n // min(chunk, n))

  def chunks(self, split: str, chunk: int, num_chunks: int | None = None):
    """(x [S, C, c, ...], y [S, C, c], mask [C, c]) of the validation ("val")
    or test ("test") examples, padded to C chunks of c examples.

    Args:
      split: "val" or "test".
      chunk: examples per chunk (at most; c = min(chunk, n)).
      num_chunks: at least this many chunks (then c = ceil(n / C)), so that
        two splits evaluated by one program have the same C.
    """
    if split == "val":
      xs = [d.train_x[self.val_idx] for d in self.sets]
      ys = [d.train_y[self.val_idx] for d in self.sets]
    else:
      xs = [d.test_x for d in self.sets]
      ys = [d.test_y for d in self.sets]
    n = len(ys[0])
    chunk = min(chunk, n)
    c = -(-n // chunk)
    if num_chunks is not None and num_chunks > c:
      c = num_chunks
      chunk = -(-n // c)
    pad = c * chunk - n
    x = np.stack([np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for v in xs])
    y = np.stack([np.concatenate([v, np.zeros((pad,), v.dtype)]) for v in ys])
    mask = (np.arange(c * chunk) < n).reshape(c, chunk)
    return (x.reshape(len(xs), c, chunk, *x.shape[2:]), y.reshape(len(ys), c, chunk),
            mask)


def batch_indices(seed_data: SeedData, run: ArmRun, seed: int) -> np.ndarray:
  """int32 [T, p, B]: the run's examples at every step, as indices into the
  full training set (the trainer's order: epochs 1, 2, ... of
  ``worker_batch_indices`` over the training part)."""
  c = run.config
  idx = np.concatenate([
      batches.worker_batch_indices(seed_data.num_train, c.num_workers,
                                c.per_worker_batch_size, seed, epoch)
      for epoch in range(1, c.num_epochs + 1)])[:run.num_steps]
  return seed_data.train_idx[idx].astype(np.int32)


# ----------------------------------------------------------------------------
# One program
# ----------------------------------------------------------------------------


def make_eval(model, splits):
  """``eval_fn(center, data, config_data, j)``: the center's summed loss, number
  of correct predictions and number of examples on chunk j of the config's
  examples of each split (additive over the chunks).

  Args:
    model: the Flax model.
    splits: "val" (validation), "test", or a tuple of both (each split's
      chunks in ``data[split]``, the same number of chunks for all).

  Returns:
    ``eval_fn`` returning ``{split}_loss_sum``, ``{split}_correct`` and
    ``{split}_count`` (float32 scalars) for each split.
  """
  splits = (splits,) if isinstance(splits, str) else tuple(splits)

  def eval_fn(params, shared, cfg, j):
    out = {}
    for split in splits:
      x, y, mask = shared[split]
      m = mask[j]
      loss, correct = models.per_example_stats(
          model.apply({"params": params}, x[cfg["slot"], j], train=False),
          y[cfg["slot"], j])
      out.update({f"{split}_loss_sum": jnp.sum(jnp.where(m, loss, 0.0)),
                  f"{split}_correct": jnp.sum(jnp.where(m, correct, 0).astype(jnp.float32)),
                  f"{split}_count": jnp.sum(m).astype(jnp.float32)})
    return out
  return eval_fn


def make_final(model):
  """``final_fn``: every worker's correct test predictions (additive over the
  chunks), and its distance to the center (only chunk 0 counts it)."""
  test_eval = make_eval(model, "test")

  def final_fn(worker_params, center, shared, cfg, j):
    correct = jax.vmap(lambda w: test_eval(w, shared, cfg, j)["test_correct"])(worker_params)
    dist = jax.vmap(lambda w: elastic.tree_l2_distance(w, center))(worker_params)
    return dict(worker_test_correct=correct,
                worker_center_distance=jnp.where(j == 0, jnp.mean(dist), 0.0))
  return final_fn


def batch_fn(shared, cfg, t):
  """The configuration's worker batches of step t: ([p, B, ...], [p, B]), one
  gather from its data set's slot (no copy of the data set)."""
  x, y = shared["train"]
  idx = cfg["idx"][t]  # [p, B] indices into the full training set
  return x[cfg["slot"], idx], y[cfg["slot"], idx]


def means(curves: dict, split: str) -> tuple[np.ndarray, np.ndarray]:
  """(mean loss, error) from a program's summed curves of ``split``.

  Args:
    curves: the program's curves: ``{split}_loss_sum``, ``{split}_correct``
      and ``{split}_count``, each float64 [n, E] (n configurations, E
      evaluations), summed over the evaluation chunks.
    split: "val" or "test".

  Returns:
    (mean cross-entropy in nats, error as a fraction in [0, 1]), float64 [n, E].
  """
  count = curves[f"{split}_count"]
  return curves[f"{split}_loss_sum"] / count, 1.0 - curves[f"{split}_correct"] / count


def run_program(group: list[ArmRun], configs: list[dict], seed_data: SeedData,
                model, kind: str, protocol: ProtocolConfig, *,
                return_center: bool = False) -> tuple[dict, dict]:
  """Runs the configurations of one program.

  Args:
    group: the program's arms (one algorithm, one static config).
    configs: one dict per configuration: arm (name), learning_rate (base),
      seed, and the arm's values of the varying array fields.
    seed_data: the seeds' data.
    model: the Flax model.
    kind: "tune" (validation curves; the test set is not given to the
      program) or "report" (validation and test curves, every worker's test
      error at the end).
    protocol: the protocol (chunking, evaluation steps).
    return_center: also return the final centers (tests).

  Returns:
    (host outputs of :func:`easgd.sweeps.curves.make_curve_fn`'s program,
    info: configs, wall_s, compiles, compile_s, arms).
  """
  first = group[0]
  static = first.config
  spec = registry.TABLE[static.algorithm]
  by_name = {r.arm.name: r for r in group}
  varying = [f for f in spec.array_fields
             if len({getattr(r.config, f) for r in group}) > 1]
  loss_fn = make_loss_fn(model)

  def build(learning_rate, **fields):
    cfg = dataclasses.replace(static, **fields)  # traced values, not validated
    opt = make_optimizer(static, first.steps_per_epoch, learning_rate=learning_rate)
    return spec.build(cfg, loss_fn, opt, first.num_steps)

  hyper = {"learning_rate": np.asarray(
      [c["learning_rate"] * by_name[c["arm"]].config.lr_scale for c in configs],
      np.float32)}
  for f in varying:
    values = [getattr(by_name[c["arm"]].config, f) for c in configs]
    hyper[f] = np.asarray(values, np.int32 if f == "tau" else np.float32)
  keys, params = [], []
  for c in configs:
    init_key, step_key = jax.random.split(jax.random.key(c["seed"]))
    keys.append(step_key)
    params.append(models.init_params(model, seed_data.input_shape, init_key))
  params0 = jax.tree.map(lambda *a: jnp.stack(a), *params)
  cfg_data = dict(slot=np.asarray([seed_data.slot[c["seed"]] for c in configs], np.int32),
                  idx=np.stack([batch_indices(seed_data, by_name[c["arm"]], c["seed"])
                                for c in configs]))
  shared = dict(train=seed_data.train())
  splits = ("val",) if kind == "tune" else ("val", "test")
  num_chunks = max(seed_data.num_chunks(s, protocol.eval_chunk) for s in splits)
  for s in splits:
    shared[s] = seed_data.chunks(s, protocol.eval_chunk, num_chunks)
  program = make_curve_fn(
      build, static.num_workers, first.num_steps, first.eval_steps,
      batch_fn=batch_fn, eval_fn=make_eval(model, splits),
      eval_chunks=num_chunks,
      final_fn=make_final(model) if kind == "report" else None,
      configs_per_batch=protocol.configs_per_batch,
      warmup_steps=static.sync_warmup_steps, return_center=return_center)
  keys = jnp.stack(keys)
  start = time.perf_counter()
  with CompileCounter() as cc:
    out = program(hyper, params0, keys, cfg_data, shared)
  curves = {}
  for s in splits:
    curves[f"{s}_loss"], curves[f"{s}_error"] = means(out["curves"], s)
  out["curves"] = curves
  if kind == "report":
    count = float(shared["test"][2].sum())
    out["final"]["worker_test_error"] = 1.0 - out["final"].pop("worker_test_correct") / count
  info = dict(kind=kind, algorithm=static.algorithm, arms=[r.arm.name for r in group],
              configs=len(configs), traced_fields=["learning_rate", "seed"] + varying,
              num_workers=static.num_workers, num_steps=first.num_steps,
              wall_s=round(time.perf_counter() - start, 3),
              # the grid's programs (init, step per phase, evaluation, end); the
              # others are JAX's small placement helpers
              compiles=sum(str(n).endswith("_one)") for n in cc.names),
              compiles_all=cc.count, compile_s=round(cc.seconds, 3))
  return out, info


# ----------------------------------------------------------------------------
# The protocol
# ----------------------------------------------------------------------------


def _diverged(loss_curve: np.ndarray, factor: float) -> bool:
  last, first = loss_curve[-1], loss_curve[0]
  return bool(not np.isfinite(last) or last > factor * abs(first))


def measure_step_seconds(model, input_shape, batch_size: int, repeats: int = 30) -> float:
  """Median seconds of one worker's local SGD step (forward, backward, update)
  at ``batch_size`` on this machine, jitted, after two warm-up calls.

  Args:
    model: the Flax model.
    input_shape: one example's shape, e.g. (40, 1).
    batch_size: examples per step (one worker's mini-batch).
    repeats: timed calls; the median is returned.

  Returns:
    Seconds (float) of one step: the compute term of the modelled wall clock
    (``easgd.protocol.stats.modelled_seconds``).
  """
  params = models.init_params(model, input_shape, jax.random.key(0))
  loss_fn = make_loss_fn(model)
  opt = optax.sgd(0.01)

  @jax.jit
  def step(params, state, x, y, key):
    grads = jax.grad(loss_fn)(params, (x, y), key)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  x = jnp.zeros((batch_size, *input_shape), jnp.float32)
  y = jnp.zeros((batch_size,), jnp.int32)
  state, key = opt.init(params), jax.random.key(1)
  for _ in range(2):
    params, state = jax.block_until_ready(step(params, state, x, y, key))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    params, state = jax.block_until_ready(step(params, state, x, y, key))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _communication(run: ArmRun, model, input_shape, param_bytes: int) -> Callable:
  """``comm(steps) -> (all_reduces, bytes)`` per worker of the arm (Python tau)."""
  algo = registry.make_algorithm(run.config, make_loss_fn(model), optax.sgd(0.1),
                                 run.num_steps)
  return lambda t: tuple(algo.communication(int(t), param_bytes))


def run_protocol(config: ProtocolConfig, workdir=None, *, log: Callable = print
                 ) -> dict[str, Any]:
  """Tunes, chooses and reruns every arm of ``config``; returns (and writes) the results.

  Args:
    config: the protocol (validated here, before anything is loaded).
    workdir: if given, ``results.json`` is written there (created if
      missing); its lock is held for the whole run (``easgd.training.runlock``).
    log: called with one line per program (progress).

  Returns:
    JSON-ready dict: ``protocol`` (the resolved config), ``machine``,
    ``arms`` (per arm: config, grid, tuning results per rate, chosen rate,
    report per seed, summaries with intervals, time to target), ``programs``
    (each compiled program: kind, arms, configurations, wall and compile
    seconds, the fields traced per configuration and why its arms run apart
    from others), ``compute_per_step_s``, ``wall_time_s``.

  Raises:
    ProtocolError, ConfigError: a bad setting (before anything runs).
    easgd.training.runlock.WorkdirInUseError: another command holds ``workdir``.
    easgd.training.data.DataError: missing data files.
  """
  config = config.validate()
  if workdir is None:
    return _run_protocol(config, None, log)
  with runlock.hold_workdir(workdir, "protocol"):
    return _run_protocol(config, workdir, log)


def _run_protocol(config: ProtocolConfig, workdir, log: Callable) -> dict[str, Any]:
  """:func:`run_protocol` of a validated config (``workdir``'s lock held, if any)."""
  start = time.perf_counter()
  base = config.base
  tune = SeedData(base, config.tune_seeds)
  runs = prepare(config, tune.num_train)
  model = models.make_model(base.model, tune.num_classes, param_dtype=base.param_dtype,
                            compute_dtype=base.compute_dtype)
  params = models.init_params(model, tune.input_shape, jax.random.key(0))
  param_bytes = models.param_bytes(params)
  programs: list[dict] = []
  results: dict[str, dict] = {}

  # 1. tune: every (rate, tuning seed) of the arms with a grid, on validation
  tuned = [runs[a.name] for a in config.arms if a.lr_from is None]
  groups = group_programs(tuned)
  for group, reason in zip(groups, why_separate(groups)):
    configs = [dict(arm=r.arm.name, learning_rate=lr, seed=s)
               for r in group for lr in r.arm.learning_rates for s in config.tune_seeds]
    out = _run_logged(group, reason, configs, tune, model, "tune", config, programs, log)
    for r in group:
      rows = [i for i, c in enumerate(configs) if c["arm"] == r.arm.name]
      per_rate = []
      for lr in r.arm.learning_rates:
        idx = [i for i in rows if configs[i]["learning_rate"] == lr]
        final = [float(out["curves"]["val_error"][i, -1]) for i in idx]
        best = [float(np.nanmin(out["curves"]["val_error"][i])) for i in idx]
        div = [_diverged(out["curves"]["val_loss"][i], config.divergence_factor)
               for i in idx]
        scored = [1.0 if d or not np.isfinite(e) else e for e, d in zip(final, div)]
        per_rate.append(dict(learning_rate=lr,
                             resolved_learning_rate=lr * r.config.lr_scale,
                             val_error_final=final, val_error_best=best, diverged=div,
                             score=float(np.mean(scored)),
                             val_error_curve=[out["curves"]["val_error"][i].tolist()
                                              for i in idx]))
      best_i = int(np.argmin([p["score"] for p in per_rate]))
      chosen = per_rate[best_i]["learning_rate"]
      results[r.arm.name] = dict(tuning=per_rate, chosen_learning_rate=chosen,
                                 grid_edge=lr_grid_edges(r.arm.learning_rates, chosen,
                                                         per_rate))

  # 2. choose: the arms with lr_from take their source's base rate (and the
  # flag of a source whose grid could not tune)
  for a in config.arms:
    if a.lr_from is not None:
      source = results[a.lr_from]
      untuned = (source["grid_edge"] or "").startswith(UNTUNABLE)
      results[a.name] = dict(
          tuning=None, lr_from=a.lr_from,
          grid_edge=f"{UNTUNABLE}: from '{a.lr_from}'" if untuned else None,
          chosen_learning_rate=source["chosen_learning_rate"])

  # 3. report: every arm at its chosen rate on the fresh seeds, on test
  report = SeedData(base, config.report_seeds)
  groups = group_programs([runs[a.name] for a in config.arms])
  for group, reason in zip(groups, why_separate(groups)):
    configs = [dict(arm=r.arm.name, learning_rate=results[r.arm.name]["chosen_learning_rate"],
                    seed=s) for r in group for s in config.report_seeds]
    out = _run_logged(group, reason, configs, report, model, "report", config, programs,
                      log)
    for r in group:
      idx = [i for i, c in enumerate(configs) if c["arm"] == r.arm.name]
      results[r.arm.name]["report"] = dict(
          seeds=list(config.report_seeds), eval_steps=r.eval_steps.tolist(),
          val_error_curve=[out["curves"]["val_error"][i].tolist() for i in idx],
          val_loss_curve=[out["curves"]["val_loss"][i].tolist() for i in idx],
          test_error_curve=[out["curves"]["test_error"][i].tolist() for i in idx],
          test_loss_curve=[out["curves"]["test_loss"][i].tolist() for i in idx],
          train_loss_curve=[out["train_loss"][i].tolist() for i in idx],
          worker_test_error=[out["final"]["worker_test_error"][i].tolist() for i in idx],
          worker_center_distance=[float(out["final"]["worker_center_distance"][i])
                                  for i in idx])

  # 4. statistics: intervals over the report seeds, time to target
  step_s = {}
  arms_out = {}
  for a in config.arms:
    r = runs[a.name]
    res = results[a.name]
    key = (r.config.per_worker_batch_size,)
    if key not in step_s:
      step_s[key] = measure_step_seconds(model, tune.input_shape, key[0])
    arms_out[a.name] = summarize_arm(r, res, config, step_s[key],
                                     _communication(r, model, tune.input_shape, param_bytes))
  return _finish(config, arms_out, programs, step_s, param_bytes,
                 models.count_params(params), time.perf_counter() - start, workdir)


def _run_logged(group, reason, configs, seed_data, model, kind, config, programs, log):
  """:func:`run_program`, its info (and why its arms run apart) appended to
  ``programs`` and one progress line logged; returns its outputs."""
  out, info = run_program(group, configs, seed_data, model, kind, config)
  info["separate_because"] = reason
  programs.append(info)
  log(f"{kind:6s} {info['algorithm']:11s} {len(group):2d} arm(s) {info['configs']:4d} "
      f"configs  {info['wall_s']:7.1f} s ({info['compile_s']:.1f} s compiling)")
  return out


def summarize_arm(run: ArmRun, res: dict, config: ProtocolConfig, step_s: float,
                  comm: Callable) -> dict:
  """The arm's reported numbers with 95% intervals over the report seeds.

  Per arm: ``final_test_error`` (the last evaluation) and
  ``test_error_at_best_val`` (the evaluation with the lowest validation
  error, at step ``best_val_steps``), each the mean with its interval over
  the report seeds and per seed (``final_test_errors``,
  ``test_errors_at_best_val``); a diverged seed counts as error 1. No
  number is a minimum over the test evaluations.
  """
  rep = res["report"]
  c = run.config
  curves = np.asarray(rep["test_error_curve"], np.float64)
  final = np.nan_to_num(curves[:, -1], nan=1.0)
  at_val = [protocol_stats.best_val_index(v) for v in rep["val_error_curve"]]
  at_best_val = np.asarray([protocol_stats.error_at_best_val(t, v) for t, v in
                            zip(rep["test_error_curve"], rep["val_error_curve"])])
  workers_final = np.asarray(rep["worker_test_error"], np.float64).mean(axis=1)
  steps = run.eval_steps
  ttt = {}
  for target in config.targets:
    hits = [protocol_stats.first_reach(curve, steps, target) for curve in curves]
    entry = dict(steps=hits, reached=sum(h is not None for h in hits), n=len(hits))
    if all(h is not None for h in hits):
      comms = [comm(h) for h in hits]
      entry["summary"] = dict(
          steps=protocol_stats.mean_interval(hits),
          samples=protocol_stats.mean_interval([h * c.global_batch_size for h in hits]),
          all_reduces=protocol_stats.mean_interval([a for a, _ in comms]),
          bytes=protocol_stats.mean_interval([b for _, b in comms]),
          modelled_s={n.name: protocol_stats.mean_interval([
              protocol_stats.modelled_seconds(h, step_s, a, b, c.num_workers,
                                              n.bandwidth_bytes_per_s, n.latency_s)
              for h, (a, b) in zip(hits, comms)]) for n in config.networks})
    ttt[str(target)] = entry
  total = comm(run.num_steps)
  at_evals = [comm(t) for t in steps]
  return dict(
      algorithm=c.algorithm, config=c.to_dict(), num_steps=run.num_steps,
      steps_per_epoch=run.steps_per_epoch, epochs=c.num_epochs,
      learning_rates=list(run.arm.learning_rates), lr_from=run.arm.lr_from,
      chosen_learning_rate=res["chosen_learning_rate"],
      resolved_learning_rate=res["chosen_learning_rate"] * c.lr_scale,
      lr_scale=c.lr_scale, grid_edge=res["grid_edge"], tuning=res["tuning"],
      report=rep,
      final_test_error=protocol_stats.mean_interval(final),
      test_error_at_best_val=protocol_stats.mean_interval(at_best_val),
      final_worker_test_error=protocol_stats.mean_interval(workers_final),
      final_test_errors=final.tolist(), test_errors_at_best_val=at_best_val.tolist(),
      best_val_steps=[int(steps[i]) for i in at_val],
      final_worker_test_errors=workers_final.tolist(),
      diverged=[_diverged(np.asarray(loss, np.float64), config.divergence_factor)
                for loss in rep["test_loss_curve"]],
      time_to_target=ttt, compute_per_step_s=step_s,
      communication_curve=dict(all_reduces=[a for a, _ in at_evals],
                               bytes=[b for _, b in at_evals]),
      all_reduces=total[0], bytes_per_worker=total[1],
      samples=run.num_steps * c.global_batch_size)


def _finish(config, arms, programs, step_s, param_bytes, num_params, seconds, workdir):
  results = dict(
      protocol=to_dict(config),
      machine=dict(platform=jax.devices()[0].platform, jax_version=jax.__version__,
                   cpu_count=os.cpu_count(), processor=platform.processor() or None,
                   note="wall times from this machine, which other jobs may share"),
      num_params=num_params, param_bytes=param_bytes,
      compute_per_step_s={str(k[0]): v for k, v in step_s.items()},
      arms=arms, programs=programs, wall_time_s=round(seconds, 1))
  if workdir is not None:
    path = Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path / RESULTS_JSON, results_json(results))
  return results


def results_json(results: dict[str, Any]) -> str:
  """``results`` as the text of ``results.json``: strict JSON
  (``easgd._util.files.json_text``), NumPy values as Python ones, and ``null``
  where a number was not finite (a diverged run's loss or error) or was not
  measured (``train_loss_curve`` at step 0, before any step)."""
  return json_text(results, indent=1)

