"""The protocol's programs: arms resolved to runs, the data of the seeds, one program.

``easgd.protocol.runs.run_protocol`` (whose docstring states the procedure and
what "one program" computes) tunes and reports through these pieces:

  :class:`ArmRun`, :func:`prepare`        every arm with its config, steps and
                                          evaluation steps (sizes checked).
  :func:`group_programs`, :func:`why_separate`
                                          arms that run as one compiled program,
                                          and the fields that keep groups apart.
  :class:`SeedData`, :func:`batch_indices`
                                          the seeds' data sets, a run's batch indices.
  :func:`run_program`                     one group's configurations as one
                                          program (``easgd.sweeps.curves``).

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging
  SGD. NeurIPS 2015, Section 5.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from easgd.training import batches, data, models
from easgd.core import elastic
from easgd.methods import registry
from easgd.training.config import ConfigError, TrainConfig
from easgd.training.optimizers import make_optimizer
from easgd.protocol.config import Arm, ProtocolConfig, ProtocolError
from easgd.sweeps.curves import make_curve_fn
from easgd.sweeps.engine import CompileCounter
from easgd.training.builtin_tasks import make_loss_fn

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
    configs = max(len(arm.learning_rates) * len(config.tune_seeds), len(config.report_seeds))
    index_bytes = configs * total * cfg.global_batch_size * 4
    if index_bytes > MAX_INDEX_BYTES:
      raise ProtocolError(
          f"arm {arm.name!r}: {configs} configurations x {total} steps x "
          f"{cfg.global_batch_size} examples of batch indices need "
          f"{index_bytes / 2**30:.1f} GiB; allowed: at most {MAX_INDEX_BYTES / 2**30:g} "
          f"GiB (fewer epochs, rates or seeds)"
      )
    runs[arm.name] = ArmRun(arm, cfg, spe, total, eval_steps_of(total, config.eval_every_steps))
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
          why = WHY_STATIC.get(
              k, f"{k} is not an array field of {algo} " "(easgd.methods.registry)"
          )
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
    self.train_idx, self.val_idx = data.validation_split(first.num_train, base.validation_examples)
    self.num_train = len(self.train_idx)
    self.sets = sets

  def train(self):
    """(x [S, N, ...], y [S, N]): every training example (the held-out ones
    too: the runs gather only their training indices)."""
    return (np.stack([d.train_x for d in self.sets]), np.stack([d.train_y for d in self.sets]))

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
    return (x.reshape(len(xs), c, chunk, *x.shape[2:]), y.reshape(len(ys), c, chunk), mask)


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
          model.apply({"params": params}, x[cfg["slot"], j], train=False), y[cfg["slot"], j]
      )
      out.update(
          {
              f"{split}_loss_sum": jnp.sum(jnp.where(m, loss, 0.0)),
              f"{split}_correct": jnp.sum(jnp.where(m, correct, 0).astype(jnp.float32)),
              f"{split}_count": jnp.sum(m).astype(jnp.float32),
          }
      )
    return out

  return eval_fn


def make_final(model):
  """``final_fn``: every worker's correct test predictions (additive over the
  chunks), and its distance to the center (only chunk 0 counts it)."""
  test_eval = make_eval(model, "test")

  def final_fn(worker_params, center, shared, cfg, j):
    correct = jax.vmap(lambda w: test_eval(w, shared, cfg, j)["test_correct"])(worker_params)
    dist = jax.vmap(lambda w: elastic.tree_l2_distance(w, center))(worker_params)
    return dict(
        worker_test_correct=correct, worker_center_distance=jnp.where(j == 0, jnp.mean(dist), 0.0)
    )

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


def run_program(
    group: list[ArmRun],
    configs: list[dict],
    seed_data: SeedData,
    model,
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
  varying = [f for f in spec.array_fields if len({getattr(r.config, f) for r in group}) > 1]
  loss_fn = make_loss_fn(model)

  def build(learning_rate, **fields):
    cfg = dataclasses.replace(static, **fields)  # traced values, not validated
    opt = make_optimizer(static, first.steps_per_epoch, learning_rate=learning_rate)
    return spec.build(cfg, loss_fn, opt, first.num_steps)

  hyper = {
      "learning_rate": np.asarray(
          [c["learning_rate"] * by_name[c["arm"]].config.lr_scale for c in configs], np.float32
      )
  }
  for f in varying:
    values = [getattr(by_name[c["arm"]].config, f) for c in configs]
    hyper[f] = np.asarray(values, np.int32 if f == "tau" else np.float32)
  keys, params = [], []
  for c in configs:
    init_key, step_key = jax.random.split(jax.random.key(c["seed"]))
    keys.append(step_key)
    params.append(models.init_params(model, seed_data.input_shape, init_key))
  params0 = jax.tree.map(lambda *a: jnp.stack(a), *params)
  cfg_data = dict(
      slot=np.asarray([seed_data.slot[c["seed"]] for c in configs], np.int32),
      idx=np.stack([batch_indices(seed_data, by_name[c["arm"]], c["seed"]) for c in configs]),
  )
  shared = dict(train=seed_data.train())
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
      eval_fn=make_eval(model, splits),
      eval_chunks=num_chunks,
      final_fn=make_final(model) if kind == "report" else None,
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
    curves[f"{s}_loss"], curves[f"{s}_error"] = means(out["curves"], s)
  out["curves"] = curves
  if kind == "report":
    count = float(shared["test"][2].sum())
    out["final"]["worker_test_error"] = 1.0 - out["final"].pop("worker_test_correct") / count
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
