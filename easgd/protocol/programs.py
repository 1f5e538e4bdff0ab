"""The protocol's programs: arms resolved to runs, the data of the seeds, one program.

``easgd.protocol.runs.run_protocol`` tunes and reports through these pieces (the
procedure and what "one program" computes: docs/guides/protocol.md):

  :class:`ArmRun`, :func:`prepare`        every arm with its config, steps and
                                          evaluation steps (sizes checked).
  :func:`group_programs`, :func:`why_separate`
                                          arms that run as one compiled program,
                                          and the fields that keep groups apart.
  :func:`check_task_kind`, :func:`check_task_for`
                                          a task the protocol cannot run refused
                                          (before anything compiles).
  :class:`SeedData`, :func:`batch_indices`
                                          the seeds' tasks and their data (held
                                          in memory), a run's batch indices.
  :func:`augmented_batches`, :func:`center_state_examples`
                                          a run's augmented global batches and
                                          the center's BatchNorm examples, made
                                          on the host as ``easgd train`` makes
                                          them (a task with ``augment``, one
                                          with ``center_state``).
  :func:`run_program`                     one group's configurations as one
                                          program (``easgd.sweeps.curves``).

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging
  SGD. NeurIPS 2015, Section 5.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from easgd.core import elastic
from easgd.methods import registry
from easgd.protocol.config import Arm, ProtocolConfig, ProtocolError
from easgd.runtimes.optimizers import make_optimizer
from easgd.runtimes.training_run import bn_stats_indices
from easgd.settings import builtin_tasks
from easgd.settings.config import ConfigError, TrainConfig
from easgd.sweeps.curves import make_curve_fn
from easgd.sweeps.engine import CompileCounter
from easgd.tasks import batches, data
from easgd.tasks.sources import ArraySource, TaskError, take
from easgd.tasks.task import Task, check_task, user_call

TRACED_ALWAYS = ("learning_rate", "seed", "lr_scaling", "lr_reference_batch")
"""Fields every program takes per configuration: the rate (resolved with the
arm's scaling, traced) and the seed (initial parameters, data, key)."""

WHY_STATIC = {
    "num_workers": "p sets the workers' array shapes",
    "global_batch_size": "the batch sets the array shapes",
    "num_epochs": "the budget sets the scan's length",
    "sync_warmup_steps": "the warm-up's K sets the program's control flow",
    "tau": "its tau is a Python int (the fragments' offsets of a streaming exchange)",
}
"""Why arms that differ in a field run as separate programs."""

MAX_INDEX_BYTES = 2 * 2**30
"""The most bytes (2 GiB) of batch indices an arm's grid may hold (every step's
examples of every configuration are gathered on the host before its program
runs); a larger budget is refused before anything is compiled."""

MAX_AUGMENTED_BYTES = 2 * 2**30
"""The most bytes (2 GiB) of augmented training batches one program of an arm
may hold (a task with ``augment``: every step's augmented global batch of every
seed, :func:`augmented_batches`, made on the host and held on the device); a
larger budget is refused before anything is compiled."""


# ----------------------------------------------------------------------------
# Arms resolved to runs
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class ArmRun:
  """An arm with what its runs need: config, steps, evaluation steps."""

  arm: Arm
  config: TrainConfig  # the arm's config (learning rate: the base's)
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


def prepare(
    config: ProtocolConfig, num_train: int, augmented_bytes: Callable | None = None
) -> dict[str, ArmRun]:
  """Each arm's run length and evaluation steps; checks what the arm derives
  from the run's length as the trainer does (``TrainConfig.resolve``: tau, K,
  the center's first exchange, the schedule in steps).

  Args:
    config: the validated protocol.
    num_train: N, the training examples (the validation split held out).
    augmented_bytes: for a task with ``augment``, ``augmented_bytes(p, B) ->
      int``, the bytes of one augmented global batch of p workers x B examples
      (:meth:`SeedData.augmented_batch_bytes`); None: the task does not
      augment (nothing materialised).

  Raises:
    ProtocolError: a quantity ``TrainConfig.resolve`` refuses (naming the
      arm), an arm's batch indices (int32, every step of every configuration of its
      grid) beyond :data:`MAX_INDEX_BYTES`, or its augmented batches (every
      step of every seed of a program) beyond :data:`MAX_AUGMENTED_BYTES`.
  """
  runs = {}
  for arm in config.arms:
    cfg = arm.config(config.base).validate()
    spe = batches.steps_per_epoch(num_train, cfg.num_workers, cfg.per_worker_batch_size)
    total = spe * cfg.num_epochs
    try:  # tau, K and the center's first exchange against the run: the trainer's checks
      cfg.resolve(spe, num_train)
    except ConfigError as e:
      raise ProtocolError(f"arm {arm.name!r}: {e}") from None
    # every configuration of a program holds its batch indices of every step
    configs = max(len(arm.learning_rates) * len(config.tune_seeds), len(config.report_seeds))
    index_bytes = configs * total * cfg.global_batch_size * 4
    if index_bytes > MAX_INDEX_BYTES:
      raise ProtocolError(
          f"arm {arm.name!r}: {configs} configurations x {total} steps x "
          f"{cfg.global_batch_size} examples of batch indices need "
          f"{index_bytes / 2**30:.1f} GiB; allowed: at most {MAX_INDEX_BYTES / 2**30:g} "
          f"GiB (fewer epochs, rates or seeds)"
      )
    if augmented_bytes is not None:  # every step of every seed, made on the host
      seeds = max(len(config.tune_seeds), len(config.report_seeds))
      batch_bytes = int(augmented_bytes(cfg.num_workers, cfg.per_worker_batch_size))
      aug_bytes = seeds * total * batch_bytes
      if aug_bytes > MAX_AUGMENTED_BYTES:
        raise ProtocolError(
            f"arm {arm.name!r}: {seeds} seeds x {total} steps x {batch_bytes} bytes of an "
            f"augmented global batch need {aug_bytes} bytes ({aug_bytes / 2**30:.1f} GiB); "
            f"allowed: at most {MAX_AUGMENTED_BYTES} bytes ({MAX_AUGMENTED_BYTES / 2**30:g} "
            "GiB; fewer epochs or seeds, or smaller examples)"
        )
    runs[arm.name] = ArmRun(arm, cfg, spe, total, eval_steps_of(total, config.eval_every_steps))
  return runs


def program_key(run: ArmRun) -> tuple:
  """Arms with equal keys run in one program: everything but the rate, the
  seed and the algorithm's array fields is equal."""
  traced = set(TRACED_ALWAYS) | set(registry.array_fields_of(run.config))
  if run.config.lr_schedule_unit == "reference_steps":  # it sets the schedule's steps
    traced.discard("lr_reference_batch")
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
          why = WHY_STATIC.get(
              k, f"{k} is not an array field of {algo} " "(easgd.methods.registry)"
          )
          reasons.add(f"{k} differs: {why}")
    out.append("; ".join(sorted(reasons)))
  return out


# ----------------------------------------------------------------------------
# Data of the seeds
# ----------------------------------------------------------------------------


def check_task_kind(task: Task, base: TrainConfig) -> None:
  """Refuses a task the protocol cannot run, before any data are read.

  The protocol tunes on ``base.validation_examples`` held out of the training
  set and reports on a test set shared by the seeds, so a task may not bring
  its own validation data or draw its train/test split from the seed. Any
  other task runs as ``easgd train`` runs it: one with ``augment`` trains on
  the global batches ``easgd train`` augments (made on the host,
  :func:`augmented_batches`), one with ``eval_transform`` is evaluated on
  transformed examples, and one with a ``center_state`` (BatchNorm) is
  evaluated with statistics over the trainer's transformed training examples
  (:func:`center_state_examples`).

  Args:
    task: the task (one seed's).
    base: the protocol's base config (``validation_examples``).

  Raises:
    ProtocolError: naming the task and what it has (one line).
  """
  name = task.name
  if task.split_from_seed:
    raise ProtocolError(
        f"task {name!r} draws its train/test split from the seed: a tuning seed's "
        "validation examples would be test examples of a report seed; allowed: a task "
        "whose test set is the same for every seed"
    )
  if task.validation is not None:
    raise ProtocolError(
        f"task {name!r} has validation data of its own: the protocol tunes on "
        f"validation_examples={base.validation_examples} held out of the training data "
        "(easgd.tasks.data.validation_split); allowed: a task without validation data"
    )


def check_task_for(config: ProtocolConfig, task: Task) -> tuple[str, ...]:
  """Checks ``task`` against every arm's sizes (abstractly, nothing compiled).

  Args:
    config: the validated protocol.
    task: the task.

  Returns:
    The metric names its ``evaluate`` returns (``"loss"``, ``"correct"`` of a
    classifier, any others): what ``ProtocolConfig.for_task`` resolves the
    chosen metric, targets and networks by.

  Raises:
    easgd.tasks.task.TaskError: as ``easgd.tasks.task.check_task``.
  """
  sizes = []
  for arm in config.arms:
    cfg = arm.config(config.base)
    if (cfg.num_workers, cfg.per_worker_batch_size) not in sizes:
      sizes.append((cfg.num_workers, cfg.per_worker_batch_size))
  metrics = ()
  for p, b in sizes:
    metrics = check_task(
        task,
        num_workers=p,
        per_worker_batch=b,
        eval_batch=min(config.eval_chunk, len(task.test)),
    )["metrics"]
  return tuple(metrics)


def _tree_equal(a, b) -> bool:
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  return ta == tb and all(
      x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb)
  )


def _shapes(tree) -> list:
  return [(a.shape, str(a.dtype)) for a in jax.tree.leaves(tree)]


def _same_source(a, b) -> bool:
  """Whether two sources are the same data without reading them (the same
  object, or array sources of the same array objects)."""
  if a is b:
    return True
  return (
      isinstance(a, ArraySource)
      and isinstance(b, ArraySource)
      and a.treedef == b.treedef
      and all(x is y for x, y in zip(a.leaves, b.leaves))
  )


def _all_examples(source):
  """Every example of ``source``, as one pytree of arrays ``[N, ...]``."""
  return take(source, np.arange(len(source)))


class SeedData:
  """The data of some seeds' tasks, held in memory, stacked once per distinct data set.

  Each seed's task is ``task`` (a task built in code: the same data for every
  seed) or ``easgd.settings.builtin_tasks.task_of(base, seed=s)`` (the
  config's import path, or the built-in data set and model; a factory that
  takes ``seed`` draws per-seed data, as MNIST-1D does). Each distinct data
  set's training and test sources are read whole into arrays
  (``easgd.tasks.task.take`` of every index, so a ``__getitem__`` source
  gives the arrays its items stack to); seeds whose data are equal share one
  slot. ``slot[seed]`` is the seed's index into the stacked arrays; the
  training and validation indices are
  :func:`easgd.tasks.data.validation_split`'s of the training set (the
  same for every seed: they depend on its size only), so the validation
  split is held out of the training data and never the test set. The
  validation and test examples have the task's ``eval_transform`` applied;
  the training examples are held as read (a run's augmented batches and the
  center's BatchNorm examples are made from them, per run:
  :func:`augmented_batches`, :func:`center_state_examples`). The programs
  use the first seed's task's ``init``, ``loss``, ``evaluate``, ``augment``,
  ``eval_transform`` and ``center_state`` for every seed (:attr:`task`): the
  seeds differ in data only.

  Args:
    base: the protocol's base config (validated).
    seeds: the seeds.
    task: a task built in code, or None for the one ``base`` names.

  Raises:
    ProtocolError: a task the protocol cannot run (:func:`check_task_kind`).
    easgd.tasks.task.TaskError: as ``task_of`` and ``take``, or seeds
      whose data differ in structure, shapes or dtypes.
    ConfigError, easgd.tasks.data.DataError: as ``task_of``.
  """

  def __init__(self, base: TrainConfig, seeds, task: Task | None = None):
    tasks, sets, self.slot = [], [], {}
    for s in seeds:
      t = builtin_tasks.task_of(base, task, seed=s)
      check_task_kind(t, base)
      for i, other in enumerate(tasks):
        if _same_source(t.train, other.train) and _same_source(t.test, other.test):
          self.slot[s] = i
          break
      else:
        arrays = (_all_examples(t.train), _all_examples(t.test))
        for i, other in enumerate(sets):
          if _tree_equal(arrays, other):
            self.slot[s] = i
            break
        else:
          if sets and (
              jax.tree.structure(arrays) != jax.tree.structure(sets[0])
              or _shapes(arrays) != _shapes(sets[0])
          ):
            raise TaskError(
                f"task {t.name!r}: seed {s}'s data have shapes {_shapes(arrays)}, seed "
                f"{seeds[0]}'s {_shapes(sets[0])}; the protocol stacks the seeds' data: "
                "every seed's data must have the same structure, sizes and dtypes"
            )
          self.slot[s] = len(sets)
          sets.append(arrays)
          tasks.append(t)
    self.task = tasks[0]
    self.train_idx, self.val_idx = data.validation_split(
        len(self.task.train), base.validation_examples
    )
    self.num_train = len(self.train_idx)
    self._train = [train for train, _ in sets]
    self._eval = dict(
        val=[self.evaluated(jax.tree.map(lambda a: a[self.val_idx], tr)) for tr, _ in sets],
        test=[self.evaluated(te) for _, te in sets],
    )

  def evaluated(self, batch):
    """``batch`` with the task's ``eval_transform`` applied (as is without one).

    Raises:
      easgd.tasks.task.TaskError: ``eval_transform`` fails (one line).
    """
    if self.task.eval_transform is None:
      return batch
    return user_call(self.task, "eval_transform", self.task.eval_transform, batch)

  def train(self):
    """Every training example of each slot, each leaf ``[S, N, ...]`` (the
    held-out ones too: the runs gather only their training indices)."""
    return jax.tree.map(lambda *a: np.stack(a), *self._train)

  def train_examples(self, seed: int, indices: np.ndarray):
    """The training examples of ``seed``'s data at ``indices`` (any shape,
    into the full training set), as read: leaves ``[*indices.shape, ...]``."""
    return jax.tree.map(lambda a: a[indices], self._train[self.slot[seed]])

  def augment(self, batch, seed: int, epoch: int, step: int):
    """``task.augment`` of a global batch as ``easgd train`` calls it
    (``easgd.runtimes.training_run.global_batch``): its generator
    ``easgd.tasks.batches.crop_rng(seed, epoch, step)``, ``epoch`` 1-based,
    ``step`` the global step (0-based).

    Raises:
      easgd.tasks.task.TaskError: ``augment`` fails (one line).
    """
    task = self.task
    return user_call(task, "augment", task.augment, batch, batches.crop_rng(seed, epoch, step))

  def augmented_batch_bytes(self, num_workers: int, per_worker_batch: int) -> int:
    """Bytes of one augmented global batch of ``num_workers`` x
    ``per_worker_batch`` examples (the first training examples, augmented as
    at seed 0, epoch 1, step 0): what each step of a run adds to
    :func:`augmented_batches`.

    Raises:
      easgd.tasks.task.TaskError: ``augment`` fails (one line).
    """
    g = num_workers * per_worker_batch
    idx = self.train_idx[np.arange(g) % self.num_train].reshape(num_workers, per_worker_batch)
    batch = self.augment(self.train_examples(next(iter(self.slot)), idx), 0, 1, 0)
    return int(sum(np.asarray(a).nbytes for a in jax.tree.leaves(batch)))

  def num_examples(self, split: str) -> int:
    """How many validation ("val") or test ("test") examples each seed has."""
    return len(self.val_idx) if split == "val" else len(jax.tree.leaves(self._eval["test"][0])[0])

  def num_chunks(self, split: str, chunk: int) -> int:
    """C of :meth:`chunks` without ``num_chunks``: ceil(n / min(chunk, n))."""
    n = self.num_examples(split)
    return -(-n // min(chunk, n))

  def chunks(self, split: str, chunk: int, num_chunks: int | None = None):
    """(batch, mask [C, c]) of the validation ("val") or test ("test")
    examples, each leaf of the batch ``[S, C, c, ...]``, padded with zeros to
    C chunks of c examples (``mask`` False on the padding).

    Args:
      split: "val" or "test".
      chunk: examples per chunk (at most; c = min(chunk, n)).
      num_chunks: at least this many chunks (then c = ceil(n / C)), so that
        two splits evaluated by one program have the same C.
    """
    sets = self._eval[split]
    n = self.num_examples(split)
    chunk = min(chunk, n)
    c = -(-n // chunk)
    if num_chunks is not None and num_chunks > c:
      c = num_chunks
      chunk = -(-n // c)
    pad = c * chunk - n

    def stacked(*leaves):
      v = np.stack([np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) for a in leaves])
      return v.reshape(len(leaves), c, chunk, *v.shape[2:])

    mask = (np.arange(c * chunk) < n).reshape(c, chunk)
    return jax.tree.map(stacked, *sets), mask


def batch_indices(seed_data: SeedData, run: ArmRun, seed: int) -> np.ndarray:
  """int32 [T, p, B]: the run's examples at every step, as indices into the
  full training set (the trainer's order: epochs 1, 2, ... of
  ``worker_batch_indices`` over the training part)."""
  c = run.config
  idx = np.concatenate(
      [
          batches.worker_batch_indices(
              seed_data.num_train, c.num_workers, c.per_worker_batch_size, seed, epoch
          )
          for epoch in range(1, c.num_epochs + 1)
      ]
  )[: run.num_steps]
  return seed_data.train_idx[idx].astype(np.int32)


def augmented_batches(seed_data: SeedData, run: ArmRun, seed: int):
  """The run's augmented global batches, every step: what ``easgd train``
  feeds its step (``easgd.runtimes.training_run.global_batch``).

  Step t (0-based) is ``task.augment(batch, crop_rng(seed, epoch, t))`` of
  the examples at ``batch_indices(seed_data, run, seed)[t]`` (leaves
  ``[p, B, ...]``), with ``epoch = t // steps_per_epoch + 1``, as the trainer
  numbers them (``easgd.runtimes.spmd``; the asynchronous runtimes read
  worker i's row of the same batch).

  Args:
    seed_data: the seeds' data and task (its ``augment``).
    run: the arm's run (layout, steps per epoch, steps).
    seed: the run's seed.

  Returns:
    The batches, each leaf ``[T, p, B, ...]`` (the augmented leaf's dtype).

  Raises:
    easgd.tasks.task.TaskError: ``augment`` fails, or returns batches of
      different structure, shapes or dtypes at two steps (one line).
  """
  idx = batch_indices(seed_data, run, seed)
  spe, out, first = run.steps_per_epoch, None, None
  for t in range(run.num_steps):
    batch = seed_data.augment(seed_data.train_examples(seed, idx[t]), seed, t // spe + 1, t)
    leaves, treedef = jax.tree.flatten(batch)
    leaves = [np.asarray(a) for a in leaves]
    if out is None:
      first = (treedef, _shapes(leaves))
      out = [np.empty((run.num_steps, *a.shape), a.dtype) for a in leaves]
    elif (treedef, _shapes(leaves)) != first:
      raise TaskError(
          f"task {seed_data.task.name!r}: augment returns {_shapes(leaves)} at step {t}, "
          f"{first[1]} at step 0; every augmented batch must have the same structure, "
          "shapes and dtypes"
      )
    for o, a in zip(out, leaves):
      o[t] = a
  return first[0].unflatten(out)


def center_state_examples(seed_data: SeedData, config: TrainConfig, seed: int):
  """The examples of the center's statistics (a task with ``center_state``),
  as ``easgd train`` makes them: the training examples of
  ``easgd.runtimes.training_run.bn_stats_indices`` (of ``seed``, p workers,
  ``bn_stats_examples``), all workers' shards in order, with the task's
  ``eval_transform`` applied (``evaluated_examples``: centre crops, never
  augmented).

  Returns:
    The examples, each leaf ``[p * n, ...]`` (the pooled statistics of the
    trainer's p equal shards of n are those of all p * n at once).

  Raises:
    easgd.tasks.task.TaskError: ``eval_transform`` fails (one line).
  """
  idx = bn_stats_indices(seed_data.num_train, config.num_workers, config.bn_stats_examples, seed)
  return seed_data.evaluated(seed_data.train_examples(seed, seed_data.train_idx[idx.reshape(-1)]))


def _per_seed(configs: list[dict], make: Callable, name: str):
  """``(stacked, slots)``: ``make(seed)`` of each distinct seed of ``configs``
  (in order of first use), each leaf stacked ``[K, ...]`` (written in place: no
  second copy), and int32 [n] each configuration's index into them
  (configurations of one seed share one).

  Raises:
    easgd.tasks.task.TaskError: two seeds' ``make`` differ in structure,
      shapes or dtypes (``name`` says what they are).
  """
  seeds = list(dict.fromkeys(c["seed"] for c in configs))
  out = first = None
  for k, s in enumerate(seeds):
    leaves, treedef = jax.tree.flatten(make(s))
    leaves = [np.asarray(a) for a in leaves]
    if out is None:
      first = (treedef, _shapes(leaves))
      out = [np.empty((len(seeds), *a.shape), a.dtype) for a in leaves]
    elif (treedef, _shapes(leaves)) != first:
      raise TaskError(
          f"{name} of seed {s} have shapes {_shapes(leaves)}, of seed {seeds[0]} "
          f"{first[1]}; every seed's must have the same structure, shapes and dtypes"
      )
    for o, a in zip(out, leaves):
      o[k] = a
  return first[0].unflatten(out), np.asarray([seeds.index(c["seed"]) for c in configs], np.int32)


# ----------------------------------------------------------------------------
# One program
# ----------------------------------------------------------------------------


def _sum_name(split: str, metric: str) -> str:
  """The name of a split's summed metric in a program's curves: ``{split}_loss_sum``,
  ``{split}_correct`` (the number of correct predictions), ``{split}_<metric>_sum``."""
  return f"{split}_correct" if metric == "correct" else f"{split}_{metric}_sum"


def make_eval(task: Task, splits):
  """``eval_fn(center, data, config_data, j)``: the center's summed per-example
  metrics and number of examples on chunk j of the config's examples of each
  split (additive over the chunks), from every metric of ``task.evaluate``
  (``"loss"``, ``"correct"`` of a classifier, any other).

  Args:
    task: the task (its ``evaluate``).
    splits: "val" (validation), "test", or a tuple of both (each split's
      chunks in ``data[split]``, the same number of chunks for all).

  Returns:
    ``eval_fn`` returning ``{split}_loss_sum``, ``{split}_correct`` (a
    classifier's), ``{split}_<metric>_sum`` of any other metric and
    ``{split}_count`` (float32 scalars) for each split. A task with a
    ``center_state`` (BatchNorm) is evaluated with the state of ``params``
    over the configuration's examples ``data["bn_stats"][config["bn_slot"]]``
    (the trainer's, :func:`center_state_examples`, all at once: the pooled
    statistics of the workers' equal shards), recomputed at every chunk.
  """
  splits = (splits,) if isinstance(splits, str) else tuple(splits)

  def eval_fn(params, shared, cfg, j):
    out = {}
    state = ()
    if task.center_state is not None:  # statistics of the evaluated parameters themselves
      stats_batch = jax.tree.map(lambda a: a[cfg["bn_slot"]], shared["bn_stats"])
      state = (task.center_state(params, stats_batch, None),)
    for split in splits:
      examples, mask = shared[split]
      m = mask[j]
      metrics = task.evaluate(params, jax.tree.map(lambda a: a[cfg["slot"], j], examples), *state)
      out[f"{split}_loss_sum"] = jnp.sum(jnp.where(m, metrics["loss"], 0.0))
      if "correct" in metrics:
        out[f"{split}_correct"] = jnp.sum(jnp.where(m, metrics["correct"], 0).astype(jnp.float32))
      out[f"{split}_count"] = jnp.sum(m).astype(jnp.float32)
      for name in sorted(set(metrics) - {"loss", "correct"}):
        value = jnp.where(m, metrics[name], 0).astype(jnp.float32)
        out[_sum_name(split, name)] = jnp.sum(value)
    return out

  return eval_fn


def make_final(task: Task):
  """``final_fn``: every worker's correct test predictions (a classifier's;
  else its summed test loss), additive over the chunks, and its distance to
  the center (only chunk 0 counts it)."""
  test_eval = make_eval(task, "test")

  def final_fn(worker_params, center, shared, cfg, j):
    sums = jax.vmap(lambda w: test_eval(w, shared, cfg, j))(worker_params)
    dist = jax.vmap(lambda w: elastic.tree_l2_distance(w, center))(worker_params)
    out = dict(worker_center_distance=jnp.where(j == 0, jnp.mean(dist), 0.0))
    if "test_correct" in sums:
      out["worker_test_correct"] = sums["test_correct"]
    else:
      out["worker_test_loss_sum"] = sums["test_loss_sum"]
    return out

  return final_fn


def batch_fn(shared, cfg, t):
  """The configuration's worker batches of step t (each leaf ``[p, B, ...]``).

  Without augmentation, one gather per leaf from its data set's slot
  ``shared["train"][cfg["slot"]]`` (leaves ``[S, N, ...]``) at the step's
  indices ``cfg["idx"][t]`` (:func:`batch_indices`; no copy of the data set).
  A task with ``augment`` instead reads step t of its seed's augmented
  batches, ``shared["train_aug"][cfg["aug_slot"], t]`` (leaves ``[K, T, p, B,
  ...]``, :func:`augmented_batches`: made on the host as ``easgd train``
  makes them; configurations of one seed share a slot).
  """
  if "train_aug" in shared:  # the program's data say which (a static structure)
    return jax.tree.map(lambda a: a[cfg["aug_slot"], t], shared["train_aug"])
  idx = cfg["idx"][t]  # [p, B] indices into the full training set
  return jax.tree.map(lambda a: a[cfg["slot"], idx], shared["train"])


def means(curves: dict, split: str) -> dict[str, np.ndarray]:
  """The mean curves of ``split`` from a program's summed curves.

  Args:
    curves: the program's curves: ``{split}_loss_sum``, ``{split}_correct`` (a
      classifier's), ``{split}_<metric>_sum`` of any other metric and
      ``{split}_count``, each float64 [n, E] (n configurations, E
      evaluations), summed over the evaluation chunks.
    split: "val" or "test".

  Returns:
    ``{split}_loss`` (the task's mean per-example loss), ``{split}_error`` (a
    classifier's: 1 - the fraction correct, in [0, 1]) and ``{split}_<metric>``
    (the mean of each other metric), each float64 [n, E].
  """
  count = curves[f"{split}_count"]
  out = {f"{split}_loss": curves[f"{split}_loss_sum"] / count}
  if f"{split}_correct" in curves:
    out[f"{split}_error"] = 1.0 - curves[f"{split}_correct"] / count
  head, tail = f"{split}_", "_sum"
  for name, value in curves.items():
    metric = name[len(head) : -len(tail)]
    if name.startswith(head) and name.endswith(tail) and metric != "loss":
      out[f"{split}_{metric}"] = value / count
  return out


def run_program(
    group: list[ArmRun],
    configs: list[dict],
    seed_data: SeedData,
    kind: str,
    protocol: ProtocolConfig,
    *,
    return_center: bool = False,
) -> tuple[dict, dict]:
  """Runs the configurations of one program.

  Args:
    group: the program's arms (one algorithm, one static config).
    configs: one dict per configuration: arm (name), learning_rate (base),
      seed, and the arm's values of the varying array fields.
    seed_data: the seeds' data and task (its ``init``, ``loss`` and
      ``evaluate``: :attr:`SeedData.task`).
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
  varying = [
      f for f in registry.array_fields_of(static) if len({getattr(r.config, f) for r in group}) > 1
  ]
  task = seed_data.task
  loss_fn = task.loss
  shapes = jax.eval_shape(task.init, jax.random.key(0))  # fragments' sizes (streaming)

  def build(learning_rate, **fields):
    cfg = dataclasses.replace(static, **fields)  # traced values, not validated
    opt = make_optimizer(
        static,
        first.steps_per_epoch,
        learning_rate=learning_rate,
        num_examples=seed_data.num_train,
    )
    return spec.build(cfg, loss_fn, opt, first.num_steps, shapes)

  hyper = {
      "learning_rate": np.asarray(
          [c["learning_rate"] * by_name[c["arm"]].config.lr_scale for c in configs], np.float32
      )
  }
  for f in varying:
    values = [getattr(by_name[c["arm"]].config, f) for c in configs]
    hyper[f] = registry.field_array(f, values)  # exchange_order: its index
  keys, params = [], []
  for c in configs:
    init_key, step_key = jax.random.split(jax.random.key(c["seed"]))
    keys.append(step_key)
    params.append(task.init(init_key))
  params0 = jax.tree.map(lambda *a: jnp.stack(a), *params)
  cfg_data = dict(slot=np.asarray([seed_data.slot[c["seed"]] for c in configs], np.int32))
  shared = {}
  if task.augment is None:  # the examples gathered inside the program
    cfg_data["idx"] = np.stack(
        [batch_indices(seed_data, by_name[c["arm"]], c["seed"]) for c in configs]
    )
    shared["train"] = seed_data.train()
  else:  # every step's augmented batch made on the host, once per seed (the arms'
    # layouts are equal: p, B and the epochs are static)
    shared["train_aug"], cfg_data["aug_slot"] = _per_seed(
        configs, lambda s: augmented_batches(seed_data, first, s), "the augmented batches"
    )
  if task.center_state is not None:  # the trainer's examples of the center's statistics
    shared["bn_stats"], cfg_data["bn_slot"] = _per_seed(
        configs, lambda s: center_state_examples(seed_data, static, s), "the center's examples"
    )
  splits = ("val",) if kind == "tune" else ("val", "test")
  num_chunks = max(seed_data.num_chunks(s, protocol.eval_chunk) for s in splits)
  for s in splits:
    shared[s] = seed_data.chunks(s, protocol.eval_chunk, num_chunks)
  program = make_curve_fn(
      build,
      static.num_workers,
      first.num_steps,
      first.eval_steps,
      batch_fn=batch_fn,
      eval_fn=make_eval(task, splits),
      eval_chunks=num_chunks,
      final_fn=make_final(task) if kind == "report" else None,
      configs_per_batch=protocol.configs_per_batch,
      warmup_steps=static.sync_warmup_steps,
      return_center=return_center,
  )
  keys = jnp.stack(keys)
  start = time.perf_counter()
  with CompileCounter() as cc:
    out = program(hyper, params0, keys, cfg_data, shared)
  curves = {}
  for s in splits:
    curves.update(means(out["curves"], s))
  out["curves"] = curves
  if kind == "report":
    count = float(shared["test"][1].sum())
    final = out["final"]
    if "worker_test_correct" in final:
      final["worker_test_error"] = 1.0 - final.pop("worker_test_correct") / count
    else:
      final["worker_test_loss"] = final.pop("worker_test_loss_sum") / count
  info = dict(
      kind=kind,
      algorithm=static.algorithm,
      arms=[r.arm.name for r in group],
      configs=len(configs),
      traced_fields=["learning_rate", "seed"] + varying,
      num_workers=static.num_workers,
      num_steps=first.num_steps,
      wall_s=round(time.perf_counter() - start, 3),
      # the grid's programs (init, step per phase, evaluation, end); the
      # others are JAX's small placement helpers
      compiles=sum(str(n).endswith("_one)") for n in cc.names),
      compiles_all=cc.count,
      compile_s=round(cc.seconds, 3),
  )
  return out, info
