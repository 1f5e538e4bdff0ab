"""A problem the package trains: a model and its data, as one :class:`Task`.

Every part above the algorithms (``easgd train``, ``compare``, ``protocol``, the
sweep's network problem, the threads and Ray runtimes, checkpoints, resume and
export) reads its problem through this one seam. A task says

* how to initialise the model's parameters (``init(key) -> params``);
* the per-worker training loss (``loss(params, batch, key) -> scalar``), the
  mean over one worker's mini-batch, ``key`` for dropout;
* the per-example evaluation (``evaluate(params, batch) -> {name: [b]}``):
  ``"loss"`` always, ``"correct"`` (1/0, or a fraction such as a sequence's
  token accuracy) for accuracies and errors, any other metric it names;
* its data as random-access sources (:func:`as_source`): NumPy arrays (a
  pytree of arrays of one length, e.g. ``(x, y)``), or any object with
  ``__len__`` and ``__getitem__`` whose items are arrays or pytrees of arrays
  (a ``grain.MapDataset``, a Hugging Face ``datasets.Dataset`` in NumPy
  format). Which rows a worker reads is the package's
  (``easgd.tasks.batches``): the global batch of step t is fixed by the
  seed, the epoch and t, worker i takes its rows, for every source alike
  (``easgd.tasks.sources``: ``take`` stacks the items of a ``__getitem__`` source into exactly the
  arrays that indexing the arrays gives).

Optional: a host-side ``augment(batch, rng)`` of the global training batch
(random crops), an ``eval_transform(batch)`` of evaluated examples (centre
crops), and a ``center_state(params, batch, axis_name)``: the model state
(BatchNorm statistics) the center is evaluated with, recomputed from the
center itself over fixed training examples pooled across workers (the
package's BatchNorm policy, ``easgd.tasks.models``); ``evaluate`` then
takes it as a third argument.

Tasks come from a factory: the built-in data sets and models
(``easgd.settings.builtin_tasks``), or a user's importable factory named
``"package.module:factory"`` (:func:`load_task`; ``easgd train --task``), whose
keyword arguments a config records, so a resume, a Ray worker's process or
``export`` rebuilds the same task. :func:`check_task` checks a task against a
run before anything compiles (abstract evaluation only); :func:`fingerprint`
is what a run records of its task, and :func:`fingerprint_differences` what a
resume or an export finds changed in the task it rebuilds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import os
import sys
from typing import Any, Callable, Mapping

import numpy as np

from easgd.tasks.sources import Batch, TaskError, _first_line, _tree, as_source, take

Params = Any


_DESCRIBED = (
    "name",
    "factory",
    "factory_args",
    "train_examples",
    "test_examples",
    "validation_examples",
    "batch_norm",
)
"""The keys :meth:`Task.describe` writes itself (``info`` may not use them)."""

# --------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
  """A model and its data: what the package trains (module docstring).

  Attributes:
    name: a short name for logs and summaries.
    init: ``init(key) -> params``: the initial parameters (a pytree of float
      arrays) from a JAX PRNG key; every worker starts from them.
    loss: ``loss(params, batch, key) -> float32 scalar``: the mean training
      loss of one worker's mini-batch (leaves ``[B, ...]``); ``key`` is the
      worker's key of the step (dropout).
    evaluate: ``evaluate(params, batch) -> {name: [b]}`` (with
      ``center_state``: ``evaluate(params, batch, state)``): per-example
      metrics of an evaluation batch of b examples; ``"loss"`` is required
      (nats per example), ``"correct"`` gives ``test_accuracy`` and
      ``test_error``; every metric is reported as its mean over the split
      (``test_<name>``, ``val_<name>``).
    train, test: the training and test data (:func:`as_source`).
    validation: optional held-out data; otherwise a run's
      ``validation_examples`` are held out of ``train``.
    augment: optional host-side ``augment(batch, rng) -> batch`` of a global
      training batch (leaves ``[num_workers, B, ...]``), ``rng`` a NumPy
      generator fixed by (seed, epoch, step): e.g. random crops.
    eval_transform: optional ``eval_transform(batch) -> batch`` of evaluated
      examples (test, validation, center-state examples): e.g. centre crops.
    center_state: optional ``center_state(params, batch, axis_name) -> state``:
      the model state (BatchNorm statistics) of ``params`` over a shard of
      fixed training examples, pooled over the mapped ``axis_name``; the run's
      ``bn_stats_examples`` says how many examples in all.
    mean_of_examples: whether ``loss`` is the mean of independent
      per-example terms (no BatchNorm, no batch-level term): then the workers
      a device runs of a one-model method (pmean SGD) may be run as one batch
      (``easgd.parallel.mapping.map_step``'s ``merge_workers``); False, the
      safe default, runs one pass per worker.
    split_from_seed: whether the factory draws the train/test split from the
      seed (then one seed's test examples are another's training examples,
      and the protocol refuses it).
    info: JSON-ready facts recorded in ``summary.json`` (e.g. model, classes).
    factory: the import path ``"package.module:factory"`` it was built from
      (:func:`load_task`), None for a task built in code.
    factory_args: the factory's keyword arguments.

  Raises:
    TaskError: a field of the wrong kind (checked on construction; the
      functions are checked against a run by :func:`check_task`).
  """

  name: str
  init: Callable[[Any], Params]
  loss: Callable[..., Any]
  evaluate: Callable[..., Mapping[str, Any]]
  train: Any
  test: Any
  validation: Any = None
  augment: Callable[[Batch, np.random.Generator], Batch] | None = None
  eval_transform: Callable[[Batch], Batch] | None = None
  center_state: Callable[..., Any] | None = None
  mean_of_examples: bool = False
  split_from_seed: bool = False
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  factory: str | None = None
  factory_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name.strip():
      raise TaskError(f"a task's name must be a non-empty string, got {self.name!r}")
    for field in ("init", "loss", "evaluate"):
      if not callable(getattr(self, field)):
        raise TaskError(
            f"task {self.name!r}: {field} must be a function, got "
            f"{type(getattr(self, field)).__name__}"
        )
    for field in ("augment", "eval_transform", "center_state"):
      value = getattr(self, field)
      if value is not None and not callable(value):
        raise TaskError(
            f"task {self.name!r}: {field} must be a function or None, got {type(value).__name__}"
        )
    for field in ("train", "test", "validation"):
      value = getattr(self, field)
      if value is not None or field != "validation":
        object.__setattr__(self, field, as_source(value, f"task {self.name!r}: {field}"))
    if not isinstance(self.info, Mapping) or not all(isinstance(k, str) for k in self.info):
      raise TaskError(
          f"task {self.name!r}: info must be a dict with string keys, got "
          f"{type(self.info).__name__}"
      )
    taken = set(_DESCRIBED) & set(self.info)
    if taken:
      raise TaskError(
          f"task {self.name!r}: info key {sorted(taken)[0]!r} is one the package records "
          f"itself; allowed: any key but {', '.join(_DESCRIBED)}"
      )
    try:
      json.dumps(dict(self.info), allow_nan=False)
    except (TypeError, ValueError) as e:
      raise TaskError(
          f"task {self.name!r}: info must hold JSON values (numbers, strings, lists, "
          f"dicts), {_first_line(e)}"
      ) from None
    object.__setattr__(self, "info", dict(self.info))
    object.__setattr__(self, "factory_args", dict(self.factory_args))

  def describe(self) -> dict[str, Any]:
    """JSON-ready: name, factory and its arguments, sizes, ``info``."""
    return dict(
        name=self.name,
        factory=self.factory,
        factory_args=dict(self.factory_args),
        train_examples=len(self.train),
        test_examples=len(self.test),
        validation_examples=None if self.validation is None else len(self.validation),
        batch_norm=self.center_state is not None,
        **self.info,
    )


# --------------------------------------------------------------------------
# Checks against a run (abstract evaluation: nothing is compiled)
# --------------------------------------------------------------------------


def _shapes(tree) -> list:
  """(shape, dtype) of each leaf: arrays and ``jax.ShapeDtypeStruct`` alike."""
  return [
      (tuple(np.shape(a)), str(getattr(a, "dtype", None) or np.asarray(a).dtype))
      for a in _tree().tree_leaves(tree)
  ]


def _is_float(dtype) -> bool:
  """A floating dtype, bfloat16 and the other ml_dtypes included."""
  import jax.numpy as jnp  # noqa: PLC0415

  return bool(jnp.issubdtype(dtype, jnp.floating))


def _abstract(task: Task, what: str, fn, *args):
  """``jax.eval_shape(fn, *args)``; a failure of the user's function: one line."""
  import jax  # noqa: PLC0415

  try:
    return jax.eval_shape(fn, *args)
  except TaskError:
    raise
  except Exception as e:  # noqa: BLE001 (a user's function: one line)
    raise TaskError(f"task {task.name!r}: {what} fails: {_first_line(e)}") from None


def check_task(task: Task, *, num_workers: int, per_worker_batch: int, eval_batch: int) -> dict:
  """Checks ``task`` against a run's sizes before anything compiles.

  Reads two global training batches (the first and the last examples), one
  evaluation batch and, with ``center_state``, its examples, and evaluates
  ``init``, ``loss``, ``center_state`` and ``evaluate`` abstractly
  (``jax.eval_shape``: shapes only, nothing compiled or run).

  Args:
    task: the task.
    num_workers: p.
    per_worker_batch: B, examples per worker per step.
    eval_batch: examples per evaluation batch (at most the test set's size).

  Returns:
    ``{"metrics": names evaluate returns, "param_shapes": ...}``.

  Raises:
    TaskError: a training set shorter than one global batch (p * B), items
      that are not arrays, batches whose shapes differ between two calls (of
      the source or of ``augment``), a loss that is not a float scalar,
      metrics that are not per-example ``[b]`` arrays or lack ``"loss"``, or
      a function of the task that fails on the batch (one line each).
  """
  import jax  # noqa: PLC0415

  name = task.name
  g = num_workers * per_worker_batch
  n = len(task.train)
  if n < g:
    raise TaskError(
        f"task {name!r}: the training data has {n} examples, fewer than one global batch "
        f"(num_workers {num_workers} x per-worker batch {per_worker_batch} = {g})"
    )
  first = take(task.train, np.arange(g).reshape(num_workers, per_worker_batch))
  last = take(task.train, np.arange(n - g, n).reshape(num_workers, per_worker_batch))
  if task.augment is not None:
    first, last = (
        user_call(task, "augment", task.augment, b, np.random.default_rng(0)) for b in (first, last)
    )
  if _shapes(first) != _shapes(last) or (
      _tree().tree_structure(first) != _tree().tree_structure(last)
  ):
    raise TaskError(
        f"task {name!r}: batch shapes differ between calls ({_shapes(first)} vs "
        f"{_shapes(last)}); every batch must have the same shapes and dtypes"
    )
  for shape, _ in _shapes(first):
    if shape[:2] != (num_workers, per_worker_batch):
      raise TaskError(
          f"task {name!r}: a global batch leaf has shape {shape}; expected leading axes "
          f"[num_workers, B] = [{num_workers}, {per_worker_batch}] (augment must keep them)"
      )
  worker_batch = jax.tree.map(lambda a: a[0], first)
  key = jax.random.key(0)
  params = _abstract(task, "init(key)", task.init, key)
  leaves = jax.tree.leaves(params)
  if not leaves or any(not _is_float(l.dtype) for l in leaves):
    raise TaskError(
        f"task {name!r}: init returns {_shapes(params) or 'no arrays'}; expected a pytree "
        "of float parameter arrays"
    )
  loss = _abstract(task, "loss(params, batch, key)", task.loss, params, worker_batch, key)
  if not isinstance(loss, jax.ShapeDtypeStruct) or loss.shape != () or not _is_float(loss.dtype):
    got = jax.tree.map(lambda a: (a.shape, str(a.dtype)), loss)
    raise TaskError(
        f"task {name!r}: loss returns {got}; allowed: a float scalar (the mean over the "
        "worker's batch)"
    )
  e = max(1, min(eval_batch, len(task.test)))
  batch = take(task.test, np.arange(e))
  if task.eval_transform is not None:
    batch = user_call(task, "eval_transform", task.eval_transform, batch)
  args = (params, batch)
  if task.center_state is not None:
    state_batch = take(task.train, np.arange(min(e, n)))
    if task.eval_transform is not None:
      state_batch = user_call(task, "eval_transform", task.eval_transform, state_batch)
    state = _abstract(
        task,
        "center_state(params, batch, None)",
        lambda p, b: task.center_state(p, b, None),
        params,
        state_batch,
    )
    args = (params, batch, state)
  metrics = _abstract(task, "evaluate(params, batch)", task.evaluate, *args)
  if not isinstance(metrics, Mapping) or "loss" not in metrics:
    raise TaskError(
        f"task {name!r}: evaluate returns {type(metrics).__name__}"
        f"{sorted(metrics) if isinstance(metrics, Mapping) else ''}; expected a dict of "
        "per-example metrics with 'loss' (and 'correct' for accuracies)"
    )
  for metric, value in metrics.items():
    if not isinstance(metric, str) or not metric.isidentifier():
      raise TaskError(f"task {name!r}: metric name {metric!r} must be a Python name")
    shape = getattr(value, "shape", None)
    if shape != (e,):
      raise TaskError(
          f"task {name!r}: evaluate's metric {metric!r} has shape {shape} for a batch of "
          f"{e} examples; allowed: per-example values, shape ({e},)"
      )
  return dict(metrics=tuple(metrics), param_shapes=_shapes(params))


def user_call(task: Task, what: str, fn, *args):
  """``fn(*args)``, a function of the user's ``task`` (``augment``, ``eval_transform``).

  Raises:
    TaskError: ``fn`` raised: one line naming the task, ``what`` and the error.
  """
  try:
    return fn(*args)
  except TaskError:
    raise
  except Exception as e:  # noqa: BLE001 (a user's function: one line)
    raise TaskError(f"task {task.name!r}: {what} fails: {_first_line(e)}") from None


# --------------------------------------------------------------------------
# Fingerprint: what a run records of its task (resume and export compare it)
# --------------------------------------------------------------------------

FINGERPRINT_ITEMS = 8
"""Items per split :func:`fingerprint` reads (evenly spaced, the first and last among them)."""

SPLITS = ("train", "validation", "test")


def _digest(source) -> dict[str, Any]:
  """``{"examples": n, "digest": sha256 hex}`` of a split (:func:`fingerprint`)."""
  n = len(source)
  positions = np.unique(np.linspace(0, n - 1, FINGERPRINT_ITEMS).round().astype(np.int64))
  h = hashlib.sha256()
  for leaf in _tree().tree_leaves(take(source, positions)):
    leaf = np.ascontiguousarray(leaf)
    h.update(f"{leaf.dtype.str}{leaf.shape}".encode())
    h.update(leaf.tobytes())
  return dict(examples=n, digest=h.hexdigest())


def fingerprint(task: Task) -> dict[str, Any]:
  """What a run records of its task, cheap for data of any size (``task.json``).

  Covers exactly: the path, shape and dtype of every parameter ``init``
  returns (evaluated abstractly, ``jax.eval_shape``: nothing compiled or
  run), and for each split (``train``, ``validation``, ``test``, as the run
  uses them: the validation examples held out of ``train``) its number of
  examples and a SHA-256 digest of the dtype, shape and bytes of every leaf
  of :data:`FINGERPRINT_ITEMS` items at evenly spaced positions
  (``round(k (n - 1) / 7)``, k = 0..7: the first and the last included).
  Not covered: the items between those positions, and the task's functions
  beyond the shapes of the parameters they make.

  Args:
    task: the run's view of its task (``easgd.runtimes.training_run.checked_task``).

  Returns:
    JSON-ready ``{"params": [[path, shape, dtype], ...], "train": {"examples":
    n, "digest": hex}, "validation": {...} or None, "test": {...}}``.

  Raises:
    TaskError: ``init`` fails, or an item cannot be read.
  """
  import jax  # noqa: PLC0415

  params = _abstract(task, "init(key)", task.init, jax.random.key(0))
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  out: dict[str, Any] = dict(
      params=[
          [jax.tree_util.keystr(path), list(leaf.shape), str(leaf.dtype)] for path, leaf in leaves
      ]
  )
  for split in SPLITS:
    source = getattr(task, split)
    out[split] = None if source is None else _digest(source)
  return out


def fingerprint_differences(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
  """What differs between two :func:`fingerprint` s, one short phrase each.

  Args:
    recorded: the fingerprint the run recorded.
    now: the fingerprint of the task rebuilt.

  Returns:
    E.g. ``["train: 256 -> 258 examples", "parameter ['Dense_0']['kernel']:
    (8, 64) float32 -> (8, 32) float32"]``; empty when they agree.
  """

  def shapes(fp):
    return {p: f"({', '.join(map(str, s))}{',' if len(s) == 1 else ''}) {d}" for p, s, d in fp}

  out = []
  old, new = shapes(recorded.get("params", [])), shapes(now.get("params", []))
  changed = [p for p in sorted(set(old) | set(new)) if old.get(p) != new.get(p)]
  for p in changed[:2]:
    out.append(f"parameter {p}: {old.get(p, 'none')} -> {new.get(p, 'none')}")
  if len(changed) > 2:
    out[-1] += f" and {len(changed) - 2} more"
  for split in SPLITS:
    a, b = recorded.get(split) or {}, now.get(split) or {}
    if a.get("examples") != b.get("examples"):
      out.append(f"{split}: {a.get('examples', 'no')} -> {b.get('examples', 'no')} examples")
    elif a.get("digest") != b.get("digest"):
      out.append(f"{split}: other items (digest of {FINGERPRINT_ITEMS} evenly spaced items)")
  return out


# --------------------------------------------------------------------------
# Factories by import path
# --------------------------------------------------------------------------


def parse_task_arg(text: str) -> tuple[str, Any]:
  """``"key=value"`` (``--task-arg``) as ``(key, value)``: JSON if it parses, else text.

  Raises:
    TaskError: no ``=`` or an empty key.
  """
  key, sep, value = str(text).partition("=")
  if not sep or not key.strip() or not key.strip().isidentifier():
    raise TaskError(f"--task-arg {text!r} must be key=value with key a Python name")
  try:
    parsed = json.loads(value)
  except ValueError:
    parsed = value
  return key.strip(), parsed


def parse_task_args(texts) -> dict[str, Any]:
  """``("key=value", ...)`` (``config.task_args``) as a dict (:func:`parse_task_arg`).

  Raises:
    TaskError: a malformed entry or a key given twice.
  """
  out = {}
  for text in texts:
    key, value = parse_task_arg(text)
    if key in out:
      raise TaskError(f"--task-arg {key!r} is given twice")
    out[key] = value
  return out


def _import_path_dirs() -> list[str]:
  """The working directory, searched for a task's module like ``python -m``."""
  return [os.getcwd()]


def load_task(factory: str, args: Mapping[str, Any] | None = None, *, seed: int | None = None):
  """The task of ``factory(**args)``, ``factory`` an import path.

  Args:
    factory: ``"package.module:function"`` naming an importable function
      (the working directory is searched first, as ``python -m`` does).
    args: its keyword arguments (JSON values).
    seed: the run's seed, passed as ``seed=`` when the function takes it
      (then ``args`` may not name it).

  Returns:
    The :class:`Task` (``factory`` and ``factory_args`` set).

  Raises:
    TaskError: a malformed path, a module that does not import, a missing or
      non-callable attribute, arguments it does not take, a factory that
      raises, or a result that is not a Task (one line each).
  """
  args = dict(args or {})
  if not isinstance(factory, str) or factory.count(":") != 1:
    raise TaskError(f"--task {factory!r} must be package.module:factory (one colon)")
  module_name, _, attr = factory.partition(":")
  if not module_name or not attr or not all(p.isidentifier() for p in module_name.split(".")):
    raise TaskError(f"--task {factory!r} must be package.module:factory")
  for d in reversed(_import_path_dirs()):
    if d not in sys.path:
      sys.path.insert(0, d)
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # noqa: BLE001 (a user's module: one line)
    raise TaskError(
        f"--task {factory!r}: module {module_name!r} does not import ({_first_line(e)})"
    ) from None
  fn = getattr(module, attr, None)
  if fn is None:
    raise TaskError(f"--task {factory!r}: module {module_name!r} has no {attr!r}")
  if not callable(fn) or isinstance(fn, Task):
    raise TaskError(
        f"--task {factory!r}: {attr!r} is a {type(fn).__name__}, not a factory function "
        "returning an easgd Task"
    )
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    params = {}
  takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
  if "seed" in args and "seed" in params:
    raise TaskError(f"--task {factory!r}: seed is the run's seed (set --seed), not a --task-arg")
  unknown = [k for k in args if k not in params and not takes_kwargs]
  if unknown:
    allowed = ", ".join(k for k in params if k != "seed") or "none"
    raise TaskError(f"--task {factory!r} takes no argument {unknown[0]!r}; allowed: {allowed}")
  call_args = dict(args)
  if seed is not None and "seed" in params:
    call_args["seed"] = seed
  try:
    task = fn(**call_args)
  except TaskError:
    raise
  except (Exception, SystemExit) as e:  # noqa: BLE001 (a user's factory: one line)
    raise TaskError(f"--task {factory!r} failed: {_first_line(e)}") from None
  if not isinstance(task, Task):
    raise TaskError(f"--task {factory!r} returned a {type(task).__name__}; expected an easgd.Task")
  return dataclasses.replace(task, factory=factory, factory_args=args)


def module_root(factory: str) -> str | None:
  """The directory a task factory's top-level package imports from (for another
  process, e.g. a Ray worker, to import it alike); None if not found."""
  module_name = factory.partition(":")[0]
  module = sys.modules.get(module_name)
  path = getattr(module, "__file__", None)
  if not path:
    return None
  root = os.path.dirname(os.path.abspath(path))
  for _ in range(module_name.count(".")):
    root = os.path.dirname(root)
  return root
