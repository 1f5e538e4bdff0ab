"""The synchronous warm-up (easgd.core.warmup) and the learning-rate scaling settings.

Exchange indices, worked out for tau = 4 (EASGD exchanges where its own clock
t - K is a multiple of tau; the warm-up's steps t < K each all-reduce the
gradient):

    K = 0:  exchanges at 0, 4, 8, ...        (no warm-up: plain EASGD)
    K = 1:  warm-up 0;       exchanges at 1, 5, 9, ...
    K = 3:  warm-up 0..2;    exchanges at 3, 7, 11, ...
    K = 4:  warm-up 0..3;    exchanges at 4, 8, 12, ...

Local SGD averages after its own steps tau - 1, 2 tau - 1, ... and at the
run's last step: with K = 3 and 14 steps, after steps 6, 10 and 13.
"""

import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd import TrainConfig, train_and_evaluate
from easgd.core import algorithms, warmup
from easgd.core.base import Communication
from easgd.methods import registry
from easgd.parallel import mapping, placement, worker_layout
from easgd.settings.config import ConfigError
from easgd.sweeps.engine import simulated_step, start_state

from linear_problem import loss_fn, make_data, params0

TAU, P, STEPS = 4, 4, 14


def build(algorithm, k, tau=TAU, num_steps=STEPS, lr=0.05):
  config = TrainConfig(algorithm=algorithm, num_workers=P, tau=tau, sync_warmup_steps=k)
  return registry.TABLE[algorithm].build(config, loss_fn, optax.sgd(lr), num_steps)


CENTERS_KEY = jax.random.key(3)


def centers_along(algo, xs, ys, key=CENTERS_KEY, spread=0.0):
  """The center after every step on P simulated workers: [STEPS + 1, 4] (flat);
  worker i starts at x0 + i * spread."""
  step = jax.jit(simulated_step(algo, P))
  x0 = params0()
  starts = jax.tree.map(lambda a: jnp.stack([a + i * spread for i in range(P)]), x0)
  worker, shared = start_state(algo, starts, x0)
  flat = lambda c: np.concatenate([np.asarray(c["w"]), np.asarray(c["b"])[None]])
  out = [flat(algo.center(shared))]
  for t in range(len(xs)):
    worker, shared, _ = step(worker, shared, (xs[t], ys[t]), key)
    out.append(flat(algo.center(shared)))
  return np.stack(out), worker, shared


@pytest.mark.parametrize("k", [0, 1, TAU - 1, TAU])
def test_easgd_exchange_indices_are_counted_from_k(k):
  expected = [t for t in range(STEPS) if t >= k and (t - k) % TAU == 0]
  algo = build("easgd", k)
  host = [t for t in range(STEPS) if algo.exchange_at(t)]
  assert host == list(range(k)) + expected  # warm-up steps all-reduce too
  xs, ys = make_data(STEPS, P)
  centers, _, _ = centers_along(algo, xs, ys, spread=0.1)  # workers start apart
  moved = [t for t in range(STEPS) if not np.array_equal(centers[t + 1], centers[t])]
  # the center moves at every warm-up step (it is the one model), then only
  # at EASGD's exchanges; the exchange at K > 0 follows the handover, which
  # puts every worker and the center at x_K, so it moves nothing
  assert moved == list(range(k)) + (expected[1:] if k else expected)
  assert algo.communication(STEPS, 10) == Communication(k + len(expected), 10 * (k + len(expected)))


@pytest.mark.parametrize("k", [0, 1, TAU - 1, TAU])
def test_local_sgd_averages_counted_from_k_and_at_the_end(k):
  expected = [t for t in range(k, STEPS) if (t - k + 1) % TAU == 0 or t == STEPS - 1]
  algo = build("local_sgd", k)
  assert [t for t in range(k, STEPS) if algo.exchange_at(t)] == expected
  xs, ys = make_data(STEPS, P)
  centers, _, _ = centers_along(algo, xs, ys)
  moved = [t for t in range(k, STEPS) if not np.array_equal(centers[t + 1], centers[t])]
  assert moved == expected


def test_warmup_is_pmean_sgd_then_the_algorithm_from_its_model_and_optimizer_state():
  k, lr = 5, 0.05
  opt = optax.sgd(lr, momentum=0.9)  # a state worth handing over
  config = TrainConfig(algorithm="eamsgd", num_workers=P, tau=TAU, delta=0.5, sync_warmup_steps=k)
  algo = registry.TABLE["eamsgd"].build(config, loss_fn, opt, STEPS)
  xs, ys = make_data(STEPS, P)
  key = jax.random.key(3)
  centers, worker, shared = centers_along(algo, xs, ys, key)
  # the first K steps: pmean SGD with the same optimizer
  pmean = algorithms.pmean_sgd(loss_fn, opt, num_workers=P)
  ref, _, pm_shared = centers_along(pmean, xs[:k], ys[:k], key)
  np.testing.assert_array_equal(centers[: k + 1], ref)
  # then EAMSGD from x_K with the warm-up's optimizer state, its clock from 0,
  # its base key fold_in(key, 1)
  inner = algorithms.eamsgd(loss_fn, opt, num_workers=P, tau=TAU, momentum=0.5, beta=0.9)
  x_k = pm_shared.params
  w, s = start_state(inner, jax.tree.map(lambda a: jnp.stack([a] * P), x_k), x_k)
  w = w._replace(opt_state=jax.tree.map(lambda a: jnp.stack([a] * P), pm_shared.opt_state))
  step = jax.jit(simulated_step(inner, P))
  for t in range(k, STEPS):
    w, s, _ = step(w, s, (xs[t], ys[t]), jax.random.fold_in(key, warmup.MAIN_KEY_STREAM))
  for got, want in zip(jax.tree.leaves(algo.center(shared)), jax.tree.leaves(s.center)):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # measured: 0 on CPU


def test_map_step_runs_the_warmup_program_and_the_same_values():
  k = 3
  algo = build("easgd", k)
  layout = worker_layout.make_layout(P, 1)
  step_fn = mapping.map_step(algo, layout, donate_state=False)
  assert set(step_fn.programs) == {False, True, "warmup"}
  xs, ys = make_data(STEPS, P)
  key = jax.random.key(3)
  worker, shared = placement.place_state(algo, params0(), layout)
  for t in range(STEPS):
    worker, shared, loss = step_fn(
        worker, shared, placement.split_workers((xs[t], ys[t]), layout), key, t
    )
    assert np.isfinite(np.asarray(loss)).all()  # the right program for every clock
  ref, _, _ = centers_along(algo, xs, ys, key)
  center = placement.first_copy(algo.center(shared))
  got = np.concatenate([np.asarray(center["w"]), np.asarray(center["b"])[None]])
  np.testing.assert_allclose(got, ref[-1], rtol=0, atol=1e-6)
  # a clock that names the wrong program gives a NaN loss
  w2, s2 = placement.place_state(algo, params0(), layout)
  _, _, bad = step_fn(w2, s2, placement.split_workers((xs[0], ys[0]), layout), key, k + 1)
  assert np.isnan(np.asarray(bad)).all()


def test_only_the_synchronous_elastic_and_averaging_methods_read_the_warmup():
  # not pmean SGD (it is the warm-up), nor Streaming DiLoCo, whose programs are its
  # fragments' events (a warm-up is refused beside fragments, delay or compression)
  streaming = {name for name, s in registry.TABLE.items() if "fragments" in s.reads}
  assert set(registry.readers("sync_warmup_steps")) == {
      name
      for name, s in registry.TABLE.items()
      if not s.asynchronous
      and s.family in ("elastic", "averaging")
      and name != "pmean_sgd"
      and (name not in streaming or "sync_warmup_steps" in s.reads)
  }
  assert "streaming_diloco" in streaming - set(registry.readers("sync_warmup_steps"))
  with pytest.raises(
      ConfigError, match="sync_warmup_steps=5 is not read by algorithm " "'pmean_sgd'"
  ):
    TrainConfig(algorithm="pmean_sgd", sync_warmup_steps=5).validate()
  with pytest.raises(ConfigError, match=r"sync_warmup_steps .* must be an integer in \[0, "):
    TrainConfig(sync_warmup_steps=-1).validate()


def test_lr_scaling_settings_are_checked():
  with pytest.raises(ConfigError, match="give lr_reference_batch"):
    TrainConfig(lr_scaling="linear").validate()
  with pytest.raises(
      ConfigError, match="lr_reference_batch=64 has no effect with " "lr_scaling 'none'"
  ):
    TrainConfig(lr_reference_batch=64).validate()
  with pytest.raises(ConfigError, match="unknown lr_scaling 'cubic'"):
    TrainConfig(lr_scaling="cubic", lr_reference_batch=64).validate()
  c = TrainConfig(
      global_batch_size=128, learning_rate=0.1, lr_reference_batch=32, lr_scaling="linear"
  ).validate()
  assert c.lr_scale == 4.0 and c.resolved_learning_rate == pytest.approx(0.4)
  c = c.replace(lr_scaling="sqrt").validate()
  assert c.lr_scale == 2.0 and c.resolved_learning_rate == pytest.approx(0.2)


def test_trainer_writes_the_resolved_rate_and_schedule_lengths():
  config = TrainConfig(
      dataset="digits",
      model="mlp",
      algorithm="easgd",
      num_workers=4,
      global_batch_size=64,
      num_epochs=2,
      learning_rate=0.05,
      tau=4,
      lr_scaling="linear",
      lr_reference_batch=32,
      sync_warmup_steps=7,
      lr_schedule="step",
      lr_decay_epochs=(1.0,),
      validation_examples=200,
      progress=False,
  )
  with tempfile.TemporaryDirectory() as workdir:
    summary = train_and_evaluate(config, workdir)
  r = summary["resolved"]
  spe = (1438 - 200) // 64
  assert r["resolved_learning_rate"] == pytest.approx(0.1) and r["lr_scale"] == 2.0
  assert (
      r["steps_per_epoch"],
      r["total_steps"],
      r["lr_decay_steps"],
      r["sync_warmup_steps"],
      r["train_examples"],
  ) == (spe, 2 * spe, [spe], 7, 1238)
  first, last = summary["history"][0], summary["history"][-1]
  assert first["learning_rate"] == pytest.approx(0.1)
  assert last["learning_rate"] == pytest.approx(0.01)  # decayed at epoch 1
  assert (first["sync_warmup_steps_done"], last["sync_warmup_steps_done"]) == (0, 7)
  assert last["val_count"] == 200 and 0 <= last["val_error"] <= 1
  # 7 warm-up all-reduces, then EASGD's exchanges at its clocks 0, 4, ...
  assert summary["communication"]["all_reduces"] == 7 + len(range(0, 2 * spe - 7, 4))
  with pytest.raises(ConfigError, match="sync_warmup_steps=40 .* leaves nothing"):
    train_and_evaluate(config.replace(sync_warmup_steps=40), tempfile.mkdtemp())
