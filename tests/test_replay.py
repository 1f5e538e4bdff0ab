"""The explicit-order replay: the simulator's rules run in the order of a log.

``easgd.asynchrony.log.replay`` takes the rules an asynchronous method is built
from (``Algorithm.async_rules``) and runs them one event at a time in the order
of an exchange log. Given the SPMD simulation's own log it reproduces the
simulation (any speeds, staleness and serving order); a hand-computed
trajectory pins the order of events; a log that contradicts the method's
schedule is refused.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd.asynchrony import simulation
from easgd.asynchrony.log import async_rules, exchange_log, replay
from easgd.asynchrony.schedule import exchange_schedule, slot_table
from easgd.methods.downpour_family import downpour, mdownpour, mvadownpour
from easgd.parallel import placement

import linear_problem
from linear_problem import flat, loss_fn, params0

KEY = jax.random.key(5)
ALPHA, ETA = 0.2, 0.1


def make(name, schedule, tau, p=4):
  kw = dict(num_workers=p, tau=tau, learning_rate=ETA, schedule=schedule)
  if name == "async_easgd":
    return simulation.async_easgd(loss_fn, alpha=ALPHA, **kw)
  if name == "async_eamsgd":
    return simulation.async_eamsgd(loss_fn, alpha=ALPHA, momentum=0.9, **kw)
  if name == "downpour":
    return downpour(loss_fn, **kw)
  if name == "mdownpour":
    return mdownpour(loss_fn, momentum=0.5, **kw)
  return mvadownpour(loss_fn, average_rate=0.1, **kw)


@pytest.mark.parametrize(
    "name", ["async_easgd", "async_eamsgd", "downpour", "mdownpour", "mvadownpour"]
)
@pytest.mark.parametrize("staleness", [0, 2])
def test_replaying_the_simulations_own_log_reproduces_the_simulation(name, staleness):
  p = 4
  schedule = exchange_schedule(p, "random", (1, 3, 2, 2), staleness=staleness)
  num_steps = 6 * schedule.slots_per_tick
  xs, ys = linear_problem.make_data(num_steps, p, seed=3)
  algo = make(name, schedule, tau=2)
  wt, ct, worker, shared = linear_problem.trajectory(algo, xs, ys, 2, KEY)
  log = exchange_log(algo, KEY, num_steps)
  # worker i's local step at clock t is computed in the slot of its m-th step of
  # tick n, t = n k_i + m; the replay reads that slot's batch (the loss ignores
  # the key, which the simulation derives from the slot)
  active = slot_table(schedule.worker_speeds, algo.hyperparameters["exchange_at"]).active
  big_k = schedule.slots_per_tick

  def batch_fn(i, t):
    tick, m = divmod(t, schedule.worker_speeds[i])
    slot = tick * big_k + np.flatnonzero(active[:, i])[m]
    return xs[slot, i], ys[slot, i]

  final_clocks = placement.merge_workers(worker.clock).tolist()
  out = replay(algo, log, params0(), batch_fn, KEY, final_clocks, keep_centers=True)
  # the replay runs the rules op by op, the simulation vmapped in one program:
  # equal up to float32 rounding (measured: <= 1.07e-6, MDOWNPOUR, values up to 7)
  np.testing.assert_allclose(
      np.stack([flat(w.params) for w in out.workers]), wt[-1], rtol=0, atol=2e-6
  )
  np.testing.assert_allclose(flat(algo.center(out.shared)), ct[-1], rtol=0, atol=2e-6)
  assert [int(w.clock) for w in out.workers] == final_clocks
  assert int(out.shared.master_clock) == len(log) == len(out.centers) - 1
  # the center after each slot is the replay's center after that slot's exchanges
  served_by = np.searchsorted(log["slot"], np.arange(num_steps), side="right")
  if name not in ("mvadownpour",):  # its evaluated model is the average, not x~
    np.testing.assert_allclose(
        np.stack([flat(out.centers[v]) for v in served_by]), ct, rtol=0, atol=2e-6
    )


def test_a_hand_computed_order_of_events():
  # F(x) = x^2 / 2 (gradient x), p = 2, tau = 1, eta = 0.5, alpha = 0.25, all at 1.
  # Algorithm 1, exchange at the step's start with the snapshot x:
  #   x^i <- x^i - alpha (x - c) - eta x;   c <- c + alpha (x - c)
  # Log: worker 1 (t=0), worker 1 (t=1), worker 0 (t=0); then worker 0 ends at
  # clock 2 with its step t=1 missing from the log (refused below) or the run
  # ends at clocks (1, 2):
  #   w1 t=0: d = 0.25 (1 - 1) = 0;        x1 = 1 - 0 - 0.5 = 0.5;        c = 1
  #   w1 t=1: d = 0.25 (0.5 - 1) = -0.125; x1 = 0.5 + 0.125 - 0.25 = 0.375; c = 0.875
  #   w0 t=0: d = 0.25 (1 - 0.875) = 0.03125; x0 = 1 - 0.03125 - 0.5 = 0.46875;
  #           c = 0.90625
  algo = simulation.async_easgd(
      lambda x, b, k: 0.5 * x**2, num_workers=2, tau=1, alpha=0.25, learning_rate=0.5
  )
  log = [
      dict(worker=1, local_step=0, version=0, read_version=0),
      dict(worker=1, local_step=1, version=1, read_version=1),
      dict(worker=0, local_step=0, version=2, read_version=2),
  ]
  out = replay(algo, log, jnp.float32(1.0), lambda i, t: None, KEY, (1, 2), keep_centers=True)
  assert [float(w.params) for w in out.workers] == [0.46875, 0.375]
  assert [float(c) for c in out.centers] == [1.0, 1.0, 0.875, 0.90625]
  # the same events served in another order give another run:
  other = [
      dict(worker=0, local_step=0, version=0, read_version=0),
      dict(worker=1, local_step=0, version=1, read_version=1),
      dict(worker=1, local_step=1, version=2, read_version=2),
  ]
  out2 = replay(algo, other, jnp.float32(1.0), lambda i, t: None, KEY, (1, 2))
  assert float(out2.shared.center) != 0.90625
  # a restart puts the worker at the center it reads, its clock going on
  restart = log + [dict(event="restart", worker=0, local_step=1, version=3, read_version=3)]
  out3 = replay(algo, restart, jnp.float32(1.0), lambda i, t: None, KEY, (1, 2))
  assert float(out3.workers[0].params) == 0.90625 and int(out3.workers[0].clock) == 1


def test_a_log_that_contradicts_the_schedule_is_refused():
  algo = simulation.async_easgd(
      lambda x, b, k: 0.5 * x**2, num_workers=2, tau=2, alpha=0.25, learning_rate=0.5
  )
  run = lambda log, clocks=(0, 0): replay(
      algo, log, jnp.float32(1.0), lambda i, t: None, KEY, clocks
  )
  e = dict(worker=0, local_step=0, version=0, read_version=0)
  with pytest.raises(ValueError, match="lacks worker 1's exchange at its local step 0"):
    run([e], (1, 1))
  with pytest.raises(ValueError, match="local step 1, which is not due"):
    run([e, dict(e, local_step=1, version=1, read_version=1)])
  with pytest.raises(ValueError, match="expected 0"):
    run([dict(e, version=3)])
  with pytest.raises(ValueError, match="names worker 5"):
    run([dict(e, worker=5)])
  with pytest.raises(ValueError, match="unknown log event"):
    run([dict(e, event="push")])
  with pytest.raises(ValueError, match="no asynchronous rules"):
    async_rules(linear_problem_sync())
  assert algo.async_rules.due(2) and not algo.async_rules.due(3)


def linear_problem_sync():
  from easgd.core import algorithms

  return algorithms.easgd(loss_fn, num_workers=2, tau=2, alpha=0.1, learning_rate=0.1)
