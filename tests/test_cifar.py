"""CIFAR-10: the pickle-batch loader, the 28x28 crops, the paper's CifarNet, a tiny run.

The fixture is written in the CIFAR-10 python format by hand: five training
batches of 4 images and a test batch of 3, each a pickled dict with b"data"
(uint8 [N, 3072], the R plane, then G, then B, rows in order) and b"labels".
"""

import json
import os
import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd import cli
from easgd.run import checkpoint, trainer
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import batches, data, datasets, loaders, models

TRAIN_PER_BATCH, NUM_TEST = 4, 3


def fixture_images(seed: int, n: int) -> tuple[np.ndarray, list[int]]:
  """uint8 [n, 32, 32, 3] NHWC images and their labels."""
  rng = np.random.default_rng(seed)
  return (
      rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8),
      [int(v) for v in rng.integers(0, 10, size=n)],
  )


def to_rows(images: np.ndarray) -> np.ndarray:
  """NHWC uint8 -> the file's [N, 3072] rows: R plane, G plane, B plane."""
  return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), 3072))


def write_batch(path, images, labels):
  with open(path, "wb") as f:
    pickle.dump({b"batch_label": b"fixture", b"data": to_rows(images), b"labels": list(labels)}, f)


def write_cifar(root, nested=False):
  """Writes the fixture; returns (train_images, train_labels, test_images, test_labels)."""
  folder = root / loaders.CIFAR10_SUBDIR if nested else root
  folder.mkdir(parents=True, exist_ok=True)
  train_x, train_y = [], []
  for i, name in enumerate(loaders.CIFAR10_TRAIN_FILES):
    x, y = fixture_images(i, TRAIN_PER_BATCH)
    if i == 0:  # image 0: constant planes R=200, G=100, B=10; image 1: R = a ramp
      x[0, ..., 0], x[0, ..., 1], x[0, ..., 2] = 200, 100, 10
      x[1, ..., 0] = (np.arange(1024) % 256).reshape(32, 32)
      y[0] = 9
    write_batch(folder / name, x, y)
    train_x.append(x)
    train_y += y
  test_x, test_y = fixture_images(99, NUM_TEST)
  write_batch(folder / loaders.CIFAR10_TEST_FILE, test_x, test_y)
  return np.concatenate(train_x), np.array(train_y), test_x, np.array(test_y)


def standardise(x, train):
  """Per-channel (x/255 - mean) / std with train statistics, in float64."""
  t = train.astype(np.float64) / 255
  return (x.astype(np.float64) / 255 - t.mean(axis=(0, 1, 2))) / t.std(axis=(0, 1, 2))


# --------------------------------------------------------------------------
# Loader.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "cifar-10-batches-py"])
def test_load_shapes_dtypes_labels_and_standardisation(tmp_path, nested):
  train_u8, train_y, test_u8, test_y = write_cifar(tmp_path, nested)
  ds = datasets.load_dataset("cifar10", data_dir=tmp_path)
  assert ds.name == "cifar10" and ds.num_classes == 10
  assert ds.train_x.shape == (20, 32, 32, 3) and ds.test_x.shape == (NUM_TEST, 32, 32, 3)
  assert ds.train_x.dtype == ds.test_x.dtype == np.float32
  assert ds.train_y.dtype == ds.test_y.dtype == np.int32
  np.testing.assert_array_equal(ds.train_y, train_y)  # batches 1..5 in order
  np.testing.assert_array_equal(ds.test_y, test_y)
  assert ds.train_y[0] == 9
  np.testing.assert_allclose(ds.train_x, standardise(train_u8, train_u8), atol=1e-5)
  np.testing.assert_allclose(ds.test_x, standardise(test_u8, train_u8), atol=1e-5)
  # per channel: train mean 0, std 1 (the test split keeps the train statistics)
  np.testing.assert_allclose(ds.train_x.mean(axis=(0, 1, 2)), 0, atol=1e-5)
  np.testing.assert_allclose(ds.train_x.std(axis=(0, 1, 2)), 1, atol=1e-5)


def test_channel_order_is_nhwc_rgb(tmp_path):
  write_cifar(tmp_path)
  images, labels = loaders.read_cifar10_batch(tmp_path / "data_batch_1")
  assert images.shape == (TRAIN_PER_BATCH, 32, 32, 3) and images.dtype == np.uint8
  assert labels.dtype == np.int32 and labels[0] == 9
  # image 0: the file's first plane is red, the last blue
  assert (images[0, ..., 0] == 200).all() and (images[0, ..., 1] == 100).all()
  assert (images[0, ..., 2] == 10).all()
  # image 1: the red plane is row-major, pixel (r, c) = (32 r + c) mod 256
  r, c = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
  np.testing.assert_array_equal(images[1, ..., 0], (32 * r + c) % 256)
  # after standardisation image 0 is still constant per channel, red ordered first
  x0 = loaders.load_cifar10(tmp_path).train_x[0]
  assert all(np.ptp(x0[..., ch]) == 0 for ch in range(3))


def test_missing_directory_and_none(tmp_path):
  missing = tmp_path / "nowhere"
  with pytest.raises(
      data.DataError, match=f"'{re.escape(str(missing))}' does not exist.*data_batch_1"
  ):
    loaders.load_cifar10(missing)
  with pytest.raises(data.DataError, match="needs data_dir.*never downloaded"):
    datasets.load_dataset("cifar10")


def test_missing_batch_file(tmp_path):
  write_cifar(tmp_path)
  os.remove(tmp_path / "data_batch_3")
  path = tmp_path / "data_batch_3"
  with pytest.raises(
      data.DataError, match=f"'{re.escape(str(path))}' does not exist.*test_batch"
  ) as e:
    loaders.load_cifar10(tmp_path)
  assert "\n" not in str(e.value)


class _Evil:

  def __reduce__(self):
    return (os.system, ("echo pwned",))


@pytest.mark.parametrize(
    "content,message",
    [
        (b"not a pickle at all", "not a readable python pickle"),
        (pickle.dumps([1, 2, 3]), "holds a list; expected a dict"),
        (pickle.dumps({b"data": np.zeros((3, 3072), np.uint8)}), "no b'labels' entry"),
        (
            pickle.dumps({b"data": np.zeros((3, 100), np.uint8), b"labels": [0, 1, 2]}),
            r"uint8\(3, 100\); expected uint8 \[N, 3072\]",
        ),
        (
            pickle.dumps({b"data": np.zeros((3, 3072), np.uint8), b"labels": [0, 1]}),
            "expected 3 integers",
        ),
        (
            pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}),
            r"labels in \[0, 10\]; expected labels in \[0, 10\)",
        ),
        (pickle.dumps({b"data": _Evil(), b"labels": []}), "global posix.system is not allowed"),
    ],
    ids=["garbage", "list", "no-labels", "shape", "count", "range", "code"],
)
def test_malformed_batch_names_the_path(tmp_path, content, message):
  write_cifar(tmp_path)
  path = tmp_path / "test_batch"
  path.write_bytes(content)
  with pytest.raises(data.DataError, match=message) as e:
    loaders.load_cifar10(tmp_path)
  assert f"'{path}'" in str(e.value) and "\n" not in str(e.value)


# --------------------------------------------------------------------------
# Crops.
# --------------------------------------------------------------------------


def test_random_crop_is_a_window_of_the_right_size_and_deterministic():
  x = np.random.default_rng(0).normal(size=(2, 3, 32, 32, 3)).astype(np.float32)
  a = batches.random_crop(x, 28, batches.crop_rng(seed=0, epoch=1, step=5))
  b = batches.random_crop(x, 28, batches.crop_rng(seed=0, epoch=1, step=5))
  c = batches.random_crop(x, 28, batches.crop_rng(seed=0, epoch=1, step=6))
  assert a.shape == (2, 3, 28, 28, 3) and a.dtype == np.float32
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  offsets = set()
  for w in range(2):
    for i in range(3):
      found = [
          (r, q)
          for r in range(5)
          for q in range(5)
          if np.array_equal(a[w, i], x[w, i, r : r + 28, q : q + 28])
      ]
      assert len(found) == 1  # each crop is one 28x28 window of its own image
      offsets.add(found[0])
  assert len(offsets) > 1  # offsets drawn per image


def test_center_crop_and_bad_sizes():
  x = np.arange(2 * 32 * 32 * 3, dtype=np.float32).reshape(2, 32, 32, 3)
  np.testing.assert_array_equal(batches.center_crop(x, 28), x[:, 2:30, 2:30])
  assert batches.center_crop(x, None) is x
  assert batches.cropped_shape((32, 32, 3), 28) == (28, 28, 3)
  assert batches.cropped_shape((32, 32, 3), None) == (32, 32, 3)
  with pytest.raises(data.DataError, match="crop_size=33 exceeds the 32x32 images"):
    batches.random_crop(x, 33, batches.crop_rng(0, 0, 0))
  with pytest.raises(data.DataError, match="needs images"):
    batches.cropped_shape((40, 1), 28)


def test_a_flip_is_drawn_after_the_crop_from_the_same_generator():
  # 2 workers x 3 images of 8x8x2, crops of 6: the draws of crop_rng(0, 1, 5), by hand
  #   rows    rng.integers(0, 3, 6) = [0 1 0 1 2 0]
  #   columns rng.integers(0, 3, 6) = [0 1 2 2 1 0]
  #   flips   rng.integers(0, 2, 6) = [0 1 1 0 1 1]  (image b flipped where 1)
  x = np.arange(2 * 3 * 8 * 8 * 2, dtype=np.float32).reshape(2, 3, 8, 8, 2)
  y = np.arange(6).reshape(2, 3)
  augment, eval_transform = batches.crop_transforms(6, flip=True)
  out, labels = augment((x, y), batches.crop_rng(seed=0, epoch=1, step=5))
  rows, cols, flips = [0, 1, 0, 1, 2, 0], [0, 1, 2, 2, 1, 0], [0, 1, 1, 0, 1, 1]
  flat = x.reshape(6, 8, 8, 2)
  expected = np.stack(
      [
          flat[b, r : r + 6, c : c + 6][:, ::-1] if f else flat[b, r : r + 6, c : c + 6]
          for b, (r, c, f) in enumerate(zip(rows, cols, flips))
      ]
  ).reshape(2, 3, 6, 6, 2)
  np.testing.assert_array_equal(out, expected)
  np.testing.assert_array_equal(labels, y)
  # the crops are those of crops alone (the flips come after them)
  crop_only, _ = batches.crop_transforms(6)
  cropped = crop_only((x, y), batches.crop_rng(seed=0, epoch=1, step=5))[0]
  for b, (r, c, f) in enumerate(zip(rows, cols, flips)):
    w, i = divmod(b, 3)
    np.testing.assert_array_equal(cropped[w, i], flat[b, r : r + 6, c : c + 6])
    np.testing.assert_array_equal(out[w, i], cropped[w, i][:, ::-1] if f else cropped[w, i])
  # evaluation: the centre crop, unflipped
  np.testing.assert_array_equal(eval_transform((x, y))[0], x[..., 1:7, 1:7, :])
  # flips without a crop: whole images, no evaluation transform
  flip_only, none = batches.crop_transforms(None, flip=True)
  assert none is None and batches.crop_transforms(None) == (None, None)
  whole = flip_only((x, y), batches.crop_rng(seed=0, epoch=1, step=5))[0]
  draws = batches.crop_rng(seed=0, epoch=1, step=5).integers(0, 2, size=6)  # [0 0 0 1 1 0]
  np.testing.assert_array_equal(
      whole.reshape(6, 8, 8, 2), np.where(draws[:, None, None, None] == 1, flat[:, :, ::-1], flat)
  )
  with pytest.raises(data.DataError, match="random_flip needs images"):
    batches.random_flip(np.zeros((4, 40)), batches.crop_rng(0, 0, 0))


def flip_run(tmp_path, name, *flags):
  """``easgd train`` of 2 steps on digits (8x8 images); its workers' parameters."""
  work = tmp_path / name
  argv = ["train", "--workdir", str(work), "--dataset", "digits", "--model", "mlp"]
  argv += ["--num-workers", "2", "--global-batch-size", "64", "--num-epochs", "1"]
  argv += ["--stop-after-steps", "2", "--no-progress", *flags]
  assert cli.main(argv) == 0
  ckpt = checkpoint.Checkpointer(work)
  try:
    state = ckpt.restore(ckpt.latest_step())
  finally:
    ckpt.close()
  assert int(np.asarray(state["step"])) == 2
  return jax.tree.leaves(state["worker"]["params"])


def test_easgd_train_with_flips_is_reproducible_and_differs_from_no_flips(tmp_path):
  flipped = flip_run(tmp_path, "a", "--random-flip")
  again = flip_run(tmp_path, "b", "--random-flip")
  plain = flip_run(tmp_path, "c")
  for a, b in zip(flipped, again):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, c) for a, c in zip(flipped, plain))
  saved = json.loads((tmp_path / "a" / "config.json").read_text())
  assert saved["random_flip"] is True


def test_config_crop_and_data_dir_checks():
  with pytest.raises(ConfigError, match="cifar10' needs data_dir"):
    TrainConfig(dataset="cifar10", model="cifar").validate()
  with pytest.raises(ConfigError, match="crop_size"):
    TrainConfig(dataset="digits", crop_size=0).validate()
  with pytest.raises(ConfigError, match="mnist1d"):
    TrainConfig(crop_size=28).validate()
  with pytest.raises(
      ConfigError,
      match="^random_flip flips images; dataset 'mnist1d' holds 1-D signals; allowed: "
      "random_flip False$",
  ):
    TrainConfig(random_flip=True).validate()
  TrainConfig(dataset="digits", random_flip=True).validate()
  # validate() does not touch the disk
  TrainConfig(dataset="cifar10", data_dir="/no/such/dir", model="cifar", crop_size=28).validate()


# --------------------------------------------------------------------------
# The paper's CIFAR-10 model.
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cifar_params():
  """CifarNet's parameters for 28x28x3 inputs (one jitted init: eager init is slow)."""
  return jax.jit(lambda k: models.init_params(models.CifarNet(), (28, 28, 3), k))(jax.random.key(0))


def test_cifarnet_shapes_as_in_the_paper(cifar_params):
  # (3,28) C(64,24) P(64,12) C(128,8) P(128,4) C(64,2) D(256,1) S(10,1)
  model = models.make_model("cifar", num_classes=10)
  assert isinstance(model, models.CifarNet)
  logits, state = jax.eval_shape(
      lambda p: model.apply({"params": p}, jnp.zeros((2, 28, 28, 3)), mutable=["intermediates"]),
      cifar_params,
  )
  shapes = {k: v[0].shape for k, v in state["intermediates"].items()}
  assert shapes == {
      "conv1": (2, 24, 24, 64),
      "pool1": (2, 12, 12, 64),
      "conv2": (2, 8, 8, 128),
      "pool2": (2, 4, 4, 128),
      "conv3": (2, 2, 2, 64),
      "dense": (2, 256),
      "logits": (2, 10),
  }
  assert logits.shape == (2, 10) and logits.dtype == jnp.float32
  assert models.count_params(cifar_params) == (
      5 * 5 * 3 * 64
      + 64
      + 5 * 5 * 64 * 128
      + 128
      + 3 * 3 * 128 * 64
      + 64
      + 256 * 256
      + 256
      + 256 * 10
      + 10
  )
  biases = [
      v
      for p, v in jax.tree_util.tree_leaves_with_path(cifar_params)
      if jax.tree_util.keystr(p).endswith("['bias']")
  ]
  assert len(biases) == 5 and all(not np.any(b) for b in biases)  # paper: biases 0
  with pytest.raises(models.ModelError, match="H, W >= 24"):
    jax.eval_shape(lambda k: models.init_params(model, (8, 8, 1), k), jax.random.key(0))


def test_cifarnet_dropout_only_in_train_mode(cifar_params):
  model = models.CifarNet()
  # A positive dense bias makes every hidden unit active, so dropout must show.
  params = jax.tree_util.tree_map(lambda v: v, cifar_params)
  params["Dense_0"]["bias"] = jnp.ones_like(params["Dense_0"]["bias"])
  x = jax.random.normal(jax.random.key(1), (4, 28, 28, 3))
  apply = jax.jit(lambda key: model.apply({"params": params}, x, train=True, rngs={"dropout": key}))
  eval_a = model.apply({"params": params}, x)  # train=False: no rng needed
  np.testing.assert_array_equal(eval_a, model.apply({"params": params}, x, train=False))
  train_a, train_b = apply(jax.random.key(2)), apply(jax.random.key(3))
  np.testing.assert_array_equal(train_a, apply(jax.random.key(2)))
  assert not np.allclose(train_a, train_b) and not np.allclose(train_a, eval_a)
  with pytest.raises(Exception, match="dropout"):
    model.apply({"params": params}, x, train=True)  # train mode needs the rng


# --------------------------------------------------------------------------
# End to end.
# --------------------------------------------------------------------------


def test_tiny_run_on_the_fixture(tmp_path):
  write_cifar(tmp_path / "cifar")
  config = TrainConfig(
      dataset="cifar10",
      data_dir=str(tmp_path / "cifar"),
      model="cifar",
      crop_size=28,
      num_workers=2,
      global_batch_size=4,
      num_epochs=1,
      learning_rate=0.01,
      weight_decay=1e-4,
      tau=2,
      beta=0.9,
      eval_batch_size=2,
      progress=False,
  )
  summary = trainer.train_and_evaluate(config, tmp_path / "run")
  history = summary["history"]
  assert [r["epoch"] for r in history] == [0, 1]
  assert all(r["test_count"] == NUM_TEST for r in history)  # every test example once
  assert summary["steps_done"] == summary["total_steps"] == (20 // 2) // 2
  assert summary["num_params"] == 351946
  assert np.isfinite(history[-1]["train_loss"]) and history[-1]["worker_center_distance"] > 0
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert saved["crop_size"] == 28
