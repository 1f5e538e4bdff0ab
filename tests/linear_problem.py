"""The small problem shared by the reference tests of test_async and test_baselines.

Worker i fits y = X w + b (w: 3 numbers, b: 1) on its own data with its own
targets; the NumPy reference implementations in the tests use ``np_grad``.
"""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from easgd.parallel import mapping, placement, worker_layout

from testutil import STEP_KINDS

THETA0 = np.array([0.5, -0.25, 1.0, 0.125])  # w (3) and b, flattened


def loss_fn(params, batch, key):
  del key
  x, y = batch
  return 0.5 * jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def params0():
  return {"w": jnp.asarray(THETA0[:3], jnp.float32), "b": jnp.float32(THETA0[3])}


def flat(params):
  """Parameters as one array [..., 4]: w then b."""
  return np.concatenate([np.asarray(params["w"]), np.asarray(params["b"])[..., None]], axis=-1)


def make_data(num_steps, num_workers, n=4, seed=1):
  """Batches x [steps, workers, n, 3], y [steps, workers, n]; distinct targets per worker."""
  rng = np.random.default_rng(seed)
  targets = rng.normal(size=(num_workers, 4)) * 2
  xs = rng.normal(size=(num_steps, num_workers, n, 3))
  ys = np.einsum("tpnd,pd->tpn", xs, targets[:, :3]) + targets[None, :, 3:4]
  ys = ys + 0.1 * rng.normal(size=ys.shape)
  return xs.astype(np.float32), ys.astype(np.float32)


def np_grad(theta, x, y):
  """Gradient of the loss at flat parameters theta, in float64."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  r = x @ theta[:3] + theta[3] - y
  return np.concatenate([x.T @ r / len(y), [r.mean()]])


def trajectory(algo, xs, ys, num_devices, key, init=None):
  """Steps ``algo`` through the batches, ``xs.shape[1]`` workers on ``num_devices``.

  Returns:
    (worker params per step [T, p, 4], centers per step [T, 4], worker state,
    shared state). A sequential method's one shared model counts as p equal
    workers. Checks that the shared state's device copies stayed equal.
  """
  num_workers = xs.shape[1]
  layout = worker_layout.make_layout(num_workers, num_devices)
  worker, shared = placement.place_state(algo, init if init is not None else params0(), layout)
  step = mapping.map_workers(algo.step, layout, *STEP_KINDS)
  wt, ct = [], []
  for x, y in zip(xs, ys):
    worker, shared, _ = step(worker, shared, placement.split_workers((x, y), layout), key)
    wp = algo.worker_params(worker, shared)
    if np.ndim(wp["b"]) == 1:  # shared [d]: the one model of a sequential method
      wt.append(flat(jax.tree.map(lambda a: np.stack([a[0]] * num_workers), wp)))
    else:
      wt.append(flat(placement.merge_workers(wp)))
    ct.append(flat(placement.first_copy(algo.center(shared))))
  assert placement.shared_copies_equal(shared)
  return np.stack(wt), np.stack(ct), worker, shared


def local_steps_in_time_order(speeds, orders, num_slots, at):
  """Every local step of the first ``num_slots`` slots, in the order the master meets them.

  Written from the paper's loop, not from the package: worker i (speed k_i)
  runs its m-th local step of tick n from time n + m / k_i to n + (m + 1) / k_i
  (in ticks). Its exchange point is the step's start (``at="start"``: EASGD,
  Algorithm 1, exchange before the gradient) or its end (``at="end"``:
  DOWNPOUR, push after the gradient). Points are met in time order; points
  at the same time in the order of their tick (``orders[n]``, a list of
  workers). With K = max k_i, slot j of the run covers times j / K to
  (j + 1) / K; the step belongs to (and takes its worker's mini-batch from)
  the slot that holds its point, a slot's end counting as part of that slot.

  Returns:
    A list of (slot, worker), one per local step, in the order met.
  """
  big_k = max(speeds)
  events = []
  for n in range(-(-num_slots // big_k)):
    for i, k in enumerate(speeds):
      for m in range(k):
        if at == "start":
          point = n + Fraction(m, k)
          slot = math.floor(point * big_k)
        else:
          point = n + Fraction(m + 1, k)
          slot = math.ceil(point * big_k) - 1
        if slot < num_slots:
          events.append((point, orders[n].index(i), slot, i))
  return [(slot, i) for _, _, slot, i in sorted(events)]
