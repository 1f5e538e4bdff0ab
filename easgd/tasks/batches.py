"""Which examples each worker reads, and how images are cropped (NumPy only).

The index layouts that the trainer gathers batches with:

* :func:`worker_batch_indices`: each epoch is one seeded permutation
  (:func:`epoch_permutation`); global step t of the epoch reads the t-th
  global batch of it, and worker i takes rows i*B..(i+1)*B-1 of that global
  batch, so the examples of a step depend on (seed, epoch, t) and the global
  batch only, never on how it is split over workers, devices or processes.
* :func:`eval_shards`: every evaluation example exactly once across workers,
  padded to a rectangular ``[num_workers, num_batches, eval_batch]`` block with
  a mask, so that masked sums are exact.
* :func:`random_crop` / :func:`center_crop`: the paper's 28x28 crops of
  CIFAR-10 (training crops fixed by (seed, epoch, step), :func:`crop_rng`),
  and :func:`random_flip`, horizontal flips drawn from the same generator.

This module imports no JAX: it runs on the host and hands NumPy index arrays to
the caller, who decides how to place them on devices.
"""

from __future__ import annotations

import numpy as np

from easgd._util import checks
from easgd.tasks.data import DataError

MAX_SEED = 2**32 - 1
"""The largest seed (NumPy's and Python's generators take [0, 2**32))."""


# --------------------------------------------------------------------------
# Image crops (the paper's 28x28 crops of CIFAR-10).
# --------------------------------------------------------------------------

_CROP_STREAM = 0x63726F70  # "crop": spawn key that separates crop draws from data order.


def _crop_size(size, shape) -> int:
  size = checks.integer("crop_size", size, 1, error=DataError)
  if len(shape) < 3:
    raise DataError(
        f"crop_size={size} needs images [..., H, W, C]; got inputs of shape {tuple(shape)}"
    )
  height, width = shape[-3], shape[-2]
  if size > height or size > width:
    raise DataError(
        f"crop_size={size} exceeds the {height}x{width} images; expected "
        f"crop_size <= {min(height, width)}"
    )
  return size


def cropped_shape(input_shape: tuple[int, ...], size: int | None) -> tuple[int, ...]:
  """The shape of one example ``(H, W, C)`` after a ``size x size`` crop.

  Args:
    input_shape: one image's shape ``(H, W, C)`` (``Dataset.input_shape``).
    size: crop side in pixels, or None for no crop.

  Returns:
    ``(size, size, C)``, or ``input_shape`` unchanged when ``size`` is None.

  Raises:
    DataError: if the inputs are not images or ``size`` exceeds H or W.
  """
  input_shape = tuple(input_shape)
  if size is None:
    return input_shape
  size = _crop_size(size, input_shape)
  return (*input_shape[:-3], size, size, input_shape[-1])


def crop_rng(seed: int, epoch: int, step: int) -> np.random.Generator:
  """The generator of the training crops at one step, fixed by (seed, epoch, step).

  ``np.random.default_rng(SeedSequence((seed, epoch, step), spawn_key=(S,)))``
  with a constant ``S``: the same triple gives the same crops (so a resumed run
  repeats them), and the stream is independent of :func:`epoch_permutation`'s
  ``default_rng((seed, epoch))`` and of any global RNG.

  Args:
    seed: run seed, in ``[0, 2**32)``.
    epoch: epoch number, a non-negative integer.
    step: global step number, a non-negative integer.

  Raises:
    DataError: if an argument is out of range.
  """
  seed = checks.integer("seed", seed, 0, MAX_SEED, error=DataError)
  epoch = checks.integer("epoch", epoch, 0, error=DataError)
  step = checks.integer("step", step, 0, error=DataError)
  return np.random.default_rng(
      np.random.SeedSequence((seed, epoch, step), spawn_key=(_CROP_STREAM,))
  )


def random_crop(x: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """Independent uniformly placed ``size x size`` crops of a batch of images.

  Each image ``x[..., :, :, :]`` gets its own top-left corner
  ``(i, j) ~ U{0..H-size} x U{0..W-size}``, drawn from ``rng`` (row offsets
  for all images first, then column offsets, in C order of the leading axes):
  ``out[b] = x[b, i_b:i_b+size, j_b:j_b+size, :]``.

  Args:
    x: images ``[..., H, W, C]`` (any leading axes, e.g. ``[workers, batch]``).
    size: crop side in pixels, ``1 <= size <= min(H, W)``.
    rng: a NumPy generator, e.g. :func:`crop_rng` ``(seed, epoch, step)``.

  Returns:
    A new C-contiguous array ``[..., size, size, C]`` of ``x``'s dtype.

  Raises:
    DataError: if ``x`` is not images or ``size`` is out of range.

  Example:
    >>> x = np.zeros((2, 4, 32, 32, 3), np.float32)
    >>> random_crop(x, 28, crop_rng(seed=0, epoch=1, step=0)).shape
    (2, 4, 28, 28, 3)
  """
  x = np.asarray(x)
  size = _crop_size(size, x.shape)
  lead, (height, width, channels) = x.shape[:-3], x.shape[-3:]
  flat = x.reshape(-1, height, width, channels)
  n = flat.shape[0]
  top = rng.integers(0, height - size + 1, size=n)
  left = rng.integers(0, width - size + 1, size=n)
  offsets = np.arange(size)
  rows = (top[:, None] + offsets)[:, :, None]  # [n, size, 1]
  cols = (left[:, None] + offsets)[:, None, :]  # [n, 1, size]
  out = flat[np.arange(n)[:, None, None], rows, cols]  # [n, size, size, C]
  return out.reshape(*lead, size, size, channels)


def random_flip(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Each image of a batch mirrored left-right with probability 1/2.

  One draw per image, ``flip = rng.integers(0, 2, size=n) == 1`` in C order of
  the leading axes (after any crop drawn from the same ``rng``):
  ``out[b] = x[b, :, ::-1, :]`` where ``flip[b]``, else ``x[b]``.

  Args:
    x: images ``[..., H, W, C]`` (any leading axes, e.g. ``[workers, batch]``).
    rng: a NumPy generator, e.g. :func:`crop_rng` ``(seed, epoch, step)``.

  Returns:
    A new C-contiguous array of ``x``'s shape and dtype.

  Raises:
    DataError: if ``x`` is not images ``[..., H, W, C]``.

  Example:
    >>> x = np.arange(4.0).reshape(1, 1, 4, 1)  # one 1x4 image: 0 1 2 3
    >>> out = random_flip(x, crop_rng(seed=0, epoch=1, step=0))
    >>> out.ravel().tolist() in ([0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0])
    True
  """
  x = np.asarray(x)
  if x.ndim < 3:
    raise DataError(f"random_flip needs images [..., H, W, C]; got inputs of shape {x.shape}")
  flat = x.reshape(-1, *x.shape[-3:])
  flip = rng.integers(0, 2, size=flat.shape[0]) == 1
  out = np.where(flip[:, None, None, None], flat[:, :, ::-1, :], flat)
  return out.reshape(x.shape)


def center_crop(x: np.ndarray, size: int | None) -> np.ndarray:
  """The central ``size x size`` window of every image (the evaluation crop).

  The window starts at row ``(H - size) // 2`` and column ``(W - size) // 2``
  (for 32 -> 28: pixels 2..29).

  Args:
    x: images ``[..., H, W, C]``.
    size: crop side in pixels, ``1 <= size <= min(H, W)``; None returns ``x``.

  Returns:
    ``[..., size, size, C]``, a view of ``x`` (no copy).

  Raises:
    DataError: if ``x`` is not images or ``size`` is out of range.
  """
  if size is None:
    return x
  size = _crop_size(size, np.shape(x))
  top = (x.shape[-3] - size) // 2
  left = (x.shape[-2] - size) // 2
  return x[..., top : top + size, left : left + size, :]


# --------------------------------------------------------------------------
# Data order for data-parallel training.
# --------------------------------------------------------------------------


def crop_transforms(size: int | None, flip: bool = False):
  """A task's ``augment`` and ``eval_transform`` (``easgd.tasks.task.Task``) of images:
  crops and horizontal flips.

  Args:
    size: the square crop's side in pixels, or None (no crop).
    flip: also flip each training image left-right with probability 1/2
      (:func:`random_flip`, drawn from the same generator after the crop).

  Returns:
    ``(augment, eval_transform)``: ``augment((x, y), rng)`` takes a :func:`random_crop`
    of every image of ``x`` [batch, H, W, C] (with ``size``) and then a
    :func:`random_flip` (with ``flip``), ``y`` unchanged;
    ``eval_transform((x, y))`` the :func:`center_crop` (unflipped), both giving
    [batch, size, size, C]; ``eval_transform`` is None without a crop, and
    both are None without either.
  """
  if size is None and not flip:
    return None, None

  def augment(batch, rng):
    x, y = batch
    if size is not None:
      x = random_crop(x, size, rng)
    if flip:
      x = random_flip(x, rng)
    return x, y

  if size is None:
    return augment, None

  def eval_transform(batch):
    x, y = batch
    return center_crop(x, size), y

  return augment, eval_transform


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
  num_examples = checks.integer("num_examples", num_examples, 1, error=DataError)
  seed = checks.integer("seed", seed, 0, error=DataError)
  epoch = checks.integer("epoch", epoch, 0, error=DataError)
  rng = np.random.default_rng((seed, epoch))
  return rng.permutation(num_examples).astype(np.int64)


def steps_per_epoch(num_examples: int, num_workers: int, per_worker_batch: int) -> int:
  """Synchronous steps in one epoch of :func:`worker_batch_indices`.

  An epoch is ``N // G`` global batches of ``G = num_workers * per_worker_batch``
  examples; the last ``N % G`` examples of the epoch's permutation are dropped
  for that epoch. The permutation changes every epoch, so no example is dropped
  systematically. The count depends on the global batch only, not on how it is
  split over workers.

  Args:
    num_examples: training set size ``N`` (examples).
    num_workers: number of workers ``W``.
    per_worker_batch: examples per worker per step ``B`` (the global batch is
      ``G = W * B``).

  Returns:
    ``N // (W * B)``, at least 1.

  Raises:
    DataError: if an argument is not a positive integer, or the data are too
      few for one step (``N < W * B``).
  """
  num_examples = checks.integer("num_examples", num_examples, 1, error=DataError)
  num_workers = checks.integer("num_workers", num_workers, 1, error=DataError)
  per_worker_batch = checks.integer("per_worker_batch", per_worker_batch, 1, error=DataError)
  steps = num_examples // (num_workers * per_worker_batch)
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

  With ``perm = epoch_permutation(N, seed, epoch)`` and the global batch
  ``G = W * B``, global step ``t`` of the epoch reads the examples
  ``perm[t*G:(t+1)*G]``, and worker ``i`` takes rows ``i*B .. (i+1)*B - 1`` of
  that global batch. So the examples of a global step are a function of
  ``(seed, epoch, t)`` and ``G`` only: splitting the same global batch over 1,
  2 or 8 workers (or over any number of devices and processes) changes which
  worker reads an example, never which examples the step sees. Within an
  epoch no example is read twice, and the workers of a step read disjoint
  examples. ``steps_per_epoch = N // G``; the last ``N % G`` examples of the
  permutation are dropped for this epoch (see :func:`steps_per_epoch`).

  Args:
    num_examples: training set size ``N`` (examples).
    num_workers: number of workers ``W``.
    per_worker_batch: examples per worker per step ``B``.
    seed: run seed, a non-negative integer.
    epoch: epoch number (0-based), a non-negative integer.

  Returns:
    int64 ``[steps_per_epoch, W, B]``, C-contiguous; ``out[t, i]`` are the
    indices of worker ``i``'s batch at step ``t`` of this epoch, and
    ``out[t].ravel()`` is the global batch of step ``t``.

  Raises:
    DataError: as :func:`steps_per_epoch` and :func:`epoch_permutation`.

  Example:
    >>> idx = worker_batch_indices(12, num_workers=2, per_worker_batch=3, seed=0, epoch=0)
    >>> idx.shape
    (2, 2, 3)
    >>> bool((idx.reshape(2, 6) == worker_batch_indices(12, 1, 6, 0, 0)[:, 0]).all())
    True

  References:
    Zhang, Choromanska & LeCun, "Deep learning with Elastic Averaging SGD",
    NeurIPS 2015, section 2 (every worker may sample the whole data set; here
    the workers of one step share one global batch, as data-parallel SGD does).
  """
  steps = steps_per_epoch(num_examples, num_workers, per_worker_batch)
  perm = epoch_permutation(num_examples, seed, epoch)
  used = steps * num_workers * per_worker_batch
  out = perm[:used].reshape(steps, num_workers, per_worker_batch)
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
  num_examples = checks.integer("num_examples", num_examples, 1, error=DataError)
  num_workers = checks.integer("num_workers", num_workers, 1, error=DataError)
  eval_batch = checks.integer("eval_batch", eval_batch, 1, error=DataError)
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
