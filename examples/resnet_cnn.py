"""A small ResNet with BatchNorm on images from an ``.npz`` file, as an easgd task.

A user's own model and data (not the package's built-ins), written as one
factory, :func:`make_task`, that follows the package's BatchNorm policy
(``easgd.tasks.models``):

* training: every worker normalises with its own mini-batch's statistics
  (train mode; the ``batch_stats`` Flax returns are discarded, so no
  BatchNorm state is trained, exchanged or checkpointed);
* evaluation: the center is an average of workers' parameters, so no
  worker's statistics belong to it. Before each evaluation the task's
  ``center_state(params, batch, axis_name)`` recomputes them from the center
  itself: one train-mode pass with BatchNorm momentum 0 over the run's
  ``bn_stats_examples`` fixed training examples, the moments pooled across
  workers over ``axis_name`` (``easgd.tasks.models.compute_batch_stats``,
  which clones the module with ``bn_momentum=0.0`` and ``bn_axis_name``:
  :class:`ResNet` has those two fields for it), and ``evaluate`` normalises
  with them.

The file holds ``x_train [N, H, W(, C)]``, ``y_train [N]`` (integer classes
``0..K-1``), ``x_test``, ``y_test``; the images are standardised with the
training images' per-channel mean and standard deviation. With ``crop_size``
the training images are random ``crop_size x crop_size`` crops (fixed by
seed, epoch and step, ``augment``) and evaluated images their centre crops.

Run it from the repository root (``examples/make_data.py`` writes the
``.npz`` from scikit-learn's digits or the local Fashion-MNIST files)::

  python examples/make_data.py images --source fashion_mnist \\
      --train-examples 4096 --test-examples 1024 --out runs/data/fashion_4k.npz
  easgd train --task examples.resnet_cnn:make_task \\
      --task-arg path=runs/data/fashion_4k.npz --task-arg crop_size=24 \\
      --workdir runs/resnet_cnn --algorithm easgd --num-workers 4 \\
      --global-batch-size 128 --num-epochs 4 --learning-rate 0.1 --tau 4 \\
      --bn-stats-examples 1024

(``examples/README.md``: 71.97% test accuracy after 4 epochs;
``examples/protocol_resnet.py`` compares methods on it with ``easgd
protocol``, on whole images: the protocol refuses a task with ``augment``.)

``--task-arg`` values: ``path`` (required), ``width``, ``blocks``,
``crop_size`` (:func:`make_task`). ``easgd compare --task ...`` takes the
same flags; ``--bn-stats-examples`` sets how many training examples the
center's statistics use.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from easgd.tasks import batches, models
from easgd.tasks.sources import TaskError
from easgd.tasks.task import Task

KEYS = ("x_train", "y_train", "x_test", "y_test")


class ResNet(nn.Module):
  """A small ResNet: a 3x3 stem, one residual block per entry of ``features``, logits.

  Stem: conv 3x3 (``features[0]`` channels) -> BatchNorm -> ReLU. Block ``i``
  (stride 1 for the first, 2 after): ``relu(s(x) + BN(conv3(relu(BN(conv3(x))))))``
  with ``s`` the identity, or a strided 1x1 conv and BatchNorm where the
  shape changes. Then the global average over positions and
  ``Dense(num_classes)``. Convolutions before a BatchNorm have no bias.

  BatchNorm (over batch and spatial positions, per channel) uses the batch's
  statistics with ``train=True`` and ``batch_stats`` with ``train=False``;
  ``batch_norm``, ``bn_momentum`` and ``bn_axis_name`` are the fields through
  which the package's :func:`easgd.tasks.models.compute_batch_stats`
  computes the center's exact statistics (pooled over a mapped axis).

  Attributes:
    num_classes: logits per example.
    features: channels of each residual block (e.g. ``(16, 32, 64)``: 28x28
      -> 28, 14, 7 positions).
    batch_norm: True: declares BatchNorm to the package
      (``easgd.tasks.models.has_batch_norm``).
    bn_momentum: running-average momentum, used only when a caller keeps
      ``batch_stats`` mutable in train mode (``compute_batch_stats`` sets 0).
    bn_axis_name: in train mode, moments averaged over this mapped axis
      (``compute_batch_stats`` sets it); None: each call's own batch.
  """

  num_classes: int = 10
  features: tuple[int, ...] = (16, 32, 64)
  batch_norm: bool = True
  bn_momentum: float = 0.99
  bn_axis_name: Any = None

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """float ``[B, H, W, C]`` images -> float32 ``[B, num_classes]`` logits."""
    norm = functools.partial(
        nn.BatchNorm,
        use_running_average=not train,
        momentum=self.bn_momentum,
        axis_name=self.bn_axis_name,
        use_fast_variance=False,  # var = mean((h - mean)^2), as the package's CNN
    )
    conv = functools.partial(nn.Conv, padding="SAME", use_bias=False)
    x = nn.relu(norm()(conv(self.features[0], (3, 3))(x)))
    for i, width in enumerate(self.features):
      stride = (1, 1) if i == 0 else (2, 2)
      h = nn.relu(norm()(conv(width, (3, 3), strides=stride)(x)))
      h = norm()(conv(width, (3, 3))(h))
      if stride != (1, 1) or x.shape[-1] != width:
        x = norm()(conv(width, (1, 1), strides=stride)(x))
      x = nn.relu(x + h)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes)(x).astype(jnp.float32)


def load_npz(path) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], int]:
  """``((x_train, y_train), (x_test, y_test), num_classes)`` of an ``.npz`` file.

  Images become float32 ``[N, H, W, C]`` standardised with the training
  images' per-channel mean and standard deviation; labels int32.

  Raises:
    TaskError: a missing or unreadable file, a missing key, images not
      ``[N, H, W]`` or ``[N, H, W, C]``, labels not integer ``[N]`` classes
      ``>= 0``, or train and test images of different shapes (one line).
  """
  if not isinstance(path, str) or not path:
    raise TaskError(f"path={path!r}: give the .npz file, --task-arg path=FILE.npz")
  if not os.path.isfile(path):
    raise TaskError(f"path={path!r} is not a file; give an .npz with {', '.join(KEYS)}")
  try:
    with np.load(path, allow_pickle=False) as f:
      missing = [k for k in KEYS if k not in f.files]
      if missing:
        raise TaskError(
            f"path={path!r} has no {missing[0]!r} (it holds {sorted(f.files)}); "
            f"expected {', '.join(KEYS)}"
        )
      arrays = {k: np.asarray(f[k]) for k in KEYS}
  except TaskError:
    raise
  except Exception as e:  # noqa: BLE001 (a user's file: one line)
    raise TaskError(f"path={path!r} is not a readable .npz ({type(e).__name__}: {e})") from None
  splits = []
  for split in ("train", "test"):
    x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
    if x.ndim == 3:
      x = x[..., None]
    if x.ndim != 4 or x.dtype.kind not in "biuf":
      raise TaskError(
          f"path={path!r}: x_{split} has shape {x.shape} ({x.dtype}); expected numeric "
          "images [N, H, W] or [N, H, W, C]"
      )
    if y.shape != (len(x),) or y.dtype.kind not in "iu" or (len(y) and y.min() < 0):
      raise TaskError(
          f"path={path!r}: y_{split} has shape {y.shape} ({y.dtype}); expected integer "
          f"classes >= 0, shape ({len(x)},)"
      )
    if len(x) == 0:
      raise TaskError(f"path={path!r}: x_{split} has no images")
    splits.append((x.astype(np.float32), y.astype(np.int32)))
  (x_train, y_train), (x_test, y_test) = splits
  if x_train.shape[1:] != x_test.shape[1:]:
    raise TaskError(
        f"path={path!r}: train images {x_train.shape[1:]} and test images "
        f"{x_test.shape[1:]} differ in shape"
    )
  mean = x_train.mean(axis=(0, 1, 2), dtype=np.float64)
  std = np.maximum(x_train.std(axis=(0, 1, 2), dtype=np.float64), 1e-6)
  standard = lambda x: ((x - mean) / std).astype(np.float32)
  num_classes = int(max(y_train.max(), y_test.max())) + 1
  return (standard(x_train), y_train), (standard(x_test), y_test), num_classes


def make_task(
    path: str | None = None, width: int = 16, blocks: int = 3, crop_size: int | None = None
) -> Task:
  """The ResNet of :class:`ResNet` on the images of ``path`` as a task.

  Args:
    path: the ``.npz`` (``x_train, y_train, x_test, y_test``; module docstring).
    width: channels of the first block; block ``i`` has ``width * 2**i``.
    blocks: residual blocks (1 to 4; each after the first halves the side).
    crop_size: random training crops and centre evaluation crops of this
      side (pixels); None: whole images.

  Returns:
    The task (``center_state`` set: ``summary.json`` records
    ``batch_norm: true``; ``info``: features, classes, input shape).

  Raises:
    TaskError: a bad file (:func:`load_npz`), a width or block count out of
      range, or a crop larger than the images (one line).
  """
  for name, value, low, high in (("width", width, 1, 1024), ("blocks", blocks, 1, 4)):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
      raise TaskError(f"{name}={value!r} must be an integer in [{low}, {high}]")
  (x_train, y_train), (x_test, y_test), num_classes = load_npz(path)
  shape = tuple(x_train.shape[1:])
  if crop_size is not None:
    if isinstance(crop_size, bool) or not isinstance(crop_size, int):
      raise TaskError(f"crop_size={crop_size!r} must be an integer number of pixels or null")
    if not 1 <= crop_size <= min(shape[:2]):
      raise TaskError(
          f"crop_size={crop_size} must be in [1, {min(shape[:2])}] for images {shape[:2]}"
      )
    shape = (crop_size, crop_size, shape[2])
  model = ResNet(num_classes, tuple(width * 2**i for i in range(blocks)))

  def init(key):
    return models.init_params(model, shape, key)

  def loss(params, batch, key):
    del key  # no dropout
    x, y = batch
    # the worker's own mini-batch statistics; the updated batch_stats are dropped
    logits, _ = model.apply({"params": params}, x, train=True, mutable=["batch_stats"])
    return models.cross_entropy_loss(logits, y)

  def center_state(params, batch, axis_name):
    return models.compute_batch_stats(model, params, batch[0], axis_name)

  def evaluate(params, batch, batch_stats):
    x, y = batch
    logits = model.apply({"params": params, "batch_stats": batch_stats}, x, train=False)
    loss_b, correct_b = models.per_example_stats(logits, y)
    return {"loss": loss_b, "correct": correct_b}

  augment, eval_transform = batches.crop_transforms(crop_size)

  return Task(
      name="resnet_cnn",
      init=init,
      loss=loss,
      evaluate=evaluate,
      train=(x_train, y_train),
      test=(x_test, y_test),
      augment=augment,
      eval_transform=eval_transform,
      center_state=center_state,
      mean_of_examples=False,  # BatchNorm couples a worker's examples
      info=dict(
          model="ResNet",
          features=list(model.features),
          num_classes=num_classes,
          input_shape=list(shape),
      ),
  )
