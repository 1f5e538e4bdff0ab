"""The worker mapping: pmap x vmap layouts agree, pmean SGD equals a big batch."""

import jax
import numpy as np
import optax
import pytest

from easgd.core import algorithms
from easgd.core.base import worker_key
from easgd.parallel import mapping, placement, worker_layout

from testutil import STEP_KINDS, mlp_setup, random_batches


def run(algo, params, layout, xs, ys):
  worker, shared = placement.place_state(algo, params, layout)
  step = mapping.map_workers(algo.step, layout, *STEP_KINDS)
  key = jax.random.key(3)
  for x, y in zip(xs, ys):
    worker, shared, _ = step(worker, shared, placement.split_workers((x, y), layout), key)
  return worker, shared


def test_fake_devices_took_effect():
  assert len(jax.devices()) >= 8


@pytest.mark.parametrize("num_devices", [4, 1])
def test_pmean_sgd_with_4_workers_equals_one_device_with_4x_batch(num_devices):
  params, loss_fn = mlp_setup()
  B = 8
  xs, ys = random_batches(10, 4, B)
  algo = algorithms.pmean_sgd(loss_fn, optax.sgd(0.5))
  _, shared4 = run(algo, params, worker_layout.make_layout(4, num_devices), xs, ys)
  # one worker whose batch is the 4 workers' batches concatenated (4B examples)
  big_x = xs.reshape(10, 1, 4 * B, 5)
  big_y = ys.reshape(10, 1, 4 * B)
  _, shared1 = run(algo, params, worker_layout.make_layout(1, 1), big_x, big_y)
  p4 = placement.first_copy(shared4.params)
  p1 = placement.first_copy(shared1.params)
  diffs = [np.max(np.abs(a - b)) for a, b in zip(jax.tree.leaves(p4), jax.tree.leaves(p1))]
  assert max(diffs) < 1e-5
  # and the 10 steps really moved the parameters (the comparison is not vacuous)
  moved = [
      np.max(np.abs(a - np.asarray(b)))
      for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(params))
  ]
  assert max(moved) > 1e-2
  assert placement.shared_copies_equal(shared4)


def test_eight_workers_same_center_on_8x1_2x4_1x8():
  params, loss_fn = mlp_setup()
  xs, ys = random_batches(20, 8, 4)
  algo = algorithms.easgd(loss_fn, optax.sgd(0.3), num_workers=8, tau=3, beta=0.9)
  centers, worker_params = [], []
  for d in (8, 2, 1):
    layout = worker_layout.make_layout(8, d)
    assert (layout.num_devices, layout.workers_per_device) == (d, 8 // d)
    worker, shared = run(algo, params, layout, xs, ys)
    assert placement.shared_copies_equal(shared)
    centers.append(placement.first_copy(shared.center))
    worker_params.append(placement.merge_workers(worker.params))
  for c, w in zip(centers[1:], worker_params[1:]):
    for a, b in zip(jax.tree.leaves(c), jax.tree.leaves(centers[0])):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(worker_params[0])):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  # workers explored: they differ from each other and from the center
  leaf = jax.tree.leaves(worker_params[0])[0]
  assert np.max(np.abs(leaf[0] - leaf[1])) > 1e-4


def test_workers_and_center_start_bitwise_equal_and_keys_differ():
  params, _ = mlp_setup()
  layout = worker_layout.make_layout(8, 2)
  stacked = placement.merge_workers(placement.replicate_per_worker(params, layout))
  for leaf, ref in zip(jax.tree.leaves(stacked), jax.tree.leaves(params)):
    for i in range(8):
      assert leaf[i].tobytes() == np.asarray(ref).tobytes()
  center = placement.replicate_per_device(params, layout)
  assert placement.shared_copies_equal(center)

  def draw(dummy, key):
    return (jax.random.normal(worker_key(key, 5), ()), mapping.worker_index())

  f = mapping.map_workers(draw, layout, ("worker", "broadcast"), ("worker", "worker"))
  noise, index = f(placement.split_workers(np.zeros(8), layout), jax.random.key(0))
  noise, index = placement.merge_workers(noise), placement.merge_workers(index)
  np.testing.assert_array_equal(index, np.arange(8))
  assert len(set(noise.tolist())) == 8
  # the key of worker i is fold_in(fold_in(key, step), i), whatever the layout
  expect = [
      float(jax.random.normal(jax.random.fold_in(jax.random.fold_in(jax.random.key(0), 5), i), ()))
      for i in range(8)
  ]
  np.testing.assert_array_equal(noise, np.array(expect, np.float32))


def test_layout_errors_name_the_values():
  with pytest.raises(worker_layout.LayoutError, match="num_workers=6 is not a multiple"):
    worker_layout.make_layout(6, 4)
  with pytest.raises(worker_layout.LayoutError, match="num_devices=64"):
    worker_layout.make_layout(64, 64)
  with pytest.raises(worker_layout.LayoutError, match="num_workers must be"):
    worker_layout.make_layout(0)
  # default: the largest available count that divides num_workers
  assert worker_layout.make_layout(6).num_devices == 6
  assert worker_layout.make_layout(12).num_devices == 6
  assert worker_layout.make_layout(7).num_devices == 7
