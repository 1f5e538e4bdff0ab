"""The synchronous EASGD rule (eq. 5-6) against hand-worked values."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd.core import algorithms, elastic
from easgd.core.base import Communication
from easgd.parallel import mapping, placement, worker_layout


def quadratic_loss(params, target, key):
  # f_i(x) = (x - a_i)^2 / 2, gradient x - a_i; each worker's "batch" is a_i.
  del key
  return 0.5 * (params - target) ** 2


def run(algo, x0, targets, num_steps, num_devices):
  """Runs ``num_steps`` steps; returns per-step worker values and centers."""
  layout = worker_layout.make_layout(len(targets), num_devices)
  worker, shared = placement.place_state(algo, jnp.float32(x0), layout)
  step = mapping.map_workers(
      algo.step, layout, ("worker", "shared", "worker", "broadcast"), ("worker", "shared", "worker")
  )
  batch = placement.split_workers(np.asarray(targets, np.float32), layout)
  key = jax.random.key(0)
  xs, cs = [], []
  for _ in range(num_steps):
    worker, shared, _ = step(worker, shared, batch, key)
    assert placement.shared_copies_equal(shared)
    xs.append(placement.merge_workers(algo.worker_params(worker, shared)))
    cs.append(float(placement.first_copy(algo.center(shared))))
  return np.array(xs), np.array(cs)


# Two workers, f_0(x) = x^2/2 (a_0 = 0), f_1(x) = (x - 4)^2/2 (a_1 = 4), start
# x^0 = x^1 = x~ = 1, eta = 0.5, alpha = 0.25 (beta = 0.5), tau = 2: exchanges at
# t = 0, 2, 4. Worked by hand (all values dyadic, exact in float32):
#  t=0 exch: g = (1, -3);  x^0 = 1 - .5*1 - .25*0 = .5;  x^1 = 1 + 1.5 = 2.5
#            x~ = 1 + .25*((1-1) + (1-1)) = 1
#  t=1 loc:  g = (.5, -1.5); x = (.25, 3.25); x~ = 1
#  t=2 exch: g = (.25, -.75); x^0 = .25 - .125 - .25*(.25-1) = .3125
#            x^1 = 3.25 + .375 - .25*(3.25-1) = 3.0625
#            x~ = 1 + .25*((.25-1) + (3.25-1)) = 1.375
#  t=3 loc:  g = (.3125, -.9375); x = (.15625, 3.53125); x~ = 1.375
#  t=4 exch: g = (.15625, -.46875); x^0 = .15625 - .078125 - .25*(.15625-1.375)
#            = .3828125;  x^1 = 3.53125 + .234375 - .25*(3.53125-1.375) = 3.2265625
#            x~ = 1.375 + .25*((.15625-1.375) + (3.53125-1.375)) = 1.609375
#  t=5 loc:  g = (.3828125, -.7734375); x = (.19140625, 3.61328125); x~ = 1.609375
HAND_WORKERS = [
    (0.5, 2.5),
    (0.25, 3.25),
    (0.3125, 3.0625),
    (0.15625, 3.53125),
    (0.3828125, 3.2265625),
    (0.19140625, 3.61328125),
]
HAND_CENTER = [1.0, 1.0, 1.375, 1.375, 1.609375, 1.609375]


@pytest.mark.parametrize("num_devices,arrays", [(1, False), (2, False), (2, True)])
def test_two_workers_tau2_matches_hand_trajectory(num_devices, arrays):
  # arrays: the hyperparameters as JAX arrays (unchecked, as optax takes them);
  # with an array tau the step decides the exchange on the device
  value = jnp.asarray if arrays else (lambda v: v)
  algo = algorithms.easgd(
      quadratic_loss, learning_rate=value(0.5), num_workers=2, tau=value(2), alpha=value(0.25)
  )
  assert (algo.exchange_at is None) == arrays
  xs, cs = run(algo, 1.0, [0.0, 4.0], 6, num_devices)
  np.testing.assert_array_equal(xs, np.array(HAND_WORKERS, np.float32))
  np.testing.assert_array_equal(cs, np.array(HAND_CENTER, np.float32))


def test_beta_is_num_workers_times_alpha():
  a = algorithms.easgd(quadratic_loss, learning_rate=0.5, num_workers=2, tau=2, beta=0.5)
  assert a.hyperparameters["alpha"] == 0.25
  xs, cs = run(a, 1.0, [0.0, 4.0], 6, 1)
  np.testing.assert_array_equal(cs, np.array(HAND_CENTER, np.float32))


def test_alpha_zero_gives_independent_sgd_and_frozen_center():
  targets = [0.0, 4.0, -2.0, 1.0]
  algo = algorithms.easgd(quadratic_loss, learning_rate=0.3, num_workers=4, tau=1, alpha=0.0)
  xs, cs = run(algo, 1.0, targets, 7, 2)
  np.testing.assert_array_equal(cs, np.ones(7, np.float32))
  # independent SGD on each worker: x <- x - 0.3 (x - a), by NumPy in float32
  x = np.ones(4, np.float32)
  a = np.asarray(targets, np.float32)
  for t in range(7):
    x = x - np.float32(0.3) * (x - a)
    np.testing.assert_allclose(xs[t], x, rtol=1e-6, atol=1e-6)


def test_one_worker_tau1_beta1_center_equals_worker_after_exchange():
  # beta = 1, p = 1: alpha = 1, x~_{t+1} = x^1_t, and x^1_{t+1} = x~_t - eta g;
  # the center copies the worker's pre-step value at every exchange.
  algo = algorithms.easgd(quadratic_loss, learning_rate=0.1, num_workers=1, tau=1, beta=1.0)
  xs, cs = run(algo, 3.0, [0.0], 5, 1)
  prev = np.concatenate([[3.0], xs[:-1, 0]]).astype(np.float32)
  np.testing.assert_array_equal(cs, prev)


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(tau=0), "tau"),
        (dict(tau=1.5), "tau"),
        (dict(alpha=-0.1), "alpha"),
        (dict(beta=-1.0), "beta"),
        (dict(alpha=0.1, beta=0.9), "exactly one"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(num_workers=0), "num_workers"),
    ],
)
def test_bad_hyperparameters_name_the_value(bad, match):
  kwargs = dict(learning_rate=0.1, num_workers=2, tau=1, beta=0.9)
  if "alpha" in bad and "beta" not in bad:
    kwargs.pop("beta")
  kwargs.update(bad)
  with pytest.raises(elastic.HyperparameterError, match=match):
    algorithms.easgd(quadratic_loss, **kwargs)


def test_communication_counts():
  algo = algorithms.easgd(quadratic_loss, learning_rate=0.1, num_workers=4, tau=4, beta=0.9)
  # exchanges at t = 0, 4, 8 among the first 10 steps
  assert algo.communication(10, 100) == Communication(3, 300)
  base = algorithms.pmean_sgd(quadratic_loss, optax.sgd(0.1))
  assert base.communication(10, 100) == Communication(10, 1000)


def test_array_hyperparameters_are_traced_and_vmapped_over_configurations():
  # One program for three configurations of (eta, tau, beta), the algorithm built
  # inside the vmap from traced values; each equals its own Python-valued run.
  def trajectory(lr, tau, beta):
    algo = algorithms.easgd(quadratic_loss, learning_rate=lr, num_workers=2, tau=tau, beta=beta)
    step = mapping.vmap_workers(algo.step, 2, mapping.STEP_IN_KINDS, mapping.STEP_OUT_KINDS)
    worker = jax.vmap(lambda x: algo.init(x)[0])(jnp.ones(2))
    shared = algo.init(jnp.float32(1.0))[1]

    def body(carry, _):
      worker, shared, _ = step(*carry, jnp.array([0.0, 4.0]), jax.random.key(0))
      return (worker, shared), algo.center(shared)

    return jax.lax.scan(body, (worker, shared), None, length=6)[1]

  configs = (
      jnp.array([0.5, 0.3, 0.5]),
      jnp.array([2, 1, 3], jnp.int32),
      jnp.array([0.5, 0.9, 0.2]),
  )
  centers = jax.jit(jax.vmap(trajectory))(*configs)
  np.testing.assert_array_equal(centers[0], np.array(HAND_CENTER, np.float32))
  for i in (1, 2):
    algo = algorithms.easgd(
        quadratic_loss,
        learning_rate=float(configs[0][i]),
        num_workers=2,
        tau=int(configs[1][i]),
        beta=float(configs[2][i]),
    )
    _, cs = run(algo, 1.0, [0.0, 4.0], 6, 1)
    np.testing.assert_allclose(centers[i], cs, rtol=1e-6)


def test_what_needs_a_python_value_is_defined_for_array_hyperparameters():
  algo = algorithms.easgd(
      quadratic_loss, learning_rate=jnp.float32(0.1), num_workers=4, tau=4, beta=jnp.float32(0.9)
  )
  # a Python tau keeps the host schedule and the communication count
  assert algo.exchange_at(4) and algo.communication(10, 100) == Communication(3, 300)
  assert float(algo.hyperparameters["alpha"]) == pytest.approx(0.225)
  algo = algorithms.easgd(
      quadratic_loss, learning_rate=0.1, num_workers=4, tau=jnp.int32(4), beta=0.9
  )
  assert algo.exchange_at is None  # map_step runs the device-chosen program
  assert list(mapping.map_step(algo, worker_layout.make_layout(4, 2)).programs) == [None]
  with pytest.raises(TypeError, match="counted on the host from a Python tau"):
    algo.communication(10, 100)
  # Python values are still checked; arrays are the caller's to check
  with pytest.raises(elastic.HyperparameterError, match="tau"):
    algorithms.easgd(quadratic_loss, learning_rate=0.1, num_workers=4, tau=0, beta=0.9)
  with pytest.raises(elastic.HyperparameterError, match="learning_rate"):
    algorithms.easgd(
        quadratic_loss, learning_rate=-1.0, num_workers=4, tau=4, alpha=jnp.float32(0.1)
    )
