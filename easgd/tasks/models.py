"""Flax classifiers (MLP, CNN, the paper's CIFAR-10 net) and the trainer's loss helpers.

A model's trainable variables are its ``params`` pytree: that pytree is what
EASGD workers hold and what the elastic force pulls towards the center.
``train`` is accepted by every ``__call__`` for a uniform interface;
:class:`CifarNet` uses it for dropout (which then needs a ``'dropout'`` rng) and
``"cnn_bn"`` (:class:`CNN` with ``batch_norm=True``) for BatchNorm.

BatchNorm policy (``"cnn_bn"``; see :func:`has_batch_norm`): in training every
BatchNorm layer normalises with the statistics of the worker's own mini-batch
(train mode) and no running averages are kept, so the ``batch_stats``
collection is never part of the training state (never exchanged, averaged or
checkpointed). The center's statistics are recomputed from the center's own
parameters before it is evaluated or exported (:func:`compute_batch_stats`,
``easgd.runtimes.training_run.make_eval_fn``, ``Task.center_state``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from easgd._util import checks
from easgd.tasks.names import DTYPES, MODELS

# Pending: easgd/sweeps/network.py still reads it here (its split moves it to
# easgd.tasks.names); tests/test_layout.py lists it.

Params = Any  # A pytree of float32 arrays (Flax's ``variables['params']``).


class ModelError(ValueError):
  """A bad model choice or an input the model cannot take; one-line message."""


class MLP(nn.Module):
  """Multilayer perceptron: flatten, ReLU hidden layers, linear logits.

  ``h_0 = flatten(x)``, ``h_k = relu(W_k h_{k-1} + b_k)`` for each hidden
  width, ``logits = W_out h_K + b_out``.

  Attributes:
    num_classes: logits per example.
    hidden: widths of the hidden layers (units); ``()`` gives a linear model.
    dtype: compute dtype of the layers (None: from inputs and params).
    param_dtype: dtype of the parameters.
  """

  num_classes: int = 10
  hidden: tuple[int, ...] = (256, 256)
  dtype: Any = None
  param_dtype: Any = jnp.float32

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
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=self.param_dtype)
    for width in self.hidden:
      x = nn.relu(dense(width)(x))
    return dense(self.num_classes)(x)


class CNN(nn.Module):
  """Small convnet for 2-D images ``[B, H, W, C]`` or 1-D signals ``[B, L, C]``.

  For each entry of ``features``: conv (``SAME`` padding; 3x3 for images,
  width 5 for signals), ReLU, max-pool (window 2, stride 2 per spatial axis).
  Then flatten, ``Dense(dense)`` + ReLU, ``Dense(num_classes)`` logits. The
  convolution dimensionality is read from ``x.ndim`` (4: images, 3: signals),
  so one model definition serves Fashion-MNIST ``28x28`` (-> 14 -> 7),
  digits ``8x8`` (-> 4 -> 2) and MNIST-1D length 40 (-> 20 -> 10).

  With ``batch_norm=True`` (the ``"cnn_bn"`` model) each conv is followed by
  ``nn.BatchNorm`` over the channels, before the ReLU:
  ``y = scale * (h - mean) / sqrt(var + 1e-5) + bias``. With ``train=True``
  ``mean``/``var`` are the current batch's (biased) per-channel statistics,
  over batch and spatial positions; with ``train=False`` they are read from
  the ``batch_stats`` collection. The trainer never keeps running averages
  (module docstring): it recomputes the center's statistics exactly with
  :func:`compute_batch_stats`.

  Attributes:
    num_classes: logits per example.
    features: output channels of each conv block.
    dense: width of the hidden dense layer (units).
    batch_norm: BatchNorm after each conv (adds ``params`` scale and bias and
      ``batch_stats`` mean and var per channel).
    bn_momentum: BatchNorm running-average momentum, used only when a caller
      keeps ``batch_stats`` mutable in train mode. :func:`compute_batch_stats`
      clones the model with 0.0, so that the "running average" is exactly
      the statistics of the batch.
    bn_axis_name: BatchNorm ``axis_name``: in train mode, statistics are
      averaged over this mapped axis (cross-worker BatchNorm). None: each
      call's own batch. :func:`compute_batch_stats` sets it.
    dtype: compute dtype of the layers (None: from inputs and params).
    param_dtype: dtype of the parameters.
  """

  num_classes: int = 10
  features: tuple[int, ...] = (16, 32)
  dense: int = 128
  batch_norm: bool = False
  bn_momentum: float = 0.99
  bn_axis_name: Any = None
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Computes logits.

    Args:
      x: float ``[B, H, W, C]`` images or ``[B, L, C]`` signals (channels last).
      train: BatchNorm (``batch_norm=True``) normalises with the batch's
        statistics; otherwise with ``batch_stats``. Unused without BatchNorm.

    Returns:
      float32 ``[B, num_classes]`` logits.

    Raises:
      ModelError: if ``x`` is not rank 3 or 4, or a spatial size falls below
        2 before a pooling layer (too many conv blocks for the input).
    """
    if x.ndim == 4:
      kernel, window = (3, 3), (2, 2)
    elif x.ndim == 3:
      kernel, window = (5,), (2,)
    else:
      raise ModelError(
          f"CNN input has shape {x.shape}; expected images [B, H, W, C] or " "signals [B, L, C]"
      )
    precision = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    for block, width in enumerate(self.features):
      x = nn.Conv(width, kernel_size=kernel, padding="SAME", **precision)(x)
      if self.batch_norm:  # "cnn_bn": normalise the conv output, then ReLU
        x = nn.BatchNorm(
            use_running_average=not train,
            momentum=self.bn_momentum,
            axis_name=self.bn_axis_name,
            use_fast_variance=False,  # var = mean((h - mean)^2), two passes
            **precision,
        )(x)
      x = nn.relu(x)
      spatial = x.shape[1:-1]
      if min(spatial) < 2:
        raise ModelError(
            f"CNN block {block} has spatial size {spatial}; expected >= 2 per "
            f"axis to pool; use fewer than {len(self.features)} conv blocks"
        )
      x = nn.max_pool(x, window_shape=window, strides=window, padding="VALID")
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(self.dense, **precision)(x))
    return nn.Dense(self.num_classes, **precision)(x)


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
    dtype: compute dtype of the layers (None: from inputs and params).
    param_dtype: dtype of the parameters.

  References:
    Zhang, Choromanska & LeCun, "Deep learning with Elastic Averaging SGD",
    NeurIPS 2015, Section 5.1 (the CIFAR model, 28x28 crops, biases 0).
  """

  num_classes: int = 10
  dropout_rate: float = 0.5
  dtype: Any = None
  param_dtype: Any = jnp.float32

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
    conv = functools.partial(
        nn.Conv, padding="VALID", bias_init=zeros, dtype=self.dtype, param_dtype=self.param_dtype
    )
    dense = functools.partial(
        nn.Dense, bias_init=zeros, dtype=self.dtype, param_dtype=self.param_dtype
    )
    stages = (("conv1", 64, 5), ("conv2", 128, 5))
    for index, (name, width, kernel) in enumerate(stages, start=1):
      x = nn.relu(conv(width, (kernel, kernel))(x))
      self.sow("intermediates", name, x)
      x = nn.max_pool(x, window_shape=(2, 2), strides=(2, 2), padding="VALID")
      self.sow("intermediates", f"pool{index}", x)
    x = nn.relu(conv(64, (3, 3))(x))
    self.sow("intermediates", "conv3", x)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(dense(256)(x))
    self.sow("intermediates", "dense", x)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    x = dense(self.num_classes)(x)
    self.sow("intermediates", "logits", x)
    return x


def make_model(
    name: str, num_classes: int, *, param_dtype: str = "float32", compute_dtype: str = "float32"
) -> nn.Module:
  """Builds one of :data:`MODELS` with its default widths.

  Args:
    name: ``"mlp"`` (:class:`MLP`, hidden ``(256, 256)``), ``"cnn"``
      (:class:`CNN`, features ``(16, 32)``, dense 128), ``"cnn_bn"`` (the
      same CNN with BatchNorm after each conv, before the ReLU; see
      :func:`has_batch_norm`) or ``"cifar"`` (:class:`CifarNet`, the paper's
      CIFAR-10 model for 28x28x3 crops).
    num_classes: logits per example, a positive integer.
    param_dtype: dtype of the parameters, one of :data:`DTYPES`.
    compute_dtype: dtype of the layers' computation, one of :data:`DTYPES`
      (the logits come out in it; the losses of this module are float32).

  Returns:
    An unbound Flax module; initialise it with :func:`init_params`.

  Raises:
    ModelError: for an unknown name or dtype, or a non-positive ``num_classes``.

  Example:
    >>> model = make_model("mlp", num_classes=10)
    >>> params = init_params(model, (8, 8, 1), jax.random.key(0))
    >>> count_params(params)
    85002
  """
  num_classes = checks.integer("num_classes", num_classes, 1, error=ModelError)
  for what, value in (("param_dtype", param_dtype), ("compute_dtype", compute_dtype)):
    checks.choice(what, value, DTYPES, error=ModelError)
  checks.choice("model", name, MODELS, error=ModelError)
  kw = dict(
      num_classes=num_classes, param_dtype=jnp.dtype(param_dtype), dtype=jnp.dtype(compute_dtype)
  )
  build = dict(mlp=MLP, cnn=CNN, cnn_bn=functools.partial(CNN, batch_norm=True), cifar=CifarNet)
  return build[name](**kw)


def init_params(model: nn.Module, input_shape: tuple[int, ...], key: jax.Array) -> Params:
  """Initialises a model's parameters for inputs of one example's shape.

  Args:
    model: a Flax module whose ``__call__(x, train)`` takes ``[B, *input_shape]``.
    input_shape: shape of one example without the batch axis, e.g.
      ``(28, 28, 1)`` or ``(40, 1)`` (``Dataset.input_shape``).
    key: a JAX PRNG key.

  Returns:
    The ``params`` pytree (float32 leaves), traced with a batch of one zero
    input. Other collections (``batch_stats``) are dropped: see
    :func:`init_variables`.
  """
  return init_variables(model, input_shape, key)["params"]


def init_variables(model: nn.Module, input_shape: tuple[int, ...], key: jax.Array) -> dict:
  """All of a model's variable collections, as :func:`init_params` initialises them.

  Returns:
    ``{"params": ...}``, plus ``"batch_stats"`` (per-channel ``mean`` 0 and
    ``var`` 1 per BatchNorm layer) for models with BatchNorm: the template of
    the statistics that :func:`compute_batch_stats` returns.
  """
  dummy = jnp.zeros((1, *tuple(input_shape)), jnp.float32)  # inputs: float32 data
  return dict(model.init(key, dummy, train=False))


def has_batch_norm(model: nn.Module) -> bool:
  """Whether ``model`` has BatchNorm layers (so the BatchNorm policy applies).

  True for ``"cnn_bn"`` (``CNN(batch_norm=True)``). Such a model is trained with
  each mini-batch's own statistics (``mutable=["batch_stats"]`` in train mode,
  the updated collection discarded: ``easgd.settings.builtin_tasks.make_loss_fn``) and
  evaluated with statistics recomputed for the parameters evaluated
  (:func:`compute_batch_stats`). A module declares BatchNorm with a true
  ``batch_norm`` attribute and then has the ``bn_momentum`` and
  ``bn_axis_name`` fields of :class:`CNN`.
  """
  return bool(getattr(model, "batch_norm", False))


def compute_batch_stats(
    model: nn.Module, params: Params, x: jax.Array, axis_name: Any = None
) -> Params:
  """Exact BatchNorm statistics of ``params`` over the examples ``x``.

  One train-mode pass of ``model`` over ``x`` as a single batch, with the
  BatchNorm momentum set to 0 (so each layer's "running average" is exactly
  the batch's statistics). For every BatchNorm layer, with ``h`` its input
  (``[N, ..., C]``):

  ``mean_c = mean(h[..., c])``, ``var_c = mean((h[..., c] - mean_c)^2)``

  over all examples and spatial positions (biased variance). Earlier layers
  are normalised with their own statistics over the same examples, so every
  layer's statistics are those of its input in evaluation mode
  (``use_running_average=True`` with these statistics): they belong to
  ``params``. With ``axis_name``, ``x`` is one shard of the examples and the
  moments are averaged over the named mapped axis inside each layer
  (cross-worker BatchNorm: ``lax.pmean`` of the mean, then of the squared
  deviations from the pooled mean), exact when all shards have the same size;
  the result is then the same on all members of the axis.

  Args:
    model: a model with BatchNorm (:func:`has_batch_norm`).
    params: its ``params`` pytree, e.g. the EASGD center.
    x: float ``[N, *input_shape]`` examples (this member's shard if
      ``axis_name`` is given).
    axis_name: a mapped axis (or tuple of axes) to pool the moments over,
      e.g. ``easgd.core.elastic.WORKER_AXES``; None: ``x`` alone.

  Returns:
    The ``batch_stats`` pytree (float32 per-channel ``mean`` and ``var`` per
    layer), to apply as ``model.apply({"params": params, "batch_stats": s},
    x, train=False)``.

  Raises:
    ModelError: if ``model`` has no BatchNorm.

  References:
    Ioffe & Szegedy, "Batch Normalization", ICML 2015 (population statistics
    for inference); Izmailov et al., "Averaging Weights Leads to Wider Optima
    and Better Generalization", UAI 2018 (recomputing them for averaged
    weights, ``bn_update``).
  """
  if not has_batch_norm(model):
    raise ModelError(f"{type(model).__name__} has no BatchNorm statistics to compute")
  stats_model = model.clone(bn_momentum=0.0, bn_axis_name=axis_name)
  _, state = stats_model.apply({"params": params}, x, train=True, mutable=["batch_stats"])
  return state["batch_stats"]


def count_params(params: Params) -> int:
  """Total number of scalar parameters in a pytree (elements, not bytes).

  Works on arrays and on ``jax.ShapeDtypeStruct`` leaves (``jax.eval_shape``),
  which ``optax.tree_utils.tree_size`` passes to ``jnp.size`` (deprecated).
  """
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
