"""The streaming elastic exchange (easgd.core.streaming) against an independent
float64 NumPy reference written from its equations, event by event: the update
alone (EASGD), and synchronous EAMSGD's programs (Nesterov velocity of eq. (7)
as the local update); the base case against easgd_update bit for bit;
hand-worked compressors and schedules."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd.core import algorithms, elastic, streaming
from easgd.core.elastic import HyperparameterError
from easgd.core.streaming import Compression

from testutil import tanh_mlp

TAU, ALPHA, ETA, STEPS = 4, 0.3, 0.1, 3 * 4 + 3
"""Period, moving rate, learning rate, and steps run: three periods and the
applications still in flight (delay up to tau - 1)."""
DELTA = 0.9
"""EAMSGD's Nesterov momentum delta in the reference runs."""

# NumPy reference, written from the module docstring's equations (no module code).


def ref_compress(g, kind, block_size, fraction):
  """C(g) of one flattened float64 leaf: the decoded values."""
  if kind in ("int8", "int4"):
    q_max = 127 if kind == "int8" else 7
    out = np.zeros_like(g)
    for start in range(0, g.size, block_size):
      block = g[start : start + block_size]
      amax = np.max(np.abs(block))
      if amax == 0:
        continue
      q = np.clip(np.round(block * q_max / amax), -q_max, q_max)  # np.round: half to even
      out[start : start + block_size] = q * float(np.float32(amax / q_max))
    return out
  k = max(1, math.ceil(fraction * g.size))
  keep = np.argsort(-np.abs(g), kind="stable")[:k]  # ties: lower index first
  out = np.zeros_like(g)
  out[keep] = np.float32(g[keep])  # values travel as float32
  return out


def ref_run(x0, c0, grad, fragments, num_fragments, delay, compression, steps, momentum=0.0):
  """Event-by-event trajectory: lists (per step) of (x, c, e, v), x, e and v per worker.

  x0: per worker a list of leaves; c0: list of leaves; grad(i, leaves) -> leaves.
  The local update u^i_t: -eta g(x^i_t) (momentum 0, EASGD), or EAMSGD's velocity
  of eq. (7) / Algorithm 2: v^i <- delta v^i - eta g(x^i_t + delta v^i), u^i_t = v^i
  (the look-ahead at the pre-exchange x^i_t; v^i local, never exchanged).
  """
  p, n = len(x0), len(c0)
  x = [[np.array(v, np.float64) for v in w] for w in x0]
  c = [np.array(v, np.float64) for v in c0]
  e = [[np.zeros_like(v) for v in c] for _ in range(p)]
  vel = [[np.zeros_like(v) for v in c] for _ in range(p)]
  offsets = [j * TAU // num_fragments for j in range(num_fragments)]
  in_flight = {}  # fragment -> (d per worker, M), leaves by index
  out = []
  for t in range(steps):
    if momentum:
      for i in range(p):
        look = [x[i][k] + momentum * vel[i][k] for k in range(n)]
        vel[i] = [momentum * vk - ETA * gk for vk, gk in zip(vel[i], grad(i, look))]
      u = [list(w) for w in vel]
    else:
      u = [[-ETA * gv for gv in grad(i, x[i])] for i in range(p)]
    for j, o in enumerate(offsets):
      if t >= o and (t - o) % TAU == 0:  # send
        members = [k for k in range(n) if fragments[k] == j]
        d = [{} for _ in range(p)]  # the exact elastic difference: the worker moves by it
        m = [{} for _ in range(p)]  # what is sent: the center moves by its sum
        for i in range(p):
          for k in members:
            d[i][k] = ALPHA * (x[i][k] - c[k])
            if compression is None:
              m[i][k] = d[i][k]
            else:
              g = d[i][k] + e[i][k]
              m[i][k] = ref_compress(g.ravel(), *compression).reshape(g.shape)
              e[i][k] = g - m[i][k]
        big_m = {k: functools.reduce(np.add, [m[i][k] for i in range(p)]) for k in members}
        in_flight[j] = (d, big_m)
    applied = {}
    for j, o in enumerate(offsets):
      if t >= o + delay and (t - o - delay) % TAU == 0:  # apply
        applied = in_flight.pop(j)
    d, big_m = applied or ([{}] * p, {})
    for i in range(p):
      x[i] = [(x[i][k] - d[i][k]) + u[i][k] if k in big_m else x[i][k] + u[i][k] for k in range(n)]
    c = [c[k] + big_m[k] if k in big_m else c[k] for k in range(n)]
    out.append(([list(w) for w in x], list(c), [list(w) for w in e], [list(w) for w in vel]))
  return out


# The two problems: per-worker params (leading axis p), center, gradient in JAX and NumPy.

P_WORKERS = 3


def quadratic():
  """f_i(x) = 1/2 sum h (x - target_i)^2 over three leaves (sizes 3, 4, 1).

  Returns ``(x0, c0, target, loss, np_grad)`` as :func:`testutil.tanh_mlp`."""
  rng = np.random.default_rng(0)
  shapes = {"a": (3,), "b": (2, 2), "c": ()}
  h = {k: rng.uniform(0.5, 2.0, s) for k, s in shapes.items()}
  target = {k: rng.normal(size=(P_WORKERS,) + s) for k, s in shapes.items()}
  x0 = {k: rng.normal(size=(P_WORKERS,) + s) for k, s in shapes.items()}
  c0 = {k: rng.normal(size=s) for k, s in shapes.items()}

  def loss(i_params, i_target, key=None):
    del key
    return sum(0.5 * jnp.sum(h[k] * (i_params[k] - i_target[k]) ** 2) for k in shapes)

  keys = sorted(shapes)

  def np_grad(i, leaves):
    return [h[k] * (v - target[k][i]) for k, v in zip(keys, leaves)]

  return x0, c0, target, loss, np_grad


def mlp():
  """A 3-4-2 tanh network, loss 1/2 mean_b ||out - y||^2, a batch of 5 per worker
  (:func:`testutil.tanh_mlp`)."""
  return tanh_mlp(P_WORKERS)


def jax_run(problem, fragments, num_fragments, delay, compression, steps):
  """The module's trajectory, p workers under jax.vmap(axis_name="w"), float64."""
  x0, c0, extra, loss, _ = problem
  jax_grad = jax.grad(loss)
  x = jax.tree.map(jnp.asarray, x0)
  c = jax.tree.map(lambda v: jnp.broadcast_to(jnp.asarray(v), (P_WORKERS,) + np.shape(v)), c0)
  state = jax.vmap(lambda w: streaming.init_stream_state(w, delay, compression))(x)

  @functools.partial(jax.jit, static_argnums=4)
  def step(x, c, state, extra, event):
    def one(x, c, state, extra):
      u = jax.tree.map(lambda g: -ETA * g, jax_grad(x, extra))
      return streaming.streaming_elastic_update(
          x, u, c, state, ALPHA, event, fragments, compression, "w"
      )

    return jax.vmap(one, axis_name="w")(x, c, state, extra)

  out = []
  for t in range(steps):
    x, c, state = step(x, c, state, extra, streaming.events(t, TAU, num_fragments, delay))
    out.append((x, c, state))
  return out


def reference_of(problem, fragments, num_fragments, delay, compression, momentum=None):
  """(keys, :func:`ref_run` of ``problem`` for STEPS steps), the leaves in key order."""
  x0, c0, _, _, np_grad = problem
  keys = sorted(c0)
  ref = ref_run(
      [[x0[k][i] for k in keys] for i in range(P_WORKERS)],
      [c0[k] for k in keys],
      np_grad,
      fragments,
      num_fragments,
      delay,
      None
      if compression is None
      else (compression.kind, compression.block_size, compression.fraction),
      STEPS,
      **({} if momentum is None else dict(momentum=momentum)),
  )
  return keys, ref


def assert_matches_reference(problem, fragments, num_fragments, delay, compression):
  keys, ref = reference_of(problem, fragments, num_fragments, delay, compression)
  got = jax_run(problem, fragments, num_fragments, delay, compression, STEPS)
  close = functools.partial(np.testing.assert_allclose, rtol=1e-12, atol=1e-14)
  for t, ((rx, rc, re, _), (x, c, state)) in enumerate(zip(ref, got)):
    for n, k in enumerate(keys):
      for i in range(P_WORKERS):
        close(x[k][i], rx[i][n], err_msg=f"x^{i} leaf {k} after step {t}")
        close(c[k][i], rc[n], err_msg=f"center leaf {k} after step {t} (worker {i})")
        if compression is not None:
          close(state.error[k][i], re[i][n], err_msg=f"e^{i} leaf {k} after step {t}")
  return got


INT8 = Compression("int8", block_size=2)
INT4 = Compression("int4", block_size=3)
TOPK = Compression("topk", fraction=0.4)

QUADRATIC_FRAGMENTS = {1: (0, 0, 0), 2: (0, 0, 1), 3: (0, 1, 2)}
"""fragment_leaves of the quadratic (sizes 3, 4, 1), contiguous, per P."""


@pytest.fixture(scope="module")
def quadratic_problem():
  return quadratic()  # NumPy float64 arrays; the runs enable x64 themselves


@pytest.mark.parametrize(
    "num_fragments, delay, compression",
    [
        (1, 0, None),
        (2, 0, None),
        (3, 0, None),
        (1, 1, None),
        (2, 1, None),
        (3, TAU - 1, None),
        (2, TAU - 1, None),
        (1, 0, INT8),
        (2, 1, INT8),
        (3, TAU - 1, INT4),
        (2, 0, INT4),
        (2, TAU - 1, TOPK),
        (3, 1, TOPK),
    ],
    ids=lambda v: getattr(v, "kind", str(v)),
)
def test_quadratic_matches_the_reference(quadratic_problem, num_fragments, delay, compression):
  with jax.enable_x64(True):
    x0 = quadratic_problem[0]
    fragments = QUADRATIC_FRAGMENTS[num_fragments]
    assert streaming.fragment_leaves(jax.tree.map(lambda v: v[0], x0), num_fragments) == fragments
    got = assert_matches_reference(quadratic_problem, fragments, num_fragments, delay, compression)
    if delay:  # pending holds the fragments sent in the last `delay` steps, zeros elsewhere
      in_flight = {
          streaming.events(t, TAU, num_fragments, delay)[0] for t in range(STEPS - delay, STEPS)
      }
      pending = jax.tree.leaves(got[-1][2].pending_sent) + jax.tree.leaves(got[-1][2].pending_sum)
      for leaf, j in zip(pending, 2 * fragments):
        assert np.any(leaf) == (j in in_flight), (j, in_flight)


@pytest.mark.parametrize(
    "num_fragments, delay, compression, layout, fragments",
    [
        (2, 1, None, "contiguous", (0, 0, 0, 1)),
        (3, TAU - 1, INT8, "strided", (0, 1, 2, 0)),
        (3, 0, TOPK, "contiguous", (0, 0, 1, 2)),
        (2, TAU - 1, INT4, "strided", (0, 1, 0, 1)),
    ],
    ids=lambda v: getattr(v, "kind", str(v)),
)
def test_mlp_matches_the_reference(num_fragments, delay, compression, layout, fragments):
  with jax.enable_x64(True):
    problem = mlp()
    one = jax.tree.map(lambda v: v[0], problem[0])
    assert streaming.fragment_leaves(one, num_fragments, layout) == fragments
    assert_matches_reference(problem, fragments, num_fragments, delay, compression)


# Synchronous EAMSGD with the streaming exchange: the package's programs against the
# reference with eq. (7)'s velocity. P = 1, V = 0 and no compression is today's eamsgd
# (the same programs bit for bit: tests/test_streaming_runs.py), here against the
# reference too.


def eamsgd_run(problem, num_fragments, layout, delay, compression, steps):
  """``eamsgd``'s programs, the host's choice per clock, p workers under
  ``jax.vmap(axis_name="w")``, float64, each worker from its x0 and the center
  set to c0 after ``init``; (worker, shared) after each step."""
  x0, c0, batch, loss, _ = problem
  x = jax.tree.map(jnp.asarray, x0)
  exchange = streaming.ExchangeTechniques(
      num_fragments,
      layout,
      delay,
      compression,
      param_shapes=jax.tree.map(lambda v: v[0], x),
  )
  algo = algorithms.eamsgd(
      loss,
      optax.sgd(ETA),
      num_workers=P_WORKERS,
      momentum=DELTA,
      tau=TAU,
      alpha=ALPHA,
      exchange=exchange,
      axis_name="w",
  )
  worker, shared = jax.vmap(algo.init)(x)
  center = jax.tree.map(lambda v: jnp.broadcast_to(jnp.asarray(v), (P_WORKERS,) + v.shape), c0)
  shared = shared._replace(center=center)
  programs = {
      name: jax.jit(jax.vmap(program.step, in_axes=(0, 0, 0, None), axis_name="w"))
      for name, program in algo.programs().items()
  }
  out = []
  for t in range(steps):
    worker, shared, _ = programs[algo.program_at(t)](worker, shared, batch, jax.random.key(0))
    out.append((worker, shared))
  return out


def assert_eamsgd_matches_reference(problem, num_fragments, layout, delay, compression):
  """x^i, v^i, e^i and the center after every step within float64 round-off."""
  fragments = streaming.fragment_leaves(problem[1], num_fragments, layout)
  keys, ref = reference_of(problem, fragments, num_fragments, delay, compression, DELTA)
  got = eamsgd_run(problem, num_fragments, layout, delay, compression, STEPS)
  close = functools.partial(np.testing.assert_allclose, rtol=1e-12, atol=1e-14)
  for t, ((rx, rc, re, rv), (worker, shared)) in enumerate(zip(ref, got)):
    for n, k in enumerate(keys):
      for i in range(P_WORKERS):
        close(worker.params[k][i], rx[i][n], err_msg=f"x^{i} leaf {k} after step {t}")
        close(worker.velocity[k][i], rv[i][n], err_msg=f"v^{i} leaf {k} after step {t}")
        close(shared.center[k][i], rc[n], err_msg=f"center leaf {k} after step {t} (worker {i})")
        if compression is not None:
          close(worker.stream.error[k][i], re[i][n], err_msg=f"e^{i} leaf {k} after step {t}")


@pytest.mark.parametrize(
    "num_fragments, delay, compression",
    [
        (1, 0, None),
        (1, 1, None),
        (2, 0, None),
        (3, TAU - 1, None),
        (2, 1, INT8),
        (3, 0, INT4),
        (2, TAU - 1, TOPK),
    ],
    ids=lambda v: getattr(v, "kind", str(v)),
)
def test_eamsgd_on_the_quadratic_matches_the_reference(
    quadratic_problem, num_fragments, delay, compression
):
  with jax.enable_x64(True):
    assert_eamsgd_matches_reference(
        quadratic_problem, num_fragments, "contiguous", delay, compression
    )


@pytest.mark.parametrize(
    "num_fragments, delay, compression, layout",
    [
        (1, 0, None, "contiguous"),
        (2, 1, INT8, "contiguous"),
        (3, TAU - 1, TOPK, "strided"),
        (2, 0, INT4, "strided"),
    ],
    ids=lambda v: getattr(v, "kind", str(v)),
)
def test_eamsgd_on_the_mlp_matches_the_reference(num_fragments, delay, compression, layout):
  with jax.enable_x64(True):
    assert_eamsgd_matches_reference(mlp(), num_fragments, layout, delay, compression)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_one_fragment_no_delay_no_compression_is_easgd_update_bit_for_bit(dtype):
  rng = np.random.default_rng(2)
  shapes = {"a": (3,), "b": (2, 2)}
  x = {k: jnp.asarray(rng.normal(size=(P_WORKERS,) + s), dtype) for k, s in shapes.items()}
  c = {k: jnp.asarray(rng.normal(size=(P_WORKERS,) + s), jnp.float32) for k, s in shapes.items()}
  c = jax.tree.map(lambda v: jnp.broadcast_to(v[:1], v.shape), c)
  us = [
      jax.tree.map(lambda v: jnp.asarray(0.1 * rng.normal(size=v.shape), dtype), x)
      for _ in range(2 * TAU)
  ]
  state = streaming.init_stream_state(x, 0, None)
  want_x, want_c = x, c
  for t, u in enumerate(us):
    event = streaming.events(t, TAU, 1, 0)
    want_x, want_c = jax.vmap(
        lambda x, u, c: elastic.easgd_update(x, u, c, 0.3, event[0] is not None, "w"),
        axis_name="w",
    )(want_x, u, want_c)
    x, c, state = jax.vmap(
        lambda x, u, c: streaming.streaming_elastic_update(
            x, u, c, state, 0.3, event, (0, 0), None, "w"
        ),
        axis_name="w",
    )(x, u, c)
    for got, want in zip(jax.tree.leaves((x, c)), jax.tree.leaves((want_x, want_c))):
      assert got.dtype == want.dtype
      np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_a_send_leaves_the_compression_error_in_the_accumulator():
  """One worker (axis_name None), int8, an accumulator holding e: after the send
  e' = g - C(g) with d = alpha (x - c) and g = d + e, exactly; the worker moves by
  its exact difference, x' = (x - d) + u, the center by what was sent, c' = c + C(g)."""
  rng = np.random.default_rng(3)
  x = {"a": jnp.asarray(rng.normal(size=7), jnp.float32)}
  c = {"a": jnp.asarray(rng.normal(size=7), jnp.float32)}
  u = {"a": jnp.asarray(rng.normal(size=7), jnp.float32)}
  compression = Compression("int8", block_size=3)
  state = streaming.init_stream_state(x, 0, compression)
  state = state._replace(error={"a": jnp.asarray(rng.normal(size=7) * 1e-2, jnp.float32)})
  new_x, new_c, new_state = streaming.streaming_elastic_update(
      x, u, c, state, ALPHA, (0, 0), (0,), compression, None
  )
  d = elastic.elastic_difference([x["a"]], [c["a"]], ALPHA)[0]
  g = d + state.error["a"]
  m = streaming.compress({"a": g}, compression)["a"]
  assert np.any(np.asarray(g - m))
  np.testing.assert_array_equal(new_state.error["a"], g - m)
  np.testing.assert_array_equal(new_x["a"], (x["a"] - d) + u["a"])
  np.testing.assert_array_equal(new_c["a"], c["a"] + m)


@pytest.mark.parametrize("delay", [0, 1])
@pytest.mark.parametrize("compression", [INT8, TOPK], ids=lambda v: v.kind)
def test_an_exchange_conserves_center_plus_workers_plus_accumulators(compression, delay):
  """x~ + sum_i x^i + sum_i e^i is unchanged by an exchange (send and application,
  u = 0), float64, 3 workers holding nonzero accumulators: the worker moves by
  -d^i, the center by sum_i C(d^i + e^i), e^i by C(d^i + e^i)'s remainder minus e^i."""
  rng = np.random.default_rng(5)
  with jax.enable_x64(True):
    x = {
        "a": jnp.asarray(rng.normal(size=(P_WORKERS, 6))),
        "b": jnp.asarray(rng.normal(size=(P_WORKERS, 3))),
    }
    c = jax.tree.map(
        lambda v: jnp.broadcast_to(jnp.asarray(rng.normal(size=v.shape[1:])), v.shape), x
    )
    u = jax.tree.map(jnp.zeros_like, x)
    state = jax.vmap(lambda w: streaming.init_stream_state(w, delay, compression))(x)
    state = state._replace(error=jax.tree.map(lambda v: 0.1 * rng.normal(size=v.shape), x))

    def total(x, c, state):  # the center is identical on all workers: worker 0's copy
      return [c[k][0] + x[k].sum(0) + state.error[k].sum(0) for k in sorted(x)]

    before = total(x, c, state)
    for event in [(0, 0)] if delay == 0 else [(0, None), (None, 0)]:
      x, c, state = jax.vmap(
          lambda x, u, c, s, event=event: streaming.streaming_elastic_update(
              x, u, c, s, ALPHA, event, (0, 0), compression, "w"
          ),
          axis_name="w",
      )(x, u, c, state)
    assert np.any(np.asarray(state.error["a"]))
    for got, want in zip(total(x, c, state), before):
      np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def test_top_k_does_not_overshoot_the_elastic_pull():
  """2 workers x^1 = v, x^2 = -v around x~ = 0, one leaf of 8 entries of distinct
  magnitudes, top-k 0.25 (2 entries a send), alpha 0.3, u = 0, eight exchanges.
  The two messages cancel (C(-g) = -C(g)), so x~ stays 0 and each worker moves by
  its exact difference: x^i - x~ = 0.7^s (x^i_0 - x~_0) after s exchanges, every
  entry shrinking monotonically. The rule that moved the worker by C(g) instead
  (what C dropped counted twice: still in x - x~ and in e) sends an entry late as
  a pulse of several alpha (x - x~) and flips its sign (hand-computed below)."""
  v = np.array([1.0, -0.9, 0.8, -0.7, 0.6, -0.5, 0.4, -0.3])
  compression = Compression("topk", fraction=0.25)
  with jax.enable_x64(True):
    x = {"a": jnp.asarray(np.stack([v, -v]))}
    c = {"a": jnp.zeros((2, 8), jnp.float64)}
    u = jax.tree.map(jnp.zeros_like, x)
    state = jax.vmap(lambda w: streaming.init_stream_state(w, 0, compression))(x)
    step = jax.jit(
        jax.vmap(
            lambda x, u, c, s: streaming.streaming_elastic_update(
                x, u, c, s, ALPHA, (0, 0), (0,), compression, "w"
            ),
            axis_name="w",
        )
    )
    for s in range(1, 9):
      x, c, state = step(x, u, c, state)
      np.testing.assert_array_equal(c["a"], 0)
      np.testing.assert_allclose(x["a"], (1 - ALPHA) ** s * np.stack([v, -v]), rtol=1e-12)
  # The old rule on worker 1, by hand (x~ stays 0 there too): after the 1st to 4th
  # sends (entries 0-1, 2-3, 4-5, 0-1 by |g|) x = (0.07, -0.063, 0.32, -0.28, 0.06,
  # -0.05, 0.4, -0.3), e_6 = 4 * 0.3 * 0.4 = 0.48, e_7 = -0.36: the 5th send takes
  # entries 6-7 (g_6 = 0.12 + 0.48, g_7 = -0.09 - 0.36) and moves x_6 by a pulse of
  # 5 alpha x_6 = -0.6 to -0.2, past x~ = 0 (and x_7 from -0.3 to 0.15).
  old_x, old_e = v.copy(), np.zeros(8)
  for _ in range(5):
    g = ALPHA * old_x + old_e
    keep = np.argsort(-np.abs(g), kind="stable")[:2]
    m = np.zeros(8)
    m[keep] = g[keep]
    old_x, old_e = old_x - m, g - m
  np.testing.assert_allclose(old_x[6:], [-0.2, 0.15], rtol=1e-12)


def test_nested_worker_axes_gather_in_worker_index_order():
  """2 x 2 workers over ("a", "b") give what 4 workers over one axis give."""
  rng = np.random.default_rng(4)
  x = {"w": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)}
  c = {"w": jnp.zeros((4, 5), jnp.float32)}
  u = jax.tree.map(jnp.zeros_like, x)
  compression = Compression("topk", fraction=0.4)
  state = jax.vmap(lambda w: streaming.init_stream_state(w, 0, compression))(x)

  def step(axis):
    return lambda x, u, c, s: streaming.streaming_elastic_update(
        x, u, c, s, ALPHA, (0, 0), (0,), compression, axis
    )

  flat = jax.vmap(step("w"), axis_name="w")(x, u, c, state)
  nested = jax.vmap(jax.vmap(step(("a", "b")), axis_name="b"), axis_name="a")(
      *jax.tree.map(lambda v: v.reshape((2, 2) + v.shape[1:]), (x, u, c, state))
  )
  for got, want in zip(jax.tree.leaves(nested), jax.tree.leaves(flat)):
    np.testing.assert_array_equal(np.asarray(got).reshape(want.shape), want)


# Hand-worked compressors.


def test_quantize_int8_by_hand():
  # scale = 1 / 127; 0.5 * 127 = 63.5 -> 64 (half to even), 0.25 * 127 = 31.75 -> 32.
  q, scales = streaming.quantize(jnp.array([0.5, -1.0, 0.25, 0.0]), 8, 4)
  np.testing.assert_array_equal(q, np.array([64, -127, 32, 0], np.int8))
  assert q.dtype == jnp.int8 and scales.dtype == jnp.float32
  np.testing.assert_array_equal(scales, [np.float32(1 / 127)])
  np.testing.assert_array_equal(
      streaming.dequantize(q, scales, (4,), jnp.float32, 4),
      np.float32([64, -127, 32, 0]) * scales[0],
  )


def test_quantize_int4_zero_block_and_short_last_block():
  # Blocks [0.5, -1.0, 0.25] (scale 1/7: 3.5 -> 4, -7, 1.75 -> 2), [0, 0, 0] (scale 0),
  # [2.5] (the short last block, scale 2.5 / 7: 7).
  x = jnp.array([0.5, -1.0, 0.25, 0.0, 0.0, 0.0, 2.5])
  q, scales = streaming.quantize(x, 4, 3)
  np.testing.assert_array_equal(q, [4, -7, 2, 0, 0, 0, 7])
  np.testing.assert_array_equal(scales, np.float32([1 / 7, 0, 2.5 / 7]))
  back = streaming.dequantize(q, scales, (7,), jnp.float32, 3)
  np.testing.assert_array_equal(back[3:6], [0, 0, 0])
  np.testing.assert_allclose(back, [4 / 7, -1, 2 / 7, 0, 0, 0, 2.5], rtol=1e-6)


def test_top_k_ties_take_the_lower_index_first():
  x = jnp.array([[1.0, -3.0, 3.0], [2.0, -2.0, 0.5]])
  values, indices = streaming.top_k(x, 0.4)  # k = ceil(2.4) = 3
  np.testing.assert_array_equal(indices, [1, 2, 3])
  np.testing.assert_array_equal(values, [-3.0, 3.0, 2.0])
  np.testing.assert_array_equal(
      streaming.densify(values, indices, (2, 3), jnp.float32), [[0, -3, 3], [2, 0, 0]]
  )
  _, one = streaming.top_k(x, 0.01)  # k = max(1, ceil(0.06)) = 1
  np.testing.assert_array_equal(one, [1])


def test_payload_bytes():
  assert Compression("int8", block_size=256).payload_bytes(1000) == 1000 + 4 * 4
  assert Compression("int4", block_size=256).payload_bytes(1001) == 501 + 4 * 4
  assert Compression("topk", fraction=0.01).payload_bytes(1000) == 8 * 10
  assert Compression("topk", fraction=0.01).payload_bytes(50) == 8 * 1
  params = {
      "a": jnp.zeros(10, jnp.float32),
      "b": jnp.zeros((2, 3), jnp.bfloat16),
      "c": jnp.zeros(4, jnp.float32),
  }
  assert streaming.fragment_bytes(params, (0, 1, 1), None) == (40, 6 * 4 + 16)
  assert streaming.fragment_bytes(params, (0, 1, 1), Compression("int8", block_size=4)) == (
      10 + 4 * 3,
      6 + 4 * 2 + 4 + 4,
  )


# Fragments and the schedule.


def test_fragment_leaves_by_hand():
  params = {"a": np.zeros(10), "b": np.zeros(1), "c": np.zeros(1), "d": np.zeros(10)}
  assert streaming.fragment_leaves(params, 1) == (0, 0, 0, 0)
  assert streaming.fragment_leaves(params, 2) == (0, 0, 1, 1)  # 11 of 22 closes fragment 0
  assert streaming.fragment_leaves(params, 3) == (0, 1, 1, 2)  # the last leaf kept for 2
  assert streaming.fragment_leaves(params, 4) == (0, 1, 2, 3)
  assert streaming.fragment_leaves(params, 3, "strided") == (0, 1, 2, 0)
  big_first = {"a": np.zeros(100), "b": np.zeros(1), "c": np.zeros(1)}
  assert streaming.fragment_leaves(big_first, 3) == (0, 1, 2)


def test_fragment_offsets_and_events_by_hand():
  assert streaming.fragment_offsets(3, 4) == (0, 1, 2)
  assert streaming.fragment_offsets(2, 5) == (0, 2)
  assert streaming.fragment_offsets(4, 4) == (0, 1, 2, 3)
  assert streaming.fragment_offsets(1, 7) == (0,)
  # tau 4, P 2 (offsets 0, 2), delay 1: each fragment applied one step after its send.
  assert [streaming.events(t, 4, 2, 1) for t in range(6)] == [
      (0, None),
      (None, 0),
      (1, None),
      (None, 1),
      (0, None),
      (None, 0),
  ]
  # delay 3: fragment 1 is sent (t = 2) while fragment 0 is still in flight.
  assert [streaming.events(t, 4, 2, 3) for t in range(8)] == [
      (0, None),
      (None, None),
      (1, None),
      (None, 0),
      (0, None),
      (None, 1),
      (1, None),
      (None, 0),
  ]
  assert [streaming.events(t, 3, 1, 0) for t in range(4)] == [
      (0, 0),
      (None, None),
      (None, None),
      (0, 0),
  ]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: streaming.fragment_leaves({"a": 1.0, "b": 2.0}, 3), "got 3"),
        (lambda: streaming.fragment_leaves({"a": 1.0}, 0), "got 0"),
        (lambda: streaming.fragment_leaves({"a": 1.0}, 1.5), "got 1.5"),
        (lambda: streaming.fragment_leaves({"a": 1.0}, 1, "random"), "unknown layout 'random'"),
        (lambda: streaming.fragment_offsets(5, 4), "tau >= P.*got 5"),
        (lambda: streaming.check_delay(4, 4), r"\[0, 3\], got 4"),
        (lambda: streaming.check_delay(-1, 4), "got -1"),
        (lambda: streaming.quantize(jnp.zeros(4), 3, 4), "unknown bits 3"),
        (lambda: streaming.quantize(jnp.zeros(4), 8, 0), "block_size.*got 0"),
        (lambda: streaming.top_k(jnp.zeros(4), 0), r"fraction.*\(0, 1\], got 0"),
        (lambda: Compression("topk", fraction=0), r"fraction.*\(0, 1\], got 0"),
        (lambda: Compression("topk", fraction=1.5), "got 1.5"),
        (lambda: Compression("int8", block_size=0), "block_size.*got 0"),
        (lambda: Compression("int2"), "unknown kind 'int2'"),
        (
            lambda: streaming.streaming_elastic_update(
                {"a": jnp.zeros(2)},
                {"a": jnp.zeros(2)},
                {"a": jnp.zeros(2)},
                streaming.init_stream_state({"a": jnp.zeros(2)}, 0, None),
                0.1,
                (0, 0),
                (0, 0),
                None,
                None,
            ),
            "fragments must give.*1 leaves",
        ),
        (
            lambda: streaming.streaming_elastic_update(
                {"a": jnp.zeros(2)},
                {"a": jnp.zeros(2)},
                {"a": jnp.zeros(2)},
                streaming.init_stream_state({"a": jnp.zeros(2)}, 0, None),
                0.1,
                (0, None),
                (0,),
                None,
                None,
            ),
            r"event \(0, None\) must send and apply the same fragment",
        ),
        (
            lambda: streaming.streaming_elastic_update(
                {"a": jnp.zeros(2)},
                {"a": jnp.zeros(2)},
                {"a": jnp.zeros(2)},
                streaming.init_stream_state({"a": jnp.zeros(2)}, 1, None),
                0.1,
                (0, None),
                (0,),
                INT8,
                None,
            ),
            "compression Compression.*does not match",
        ),
        (lambda: streaming.init_stream_state({"a": jnp.zeros(2)}, -1, None), "delay.*got -1"),
    ],
)
def test_bad_input_is_one_line_naming_the_value(call, match):
  with pytest.raises(HyperparameterError, match=match) as caught:
    call()
  assert "\n" not in str(caught.value)
