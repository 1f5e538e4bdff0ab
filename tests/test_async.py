"""EAMSGD (eq. 7), asynchronous EASGD/EAMSGD (Algorithms 1-2) and local optimizers.

Every algorithm is checked against a plain NumPy (float64) implementation of the
published rule written here, event by event: worker by worker, message by
message, on a tiny linear least-squares model whose workers see different data.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd.asynchrony import simulation
from easgd.asynchrony.log import exchange_log
from easgd.asynchrony.names import EXCHANGE_ORDERS
from easgd.asynchrony.schedule import (
    active_slots,
    draw_worker_speeds,
    exchange_order,
    exchange_schedule,
    local_steps_done,
    served_order,
    simulated_time,
    slot_table,
)
from easgd.core import algorithms
from easgd.core.base import reset_optimizer_state
from easgd.core.elastic import HyperparameterError
from easgd.methods import downpour_family, registry
from easgd.parallel import mapping, placement, worker_layout
from easgd.run import trainer
from easgd.settings.config import ConfigError, TrainConfig
from easgd.sweeps import engine

import linear_problem
from linear_problem import THETA0, local_steps_in_time_order, loss_fn, np_grad, params0
from testutil import STEP_KINDS

make_data = functools.partial(linear_problem.make_data, seed=1)

KEY = jax.random.key(7)


def run(algo, xs, ys, num_devices, key=KEY, init=None):
  """Steps through the batches; per-step worker params [T, p, 4] and centers [T, 4]."""
  return linear_problem.trajectory(algo, xs, ys, num_devices, key, init)


def assert_close(actual, expected, tol=2e-5):
  np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


# -- NumPy references -----------------------------------------------------------


def ref_sync_eamsgd(xs, ys, tau, alpha, eta, delta):
  """Synchronous EAMSGD, eq. (5)-(7); delta = 0 is EASGD."""
  T, p = xs.shape[:2]
  x = [THETA0.copy() for _ in range(p)]
  v = [np.zeros(4) for _ in range(p)]
  c = THETA0.copy()
  wt, ct = [], []
  for t in range(T):
    snaps, c_t = [xi.copy() for xi in x], c.copy()
    for i in range(p):
      v[i] = delta * v[i] - eta * np_grad(snaps[i] + delta * v[i], xs[t, i], ys[t, i])
      x[i] = snaps[i] + v[i]
      if t % tau == 0:  # every worker exchanges with the time-t center
        x[i] = x[i] - alpha * (snaps[i] - c_t)
        c = c + alpha * (snaps[i] - c_t)
    wt.append(np.stack(x))
    ct.append(c.copy())
  return np.stack(wt), np.stack(ct)


def ref_async_elastic(xs, ys, tau, alpha, eta, delta, speeds, orders, staleness):
  """Algorithms 1/2, one event at a time, each exchange at its step's START.

  Local steps are met in time order (``local_steps_in_time_order``: ties in
  the tick's order); the state after slot j is the state after every step
  that starts before the slot's end.
  """
  T, p = xs.shape[:2]
  x = [THETA0.copy() for _ in range(p)]
  v = [np.zeros(4) for _ in range(p)]
  clock = [0] * p
  centers = [THETA0.copy()]  # the center after each master update
  exchanges = [0] * p
  wt, ct = [], []
  events = local_steps_in_time_order(speeds, orders, T, "start")
  for step in range(T):
    for _, i in (e for e in events if e[0] == step):
      snap = x[i].copy()
      if clock[i] % tau == 0:
        read = centers[max(len(centers) - 1 - staleness, 0)]
        d = alpha * (snap - read)
        x[i] = x[i] - d
        centers.append(centers[-1] + d)
        exchanges[i] += 1
      v[i] = delta * v[i] - eta * np_grad(snap + delta * v[i], xs[step, i], ys[step, i])
      x[i] = x[i] + v[i]
      clock[i] += 1
    wt.append(np.stack(x))
    ct.append(centers[-1].copy())
  return np.stack(wt), np.stack(ct), exchanges


# -- synchronous EAMSGD ---------------------------------------------------------


def test_eamsgd_matches_numpy_reference():
  xs, ys = make_data(9, 4)  # tau = 3: exchanges at t = 0, 3, 6 (3 periods)
  algo = algorithms.eamsgd(
      loss_fn, num_workers=4, momentum=0.9, tau=3, alpha=0.2, learning_rate=0.05
  )
  wt, ct, worker, _ = run(algo, xs, ys, num_devices=2)
  ref_w, ref_c = ref_sync_eamsgd(xs, ys, tau=3, alpha=0.2, eta=0.05, delta=0.9)
  assert_close(wt, ref_w)
  assert_close(ct, ref_c)
  # the velocity is the worker's own: it differs between workers
  vel = placement.merge_workers(worker.velocity)["w"]
  assert np.max(np.abs(vel[0] - vel[1])) > 1e-3


@pytest.mark.parametrize(
    "make_opt", [lambda: optax.sgd(0.05), lambda: optax.adamw(0.01, weight_decay=0.1)]
)
def test_eamsgd_with_zero_momentum_is_easgd_bit_for_bit(make_opt):
  xs, ys = make_data(7, 4)
  kw = dict(num_workers=4, tau=2, beta=0.9)
  wa, ca, _, _ = run(algorithms.eamsgd(loss_fn, make_opt(), momentum=0.0, **kw), xs, ys, 2)
  wb, cb, _, _ = run(algorithms.easgd(loss_fn, make_opt(), **kw), xs, ys, 2)
  np.testing.assert_array_equal(wa, wb)
  np.testing.assert_array_equal(ca, cb)
  assert np.max(np.abs(wa[-1, 0] - THETA0)) > 1e-3  # it moved


def test_eamsgd_validates_momentum():
  with pytest.raises(HyperparameterError, match="momentum"):
    algorithms.eamsgd(loss_fn, num_workers=2, momentum=1.0, learning_rate=0.1, beta=0.9)
  with pytest.raises(HyperparameterError, match="momentum"):
    simulation.async_eamsgd(loss_fn, num_workers=2, momentum=-0.1, learning_rate=0.1, beta=0.9)


# -- round-robin scheme, eq. (12)-(13) --------------------------------------------


def test_round_robin_async_easgd_reproduces_eq_12_13_exactly():
  # F(x) = x^2 / 2 (true gradient x), p = 3, eta = 0.5, alpha = 0.25, tau = 1,
  # all start at 1. Eq. (12)-(13): at global time t only worker i = t mod p moves,
  #   x^i <- x^i - eta x^i - alpha (x^i - x~);   x~ <- x~ + alpha (x^i - x~).
  p, eta, alpha, rounds = 3, np.float32(0.5), np.float32(0.25), 4
  algo = simulation.async_easgd(
      lambda x, b, k: 0.5 * x**2, num_workers=p, tau=1, alpha=0.25, learning_rate=0.5
  )
  layout = worker_layout.make_layout(p, 3)
  worker, shared = placement.place_state(algo, jnp.float32(1.0), layout)
  step = mapping.map_workers(algo.step, layout, *STEP_KINDS)
  dummy = placement.split_workers(np.zeros(p, np.float32), layout)
  # float32, operation by operation, as written in eq. (12)-(13)
  x, c = np.ones(p, np.float32), np.float32(1.0)
  # and the paper's linear form of eq. (12)-(13) for the active worker:
  #   [x^i, x~] <- [[1 - eta - alpha, alpha], [alpha, 1 - alpha]] [x^i, x~]
  m = np.array([[1 - 0.5 - 0.25, 0.25], [0.25, 1 - 0.25]])
  x64, c64 = np.ones(p), 1.0
  for _ in range(rounds):
    worker, shared, _ = step(worker, shared, dummy, KEY)  # one tick = p time steps
    for t in range(p):
      i = t % p
      d = alpha * (x[i] - c)
      c = c + d
      x[i] = (x[i] - d) + (-eta) * x[i]
      x64[i], c64 = m @ np.array([x64[i], c64])
    np.testing.assert_array_equal(placement.merge_workers(worker.params), x)
    np.testing.assert_array_equal(placement.first_copy(shared.center), c)
    np.testing.assert_allclose(placement.merge_workers(worker.params), x64, rtol=1e-6)
  assert len(set(x.tolist())) == p  # the workers really differ


def test_async_easgd_serves_the_exchanges_of_a_slot_in_time_order():
  # F(x) = x^2 / 2, p = 2, speeds (2, 3): K = 3 slots per tick; worker 0 starts
  # its steps at 0 and 1/2 tick (slot 0 and slot 1 at 1.5 slots), worker 1 at
  # 0, 1/3, 2/3 (slots 0, 1, 2). Round-robin, tau = 1, eta = 0.5, alpha = 0.25,
  # all start at 1. Algorithm 1, exchange at the step's start:
  #   slot 0, time 0 (tie, tick order 0, 1): d = 0 for both; x = (0.5, 0.5), c = 1
  #   slot 1, worker 1 (time 1/3) BEFORE worker 0 (time 1/2):
  #     w1: d = 0.25 (0.5 - 1) = -0.125;       c = 0.875;   x1 = 0.5 + 0.125 - 0.25 = 0.375
  #     w0: d = 0.25 (0.5 - 0.875) = -0.09375; c = 0.78125; x0 = 0.5 + 0.09375 - 0.25 = 0.34375
  #   slot 2, w1 (time 2/3): d = 0.25 (0.375 - 0.78125) = -0.1015625;
  #     c = 0.6796875;  x1 = 0.375 + 0.1015625 - 0.1875 = 0.2890625
  # (Serving slot 1 in the tick's order instead swaps x0 and x1 after slot 1.)
  schedule = exchange_schedule(2, worker_speeds=(2, 3))
  algo = simulation.async_easgd(
      lambda x, b, k: 0.5 * x**2,
      num_workers=2,
      tau=1,
      alpha=0.25,
      learning_rate=0.5,
      schedule=schedule,
  )
  layout = worker_layout.make_layout(2, 2)
  worker, shared = placement.place_state(algo, jnp.float32(1.0), layout)
  step = mapping.map_workers(algo.step, layout, *STEP_KINDS)
  dummy = placement.split_workers(np.zeros(2, np.float32), layout)
  expected = [((0.5, 0.5), 1.0), ((0.34375, 0.375), 0.78125), ((0.34375, 0.2890625), 0.6796875)]
  for x, c in expected:
    worker, shared, _ = step(worker, shared, dummy, KEY)
    np.testing.assert_array_equal(placement.merge_workers(worker.params), x)
    np.testing.assert_array_equal(placement.first_copy(shared.center), c)
  log = exchange_log(algo, KEY, 3)
  assert [(r["slot"], r["worker"], r["local_step"]) for r in log] == [
      (0, 0, 0),
      (0, 1, 0),
      (1, 1, 1),
      (1, 0, 1),
      (2, 1, 2),
  ]
  np.testing.assert_array_equal(log["time"], [0, 0, 1 / 3, 1 / 2, 2 / 3])


# -- asynchronous EASGD / EAMSGD with schedules -----------------------------------


def orders_for(schedule, num_ticks, key=KEY):
  return [np.asarray(exchange_order(schedule, key, t)).tolist() for t in range(num_ticks)]


@pytest.mark.parametrize(
    "order,speeds,staleness,delta,tau",
    [
        ("round_robin", (1, 1, 1, 1), 0, 0.0, 2),
        ("random", (1, 2, 1, 3), 2, 0.0, 2),
        ("random", (2, 1, 3, 1), 1, 0.9, 2),
        # speeds 2 and 3 start steps at different times within one slot
        ("random", (2, 3, 3, 1), 1, 0.0, 1),
        ("round_robin", (3, 2, 2, 3), 0, 0.9, 1),
    ],
)
def test_async_elastic_matches_event_by_event_reference(order, speeds, staleness, delta, tau):
  p, alpha, eta = 4, 0.2, 0.1
  schedule = exchange_schedule(p, order, speeds, staleness)
  num_steps = 6 * schedule.slots_per_tick  # the slowest worker: 6 steps, 3 periods
  xs, ys = make_data(num_steps, p)
  if delta:
    algo = simulation.async_eamsgd(
        loss_fn,
        num_workers=p,
        momentum=delta,
        tau=tau,
        alpha=alpha,
        learning_rate=eta,
        schedule=schedule,
    )
  else:
    algo = simulation.async_easgd(
        loss_fn, num_workers=p, tau=tau, alpha=alpha, learning_rate=eta, schedule=schedule
    )
  wt, ct, worker, shared = run(algo, xs, ys, num_devices=2)
  ref_w, ref_c, exchanges = ref_async_elastic(
      xs, ys, tau, alpha, eta, delta, schedule.worker_speeds, orders_for(schedule, 6), staleness
  )
  assert_close(wt, ref_w)
  assert_close(ct, ref_c)
  clocks = placement.merge_workers(worker.clock)
  np.testing.assert_array_equal(clocks, 6 * np.asarray(schedule.worker_speeds))
  assert int(placement.first_copy(shared.master_clock)) == sum(exchanges)
  comm = algo.communication(num_steps, 16)
  assert comm.all_reduces == round(np.mean(exchanges))
  assert comm.bytes == comm.all_reduces * 16


def test_async_eamsgd_with_zero_momentum_is_async_easgd_bit_for_bit():
  schedule = exchange_schedule(4, "random", (1, 2, 2, 1), 1)
  xs, ys = make_data(8, 4)
  kw = dict(num_workers=4, tau=2, beta=0.9, learning_rate=0.1, schedule=schedule)
  wa, ca, _, _ = run(simulation.async_eamsgd(loss_fn, momentum=0.0, **kw), xs, ys, 1)
  wb, cb, _, _ = run(simulation.async_easgd(loss_fn, **kw), xs, ys, 1)
  np.testing.assert_array_equal(wa, wb)
  np.testing.assert_array_equal(ca, cb)


@pytest.mark.parametrize("name", ["async_easgd", "async_eamsgd"])
def test_async_runs_agree_on_4_1_and_2_devices(name):
  schedule = exchange_schedule(4, "random", (1, 3, 2, 1), 2)
  xs, ys = make_data(9, 4)
  kw = dict(num_workers=4, tau=2, beta=0.9, learning_rate=0.1, schedule=schedule)
  if name == "async_eamsgd":
    kw["momentum"] = 0.9
  algo = getattr(simulation, name)(loss_fn, **kw)
  runs = [run(algo, xs, ys, num_devices=d)[:2] for d in (4, 1, 2)]
  for wt, ct in runs[1:]:
    np.testing.assert_allclose(wt, runs[0][0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ct, runs[0][1], rtol=1e-6, atol=1e-7)


def test_schedule_helpers():
  # speeds (1, 2, 4): K = 4 slots; worker 1 at slots 0, 2; worker 2 every slot
  table = active_slots((1, 2, 4))
  np.testing.assert_array_equal(table, [[1, 1, 1], [0, 0, 1], [0, 1, 1], [0, 0, 1]])
  np.testing.assert_array_equal(table.sum(0), [1, 2, 4])
  # speeds 2 and 3 (K = 3): steps of the speed-2 worker at times 0, 1/2 -> slots 0, 1
  np.testing.assert_array_equal(active_slots((2, 3))[:, 0], [1, 1, 0])
  # the same steps placed by their ends (DOWNPOUR's push): 1/2 -> slot 1 (1.5 slots),
  # 1 -> slot 2; the speed-3 worker's ends 1/3, 2/3, 1 -> slots 0, 1, 2
  end = slot_table((2, 3), "step_end")
  np.testing.assert_array_equal(end.active, [[0, 1], [1, 1], [1, 1]])
  # time ranks within the tick: ends 1/3 < 1/2 < 2/3 < 1
  np.testing.assert_array_equal(end.rank, [[0, 0], [1, 2], [3, 3]])
  start = slot_table((2, 3), "step_start")  # starts 0 < 1/3 < 1/2 < 2/3
  np.testing.assert_array_equal(start.rank, [[0, 0], [2, 1], [0, 3]])
  np.testing.assert_array_equal(
      slot_table((1, 2, 4), "step_end").active,
      [[0, 0, 1], [0, 1, 1], [0, 0, 1], [1, 1, 1]],
  )
  # served in time order; ties keep the tick's order (ranks are per worker)
  np.testing.assert_array_equal(served_order(np.array([2, 0, 1]), np.array([1, 0, 1])), [1, 2, 0])
  np.testing.assert_array_equal(served_order(np.array([2, 0, 1]), np.array([0, 0, 0])), [2, 0, 1])
  s = exchange_schedule(3, worker_speeds=(1, 2, 4))
  np.testing.assert_array_equal(local_steps_done(s, 6), [2, 3, 6])
  assert simulated_time(6, s) == 1.5
  assert exchange_schedule(2, worker_speeds=(2.0, 1.0)).worker_speeds == (2, 1)
  a = draw_worker_speeds(16, 4, seed=3)
  assert a == draw_worker_speeds(16, 4, seed=3)
  assert set(a) <= {1, 2, 3, 4} and len(set(a)) > 1
  assert a != draw_worker_speeds(16, 4, seed=4)
  for bad, match in [
      (dict(order="fifo"), "unknown exchange order"),
      (dict(worker_speeds=(1, 2)), "3 entries|2 entries"),
      (
          dict(worker_speeds=(1, 0, 1)),
          r"worker_speeds\[1\] \(local steps per tick\) must be an integer >= 1, got 0",
      ),
      (
          dict(worker_speeds=(1, 1.5, 1)),
          r"worker_speeds\[1\] \(local steps per tick\) must be an integer >= 1, got 1.5",
      ),
      (dict(staleness=-1), "staleness"),
  ]:
    with pytest.raises(HyperparameterError, match=match):
      exchange_schedule(3, **bad)
  with pytest.raises(HyperparameterError, match="unknown exchange_at 'middle'"):
    slot_table((1, 2), "middle")


def test_random_order_depends_on_the_seed_and_is_reproducible():
  s = exchange_schedule(8, "random")
  # the trainer's key: jax.random.split(jax.random.key(seed))[1]
  keys = [jax.random.split(jax.random.key(seed))[1] for seed in (0, 0, 1)]
  o0, o0b, o1 = (orders_for(s, 5, k) for k in keys)
  assert o0 == o0b
  assert o0 != o1
  assert all(sorted(o) == list(range(8)) for o in o0 + o1)
  assert len({tuple(o) for o in o0}) > 1  # a fresh permutation per tick
  rr = exchange_schedule(8)
  assert orders_for(rr, 2) == [list(range(8))] * 2


def test_an_order_given_as_an_array_gives_the_named_orders():
  """``exchange_order`` of a schedule whose order is an int32 array (its index in
  EXCHANGE_ORDERS, traced under jit) gives the same integers as the name."""
  key = jax.random.split(jax.random.key(3))[1]
  traced = jax.jit(lambda code, t: exchange_order(exchange_schedule(6, code), key, t))
  for code, name in enumerate(EXCHANGE_ORDERS):
    named = orders_for(exchange_schedule(6, name), 5, key)
    got = [np.asarray(traced(jnp.int32(code), jnp.int32(t))).tolist() for t in range(5)]
    assert got == named, name
  assert orders_for(exchange_schedule(6, "round_robin"), 1, key) == [list(range(6))]


@pytest.mark.parametrize("name", ["async_easgd", "downpour"])
def test_tau_and_order_traced_per_configuration_step_as_their_python_values(name):
  """Three configurations (tau, order) = (2, round robin), (2, random), (1, random),
  their tau and order traced in one vmap over configurations, take the steps each
  takes built from Python values (to float32 rounding: the two are different
  programs; bit for bit where the chunk is the same: tests/test_protocol_async.py)."""
  p, num_steps = 4, 6
  xs, ys = make_data(num_steps, p)
  cases = [(2, "round_robin"), (2, "random"), (1, "random")]

  def build(tau, order):
    schedule = exchange_schedule(p, order)
    if name == "downpour":
      return downpour_family.downpour(
          loss_fn, num_workers=p, tau=tau, learning_rate=0.1, schedule=schedule
      )
    return simulation.async_easgd(
        loss_fn, num_workers=p, tau=tau, beta=0.9, learning_rate=0.1, schedule=schedule
    )

  def centers(tau, order):
    algo = build(tau, order)
    step = engine.simulated_step(algo, p)
    worker, shared = engine.start_state(
        algo, jax.tree.map(lambda a: jnp.stack([a] * p), params0()), params0()
    )
    out = []
    for t in range(num_steps):
      worker, shared, _ = step(worker, shared, (xs[t], ys[t]), KEY)
      center = algo.center(shared)
      out.append(jnp.concatenate([center["w"], center["b"][None]]))
    return jnp.stack(out)

  taus = jnp.asarray([tau for tau, _ in cases], jnp.int32)
  codes = jnp.asarray([EXCHANGE_ORDERS.index(order) for _, order in cases], jnp.int32)
  together = jax.jit(jax.vmap(centers))(taus, codes)
  for i, (tau, order) in enumerate(cases):
    assert_close(together[i], jax.jit(lambda: centers(tau, order))(), tol=1e-6)


def test_an_array_tau_builds_on_the_device_only():
  """With an array tau the exchange count (a host count) refuses, naming the
  Python tau it needs, and the overlap must be 0."""
  algo = simulation.async_easgd(
      loss_fn, num_workers=2, tau=jnp.int32(2), learning_rate=0.1, beta=0.9
  )
  with pytest.raises(HyperparameterError, match="needs a Python tau"):
    algo.communication(8, 16)
  push = downpour_family.downpour(loss_fn, num_workers=2, tau=jnp.int32(2), learning_rate=0.1)
  with pytest.raises(HyperparameterError, match="needs a Python tau"):
    push.communication(8, 16)
  assert simulation.check_delay(0, jnp.int32(4)) == 0
  with pytest.raises(HyperparameterError, match="delay"):
    simulation.check_delay(1, jnp.int32(4))


def test_the_array_values_of_the_traced_fields():
  assert registry.field_array("exchange_order", ["random", "round_robin"]).tolist() == [1, 0]
  assert registry.field_array("exchange_order", ["random"]).dtype == np.int32
  assert registry.field_array("tau", [1, 4]).dtype == np.int32
  assert registry.field_array("beta", [0.9]).dtype == np.float32
  with pytest.raises(ValueError, match="unknown exchange_order 'fifo'; allowed: round_robin"):
    registry.field_array("exchange_order", ["fifo"])
  for name in ("async_easgd", "async_eamsgd", "downpour", "mdownpour"):
    assert {"tau", "exchange_order"} <= set(registry.TABLE[name].array_fields), name


# -- any Optax optimizer as the local optimizer -----------------------------------


class NumpyAdamW:
  """optax.adamw by hand: scale_by_adam, + wd * params, * -lr(count)."""

  def __init__(self, lr, weight_decay, b1=0.9, b2=0.999, eps=1e-8):
    self.lr = lr if callable(lr) else (lambda count: lr)
    self.wd, self.b1, self.b2, self.eps = weight_decay, b1, b2, eps

  def init(self):
    return dict(m=np.zeros(4), v=np.zeros(4), count=0, schedule_count=0)

  def reset(self, state):  # moments and bias correction restart; the schedule not
    return dict(self.init(), schedule_count=state["schedule_count"])

  def update(self, g, state, theta):
    m = self.b1 * state["m"] + (1 - self.b1) * g
    v = self.b2 * state["v"] + (1 - self.b2) * g * g
    count = state["count"] + 1
    direction = (m / (1 - self.b1**count)) / (np.sqrt(v / (1 - self.b2**count)) + self.eps)
    step = -self.lr(state["schedule_count"]) * (direction + self.wd * theta)
    return step, dict(m=m, v=v, count=count, schedule_count=state["schedule_count"] + 1)


def ref_easgd_with_optimizer(xs, ys, tau, alpha, opt, reset):
  T, p = xs.shape[:2]
  x = [THETA0.copy() for _ in range(p)]
  states = [opt.init() for _ in range(p)]
  c = THETA0.copy()
  wt, ct = [], []
  for t in range(T):
    snaps, c_t = [xi.copy() for xi in x], c.copy()
    for i in range(p):
      if reset and t % tau == 0:
        states[i] = opt.reset(states[i])
      step, states[i] = opt.update(
          np_grad(snaps[i], xs[t, i], ys[t, i]), states[i], snaps[i]
      )  # the worker's OWN params
      x[i] = snaps[i] + step
      if t % tau == 0:
        x[i] = x[i] - alpha * (snaps[i] - c_t)
        c = c + alpha * (snaps[i] - c_t)
    wt.append(np.stack(x))
    ct.append(c.copy())
  return np.stack(wt), np.stack(ct)


@pytest.mark.parametrize("reset", [False, True])
def test_easgd_with_adamw_matches_hand_rolled_adamw_plus_elastic_term(reset):
  xs, ys = make_data(9, 4)
  lr = optax.linear_schedule(0.05, 0.01, 9)  # the schedule must keep its position
  algo = algorithms.easgd(
      loss_fn,
      optax.adamw(lr, weight_decay=0.1),
      num_workers=4,
      tau=3,
      alpha=0.2,
      reset_opt_state=reset,
  )
  wt, ct, worker, _ = run(algo, xs, ys, num_devices=2)
  ref_w, ref_c = ref_easgd_with_optimizer(
      xs, ys, 3, 0.2, NumpyAdamW(lambda n: 0.05 - 0.04 * min(n, 9) / 9, 0.1), reset
  )
  assert_close(wt, ref_w)
  assert_close(ct, ref_c)
  # the state is per worker: the workers' first moments differ
  mu = placement.merge_workers(worker.opt_state)[0].mu["w"]
  assert np.max(np.abs(mu[0] - mu[1])) > 1e-4


def test_reset_differs_from_persistent_state_and_applies_to_eamsgd():
  xs, ys = make_data(6, 2)
  opt = lambda: optax.adam(0.05)
  kw = dict(num_workers=2, tau=2, alpha=0.3)
  keep = run(algorithms.easgd(loss_fn, opt(), **kw), xs, ys, 1)[0]
  reset = run(algorithms.easgd(loss_fn, opt(), reset_opt_state=True, **kw), xs, ys, 1)[0]
  np.testing.assert_array_equal(keep[:2], reset[:2])  # identical until the 2nd exchange
  assert np.max(np.abs(keep[-1] - reset[-1])) > 1e-4
  # EAMSGD and async EASGD take the option too; momentum 0 keeps them equal to EASGD
  eam = run(algorithms.eamsgd(loss_fn, opt(), momentum=0.0, reset_opt_state=True, **kw), xs, ys, 1)[
      0
  ]
  np.testing.assert_array_equal(eam, reset)
  schedule = exchange_schedule(2)
  asy = simulation.async_easgd(loss_fn, opt(), schedule=schedule, reset_opt_state=True, **kw)
  assert asy.hyperparameters["reset_opt_state"] is True
  assert np.isfinite(run(asy, xs, ys, 1)[0]).all()


def test_reset_optimizer_state_keeps_the_schedule_count():
  opt = optax.adamw(optax.linear_schedule(1.0, 0.0, 10), weight_decay=0.1)
  params = {"w": jnp.ones(3)}
  state = opt.init(params)
  for _ in range(3):
    _, state = opt.update({"w": jnp.ones(3)}, state, params)
  fresh = reset_optimizer_state(opt, state, params, jnp.bool_(True))
  kept = reset_optimizer_state(opt, state, params, jnp.bool_(False))
  assert int(fresh[0].count) == 0 and float(jnp.abs(fresh[0].mu["w"]).sum()) == 0
  schedule_counts = [
      s.count
      for s in jax.tree.leaves(fresh, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState))
      if isinstance(s, optax.ScaleByScheduleState)
  ]
  assert [int(c) for c in schedule_counts] == [3]
  for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(state)):
    np.testing.assert_array_equal(a, b)


# -- through the trainer: reproducibility per seed --------------------------------

ASYNC_TINY = TrainConfig(
    algorithm="async_easgd",
    dataset="digits",
    model="mlp",
    num_workers=4,
    num_devices=2,
    global_batch_size=64,
    num_epochs=1,
    learning_rate=0.1,
    tau=2,
    beta=0.9,
    exchange_order="random",
    worker_speeds=(1.0, 2.0, 1.0, 3.0),
    staleness=1,
    eval_batch_size=64,
    progress=False,
)


def _metrics(path):
  # wall-clock fields, if any, are not part of the computation
  return [
      {k: v for k, v in json.loads(line).items() if not k.endswith("_s")}
      for line in (path / "metrics.jsonl").read_text().splitlines()
  ]


def test_async_training_is_reproducible_per_seed(tmp_path):
  s1 = trainer.train_and_evaluate(ASYNC_TINY, tmp_path / "a")
  s2 = trainer.train_and_evaluate(ASYNC_TINY, tmp_path / "b")
  m1, m2 = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
  assert m1 == m2
  assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (
      tmp_path / "b" / "metrics.jsonl"
  ).read_bytes()
  assert s1["algorithm"]["worker_speeds"] == [1, 2, 1, 3]
  assert s1["algorithm"]["slots_per_tick"] == 3
  assert s1["shared_copies_equal"] and s2["final"] == s1["final"]
  assert m1[-1]["test_accuracy"] > 0.3  # it learned (10 classes)
  # another seed gives another exchange order: test_random_order_depends_on_the_seed


def test_config_fields_are_validated():
  base = TrainConfig(num_workers=4)
  for changes, match in [
      (dict(exchange_order="fifo"), "exchange_order"),
      (dict(worker_speeds=(1.0, 2.0)), "one per worker"),
      (
          dict(worker_speeds=(1.0, 2.5, 1.0, 1.0)),
          r"worker_speeds\[1\] \(local steps per tick\) must be an integer in \[1, 1024\]",
      ),
      (
          dict(staleness=10**12),
          r"staleness \(in master updates\) must be an integer in \[0, 1024\]",
      ),
      (dict(worker_speeds=(1.0,) * 4, max_worker_speed=3), "not both"),
      (dict(max_worker_speed=0), "max_worker_speed"),
      (dict(staleness=-1), "staleness"),
      (dict(outer_learning_rate=0.0), "outer_learning_rate"),
      (dict(outer_momentum=1.0), "outer_momentum"),
      (dict(average_rate=0.0), "average_rate"),
      (dict(algorithm="eamsgd", optimizer="nesterov"), "own Nesterov momentum"),
      (dict(algorithm="nope"), "unknown algorithm"),
  ]:
    with pytest.raises(ConfigError, match=match):
      base.replace(**changes).validate()
  cfg = base.replace(algorithm="async_eamsgd", delta=0.9, worker_speeds=(1.0, 2.0, 1.0, 1.0))
  assert TrainConfig.from_dict(json.loads(cfg.validate().to_json())) == cfg


def test_cli_flags_of_the_new_fields():
  from easgd import cli

  args = cli.build_parser().parse_args(
      [
          "train",
          "--workdir",
          "w",
          "--algorithm",
          "async_easgd",
          "--exchange-order",
          "random",
          "--worker-speeds",
          "1,2,1,3",
          "--staleness",
          "2",
          "--reset-opt-state",
          "--max-worker-speed",
          "none",
          "--average-rate",
          "0.01",
      ]
  )
  assert args.worker_speeds == (1.0, 2.0, 1.0, 3.0)
  assert (args.exchange_order, args.staleness, args.reset_opt_state) == ("random", 2, True)
  assert args.max_worker_speed is None and args.average_rate == 0.01
