"""The BatchNorm policy ("cnn_bn"): the center is evaluated with its own statistics.

Training normalises with each mini-batch's statistics and keeps no running
averages; before each evaluation (and at export) the trainer recomputes the
center's statistics over fixed training examples (``bn_stats_examples``).
"""

import json

import jax
import numpy as np
import pytest
from flax import serialization
from numpy.lib.stride_tricks import sliding_window_view

from easgd.parallel import placement
from easgd.run import checkpoint, trainer
from easgd.run.export import export_center
from easgd.runtimes import training_run
from easgd.settings import builtin_tasks
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import batches, datasets, models

# digits (1438 training images, 8x8x1): 64 per step = 22 steps per epoch;
# the statistics over 512 training images, 128 per worker.
BN = TrainConfig(
    dataset="digits",
    model="cnn_bn",
    num_workers=4,
    num_devices=2,
    global_batch_size=64,
    num_epochs=1,
    learning_rate=0.1,
    tau=4,
    beta=0.9,
    eval_batch_size=64,
    bn_stats_examples=512,
    progress=False,
)


def reference_batch_stats(params, x, eps=1e-5):
  """Per-channel mean and biased variance of each BatchNorm layer's input, float64.

  The CNN written out in NumPy: conv 3x3 SAME -> statistics of its output h over
  all examples and positions -> normalise with them, scale, bias -> ReLU ->
  max-pool 2 -> next block. So layer 2's statistics are those of its input
  when layer 1 uses layer 1's statistics (as at evaluation).
  """
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  stats = {}
  for i in range(2):
    k, b = p[f"Conv_{i}"]["kernel"], p[f"Conv_{i}"]["bias"]
    win = sliding_window_view(
        np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))), (3, 3), axis=(1, 2)
    )  # [N, H, W, C, 3, 3]
    h = np.einsum("nhwcij,ijcf->nhwf", win, k) + b
    mean = h.mean(axis=(0, 1, 2))
    var = ((h - mean) ** 2).mean(axis=(0, 1, 2))
    stats[f"BatchNorm_{i}"] = dict(mean=mean, var=var)
    bn = p[f"BatchNorm_{i}"]
    a = np.maximum((h - mean) / np.sqrt(var + eps) * bn["scale"] + bn["bias"], 0.0)
    n, hh, ww, c = a.shape
    x = a.reshape(n, hh // 2, 2, ww // 2, 2, c).max(axis=(2, 4))
  return stats


def max_rel_diff(a, b):
  return max(
      float(np.max(np.abs(np.asarray(x, np.float64) - y) / (np.abs(y) + 1e-3)))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def test_center_statistics_belong_to_the_center_not_to_a_worker():
  run = training_run.Run(BN)
  ds = datasets.load_dataset(BN.dataset, seed=BN.seed)  # the run's task's data
  model = models.make_model(BN.model, ds.num_classes)
  worker, shared = run.initial_state()
  # 6 steps: exchanges at steps 0 and 4, so workers and center have moved apart
  for t, ix in enumerate(batches.worker_batch_indices(len(ds.train_y), 4, 16, BN.seed, 1)[:6]):
    batch = placement.split_workers((ds.train_x[ix], ds.train_y[ix]), run.layout)
    worker, shared, _ = run.step_fn(worker, shared, batch, run.step_key, t)
  shared_host = placement.first_copy(shared)
  center = run.algorithm.center(shared_host)
  worker0 = run.algorithm.worker_params(
      jax.tree.map(lambda a: a[0], placement.merge_workers(worker)), shared_host
  )

  stats = run.center_batch_stats(center)  # what the evaluation uses
  assert set(stats) == {"BatchNorm_0", "BatchNorm_1"}
  # the same examples, chosen independently: the first 4 * 128 of the seeded
  # permutation of "epoch 0" (never a training epoch)
  x = ds.train_x[batches.epoch_permutation(len(ds.train_y), BN.seed, 0)[:512]]
  np.testing.assert_array_equal(
      np.asarray(placement.merge_workers(run.bn_stats_data)[0]).reshape(x.shape), x
  )

  # (1) they are the exact statistics of the center's pre-BN activations
  ref_center = reference_batch_stats(center, x)
  for layer in ref_center:
    for name in ("mean", "var"):
      np.testing.assert_allclose(
          stats[layer][name],
          ref_center[layer][name],
          rtol=2e-5,
          atol=2e-6,
          err_msg=f"{layer}/{name}",
      )
  # (2) ... and not those of a worker's parameters (which is not close)
  ref_worker = reference_batch_stats(worker0, x)
  assert max_rel_diff(stats, ref_worker) > 1e-2
  assert max_rel_diff(stats, ref_center) < 1e-4

  # the evaluation uses exactly these statistics: its test loss is the direct one
  rec = run.evaluate(worker, shared, 0, 6, None)
  test_x, test_y = ds.test_x, ds.test_y

  def direct_loss(batch_stats):
    logits = model.apply({"params": center, "batch_stats": batch_stats}, test_x, train=False)
    return float(np.mean(models.per_example_stats(logits, test_y)[0]))

  worker_stats = jax.tree.map(lambda a: np.asarray(a, np.float32), ref_worker)
  assert rec["test_loss"] == pytest.approx(direct_loss(stats), rel=1e-5)
  assert rec["test_loss"] != pytest.approx(direct_loss(worker_stats), rel=1e-3)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("bn_full")
  return workdir, trainer.train_and_evaluate(BN, workdir)


def test_trains_and_exported_center_reproduces_the_reported_accuracy(full_run, tmp_path):
  workdir, summary = full_run
  acc = summary["final"]["test_accuracy"]
  assert acc > 0.5  # 10 classes: chance is 0.1
  out = export_center(workdir, tmp_path / "center.msgpack")
  info = json.loads((tmp_path / "center.msgpack.json").read_text())
  assert info["batch_stats"] == "center.msgpack.batch_stats.msgpack"
  assert info["bn_stats_examples"] == 512
  params = serialization.msgpack_restore(out.read_bytes())
  stats = serialization.msgpack_restore((tmp_path / info["batch_stats"]).read_bytes())
  ds = datasets.load_dataset("digits")
  model = models.make_model("cnn_bn", info["num_classes"])
  logits = model.apply({"params": params, "batch_stats": stats}, ds.test_x, train=False)
  correct = int(np.sum(np.argmax(logits, -1) == ds.test_y))
  assert acc == correct / len(ds.test_y)
  # the statistics are not the initial template (mean 0, var 1): they were computed
  assert not np.allclose(stats["BatchNorm_0"]["var"], 1.0)


def test_interrupted_and_resumed_run_is_bitwise_identical(full_run, tmp_path):
  workdir, _ = full_run
  # 7 steps: inside the epoch and not a multiple of tau = 4
  partial = trainer.train_and_evaluate(BN, tmp_path, stop_after_steps=7)
  assert partial["status"] == "stopped"
  assert checkpoint.Checkpointer(tmp_path).latest_step() == 7
  done = trainer.train_and_evaluate(BN, tmp_path, resume=True)
  assert done["status"] == "complete"
  assert (tmp_path / "metrics.jsonl").read_text() == (workdir / "metrics.jsonl").read_text()


def test_training_state_holds_no_batch_statistics_and_config_is_checked():
  model = models.make_model("cnn_bn", 10)
  variables = models.init_variables(model, (8, 8, 1), jax.random.key(0))
  assert set(variables) == {"params", "batch_stats"}
  params = models.init_params(model, (8, 8, 1), jax.random.key(0))
  assert jax.tree.structure(params) == jax.tree.structure(variables["params"])
  assert models.has_batch_norm(model) and not models.has_batch_norm(models.make_model("cnn", 10))
  x = np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype(np.float32)
  loss = builtin_tasks.make_loss_fn(model)(params, (x, np.arange(8)), jax.random.key(1))
  assert np.isfinite(float(loss))
  with pytest.raises(models.ModelError, match="no BatchNorm"):
    models.compute_batch_stats(models.make_model("cnn", 10), params, x)
  with pytest.raises(ConfigError, match="bn_stats_examples"):
    BN.replace(bn_stats_examples=0).validate()
  # fewer examples than workers: still one per worker
  assert training_run.bn_stats_indices(100, 4, 1, 0).shape == (4, 1)
  assert training_run.bn_stats_indices(100, 4, 10_000, 0).shape == (4, 25)


def test_a_batchnorm_model_normalises_each_workers_batch_on_every_layout(tmp_path):
  """pmean SGD runs a device's workers as one batch for ordinary models; with
  BatchNorm that would normalise over the device's examples instead of each
  worker's, so the trainer keeps one pass per worker: 4 workers on 1 device and
  on 4 devices give the same model (float32 summation order only)."""
  cfg = BN.for_algorithm("pmean_sgd")[0].replace(bn_stats_examples=512)
  centers = {}
  for d in (1, 4):
    trainer.train_and_evaluate(cfg.replace(num_devices=d), tmp_path / f"d{d}", stop_after_steps=10)
    ckpt = checkpoint.Checkpointer(tmp_path / f"d{d}")
    try:
      centers[d] = ckpt.restore(10)["center"]
    finally:
      ckpt.close()
  gap = max(
      float(np.max(np.abs(a - b)))
      for a, b in zip(jax.tree.leaves(centers[1]), jax.tree.leaves(centers[4]))
  )
  assert gap <= 1e-5, gap
