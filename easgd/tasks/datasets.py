"""The built-in data sets: one table, the one place that names them.

Each row of :data:`TABLE` is a :class:`DatasetSpec`: its loader, its inputs'
shape and classes, the models that take them, and what it reads of
``data_dir``. The config's ``dataset`` and ``data_dir`` (allowed values, help,
checks), ``easgd sweep`` and the built-in task (``easgd.settings.builtin_tasks``)
follow from the rows: adding a data set is its loader (``easgd.tasks.loaders``)
and its row. Imports no JAX.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

from easgd._util import checks
from easgd.tasks import loaders
from easgd.tasks.data import DataError, Dataset, check_seed


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """One built-in data set.

  Attributes:
    name: the name in configs and on the command line.
    load: ``load(data_dir, seed) -> easgd.tasks.data.Dataset`` (seed: a Python
      int in [0, 2**32 - 1]).
    summary: where its data come from, for the help of ``dataset``.
    input_shape: one example's input shape (of the files the loader expects).
    num_classes: classes (logits per example).
    models: the names of ``easgd.tasks.names.MODELS`` that take its inputs.
    kind: what one input is; ``"images"`` ([H, W, C]) are what ``crop_size``
      crops.
    data_dir: what ``data_dir`` names for it (after "directory of"); None: it
      reads no ``data_dir`` (generated or shipped).
    needs_data_dir: ``data_dir`` is required (the files are never downloaded).
    seeded_split: its train/test split is a permutation drawn from the seed
      (the same examples for every seed), so one seed's test examples are
      another's training examples; otherwise generated anew per seed or fixed.
  """

  name: str
  load: Callable[[str | os.PathLike | None, int], Dataset]
  summary: str
  input_shape: tuple[int, ...]
  num_classes: int
  models: tuple[str, ...]
  kind: str = "images"
  data_dir: str | None = None
  needs_data_dir: bool = False
  seeded_split: bool = False


TABLE: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec(
            "mnist1d",
            lambda data_dir, seed: loaders.load_mnist1d(seed=seed),
            "generated locally",
            (40, 1),
            10,
            ("mlp", "cnn", "cnn_bn"),
            kind="1-D signals",
        ),
        DatasetSpec(
            "fashion_mnist",
            lambda data_dir, seed: loaders.load_fashion_mnist(data_dir),
            "Debian's IDX files",
            (28, 28, 1),
            10,
            ("mlp", "cnn", "cnn_bn", "cifar"),
            data_dir="the Fashion-MNIST IDX files (None: the Debian location "
            f"{loaders.DEFAULT_FASHION_MNIST_DIR})",
        ),
        DatasetSpec(
            "digits",
            lambda data_dir, seed: loaders.load_digits(seed=seed),
            "scikit-learn's 8x8 digits",
            (8, 8, 1),
            10,
            ("mlp", "cnn", "cnn_bn"),
            seeded_split=True,
        ),
        DatasetSpec(
            "cifar10",
            lambda data_dir, seed: loaders.load_cifar10(data_dir),
            "the CIFAR-10 python batches in data_dir; never downloaded",
            (32, 32, 3),
            10,
            ("mlp", "cnn", "cnn_bn", "cifar"),
            data_dir="the CIFAR-10 python batches",
            needs_data_dir=True,
        ),
    )
}

DATASETS = tuple(TABLE)
"""Names accepted by :func:`load_dataset`, in the table's order."""


def reads_data_dir(name: str) -> bool:
  """Whether data set ``name`` reads ``data_dir`` (False for an unknown name)."""
  spec = TABLE.get(name) if isinstance(name, str) else None
  return spec is not None and spec.data_dir is not None


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, seed: int = 0) -> Dataset:
  """Loads the data set ``name`` of :data:`TABLE` with its loader's defaults.

  Args:
    name: one of :data:`DATASETS`.
    data_dir: the directory of its files (``DatasetSpec.data_dir``); ignored
      by the data sets that read none.
    seed: in [0, 2**32); MNIST-1D's generator seed, digits' split seed, ignored
      by the fixed splits (checked for every data set).

  Returns:
    An ``easgd.tasks.data.Dataset`` (shapes: the loaders, ``easgd.tasks.loaders``).

  Raises:
    DataError: an unknown name, a seed out of range, or any error of the loader.

  Example:
    >>> ds = load_dataset("digits", seed=0)
    >>> ds.train_x.shape, ds.train_x.dtype, ds.num_classes
    ((1438, 8, 8, 1), dtype('float32'), 10)
  """
  checks.choice("dataset", name, DATASETS, error=DataError)
  return TABLE[name].load(data_dir, check_seed(seed))
