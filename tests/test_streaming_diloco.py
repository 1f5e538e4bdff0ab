"""Streaming DiLoCo (easgd.methods.streaming_diloco) against an independent float64
NumPy reference written from its equations, event by event; P = 1, V = 0,
alpha = 1, no compression against DiLoCo bit for bit; a run on the command line;
bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd import cli
from easgd.core import streaming
from easgd.core.elastic import HyperparameterError
from easgd.methods import baselines, registry
from easgd.methods.streaming_diloco import streaming_diloco
from easgd.settings.config import ConfigError, TrainConfig

from testutil import TINY_DIGITS

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


def reference(num_fragments, delay, alpha, compressed, last_step, seed=0):
  x0, h, targets = problem(seed)
  frag = FRAGMENTS[num_fragments]
  offsets = [j * TAU // num_fragments for j in range(num_fragments)]
  x = [[v.copy() for v in x0] for _ in range(P_WORKERS)]
  center = [v.copy() for v in x0]
  momentum = [np.zeros_like(v) for v in x0]
  error = [[np.zeros_like(v) for v in x0] for _ in range(P_WORKERS)]
  for t in range(STEPS):
    for i in range(P_WORKERS):  # inner SGD step
      x[i] = [v - LR * hk * (v - y) for v, hk, y in zip(x[i], h, targets[t][i])]
    if t == last_step:
      syncs = merges = list(range(num_fragments))
    else:
      syncs = [j for j, o in enumerate(offsets) if (t + 1 - o) % TAU == 0]
      merges = [j for j, o in enumerate(offsets) if t >= delay and (t - delay + 1 - o) % TAU == 0]
    for j in syncs:
      for k in (k for k in range(len(SHAPES)) if frag[k] == j):
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
      for k in (k for k in range(len(SHAPES)) if frag[k] == j):
        for i in range(P_WORKERS):
          x[i][k] = (1 - alpha) * x[i][k] + alpha * center[k]
  return x, center


# -- the package, p workers under jax.vmap(axis_name="w") -------------------------


def tree(leaves):
  return dict(zip("abc", leaves))


def build(x0, h, *, num_fragments=1, delay=0, alpha=1.0, compressed=False, num_steps=STEPS):
  h = tree([jnp.asarray(v) for v in h])

  def loss_fn(params, batch, key):
    return sum(0.5 * jnp.sum(h[n] * (params[n] - batch[n]) ** 2) for n in params)

  params = tree([jnp.asarray(v) for v in x0])
  exchange = streaming.ExchangeTechniques(
      num_fragments,
      delay=delay,
      compression=streaming.Compression("int8", block_size=BLOCK) if compressed else None,
      param_shapes=params,
  )
  algo = streaming_diloco(
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
  return algo, params, loss_fn


def run(algo, params, targets, on_device=False):
  """The algorithm's programs (the host's choice per clock), or its ``step``."""
  worker, shared = jax.vmap(lambda _: algo.init(params))(jnp.arange(P_WORKERS))
  programs = algo.programs()
  for t in range(STEPS):
    batch = jax.tree.map(
        lambda *v: jnp.stack(v), *[tree([jnp.asarray(v) for v in y]) for y in targets[t]]
    )
    step = algo.step if on_device else programs[algo.program_at(t)].step
    worker, shared, _ = jax.vmap(step, in_axes=(0, 0, 0, None), axis_name="w")(
        worker, shared, batch, jax.random.key(0)
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
    algo, params, _ = build(
        x0,
        h,
        num_fragments=num_fragments,
        delay=delay,
        alpha=alpha,
        compressed=compressed,
        num_steps=num_steps,
    )
    assert streaming.fragment_leaves(params, num_fragments) == tuple(FRAGMENTS[num_fragments])
    worker, shared = run(algo, params, targets)
  last_step = None if num_steps is None else num_steps - 1
  want_x, want_c = reference(num_fragments, delay, alpha, compressed, last_step)
  for k, n in enumerate("abc"):
    for i in range(P_WORKERS):
      np.testing.assert_allclose(worker.params[n][i], want_x[i][k], rtol=0, atol=1e-12)
      np.testing.assert_array_equal(shared.center[n][i], shared.center[n][0])  # replicated
    np.testing.assert_allclose(shared.center[n][0], want_c[k], rtol=0, atol=1e-12)
  assert int(shared.step[0]) == STEPS


def test_the_device_decided_step_equals_the_programs():
  x0, h, targets = problem(1)
  with jax.enable_x64(True):
    algo, params, _ = build(x0, h, num_fragments=3, delay=1, alpha=0.5, compressed=True)
    assert len(algo.phases) == 6  # 5 periodic events and the last step's
    by_programs = run(algo, params, targets)
    on_device = run(algo, params, targets, on_device=True)
  for a, b in zip(jax.tree.leaves(by_programs), jax.tree.leaves(on_device)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)


@pytest.mark.parametrize("num_steps", [STEPS, 2 * TAU, None])
def test_one_fragment_no_delay_alpha_one_is_diloco_bit_for_bit(num_steps):
  x0, h, targets = problem(2)
  x0 = [np.float32(v) for v in x0]
  algo, params, loss_fn = build(x0, h, num_steps=num_steps)
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
  worker, shared = run(algo, params, targets)
  worker_d, shared_d = run(want, params, targets)
  for n in "abc":
    np.testing.assert_array_equal(worker.params[n], worker_d.params[n])
    np.testing.assert_array_equal(shared.center[n], shared_d.center[n])
  for steps in (1, 3, 4, 7, 8, 9, 10, 11):
    assert algo.communication(steps, 36) == want.communication(steps, 36), steps


def test_communication_counts_one_collective_per_fragment_sync():
  x0, h, _ = problem()
  # P = 3 (o = 0, 1, 2; bytes 8, 12, 16 in float32), 10 steps: syncs of F_1 at 0, 4, 8,
  # F_2 at 1, 5, F_0 at 3, 7 before the last step, 9, which sends all 36 bytes once
  algo, _, _ = build([np.float32(v) for v in x0], h, num_fragments=3, delay=1)
  assert algo.communication(STEPS, 0) == (8, 3 * 12 + 2 * 16 + 2 * 8 + 36, 0, 0)
  assert algo.communication(9, 0) == (7, 3 * 12 + 2 * 16 + 2 * 8, 0, 0)
  packed = build([np.float32(v) for v in x0], h, num_fragments=2, compressed=True)[0]
  # int8, blocks of 2: F_0 = a, b: 2 + 4 + 3 + 8 = 17 bytes; F_1 = c: 4 + 8 = 12
  assert packed.communication(STEPS, 0) == (0, 0, 5, 2 * 17 + 2 * 12 + 29)


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
    build(x0, h, **kw)
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
