"""The two worker-mapping backends: pmap(vmap) and jit(shard_map(vmap)) agree.

Same per-worker code, same [d, w, ...] / [d, ...] layouts, same values after N
steps for every layout of 4 workers (4x1, 2x2, 1x4), the same training run
through the trainer, and the multi-process device selection of make_layout.
In JAX 0.10.2 the two compile to the same program: the tests assert bitwise
equality (measured: 0 difference for every layout and algorithm).
"""

import collections

import jax
import numpy as np
import optax
import pytest

from easgd.core import algorithms, elastic
from easgd.core.base import worker_key
from easgd.parallel import mapping, names, placement, worker_layout
from easgd.run import checkpoint, rundir, trainer
from easgd.settings.config import ConfigError, TrainConfig

from testutil import STEP_KINDS, mlp_setup, random_batches


def run_steps(algo, params, layout, xs, ys, donate=True):
  worker, shared = placement.place_state(algo, params, layout)
  step = mapping.map_workers(
      algo.step, layout, *STEP_KINDS, donate_argnums=(0, 1) if donate else ()
  )
  key = jax.random.key(3)
  losses = []
  for x, y in zip(xs, ys):
    worker, shared, loss = step(worker, shared, placement.split_workers((x, y), layout), key)
    losses.append(placement.merge_workers(loss))
  return worker, shared, np.stack(losses), step


def assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("algorithm", ["easgd", "pmean_sgd"])
@pytest.mark.parametrize("num_devices", [4, 2, 1])  # layouts 4x1, 2x2, 1x4
def test_pmap_and_shard_map_give_the_same_workers_and_center(algorithm, num_devices):
  params, loss_fn = mlp_setup()
  xs, ys = random_batches(7, 4, 4)  # 7 steps: exchanges at t = 0, 3, 6 (tau = 3)
  if algorithm == "easgd":
    algo = algorithms.easgd(loss_fn, optax.sgd(0.3), num_workers=4, tau=3, beta=0.9)
  else:
    algo = algorithms.pmean_sgd(loss_fn, optax.sgd(0.3))
  out = {}
  for backend in names.BACKENDS:
    layout = worker_layout.make_layout(4, num_devices, backend=backend)
    assert (layout.num_devices, layout.workers_per_device) == (num_devices, 4 // num_devices)
    worker, shared, losses, _ = run_steps(algo, params, layout, xs, ys)
    # same layouts: [d, w, ...] worker values, [d, ...] shared values
    for leaf in jax.tree.leaves(worker):
      assert leaf.shape[:2] == (num_devices, 4 // num_devices)
    for leaf in jax.tree.leaves(shared):
      assert leaf.shape[0] == num_devices
    assert placement.shared_copies_equal(shared)
    out[backend] = (
        placement.merge_workers(algo.worker_params(worker, shared)),
        placement.first_copy(algo.center(shared)),
        losses,
    )
  assert_trees_equal(out["shard_map"], out["pmap"])
  # the steps moved the center (the comparison is not vacuous)
  moved = max(
      float(np.max(np.abs(c - np.asarray(p))))
      for c, p in zip(jax.tree.leaves(out["pmap"][1]), jax.tree.leaves(params))
  )
  assert moved > 1e-3


def test_shard_map_step_donates_and_compiles_once():
  params, loss_fn = mlp_setup()
  xs, ys = random_batches(3, 4, 4)
  algo = algorithms.easgd(loss_fn, optax.sgd(0.3), num_workers=4, tau=2, beta=0.9)
  layout = worker_layout.make_layout(4, 2, backend="shard_map")
  worker, shared = placement.place_state(algo, params, layout)
  step = mapping.map_workers(algo.step, layout, *STEP_KINDS, donate_argnums=(0, 1))
  key = jax.random.key(0)
  for x, y in zip(xs, ys):
    old = jax.tree.leaves((worker, shared))
    worker, shared, _ = step(worker, shared, placement.split_workers((x, y), layout), key)
    assert all(leaf.is_deleted() for leaf in old)  # buffers donated
  assert step._cache_size() == 1  # exchange and local steps: one program (lax.cond)
  sharding = jax.tree.leaves(worker)[0].sharding
  assert isinstance(sharding, jax.sharding.NamedSharding)
  assert sharding.spec == jax.sharding.PartitionSpec(elastic.DEVICE_AXIS)


def test_worker_index_and_keys_agree_across_backends():
  layout_p = worker_layout.make_layout(8, 2, backend="pmap")
  layout_s = worker_layout.make_layout(8, 2, backend="shard_map")

  def draw(dummy, key):
    return (
        jax.random.normal(worker_key(key, 5), ()),
        mapping.worker_index(),
        mapping.num_mapped_workers(),
    )

  res = []
  for layout in (layout_p, layout_s):
    f = mapping.map_workers(draw, layout, ("worker", "broadcast"), ("worker",) * 3)
    res.append(
        placement.merge_workers(f(placement.split_workers(np.zeros(8), layout), jax.random.key(0)))
    )
  np.testing.assert_array_equal(res[1][1], np.arange(8))
  np.testing.assert_array_equal(res[1][2], np.full(8, 8))
  for a, b in zip(res[0], res[1]):
    np.testing.assert_array_equal(a, b)


def test_trainer_runs_are_equal_under_both_backends(tmp_path):
  cfg = TrainConfig(
      dataset="digits",
      model="mlp",
      num_workers=4,
      num_devices=2,
      global_batch_size=64,
      num_epochs=1,
      learning_rate=0.1,
      tau=3,
      beta=0.9,
      eval_batch_size=64,
      progress=False,
  )
  runs = {}
  for backend in names.BACKENDS:
    s = trainer.train_and_evaluate(cfg.replace(mapping_backend=backend), tmp_path / backend)
    assert backend in s["layout"] and s["shared_copies_equal"]
    ck = checkpoint.Checkpointer(tmp_path / backend)
    runs[backend] = (s["history"], ck.restore())
    ck.close()
  (hist_p, ck_p), (hist_s, ck_s) = runs["pmap"], runs["shard_map"]
  for rp, rs in zip(hist_p, hist_s, strict=True):
    assert rp["test_count"] == rs["test_count"]
    assert rp["test_accuracy"] == pytest.approx(rs["test_accuracy"], abs=1 / rp["test_count"])
    assert rp["test_loss"] == pytest.approx(rs["test_loss"], rel=1e-5)
  assert_trees_equal(ck_s["center"], ck_p["center"])
  assert_trees_equal(ck_s["worker"], ck_p["worker"])


def test_backend_is_validated():
  with pytest.raises(worker_layout.LayoutError, match="unknown mapping backend 'xmap'"):
    worker_layout.make_layout(4, 2, backend="xmap")
  with pytest.raises(ConfigError, match="mapping_backend"):
    TrainConfig(mapping_backend="xmap").validate()
  assert "mapping_backend" in rundir.RESUMABLE_CHANGES  # where it runs, not what


FakeDevice = collections.namedtuple("FakeDevice", "id process_index platform")


def test_multiprocess_layout_takes_the_same_devices_from_every_process():
  # 2 processes x 3 devices, listed out of order
  devs = [FakeDevice(i, i // 3, "cpu") for i in (5, 0, 3, 1, 4, 2)]
  layout = worker_layout.make_layout(4, backend="shard_map", devices=devs)
  assert [(d.process_index, d.id) for d in layout.devices] == [(0, 0), (0, 1), (1, 3), (1, 4)]
  assert layout.num_processes == 2 and "2 processes" in layout.describe()
  layout = worker_layout.make_layout(6, 2, backend="shard_map", devices=devs)
  assert [d.id for d in layout.devices] == [0, 3] and layout.workers_per_device == 3
  with pytest.raises(worker_layout.LayoutError, match="need the 'shard_map' mapping backend"):
    worker_layout.make_layout(4, backend="pmap", devices=devs)
  with pytest.raises(worker_layout.LayoutError, match="multiple of the 2 processes"):
    worker_layout.make_layout(3, 3, backend="shard_map", devices=devs)
  with pytest.raises(worker_layout.LayoutError, match="cannot be spread over 2"):
    worker_layout.make_layout(3, backend="shard_map", devices=devs)
