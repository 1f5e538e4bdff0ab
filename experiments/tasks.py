"""Tasks of the experiments that the built-in data sets and models do not name.

Run from the repository root, a config names them by import path, e.g.
``TrainConfig(task="experiments.tasks:mnist1d_variant", task_args=("variant=cnn_bn",))``
(the working directory is searched first, ``easgd.tasks.task.load_task``):

  :func:`mnist1d_variant`  MNIST-1D with one of :data:`VARIANTS`.
  :func:`dropout_mlp`      MNIST-1D with an MLP that drops hidden units in
                           training (each worker draws its own masks).
  :func:`fashion_subset`   a fixed subset of Fashion-MNIST with random crops
                           and flips (the schedule question at CPU scale).

The MNIST-1D tasks serve the question "is pmean SGD over p workers one worker
with a p times larger batch?" where the answer is not an identity
(experiments/protocol_bigbatch.py); the Fashion-MNIST subset the question "why
does accuracy drop from 1 to 2 GPUs at the same epochs?"
(experiments/protocol_schedule.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from easgd.settings import builtin_tasks
from easgd.tasks import datasets, models
from easgd.tasks.task import Task


class DropoutMLP(nn.Module):
  """``models.MLP`` with dropout after each hidden layer in training.

  ``h_k = drop(relu(W_k h_{k-1} + b_k))``, ``drop`` zeroing each unit with
  probability ``rate`` and scaling the others by ``1 / (1 - rate)``
  (``flax.linen.Dropout``, Srivastava et al. 2014); evaluation keeps every
  unit.

  Attributes:
    num_classes: logits per example.
    hidden: widths of the hidden layers (units).
    rate: drop probability of a hidden unit in training, in [0, 1).
  """

  num_classes: int = 10
  hidden: tuple[int, ...] = (256, 256)
  rate: float = 0.5

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """float32 logits ``[B, num_classes]`` of inputs ``[B, ...]`` (flattened);
    ``train=True`` needs a ``'dropout'`` rng."""
    x = x.reshape((x.shape[0], -1))
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
      x = nn.Dropout(self.rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)


def _mnist1d(model: nn.Module, name: str, seed: int) -> Task:
  ds = datasets.load_dataset("mnist1d", seed=seed)
  return builtin_tasks.classifier_task(
      model,
      (ds.train_x, ds.train_y),
      (ds.test_x, ds.test_y),
      name=name,
      info=dict(dataset="mnist1d", num_classes=ds.num_classes),
  )


def dropout_mlp(seed: int = 0, rate: float = 0.5) -> Task:
  """MNIST-1D (generated from ``seed``) with :class:`DropoutMLP`.

  Args:
    seed: the run's seed (MNIST-1D's generator seed), in [0, 2**32).
    rate: the drop probability, in [0, 1).

  Returns:
    The task; its loss is the mean cross-entropy of a worker's mini-batch
    with the worker's own dropout masks (drawn from the worker's key of the
    step).

  Raises:
    ValueError: ``rate`` outside [0, 1).
  """
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"rate={rate!r}: the drop probability must lie in [0, 1)")
  return _mnist1d(DropoutMLP(rate=rate), f"mnist1d/dropout_mlp({rate:g})", seed)


VARIANTS = {
    "cnn": "the small CNN, mean loss (pmean SGD is one big batch: the control)",
    "cnn_bn": "the CNN with BatchNorm (each worker normalises its own mini-batch)",
    "dropout": "DropoutMLP, rate 0.5 (each worker draws its own masks)",
}
"""The variants of :func:`mnist1d_variant`, with what makes each one (not) one batch."""


def mnist1d_variant(seed: int = 0, variant: str = "cnn") -> Task:
  """MNIST-1D (generated from ``seed``) with the model and loss of ``variant``.

  Args:
    seed: the run's seed (MNIST-1D's generator seed), in [0, 2**32).
    variant: one of :data:`VARIANTS`.

  Returns:
    The task.

  Raises:
    ValueError: an unknown ``variant`` (one line naming the allowed ones).
  """
  if variant == "dropout":
    return dropout_mlp(seed)
  if variant in ("cnn", "cnn_bn"):
    return builtin_tasks.builtin_task("mnist1d", variant, seed=seed)
  raise ValueError(f"variant={variant!r}; allowed: {', '.join(VARIANTS)}")


def fashion_subset(
    train_examples: int = 10000,
    test_examples: int = 5000,
    model: str = "cnn_bn",
    crop_size: int | None = 24,
    random_flip: bool = True,
) -> Task:
  """A fixed subset of Fashion-MNIST (Debian's IDX files) as a classifier task.

  The first ``train_examples`` of a fixed permutation of the 60000 training
  images (NumPy ``default_rng(0)``, the same for every run and seed) and the
  first ``test_examples`` of the 10000 test images, standardised as the
  built-in loader does; random ``crop_size`` crops and horizontal flips for
  training, drawn from (seed, epoch, step) (``easgd.tasks.batches``), centre
  crops for evaluation.

  Args:
    train_examples: training images kept, in [1, 60000] (a protocol holds its
      validation examples out of them).
    test_examples: test images kept, in [1, 10000].
    model: one of ``easgd.tasks.names.MODELS`` that takes 28x28x1 images.
    crop_size: the crops' side in pixels, or None.
    random_flip: random horizontal flips of the training images.

  Returns:
    The task (its data are the same for every seed).

  Raises:
    ValueError: a count out of range (one line naming it).
    easgd.tasks.data.DataError: the IDX files are missing.
  """
  ds = datasets.load_dataset("fashion_mnist")
  for name, n, most in (
      ("train_examples", train_examples, len(ds.train_y)),
      ("test_examples", test_examples, len(ds.test_y)),
  ):
    if not isinstance(n, int) or not 1 <= n <= most:
      raise ValueError(f"{name}={n!r}; allowed: an integer in [1, {most}]")
  keep = np.random.default_rng(0).permutation(len(ds.train_y))[:train_examples]
  net = models.make_model(model, ds.num_classes)
  shape = ds.input_shape if crop_size is None else (crop_size, crop_size, ds.input_shape[-1])
  return builtin_tasks.classifier_task(
      net,
      (ds.train_x[keep], ds.train_y[keep]),
      (ds.test_x[:test_examples], ds.test_y[:test_examples]),
      name=f"fashion_mnist[{train_examples}]/{model}",
      input_shape=shape,
      crop_size=crop_size,
      random_flip=random_flip,
      info=dict(dataset="fashion_mnist", model=model, num_classes=ds.num_classes),
  )
