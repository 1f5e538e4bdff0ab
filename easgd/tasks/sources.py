"""Random-access data sources: what a task's data may be (``easgd.tasks.task``).

A source has ``__len__`` and ``take(indices)``: the examples at integer
indices of any shape, stacked (leaves ``[*indices.shape, ...]``). NumPy arrays
(a pytree of arrays of one length, e.g. ``(x, y)``) are an
:class:`ArraySource`; any other object with ``__len__`` and ``__getitem__``
whose items are arrays or pytrees of arrays (a ``grain.MapDataset``, a Hugging
Face ``datasets.Dataset`` in NumPy format) an :class:`ItemSource`, whose
``take`` reads the items one by one and stacks them into exactly the arrays
that indexing arrays of the same rows gives; :class:`Subset` is the examples
of a source at given indices (the held-out validation part). Which rows a
worker reads at each step is ``easgd.tasks.batches``'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Batch = Any  # a pytree of arrays whose leaves share their leading axes


class TaskError(ValueError):
  """A task, its factory or its data cannot be used; one line naming what and why.

  Raised for data here (a source that is not arrays, an unreadable item) and
  for the task itself in ``easgd.tasks.task``, which exports it."""


def _first_line(e: BaseException) -> str:
  text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _tree():
  import jax  # noqa: PLC0415 (sources import no JAX until used)

  return jax.tree_util


def _numeric(leaf, what: str) -> np.ndarray:
  """``leaf`` as a NumPy array of numbers or booleans; TaskError otherwise."""
  try:
    arr = np.asarray(leaf)
  except Exception as e:  # noqa: BLE001 (a user's item: one line)
    raise TaskError(f"{what} is not an array ({_first_line(e)})") from None
  if arr.dtype.kind not in "biuf":
    raise TaskError(
        f"{what} is not an array of numbers (dtype {arr.dtype}, from {type(leaf).__name__}); "
        "allowed: items that are arrays or pytrees of numeric arrays"
    )
  return arr


class ArraySource:
  """Random-access rows of a pytree of NumPy arrays of one length.

  Args:
    arrays: a pytree (tuple, list, dict) of arrays ``[N, ...]``, e.g.
      ``(x, y)``; each leaf becomes a read-only NumPy array.
    what: how messages name the source (e.g. ``"train"``).

  Raises:
    TaskError: a leaf that is not a numeric array, no leaves, leaves of
      different lengths, or an empty source.
  """

  def __init__(self, arrays, what: str = "source"):
    tu = _tree()
    leaves, self.treedef = tu.tree_flatten(arrays)
    if not leaves:
      raise TaskError(f"{what} data holds no arrays; give e.g. (x, y) of NumPy arrays")
    self.leaves = []
    for i, leaf in enumerate(leaves):
      arr = _numeric(leaf, f"{what} data leaf {i}")
      if arr.ndim == 0:
        raise TaskError(f"{what} data leaf {i} is a scalar; expected an array [N, ...]")
      self.leaves.append(arr)
    lengths = {len(a) for a in self.leaves}
    if len(lengths) > 1:
      raise TaskError(
          f"{what} data arrays have different lengths {sorted(lengths)}; "
          "expected one length N (one row per example)"
      )
    if not lengths or lengths == {0}:
      raise TaskError(f"{what} data has no examples")
    self.what = what

  @property
  def arrays(self):
    """The pytree of arrays."""
    return self.treedef.unflatten(self.leaves)

  def __len__(self) -> int:
    return len(self.leaves[0])

  def __getitem__(self, index):
    return self.treedef.unflatten([a[index] for a in self.leaves])

  def take(self, indices: np.ndarray):
    """The rows at integer ``indices`` of any shape: leaves ``[*indices.shape, ...]``."""
    return self.treedef.unflatten([a[indices] for a in self.leaves])


class Subset:
  """The examples of a source at given indices (e.g. the held-out validation part).

  Args:
    source: a source (:func:`as_source`).
    indices: int ``[n]`` indices into it.
  """

  def __init__(self, source, indices: np.ndarray):
    self.source = source
    self.indices = np.asarray(indices, np.int64)

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, index):
    return self.source[int(self.indices[index])]

  def take(self, indices: np.ndarray):
    """The rows at ``indices`` (into this subset)."""
    return take(self.source, self.indices[np.asarray(indices)])


class ItemSource:
  """A user's random-access object (``__len__``, ``__getitem__``) as a source.

  :meth:`take` reads the items one by one and stacks them, so the batch equals
  what indexing arrays of the same rows gives, bit for bit.
  """

  def __init__(self, source, what: str = "source"):
    self.source = source
    self.what = what
    try:
      n = len(source)
    except Exception as e:  # noqa: BLE001
      raise TaskError(f"{what} data: len() fails ({_first_line(e)})") from None
    if not isinstance(n, (int, np.integer)) or n < 1:
      raise TaskError(f"{what} data has {n!r} examples; expected at least one")
    self._len = int(n)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index):
    return self.source[int(index)]

  def _item(self, i: int):
    try:
      item = self.source[int(i)]
    except Exception as e:  # noqa: BLE001 (a user's source: one line)
      raise TaskError(f"{self.what} data: item {i} cannot be read ({_first_line(e)})") from None
    leaves, treedef = _tree().tree_flatten(item)
    if not leaves:
      raise TaskError(f"{self.what} data: item {i} holds no arrays (got {type(item).__name__})")
    return [_numeric(leaf, f"{self.what} data item {i}") for leaf in leaves], treedef

  def take(self, indices: np.ndarray):
    """The items at ``indices`` stacked: leaves ``[*indices.shape, *item_shape]``.

    Raises:
      TaskError: an item that cannot be read or is not an array (or pytree of
        arrays), or items whose structure, shapes or dtypes differ.
    """
    indices = np.asarray(indices)
    flat = indices.reshape(-1)
    first, treedef = self._item(int(flat[0]))
    columns = [[leaf] for leaf in first]
    for i in flat[1:]:
      leaves, td = self._item(int(i))
      if td != treedef or any(
          a.shape != b.shape or a.dtype != b.dtype for a, b in zip(leaves, first)
      ):
        raise TaskError(
            f"{self.what} data: item {int(i)} has structure/shapes "
            f"{[(a.shape, str(a.dtype)) for a in leaves]}, item {int(flat[0])} has "
            f"{[(a.shape, str(a.dtype)) for a in first]}; items must all have the same "
            "shapes and dtypes (pad them to one length)"
        )
      for column, leaf in zip(columns, leaves):
        column.append(leaf)
    return treedef.unflatten([np.stack(c).reshape(*indices.shape, *c[0].shape) for c in columns])


def _is_array_tree(data) -> bool:
  if isinstance(data, np.ndarray):
    return True
  if isinstance(data, (tuple, list)):
    return bool(data) and all(_is_array_tree(d) for d in data)
  if isinstance(data, dict):
    return bool(data) and all(_is_array_tree(d) for d in data.values())
  return False


def as_source(data, what: str = "source"):
  """``data`` as a random-access source with ``take(indices)``.

  Args:
    data: a pytree of NumPy arrays of one length (``(x, y)``, a dict), an
      existing source, or any object with ``__len__`` and ``__getitem__``.
    what: how messages name it ("train", "test", "validation").

  Returns:
    An :class:`ArraySource`, the source itself, or an :class:`ItemSource`.

  Raises:
    TaskError: none of these.
  """
  if isinstance(data, (ArraySource, Subset, ItemSource)):
    return data
  if _is_array_tree(data):
    return ArraySource(data, what)
  if hasattr(data, "__len__") and hasattr(data, "__getitem__") and not isinstance(data, str):
    return ItemSource(data, what)
  raise TaskError(
      f"{what} data is a {type(data).__name__}; allowed: NumPy arrays (e.g. (x, y)) or "
      "an object with __len__ and __getitem__ whose items are arrays"
  )


def take(source, indices) -> Batch:
  """The examples of ``source`` at integer ``indices`` (any shape), stacked.

  Args:
    source: a source of :func:`as_source`.
    indices: int array ``[...]``.

  Returns:
    The batch: each leaf ``[*indices.shape, *example_shape]``.

  Raises:
    TaskError: from an item source (:meth:`ItemSource.take`).
  """
  return source.take(np.asarray(indices))
