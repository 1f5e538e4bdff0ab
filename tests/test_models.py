"""Tests for easgd.tasks.models: output shapes, the model factory, and loss helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd.tasks import models
from easgd.tasks.names import MODELS

SHAPES = [(28, 28, 1), (8, 8, 1), (40, 1)]


def abstract_init(model, input_shape):
  """Parameter shapes and dtypes without running the initialisers (fast)."""
  return jax.eval_shape(lambda k: models.init_params(model, input_shape, k), jax.random.key(0))


@pytest.mark.parametrize("input_shape", SHAPES, ids=["fashion", "digits", "mnist1d"])
# The generic models; CifarNet needs images >= 24x24 (tested in tests/test_cifar.py).
@pytest.mark.parametrize("name", [m for m in MODELS if m != "cifar"])
def test_output_shapes(name, input_shape):
  model = models.make_model(name, num_classes=10)
  params = models.init_params(model, input_shape, jax.random.key(0))
  leaves = jax.tree_util.tree_leaves(params)
  assert leaves and all(leaf.dtype == jnp.float32 for leaf in leaves)
  x = jax.random.normal(jax.random.key(1), (2, *input_shape))
  # "cnn_bn" also needs its batch_stats (init_params returns params only)
  variables = models.init_variables(model, input_shape, jax.random.key(0))
  assert set(variables) == (
      {"params", "batch_stats"} if models.has_batch_norm(model) else {"params"}
  )
  logits = model.apply(variables, x, train=False)
  assert logits.shape == (2, 10) and logits.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(logits)))
  assert models.count_params(params) == sum(leaf.size for leaf in leaves)
  assert models.param_bytes(params) == 4 * models.count_params(params)


def test_mlp_param_count():
  # 64*256+256 + 256*256+256 + 256*3+3; abstract init (eval_shape) is enough.
  params = abstract_init(models.make_model("mlp", 3), (8, 8, 1))
  assert models.count_params(params) == 64 * 256 + 256 + 256 * 256 + 256 + 256 * 3 + 3
  assert models.param_bytes(params) == 4 * models.count_params(params)


def test_cnn_uses_1d_convs_for_signals():
  params = abstract_init(models.CNN(), (40, 1))
  assert params["Conv_0"]["kernel"].shape == (5, 1, 16)
  params = abstract_init(models.CNN(), (8, 8, 1))
  assert params["Conv_0"]["kernel"].shape == (3, 3, 1, 16)


def test_cnn_rejects_bad_rank_and_tiny_input():
  with pytest.raises(models.ModelError, match="expected images"):
    abstract_init(models.CNN(), (4,))
  with pytest.raises(models.ModelError, match="spatial size"):
    abstract_init(models.CNN(features=(8, 8, 8)), (4, 4, 1))


def test_make_model_unknown_name():
  with pytest.raises(models.ModelError, match="'resnet'.*mlp, cnn") as e:
    models.make_model("resnet", 10)
  assert isinstance(e.value, ValueError)
  with pytest.raises(models.ModelError, match="num_classes must be an integer >= 1, got 0"):
    models.make_model("mlp", 0)


def test_loss_helpers():
  logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0], [-3.0, 1.0, 4.0]])
  labels = jnp.array([0, 1, 1])
  loss, correct = models.per_example_stats(logits, labels)
  expected = -jax.nn.log_softmax(logits)[jnp.arange(3), labels]
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  np.testing.assert_array_equal(correct, [1.0, 0.0, 0.0])  # ties: argmax picks class 0
  assert loss.shape == correct.shape == (3,)
  assert correct.dtype == jnp.float32
  np.testing.assert_allclose(
      models.cross_entropy_loss(logits, labels),
      optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(),
      rtol=1e-6,
  )
  # Uniform logits over 3 classes: log 3 nats.
  np.testing.assert_allclose(loss[1], np.log(3.0), rtol=1e-6)
