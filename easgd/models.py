"""Flax classifiers (MLP, CNN, the paper's CIFAR-10 net) and the trainer's loss helpers.

All models are stateless (no batch norm), so a model's variables are exactly
its ``params`` pytree: that pytree is what EASGD workers hold and what the
elastic force pulls towards the center. ``train`` is accepted by every
``__call__`` for a uniform interface; only :class:`CifarNet` uses it (dropout,
which then needs a ``'dropout'`` rng).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = [
    "CNN",
    "CifarNet",
    "MLP",
    "MODELS",
    "ModelError",
    "count_params",
    "cross_entropy_loss",
    "init_params",
    "make_model",
    "param_bytes",
    "per_example_stats",
]

MODELS = ("mlp", "cnn", "cifar")
"""Names accepted by :func:`make_model`."""

Params = Any  # A pytree of float32 arrays (Flax's ``variables['params']``).


class ModelError(ValueError):
    """A bad model choice or an input the model cannot take; one-line message."""


def _positive_int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise ModelError(f"{name}={value!r} is a bool; expected a positive integer")
    try:
        value = operator.index(value)
    except TypeError:
        raise ModelError(
            f"{name}={value!r} has type {type(value).__name__}; expected a positive integer"
        ) from None
    if value < 1:
        raise ModelError(f"{name}={value} must be a positive integer (>= 1)")
    return value


class MLP(nn.Module):
    """Multilayer perceptron: flatten, ReLU hidden layers, linear logits.

    ``h_0 = flatten(x)``, ``h_k = relu(W_k h_{k-1} + b_k)`` for each hidden
    width, ``logits = W_out h_K + b_out``.

    Attributes:
      num_classes: logits per example.
      hidden: widths of the hidden layers (units); ``()`` gives a linear model.
    """

    num_classes: int = 10
    hidden: tuple[int, ...] = (256, 256)

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Computes logits.

        Args:
          x: float ``[B, ...]`` inputs, any trailing shape (flattened).
          train: unused (the model has no dropout or batch norm).

        Returns:
          float32 ``[B, num_classes]`` logits.

        Raises:
          ModelError: if ``x`` has no batch dimension.
        """
        del train
        if x.ndim < 2:
            raise ModelError(f"MLP input has shape {x.shape}; expected [B, ...] with ndim >= 2")
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_classes)(x)


class CNN(nn.Module):
    """Small convnet for 2-D images ``[B, H, W, C]`` or 1-D signals ``[B, L, C]``.

    For each entry of ``features``: conv (``SAME`` padding; 3x3 for images,
    width 5 for signals), ReLU, max-pool (window 2, stride 2 per spatial axis).
    Then flatten, ``Dense(dense)`` + ReLU, ``Dense(num_classes)`` logits. The
    convolution dimensionality is read from ``x.ndim`` (4: images, 3: signals),
    so one model definition serves Fashion-MNIST ``28x28`` (-> 14 -> 7),
    digits ``8x8`` (-> 4 -> 2) and MNIST-1D length 40 (-> 20 -> 10).

    Attributes:
      num_classes: logits per example.
      features: output channels of each conv block.
      dense: width of the hidden dense layer (units).
    """

    num_classes: int = 10
    features: tuple[int, ...] = (16, 32)
    dense: int = 128

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Computes logits.

        Args:
          x: float ``[B, H, W, C]`` images or ``[B, L, C]`` signals (channels last).
          train: unused (the model has no dropout or batch norm).

        Returns:
          float32 ``[B, num_classes]`` logits.

        Raises:
          ModelError: if ``x`` is not rank 3 or 4, or a spatial size falls below
            2 before a pooling layer (too many conv blocks for the input).
        """
        del train
        if x.ndim == 4:
            kernel, window = (3, 3), (2, 2)
        elif x.ndim == 3:
            kernel, window = (5,), (2,)
        else:
            raise ModelError(
                f"CNN input has shape {x.shape}; expected images [B, H, W, C] or "
                "signals [B, L, C]"
            )
        for block, width in enumerate(self.features):
            x = nn.relu(nn.Conv(width, kernel_size=kernel, padding="SAME")(x))
            spatial = x.shape[1:-1]
            if min(spatial) < 2:
                raise ModelError(
                    f"CNN block {block} has spatial size {spatial}; expected >= 2 per "
                    f"axis to pool; use fewer than {len(self.features)} conv blocks"
                )
            x = nn.max_pool(x, window_shape=window, strides=window, padding="VALID")
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.dense)(x))
        return nn.Dense(self.num_classes)(x)


class CifarNet(nn.Module):
    """The 7-layer CIFAR-10 convnet of the EASGD paper, Section 5.1.

    In the paper's notation (channels, spatial size), for 28x28 crops:
    ``(3,28) C(64,24) P(64,12) C(128,8) P(128,4) C(64,2) D(256,1) S(10,1)``:

    ====================  ===============  =====================
    layer                 output (28x28)   parameters
    ====================  ===============  =====================
    conv 5x5 VALID + ReLU ``[B,24,24,64]`` 5*5*3*64 + 64
    max-pool 2, stride 2  ``[B,12,12,64]``
    conv 5x5 VALID + ReLU ``[B,8,8,128]``  5*5*64*128 + 128
    max-pool 2, stride 2  ``[B,4,4,128]``
    conv 3x3 VALID + ReLU ``[B,2,2,64]``   3*3*128*64 + 64
    flatten, dense + ReLU ``[B,256]``      256*256 + 256
    dropout 0.5 (train)   ``[B,256]``
    dense (logits)        ``[B,10]``       256*10 + 10
    ====================  ===============  =====================

    351946 parameters for 28x28x3 inputs and 10 classes. The softmax of the
    paper's ``S(10,1)`` is in the loss (:func:`cross_entropy_loss`). Biases start
    at 0 (the paper's CIFAR setting); kernels use Flax's default LeCun-normal
    initialiser (the paper does not give one). Dropout is active only when
    ``train=True``, and then needs a ``'dropout'`` rng
    (``model.apply(..., train=True, rngs={"dropout": key})``, as the trainer's
    loss does); it has no state, so the variables are still only ``params``.

    Each stage's output is sown into the ``'intermediates'`` collection under
    ``conv1, pool1, conv2, pool2, conv3, dense, logits`` (recorded only when
    that collection is mutable, e.g. ``mutable=["intermediates"]``).

    Attributes:
      num_classes: logits per example.
      dropout_rate: drop probability after the 256-unit layer (paper: 0.5).

    References:
      Zhang, Choromanska & LeCun, "Deep learning with Elastic Averaging SGD",
      NeurIPS 2015, Section 5.1 (the CIFAR model, 28x28 crops, biases 0).
    """

    num_classes: int = 10
    dropout_rate: float = 0.5

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Computes logits.

        Args:
          x: float ``[B, H, W, C]`` images, ``H, W >= 24`` (the paper: 28x28x3
            crops; other sizes change the flattened width).
          train: apply dropout (needs a ``'dropout'`` rng).

        Returns:
          float32 ``[B, num_classes]`` logits.

        Raises:
          ModelError: if ``x`` is not ``[B, H, W, C]`` or an image side is below 24.
        """
        if x.ndim != 4 or min(x.shape[1:3]) < 24:
            raise ModelError(
                f"CifarNet input has shape {x.shape}; expected images [B, H, W, C] with "
                "H, W >= 24 (the paper's 28x28x3 crops)"
            )
        zeros = nn.initializers.zeros
        stages = (("conv1", 64, 5), ("conv2", 128, 5))
        for index, (name, width, kernel) in enumerate(stages, start=1):
            x = nn.relu(nn.Conv(width, (kernel, kernel), padding="VALID", bias_init=zeros)(x))
            self.sow("intermediates", name, x)
            x = nn.max_pool(x, window_shape=(2, 2), strides=(2, 2), padding="VALID")
            self.sow("intermediates", f"pool{index}", x)
        x = nn.relu(nn.Conv(64, (3, 3), padding="VALID", bias_init=zeros)(x))
        self.sow("intermediates", "conv3", x)
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(256, bias_init=zeros)(x))
        self.sow("intermediates", "dense", x)
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        x = nn.Dense(self.num_classes, bias_init=zeros)(x)
        self.sow("intermediates", "logits", x)
        return x


def make_model(name: str, num_classes: int) -> nn.Module:
    """Builds one of :data:`MODELS` with its default widths.

    Args:
      name: ``"mlp"`` (:class:`MLP`, hidden ``(256, 256)``), ``"cnn"``
        (:class:`CNN`, features ``(16, 32)``, dense 128) or ``"cifar"``
        (:class:`CifarNet`, the paper's CIFAR-10 model for 28x28x3 crops).
      num_classes: logits per example, a positive integer.

    Returns:
      An unbound Flax module; initialise it with :func:`init_params`.

    Raises:
      ModelError: for an unknown name or a non-positive ``num_classes``.

    Example:
      >>> model = make_model("mlp", num_classes=10)
      >>> params = init_params(model, (8, 8, 1), jax.random.key(0))
      >>> count_params(params)
      85002
    """
    num_classes = _positive_int(num_classes, "num_classes")
    if name == "mlp":
        return MLP(num_classes=num_classes)
    if name == "cnn":
        return CNN(num_classes=num_classes)
    if name == "cifar":
        return CifarNet(num_classes=num_classes)
    raise ModelError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")


def init_params(model: nn.Module, input_shape: tuple[int, ...], key: jax.Array) -> Params:
    """Initialises a model's parameters for inputs of one example's shape.

    Args:
      model: a Flax module whose ``__call__(x, train)`` takes ``[B, *input_shape]``.
      input_shape: shape of one example without the batch axis, e.g.
        ``(28, 28, 1)`` or ``(40, 1)`` (``Dataset.input_shape``).
      key: a JAX PRNG key.

    Returns:
      The ``params`` pytree (float32 leaves), traced with a batch of one zero
      input.
    """
    dummy = jnp.zeros((1, *tuple(input_shape)), jnp.float32)
    return model.init(key, dummy, train=False)["params"]


def count_params(params: Params) -> int:
    """Total number of scalar parameters in a pytree (elements, not bytes)."""
    return int(sum(math.prod(np.shape(leaf)) for leaf in jax.tree_util.tree_leaves(params)))


def param_bytes(params: Params) -> int:
    """Total size of a parameter pytree in bytes (elements times itemsize)."""
    return int(
        sum(
            math.prod(np.shape(leaf)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(params)
        )
    )


def per_example_stats(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-example softmax cross-entropy and correctness.

    ``loss_b = logsumexp(logits_b) - logits_b[labels_b]`` (natural log, nats),
    ``correct_b = [argmax(logits_b) == labels_b]``.

    Args:
      logits: float ``[B, num_classes]``; computed in float32.
      labels: int ``[B]`` class indices in ``[0, num_classes)``.

    Returns:
      ``(loss, correct)``: float32 ``[B]`` losses and float32 ``[B]`` 0/1
      correctness (float so that masked sums and means need no cast).
    """
    logits = logits.astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return loss, correct


def cross_entropy_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over a batch (the training objective).

    Args:
      logits: float ``[B, num_classes]``; computed in float32.
      labels: int ``[B]`` class indices.

    Returns:
      float32 scalar, ``mean_b loss_b`` in nats (see :func:`per_example_stats`).
    """
    logits = logits.astype(jnp.float32)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
