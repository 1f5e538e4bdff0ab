r"""Streaming DiLoCo: DiLoCo's outer step on fragments, overlapped and compressed.

Notation: worker i of p, period tau, P fragments F_0..F_{P-1} of the parameter
LEAVES (``easgd.core.streaming.fragment_leaves``) with offsets o_j = floor(j tau / P)
(``fragment_offsets``), delay V (0 <= V < tau), merge rate alpha in (0, 1], outer
learning rate eta_out and Nesterov momentum mu, compressor C with error accumulator
e^i (per worker, zeros at start), u^i_t the inner optimizer's update at x^i_t, x~ the
outer (global) model, m_j the outer momentum of fragment j (zeros at start).

Every clock t, every worker: :math:`x'^i = x^i_t + u^i_t`. Fragment j syncs at the
clocks s with (s + 1 - o_j) mod tau = 0 (after its own step of each period;
P = 1: after steps tau - 1, 2 tau - 1, ..., DiLoCo's rounds):

.. math::

   \Delta^i &= (\tilde x - x'^i)|_{F_j}, \qquad
   m^i = C(\Delta^i + e^i|_{F_j}), \qquad e^i|_{F_j} \leftarrow \Delta^i + e^i|_{F_j} - m^i \\
   \Delta &= \frac{1}{p} \sum_{i=1}^{p} m^i
     \quad \Big(\text{no } C\text{: } \Delta = \tilde x|_{F_j} - \frac{1}{p} \sum_i x'^i|_{F_j}\Big) \\
   m_j &\leftarrow \mu\, m_j + \Delta, \qquad
   \tilde x|_{F_j} \leftarrow \tilde x|_{F_j} - \eta_{out} (\Delta + \mu\, m_j)

and it is merged into every worker V steps later, at t = s + V (the worker trains
meanwhile; V = 0: in the sync step itself, after the outer step):

.. math::

   x^i_{t+1}|_{F_j} = (1 - \alpha)\, x'^i|_{F_j} + \alpha\, \tilde x|_{F_j}

(alpha = 1: :math:`x^i_{t+1}|_{F_j} = \tilde x|_{F_j}`, DiLoCo's replacement);
every other leaf :math:`x^i_{t+1} = x'^i`. Given ``num_steps``, the run's last step
T - 1 syncs EVERY fragment at once (one exchange of all the leaves, each fragment
its own outer step) and merges them at once, whatever the periodic schedule says
there; merges still pending from the syncs of the V steps before are superseded
(never applied). So the run ends on the outer model, as :func:`diloco`'s does. With
P = 1, V = 0, alpha = 1 and no compression this is
``easgd.methods.baselines.diloco`` bit for bit.

References:
  A. Douillard et al. Streaming DiLoCo with overlapping communication: towards a
  distributed free lunch. 2025 (arXiv:2501.18512), Algorithm 1 (fragments,
  overlap tau as our V, merge rate alpha).
  A. Douillard et al. DiLoCo. 2023 (arXiv:2311.08105), Algorithm 1.
  torchft ``torchft/local_sgd.py``, class ``DiLoCo``: ``fragment_sync_delay`` is V,
  ``fragment_update_alpha`` a is the weight of the LOCAL parameters in its merge
  (``p.lerp_(local, a)``), so alpha = 1 - a.
  Error feedback: F. Seide et al. 2014; S. P. Karimireddy et al. ICML 2019.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from easgd._util import checks
from easgd.core import algorithms, elastic, streaming
from easgd.core.base import (
    Algorithm,
    Communication,
    LossFn,
    distinct_events,
    event_programs,
    local_optimizer,
    worker_key,
)
from easgd.core.elastic import WORKER_AXES, HyperparameterError
from easgd.core.momentum import loss_and_grad
from easgd.methods.baselines import outer_sgd

Params = Any

ALL = "all"
"""The fragment of the run's last step's event: every fragment at once."""


class StreamingDiLoCoWorker(NamedTuple):
  """Per-worker state: x^i, the inner optimizer's state, the model's state, and
  e^i, the error accumulator shaped like the parameters in reduction dtype
  (``()`` without compression)."""

  params: Params
  opt_state: Any
  model_state: Any = ()
  error: Any = ()


class StreamingDiLoCoShared(NamedTuple):
  """Shared state.

  Attributes:
    center: x~, the outer model (float32 for bfloat16 parameters).
    outer_state: one outer optimizer state per fragment, each over the list of
      that fragment's leaves (in ``jax.tree.leaves`` order).
    step: int32 scalar, the common clock t.
  """

  center: Params
  outer_state: tuple
  step: jax.Array


def _syncs(t, tau: int, offset: int):
  """Whether fragment of offset o syncs at clock t: (t + 1 - o) mod tau = 0."""
  return (t + 1 - offset) % tau == 0


def _event(t: int, tau: int, offsets, delay: int, last_step) -> tuple:
  """The host event at clock t: ``(sync, merge)``, each a fragment, :data:`ALL` or None."""
  if last_step is not None and t == last_step:
    return ALL, ALL
  sync = next((j for j, o in enumerate(offsets) if _syncs(t, tau, o)), None)
  merge = next((j for j, o in enumerate(offsets) if t >= delay and _syncs(t - delay, tau, o)), None)
  return sync, merge


def _event_at(t, tau: int, offsets, delay: int, last_step, event):
  """Whether clock t (host int or traced int32) has ``event``: its program's ``runs_at``."""
  if isinstance(t, int):
    return _event(t, tau, offsets, delay, last_step) == tuple(event)
  last = jnp.bool_(False) if last_step is None else t == last_step
  if event == (ALL, ALL):
    return last
  sync, merge = event
  holds = ~last
  for j, o in enumerate(offsets):
    syncs = _syncs(t, tau, o)
    merges = (t >= delay) & _syncs(t - delay, tau, o)
    holds &= syncs if j == sync else ~syncs
    holds &= merges if j == merge else ~merges
  return holds


def streaming_diloco(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation | None = None,
    *,
    num_workers: int,
    tau: int,
    outer_learning_rate: float = 0.7,
    outer_momentum: float = 0.9,
    outer_optimizer: optax.GradientTransformation | None = None,
    alpha: float = 1.0,
    exchange: streaming.ExchangeTechniques | None = None,
    learning_rate: float | None = None,
    num_steps: int | None = None,
    axis_name=WORKER_AXES,
) -> Algorithm:
  r"""Streaming DiLoCo: fragments synced in turn, merged V steps later (module equations).

  Args:
    loss_fn: ``loss_fn(params, batch, key) -> scalar``.
    optimizer: the inner optimizer (state per worker, never reset); default
      ``optax.sgd(learning_rate)``.
    num_workers: p.
    tau: inner steps per round, a Python integer >= 1 (the host schedules the
      fragments; no array tau).
    outer_learning_rate: eta_out > 0 (DiLoCo: 0.7), or a JAX array (unchecked).
    outer_momentum: Nesterov momentum mu in [0, 1) of the outer SGD (0.9), or a
      JAX array (unchecked), as ``easgd.methods.baselines.diloco``.
    outer_optimizer: any Optax optimizer instead of the outer SGD (the outer_*
      values are then ignored); one state per fragment.
    alpha: the merge's moving rate in (0, 1] (1: replace, DiLoCo's rule;
      torchft's ``fragment_update_alpha`` is 1 - alpha), or a JAX array
      (unchecked).
    exchange: fragments P (1 <= P <= tau, at most the leaves), their layout,
      delay V (0 <= V < tau) and compression
      (``easgd.core.streaming.ExchangeTechniques``); None: P = 1, V = 0, no
      compression. ``param_shapes`` is needed for P > 1 or compression.
    learning_rate: eta of the default inner SGD optimizer.
    num_steps: the run's total number of steps (>= 1), whose last step syncs
      and merges every fragment; None: periodic syncs only.
    axis_name: mapped axis enumerating all workers.

  Returns:
    An :class:`~easgd.core.base.Algorithm` named ``"streaming_diloco"``;
    ``center`` is x~; ``phases``: one program per distinct ``(sync, merge)``
    event of the host's clock (no conditional), ``step`` the same decided on
    the device (``lax.switch``). ``communication``: per worker one collective
    per fragment sync of its bytes (``easgd.core.streaming.fragment_bytes``),
    all-reduces, or all-gathers with compression; the last step's is one of
    all the fragments' bytes.

  Raises:
    HyperparameterError: tau not a Python integer >= 1, P outside [1, tau] or
      above the leaves, V outside [0, tau), alpha outside (0, 1],
      outer_learning_rate <= 0, outer_momentum outside [0, 1), num_steps < 1,
      or P > 1 / compression without ``param_shapes``.
    TypeError: an optimizer that is not an ``optax.GradientTransformation``.

  Example:
    >>> import jax.numpy as jnp
    >>> loss_fn = lambda params, batch, key: jnp.mean((batch @ params) ** 2)
    >>> algo = streaming_diloco(loss_fn, num_workers=4, tau=8, learning_rate=0.1)

  References:
    Douillard et al. (2025), Streaming DiLoCo, Algorithm 1; Douillard et al.
    (2023), DiLoCo, Algorithm 1.
  """
  if elastic.is_array_hyperparameter(tau):
    raise HyperparameterError(
        "streaming_diloco needs a Python tau (the host schedules the fragments); got an array"
    )
  tau = elastic.check_tau(tau)
  num_workers = algorithms.check_num_workers(num_workers)
  if not elastic.is_array_hyperparameter(alpha):
    alpha = checks.real(
        "alpha", alpha, 0, 1, open_low=True, error=HyperparameterError, what="merge moving rate"
    )
  techniques = exchange if exchange is not None else streaming.ExchangeTechniques()
  offsets = streaming.fragment_offsets(techniques.fragments, tau)
  delay = streaming.check_delay(techniques.delay, tau)
  compression = techniques.compression
  shapes = techniques.param_shapes
  if shapes is None and not (techniques.fragments == 1 and compression is None):
    raise HyperparameterError(
        "fragments > 1 and compression need the parameters' shapes: give "
        "ExchangeTechniques(param_shapes=...) (e.g. jax.eval_shape of the model's init)"
    )
  fixed = None
  sizes = None
  if shapes is not None:
    fixed = streaming.fragment_leaves(shapes, techniques.fragments, techniques.fragment_layout)
    sizes = streaming.fragment_bytes(shapes, fixed, compression)
  last_step = None
  if num_steps is not None:
    last_step = (
        checks.integer(
            "num_steps", num_steps, 1, error=HyperparameterError, what="the run's length in steps"
        )
        - 1
    )
  outer, outer_hyper = outer_sgd(outer_learning_rate, outer_momentum, outer_optimizer)
  optimizer = local_optimizer(optimizer, learning_rate)
  reduce_over = elastic.reduce_axis(num_workers, axis_name)  # None: one worker
  num_fragments = len(offsets)

  def leaf_fragments(tree) -> tuple[int, ...]:
    return fixed if fixed is not None else (0,) * len(jax.tree.leaves(tree))

  def members(fragments, j) -> list[int]:
    return [k for k, f in enumerate(fragments) if j == ALL or f == j]

  def init(params, model_state=()):
    center = elastic.to_reduction_dtype(params)
    leaves, fragments = jax.tree.leaves(center), leaf_fragments(params)
    outer_state = tuple(
        outer.init([leaves[k] for k in members(fragments, j)]) for j in range(num_fragments)
    )
    error = () if compression is None else jax.tree.map(jnp.zeros_like, center)
    return (
        StreamingDiLoCoWorker(params, optimizer.init(params), model_state, error),
        StreamingDiLoCoShared(center, outer_state, jnp.zeros((), jnp.int32)),
    )

  def sync(x, c, error, outer_state, fragments, j):
    """The outer step of fragment j (or of all, :data:`ALL`) on the center ``c``."""
    ks = members(fragments, j)
    if compression is None:
      mean = elastic.worker_mean([x[k] for k in ks], reduce_over)  # in the center's dtype
      delta = [c[k] - mk for k, mk in zip(ks, mean)]  # optax.tree_utils.tree_sub
    else:
      g = [(c[k] - x[k].astype(c[k].dtype)) + error[k] for k in ks]
      payloads = [compression.encode(v) for v in g]
      for k, v, payload in zip(ks, g, payloads):
        error[k] = v - compression.decode(payload, v.shape, v.dtype)
      total = streaming._gathered_sum(  # noqa: SLF001 (core.streaming's wire format)
          payloads, [v.shape for v in g], [v.dtype for v in g], compression, reduce_over
      )
      delta = [s / num_workers for s in total]
    delta = dict(zip(ks, delta))
    for f in range(num_fragments) if j == ALL else (j,):
      fk = members(fragments, f)
      update, outer_state[f] = outer.update(
          [delta[k] for k in fk], outer_state[f], [c[k] for k in fk]
      )
      for k, value in zip(fk, optax.apply_updates([c[k] for k in fk], update)):
        c[k] = value

  def merge(x, c, fragments, j):
    """Fragment j (or all) of the center merged into the worker at rate alpha."""
    for k in members(fragments, j):
      if isinstance(alpha, float) and alpha == 1.0:
        x[k] = c[k].astype(x[k].dtype)  # DiLoCo's x^i <- x~
      else:
        mixed = (1 - alpha) * x[k].astype(c[k].dtype) + alpha * c[k]
        x[k] = mixed.astype(x[k].dtype)

  def event_step(worker, shared, batch, key, event):
    send, apply = event
    key = worker_key(key, shared.step, axis_name)
    loss, grads, model_state = loss_and_grad(loss_fn, worker.params, batch, key, worker.model_state)
    update, opt_state = optimizer.update(grads, worker.opt_state, worker.params)
    params = optax.apply_updates(worker.params, update)
    x, treedef = jax.tree.flatten(params)
    c = treedef.flatten_up_to(shared.center)
    error = treedef.flatten_up_to(worker.error) if compression is not None else None
    outer_state = list(shared.outer_state)
    fragments = leaf_fragments(params)
    if send is not None:
      sync(x, c, error, outer_state, fragments, send)
    if apply is not None:
      merge(x, c, fragments, apply)
    return (
        StreamingDiLoCoWorker(
            treedef.unflatten(x),
            opt_state,
            model_state,
            treedef.unflatten(error) if error is not None else (),
        ),
        StreamingDiLoCoShared(treedef.unflatten(c), tuple(outer_state), shared.step + 1),
        loss,
    )

  clocks = 2 * tau + delay if last_step is None else min(2 * tau + delay, last_step)
  events = distinct_events(lambda t: _event(t, tau, offsets, delay, None), clocks)
  if last_step is not None:
    events.append((ALL, ALL))
  phases, step = event_programs(
      events,
      event_step,
      lambda t, event: _event_at(t, tau, offsets, delay, last_step, event),
  )

  def communication(num_steps, param_bytes):
    """Per worker: one collective per fragment sync of its bytes; the last step's
    one of all the fragments (``param_bytes`` is read for P = 1 without
    compression and without shapes only)."""
    n = int(num_steps)
    if num_workers == 1 or n <= 0:
      return Communication(0, 0)
    per_fragment = sizes if sizes is not None else (int(param_bytes),)
    periodic = n if last_step is None or n <= last_step else last_step
    count, nbytes = 0, 0
    for o, size in zip(offsets, per_fragment):
      first = (o - 1) % tau
      syncs = (periodic - 1 - first) // tau + 1 if periodic > first else 0
      count, nbytes = count + syncs, nbytes + syncs * size
    if last_step is not None and n > last_step:
      count, nbytes = count + 1, nbytes + sum(per_fragment)
    return streaming.sends_communication(count, nbytes, compression)

  hyper = dict(
      outer_hyper,
      num_workers=num_workers,
      tau=tau,
      alpha=alpha,
      **streaming.technique_hyperparameters(
          num_fragments, techniques.fragment_layout, delay, compression
      ),
  )
  if num_steps is not None:
    hyper["num_steps"] = int(num_steps)
  return Algorithm(
      name="streaming_diloco",
      init=init,
      step=step,
      center=lambda shared: shared.center,
      worker_params=lambda worker, shared: worker.params,
      communication=communication,
      hyperparameters=hyper,
      phases=phases,
  )
