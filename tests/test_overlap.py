"""Overlap (delay V) of async EASGD's exchanges in the real asynchronous runtime.

Rule (docs/guides/streaming.md, "Overlap in the asynchronous runtimes"): worker i
exchanges at its clocks s = 0, tau, 2 tau, ...; its step at s takes no elastic
term (x^i_{s+1} = x^i_s + u_s) and sends x^i_s; the center serves it
(d = alpha (x^i_s - x~), x~ <- x~ + d); the step at s + V applies the reply,
x^i_{s+V+1} = (x^i_{s+V} - d) + u_{s+V}. Checked here:

* one worker on a quadratic against a float64 NumPy loop of the rule (V = 0, 1, 2;
  with one worker the serving order is fixed, so the run is deterministic);
* V = 0 is today's rule: the same hyperparameters, the simulated engine still runs;
* two workers on threads (tiny digits, through the trainer, stopped and resumed):
  the whole exchange log replays the final checkpoint bit for bit with the run's
  compiled programs, and a checkpoint keeps the replies in flight (their clocks
  and values equal the replay's at that checkpoint);
* delay on the simulated (spmd) runtime is refused in one line (exit 2).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd import cli
from easgd.asynchrony import simulation
from easgd.asynchrony.log import async_rules, overlap_of
from easgd.core.elastic import HyperparameterError
from easgd.run import checkpoint, trainer
from easgd.runtimes import async_runs, threads, training_run
from easgd.runtimes.driver import Driver
from easgd.runtimes.shared import AsyncSetup, read_log, replay_run, unstack_workers

from testutil import TINY_DIGITS

H = np.asarray([1.0, 0.5, 2.0, 1.5])
NOISE = np.random.default_rng(3).normal(size=(64, 4)).astype(np.float32)
X0 = np.asarray([1.0, -2.0, 0.5, 3.0], np.float32)
TAU, LR, ALPHA = 4, 0.1, 0.3


def quadratic_loss(params, batch, key):
  del key
  return 0.5 * jnp.sum(jnp.asarray(H, jnp.float32) * params["x"] ** 2) + jnp.dot(batch, params["x"])


def reference(num_steps, delay):
  """The rule in float64 for one worker (F = sum h x^2 / 2 + xi_t . x, SGD)."""
  x, center, in_flight = X0.astype(np.float64), X0.astype(np.float64), None
  for t in range(num_steps):
    u = -LR * (H * x + NOISE[t])
    if t % TAU == 0:
      d = ALPHA * (x - center)
      center = center + d
      if delay == 0:
        x = x - d + u
        continue
      in_flight = (t + delay, d)
      x = x + u
    elif in_flight is not None and in_flight[0] == t:
      x = x - in_flight[1] + u
      in_flight = None
    else:
      x = x + u
  return x, center


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_bitwise(a, b):
  for x, y in zip(leaves(a), leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("delay", [0, 1, 2])
def test_one_worker_follows_the_rule_in_float64(delay):
  algo = simulation.async_easgd(
      quadratic_loss, num_workers=1, tau=TAU, alpha=ALPHA, learning_rate=LR, delay=delay
  )
  setup = AsyncSetup(algo, {"x": jnp.asarray(X0)}, lambda i, t: NOISE[t], jax.random.key(0))
  backend = threads.ThreadBackend(setup, 1)
  try:
    backend.warm_up()
    Driver(backend, [0], chunk_steps=3).run_to(30)  # chunks end inside exchanges in flight
    (state,), shared, log = backend.state()
  finally:
    backend.close()
  assert [r["local_step"] for r in log] == list(range(0, 30, TAU))
  x, center = reference(30, delay)
  # float32 against float64 over 30 steps (values up to ~3): measured <= 1e-6
  np.testing.assert_allclose(state.params["x"], x, atol=1e-5)
  np.testing.assert_allclose(shared.center["x"], center, atol=1e-5)
  if delay:  # the overlap changed the trajectory
    assert np.max(np.abs(reference(30, 0)[0] - x)) > 1e-4
  same = replay_run(setup, log, [30])
  assert_bitwise(same.workers[0], state)
  assert_bitwise(same.shared.center, shared.center)


def test_delay_0_is_todays_algorithm_and_delay_is_checked():
  kw = dict(num_workers=2, tau=TAU, alpha=ALPHA, learning_rate=LR)
  today, zero = simulation.async_easgd(quadratic_loss, **kw), simulation.async_easgd(
      quadratic_loss, delay=0, **kw
  )
  assert zero.hyperparameters == today.hyperparameters and "delay" not in today.hyperparameters
  assert overlap_of(async_rules(zero)) == 0
  assert zero.step is today.step or zero.step.__name__ == today.step.__name__
  two = simulation.async_eamsgd(quadratic_loss, momentum=0.5, delay=2, **kw)
  assert two.hyperparameters["delay"] == 2 and overlap_of(async_rules(two)) == 2
  with pytest.raises(HyperparameterError, match="has no overlap"):
    two.step(None, None, None, None)
  with pytest.raises(HyperparameterError, match=r"delay .* must be an integer in \[0, 3\]"):
    simulation.async_easgd(quadratic_loss, delay=TAU, **kw)


def restore(workdir, run):
  ckpt = checkpoint.Checkpointer(workdir)
  try:
    return ckpt.restore(target=async_runs._checkpoint_target(run, async_rules(run.algorithm)))
  finally:
    ckpt.close()


def replay_checkpoint(workdir, config, log):
  """The log replays the checkpoint bit for bit, its replies in flight too."""
  run, p = training_run.Run(config), config.num_workers
  saved = restore(workdir, run)
  clocks = saved["worker"].clock.tolist()
  assert int(saved["log_length"]) == len(log)
  out = replay_run(async_runs.make_setup(run), log, clocks)
  assert_bitwise(jax.device_get(out.workers), unstack_workers(saved["worker"], p))
  assert_bitwise(out.shared.center, saved["shared"].center)
  replies = unstack_workers(saved["reply_in_flight"], p)
  for i, flight in enumerate(out.in_flight):
    if flight is None:
      assert saved["reply_clock"][i] == -1
    else:
      assert saved["reply_clock"][i] == flight[0]
      assert_bitwise(replies[i], flight[1])
  return saved


# one worker: its clock at step 5 is 5, so the checkpoint holds the exchange of clock 4
# in flight (applied at 4 + V); two workers: the clocks come from timing
@pytest.mark.parametrize("workers,delay", [(1, 2), (2, 1), (2, 2)])
def test_a_threads_run_with_overlap_resumes_and_replays_bit_for_bit(tmp_path, workers, delay):
  config = dataclasses.replace(
      TINY_DIGITS,
      algorithm="async_easgd",
      runtime="threads",
      num_workers=workers,
      num_devices=1,
      num_epochs=1,
      delay=delay,
  )
  first = trainer.train_and_evaluate(config, tmp_path, stop_after_steps=5)
  assert first["status"] == "stopped"
  log5 = read_log(tmp_path / "exchanges.jsonl")
  saved5 = replay_checkpoint(tmp_path, config, log5)
  if workers == 1:
    assert saved5["reply_clock"].tolist() == [4 + delay]
  done = trainer.train_and_evaluate(config, tmp_path, resume=True)
  assert done["status"] == "complete" and done["steps_done"] == 22
  log = read_log(tmp_path / "exchanges.jsonl")
  assert log[: len(log5)] == log5
  saved = replay_checkpoint(tmp_path, config, log)
  clocks = saved["worker"].clock.tolist()
  assert sum(clocks) == 22 * workers
  for i, n in enumerate(clocks):  # Algorithm 1's schedule: t = 0, tau, 2 tau, ...
    assert [r["local_step"] for r in log if r["worker"] == i] == list(range(0, n, 4))
  assert done["algorithm"]["delay"] == delay


def test_delay_of_an_asynchronous_algorithm_is_refused_on_spmd(tmp_path, capsys):
  status = cli.main(
      [
          "train",
          "--workdir",
          str(tmp_path / "w"),
          "--algorithm",
          "async_easgd",
          "--tau",
          "4",
          "--delay",
          "2",
      ]
  )
  err = capsys.readouterr().err
  assert status == 2 and err.count("\n") == 1
  assert err == (
      "easgd: error: delay=2 of algorithm 'async_easgd' is not read by runtime 'spmd' (the "
      "overlap of an exchange with a real worker's next local steps); use runtime 'threads', "
      "or delay 0\n"
  )
  assert not (tmp_path / "w").exists()
