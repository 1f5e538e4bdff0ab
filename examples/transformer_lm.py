"""A byte-level decoder-only Transformer language model on a text file, as an easgd task.

A user's own problem, not one of the package's built-ins: the model (Flax
linen), the data (fixed windows of a text file's bytes, served by a
``__len__``/``__getitem__`` class rather than NumPy arrays) and the metrics,
all in one factory, :func:`make_task`. Every part of the package reads it
through :class:`easgd.tasks.task.Task`.

Each example is one window of ``context + 1`` consecutive bytes ``w``
(int32 ``[context + 1]``); the model reads ``w[:-1]`` and predicts ``w[1:]``
(byte ``t + 1`` from bytes ``0..t``, causal attention). The vocabulary is the
256 byte values, so any file works (UTF-8 text is modelled byte by byte).

* loss: the mean next-byte cross-entropy (nats) over a worker's mini-batch;
* evaluate, per window: ``"loss"``, the mean cross-entropy over its
  ``context`` predictions, and ``"correct"``, the fraction of them whose most
  likely byte is the true one (``test_accuracy`` is then the mean next-byte
  accuracy over the test windows, ``test_error`` one minus it).

The text is split before it is cut into windows: the first
``1 - test_fraction`` of its bytes train, the rest test, so no test byte is
ever a training target.

Run it from the repository root (``examples/make_data.py`` writes the text,
by default the GNU GPL version 3 from Debian's ``base-files``)::

  python examples/make_data.py text --out runs/data/gpl3.txt
  easgd train --task examples.transformer_lm:make_task \\
      --task-arg path=runs/data/gpl3.txt --task-arg context=32 \\
      --workdir runs/transformer_lm --algorithm easgd --num-workers 4 \\
      --global-batch-size 64 --num-epochs 40 --optimizer adam --learning-rate 0.003 --tau 4

(``examples/README.md``: 2.358 nats per byte on the test text at its lowest,
epoch 29, and 41.08% next-byte accuracy after 40 epochs;
``examples/protocol_lm.py`` compares methods on it with ``easgd protocol``.)

``--task-arg`` values: ``path`` (required), ``context``, ``stride``,
``d_model``, ``num_heads``, ``num_layers``, ``dropout``, ``test_fraction``
(:func:`make_task`). ``easgd compare --task ...`` takes the same flags.
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from easgd.tasks.sources import TaskError
from easgd.tasks.task import Task

VOCAB = 256
"""Byte-level vocabulary: the 256 byte values."""


class TextWindows:
  """Fixed windows of a token sequence, by index (a random-access source).

  Item ``i`` is ``tokens[i * stride : i * stride + window]`` as int32
  ``[window]``. An object with ``__len__`` and ``__getitem__`` only (no
  NumPy pytree), so the package reads it through
  :class:`easgd.tasks.sources.ItemSource`, one item at a time.

  Args:
    tokens: int ``[n]`` token ids.
    window: tokens per item (``context + 1``: inputs and their next tokens).
    stride: tokens between the starts of consecutive items.
  """

  def __init__(self, tokens: np.ndarray, window: int, stride: int):
    self.tokens = np.asarray(tokens, np.int32)
    self.window = int(window)
    self.stride = int(stride)

  def __len__(self) -> int:
    n = len(self.tokens) - self.window
    return 0 if n < 0 else n // self.stride + 1

  def __getitem__(self, i: int) -> np.ndarray:
    if not 0 <= i < len(self):
      raise IndexError(f"window {i} of {len(self)}")
    start = i * self.stride
    return self.tokens[start : start + self.window]


class Block(nn.Module):
  """One pre-norm Transformer block: causal self-attention, then an MLP (4x width).

  ``x + Attn(LN(x))``, then ``x + W2 gelu(W1 LN(x))``; dropout on both
  branches' outputs in training.

  Attributes:
    num_heads: attention heads (``d_model`` must be a multiple).
    dropout: dropout rate of the branches (0: none).
  """

  num_heads: int
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, train: bool) -> jax.Array:
    """``x`` float ``[B, T, d_model]`` -> ``[B, T, d_model]``."""
    d = x.shape[-1]
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))  # [B, 1, T, T]
    h = nn.MultiHeadDotProductAttention(num_heads=self.num_heads, deterministic=True)(
        nn.LayerNorm()(x), mask=mask
    )
    x = x + nn.Dropout(self.dropout, deterministic=not train)(h)
    h = nn.Dense(d)(nn.gelu(nn.Dense(4 * d)(nn.LayerNorm()(x))))
    return x + nn.Dropout(self.dropout, deterministic=not train)(h)


class DecoderLM(nn.Module):
  """A decoder-only Transformer: token and learned position embeddings, blocks, logits.

  Attributes:
    context: the longest input (positions embedded).
    d_model: width of the residual stream.
    num_heads: attention heads per block.
    num_layers: Transformer blocks.
    dropout: dropout rate (training only).
    vocab: vocabulary size.
  """

  context: int = 32
  d_model: int = 64
  num_heads: int = 4
  num_layers: int = 2
  dropout: float = 0.0
  vocab: int = VOCAB

  @nn.compact
  def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
    """int ``[B, T]`` tokens (``T <= context``) -> float32 ``[B, T, vocab]`` logits,
    position ``t`` predicting token ``t + 1`` from tokens ``0..t``."""
    t = tokens.shape[1]
    x = nn.Embed(self.vocab, self.d_model)(tokens)
    pos = self.param("pos_embedding", nn.initializers.normal(0.02), (self.context, self.d_model))
    x = x + pos[:t]
    for _ in range(self.num_layers):
      x = Block(self.num_heads, self.dropout)(x, train)
    return nn.Dense(self.vocab)(nn.LayerNorm()(x)).astype(jnp.float32)


def _read_tokens(path: str) -> np.ndarray:
  """The bytes of ``path`` as int32 token ids; TaskError if it cannot be read."""
  if not isinstance(path, str) or not path:
    raise TaskError(f"path={path!r}: give the text file, --task-arg path=FILE")
  if not os.path.isfile(path):
    raise TaskError(f"path={path!r} is not a file; give a text file, --task-arg path=FILE")
  with open(path, "rb") as f:
    return np.frombuffer(f.read(), np.uint8).astype(np.int32)


def _positive(name: str, value, low: int = 1) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise TaskError(f"{name}={value!r} must be an integer >= {low}")
  return value


def make_task(
    path: str | None = None,
    context: int = 32,
    stride: int | None = None,
    d_model: int = 64,
    num_heads: int = 4,
    num_layers: int = 2,
    dropout: float = 0.0,
    test_fraction: float = 0.1,
) -> Task:
  """The byte-level language model of the text file ``path`` as a task.

  Args:
    path: the text file (any bytes; read whole into memory).
    context: bytes each prediction window reads (a window holds
      ``context + 1`` bytes).
    stride: bytes between the starts of consecutive windows (default
      ``context``: each byte is a target once).
    d_model: width of the Transformer's residual stream.
    num_heads: attention heads (must divide ``d_model``).
    num_layers: Transformer blocks.
    dropout: dropout rate in training, in ``[0, 1)``.
    test_fraction: the share of the text (its end) held out for testing, in
      ``(0, 1)``.

  Returns:
    The task (``info``: model, vocab, sizes, text bytes).

  Raises:
    TaskError: a missing or unreadable file, a text whose training or test
      part is shorter than one window, or an argument out of range (one line).
  """
  context = _positive("context", context)
  stride = context if stride is None else _positive("stride", stride)
  d_model = _positive("d_model", d_model)
  num_heads = _positive("num_heads", num_heads)
  num_layers = _positive("num_layers", num_layers)
  if d_model % num_heads:
    raise TaskError(f"d_model={d_model} must be a multiple of num_heads={num_heads}")
  if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
    raise TaskError(f"dropout={dropout!r} must be a number in [0, 1)")
  if (
      isinstance(test_fraction, bool)
      or not isinstance(test_fraction, (int, float))
      or not 0 < test_fraction < 1
  ):
    raise TaskError(f"test_fraction={test_fraction!r} must be a number in (0, 1)")
  tokens = _read_tokens(path)
  window = context + 1
  cut = int(round(len(tokens) * (1 - test_fraction)))
  train, test = TextWindows(tokens[:cut], window, stride), TextWindows(tokens[cut:], window, stride)
  for what, part in (("training", train), ("test", test)):
    if len(part) == 0:
      raise TaskError(
          f"path={path!r} has {len(tokens)} bytes: its {what} part ({len(part.tokens)} bytes, "
          f"test_fraction={test_fraction}) is shorter than one window of context+1 = {window} "
          "bytes; give a longer text or a smaller context"
      )

  model = DecoderLM(context, d_model, num_heads, num_layers, float(dropout))

  def init(key):
    return model.init(key, jnp.zeros((1, context), jnp.int32), train=False)["params"]

  def token_losses(params, windows, train, key=None):
    """Per-token cross-entropy ``[B, context]`` and logits of windows ``[B, context + 1]``."""
    rngs = {"dropout": key} if key is not None else {}
    logits = model.apply({"params": params}, windows[:, :-1], train=train, rngs=rngs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]), logits

  def loss(params, windows, key):
    return jnp.mean(token_losses(params, windows, True, key)[0])

  def evaluate(params, windows):
    losses, logits = token_losses(params, windows, False)
    hit = (jnp.argmax(logits, axis=-1) == windows[:, 1:]).astype(jnp.float32)
    return {"loss": jnp.mean(losses, axis=1), "correct": jnp.mean(hit, axis=1)}

  return Task(
      name="transformer_lm",
      init=init,
      loss=loss,
      evaluate=evaluate,
      train=train,
      test=test,
      # every window has the same number of tokens, so the batch mean is the
      # mean of independent per-window terms (dropout draws per worker: no merging)
      mean_of_examples=dropout == 0,
      info=dict(
          model="DecoderLM",
          vocab=VOCAB,
          context=context,
          d_model=d_model,
          num_heads=num_heads,
          num_layers=num_layers,
          text_bytes=int(len(tokens)),
      ),
  )
