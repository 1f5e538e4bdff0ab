"""The comparators (DOWNPOUR family, sequential methods, local SGD, DiLoCo).

Each is checked against a plain NumPy (float64) implementation of its published
rule written here, event by event (worker by worker, message by message), on a
tiny linear least-squares model whose workers see different data, over at
least three communication periods. Then every registered algorithm passes one
conformance check through the trainer's ``make_algorithm`` and the mapping.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd.asynchrony.log import exchange_log
from easgd.asynchrony.schedule import exchange_order, exchange_schedule
from easgd.core.base import Communication
from easgd.core.elastic import HyperparameterError
from easgd.methods import baselines, downpour_family, registry
from easgd.methods.downpour_family import adownpour, downpour, mdownpour
from easgd.parallel import mapping, placement, worker_layout
from easgd.run.compare import compare
from easgd.settings.config import TrainConfig

import linear_problem
from linear_problem import THETA0, flat, local_steps_in_time_order, loss_fn, np_grad, params0
from testutil import STEP_KINDS

make_data = functools.partial(linear_problem.make_data, seed=2)

KEY = jax.random.key(11)


def run(algo, xs, ys, num_devices, key=KEY):
  """Per-step worker params [T, p, 4] and centers [T, 4]."""
  wt, ct, _, shared = linear_problem.trajectory(algo, xs, ys, num_devices, key)
  return wt, ct, shared


def assert_close(actual, expected, tol=2e-5):
  np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


# -- DOWNPOUR family: reference -------------------------------------------------


def ref_downpour(xs, ys, tau, eta, speeds, orders, staleness, master, push_timing="authors"):
  """The authors' DOWNPOUR (``asyncsgd/optim-downpour.lua``), one event at a time.

  Per local step: the gradient at the worker's params, ``dfdx = -eta g``,
  accumulated; if ``pversion % su == 0`` (su = tau; tested before pversion is
  incremented) the accumulated update is pushed, the master adds it and the
  worker receives the center into its params; else the worker moves by dfdx.
  ``push_timing="full_period"`` pushes when (pversion + 1) % su == 0 instead.
  The push happens at the END of the step; steps are met in time order
  (``local_steps_in_time_order``), the state after slot j is the state after
  every step that ends by the slot's end.

  ``master`` is "downpour", "mdownpour:<delta>", "adownpour" or "mvadownpour:<a>".
  """
  T, p = xs.shape[:2]
  x = [THETA0.copy() for _ in range(p)]
  acc = [np.zeros(4) for _ in range(p)]
  pversion = [0] * p
  centers = [THETA0.copy()]
  velocity, z = np.zeros(4), THETA0.copy()
  kind, _, arg = master.partition(":")
  phase = 0 if push_timing == "authors" else 1
  wt, ct = [], []
  events = local_steps_in_time_order(speeds, orders, T, "end")
  for step in range(T):
    for _, i in (e for e in events if e[0] == step):
      dfdx = -eta * np_grad(x[i], xs[step, i], ys[step, i])
      acc[i] = acc[i] + dfdx
      if (pversion[i] + phase) % tau == 0:  # push acc, the master updates, fetch
        c, t = centers[-1], len(centers) - 1  # t: the master clock
        if kind == "mdownpour":
          velocity = float(arg) * velocity + acc[i]
          new = c + acc[i] + float(arg) * velocity
        else:
          if kind == "adownpour":
            z = (1 - 1 / (t + 1)) * z + 1 / (t + 1) * c
          elif kind == "mvadownpour":
            z = (1 - float(arg)) * z + float(arg) * c
          new = c + acc[i]
        centers.append(new)
        x[i] = centers[max(len(centers) - 1 - staleness, 0)].copy()
        acc[i] = np.zeros(4)
      else:
        x[i] = x[i] + dfdx  # move locally
      pversion[i] += 1
    wt.append(np.stack(x))
    ct.append(z.copy() if kind in ("adownpour", "mvadownpour") else centers[-1].copy())
  return np.stack(wt), np.stack(ct)


DOWNPOUR_CASES = [
    ("downpour", dict(), "downpour", 3),
    ("downpour", dict(push_timing="full_period"), "downpour", 2),
    ("mdownpour", dict(momentum=0.9), "mdownpour:0.9", 1),
    ("adownpour", dict(), "adownpour", 2),
    ("mvadownpour", dict(average_rate=0.3), "mvadownpour:0.3", 2),
]


@pytest.mark.parametrize("name,kw,master,tau", DOWNPOUR_CASES)
@pytest.mark.parametrize(
    "order,speeds,staleness", [("round_robin", (1, 1, 1), 0), ("random", (1, 3, 2), 1)]
)
def test_downpour_family_matches_event_by_event_reference(
    name, kw, master, tau, order, speeds, staleness
):
  p, eta = 3, 0.1
  schedule = exchange_schedule(p, order, speeds, staleness)
  ticks = 3 * tau  # the slowest worker pushes 3 times
  num_steps = ticks * schedule.slots_per_tick
  xs, ys = make_data(num_steps, p)
  algo = getattr(downpour_family, name)(
      loss_fn, num_workers=p, tau=tau, learning_rate=eta, schedule=schedule, **kw
  )
  wt, ct, shared = run(algo, xs, ys, num_devices=p)
  orders = [np.asarray(exchange_order(schedule, KEY, t)).tolist() for t in range(ticks)]
  ref_w, ref_c = ref_downpour(
      xs,
      ys,
      tau,
      eta,
      schedule.worker_speeds,
      orders,
      staleness,
      master,
      kw.get("push_timing", "authors"),
  )
  assert_close(wt, ref_w)
  assert_close(ct, ref_c)
  pushes = int(placement.first_copy(shared.master_clock))
  assert pushes == sum(3 * k for k in schedule.worker_speeds)
  assert algo.communication(num_steps, 10).all_reduces == round(pushes / p)


def run_scalar(algo, num_workers, num_steps, x0=1.0, dtype=np.float32):
  """Steps ``algo`` on a scalar parameter (the loss ignores the batch).

  Returns per-step worker params [T, p], centers [T] and the final shared state.
  """
  layout = worker_layout.make_layout(num_workers, 1)
  worker, shared = placement.place_state(algo, jnp.asarray(x0, dtype), layout)
  step = mapping.map_workers(algo.step, layout, *STEP_KINDS)
  dummy = placement.split_workers(np.zeros(num_workers, np.float32), layout)
  wt, ct = [], []
  for _ in range(num_steps):
    worker, shared, _ = step(worker, shared, dummy, KEY)
    wt.append(placement.merge_workers(worker.params))
    ct.append(placement.first_copy(algo.center(shared)))
  return np.stack(wt), np.stack(ct), shared


def ref_authors_downpour_scalar(h, eta, su, x0, num_steps, phase=0):
  """``optim.downpour`` of the authors' code for one worker on F(x) = h x^2 / 2.

  Written from ``asyncsgd/optim-downpour.lua`` (su: the push period tau):
  dfdx = -lr * grad; su > 1: accumulate, push when pversion % su == 0 (and
  receive the center into w), else w += dfdx; su == 1: push every step;
  pversion += 1 after. ``phase`` 1 is the "full_period" option:
  (pversion + 1) % su == 0.
  """
  w, center, dfdx_acc, pversion = x0, x0, 0.0, 0
  ws, cs, pushes = [], [], []
  for _ in range(num_steps):
    dfdx = -eta * h * w
    dfdx_acc += dfdx
    if (pversion + phase) % su == 0:
      center += dfdx_acc  # the server: p:add(g)
      w = center  # pc:async_recv_param() into w
      dfdx_acc = 0.0
      pushes.append(pversion)
    else:
      w += dfdx
    pversion += 1
    ws.append(w)
    cs.append(center)
  return np.array(ws), np.array(cs), pushes


def test_downpour_pushes_after_steps_0_tau_2tau_as_in_the_authors_code():
  # The example: p = 1, tau = 2, x0 = 1, F(x) = 1.5 x^2 / 2, eta = 0.1.
  # Step 0 pushes -0.15: x~ = x = 0.85. Step 1 moves locally: x = 0.85 - 0.1275
  # = 0.7225, x~ stays 0.85. (Pushing after steps 1, 3, ... gives x~ = 0.7225.)
  loss = lambda x, b, k: 0.75 * x**2
  algo = downpour(loss, num_workers=1, tau=2, learning_rate=0.1)
  wt, ct, _ = run_scalar(algo, 1, 2)
  np.testing.assert_allclose(ct, [0.85, 0.85], rtol=1e-6)
  np.testing.assert_allclose(wt[:, 0], [0.85, 0.7225], rtol=1e-6)
  for tau in (1, 2, 3):
    for push_timing, phase in (("authors", 0), ("full_period", 1)):
      algo = downpour(loss, num_workers=1, tau=tau, learning_rate=0.1, push_timing=push_timing)
      num_steps = 3 * tau + 1
      wt, ct, shared = run_scalar(algo, 1, num_steps)
      ref_w, ref_c, pushes = ref_authors_downpour_scalar(1.5, 0.1, tau, 1.0, num_steps, phase)
      np.testing.assert_allclose(wt[:, 0], ref_w, rtol=1e-6)
      np.testing.assert_allclose(ct, ref_c, rtol=1e-6)
      if push_timing == "authors":
        assert pushes == list(range(0, num_steps, tau))  # 0, tau, 2 tau, ...
      else:
        assert pushes == list(range(tau - 1, num_steps, tau))
      log = exchange_log(algo, KEY, num_steps)
      assert log["local_step"].tolist() == pushes
      assert int(placement.first_copy(shared.master_clock)) == len(pushes)
      assert algo.communication(num_steps, 8).all_reduces == len(pushes)
  with pytest.raises(HyperparameterError, match="unknown push_timing 'late'"):
    downpour(loss, num_workers=1, learning_rate=0.1, push_timing="late")


def test_downpour_pushes_at_the_end_of_the_step_with_unequal_speeds():
  # F(x) = x^2 / 2, p = 2, speeds (1, 2): K = 2 slots per tick, tau = 1,
  # eta = 0.5, round-robin, all start at 1. Worker 0's step runs over the
  # whole tick and pushes at its END (time 1 = end of slot 1); worker 1's
  # steps end at 1/2 (end of slot 0) and 1 (end of slot 1).
  #   slot 0: w1 pushes -0.5 (gradient at 1):            x~ = 0.5,   x1 = 0.5
  #   slot 1, time 1 (tie, tick order 0, 1):
  #     w0 pushes -0.5 (gradient at its start value 1): x~ = 0.0,   x0 = 0.0
  #     w1 pushes -0.25 (gradient at 0.5):              x~ = -0.25, x1 = -0.25
  # (Serving w0's push in slot 0, where its step starts, gives x~ = 0, 0.)
  algo = downpour(
      lambda x, b, k: 0.5 * x**2,
      num_workers=2,
      tau=1,
      learning_rate=0.5,
      schedule=exchange_schedule(2, worker_speeds=(1, 2)),
  )
  wt, ct, _ = run_scalar(algo, 2, 2)
  np.testing.assert_array_equal(ct, [0.5, -0.25])
  np.testing.assert_array_equal(wt, [[1.0, 0.5], [0.0, -0.25]])
  log = exchange_log(algo, KEY, 2)
  assert [(r["slot"], r["worker"], r["local_step"], r["time"]) for r in log] == [
      (0, 1, 0, 0.5),
      (1, 0, 0, 1.0),
      (1, 1, 1, 1.0),
  ]


def test_downpour_with_tau_1_is_asynchronous_sgd():
  # round-robin, speeds 1: worker i's gradient is taken at the center it fetched
  # after its previous push, x~ <- x~ - eta g^i(x^i) one worker at a time.
  xs, ys = make_data(4, 2)
  algo = downpour(loss_fn, num_workers=2, tau=1, learning_rate=0.1)
  _, ct, _ = run(algo, xs, ys, num_devices=1)
  c, x = THETA0.copy(), [THETA0.copy(), THETA0.copy()]
  for t in range(4):
    for i in range(2):
      c = c - 0.1 * np_grad(x[i], xs[t, i], ys[t, i])
      x[i] = c.copy()
    assert_close(ct[t], c)


# -- sequential methods ---------------------------------------------------------


def ref_sequential(xs, ys, eta, delta=None, rate=None, averaged=False):
  T, p = xs.shape[:2]
  x, v, z = THETA0.copy(), np.zeros(4), THETA0.copy()
  xt, zt = [], []
  for t in range(T):
    point = x + delta * v if delta is not None else x
    g = np.mean([np_grad(point, xs[t, i], ys[t, i]) for i in range(p)], axis=0)
    if averaged:
      a = 1 / (t + 1) if rate is None else rate
      z = (1 - a) * z + a * x
    if delta is not None:
      v = delta * v - eta * g
      x = x + v
    else:
      x = x - eta * g
    xt.append(x.copy())
    zt.append(z.copy() if averaged else x.copy())
  return np.stack(xt), np.stack(zt)


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize(
    "name,kw,ref_kw",
    [
        ("sgd", {}, {}),
        ("msgd", dict(momentum=0.9), dict(delta=0.9)),
        ("asgd", {}, dict(averaged=True)),
        ("mvasgd", dict(average_rate=0.25), dict(averaged=True, rate=0.25)),
    ],
)
def test_sequential_methods_match_reference(name, kw, ref_kw, num_workers):
  xs, ys = make_data(8, num_workers)
  algo = getattr(baselines, name)(loss_fn, num_workers=num_workers, learning_rate=0.1, **kw)
  wt, ct, _ = run(algo, xs, ys, num_devices=num_workers)
  ref_x, ref_z = ref_sequential(xs, ys, 0.1, **ref_kw)
  assert_close(wt[:, 0], ref_x)
  assert_close(ct, ref_z)
  comm = algo.communication(8, 10)
  assert comm.all_reduces == (0 if num_workers == 1 else 8)


def test_asgd_center_is_the_mean_of_the_previous_iterates():
  xs, ys = make_data(5, 1)
  wt, ct, _ = run(baselines.asgd(loss_fn, learning_rate=0.1), xs, ys, 1)
  iterates = np.concatenate([THETA0[None], wt[:, 0]])  # x_0 .. x_5
  for t in range(5):
    assert_close(ct[t], iterates[: t + 1].mean(0))


@pytest.mark.parametrize("name", ["adownpour", "asgd"])
def test_polyak_averages_in_float64_match_a_float64_reference(name):
  # a_{t+1} = 1/(t+1) and 1 - a_{t+1} must be computed in the parameters'
  # dtype: in float32 the float64 average drifts by ~1e-7 within 3 periods.
  xs, ys = (a.astype(np.float64) for a in make_data(9, 3))
  with jax.enable_x64(True):
    init = {"w": jnp.asarray(THETA0[:3], jnp.float64), "b": jnp.asarray(THETA0[3], jnp.float64)}
    if name == "adownpour":
      schedule = exchange_schedule(3, "random", (1, 3, 2), 1)
      algo = adownpour(loss_fn, num_workers=3, tau=2, learning_rate=0.1, schedule=schedule)
      xs, ys = (a[: 3 * 2 * 3] for a in (xs, ys))
    else:
      algo = baselines.asgd(loss_fn, num_workers=3, learning_rate=0.1)
    wt, ct, _, shared = linear_problem.trajectory(algo, xs, ys, 3, KEY, init)
    assert placement.first_copy(algo.center(shared))["w"].dtype == np.float64
  if name == "adownpour":
    orders = [np.asarray(exchange_order(schedule, KEY, t)).tolist() for t in range(6)]
    ref_w, ref_c = ref_downpour(xs, ys, 2, 0.1, (1, 3, 2), orders, 1, "adownpour")
    np.testing.assert_allclose(wt, ref_w, rtol=0, atol=1e-14)
  else:
    ref_x, ref_c = ref_sequential(xs, ys, 0.1, averaged=True)
    np.testing.assert_allclose(wt[:, 0], ref_x, rtol=0, atol=1e-14)
  # measured: <= 4.5e-16 (float32 weights: ~1e-7)
  np.testing.assert_allclose(ct, ref_c, rtol=0, atol=1e-14)


# -- local SGD and DiLoCo --------------------------------------------------------


class NumpyAdam:
  """optax.adam by hand (b1 0.9, b2 0.999, eps 1e-8), one state per worker."""

  def __init__(self, lr):
    self.lr = lr

  def init(self):
    return dict(m=np.zeros(4), v=np.zeros(4), count=0)

  def update(self, g, s):
    m = 0.9 * s["m"] + 0.1 * g
    v = 0.999 * s["v"] + 0.001 * g * g
    n = s["count"] + 1
    step = -self.lr * (m / (1 - 0.9**n)) / (np.sqrt(v / (1 - 0.999**n)) + 1e-8)
    return step, dict(m=m, v=v, count=n)


def ref_periodic(xs, ys, tau, inner, outer=None):
  """local SGD (outer None) or DiLoCo (outer = (eta_out, mu)), worker by worker."""
  T, p = xs.shape[:2]
  x = [THETA0.copy() for _ in range(p)]
  states = [inner.init() for _ in range(p)]
  c, m = THETA0.copy(), np.zeros(4)
  wt, ct = [], []
  for t in range(T):
    for i in range(p):
      step, states[i] = inner.update(np_grad(x[i], xs[t, i], ys[t, i]), states[i])
      x[i] = x[i] + step
    if (t + 1) % tau == 0:
      mean = np.mean(x, axis=0)
      if outer is None:
        c = mean
      else:
        eta_out, mu = outer
        delta = c - mean  # the mean pseudo-gradient
        m = mu * m + delta
        c = c - eta_out * (delta + mu * m)  # SGD with Nesterov momentum
      x = [c.copy() for _ in range(p)]  # inner optimizer states are kept
    wt.append(np.stack(x))
    ct.append(c.copy())
  return np.stack(wt), np.stack(ct)


def test_local_sgd_matches_reference():
  xs, ys = make_data(9, 4)
  algo = baselines.local_sgd(loss_fn, num_workers=4, tau=3, learning_rate=0.1)
  wt, ct, _ = run(algo, xs, ys, num_devices=2)

  class Sgd:
    init = staticmethod(lambda: None)
    update = staticmethod(lambda g, s: (-0.1 * g, s))

  ref_w, ref_c = ref_periodic(xs, ys, 3, Sgd())
  assert_close(wt, ref_w)
  assert_close(ct, ref_c)
  assert np.ptp(wt[1], axis=0).max() > 1e-3 and np.ptp(wt[2], axis=0).max() == 0
  assert algo.communication(9, 10).all_reduces == 3


def test_diloco_with_adam_inner_matches_reference():
  xs, ys = make_data(9, 4)
  algo = baselines.diloco(
      loss_fn, optax.adam(0.05), num_workers=4, tau=3, outer_learning_rate=0.7, outer_momentum=0.9
  )
  wt, ct, _ = run(algo, xs, ys, num_devices=4)
  ref_w, ref_c = ref_periodic(xs, ys, 3, NumpyAdam(0.05), outer=(0.7, 0.9))
  assert_close(wt, ref_w)
  assert_close(ct, ref_c)
  assert algo.communication(10, 10) == Communication(3, 30)


def test_diloco_with_outer_sgd_1_no_momentum_is_local_sgd():
  xs, ys = make_data(6, 2)
  a = run(
      baselines.diloco(
          loss_fn,
          num_workers=2,
          tau=2,
          learning_rate=0.1,
          outer_learning_rate=1.0,
          outer_momentum=0.0,
      ),
      xs,
      ys,
      1,
  )
  b = run(baselines.local_sgd(loss_fn, num_workers=2, tau=2, learning_rate=0.1), xs, ys, 1)
  assert_close(a[0], b[0], 1e-6)
  assert_close(a[1], b[1], 1e-6)


# -- layouts, validation ----------------------------------------------------------


@pytest.mark.parametrize("name", ["downpour", "diloco"])
def test_same_results_on_4_and_1_devices(name):
  xs, ys = make_data(8, 4)
  if name == "downpour":
    schedule = exchange_schedule(4, "random", (2, 1, 1, 2), 1)
    algo = downpour(loss_fn, num_workers=4, tau=2, learning_rate=0.1, schedule=schedule)
  else:
    algo = baselines.diloco(loss_fn, optax.adamw(0.02), num_workers=4, tau=2)
  (w4, c4, _), (w1, c1, _) = (run(algo, xs, ys, d) for d in (4, 1))
  np.testing.assert_allclose(w1, w4, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(c1, c4, rtol=1e-6, atol=1e-7)


def test_hyperparameters_are_validated():
  with pytest.raises(HyperparameterError, match="tau"):
    baselines.local_sgd(loss_fn, num_workers=2, tau=0, learning_rate=0.1)
  with pytest.raises(HyperparameterError, match="average_rate"):
    baselines.mvasgd(loss_fn, learning_rate=0.1, average_rate=1.5)
  with pytest.raises(HyperparameterError, match="outer_learning_rate"):
    baselines.diloco(loss_fn, num_workers=2, tau=2, learning_rate=0.1, outer_learning_rate=0.0)
  with pytest.raises(HyperparameterError, match="momentum"):
    mdownpour(loss_fn, num_workers=2, momentum=1.0, learning_rate=0.1)
  with pytest.raises(HyperparameterError, match="schedule is for 3 workers"):
    downpour(loss_fn, num_workers=2, learning_rate=0.1, schedule=exchange_schedule(3))


# -- every registered algorithm through the trainer's factory -------------------

NEW_ALGORITHMS = [a for a in registry.ALGORITHMS if a not in ("easgd", "pmean_sgd")]


@pytest.mark.parametrize("name", registry.ALGORITHMS)
def test_every_algorithm_runs_through_make_algorithm(name):
  cfg, _ = TrainConfig(
      num_workers=4,
      tau=2,
      beta=0.9,
      delta=0.5,
      learning_rate=0.1,
      worker_speeds=(1.0, 2.0, 1.0, 1.0),
      exchange_order="random",
      staleness=1,
      average_rate=0.5,
  ).for_algorithm(name)
  algo = registry.make_algorithm(cfg.validate(), loss_fn, optax.sgd(0.1))
  assert algo.name == name
  xs, ys = make_data(8, 4)
  layout = worker_layout.make_layout(4, 2)
  worker, shared = placement.place_state(algo, params0(), layout)
  step = jax.jit(mapping.map_workers(algo.step, layout, *STEP_KINDS))
  losses = []
  for x, y in zip(xs, ys):
    worker, shared, loss = step(worker, shared, placement.split_workers((x, y), layout), KEY)
    losses.append(float(np.mean(loss)))
  assert step._cache_size() == 1  # state structure and dtypes are stable
  center = placement.first_copy(algo.center(shared))
  assert {k: v.dtype for k, v in center.items()} == {"w": np.float32, "b": np.float32}
  assert np.isfinite(flat(center)).all() and placement.shared_copies_equal(shared)
  assert np.max(np.abs(flat(center) - THETA0)) > 1e-3  # the evaluated model moved
  # communication over the 8 steps, counted here from each family's rule:
  # synchronous elastic (exchange at t = 0, 2, 4, 6) 4; one-model methods, every
  # step, 8; local SGD and (Streaming) DiLoCo (after steps 1, 3, 5, 7) 4; asynchronous: 8 slots
  # of speeds (1, 2, 1, 1) with K = 2 are 4 ticks, local steps (4, 8, 4, 4), an
  # exchange every 2 local steps from the first: (2, 4, 2, 2) per worker, mean 2.5,
  # rounded half to even: 2
  spec = registry.TABLE[name]
  expected = (
      int(round(np.mean([2, 4, 2, 2])))
      if spec.asynchronous
      else 4
      if spec.family in ("elastic",) or name in ("local_sgd", "diloco", "streaming_diloco")
      else 8
  )
  comm = algo.communication(8, 100)
  assert (comm.all_reduces, comm.bytes) == (expected, expected * 100)
  if spec.asynchronous:
    assert algo.hyperparameters["slots_per_tick"] == 2


def test_simulated_ticks():
  cfg = TrainConfig(num_workers=2, worker_speeds=(1.0, 4.0))
  assert registry.simulated_ticks(8, cfg.replace(algorithm="async_easgd")) == 2.0
  assert registry.simulated_ticks(8, cfg.replace(algorithm="easgd")) == 8.0
  assert registry.simulated_ticks(8, TrainConfig(algorithm="downpour")) == 8.0


def test_compare_with_async_and_baselines_on_digits(tmp_path):
  cfg = TrainConfig(
      dataset="digits",
      model="mlp",
      num_workers=4,
      num_devices=2,
      global_batch_size=64,
      num_epochs=1,
      learning_rate=0.1,
      tau=2,
      beta=0.9,
      eval_batch_size=64,
      progress=False,
      worker_speeds=(1.0, 2.0, 1.0, 2.0),
  )
  rows = compare(cfg, tmp_path, ["async_easgd", "downpour"])
  assert [r["algorithm"] for r in rows] == ["async_easgd", "downpour"]
  assert [r["settings"]["tau"] for r in rows] == [2, 2]
  assert (tmp_path / "comparison.png").stat().st_size > 10_000
  for r in rows:
    assert r["test_accuracy"] > 0.2
