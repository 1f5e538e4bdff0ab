"""The built-in data sets' loaders, each returning a standardised
:class:`~easgd.tasks.data.Dataset` (their table: ``easgd.tasks.datasets``; where
the files come from: docs/guides/quickstart.md). NumPy only."""

from __future__ import annotations

import functools
import gzip
import math
import os
import pickle
import random
import struct
import zipfile

import numpy as np

from easgd._util import files
from easgd.tasks.data import DataError, Dataset, check_positive, check_seed

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
"""Where Debian's ``dataset-fashion-mnist`` package installs its IDX files."""

_FASHION_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}

# IDX type code -> big-endian NumPy dtype (LeCun et al., MNIST database page).
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"


# -- IDX files (Fashion-MNIST). ----------------------------------------------


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Reads one IDX file (plain or gzip-compressed) into a NumPy array.

  The IDX layout is: two zero bytes, a type code byte, a byte ``ndim``, then
  ``ndim`` big-endian uint32 dimension sizes, then the data in C order,
  big-endian. Compression is detected from the gzip magic bytes, not the file
  name.

  Args:
    path: file to read.

  Returns:
    An array of shape ``dims`` in native byte order: uint8 for MNIST-family
    images ``[N, 28, 28]`` and labels ``[N]``; int8/int16/int32/float32/float64
    for the other type codes (0x09, 0x0B, 0x0C, 0x0D, 0x0E).

  Raises:
    DataError: if the file cannot be opened, is not gzip-valid, has a bad magic
      number or type code, or holds fewer or more data bytes than its
      dimensions say (truncated or trailing data).

  References:
    LeCun, Cortes & Burges, "The MNIST database of handwritten digits",
    section "The IDX file format".
  """
  path = os.fspath(path)
  try:
    with open(path, "rb") as f:
      raw = f.read()
    if raw[:2] == _GZIP_MAGIC:
      raw = gzip.decompress(raw)
  except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError.
    raise DataError(f"cannot read IDX file '{path}': {e}") from e
  if len(raw) < 4:
    raise DataError(f"IDX file '{path}' has {len(raw)} bytes; expected at least a 4-byte header")
  zero0, zero1, code, ndim = raw[0], raw[1], raw[2], raw[3]
  if zero0 != 0 or zero1 != 0:
    raise DataError(
        f"IDX file '{path}' has magic bytes {raw[:4].hex()}; expected 0000 then "
        "type code and rank"
    )
  if code not in _IDX_DTYPES:
    allowed = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
    raise DataError(f"IDX file '{path}' has type code 0x{code:02X}; expected one of {allowed}")
  header_len = 4 + 4 * ndim
  if len(raw) < header_len:
    raise DataError(
        f"IDX file '{path}' is truncated in its header: {len(raw)} bytes for "
        f"rank {ndim}; expected at least {header_len}"
    )
  dims = struct.unpack(f">{ndim}I", raw[4:header_len])
  if any(d > 2**31 - 1 for d in dims):
    raise DataError(f"IDX file '{path}' has dims {dims}; expected sizes below 2**31")
  dtype = _IDX_DTYPES[code]
  expected = math.prod(int(d) for d in dims) * dtype.itemsize  # Python ints: no overflow
  actual = len(raw) - header_len
  if actual != expected:
    what = "truncated" if actual < expected else "longer than its header says"
    raise DataError(
        f"IDX file '{path}' is {what}: {actual} data bytes for dims {dims}; " f"expected {expected}"
    )
  data = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(dims)
  return data.astype(dtype.newbyteorder("="))


def _find_idx(data_dir: str, stem: str) -> str:
  for candidate in (stem, stem + ".gz"):
    path = os.path.join(data_dir, candidate)
    if os.path.isfile(path):
      return path
  raise DataError(
      f"data directory '{data_dir}' lacks {stem}(.gz); expected the IDX files of "
      "Debian's dataset-fashion-mnist"
  )


def _standardise_uint8(train: np.ndarray, test: np.ndarray, scale: float, name: str):
  """Scales by 1/scale, then subtracts the train mean and divides by the train std.

  The statistics are exact: they come from a histogram of the integer pixel
  values, so no float64 copy of the whole training set is made.
  """
  counts = np.bincount(train.ravel(), minlength=256).astype(np.float64)
  values = np.arange(counts.size, dtype=np.float64) / scale
  total = counts.sum()
  mean = float((counts * values).sum() / total)
  std = float(np.sqrt((counts * (values - mean) ** 2).sum() / total))
  if not std > 0:
    raise DataError(f"{name}: training inputs are constant (std {std}); cannot standardise")

  def apply(x):
    # Lookup table: exact per pixel value, and float32 from the start.
    table = ((values - mean) / std).astype(np.float32)
    return table[x][..., None]

  return apply(train), apply(test)


def _not_a_dir(path: str) -> str:
  """How a data directory that is not one fails: for the error messages."""
  return "is a file, not a directory" if os.path.exists(path) else "does not exist"


@functools.lru_cache(maxsize=2)
def _load_fashion_mnist_cached(data_dir: str) -> Dataset:
  if not os.path.isdir(data_dir):
    raise DataError(
        f"data directory '{data_dir}' {_not_a_dir(data_dir)}; expected the IDX files of "
        "Debian's dataset-fashion-mnist (apt install dataset-fashion-mnist)"
    )
  arrays = {key: read_idx(_find_idx(data_dir, stem)) for key, stem in _FASHION_FILES.items()}
  for split in ("train", "test"):
    x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
    if x.ndim != 3 or x.dtype != np.uint8:
      raise DataError(
          f"fashion_mnist {split} images in '{data_dir}' have dtype {x.dtype} shape "
          f"{x.shape}; expected uint8 [N, H, W]"
      )
    if y.ndim != 1 or y.dtype != np.uint8 or y.shape[0] != x.shape[0]:
      raise DataError(
          f"fashion_mnist {split} labels in '{data_dir}' have dtype {y.dtype} shape "
          f"{y.shape}; expected uint8 [{x.shape[0]}] matching the images"
      )
    if y.size and y.max() >= 10:
      raise DataError(
          f"fashion_mnist {split} labels in '{data_dir}' reach {y.max()}; "
          "expected labels in [0, 10)"
      )
  train_x, test_x = _standardise_uint8(arrays["train_x"], arrays["test_x"], 255.0, "fashion_mnist")
  return Dataset(
      name="fashion_mnist",
      train_x=train_x,
      train_y=arrays["train_y"].astype(np.int32),
      test_x=test_x,
      test_y=arrays["test_y"].astype(np.int32),
      num_classes=10,
  )


def load_fashion_mnist(data_dir: str | os.PathLike | None = None) -> Dataset:
  """Loads Fashion-MNIST from IDX files, as standardised NHWC float32 images.

  Inputs are ``pixel / 255``, then the training mean is subtracted and the
  result divided by the training standard deviation (both scalars over all
  training pixels; the test split uses the training statistics). The official
  60000/10000 train/test split is kept; there is no seed.

  Results are cached in memory per resolved directory (2 entries), so a file
  replaced on disk during a process is not re-read.

  Args:
    data_dir: directory holding ``train-images-idx3-ubyte``,
      ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and
      ``t10k-labels-idx1-ubyte``, each plain or with ``.gz``. ``None`` means
      :data:`DEFAULT_FASHION_MNIST_DIR`.

  Returns:
    A :class:`Dataset` named ``"fashion_mnist"``: ``train_x`` float32
    ``[60000, 28, 28, 1]``, ``train_y`` int32 ``[60000]``, ``test_x`` float32
    ``[10000, 28, 28, 1]``, ``test_y`` int32 ``[10000]``, 10 classes (for the
    Debian files; other IDX files give their own ``N``, ``H``, ``W``).

  Raises:
    DataError: if the directory or a file is missing, a file is malformed, or
      images and labels disagree.

  References:
    Xiao, Rasul & Vollgraf, "Fashion-MNIST: a Novel Image Dataset for
    Benchmarking Machine Learning Algorithms", arXiv:1708.07747, 2017.
  """
  if data_dir is None:
    data_dir = DEFAULT_FASHION_MNIST_DIR
  return _load_fashion_mnist_cached(os.path.abspath(os.fspath(data_dir)))


# -- CIFAR-10 (python-pickle batches). ---------------------------------------

CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
"""The five training batches of the CIFAR-10 python version (10000 images each)."""

CIFAR10_TEST_FILE = "test_batch"
"""The test batch of the CIFAR-10 python version (10000 images)."""

CIFAR10_SUBDIR = "cifar-10-batches-py"
"""The folder that ``cifar-10-python.tar.gz`` unpacks to; looked for inside ``data_dir``."""

_CIFAR_SIDE = 32
_CIFAR_PIXELS = 3 * _CIFAR_SIDE * _CIFAR_SIDE  # 3072 bytes: R plane, G plane, B plane.

# The only globals a CIFAR-10 batch may name: NumPy's array reconstruction. A
# pickle can run arbitrary code on load; refusing every other global keeps a
# stray or hostile file in data_dir from doing so.
_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),  # pickle protocol 5
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),  # bytes in protocol-2 pickles written by Python 3
}


class _CifarUnpickler(pickle.Unpickler):

  def find_class(self, module, name):
    if (module, name) not in _PICKLE_GLOBALS:
      raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
    return super().find_class(module, name)


def _cifar_expected() -> str:
  return (
      f"expected the CIFAR-10 python batches {', '.join(CIFAR10_TRAIN_FILES)} and "
      f"{CIFAR10_TEST_FILE} (from cifar-10-python.tar.gz), directly or in "
      f"{CIFAR10_SUBDIR}/"
  )


def _cifar_dir(data_dir: str) -> str:
  """The directory that holds the batch files: data_dir or data_dir/cifar-10-batches-py."""
  if not os.path.isdir(data_dir):
    raise DataError(
        f"CIFAR-10 data directory '{data_dir}' {_not_a_dir(data_dir)}; {_cifar_expected()}"
    )
  nested = os.path.join(data_dir, CIFAR10_SUBDIR)
  if not os.path.isfile(os.path.join(data_dir, CIFAR10_TEST_FILE)) and os.path.isdir(nested):
    return nested
  return data_dir


def read_cifar10_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
  """Reads one CIFAR-10 python batch file into NHWC uint8 images and labels.

  A batch is a pickled dict with ``b"data"``, uint8 ``[N, 3072]`` (each row the
  1024 red, then 1024 green, then 1024 blue values of a 32x32 image, rows of
  the image in order), and ``b"labels"``, ``N`` integers in ``[0, 10)``
  (``str`` keys are accepted too). Unpickling only admits NumPy's array
  reconstruction, so a file that names any other global is refused instead of
  run.

  Args:
    path: the batch file, e.g. ``.../cifar-10-batches-py/data_batch_1``.

  Returns:
    ``(images, labels)``: uint8 ``[N, 32, 32, 3]`` (channels last, R, G, B) and
    int32 ``[N]``.

  Raises:
    DataError: if the file is missing, is not such a pickle, or its arrays
      have the wrong dtype, shape or label range.

  References:
    Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009;
    the file layout of https://www.cs.toronto.edu/~kriz/cifar.html.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise DataError(f"CIFAR-10 batch file '{path}' does not exist; {_cifar_expected()}")
  try:
    with open(path, "rb") as f:
      batch = _CifarUnpickler(f, encoding="bytes").load()
  except Exception as e:  # Any failure to unpickle means a malformed file.
    raise DataError(
        f"CIFAR-10 batch file '{path}' is not a readable python pickle "
        f"({type(e).__name__}: {e}); {_cifar_expected()}"
    ) from None
  if not isinstance(batch, dict):
    raise DataError(
        f"CIFAR-10 batch file '{path}' holds a {type(batch).__name__}; expected a "
        "dict with b'data' and b'labels'"
    )
  fields = {}
  for key in ("data", "labels"):
    value = batch.get(key.encode(), batch.get(key))
    if value is None:
      raise DataError(
          f"CIFAR-10 batch file '{path}' has no b'{key}' entry; expected a dict "
          "with b'data' (uint8 [N, 3072]) and b'labels' (N integers)"
      )
    fields[key] = value
  raw = fields["data"]
  if (
      not isinstance(raw, np.ndarray)
      or raw.dtype != np.uint8
      or raw.ndim != 2
      or raw.shape[1] != _CIFAR_PIXELS
  ):
    raise DataError(
        f"CIFAR-10 batch file '{path}' has data of dtype/shape "
        f"{getattr(raw, 'dtype', type(raw).__name__)}{getattr(raw, 'shape', '')}; "
        f"expected uint8 [N, {_CIFAR_PIXELS}]"
    )
  try:
    labels = np.asarray(fields["labels"])
  except Exception:  # e.g. a ragged list
    labels = np.asarray([None])
  if (
      labels.ndim != 1
      or labels.shape[0] != raw.shape[0]
      or (labels.size and not np.issubdtype(labels.dtype, np.integer))
  ):
    raise DataError(
        f"CIFAR-10 batch file '{path}' has labels of dtype/shape {labels.dtype}"
        f"{labels.shape}; expected {raw.shape[0]} integers, one per image"
    )
  if labels.size and (labels.min() < 0 or labels.max() >= 10):
    raise DataError(
        f"CIFAR-10 batch file '{path}' has labels in [{labels.min()}, "
        f"{labels.max()}]; expected labels in [0, 10)"
    )
  images = raw.reshape(-1, 3, _CIFAR_SIDE, _CIFAR_SIDE).transpose(0, 2, 3, 1)
  return np.ascontiguousarray(images), labels.astype(np.int32)


def _standardise_channels(train: np.ndarray, test: np.ndarray, name: str):
  """uint8 NHWC -> float32, per channel: x / 255, minus the train mean, over the train std.

  Exact statistics from per-channel histograms of the integer values (no
  float64 copy of the training set); the lookup table maps each byte value to
  its float32 result directly.
  """
  values = np.arange(256, dtype=np.float64) / 255.0
  tables = []
  for c in range(train.shape[-1]):
    counts = np.bincount(train[..., c].ravel(), minlength=256).astype(np.float64)
    total = counts.sum()
    mean = (counts * values).sum() / total
    std = np.sqrt((counts * (values - mean) ** 2).sum() / total)
    if not std > 0:
      raise DataError(f"{name}: training channel {c} is constant (std {std}); cannot standardise")
    tables.append(((values - mean) / std).astype(np.float32))
  tables = np.stack(tables, axis=-1)  # [256, C]
  channels = np.arange(train.shape[-1])

  def apply(x):
    # In chunks: a fancy index makes an intp copy of its index (8 bytes a pixel).
    out = np.empty(x.shape, np.float32)
    for start in range(0, x.shape[0], 2048):
      out[start : start + 2048] = tables[x[start : start + 2048], channels]
    return out

  return apply(train), apply(test)


@functools.lru_cache(maxsize=1)  # 50000 float32 images take 0.6 GB.
def _load_cifar10_cached(data_dir: str) -> Dataset:
  batch_dir = _cifar_dir(data_dir)
  train = [read_cifar10_batch(os.path.join(batch_dir, f)) for f in CIFAR10_TRAIN_FILES]
  test_x, test_y = read_cifar10_batch(os.path.join(batch_dir, CIFAR10_TEST_FILE))
  train_x = np.concatenate([x for x, _ in train])
  train_y = np.concatenate([y for _, y in train])
  if train_y.size == 0 or test_y.size == 0:
    raise DataError(
        f"CIFAR-10 batches in '{batch_dir}' hold {train_y.size} training and "
        f"{test_y.size} test images; expected at least one of each"
    )
  train_x, test_x = _standardise_channels(train_x, test_x, "cifar10")
  return Dataset(
      name="cifar10",
      train_x=train_x,
      train_y=train_y,
      test_x=test_x,
      test_y=test_y,
      num_classes=10,
  )


def load_cifar10(data_dir: str | os.PathLike) -> Dataset:
  """Loads CIFAR-10 from its python-pickle batches, as standardised NHWC float32.

  Reads ``data_batch_1`` ... ``data_batch_5`` (train) and ``test_batch`` (test)
  from ``data_dir``, or from ``data_dir/cifar-10-batches-py`` when
  ``data_dir`` itself has no ``test_batch``. Nothing is ever downloaded. Per
  channel ``c``, inputs are ``x / 255``, minus the mean of channel ``c`` over
  all training pixels, divided by its standard deviation; the test split uses
  the training statistics. The official 50000/10000 split is kept.

  Results are cached in memory for the last resolved directory (one entry:
  the float32 training set is 0.6 GB).

  Args:
    data_dir: directory of the CIFAR-10 python batches (the unpacked
      ``cifar-10-python.tar.gz``, or the folder containing it). Required.

  Returns:
    A :class:`Dataset` named ``"cifar10"``: ``train_x`` float32
    ``[50000, 32, 32, 3]`` (channels R, G, B), ``train_y`` int32 ``[50000]``,
    ``test_x`` float32 ``[10000, 32, 32, 3]``, ``test_y`` int32 ``[10000]``,
    10 classes (other batch sizes give their own ``N``).

  Raises:
    DataError: if ``data_dir`` is None or missing, a batch file is missing or
      malformed (the message names the path and the expected files), or a
      training channel is constant.

  Example:
    >>> ds = load_cifar10("/data/cifar-10-batches-py")  # doctest: +SKIP
    >>> ds.train_x.shape, ds.test_x.shape  # doctest: +SKIP
    ((50000, 32, 32, 3), (10000, 32, 32, 3))

  References:
    Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009.
  """
  if data_dir is None:
    raise DataError(
        "cifar10 needs data_dir, the directory of the CIFAR-10 python batches "
        f"(it is never downloaded); {_cifar_expected()}"
    )
  return _load_cifar10_cached(os.path.abspath(os.fspath(data_dir)))


# -- MNIST-1D (generated). ---------------------------------------------------


MNIST1D_CACHE_ENV = "EASGD_DATA_CACHE"
"""The environment variable naming the directory generated MNIST-1D data sets
are kept in (one ``.npz`` file per generator version, seed and size); unset:
``$XDG_CACHE_HOME/easgd`` or ``~/.cache/easgd``; empty: no files, every data
set is generated."""


def mnist1d_cache_dir() -> str | None:
  """The directory of the generated MNIST-1D files (:data:`MNIST1D_CACHE_ENV`),
  or None when that variable is set empty (never cache on disk)."""
  where = os.environ.get(MNIST1D_CACHE_ENV)
  if where is not None:
    return where or None
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "easgd")


def _mnist1d_file(seed: int, num_samples: int, args) -> str | None:
  """The cache file of one generated data set: named by the generator's
  version and a hash of every generator argument (seed and size among them),
  so a changed generator or argument never reads an old file."""
  import hashlib
  from importlib import metadata

  where = mnist1d_cache_dir()
  if where is None:
    return None
  spec = repr(sorted(vars(args).items())).encode()
  digest = hashlib.sha256(spec).hexdigest()[:16]
  version = metadata.version("mnist1d")
  return os.path.join(where, f"mnist1d-{version}-seed{seed}-n{num_samples}-{digest}.npz")


_MNIST1D_KEYS = ("x", "y", "x_test", "y_test")


def _read_mnist1d_file(path: str | None):
  """The arrays of a cache file, or None when there is none or it cannot be
  read whole (a damaged file is then generated again and replaced)."""
  if path is None or not os.path.isfile(path):
    return None
  try:
    with np.load(path, allow_pickle=False) as f:
      return {k: f[k] for k in _MNIST1D_KEYS}
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
    return None


def _write_mnist1d_file(path: str | None, arrays: dict) -> None:
  """Writes the cache file atomically (``files.write_bytes_atomic``), so a
  concurrent reader never sees half of one; a directory that cannot be
  written leaves the data set uncached, nothing else."""
  if path is None:
    return
  import io

  buffer = io.BytesIO()
  np.savez(buffer, **{k: np.asarray(arrays[k]) for k in _MNIST1D_KEYS})
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.write_bytes_atomic(path, buffer.getvalue())
  except OSError:
    pass


@functools.lru_cache(maxsize=8)  # 1.6 MB each; a protocol's 6 seeds stay cached
def _load_mnist1d_cached(seed: int, num_samples: int) -> Dataset:
  from mnist1d import data as mnist1d_data  # Imported lazily: it is slow-ish.

  args = mnist1d_data.get_dataset_args()
  args.seed = seed
  args.num_samples = num_samples
  path = _mnist1d_file(seed, num_samples, args)
  generated = _read_mnist1d_file(path)
  if generated is None:
    # The generator reseeds NumPy's and Python's global RNGs; put them back.
    np_state = np.random.get_state()
    py_state = random.getstate()
    try:
      generated = mnist1d_data.make_dataset(args)
    finally:
      np.random.set_state(np_state)
      random.setstate(py_state)
    _write_mnist1d_file(path, generated)
  return Dataset(
      name="mnist1d",
      train_x=np.asarray(generated["x"], dtype=np.float32)[..., None],
      train_y=np.asarray(generated["y"], dtype=np.int32),
      test_x=np.asarray(generated["x_test"], dtype=np.float32)[..., None],
      test_y=np.asarray(generated["y_test"], dtype=np.int32),
      num_classes=10,
  )


def load_mnist1d(seed: int = 0, num_samples: int = 10000) -> Dataset:
  """Generates MNIST-1D with the ``mnist1d`` package's generator (no download).

  The package's default arguments are used except for ``seed`` and
  ``num_samples``. Our default ``num_samples`` is 10000 (the package's is
  5000), so that the 80/20 split gives 8000 training and 2000 test signals, a
  test set large enough to tell accuracies apart by about a percent. The
  generator standardises the signals itself (global mean 0, std 1 over train
  and test together), so no further scaling is applied.

  The global NumPy and Python RNG states, which the generator reseeds, are
  restored after it. Cached in memory per ``(seed, num_samples)`` and on disk
  in :func:`mnist1d_cache_dir` (see docs/guides/quickstart.md).

  Args:
    seed: generator seed, in ``[0, 2**32)``; different seeds give different
      signals and a different split.
    num_samples: total signals, train plus test; a positive multiple of 10
      (the generator makes ``num_samples // 10`` per class).

  Returns:
    A :class:`Dataset` named ``"mnist1d"``: ``train_x`` float32
    ``[0.8 * num_samples, 40, 1]`` (length 40, one channel), ``train_y`` int32,
    ``test_x`` float32 ``[0.2 * num_samples, 40, 1]``, ``test_y`` int32,
    10 classes.

  Raises:
    DataError: if ``seed`` or ``num_samples`` is out of range.

  References:
    Greydanus, "Scaling down Deep Learning", arXiv:2011.14439, 2020 (the
    MNIST-1D benchmark).
  """
  seed = check_seed(seed)
  num_samples = check_positive(num_samples, "num_samples")
  if num_samples % 10:
    raise DataError(
        f"num_samples must be a positive multiple of 10 (equal examples per "
        f"class), got {num_samples}"
    )
  return _load_mnist1d_cached(seed, num_samples)


# -- scikit-learn digits. ----------------------------------------------------


@functools.lru_cache(maxsize=4)
def _load_digits_cached(seed: int) -> Dataset:
  from sklearn import datasets as sk_datasets  # Imported lazily: it is slow.

  bunch = sk_datasets.load_digits()
  images = np.asarray(bunch.images, dtype=np.float64) / 16.0  # [1797, 8, 8]
  labels = np.asarray(bunch.target, dtype=np.int32)
  perm = np.random.default_rng(seed).permutation(labels.shape[0])
  num_train = int(round(0.8 * labels.shape[0]))
  train_idx, test_idx = perm[:num_train], perm[num_train:]
  train = images[train_idx]
  mean, std = train.mean(), train.std()
  train_x = ((train - mean) / std).astype(np.float32)[..., None]
  test_x = ((images[test_idx] - mean) / std).astype(np.float32)[..., None]
  return Dataset(
      name="digits",
      train_x=train_x,
      train_y=labels[train_idx],
      test_x=test_x,
      test_y=labels[test_idx],
      num_classes=10,
  )


def load_digits(seed: int = 0) -> Dataset:
  """Loads scikit-learn's 8x8 digits with a seeded 80/20 train/test split.

  Inputs are ``pixel / 16``, then standardised with the training split's
  scalar mean and standard deviation. The split is a permutation drawn from
  ``np.random.default_rng(seed)``: first 80% (rounded) train, rest test.

  Args:
    seed: split seed, in ``[0, 2**32)``.

  Returns:
    A :class:`Dataset` named ``"digits"``: ``train_x`` float32
    ``[1438, 8, 8, 1]``, ``train_y`` int32 ``[1438]``, ``test_x`` float32
    ``[359, 8, 8, 1]``, ``test_y`` int32 ``[359]``, 10 classes.

  Raises:
    DataError: if ``seed`` is out of range.

  References:
    Alpaydin & Kaynak, "Optical Recognition of Handwritten Digits", UCI
    Machine Learning Repository, 1998 (via ``sklearn.datasets.load_digits``).
  """
  return _load_digits_cached(check_seed(seed))
