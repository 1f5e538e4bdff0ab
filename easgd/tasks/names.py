"""The models' and dtypes' names, importable without JAX or Flax.

The config (``easgd.settings.config``) declares its fields' allowed values
from these; ``easgd.tasks.models`` implements them.
"""

MODELS = ("mlp", "cnn", "cnn_bn", "cifar")
"""Names accepted by ``easgd.tasks.models.make_model``."""

BATCH_NORM_MODELS = ("cnn_bn",)
"""The names of :data:`MODELS` with BatchNorm layers
(``easgd.tasks.models.has_batch_norm``)."""

DTYPES = ("float32", "bfloat16")
"""Parameter and compute dtypes ``make_model`` accepts (Flax's ``param_dtype``
and ``dtype``)."""
