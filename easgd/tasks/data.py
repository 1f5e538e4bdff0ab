"""A classification data set in host memory, and its validation split (NumPy only).

:class:`Dataset` holds standardised float32 inputs and int32 labels, train and
test; :func:`validation_split` says which training examples are held out. The
built-in data sets are the table ``easgd.tasks.datasets`` (their loaders:
``easgd.tasks.loaders``); which examples each worker reads at each step is
``easgd.tasks.batches``. This module imports no JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from easgd._util import checks

_MAX_SEED = 2**32  # np.random.seed and random.seed-compatible range [0, 2**32).


class DataError(ValueError):
  """A bad data input: a missing or malformed file, or an impossible layout.

  Messages are one line that names the bad value and says what is allowed.
  """


# --------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------


def check_positive(value, name: str) -> int:
  """``value`` as a Python int >= 1; DataError otherwise."""
  return checks.integer(name, value, 1, error=DataError)


def check_seed(value, name: str = "seed") -> int:
  """``value`` as a seed in [0, 2**32 - 1]; DataError otherwise."""
  return checks.integer(name, value, 0, _MAX_SEED - 1, error=DataError)


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
    name: dataset name, one of ``easgd.tasks.datasets.DATASETS`` for the built-in loaders.
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
    num_classes = check_positive(self.num_classes, "num_classes")
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


_VALIDATION_STREAM = 0x76616C69  # "vali": the held-out split's own random stream.


def validation_split(num_examples: int, num_held_out: int) -> tuple[np.ndarray, np.ndarray]:
  """Which training examples are held out for validation, and which are trained on.

  The held-out examples are the first ``num_held_out`` entries of a permutation
  drawn from ``np.random.default_rng(SeedSequence(0, spawn_key=(S,)))`` with a
  constant stream ``S``: a seeded choice fixed by the training set's size alone,
  the same for every run seed, independent of :func:`epoch_permutation`. Both
  index sets are returned sorted, so a data set reduced to the training part
  keeps the original order of its examples.

  Args:
    num_examples: the training set's size ``N`` (examples).
    num_held_out: ``n``, examples held out, an integer in ``[1, N - 1]``.

  Returns:
    ``(train_idx, val_idx)``: int64 ``[N - n]`` and ``[n]``, disjoint, together
    ``arange(N)``.

  Raises:
    DataError: ``num_examples`` not positive, or ``num_held_out`` outside
      ``[1, N - 1]`` (at least one example must remain to train on).

  Example:
    >>> train, val = validation_split(10, 3)
    >>> len(train), len(val), sorted(set(train) | set(val)) == list(range(10))
    (7, 3, True)
  """
  num_examples = check_positive(num_examples, "num_examples")
  num_held_out = checks.integer(
      "validation_examples",
      num_held_out,
      1,
      num_examples - 1,
      error=DataError,
      what="examples held out of the training set",
  )
  seq = np.random.SeedSequence(0, spawn_key=(_VALIDATION_STREAM,))
  perm = np.random.default_rng(seq).permutation(num_examples)
  return (
      np.sort(perm[num_held_out:]).astype(np.int64),
      np.sort(perm[:num_held_out]).astype(np.int64),
  )


def with_validation_split(
    dataset: Dataset, num_held_out: int
) -> tuple[Dataset, tuple[np.ndarray, np.ndarray]]:
  """``dataset`` reduced to its training part, and the held-out examples.

  Args:
    dataset: a :class:`Dataset`.
    num_held_out: examples held out of its training set (0: none).

  Returns:
    ``(train_dataset, (val_x, val_y))``: a :class:`Dataset` whose training
    arrays hold only the examples :func:`validation_split` keeps (test split
    unchanged), and the held-out inputs and labels (empty ``[0, ...]`` arrays
    for 0). With 0 the dataset itself is returned.

  Raises:
    DataError: as :func:`validation_split`.
  """
  if num_held_out == 0:
    return dataset, (dataset.train_x[:0], dataset.train_y[:0])
  train_idx, val_idx = validation_split(dataset.num_train, num_held_out)
  reduced = Dataset(
      name=dataset.name,
      train_x=dataset.train_x[train_idx],
      train_y=dataset.train_y[train_idx],
      test_x=dataset.test_x,
      test_y=dataset.test_y,
      num_classes=dataset.num_classes,
  )
  return reduced, (dataset.train_x[val_idx], dataset.train_y[val_idx])
