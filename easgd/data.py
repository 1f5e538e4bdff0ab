"""Datasets and the data order of data-parallel training (NumPy only).

Three small classification datasets, loaded fully into host memory as a
:class:`Dataset` of standardised float32 inputs and int32 labels:

* ``"mnist1d"``: MNIST-1D signals ``[N, 40, 1]``, produced by the ``mnist1d``
  package's generator (never its download).
* ``"fashion_mnist"``: Fashion-MNIST images ``[N, 28, 28, 1]`` read from the IDX
  files of Debian's ``dataset-fashion-mnist`` package.
* ``"digits"``: scikit-learn's 8x8 digits ``[N, 8, 8, 1]``.

And the index layouts that the trainer gathers batches with:

* :func:`worker_batch_indices`: each epoch is one seeded permutation, cut into
  ``num_workers`` disjoint contiguous shards; worker ``i`` walks its own shard
  in consecutive per-worker batches.
* :func:`eval_shards`: every evaluation example exactly once across workers,
  padded to a rectangular ``[num_workers, num_batches, eval_batch]`` block with
  a mask, so that masked sums are exact.

This module imports no JAX: it runs on the host and hands NumPy index arrays to
the caller, who decides how to place them on devices.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import operator
import os
import random
import struct

import numpy as np

__all__ = [
    "DATASETS",
    "DEFAULT_FASHION_MNIST_DIR",
    "DataError",
    "Dataset",
    "epoch_permutation",
    "eval_shards",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_mnist1d",
    "read_idx",
    "steps_per_epoch",
    "worker_batch_indices",
]

DATASETS = ("mnist1d", "fashion_mnist", "digits")
"""Names accepted by :func:`load_dataset`."""

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
_MAX_SEED = 2**32  # np.random.seed and random.seed-compatible range [0, 2**32).


class DataError(ValueError):
    """A bad data input: a missing or malformed file, or an impossible layout.

    Messages are one line that names the bad value and says what is allowed.
    """


# --------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------


def _as_int(value, name: str) -> int:
    """Returns ``value`` as a Python int; DataError if it is not an integer."""
    if isinstance(value, (bool, np.bool_)):
        raise DataError(f"{name}={value!r} is a bool; expected an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise DataError(
            f"{name}={value!r} has type {type(value).__name__}; expected an integer"
        ) from None


def _positive_int(value, name: str) -> int:
    value = _as_int(value, name)
    if value < 1:
        raise DataError(f"{name}={value} must be a positive integer (>= 1)")
    return value


def _seed(value, name: str = "seed") -> int:
    value = _as_int(value, name)
    if not 0 <= value < _MAX_SEED:
        raise DataError(f"{name}={value} must lie in [0, 2**32)")
    return value


# --------------------------------------------------------------------------
# Dataset container.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A classification dataset held in host memory, train and test splits.

    Inputs are standardised float32 (images NHWC ``[N, H, W, C]``, signals
    ``[N, L, C]``); labels are int32 class indices in ``[0, num_classes)``.
    The arrays are made read-only on construction, because loaders cache and
    share one instance between callers (``np.array(ds.train_x)`` gives a
    writable copy). Equality is identity (``eq=False``): arrays have no
    single-valued ``==``.

    Attributes:
      name: dataset name, one of :data:`DATASETS` for the built-in loaders.
      train_x: float32 ``[N_train, *input_shape]`` standardised inputs.
      train_y: int32 ``[N_train]`` labels.
      test_x: float32 ``[N_test, *input_shape]`` inputs, standardised with the
        *training* statistics.
      test_y: int32 ``[N_test]`` labels.
      num_classes: number of classes (logits per example).

    Raises:
      DataError: if dtypes, ranks, lengths or label ranges disagree.
    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int

    def __post_init__(self):
        num_classes = _positive_int(self.num_classes, "num_classes")
        for split in ("train", "test"):
            x = getattr(self, f"{split}_x")
            y = getattr(self, f"{split}_y")
            if not isinstance(x, np.ndarray) or x.dtype != np.float32:
                raise DataError(
                    f"{self.name}: {split}_x has dtype {getattr(x, 'dtype', type(x))}; "
                    "expected a float32 numpy array"
                )
            if not isinstance(y, np.ndarray) or y.dtype != np.int32 or y.ndim != 1:
                raise DataError(
                    f"{self.name}: {split}_y has dtype/shape "
                    f"{getattr(y, 'dtype', type(y))}{getattr(y, 'shape', '')}; "
                    "expected a 1-D int32 numpy array"
                )
            if x.ndim < 2 or x.shape[0] != y.shape[0]:
                raise DataError(
                    f"{self.name}: {split}_x shape {x.shape} and {split}_y shape "
                    f"{y.shape} disagree; expected [N, ...] inputs and [N] labels"
                )
            if y.size and (y.min() < 0 or y.max() >= num_classes):
                raise DataError(
                    f"{self.name}: {split}_y has labels in [{y.min()}, {y.max()}]; "
                    f"expected labels in [0, {num_classes})"
                )
            x.flags.writeable = False
            y.flags.writeable = False
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise DataError(
                f"{self.name}: train input shape {self.train_x.shape[1:]} differs from "
                f"test input shape {self.test_x.shape[1:]}; expected the same"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input example, ``train_x.shape[1:]`` (no batch dim)."""
        return tuple(self.train_x.shape[1:])

    @property
    def num_train(self) -> int:
        """Number of training examples."""
        return int(self.train_x.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test examples."""
        return int(self.test_x.shape[0])


# --------------------------------------------------------------------------
# IDX files (Fashion-MNIST).
# --------------------------------------------------------------------------


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
        raise DataError(
            f"IDX file '{path}' has {len(raw)} bytes; expected at least a 4-byte header"
        )
    zero0, zero1, code, ndim = raw[0], raw[1], raw[2], raw[3]
    if zero0 != 0 or zero1 != 0:
        raise DataError(
            f"IDX file '{path}' has magic bytes {raw[:4].hex()}; expected 0000 then "
            "type code and rank"
        )
    if code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        raise DataError(
            f"IDX file '{path}' has type code 0x{code:02X}; expected one of {allowed}"
        )
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DataError(
            f"IDX file '{path}' is truncated in its header: {len(raw)} bytes for "
            f"rank {ndim}; expected at least {header_len}"
        )
    dims = struct.unpack(f">{ndim}I", raw[4:header_len])
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    actual = len(raw) - header_len
    if actual != expected:
        what = "truncated" if actual < expected else "longer than its header says"
        raise DataError(
            f"IDX file '{path}' is {what}: {actual} data bytes for dims {dims}; "
            f"expected {expected}"
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


@functools.lru_cache(maxsize=2)
def _load_fashion_mnist_cached(data_dir: str) -> Dataset:
    if not os.path.isdir(data_dir):
        raise DataError(
            f"data directory '{data_dir}' does not exist; expected the IDX files of "
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
    train_x, test_x = _standardise_uint8(
        arrays["train_x"], arrays["test_x"], 255.0, "fashion_mnist"
    )
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


# --------------------------------------------------------------------------
# MNIST-1D (generated).
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _load_mnist1d_cached(seed: int, num_samples: int) -> Dataset:
    from mnist1d import data as mnist1d_data  # Imported lazily: it is slow-ish.

    args = mnist1d_data.get_dataset_args()
    args.seed = seed
    args.num_samples = num_samples
    # The generator reseeds NumPy's and Python's global RNGs; put them back.
    np_state = np.random.get_state()
    py_state = random.getstate()
    try:
        generated = mnist1d_data.make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
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

    The generator calls ``np.random.seed`` and ``random.seed``; the global NumPy
    and Python RNG states are saved before and restored after, so callers'
    global random streams are untouched. Results are cached in memory per
    ``(seed, num_samples)`` (4 entries); 10000 samples take about 2 s to make.

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
    seed = _seed(seed)
    num_samples = _positive_int(num_samples, "num_samples")
    if num_samples % 10 or num_samples < 10:
        raise DataError(
            f"num_samples={num_samples} must be a positive multiple of 10 (equal "
            "examples per class)"
        )
    return _load_mnist1d_cached(seed, num_samples)


# --------------------------------------------------------------------------
# scikit-learn digits.
# --------------------------------------------------------------------------


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
    return _load_digits_cached(_seed(seed))


def load_dataset(
    name: str, data_dir: str | os.PathLike | None = None, seed: int = 0
) -> Dataset:
    """Loads one of :data:`DATASETS` by name, with each loader's defaults.

    Args:
      name: ``"mnist1d"``, ``"fashion_mnist"`` or ``"digits"``.
      data_dir: Fashion-MNIST IDX directory (``None``: Debian's default
        location); ignored by the other datasets.
      seed: generation seed for ``"mnist1d"`` (see :func:`load_mnist1d`, 10000
        samples), split seed for ``"digits"``; ignored by ``"fashion_mnist"``,
        whose split is fixed. In ``[0, 2**32)``.

    Returns:
      A :class:`Dataset`; see the per-dataset loaders for shapes.

    Raises:
      DataError: for an unknown name, or any error of the loader.

    Example:
      >>> ds = load_dataset("digits", seed=0)
      >>> ds.train_x.shape, ds.train_x.dtype, ds.num_classes
      ((1438, 8, 8, 1), dtype('float32'), 10)
    """
    if name == "mnist1d":
        return load_mnist1d(seed=seed)
    if name == "fashion_mnist":
        _seed(seed)  # Validated for uniformity, though the split is fixed.
        return load_fashion_mnist(data_dir)
    if name == "digits":
        return load_digits(seed=seed)
    raise DataError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")


# --------------------------------------------------------------------------
# Data order for data-parallel training.
# --------------------------------------------------------------------------


def epoch_permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the training examples in one epoch, fixed by (seed, epoch).

    Args:
      num_examples: training set size ``N`` (examples).
      seed: run seed, a non-negative integer.
      epoch: epoch number (0-based), a non-negative integer.

    Returns:
      int64 ``[N]``, a permutation of ``0..N-1`` drawn from
      ``np.random.default_rng((seed, epoch))``: the same for the same pair,
      independent across epochs and seeds, and independent of any global RNG.

    Raises:
      DataError: if ``num_examples`` is not positive or ``seed``/``epoch`` is
        negative.
    """
    num_examples = _positive_int(num_examples, "num_examples")
    seed = _as_int(seed, "seed")
    epoch = _as_int(epoch, "epoch")
    if seed < 0 or epoch < 0:
        raise DataError(f"seed={seed}, epoch={epoch} must both be non-negative integers")
    rng = np.random.default_rng((seed, epoch))
    return rng.permutation(num_examples).astype(np.int64)


def steps_per_epoch(num_examples: int, num_workers: int, per_worker_batch: int) -> int:
    """Synchronous steps in one epoch of :func:`worker_batch_indices`.

    Each worker owns a shard of ``S = num_examples // num_workers`` examples and
    takes ``S // per_worker_batch`` full batches from it; the remainders (up to
    ``num_workers - 1`` examples of the epoch and up to ``per_worker_batch - 1``
    per shard) are dropped for that epoch. The permutation changes every epoch,
    so no example is dropped systematically.

    Args:
      num_examples: training set size ``N`` (examples).
      num_workers: number of workers ``W``.
      per_worker_batch: examples per worker per step ``B`` (the global batch is
        ``W * B``).

    Returns:
      ``(N // W) // B``, at least 1.

    Raises:
      DataError: if an argument is not a positive integer, or the data are too
        few for one step (``N < W * B``).
    """
    num_examples = _positive_int(num_examples, "num_examples")
    num_workers = _positive_int(num_workers, "num_workers")
    per_worker_batch = _positive_int(per_worker_batch, "per_worker_batch")
    steps = (num_examples // num_workers) // per_worker_batch
    if steps == 0:
        raise DataError(
            f"num_examples={num_examples} is too few for num_workers={num_workers} x "
            f"per_worker_batch={per_worker_batch}; expected num_examples >= "
            f"{num_workers * per_worker_batch} for at least one step per epoch"
        )
    return steps


def worker_batch_indices(
    num_examples: int,
    num_workers: int,
    per_worker_batch: int,
    seed: int,
    epoch: int,
) -> np.ndarray:
    """Example indices of every worker's batch at every step of one epoch.

    With ``perm = epoch_permutation(N, seed, epoch)`` and ``S = N // W``, worker
    ``i`` owns the contiguous shard ``perm[i*S:(i+1)*S]`` and at step ``t`` reads
    its batch ``shard[t*B:(t+1)*B]``. Shards are disjoint, so within an epoch no
    example is seen twice, and the workers see disjoint data as in the
    data-parallel setting of EASGD. ``steps_per_epoch = S // B``; the tail
    ``perm[W*S:]`` and the last ``S % B`` of each shard are dropped (see
    :func:`steps_per_epoch`). When ``N`` is a multiple of ``W * B`` nothing is
    dropped and the epoch covers every example exactly once.

    Args:
      num_examples: training set size ``N`` (examples).
      num_workers: number of workers ``W``.
      per_worker_batch: examples per worker per step ``B``.
      seed: run seed, a non-negative integer.
      epoch: epoch number (0-based), a non-negative integer.

    Returns:
      int64 ``[steps_per_epoch, W, B]``, C-contiguous; ``out[t, i]`` are the
      indices of worker ``i``'s batch at step ``t`` of this epoch.

    Raises:
      DataError: as :func:`steps_per_epoch` and :func:`epoch_permutation`.

    Example:
      >>> idx = worker_batch_indices(12, num_workers=2, per_worker_batch=3, seed=0, epoch=0)
      >>> idx.shape
      (2, 2, 3)

    References:
      Zhang, Choromanska & LeCun, "Deep learning with Elastic Averaging SGD",
      NeurIPS 2015, section 2 (each worker samples from its own data).
    """
    steps = steps_per_epoch(num_examples, num_workers, per_worker_batch)
    perm = epoch_permutation(num_examples, seed, epoch)
    shard = num_examples // num_workers
    used = steps * per_worker_batch
    shards = perm[: num_workers * shard].reshape(num_workers, shard)[:, :used]
    out = shards.reshape(num_workers, steps, per_worker_batch).transpose(1, 0, 2)
    return np.ascontiguousarray(out, dtype=np.int64)


def eval_shards(
    num_examples: int, num_workers: int, eval_batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """A padded layout that evaluates every example exactly once across workers.

    Examples are split into ``W`` contiguous, near-equal ranges (sizes differ by
    at most one; worker ``i`` gets ``N // W + (i < N % W)`` examples, in order).
    Each worker's range is laid out in ``num_batches = ceil(ceil(N / W) / E)``
    batches of ``E`` slots; unused slots hold index 0 with mask ``False``. So
    ``sum(per_example_value[indices] * mask)`` over all axes is the exact total
    over the ``N`` examples for any ``N`` (multiple of ``W`` or not), and the
    exact mean is that sum divided by ``mask.sum() == N``. Padding slots read
    example 0, a valid index, so gathers need no bounds handling.

    Args:
      num_examples: evaluation set size ``N`` (examples).
      num_workers: number of workers ``W``.
      eval_batch: slots per worker per evaluation step ``E``.

    Returns:
      ``(indices, mask)``: ``indices`` int64 ``[W, num_batches, E]``, ``mask``
      bool ``[W, num_batches, E]``; ``indices[mask]`` is ``arange(N)``.

    Raises:
      DataError: if an argument is not a positive integer.

    Example:
      >>> idx, mask = eval_shards(10, num_workers=4, eval_batch=2)
      >>> idx.shape, int(mask.sum())
      ((4, 2, 2), 10)
    """
    num_examples = _positive_int(num_examples, "num_examples")
    num_workers = _positive_int(num_workers, "num_workers")
    eval_batch = _positive_int(eval_batch, "eval_batch")
    per_worker = -(-num_examples // num_workers)  # ceil(N / W)
    num_batches = -(-per_worker // eval_batch)
    slots = num_batches * eval_batch
    sizes = num_examples // num_workers + (np.arange(num_workers) < num_examples % num_workers)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    offsets = np.arange(slots)
    mask = offsets[None, :] < sizes[:, None]  # [W, slots]
    indices = np.where(mask, starts[:, None] + offsets[None, :], 0).astype(np.int64)
    shape = (num_workers, num_batches, eval_batch)
    return indices.reshape(shape), mask.reshape(shape)
