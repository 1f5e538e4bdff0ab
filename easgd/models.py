"""Small Flax classifiers (MLP and CNN) and the loss helpers the trainer uses.

Both models are stateless (no batch norm, no dropout), so a model's variables
are exactly its ``params`` pytree: that pytree is what EASGD workers hold and
what the elastic force pulls towards the center. ``train`` is accepted by
``__call__`` for a uniform interface and currently changes nothing.
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

MODELS = ("mlp", "cnn")
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


def make_model(name: str, num_classes: int) -> nn.Module:
    """Builds one of :data:`MODELS` with its default widths.

    Args:
      name: ``"mlp"`` (:class:`MLP`, hidden ``(256, 256)``) or ``"cnn"``
        (:class:`CNN`, features ``(16, 32)``, dense 128).
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
