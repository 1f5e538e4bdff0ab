"""Tests for easgd.tasks.data: IDX reading, the dataset loaders, and the index layouts."""

import gzip
import os
import random
import struct

import numpy as np
import pytest

from easgd.tasks import batches, data, datasets, loaders

FASHION_DIR = loaders.DEFAULT_FASHION_MNIST_DIR


# --------------------------------------------------------------------------
# IDX fixtures, written byte by byte (independent of the reader under test).
# --------------------------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
  codes = {
      np.uint8: 0x08,
      np.int8: 0x09,
      np.int16: 0x0B,
      np.int32: 0x0C,
      np.float32: 0x0D,
      np.float64: 0x0E,
  }
  code = codes[array.dtype.type]
  header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
  return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path, array, compress=False):
  raw = idx_bytes(array)
  if compress:
    raw = gzip.compress(raw)
  with open(path, "wb") as f:
    f.write(raw)
  return path


def make_fashion_dir(root, num_train=20, num_test=7, seed=0, compress=True):
  rng = np.random.default_rng(seed)
  arrays = {
      "train-images-idx3-ubyte": rng.integers(0, 256, (num_train, 28, 28), dtype=np.uint8),
      "train-labels-idx1-ubyte": rng.integers(0, 10, (num_train,), dtype=np.uint8),
      "t10k-images-idx3-ubyte": rng.integers(0, 256, (num_test, 28, 28), dtype=np.uint8),
      "t10k-labels-idx1-ubyte": rng.integers(0, 10, (num_test,), dtype=np.uint8),
  }
  os.makedirs(root, exist_ok=True)
  for i, (stem, arr) in enumerate(arrays.items()):
    # Mix plain and gzipped files: the loader must accept either.
    gz = compress and i % 2 == 0
    write_idx(os.path.join(root, stem + (".gz" if gz else "")), arr, compress=gz)
  return arrays


# --------------------------------------------------------------------------
# read_idx
# --------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        np.array([3, 1, 4, 1, 5], dtype=np.uint8),
        np.array([[-1, 2], [300000, -7]], dtype=np.int32),
        np.array([1.5, -2.25, 1e-3], dtype=np.float32),
    ],
    ids=["u8-3d", "u8-1d", "i32", "f32"],
)
def test_read_idx_round_trip(tmp_path, compress, array):
  path = write_idx(tmp_path / "a.idx", array, compress=compress)
  out = loaders.read_idx(path)
  assert out.shape == array.shape
  assert out.dtype == array.dtype  # native byte order
  np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_rejects_truncated(tmp_path, compress):
  raw = idx_bytes(np.zeros((3, 4, 4), np.uint8))[:-5]
  path = tmp_path / "t.idx"
  path.write_bytes(gzip.compress(raw) if compress else raw)
  with pytest.raises(data.DataError, match="truncated") as e:
    loaders.read_idx(path)
  assert str(path) in str(e.value)


def test_read_idx_rejects_truncated_gzip_stream(tmp_path):
  raw = gzip.compress(idx_bytes(np.zeros((30, 4, 4), np.uint8)))
  path = tmp_path / "t.gz"
  path.write_bytes(raw[: len(raw) // 2])
  with pytest.raises(data.DataError, match="cannot read IDX file"):
    loaders.read_idx(path)


def test_read_idx_rejects_bad_magic_code_and_header(tmp_path):
  good = idx_bytes(np.zeros((2, 2), np.uint8))
  cases = {
      "magic": (b"\x01\x00" + good[2:], "magic bytes"),
      "code": (good[:2] + b"\x07" + good[3:], "type code 0x07"),
      "header": (good[:6], "header"),
      "tiny": (b"\x00\x00", "4-byte header"),
      "trailing": (good + b"\x00", "longer than its header says"),
  }
  for name, (raw, message) in cases.items():
    path = tmp_path / name
    path.write_bytes(raw)
    with pytest.raises(data.DataError, match=message):
      loaders.read_idx(path)


def test_read_idx_missing_file(tmp_path):
  with pytest.raises(data.DataError, match="nope"):
    loaders.read_idx(tmp_path / "nope")


# --------------------------------------------------------------------------
# Fashion-MNIST
# --------------------------------------------------------------------------


def test_fashion_loader_on_fixture(tmp_path):
  arrays = make_fashion_dir(tmp_path / "fm")
  ds = datasets.load_dataset("fashion_mnist", data_dir=tmp_path / "fm")
  assert ds.name == "fashion_mnist" and ds.num_classes == 10
  assert ds.train_x.shape == (20, 28, 28, 1) and ds.train_x.dtype == np.float32
  assert ds.test_x.shape == (7, 28, 28, 1) and ds.test_x.dtype == np.float32
  assert ds.train_y.dtype == np.int32 and ds.test_y.dtype == np.int32
  assert ds.input_shape == (28, 28, 1)
  np.testing.assert_array_equal(ds.train_y, arrays["train-labels-idx1-ubyte"])
  np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte"])
  # Standardised with train statistics: /255, minus train mean, over train std.
  train = arrays["train-images-idx3-ubyte"] / 255.0
  mean, std = train.mean(), train.std()
  np.testing.assert_allclose(ds.train_x[..., 0], (train - mean) / std, rtol=1e-5, atol=1e-5)
  test = arrays["t10k-images-idx3-ubyte"] / 255.0
  np.testing.assert_allclose(ds.test_x[..., 0], (test - mean) / std, rtol=1e-5, atol=1e-5)
  assert abs(float(ds.train_x.mean())) < 1e-5
  assert abs(float(ds.train_x.std()) - 1.0) < 1e-5
  assert not ds.train_x.flags.writeable  # cached instance is shared


def test_fashion_missing_directory(tmp_path):
  missing = tmp_path / "does-not-exist"
  with pytest.raises(data.DataError, match="does not exist") as e:
    datasets.load_dataset("fashion_mnist", data_dir=missing)
  assert str(missing) in str(e.value)
  assert "\n" not in str(e.value)


def test_fashion_missing_file(tmp_path):
  root = tmp_path / "fm"
  make_fashion_dir(root)
  os.remove(root / "t10k-labels-idx1-ubyte")
  with pytest.raises(data.DataError, match="t10k-labels-idx1-ubyte") as e:
    loaders.load_fashion_mnist(root)
  assert str(root) in str(e.value)


def test_fashion_mismatched_labels(tmp_path):
  root = tmp_path / "fm"
  make_fashion_dir(root, compress=False)
  write_idx(root / "train-labels-idx1-ubyte", np.zeros((19,), np.uint8))
  with pytest.raises(data.DataError, match="labels"):
    loaders.load_fashion_mnist(root)


def test_real_fashion_mnist():
  if not os.path.isdir(FASHION_DIR):
    if os.environ.get("EASGD_REQUIRE_FASHION_MNIST") == "1":
      pytest.fail(f"{FASHION_DIR} is absent but EASGD_REQUIRE_FASHION_MNIST=1")
    pytest.skip(f"{FASHION_DIR} is absent (install Debian's dataset-fashion-mnist)")
  ds = datasets.load_dataset("fashion_mnist")
  assert ds.train_x.shape == (60000, 28, 28, 1) and ds.train_x.dtype == np.float32
  assert ds.test_x.shape == (10000, 28, 28, 1) and ds.test_x.dtype == np.float32
  assert ds.train_y.shape == (60000,) and ds.test_y.shape == (10000,)
  # Fashion-MNIST is class-balanced: 6000 / 1000 per class.
  np.testing.assert_array_equal(np.bincount(ds.train_y, minlength=10), [6000] * 10)
  np.testing.assert_array_equal(np.bincount(ds.test_y, minlength=10), [1000] * 10)
  assert abs(float(ds.train_x.mean(dtype=np.float64))) < 1e-4
  assert abs(float(ds.train_x.std(dtype=np.float64)) - 1.0) < 1e-4


# --------------------------------------------------------------------------
# MNIST-1D and digits
# --------------------------------------------------------------------------


def test_mnist1d_shapes_determinism_and_global_rng(monkeypatch):
  monkeypatch.setenv(loaders.MNIST1D_CACHE_ENV, "")  # generated every time, no file read
  loaders._load_mnist1d_cached.cache_clear()
  np.random.seed(1234)
  random.seed(99)
  np_expected = np.random.get_state()[1].copy()
  py_expected = random.getstate()
  a = loaders.load_mnist1d(seed=3, num_samples=200)
  assert np.array_equal(np.random.get_state()[1], np_expected)
  assert random.getstate() == py_expected
  assert a.name == "mnist1d" and a.num_classes == 10
  assert a.train_x.shape == (160, 40, 1) and a.test_x.shape == (40, 40, 1)
  assert a.train_x.dtype == np.float32 and a.train_y.dtype == np.int32
  assert a.input_shape == (40, 1)
  loaders._load_mnist1d_cached.cache_clear()  # regenerate, not just hit the cache
  b = loaders.load_mnist1d(seed=3, num_samples=200)
  assert a is not b
  np.testing.assert_array_equal(a.train_x, b.train_x)
  np.testing.assert_array_equal(a.test_y, b.test_y)
  c = loaders.load_mnist1d(seed=4, num_samples=200)
  assert not np.array_equal(a.train_x, c.train_x)


def test_a_generated_mnist1d_is_kept_on_disk_and_read_back_bit_for_bit(tmp_path, monkeypatch):
  from mnist1d import data as mnist1d_data

  monkeypatch.setenv(loaders.MNIST1D_CACHE_ENV, "")
  loaders._load_mnist1d_cached.cache_clear()
  generated = loaders.load_mnist1d(seed=5, num_samples=200)
  monkeypatch.setenv(loaders.MNIST1D_CACHE_ENV, str(tmp_path / "cache"))
  loaders._load_mnist1d_cached.cache_clear()
  assert loaders.load_mnist1d(seed=5, num_samples=200).train_x.shape == (160, 40, 1)
  (path,) = (tmp_path / "cache").iterdir()
  assert path.name.startswith("mnist1d-") and "-seed5-n200-" in path.name
  make = mnist1d_data.make_dataset

  def never(args):
    raise AssertionError("generated again, not read from its file")

  monkeypatch.setattr(mnist1d_data, "make_dataset", never)
  loaders._load_mnist1d_cached.cache_clear()
  read = loaders.load_mnist1d(seed=5, num_samples=200)
  for f in ("train_x", "train_y", "test_x", "test_y"):
    a, b = getattr(read, f), getattr(generated, f)
    assert a.dtype == b.dtype and np.array_equal(a, b), f
  # a damaged file is generated again and replaced; no temporary file is left
  monkeypatch.setattr(mnist1d_data, "make_dataset", make)
  path.write_bytes(path.read_bytes()[:100])
  loaders._load_mnist1d_cached.cache_clear()
  np.testing.assert_array_equal(
      loaders.load_mnist1d(seed=5, num_samples=200).test_x, generated.test_x
  )
  assert [p.name for p in (tmp_path / "cache").iterdir()] == [path.name]
  np.testing.assert_array_equal(
      np.load(path)["x_test"].astype(np.float32)[..., None], generated.test_x
  )
  # a directory that cannot be made: the data set is generated, nothing written
  (tmp_path / "a_file").write_text("")
  monkeypatch.setenv(loaders.MNIST1D_CACHE_ENV, str(tmp_path / "a_file" / "cache"))
  loaders._load_mnist1d_cached.cache_clear()
  np.testing.assert_array_equal(
      loaders.load_mnist1d(seed=5, num_samples=200).train_y, generated.train_y
  )
  loaders._load_mnist1d_cached.cache_clear()


def test_mnist1d_bad_num_samples():
  with pytest.raises(
      data.DataError, match="num_samples must be a positive multiple of 10 .*, got 25"
  ):
    loaders.load_mnist1d(num_samples=25)


def test_digits_shapes_and_split():
  ds = datasets.load_dataset("digits", seed=0)
  assert ds.train_x.shape == (1438, 8, 8, 1) and ds.test_x.shape == (359, 8, 8, 1)
  assert ds.train_x.dtype == np.float32 and ds.test_y.dtype == np.int32
  assert abs(float(ds.train_x.mean())) < 1e-5
  other = datasets.load_dataset("digits", seed=1)
  assert not np.array_equal(ds.train_y, other.train_y)


def test_unknown_dataset():
  with pytest.raises(data.DataError, match="'cifar'.*mnist1d, fashion_mnist, digits"):
    datasets.load_dataset("cifar")


# --------------------------------------------------------------------------
# Training order
# --------------------------------------------------------------------------


def test_epoch_permutation_deterministic():
  p = batches.epoch_permutation(50, seed=1, epoch=2)
  assert p.dtype == np.int64
  np.testing.assert_array_equal(np.sort(p), np.arange(50))
  np.testing.assert_array_equal(p, batches.epoch_permutation(50, seed=1, epoch=2))
  assert not np.array_equal(p, batches.epoch_permutation(50, seed=1, epoch=3))
  assert not np.array_equal(p, batches.epoch_permutation(50, seed=2, epoch=2))


@pytest.mark.parametrize("num_examples", [103, 96])
def test_worker_batch_indices_split_one_global_batch(num_examples):
  W, B, seed, epoch = 4, 5, 7, 1
  idx = batches.worker_batch_indices(num_examples, W, B, seed, epoch)
  steps = num_examples // (W * B)  # 5 and 4 global batches of 20
  assert steps == batches.steps_per_epoch(num_examples, W, B)
  assert idx.shape == (steps, W, B) and idx.dtype == np.int64
  perm = batches.epoch_permutation(num_examples, seed, epoch)
  for t in range(steps):  # step t reads perm[20t:20t+20]; worker i rows 5i..5i+4
    for i in range(W):
      np.testing.assert_array_equal(idx[t, i], perm[t * 20 + i * B : t * 20 + (i + 1) * B])
  flat = idx.reshape(-1)
  assert len(np.unique(flat)) == flat.size  # no example twice in an epoch
  np.testing.assert_array_equal(flat, perm[: steps * W * B])


@pytest.mark.parametrize("num_examples", [103, 96, 1438])
def test_the_examples_of_a_step_do_not_depend_on_how_the_global_batch_is_split(num_examples):
  # The global batch of step t is a function of (seed, epoch, t) only: 1, 2, 4 or 8
  # workers of 16 / W examples see the same 16 examples, worker i rows i*B..(i+1)*B-1.
  one = batches.worker_batch_indices(num_examples, 1, 16, seed=3, epoch=2)
  for W in (2, 4, 8):
    idx = batches.worker_batch_indices(num_examples, W, 16 // W, seed=3, epoch=2)
    assert batches.steps_per_epoch(num_examples, W, 16 // W) == len(one)
    np.testing.assert_array_equal(idx.reshape(len(one), 16), one[:, 0])


def test_worker_batch_indices_full_epoch_when_divisible():
  idx = batches.worker_batch_indices(120, num_workers=4, per_worker_batch=6, seed=0, epoch=0)
  assert idx.shape == (5, 4, 6)
  np.testing.assert_array_equal(np.sort(idx.reshape(-1)), np.arange(120))


def test_worker_batch_indices_seed_and_epoch():
  a = batches.worker_batch_indices(120, 4, 6, seed=0, epoch=0)
  np.testing.assert_array_equal(a, batches.worker_batch_indices(120, 4, 6, seed=0, epoch=0))
  assert not np.array_equal(a, batches.worker_batch_indices(120, 4, 6, seed=0, epoch=1))
  assert not np.array_equal(a, batches.worker_batch_indices(120, 4, 6, seed=1, epoch=0))


def test_steps_per_epoch_too_large_batch():
  with pytest.raises(data.DataError, match="num_examples=30.*num_workers=4.*per_worker_batch=8"):
    batches.steps_per_epoch(30, 4, 8)
  with pytest.raises(data.DataError, match="num_workers must be an integer >= 1, got 0"):
    batches.worker_batch_indices(30, 0, 8, seed=0, epoch=0)


# --------------------------------------------------------------------------
# Evaluation layout
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_examples,num_workers,eval_batch", [(1003, 4, 64), (1024, 4, 64), (5, 8, 3), (1, 1, 1)]
)
def test_eval_shards_exact_coverage(num_examples, num_workers, eval_batch):
  idx, mask = batches.eval_shards(num_examples, num_workers, eval_batch)
  per_worker = -(-num_examples // num_workers)
  num_batches = -(-per_worker // eval_batch)
  assert idx.shape == mask.shape == (num_workers, num_batches, eval_batch)
  assert idx.dtype == np.int64 and mask.dtype == np.bool_
  assert int(mask.sum()) == num_examples
  np.testing.assert_array_equal(np.sort(idx[mask]), np.arange(num_examples))
  assert np.all(idx[~mask] == 0)
  # A masked sum of per-example values is exact.
  values = np.random.default_rng(0).normal(size=num_examples)
  np.testing.assert_allclose((values[idx] * mask).sum(), values.sum())


def test_eval_shards_1003():
  idx, mask = batches.eval_shards(1003, 4, 64)
  assert idx.shape == (4, 4, 64)  # ceil(1003/4) = 251 per worker -> 4 batches of 64
  assert int(mask.sum()) == 1003
  counts = np.bincount(idx[mask], minlength=1003)
  assert np.all(counts == 1)


def test_read_idx_rejects_absurd_dims_without_allocating(tmp_path):
  # header only: uint8, rank 3, dims 2^31 x 2^31 x 4 (and a zero-count variant)
  for dims in ((2**31, 2**31, 4), (0, 2**32 - 1, 2**32 - 1)):
    path = tmp_path / "huge.idx"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">3I", *dims))
    with pytest.raises(data.DataError, match="huge.idx"):
      loaders.read_idx(path)


def test_each_row_of_the_data_set_table_states_its_shapes_and_the_models_that_fit():
  """The table's shapes and classes are the loaders' (the data sets made here),
  and its models are exactly those that take its inputs (built abstractly)."""
  import jax

  from easgd.tasks import models, names

  for name in ("mnist1d", "digits"):
    ds, spec = datasets.load_dataset(name), datasets.TABLE[name]
    assert (ds.input_shape, ds.num_classes) == (spec.input_shape, spec.num_classes)
  for spec in datasets.TABLE.values():
    fits = []
    for name in names.MODELS:
      net = models.make_model(name, spec.num_classes)
      try:
        jax.eval_shape(lambda k: models.init_params(net, spec.input_shape, k), jax.random.key(0))
      except models.ModelError:
        continue
      fits.append(name)
    assert tuple(fits) == spec.models, spec.name
  assert datasets.DATASETS == ("mnist1d", "fashion_mnist", "digits", "cifar10")
  assert [n for n in datasets.DATASETS if datasets.reads_data_dir(n)] == [
      "fashion_mnist",
      "cifar10",
  ]
