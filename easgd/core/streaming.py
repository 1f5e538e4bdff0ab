r"""Streaming elastic exchanges: fragments, delayed application and compression.

Three changes to EASGD's synchronous elastic exchange (eq. (5)-(6) of the paper,
:func:`easgd.core.elastic.easgd_update`), as pure pytree functions like those of
``easgd.core.elastic``: no ``jit``, no devices, collectives over a mapped
``axis_name``. The schedule (which fragment is sent or applied at a step) is
known on the host (:func:`events`) and picks the program while it is traced.

Notation: worker i of p, period tau, moving rate alpha, P fragments
F_0..F_{P-1} (a partition of the parameter LEAVES, :func:`fragment_leaves`),
delay V (steps between a fragment's send and its application), compressor C,
error accumulator e^i (per worker, shaped like the parameters, zeros at start),
u^i_t the local optimizer's update at x^i_t.

Fragment j is sent at the clocks s with (s - o_j) mod tau = 0, o_j = floor(j tau / P):

.. math::

   d^i_s &= \alpha (x^i_s - \tilde x_s)|_{F_j}, \qquad
   g^i_s = d^i_s + e^i|_{F_j}, \qquad
   m^i_s = C(g^i_s), \qquad e^i|_{F_j} \leftarrow g^i_s - m^i_s, \qquad
   M_s = \sum_{i=1}^{p} m^i_s

(without compression :math:`m^i_s = d^i_s` exactly and there is no accumulator),
and applied at clock t = s + V (0 <= V < tau):

.. math::

   x^i_{t+1}|_{F_j} &= x^i_t|_{F_j} - d^i_s + u^i_t|_{F_j} \\
   \tilde x_{t+1}|_{F_j} &= \tilde x_t|_{F_j} + M_s

Every other leaf and step: :math:`x^i_{t+1} = x^i_t + u^i_t`, the center unchanged.
With P = 1, V = 0 and no compression this is :func:`easgd.core.elastic.easgd_update`
bit for bit.

The worker moves by its exact elastic difference d^i (it knows it locally), the
center by what was sent, so the error feedback is on the center's side: an
exchange conserves :math:`\tilde x + \sum_i x^i + \sum_i e^i` (with V >= 1:
once it is applied; in flight, e^i has moved and x^i, x~ not yet), as eq. (5)-(6)
conserve :math:`\tilde x + \sum_i x^i`. The elastic difference is a force of
the current state, not an increment: what C dropped is still in
:math:`x^i - \tilde x` at the next send, so it must not move the worker and be
kept in e^i as well (that counts it twice and, with top-k, e^i grows by about
:math:`\alpha (x^i - \tilde x)` a send until it goes out as one overshooting
pulse).

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6) of the paper (the base rule).
  A. Douillard et al. Streaming DiLoCo with overlapping communication. 2025
  (arXiv:2501.18512) (fragments and overlap).
  Error feedback: F. Seide et al. 1-bit SGD, Interspeech 2014; S. P. Karimireddy
  et al. Error feedback fixes SignSGD, ICML 2019 (arXiv:1901.09847).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from easgd._util import checks
from easgd._util.flags import ALLOWED
from easgd.core import names
from easgd.core.elastic import (
    AxisName,
    HyperparameterError,
    Params,
    cast_like,
    check_tau,
    elastic_difference,
    reduced_bytes,
    reduction_dtype,
    worker_axis_size,
    worker_sum,
)

LAYOUTS = names.FRAGMENT_LAYOUTS
"""How :func:`fragment_leaves` groups leaves into fragments."""

COMPRESSIONS = tuple(c for c in names.COMPRESSIONS if c != "none")
"""The compressor kinds of :class:`Compression` (``"none"`` is no :class:`Compression`)."""

_BITS = names.QUANTIZED_BITS
_WIRE_FLOAT = jnp.float32  # scales and top-k values travel as float32
_WIRE_INDEX = jnp.int32  # top-k indices travel as int32


def _sizes(params: Params) -> list[int]:
  return [math.prod(np.shape(x)) for x in jax.tree.leaves(params)]


def fragment_leaves(params: Params, num_fragments, layout: str = "contiguous") -> tuple[int, ...]:
  """The fragment index of each leaf of ``params``, in ``jax.tree.leaves`` order.

  "contiguous": consecutive leaves, groups balanced by element count. Walking the
  leaves in order with running element count C_k (leaves 0..k) out of S in all,
  leaf k joins the open fragment j, which is then closed (the next leaf opens
  j + 1) if j < P - 1 and either C_k * P >= (j + 1) * S or the leaves left after
  k are exactly as many as the fragments left after j. Every fragment is
  non-empty. "strided": leaf k goes to fragment k mod P.

  Args:
    params: a pytree of arrays (or ``jax.ShapeDtypeStruct``); only shapes are read.
    num_fragments: P, an integer in [1, number of leaves].
    layout: "contiguous" or "strided".

  Returns:
    A tuple of ints in [0, P), one per leaf.

  Raises:
    HyperparameterError: P not an integer in [1, number of leaves], or an
      unknown layout.
  """
  sizes = _sizes(params)
  num = checks.integer(
      "fragments",
      num_fragments,
      1,
      len(sizes),
      error=HyperparameterError,
      what=f"P, at most the {len(sizes)} parameter leaves",
  )
  checks.choice("layout", layout, LAYOUTS, error=HyperparameterError)
  if layout == "strided":
    return tuple(k % num for k in range(len(sizes)))
  total, running, open_fragment, out = sum(sizes), 0, 0, []
  for k, size in enumerate(sizes):
    out.append(open_fragment)
    running += size
    left_leaves, left_fragments = len(sizes) - k - 1, num - 1 - open_fragment
    if left_fragments > 0 and (
        running * num >= (open_fragment + 1) * total or left_leaves == left_fragments
    ):
      open_fragment += 1
  return tuple(out)


def fragment_offsets(num_fragments, tau) -> tuple[int, ...]:
  """The send clock of each fragment within a period: o_j = floor(j * tau / P).

  Args:
    num_fragments: P, an integer in [1, tau].
    tau: communication period in local steps, an integer >= 1.

  Returns:
    ``(o_0, ..., o_{P-1})``, strictly increasing ints in [0, tau).

  Raises:
    HyperparameterError: tau not an integer >= 1, or P not an integer in [1, tau].
  """
  tau = check_tau(tau)
  num = checks.integer("fragments", num_fragments, 1, error=HyperparameterError, what="P")
  if num > tau:
    raise HyperparameterError(
        f"fragments must be <= tau={tau} (P fragments need tau >= P so each has its own "
        f"step), got {num}"
    )
  return tuple(j * tau // num for j in range(num))


def check_delay(delay, tau) -> int:
  """``delay`` V (steps from a fragment's send to its application) as an int.

  Raises:
    HyperparameterError: V not an integer in [0, tau - 1].
  """
  tau = check_tau(tau)
  return checks.integer(
      "delay", delay, 0, tau - 1, error=HyperparameterError, what="steps, below tau"
  )


def events(t, tau, num_fragments, delay) -> tuple[int | None, int | None]:
  """The host schedule at clock t: ``(send, apply)``, each a fragment index or None.

  Fragment j is sent where (t - o_j) mod tau = 0 and applied where t >= o_j + V
  and (t - o_j - V) mod tau = 0 (:func:`fragment_offsets`). The offsets are
  distinct and V < tau, so there is at most one of each per step.

  Args:
    t: the worker clock, an integer >= 0 (local steps from 0).
    tau, num_fragments, delay: as :func:`fragment_offsets` and :func:`check_delay`.

  Returns:
    ``(send, apply)``.

  Raises:
    HyperparameterError: a value outside its range.
  """
  t = checks.integer("t", t, 0, error=HyperparameterError, what="clock")
  offsets = fragment_offsets(num_fragments, tau)
  delay = check_delay(delay, tau)
  send = next((j for j, o in enumerate(offsets) if t >= o and (t - o) % tau == 0), None)
  apply = next(
      (j for j, o in enumerate(offsets) if t >= o + delay and (t - o - delay) % tau == 0), None
  )
  return send, apply


# Compressors.


def _check_bits(bits) -> int:
  return checks.choice("bits", bits, tuple(sorted(_BITS.values())), error=HyperparameterError)


def _check_block_size(block_size) -> int:
  return checks.integer(
      "block_size", block_size, 1, error=HyperparameterError, what="elements a scale"
  )


def _check_fraction(fraction) -> float:
  return checks.real(
      "fraction", fraction, 0, 1, open_low=True, error=HyperparameterError, what="of entries kept"
  )


def _top_k_count(size: int, fraction: float) -> int:
  return min(size, max(1, math.ceil(fraction * size)))


def quantize(x, bits: int, block_size: int) -> tuple[jax.Array, jax.Array]:
  """Blockwise symmetric quantization of the flattened ``x``.

  Blocks of ``block_size`` consecutive entries (the last one may be shorter);
  q_max = 2^(bits-1) - 1, and per block scale = max|x_block| / q_max and
  q = clip(round-half-to-even(x / scale), -q_max, q_max), computed as
  x * q_max / max|x_block| so that exact ties stay ties; a block of zeros has
  scale 0 and q 0. The scales travel as float32.

  Args:
    x: a float array (any shape).
    bits: 8 or 4 (int4 values are stored in int8).
    block_size: entries per scale, an integer >= 1.

  Returns:
    ``(q, scales)``: int8 of shape (n,), float32 of shape (ceil(n / block_size),).

  Raises:
    HyperparameterError: bits not 4 or 8, block_size not an integer >= 1.
  """
  q_max = 2 ** (_check_bits(bits) - 1) - 1
  block_size = _check_block_size(block_size)
  flat = jnp.ravel(x)
  size = flat.shape[0]
  num_blocks = -(-size // block_size)
  blocks = jnp.pad(flat, (0, num_blocks * block_size - size)).reshape(num_blocks, block_size)
  amax = jnp.max(jnp.abs(blocks), axis=1, keepdims=True, initial=0)
  nonzero = amax > 0
  ratio = jnp.where(nonzero, blocks * q_max / jnp.where(nonzero, amax, 1), 0)
  q = jnp.clip(jnp.round(ratio), -q_max, q_max).astype(jnp.int8)
  return q.reshape(-1)[:size], (amax[:, 0] / q_max).astype(_WIRE_FLOAT)


def dequantize(q, scales, shape, dtype, block_size: int) -> jax.Array:
  """The values :func:`quantize` encoded: q * scale of its block, of ``shape`` and ``dtype``.

  Args:
    q: int8 of shape (n,); scales: float of shape (ceil(n / block_size),).
    shape: the original shape (n elements); dtype: the float dtype to return.
    block_size: the block size ``quantize`` was given (n and the number of
      scales do not determine it).
  """
  size = q.shape[0]
  num_blocks = scales.shape[0]
  blocks = jnp.pad(q, (0, num_blocks * block_size - size)).reshape(num_blocks, block_size)
  values = blocks.astype(dtype) * scales.astype(dtype)[:, None]
  return values.reshape(-1)[:size].reshape(shape)


def pack_int4(q) -> jax.Array:
  """Two 4-bit integers per byte: q of int8 in [-7, 7], shape (n,) -> uint8 of shape
  (ceil(n / 2),), byte k = (q[2k] + 8) + 16 (q[2k+1] + 8) (a missing last q as 0)."""
  q = jnp.asarray(q).astype(jnp.int32) + 8
  q = jnp.pad(q, (0, q.shape[0] % 2), constant_values=8)
  return (q[0::2] + 16 * q[1::2]).astype(jnp.uint8)


def unpack_int4(packed, size: int) -> jax.Array:
  """The inverse of :func:`pack_int4`: int8 of shape (size,)."""
  b = jnp.asarray(packed).astype(jnp.int32)
  q = jnp.stack([b % 16, b // 16], axis=1).reshape(-1)[:size] - 8
  return q.astype(jnp.int8)


def top_k(x, fraction: float) -> tuple[jax.Array, jax.Array]:
  """The k = max(1, ceil(fraction * n)) entries of largest |x| of the flattened ``x``.

  Ties are broken by the lower index first (``jax.lax.top_k`` of |x|); k is
  computed in Python float arithmetic (``math.ceil(fraction * n)``).

  Args:
    x: an array (any shape, n elements).
    fraction: the share of entries kept, a real in (0, 1].

  Returns:
    ``(values, indices)``: values of ``x``'s dtype and int32 flat indices, both
    of shape (k,), by decreasing |x|.

  Raises:
    HyperparameterError: fraction outside (0, 1].
  """
  fraction = _check_fraction(fraction)
  flat = jnp.ravel(x)
  _, indices = lax.top_k(jnp.abs(flat), _top_k_count(flat.shape[0], fraction))
  return flat[indices], indices.astype(_WIRE_INDEX)


def densify(values, indices, shape, dtype) -> jax.Array:
  """The array of ``shape`` and ``dtype`` holding ``values`` at the flat ``indices``, zeros elsewhere."""
  flat = jnp.zeros((math.prod(shape),), dtype).at[indices].set(values.astype(dtype))
  return flat.reshape(shape)


@dataclasses.dataclass(frozen=True)
class Compression:
  """A compressor C of the exchanged fragments, with error feedback.

  ``int8``/``int4``: :func:`quantize` per leaf (int8 q + float32 scale per
  block); ``topk``: :func:`top_k` per leaf (float32 values + int32 indices).
  Checked on construction (:meth:`check`).
  """

  kind: str = dataclasses.field(metadata={ALLOWED: checks.OneOf(COMPRESSIONS)})
  """"int8", "int4" or "topk"."""
  block_size: int = dataclasses.field(
      default=256, metadata={ALLOWED: checks.Integer(1, what="elements a scale")}
  )
  """Entries per quantization scale (int8, int4)."""
  fraction: float = dataclasses.field(
      default=0.01, metadata={ALLOWED: checks.Real(0, 1, open_low=True, what="of entries kept")}
  )
  """Share of each leaf's entries sent (topk), in (0, 1]."""

  def __post_init__(self):
    self.check()

  def check(self) -> None:
    """Raises HyperparameterError for a field outside its range (one line naming it)."""
    checks.check_fields(self, HyperparameterError)

  def payload_bytes(self, leaf_size: int) -> int:
    """Bytes one worker sends for a leaf of ``leaf_size`` elements (n):
    int8 n + 4 ceil(n / block_size); int4 ceil(n / 2) + 4 ceil(n / block_size);
    topk 8 k (float32 value + int32 index), k = max(1, ceil(fraction * n))."""
    size = int(leaf_size)
    if self.kind == "topk":
      return 8 * _top_k_count(size, self.fraction)
    scales = 4 * -(-size // self.block_size)
    return (size if self.kind == "int8" else -(-size // 2)) + scales

  def encode(self, x) -> tuple[jax.Array, jax.Array]:
    """The wire payload of one leaf ``x``: ``(q, scales)`` or ``(values, indices)``."""
    if self.kind == "topk":
      values, indices = top_k(x, self.fraction)
      return values.astype(_WIRE_FLOAT), indices
    q, scales = quantize(x, _BITS[self.kind], self.block_size)
    return (pack_int4(q) if self.kind == "int4" else q), scales

  def decode(self, payload, shape, dtype) -> jax.Array:
    """The leaf of ``shape`` and ``dtype`` a receiver reconstructs from ``payload``."""
    if self.kind == "topk":
      return densify(*payload, shape, dtype)
    q, scales = payload
    if self.kind == "int4":
      q = unpack_int4(q, math.prod(shape))
    return dequantize(q, scales, shape, dtype, self.block_size)


@dataclasses.dataclass(frozen=True)
class ExchangeTechniques:
  """The techniques of an elastic exchange (module docstring's equations).

  Attributes:
    fragments: P, fragments of the parameter leaves (1: the whole tree at once).
    fragment_layout: "contiguous" or "strided" (:func:`fragment_leaves`).
    delay: V, local steps from a fragment's send to its application (0 <= V < tau).
    compression: None (the elastic difference itself) or a :class:`Compression`.
    param_shapes: the parameters (a pytree of arrays or ``jax.ShapeDtypeStruct``;
      only shapes and dtypes are read): the fragments and their bytes are fixed
      from it when the algorithm is built. Needed unless :meth:`is_plain`.
  """

  fragments: int = 1
  fragment_layout: str = "contiguous"
  delay: int = 0
  compression: Compression | None = None
  param_shapes: Any = dataclasses.field(default=None, compare=False, repr=False)

  def is_plain(self) -> bool:
    """P = 1, V = 0 and no compression: eq. (5)-(6) as they are."""
    return self.fragments == 1 and self.delay == 0 and self.compression is None


def compression_of(kind: str, block_size: int = 256, fraction: float = 0.01) -> Compression | None:
  """The :class:`Compression` of a config's ``compression`` ("none": None).

  Raises:
    HyperparameterError: an unknown kind, a block size or fraction out of range.
  """
  checks.choice("compression", kind, names.COMPRESSIONS, error=HyperparameterError)
  return None if kind == "none" else Compression(kind, block_size, fraction)


def technique_hyperparameters(
    fragments: int, fragment_layout: str, delay: int, compression: Compression | None
) -> dict:
  """The ``hyperparameters`` entries of the exchange techniques (for logs and summaries):
  ``fragments``, ``fragment_layout``, ``delay``, ``compression`` (``"none"`` for None),
  and with compression ``compression_block`` and ``topk_fraction``."""
  hyper = dict(
      fragments=fragments,
      fragment_layout=fragment_layout,
      delay=delay,
      compression="none" if compression is None else compression.kind,
  )
  if compression is not None:
    hyper.update(compression_block=compression.block_size, topk_fraction=compression.fraction)
  return hyper


def sends_communication(count: int, nbytes: int, compression: Compression | None):
  """``easgd.core.base.Communication`` of ``count`` sends of ``nbytes`` payload bytes in
  all: all-reduces, or all-gathers of the compressed payloads."""
  from easgd.core.base import Communication

  return Communication(count, nbytes) if compression is None else Communication(0, 0, count, nbytes)


def compress(tree: Params, compression: Compression) -> Params:
  """C(tree): each leaf encoded and decoded as the receiver reconstructs it, in
  :func:`easgd.core.elastic.reduction_dtype` of the leaf's dtype."""

  def one(x):
    dtype = reduction_dtype(jnp.result_type(x))
    x = jnp.asarray(x).astype(dtype)
    return compression.decode(compression.encode(x), x.shape, dtype)

  return jax.tree.map(one, tree)


def fragment_bytes(
    params: Params, fragments: tuple[int, ...], compression: Compression | None
) -> tuple[int, ...]:
  """Payload bytes one worker sends for each fragment's exchange.

  Args:
    params: a pytree of arrays or ``jax.ShapeDtypeStruct`` leaves.
    fragments: per leaf its fragment index (:func:`fragment_leaves`).
    compression: None (the fragment's leaves in reduction dtype,
      :func:`easgd.core.elastic.reduced_bytes`) or a :class:`Compression`
      (the sum of its :meth:`Compression.payload_bytes` over the leaves).

  Returns:
    A tuple of ints, bytes, one per fragment 0..max(fragments).
  """
  leaves = jax.tree.leaves(params)
  _check_fragments(fragments, len(leaves))
  out = [0] * (max(fragments) + 1)
  for leaf, j in zip(leaves, fragments):
    out[j] += (
        reduced_bytes(leaf)
        if compression is None
        else compression.payload_bytes(math.prod(np.shape(leaf)))
    )
  return tuple(out)


def _check_fragments(fragments, num_leaves: int) -> None:
  if len(fragments) != num_leaves or any(
      not isinstance(j, int) or isinstance(j, bool) or j < 0 for j in fragments
  ):
    raise HyperparameterError(
        f"fragments must give a fragment index >= 0 for each of the {num_leaves} leaves, "
        f"got {fragments!r}"
    )


# State and update.


class StreamState(NamedTuple):
  """Per-worker state of the streaming exchange (all leaves in reduction dtype).

  Fields are ``()`` where they are not needed.
  """

  error: Params
  """e^i, the error accumulator, shaped like the parameters (with compression only)."""
  pending_sent: Params
  """d^i, the exact elastic difference the worker moves by, of the fragments in flight,
  zeros elsewhere (delay >= 1 only)."""
  pending_sum: Params
  """M = sum_i m^i of the fragments in flight, zeros elsewhere (delay >= 1 only)."""


def init_stream_state(params: Params, delay, compression: Compression | None) -> StreamState:
  """The state at clock 0: zeros shaped like ``params`` in reduction dtype.

  Args:
    params: this worker's parameters (only shapes and dtypes are read).
    delay: V, an integer >= 0 (pending fields only for V >= 1).
    compression: None (no error accumulator) or a :class:`Compression`.

  Raises:
    HyperparameterError: delay not an integer >= 0.
  """
  delay = checks.integer("delay", delay, 0, error=HyperparameterError, what="steps")

  def zeros():
    return jax.tree.map(
        lambda x: jnp.zeros(np.shape(x), reduction_dtype(jnp.result_type(x))), params
    )

  return StreamState(
      error=zeros() if compression is not None else (),
      pending_sent=zeros() if delay >= 1 else (),
      pending_sum=zeros() if delay >= 1 else (),
  )


def _gathered_sum(payloads, shapes, dtypes, compression: Compression, axis_name):
  """sum_i C(g^i) per leaf: the payloads all-gathered over ``axis_name`` (one
  all-gather per axis name, innermost first, so the gathered order is that of
  ``lax.axis_index(axis_name)``), decoded and summed locally in worker-index
  order (the wire carries compressed bytes)."""
  if axis_name is None:
    return [compression.decode(p, s, d) for p, s, d in zip(payloads, shapes, dtypes)]
  worker_axis_size(axis_name)  # MappingError if the axis is unbound
  names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  gathered = payloads
  for name in reversed(names):  # innermost first: worker (a, b) lands at a * size_b + b
    gathered = lax.all_gather(gathered, name)
  gathered = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[len(names) :]), gathered)
  out = []
  for payload, shape, dtype in zip(gathered, shapes, dtypes):
    total = None
    for i in range(payload[0].shape[0]):
      part = compression.decode(tuple(a[i] for a in payload), shape, dtype)
      total = part if total is None else total + part
    out.append(total)
  return out


def streaming_elastic_update(
    params: Params,
    updates: Params,
    center: Params,
    state: StreamState,
    alpha,
    event: tuple[int | None, int | None],
    fragments: tuple[int, ...],
    compression: Compression | None,
    axis_name: AxisName | None,
) -> tuple[Params, Params, StreamState]:
  r"""One step of the streaming elastic exchange (module docstring's equations).

  On a send of fragment j each worker forms its elastic difference
  :math:`d^i = \alpha (x^i_t - \tilde x_t)|_{F_j}`, its message
  :math:`m^i = C(d^i + e^i|_{F_j})` (with the accumulator
  :math:`e^i|_{F_j} \leftarrow d^i + e^i|_{F_j} - m^i`; without compression
  :math:`m^i = d^i`) and the sum M of the messages over workers: without
  compression one all-reduce (:func:`easgd.core.elastic.worker_sum`) of the
  fragment's leaves only; with compression one all-gather of the compressed
  payloads, decoded and summed locally in worker-index order. With delay 0
  (``state.pending_sent == ()``) the exchange is applied in the same step (send
  and apply name the same fragment); otherwise d^i and M are stored in the
  pending fields and applied when ``event`` names it: :math:`x \leftarrow (x - d) + u`
  then cast back, the center :math:`\tilde x \leftarrow \tilde x + M`, as the
  exchange branch of :func:`easgd.core.elastic.easgd_update`. Other leaves:
  :math:`x \leftarrow x + u`. The worker moves by d^i, the center by the
  messages, so an exchange conserves :math:`\tilde x + \sum_i x^i + \sum_i e^i`
  (the error feedback is the center's; module docstring).

  Args:
    params: worker parameters x^i_t (pytree of float arrays).
    updates: local optimizer update u^i_t at x^i_t, same structure.
    center: center x~_t, same structure, identical on all workers.
    state: :class:`StreamState` from :func:`init_stream_state` (its fields
      decide: an error accumulator with compression, pending for delay >= 1).
    alpha: moving rate (float or traced scalar) >= 0.
    event: ``(send, apply)`` from :func:`events`, Python ints or None, fixed
      at trace time (no conditional in the program).
    fragments: per leaf its fragment index (:func:`fragment_leaves`).
    compression: None or a :class:`Compression`.
    axis_name: mapped axis (or tuple of axes) of all workers; None for a single
      worker (no collective).

  Returns:
    ``(params_{t+1}, center_{t+1}, state_{t+1})``, params and center in their
    dtypes, the state in reduction dtype.

  Raises:
    HyperparameterError: ``fragments`` not one index per leaf, an event that
      does not fit the state (delay 0 with send != apply, delay >= 1 with
      send == apply), or compression without (or an accumulator without)
      compression.
    MappingError: ``axis_name`` is not bound (called outside a mapping).

  References:
    Eq. (5)-(6) of the paper; Douillard et al. 2025, Streaming DiLoCo;
    error feedback: Seide et al. 2014; Karimireddy et al. 2019.
  """
  send, apply = event
  x, treedef = jax.tree.flatten(params)
  u, c = treedef.flatten_up_to(updates), treedef.flatten_up_to(center)
  _check_fragments(fragments, len(x))
  delayed = state.pending_sent != ()
  if (compression is None) != (state.error == ()):
    raise HyperparameterError(
        f"compression {compression!r} does not match the state's error accumulator; build the "
        "state with init_stream_state(params, delay, compression)"
    )
  if delayed and send is not None and send == apply:
    raise HyperparameterError(
        f"event {event!r} sends and applies one fragment, which needs delay 0; this state has "
        "pending fields (delay >= 1)"
    )
  if not delayed and send != apply:
    raise HyperparameterError(
        f"event {event!r} must send and apply the same fragment with delay 0 (no pending fields)"
    )
  error = treedef.flatten_up_to(state.error) if compression is not None else None
  sent = treedef.flatten_up_to(state.pending_sent) if delayed else None
  summed = treedef.flatten_up_to(state.pending_sum) if delayed else None
  moved, total = {}, {}  # leaf index -> d^i, M of this step's application

  if apply is not None and delayed:
    for k in (k for k, j in enumerate(fragments) if j == apply):
      moved[k], total[k] = sent[k], summed[k]
      sent[k], summed[k] = jnp.zeros_like(sent[k]), jnp.zeros_like(summed[k])

  if send is not None:
    members = [k for k, j in enumerate(fragments) if j == send]
    diff = elastic_difference([x[k] for k in members], [c[k] for k in members], alpha)
    if compression is None:
      big_m = worker_sum(diff, axis_name)
    else:
      g = [d + error[k] for d, k in zip(diff, members)]
      payloads = [compression.encode(v) for v in g]
      for k, v, p in zip(members, g, payloads):
        error[k] = v - compression.decode(p, v.shape, v.dtype)
      big_m = _gathered_sum(
          payloads, [v.shape for v in g], [v.dtype for v in g], compression, axis_name
      )
    for k, dk, bk in zip(members, diff, big_m):  # the worker moves by d^i, the center by M
      if delayed:
        sent[k], summed[k] = dk, bk
      else:
        moved[k], total[k] = dk, bk

  new_x = [(x[k] - moved[k]) + u[k] if k in moved else x[k] + u[k] for k in range(len(x))]
  new_c = [c[k] + total[k] if k in total else c[k] for k in range(len(x))]
  new_state = StreamState(
      error=treedef.unflatten(error) if error is not None else (),
      pending_sent=treedef.unflatten(sent) if delayed else (),
      pending_sum=treedef.unflatten(summed) if delayed else (),
  )
  return (
      cast_like(treedef.unflatten(new_x), params),
      cast_like(treedef.unflatten(new_c), center),
      new_state,
  )
