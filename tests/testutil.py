"""Helpers shared by the tests (test code, not library code).

STEP_KINDS           argument and output kinds of an algorithm step for
                     ``mapping.map_workers``;
mlp_setup, random_batches  a tiny MLP classifier and random batches for it;
tanh_mlp             a 3-4-2 tanh regression network per worker, its JAX loss and
                     its float64 NumPy gradient (the float64 references);
max_abs_diff, assert_trees_close  leafwise comparison of two pytrees;
linear_data, Items, linear_task  a separable 3-class problem as arrays, as a
                     ``__getitem__`` object, and as a user's Task;
regression_task      a loss-only user's Task (mean-squared error, no "correct"),
                     also ``--task testutil:regression_task``;
all_reduce_ops, all_reduce_bytes  the all-reduces of a compiled program's HLO
                     text: their device groups and result bytes;
program_collectives  the all-reduces and all-gathers of an algorithm's compiled
                     programs on a layout;
collective_dtypes    the element types each collective of a compiled program
                     operates on.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from easgd.parallel import mapping
from easgd.settings.config import TrainConfig
from easgd.tasks import models
from easgd.tasks.task import Task

TINY_DIGITS = TrainConfig(
    dataset="digits",
    model="mlp",
    num_workers=4,
    num_devices=2,
    global_batch_size=64,
    num_epochs=2,
    learning_rate=0.1,
    tau=4,
    beta=0.9,
    eval_batch_size=64,
    progress=False,
)
"""The tests' tiny run: scikit-learn's digits and the MLP, 1438 training images / 64 = 22
steps per epoch, 2 epochs (44 steps), 4 workers on 2 devices."""

STEP_KINDS = (mapping.STEP_IN_KINDS, mapping.STEP_OUT_KINDS)


def mlp_setup(seed=0):
  """(params, loss_fn) of an MLP 5 -> 16 -> 3 with the package's cross-entropy."""
  model = models.MLP(num_classes=3, hidden=(16,))
  params = models.init_params(model, (5,), jax.random.key(seed))

  def loss_fn(p, batch, key):
    x, y = batch
    return models.cross_entropy_loss(model.apply({"params": p}, x), y)

  return params, loss_fn


def random_batches(num_steps, num_workers, batch, seed=1):
  """x float32 [steps, workers, batch, 5], y int32 [steps, workers, batch] in {0, 1, 2}."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num_steps, num_workers, batch, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=(num_steps, num_workers, batch)).astype(np.int32)
  return x, y


def tanh_mlp(num_workers, seed=1):
  """A 3-4-2 tanh network, loss 1/2 mean_b ||out - y||^2, a fixed batch of 5 per worker.

  Returns:
    ``(x0, c0, data, loss, np_grad)``: ``x0`` per-worker parameters (float64 NumPy,
    leading axis ``num_workers``; leaves b1 (4,), b2 (2,), w1 (3, 4), w2 (4, 2)),
    ``c0`` a point of the same shapes without the worker axis, ``data`` per worker
    ``{"x": [p, 5, 3], "y": [p, 5, 2]}``, ``loss(params, batch, key)`` in JAX, and
    ``np_grad(i, leaves)``: worker i's gradient on its batch in float64 NumPy, the
    leaves in sorted-key order (b1, b2, w1, w2), written by hand (backpropagation).
  """
  rng = np.random.default_rng(seed)
  shapes = {"b1": (4,), "b2": (2,), "w1": (3, 4), "w2": (4, 2)}
  data = {"x": rng.normal(size=(num_workers, 5, 3)), "y": rng.normal(size=(num_workers, 5, 2))}
  x0 = {k: 0.5 * rng.normal(size=(num_workers,) + s) for k, s in shapes.items()}
  c0 = {k: 0.5 * rng.normal(size=s) for k, s in shapes.items()}

  def loss(w, batch, key=None):
    del key
    hidden = jnp.tanh(batch["x"] @ w["w1"] + w["b1"])
    return 0.5 * jnp.mean(jnp.sum((hidden @ w["w2"] + w["b2"] - batch["y"]) ** 2, axis=-1))

  def np_grad(i, leaves):
    b1, b2, w1, w2 = leaves
    x, y = data["x"][i], data["y"][i]
    hidden = np.tanh(x @ w1 + b1)
    r = (hidden @ w2 + b2 - y) / x.shape[0]
    dz = (r @ w2.T) * (1 - hidden**2)
    return [dz.sum(0), r.sum(0), x.T @ dz, hidden.T @ r]

  return x0, c0, data, loss, np_grad


def max_abs_diff(a, b) -> float:
  """max |a - b| over all leaves (float64), for trees of the same structure."""
  return max(
      (
          float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)), initial=0.0))
          for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
      ),
      default=0.0,
  )


def assert_trees_close(a, b, atol, rtol=0.0):
  """Every leaf of ``a`` within ``atol + rtol * |b|`` of the matching leaf of ``b``."""
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def interrupt_once(monkeypatch, owner, name, call, after=False):
  """Makes ``owner.name`` raise KeyboardInterrupt at its ``call``-th call (1-based).

  ``after``: the call runs first (an interrupt right after it returns); else
  it never runs (an interrupt right before or during it). Returns a list that
  holds True once the interrupt fired.
  """
  original = getattr(owner, name)
  calls, fired = [0], []

  def wrapper(*args, **kwargs):
    calls[0] += 1
    if calls[0] != call:
      return original(*args, **kwargs)
    fired.append(True)
    if after:
      original(*args, **kwargs)
    raise KeyboardInterrupt

  monkeypatch.setattr(owner, name, wrapper)
  return fired


FEATURES, CLASSES = 8, 3


def linear_data(n, seed):
  """{"x": float32 [n, 8], "y": int32 [n]}: the class is the argmax of a fixed
  linear map of x (a separable 3-class problem)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, FEATURES)).astype(np.float32)
  w = np.random.default_rng(0).normal(size=(FEATURES, CLASSES))
  return {"x": x, "y": np.argmax(x @ w, axis=1).astype(np.int32)}


class Items:
  """A random-access data set (``__len__``, ``__getitem__``), as a user's loader."""

  def __init__(self, arrays):
    self.arrays = arrays

  def __len__(self):
    return len(self.arrays["y"])

  def __getitem__(self, i):
    return {"x": self.arrays["x"][i], "y": self.arrays["y"][i]}


def linear_task(train, test, *, name="linear", correct=True, **fields):
  """Softmax regression on dict batches {"x", "y"}."""

  def init(key):
    return {"w": 0.1 * jax.random.normal(key, (FEATURES, CLASSES)), "b": jnp.zeros(CLASSES)}

  def logits(params, x):
    return x @ params["w"] + params["b"]

  def loss(params, batch, key):
    del key
    ce = optax.softmax_cross_entropy_with_integer_labels(logits(params, batch["x"]), batch["y"])
    return jnp.mean(ce)

  def evaluate(params, batch):
    z = logits(params, batch["x"])
    out = {"loss": optax.softmax_cross_entropy_with_integer_labels(z, batch["y"])}
    if correct:
      out["correct"] = (jnp.argmax(z, axis=-1) == batch["y"]).astype(jnp.float32)
    return out

  return Task(name, init, loss, evaluate, train, test, mean_of_examples=True, **fields)


def regression_task(train_examples=256, test_examples=64, hidden=16):
  """A loss-only task: an MLP 8 -> ``hidden`` -> 1 (tanh) regressing the
  float32 target y = sin(x . w) + 0.1 x_0 of 8 normal features, fixed w.

  ``evaluate`` gives per-example ``"loss"`` (squared error) and
  ``"abs_error"``, no ``"correct"``; the training loss is the mean squared
  error. Data: (x float32 [n, 8], y float32 [n]) arrays, training set of seed
  1, test set of seed 2.
  """

  def data(n, seed):
    x = np.random.default_rng(seed).normal(size=(n, FEATURES)).astype(np.float32)
    w = np.random.default_rng(99).normal(size=(FEATURES,))
    return x, (np.sin(x @ w) + 0.1 * x[:, 0]).astype(np.float32)

  def init(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (FEATURES, hidden)) / np.sqrt(FEATURES),
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden,)) / np.sqrt(hidden),
    }

  def evaluate(params, batch):
    x, y = batch
    err = jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] - y
    return {"loss": err**2, "abs_error": jnp.abs(err)}

  def loss(params, batch, key):
    del key
    return jnp.mean(evaluate(params, batch)["loss"])

  train, test = data(train_examples, 1), data(test_examples, 2)
  return Task("regression", init, loss, evaluate, train, test, mean_of_examples=True)


_DTYPE_BYTES = {
    **{"f32": 4, "s32": 4, "u32": 4, "f16": 2, "bf16": 2, "f64": 8, "s64": 8, "pred": 1},
    **{"s8": 1, "u8": 1, "s16": 2, "u16": 2, "u64": 8},  # compressed payloads (int8, int4)
}
_ALL_REDUCE = re.compile(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+all-reduce(?:-start)?\(")
_GROUPS = re.compile(
    r"replica_groups=(\{(?:\{[\d,]*\},?)*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)"
)


def _replica_groups(text):
  """The device groups of an HLO ``replica_groups=`` value: explicit
  ``{{0,1},{2,3}}`` or the iota form ``[G,S]<=[dims]T(perm)`` (G groups of S:
  iota over dims, transposed by perm, reshaped to [G, S])."""
  if text.startswith("{"):
    return tuple(
        tuple(int(i) for i in g.split(",") if i) for g in re.findall(r"\{([\d,]*)\}", text)
    )
  m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
  shape, dims = [[int(i) for i in g.split(",")] for g in m.group(1, 2)]
  ids = np.arange(int(np.prod(dims))).reshape(dims)
  if m.group(3):
    ids = ids.transpose([int(i) for i in m.group(3).split(",")])
  return tuple(tuple(int(i) for i in row) for row in ids.reshape(shape))


def all_reduce_ops(hlo_text, op="all-reduce"):
  """[(groups, result bytes)] of the all-reduce ops of a compiled program
  (``.compile().as_text()``): ``groups`` the device groups of its
  ``replica_groups`` (sorted tuples of logical device ids; ``()`` when the
  op has none, i.e. all devices), bytes the sum over its result shapes.
  ``op``: another collective's HLO name ("all-gather", "reduce-scatter")."""
  pattern = _ALL_REDUCE
  if op != "all-reduce":
    pattern = re.compile(_ALL_REDUCE.pattern.replace("all-reduce", re.escape(op)))
  ops = []
  for line in hlo_text.splitlines():
    m = pattern.match(line)
    if not m:
      continue
    nbytes = sum(
        _DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
        for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", m.group(1))
    )
    g = _GROUPS.search(line)
    groups = _replica_groups(g.group(1)) if g else ()
    ops.append((tuple(sorted(tuple(sorted(x)) for x in groups)), nbytes))
  return ops


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter")
"""The HLO names of the collectives that carry values between devices."""


def collective_dtypes(hlo_text):
  """{op: [element types of each op]} for the :data:`COLLECTIVES` of a compiled
  program (``.compile().as_text()``), e.g. ``{"all-reduce": [{"f32"}], ...}``:
  the types of each op's results, which are its operands' (these ops convert
  nothing); asynchronous ``-start`` forms included, their ``-done`` halves not."""
  out = {}
  for op in COLLECTIVES:
    pattern = re.compile(_ALL_REDUCE.pattern.replace("all-reduce", re.escape(op)))
    out[op] = [
        set(re.findall(r"\b([a-z]+\d*)\[[\d,]*\]", m.group(1)))
        for m in map(pattern.match, hlo_text.splitlines())
        if m
    ]
  return out


def program_collectives(algo, layout, args):
  """{program name: (all-reduce ops, all-gather ops)} (:func:`all_reduce_ops`) of the
  compiled programs of ``algo`` mapped on ``layout`` (``mapping.map_step``), each
  lowered with ``args`` = (worker, shared, batch, key)."""
  out = {}
  for name, f in mapping.map_step(algo, layout, donate_state=False).programs.items():
    hlo = f.lower(*args).compile().as_text()
    out[name] = (all_reduce_ops(hlo), all_reduce_ops(hlo, "all-gather"))
  return out


def all_reduce_bytes(hlo_text):
  """(count, result bytes) of the all-reduce ops of a compiled program."""
  ops = all_reduce_ops(hlo_text)
  return len(ops), sum(b for _, b in ops)


def wait_all(procs, timeout):
  """The exit statuses of the subprocesses ``procs``, each waited for at most ``timeout``
  seconds; any still running after that is killed (and reaped) before this returns."""
  try:
    return [p.wait(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def quadratic_task(curvature: float = 1.0, num_classes: int | None = None):
  """A deterministic quadratic "classifier" (the batch is not read): loss
  0.5 H (w - 1)^2 from w = 0, so pmean SGD is gradient descent and after T steps
  at rate lr, w_T = 1 - (1 - lr H)^T; "correct" is exp(-(w - 1)^2) per example.
  ``num_classes`` is recorded in ``info`` (chance error 1 - 1/K) when given."""

  def loss(params, batch, key):
    return 0.5 * curvature * jnp.sum((params["w"] - 1.0) ** 2)

  def evaluate(params, batch):
    b = batch.shape[0]
    d2 = jnp.sum((params["w"] - 1.0) ** 2)
    return {"loss": jnp.full((b,), 0.5 * curvature * d2), "correct": jnp.full((b,), jnp.exp(-d2))}

  rows = np.zeros((80, 1), np.float32)
  return Task(
      name="quadratic",
      init=lambda key: {"w": jnp.zeros(1)},
      loss=loss,
      evaluate=evaluate,
      train=rows,
      test=rows[:20],
      mean_of_examples=True,
      info={} if num_classes is None else dict(num_classes=num_classes),
  )
