"""Streaming DiLoCo (easgd.methods.streaming_diloco) against an independent float64
NumPy reference written from its equations, event by event, on a quadratic and a
tiny tanh MLP; P = 1, V = 0, alpha = 1, no compression against DiLoCo bit for bit;
the all-reduce and all-gather bytes of the compiled programs against the accounting;
a run on the command line; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd import cli
from easgd.core import streaming
from easgd.core.elastic import HyperparameterError
from easgd.methods import baselines, registry
from easgd.methods.streaming_diloco import ALL, streaming_diloco
from easgd.parallel import placement, worker_layout
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import models

from testutil import TINY_DIGITS, mlp_setup, program_collectives, random_batches, tanh_mlp

P_WORKERS, TAU, LR, OUTER_LR, OUTER_MU, STEPS = 3, 4, 0.1, 0.7, 0.9, 10
"""Workers, period, inner and outer learning rates, outer momentum, steps: two
periods and a shorter last round (the last step, 9, syncs every fragment)."""
SHAPES = [(2,), (3,), (2, 2)]  # leaves a, b, c (9 entries)
FRAGMENTS = {1: [0, 0, 0], 2: [0, 0, 1], 3: [0, 1, 2]}
"""Fragment of each leaf, contiguous: P = 2 closes F_0 once it holds >= 9/2 entries."""
BLOCK = 2  # int8: entries per scale (several blocks per leaf)


def problem(seed=0):
  """Quadratic: loss^i_t = sum_k 0.5 h_k |x_k - y^i_{t,k}|^2, so g = h (x - y)."""
  rng = np.random.default_rng(seed)
  x0 = [rng.normal(size=s) for s in SHAPES]
  h = [rng.uniform(0.5, 2.0, size=s) for s in SHAPES]
  targets = [[[rng.normal(size=s) for s in SHAPES] for _ in range(P_WORKERS)] for _ in range(STEPS)]
  return x0, h, targets


# -- NumPy reference, from the module docstring's equations (no package code) -----


def ref_int8(g):
  """C(g): blockwise int8, q = round(g * 127 / max|block|), scale float32(max / 127)."""
  flat, out = g.ravel(), np.zeros(g.size)
  for start in range(0, g.size, BLOCK):
    block = flat[start : start + BLOCK]
    amax = np.max(np.abs(block))
    if amax > 0:
      q = np.clip(np.round(block * 127 / amax), -127, 127)
      out[start : start + BLOCK] = q * float(np.float32(amax / 127))
  return out.reshape(g.shape)


def reference(x0, grad, frag, num_fragments, delay, alpha, compressed, last_step):
  """The workers' and the outer model's leaves after STEPS steps, every worker from
  the leaves ``x0``; ``grad(t, i, leaves)`` is worker i's gradient at clock t and
  ``frag`` the fragment of each leaf."""
  offsets = [j * TAU // num_fragments for j in range(num_fragments)]
  x = [[v.copy() for v in x0] for _ in range(P_WORKERS)]
  center = [v.copy() for v in x0]
  momentum = [np.zeros_like(v) for v in x0]
  error = [[np.zeros_like(v) for v in x0] for _ in range(P_WORKERS)]
  for t in range(STEPS):
    for i in range(P_WORKERS):  # inner SGD step
      x[i] = [v - LR * g for v, g in zip(x[i], grad(t, i, x[i]))]
    if t == last_step:
      syncs = merges = list(range(num_fragments))
    else:
      syncs = [j for j, o in enumerate(offsets) if (t + 1 - o) % TAU == 0]
      merges = [j for j, o in enumerate(offsets) if t >= delay and (t - delay + 1 - o) % TAU == 0]
    for j in syncs:
      for k in (k for k in range(len(x0)) if frag[k] == j):
        if compressed:
          sent = []
          for i in range(P_WORKERS):
            g = center[k] - x[i][k] + error[i][k]
            sent.append(ref_int8(g))
            error[i][k] = g - sent[-1]
          delta = sum(sent) / P_WORKERS
        else:
          delta = center[k] - sum(x[i][k] for i in range(P_WORKERS)) / P_WORKERS
        momentum[k] = OUTER_MU * momentum[k] + delta
        center[k] = center[k] - OUTER_LR * (delta + OUTER_MU * momentum[k])
    for j in merges:
      for k in (k for k in range(len(x0)) if frag[k] == j):
        for i in range(P_WORKERS):
          x[i][k] = (1 - alpha) * x[i][k] + alpha * center[k]
  return x, center


def quadratic_reference(num_fragments, delay, alpha, compressed, last_step, seed=0):
  x0, h, targets = problem(seed)

  def grad(t, i, leaves):
    return [hk * (v - y) for v, hk, y in zip(leaves, h, targets[t][i])]

  frag = FRAGMENTS[num_fragments]
  return reference(x0, grad, frag, num_fragments, delay, alpha, compressed, last_step)


# -- the package, p workers under jax.vmap(axis_name="w") -------------------------


def tree(leaves):
  return dict(zip("abc", leaves))


def quadratic_loss(h):
  h = tree([jnp.asarray(v) for v in h])

  def loss_fn(params, batch, key):
    return sum(0.5 * jnp.sum(h[n] * (params[n] - batch[n]) ** 2) for n in params)

  return loss_fn


def build(
    params,
    loss_fn,
    *,
    num_fragments=1,
    layout="contiguous",
    delay=0,
    alpha=1.0,
    compressed=False,
    num_steps=STEPS,
):
  """The algorithm on ``params`` (its shapes fix the fragments), int8 blocks of BLOCK."""
  exchange = streaming.ExchangeTechniques(
      num_fragments,
      layout,
      delay=delay,
      compression=streaming.Compression("int8", block_size=BLOCK) if compressed else None,
      param_shapes=params,
  )
  return streaming_diloco(
      loss_fn,
      optax.sgd(LR),
      num_workers=P_WORKERS,
      tau=TAU,
      outer_learning_rate=OUTER_LR,
      outer_momentum=OUTER_MU,
      alpha=alpha,
      exchange=exchange,
      num_steps=num_steps,
      axis_name="w",
  )


def build_quadratic(x0, h, **kw):
  """``(algorithm, params, loss_fn)`` of the quadratic from the leaves x0."""
  params = tree([jnp.asarray(v) for v in x0])
  loss_fn = quadratic_loss(h)
  return build(params, loss_fn, **kw), params, loss_fn


def target_batches(targets):
  """batch_at(t) of :func:`run`: the per-worker targets of clock t, stacked."""
  return lambda t: jax.tree.map(
      lambda *v: jnp.stack(v), *[tree([jnp.asarray(v) for v in y]) for y in targets[t]]
  )


def run(algo, params, batch_at, on_device=False):
  """The algorithm's programs (the host's choice per clock), or its ``step``;
  ``batch_at(t)``: the workers' batches of clock t (leading axis p)."""
  worker, shared = jax.vmap(lambda _: algo.init(params))(jnp.arange(P_WORKERS))
  programs = algo.programs()
  for t in range(STEPS):
    step = algo.step if on_device else programs[algo.program_at(t)].step
    worker, shared, _ = jax.vmap(step, in_axes=(0, 0, 0, None), axis_name="w")(
        worker, shared, batch_at(t), jax.random.key(0)
    )
  return worker, shared


CASES = [  # P, V, alpha, int8
    (1, 0, 1.0, False),
    (1, 1, 0.5, False),
    (2, 0, 0.5, False),
    (2, 1, 1.0, True),
    (3, 1, 0.5, False),
    (3, 0, 1.0, True),
    (3, 1, 0.5, True),
]


@pytest.mark.parametrize("num_fragments, delay, alpha, compressed", CASES)
@pytest.mark.parametrize("num_steps", [STEPS, None])
def test_the_programs_follow_the_float64_reference(
    num_fragments, delay, alpha, compressed, num_steps
):
  x0, h, targets = problem()
  with jax.enable_x64(True):
    algo, params, _ = build_quadratic(
        x0,
        h,
        num_fragments=num_fragments,
        delay=delay,
        alpha=alpha,
        compressed=compressed,
        num_steps=num_steps,
    )
    assert streaming.fragment_leaves(params, num_fragments) == tuple(FRAGMENTS[num_fragments])
    worker, shared = run(algo, params, target_batches(targets))
  last_step = None if num_steps is None else num_steps - 1
  want_x, want_c = quadratic_reference(num_fragments, delay, alpha, compressed, last_step)
  for k, n in enumerate("abc"):
    for i in range(P_WORKERS):
      np.testing.assert_allclose(worker.params[n][i], want_x[i][k], rtol=0, atol=1e-12)
      np.testing.assert_array_equal(shared.center[n][i], shared.center[n][0])  # replicated
    np.testing.assert_allclose(shared.center[n][0], want_c[k], rtol=0, atol=1e-12)
  assert int(shared.step[0]) == STEPS


MLP_CASES = [  # P, layout, V, alpha, int8
    (1, "contiguous", 0, 1.0, False),
    (1, "contiguous", 1, 0.5, True),
    (2, "contiguous", 0, 0.5, True),
    (2, "contiguous", 1, 1.0, False),
    (2, "strided", 1, 0.5, True),
]
MLP_FRAGMENTS = {
    (1, "contiguous"): (0, 0, 0, 0),
    (2, "contiguous"): (0, 0, 0, 1),
    (2, "strided"): (0, 1, 0, 1),
}
"""fragment_leaves of the MLP (b1 4, b2 2, w1 12, w2 8 entries): contiguous P = 2
closes F_0 once it holds >= 26/2 entries, after w1; strided: leaf k in F_{k mod 2}."""


@pytest.mark.parametrize("num_fragments, layout, delay, alpha, compressed", MLP_CASES)
def test_the_programs_follow_the_float64_reference_on_an_mlp(
    num_fragments, layout, delay, alpha, compressed
):
  """The 3-4-2 tanh MLP of ``testutil.tanh_mlp``, every worker from its c0 and on
  its own fixed batch of 5; the last step (9) syncs every fragment."""
  _, c0, data, loss, np_grad = tanh_mlp(P_WORKERS)
  keys = sorted(c0)
  want_x, want_c = reference(
      [c0[k] for k in keys],
      lambda t, i, leaves: np_grad(i, leaves),
      MLP_FRAGMENTS[num_fragments, layout],
      num_fragments,
      delay,
      alpha,
      compressed,
      STEPS - 1,
  )
  with jax.enable_x64(True):
    params = jax.tree.map(jnp.asarray, c0)
    fragments = streaming.fragment_leaves(params, num_fragments, layout)
    assert fragments == MLP_FRAGMENTS[num_fragments, layout]
    algo = build(
        params,
        loss,
        num_fragments=num_fragments,
        layout=layout,
        delay=delay,
        alpha=alpha,
        compressed=compressed,
    )
    batch = jax.tree.map(jnp.asarray, data)
    worker, shared = run(algo, params, lambda t: batch)
  for k, n in enumerate(keys):
    for i in range(P_WORKERS):
      np.testing.assert_allclose(worker.params[n][i], want_x[i][k], rtol=0, atol=1e-12)
      np.testing.assert_array_equal(shared.center[n][i], shared.center[n][0])  # replicated
    np.testing.assert_allclose(shared.center[n][0], want_c[k], rtol=0, atol=1e-12)
  assert int(shared.step[0]) == STEPS


def test_the_device_decided_step_equals_the_programs():
  x0, h, targets = problem(1)
  with jax.enable_x64(True):
    algo, params, _ = build_quadratic(x0, h, num_fragments=3, delay=1, alpha=0.5, compressed=True)
    assert len(algo.phases) == 6  # 5 periodic events and the last step's
    by_programs = run(algo, params, target_batches(targets))
    on_device = run(algo, params, target_batches(targets), on_device=True)
  for a, b in zip(jax.tree.leaves(by_programs), jax.tree.leaves(on_device)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)


@pytest.mark.parametrize("num_steps", [STEPS, 2 * TAU, None])
def test_one_fragment_no_delay_alpha_one_is_diloco_bit_for_bit(num_steps):
  x0, h, targets = problem(2)
  x0 = [np.float32(v) for v in x0]
  algo, params, loss_fn = build_quadratic(x0, h, num_steps=num_steps)
  want = baselines.diloco(
      loss_fn,
      optax.sgd(LR),
      num_workers=P_WORKERS,
      tau=TAU,
      outer_learning_rate=OUTER_LR,
      outer_momentum=OUTER_MU,
      num_steps=num_steps,
      axis_name="w",
  )
  worker, shared = run(algo, params, target_batches(targets))
  worker_d, shared_d = run(want, params, target_batches(targets))
  for n in "abc":
    np.testing.assert_array_equal(worker.params[n], worker_d.params[n])
    np.testing.assert_array_equal(shared.center[n], shared_d.center[n])
  for steps in (1, 3, 4, 7, 8, 9, 10, 11):
    assert algo.communication(steps, 36) == want.communication(steps, 36), steps


def test_communication_counts_one_collective_per_fragment_sync():
  x0, h, _ = problem()
  # P = 3 (o = 0, 1, 2; bytes 8, 12, 16 in float32), 10 steps: syncs of F_1 at 0, 4, 8,
  # F_2 at 1, 5, F_0 at 3, 7 before the last step, 9, which sends all 36 bytes once
  algo, _, _ = build_quadratic([np.float32(v) for v in x0], h, num_fragments=3, delay=1)
  assert algo.communication(STEPS, 0) == (8, 3 * 12 + 2 * 16 + 2 * 8 + 36, 0, 0)
  assert algo.communication(9, 0) == (7, 3 * 12 + 2 * 16 + 2 * 8, 0, 0)
  packed = build_quadratic([np.float32(v) for v in x0], h, num_fragments=2, compressed=True)[0]
  # int8, blocks of 2: F_0 = a, b: 2 + 4 + 3 + 8 = 17 bytes; F_1 = c: 4 + 8 = 12
  assert packed.communication(STEPS, 0) == (0, 0, 5, 2 * 17 + 2 * 12 + 29)


# -- the bytes of the compiled programs -------------------------------------------

LAYOUT_WORKERS, LAYOUT_BATCH, RUN_STEPS = 4, 4, 10
"""Workers, examples per worker, and the run's length for the compiled programs:
periodic syncs at clocks 0..8 and the last step's sync of every fragment at 9."""
BYTES_CONFIGS = {
    "P2-contiguous-V0": dict(fragments=2),
    "P3-strided-V1-a0.5": dict(
        fragments=3, fragment_layout="strided", delay=1, alpha=0.5, beta=None
    ),
    "P2-V1-int8": dict(fragments=2, delay=1, compression="int8"),
    "P2-V0-int4-a0.5": dict(fragments=2, compression="int4", alpha=0.5, beta=None),
    "P3-V1-topk": dict(fragments=3, delay=1, compression="topk", topk_fraction=0.1),
}
BYTES_LAYOUTS = {  # devices, backend: 1 worker a device, or 2 vmapped workers a device
    "4x1-pmap": (4, "pmap"),
    "2x2-pmap": (2, "pmap"),
    "2x2-shard_map": (2, "shard_map"),
}


def build_on_layout(params, loss_fn, num_devices, backend, **settings):
  """The config's streaming_diloco (RUN_STEPS steps) placed on ``num_devices`` devices,
  and the arguments of its mapped programs."""
  cfg = TrainConfig(
      algorithm="streaming_diloco",
      num_workers=LAYOUT_WORKERS,
      tau=TAU,
      global_batch_size=LAYOUT_BATCH * LAYOUT_WORKERS,
      mapping_backend=backend,
      **settings,
  ).validate()
  algo = registry.make_algorithm(cfg, loss_fn, optax.sgd(0.1), RUN_STEPS, params)
  layout = worker_layout.make_layout(LAYOUT_WORKERS, num_devices, backend=backend)
  worker, shared = placement.place_state(algo, params, layout)
  xs, ys = random_batches(1, LAYOUT_WORKERS, LAYOUT_BATCH)
  batch = placement.split_workers((xs[0], ys[0]), layout, kind="batch")
  return algo, layout, (worker, shared, batch, jax.random.key(0))


def exchange_bytes(reduces, gathers):
  """One worker's bytes of a program's exchange: the all-reduces' result bytes, and
  the all-gathers' over p (a gathered array is [p, payload])."""
  gathered = sum(b for _, b in gathers)
  assert gathered % LAYOUT_WORKERS == 0
  return sum(b for _, b in reduces) + gathered // LAYOUT_WORKERS


@pytest.mark.parametrize(
    "config_name, layout_name",
    [(c, layout) for c in BYTES_CONFIGS for layout in ("4x1-pmap", "2x2-shard_map")]
    + [("P2-contiguous-V0", "2x2-pmap"), ("P2-V1-int8", "2x2-pmap")],
)
def test_the_compiled_programs_send_the_bytes_the_accounting_counts(config_name, layout_name):
  """The collectives of the compiled programs, summed over the RUN_STEPS clocks (the
  program the host picks at each), equal ``communication(RUN_STEPS)``: one all-reduce
  of the fragment's leaves a sync (result bytes: the fragment's float32 bytes), or
  with compression all-gathers of every worker's payload (result bytes p x one
  worker's payload; XLA issues one a payload array: counted as one a sync); a
  collective exactly where a fragment (or, at the last step, every one) syncs, and
  each across all the devices."""
  params, loss_fn = mlp_setup()
  num_devices, backend = BYTES_LAYOUTS[layout_name]
  settings = BYTES_CONFIGS[config_name]
  algo, layout, args = build_on_layout(params, loss_fn, num_devices, backend, **settings)
  per_program = program_collectives(algo, layout, args)
  assert set(per_program) == set(algo.programs())  # one program per (sync, merge) event
  measured = dict(all_reduces=0, bytes=0, all_gathers=0, gathered_bytes=0)
  for t in range(RUN_STEPS):
    name = algo.program_at(t)
    reduces, gathers = per_program[name]
    assert bool(reduces or gathers) == (name[0] is not None), (t, name)
    assert (name[0] == ALL) == (t == RUN_STEPS - 1)
    assert len(reduces) <= 1  # one (variadic) all-reduce of the fragment's leaves
    measured["all_reduces"] += len(reduces)
    measured["bytes"] += sum(b for _, b in reduces)
    measured["all_gathers"] += bool(gathers)
    measured["gathered_bytes"] += exchange_bytes([], gathers)
    assert all(
        len(g) == num_devices for ops in (reduces, gathers) for groups, _ in ops for g in groups
    )
  comm = algo.communication(RUN_STEPS, models.param_bytes(params))
  assert measured == comm._asdict()
  compressed = "compression" in settings
  assert (comm.all_gathers > 0, comm.all_reduces > 0) == (compressed, not compressed)


def test_the_counted_bytes_are_the_payload_formulas():
  """Hand-computed per-worker bytes of RUN_STEPS = 10 steps of the MLP 5 -> 16 -> 3
  (leaves b (16,), w (5, 16), b (3,), w (16, 3): 147 float32, 588 bytes). P = 2
  contiguous: F_0 = the first two leaves (96 entries), F_1 = the last two (51),
  offsets 0 and 2: F_0 syncs at 3, 7, F_1 at 1, 5 (and 9, but that is the last step,
  which sends all 147 entries once). none: 4 bytes an entry, 2 (384 + 204) + 588 =
  1764. int8 (block 256, one scale a leaf): n + 4 a leaf: F_0 20 + 84 = 104, F_1
  7 + 52 = 59, 2 (104 + 59) + 163 = 489. topk 0.1: 8 ceil(0.1 n) a leaf: F_0
  8 (2 + 8) = 80, F_1 8 (1 + 5) = 48, 2 (80 + 48) + 128 = 384."""
  params, loss_fn = mlp_setup()
  expected = {
      "none": (5, 1764, 0, 0),
      "int8": (0, 0, 5, 489),
      "topk": (0, 0, 5, 384),
  }
  for compression, want in expected.items():
    cfg = TrainConfig(
        algorithm="streaming_diloco",
        num_workers=LAYOUT_WORKERS,
        tau=TAU,
        fragments=2,
        compression=compression,
        **(dict(topk_fraction=0.1) if compression == "topk" else {}),
    ).validate()
    algo = registry.make_algorithm(cfg, loss_fn, optax.sgd(0.1), RUN_STEPS, params)
    assert tuple(algo.communication(RUN_STEPS, 588)) == want, compression


def four_equal_leaves():
  """(params, loss_fn): four 4 x 4 float32 matrices (64 bytes each), a linear model."""
  params = {k: jnp.full((4, 4), 0.1 * (n + 1)) for n, k in enumerate("abcd")}

  def loss_fn(p, batch, key):
    x, y = batch
    z = x[:, :4] @ p["a"] @ p["b"] @ p["c"] @ p["d"]
    return jnp.mean((z[:, 0] - y) ** 2)

  return params, loss_fn


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_the_peak_exchange_of_p_equal_fragments_is_one_pth_of_the_whole(compression):
  """Four equal leaves, 4 workers on 4 devices: the largest exchange of a periodic
  program is 1/P of the unfragmented one (P = 1, 2, 4); the last step's, of every
  fragment at once, is the whole. none: 4 x 64 bytes; int8 (block 256, one scale a
  leaf): 4 x (16 + 4) = 80."""
  params, loss_fn = four_equal_leaves()
  peaks, last = {}, {}
  for fragments in (1, 2, 4):
    algo, layout, args = build_on_layout(
        params, loss_fn, 4, "pmap", fragments=fragments, compression=compression
    )
    sizes = {
        name: exchange_bytes(*ops) for name, ops in program_collectives(algo, layout, args).items()
    }
    peaks[fragments] = max(size for name, size in sizes.items() if name[0] != ALL)
    last[fragments] = sizes[(ALL, ALL)]
  whole = 4 * 64 if compression == "none" else 4 * 20
  assert peaks == {1: whole, 2: whole // 2, 4: whole // 4}
  assert last == {1: whole, 2: whole, 4: whole}


def test_a_run_on_the_command_line_completes(tmp_path, capsys):
  argv = ["train", "--workdir", str(tmp_path / "w"), "--dataset", "digits", "--model", "mlp"]
  argv += ["--num-workers", "4", "--num-devices", "2", "--global-batch-size", "64"]
  argv += ["--num-epochs", "1", "--learning-rate", "0.1", "--tau", "4", "--no-progress"]
  argv += ["--eval-batch-size", "64", "--algorithm", "streaming_diloco"]
  assert TINY_DIGITS.dataset == "digits"  # the tests' tiny run, one epoch of it
  assert cli.main(argv + ["--fragments", "2", "--delay", "1"]) == 0
  summary = (tmp_path / "w" / "summary.json").read_text()
  assert '"status": "complete"' in summary and '"algorithm": "streaming_diloco"' in summary


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(alpha=0.0), "alpha (merge moving rate) must be a finite real in (0, 1], got 0.0"),
        (dict(alpha=1.5), "alpha (merge moving rate) must be a finite real in (0, 1], got 1.5"),
        (dict(num_fragments=5), "fragments must be <= tau=4"),
        (dict(delay=4), "delay (steps, below tau) must be an integer in [0, 3], got 4"),
    ],
)
def test_bad_input_is_one_line(changes, named):
  x0, h, _ = problem()
  kw = dict(num_fragments=1, delay=0, alpha=1.0) | changes
  with pytest.raises(HyperparameterError) as e:
    build_quadratic(x0, h, **kw)
  assert "\n" not in str(e.value) and named in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "changes, named",
    [
        (
            dict(alpha=0.0),
            "alpha (the merge's moving rate) must be a finite real in (0, 1], got 0.0",
        ),
        (
            dict(alpha=1.5),
            "alpha (the merge's moving rate) must be a finite real in (0, 1], got 1.5",
        ),
        (dict(fragments=5), "fragments=5 needs tau >= fragments"),
        (dict(delay=4), "delay=4 must be below tau=4"),
        (dict(beta=0.5), "beta=0.5 is not read by algorithm 'streaming_diloco'"),
    ],
)
def test_the_config_refuses_bad_settings_in_one_line(changes, named):
  cfg = TrainConfig(algorithm="streaming_diloco", tau=4).replace(**changes)
  with pytest.raises(ConfigError) as e:
    cfg.validate()
  assert "\n" not in str(e.value) and named in str(e.value), str(e.value)


def test_the_config_reads_alpha_default_one_and_the_streaming_settings():
  assert TrainConfig(algorithm="streaming_diloco").validate().resolved_alpha == 1.0
  cfg = TrainConfig(algorithm="streaming_diloco").replace(alpha=0.5, fragments=2, delay=1)
  assert cfg.validate().resolved_alpha == 0.5 and cfg.beta is None
  assert registry.TABLE["streaming_diloco"].family == "averaging"
