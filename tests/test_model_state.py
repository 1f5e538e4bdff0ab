"""A user's own Flax model with BatchNorm, trained through the library API.

The loss takes and returns the model's state (its ``batch_stats``): every
algorithm carries it per worker (the one-model methods: one state, the mean of
the workers' updated states), updated by each worker's own mini-batch.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd.asynchrony import simulation
from easgd.core import algorithms
from easgd.methods import baselines
from easgd.methods.downpour_family import downpour
from easgd.parallel import mapping, placement, worker_layout
from easgd.sweeps.engine import CompileCounter

from testutil import max_abs_diff


class TinyBN(nn.Module):
  """Dense -> BatchNorm (running averages, momentum 0.9) -> ReLU -> Dense."""

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Dense(8)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    return nn.Dense(3)(nn.relu(x))


MODEL = TinyBN()


def loss_fn(params, batch, key, model_state):
  x, y = batch
  logits, updates = MODEL.apply(
      {"params": params, **model_state}, x, train=True, mutable=["batch_stats"]
  )
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates


def setup(num_workers=4, steps=3, batch=6):
  variables = MODEL.init(jax.random.key(0), jnp.zeros((1, 5)), train=False)
  params, state = variables["params"], {"batch_stats": variables["batch_stats"]}
  rng = np.random.default_rng(0)
  xs = rng.normal(size=(steps, num_workers, batch, 5)).astype(np.float32)
  xs += np.arange(num_workers, dtype=np.float32)[None, :, None, None]  # unlike batches
  ys = rng.integers(0, 3, size=(steps, num_workers, batch)).astype(np.int32)
  return params, state, xs, ys


def run(algo, params, state, xs, ys, num_devices=2):
  layout = worker_layout.make_layout(xs.shape[1], num_devices)
  worker, shared = algo.init(params, state)
  worker = placement.replicate_per_worker(worker, layout)
  shared = placement.replicate_per_device(shared, layout)
  step = mapping.map_step(algo, layout, donate_state=False)
  compiles = []
  for t, (x, y) in enumerate(zip(xs, ys)):
    with CompileCounter() as counter:  # steps 0 and 1 compile the two programs
      worker, shared, loss = step(
          worker, shared, placement.split_workers((x, y), layout), jax.random.key(1), t
      )
    compiles.append(counter.count)
  assert np.isfinite(placement.to_host(loss)).all()
  return worker, shared, compiles


def own_stats(params, state, x):
  """The batch statistics one train-mode pass over ``x`` leaves (running averages)."""
  _, updates = MODEL.apply({"params": params, **state}, x, train=True, mutable=["batch_stats"])
  return updates


def test_easgd_carries_each_workers_own_batch_statistics():
  params, state, xs, ys = setup(steps=1)
  algo = algorithms.easgd(loss_fn, optax.sgd(0.1), num_workers=4, tau=2, beta=0.9)
  worker, _, _ = run(algo, params, state, xs, ys)
  got = placement.merge_workers(worker.model_state)
  for i in range(4):  # after one step: the statistics of worker i's own batch
    want = own_stats(params, state, xs[0, i])
    assert max_abs_diff(jax.tree.map(lambda a: a[i], got), want) <= 1e-6
  means = got["batch_stats"]["BatchNorm_0"]["mean"]
  assert np.abs(means[0] - means[3]).max() > 0.1  # the workers' batches differ


@pytest.mark.parametrize(
    "factory",
    [
        lambda: algorithms.eamsgd(
            loss_fn, optax.sgd(0.05), num_workers=4, tau=2, beta=0.9, momentum=0.9
        ),
        lambda: baselines.local_sgd(loss_fn, optax.sgd(0.1), num_workers=4, tau=2),
        lambda: simulation.async_easgd(loss_fn, optax.sgd(0.1), num_workers=4, tau=2, beta=0.9),
        lambda: downpour(loss_fn, optax.sgd(0.1), num_workers=4, tau=2),
    ],
    ids=["eamsgd", "local_sgd", "async_easgd", "downpour"],
)
def test_every_family_updates_the_state_and_keeps_its_structure(factory):
  params, state, xs, ys = setup(steps=3)
  worker, shared, compiles = run(factory(), params, state, xs, ys)
  got = placement.merge_workers(worker.model_state)
  initial = jax.tree.map(lambda a: np.broadcast_to(a, (4, *a.shape)), state)
  assert jax.tree.structure(got) == jax.tree.structure(initial)
  assert max_abs_diff(got, initial) > 1e-3  # moved from the initial statistics
  assert compiles[2:] == [0]  # the state's structure and dtypes are stable


def test_one_model_methods_share_the_mean_of_the_workers_states():
  params, state, xs, ys = setup(steps=1)
  algo = algorithms.pmean_sgd(loss_fn, optax.sgd(0.1), num_workers=4)
  for num_devices in (1, 2):  # merged or not, each worker's own batch statistics
    _, shared, _ = run(algo, params, state, xs, ys, num_devices=num_devices)
    got = placement.first_copy(shared.model_state)
    want = jax.tree.map(
        lambda *a: np.mean(a, axis=0), *[own_stats(params, state, xs[0, i]) for i in range(4)]
    )
    assert max_abs_diff(got, want) <= 1e-6, num_devices
