"""Host-scheduled steps (``mapping.map_step``): two programs, the same values.

For the synchronous periodic algorithms (EASGD, EAMSGD, local SGD, DiLoCo) the
trainer runs a program without communication on local steps and one with it on
exchange steps, picked on the host from ``Algorithm.exchange_at``. These tests
check that this gives the values of the single ``lax.cond`` step on both
backends, that the local program holds no all-reduce and no conditional, and
that the host schedule agrees with the device's clock test.

Tolerance: the two compilations fuse the same float32 arithmetic differently
(XLA:CPU; the conditional is a fusion boundary), so they may differ in the last
bit: |a - b| <= 2.4e-7 over 8 steps (measured, JAX 0.10.2 CPU, this MLP: EASGD
1.19e-7, one ulp at 1; EAMSGD, local SGD and DiLoCo bit for bit equal here,
though with other models their fusions differ too).
"""

import jax
import numpy as np
import optax
import pytest

from easgd.core import algorithms, elastic
from easgd.core.base import every_tau_steps
from easgd.methods import baselines
from easgd.parallel import mapping, names, placement, worker_layout

from testutil import STEP_KINDS, all_reduce_bytes, max_abs_diff, mlp_setup, random_batches

TAU = 3


def make(name, loss_fn):
  sgd = optax.sgd(0.2)
  if name == "easgd":
    return algorithms.easgd(loss_fn, sgd, num_workers=4, tau=TAU, beta=0.9)
  if name == "easgd_reset":  # reset_opt_state: the reset is also fixed by the host
    return algorithms.easgd(
        loss_fn,
        optax.sgd(0.2, momentum=0.9),
        num_workers=4,
        tau=TAU,
        beta=0.9,
        reset_opt_state=True,
    )
  if name == "eamsgd":
    return algorithms.eamsgd(loss_fn, sgd, num_workers=4, tau=TAU, beta=0.9, momentum=0.9)
  if name == "local_sgd":
    return baselines.local_sgd(loss_fn, sgd, num_workers=4, tau=TAU)
  if name == "diloco":
    return baselines.diloco(loss_fn, sgd, num_workers=4, tau=TAU)
  raise AssertionError(name)


def trajectory(step_fn, algo, params, layout, xs, ys, scheduled):
  worker, shared = placement.place_state(algo, params, layout)
  key = jax.random.key(5)
  states = []
  for t, (x, y) in enumerate(zip(xs, ys)):
    batch = placement.split_workers((x, y), layout)
    args = (worker, shared, batch, key) + ((t,) if scheduled else ())
    worker, shared, loss = step_fn(*args)
    states.append(placement.to_host((worker, shared, loss)))
  return states


@pytest.mark.parametrize("backend", names.BACKENDS)
@pytest.mark.parametrize("name", ["easgd", "easgd_reset", "eamsgd", "local_sgd", "diloco"])
def test_two_host_scheduled_programs_give_the_values_of_the_conditional_step(name, backend):
  params, loss_fn = mlp_setup()
  xs, ys = random_batches(8, 4, 4)  # 8 steps, tau=3: both kinds of step, 3 periods
  algo = make(name, loss_fn)
  layout = worker_layout.make_layout(4, 2, backend=backend)
  single = mapping.map_workers(algo.step, layout, *STEP_KINDS)
  scheduled = mapping.map_step(algo, layout, donate_state=False)
  assert set(scheduled.programs) == {False, True}
  a = trajectory(single, algo, params, layout, xs, ys, scheduled=False)
  b = trajectory(scheduled, algo, params, layout, xs, ys, scheduled=True)
  worst = max(max_abs_diff(sa, sb) for sa, sb in zip(a, b))
  print(f"{name}/{backend}: max |cond - scheduled| over 8 steps = {worst:.3g}")
  # measured: EASGD 1.19e-7 (one float32 ulp at 1), the others 0
  assert worst <= 2.4e-7, (name, backend, worst)
  # the run moved: the center changed and the workers differ from it
  center0 = jax.tree.leaves(params)[0]
  assert not np.array_equal(jax.tree.leaves(algo.center(b[-1][1]))[0][0], center0)


@pytest.mark.parametrize(
    "name,exchanges",
    [("easgd", [0, 3, 6]), ("eamsgd", [0, 3, 6]), ("local_sgd", [2, 5]), ("diloco", [2, 5])],
)
def test_host_schedule_names_the_steps_where_the_device_clock_exchanges(name, exchanges):
  _, loss_fn = mlp_setup()
  algo = make(name, loss_fn)
  assert [t for t in range(8) if algo.exchange_at(t)] == exchanges
  assert algo.communication(8, 10).all_reduces == len(exchanges)


def test_only_the_exchange_program_all_reduces_and_neither_has_a_conditional():
  params, loss_fn = mlp_setup()
  algo = make("easgd", loss_fn)
  layout = worker_layout.make_layout(4, 2)
  worker, shared = placement.place_state(algo, params, layout)
  xs, ys = random_batches(1, 4, 4)
  batch = placement.split_workers((xs[0], ys[0]), layout)
  step = mapping.map_step(algo, layout)
  text = {
      flag: f.lower(worker, shared, batch, jax.random.key(0)).compile().as_text()
      for flag, f in step.programs.items()
  }
  count = lambda t, op: sum(1 for line in t.splitlines() if f" {op}(" in line)
  assert count(text[False], "all-reduce") == 0
  assert count(text[True], "all-reduce") >= 1
  assert count(text[False], "conditional") == count(text[True], "conditional") == 0


def test_algorithms_without_a_schedule_run_their_one_program():
  params, loss_fn = mlp_setup()
  algo = algorithms.pmean_sgd(loss_fn, optax.sgd(0.2))
  assert algo.exchange_at is None
  layout = worker_layout.make_layout(4, 2)
  step = mapping.map_step(algo, layout)
  assert set(step.programs) == {None}


SYNCHRONOUS = [
    n
    for n, s in __import__("easgd.methods.registry").methods.registry.TABLE.items()
    if not s.asynchronous
]


@pytest.mark.parametrize("num_workers,num_devices", [(1, 1), (2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("name", SYNCHRONOUS)
def test_the_programs_the_trainer_runs_communicate_what_the_accounting_counts(
    name, num_workers, num_devices
):
  """Summed over N = 8 tau steps, the all-reduces of the compiled programs that
  map_step runs equal Algorithm.communication, for every synchronous algorithm of
  the table at every p (per device = per worker: the vmapped workers' sum is
  formed before the cross-device all-reduce). A single worker has nothing to
  reduce: no all-reduce in its programs, none counted."""
  from easgd.methods import registry
  from easgd.runtimes import optimizers
  from easgd.settings.config import TrainConfig
  from easgd.tasks import models

  params, loss_fn = mlp_setup()
  cfg, _ = TrainConfig(num_workers=num_workers, tau=TAU).for_algorithm(name)
  cfg = cfg.validate()
  algo = registry.make_algorithm(cfg, loss_fn, optimizers.make_optimizer(cfg, 100), 10 * TAU)
  layout = worker_layout.make_layout(num_workers, num_devices)
  worker, shared = placement.place_state(algo, params, layout)
  xs, ys = random_batches(1, num_workers, 4)
  batch = placement.split_workers((xs[0], ys[0]), layout)
  programs = mapping.map_step(algo, layout, donate_state=False).programs
  texts = {
      flag: f.lower(worker, shared, batch, jax.random.key(0)).compile().as_text()
      for flag, f in programs.items()
  }
  assert not any(" conditional(" in t for t in texts.values())
  per_call = {flag: all_reduce_bytes(t) for flag, t in texts.items()}
  n = 8 * TAU
  flags = [algo.program_at(t) for t in range(n)]  # the program the host runs at t
  count = sum(per_call[f][0] for f in flags)
  nbytes = sum(per_call[f][1] for f in flags)
  comm = algo.communication(n, models.param_bytes(params))
  assert (count, nbytes) == (comm.all_reduces, comm.bytes)
  assert (count > 0) == (num_workers > 1)


@pytest.mark.parametrize("clock", [-1, 1.0, True, "3", None, 2**31])
def test_a_clock_that_is_not_a_step_count_is_refused_before_running(clock):
  params, loss_fn = mlp_setup()
  algo = make("easgd", loss_fn)
  layout = worker_layout.make_layout(4, 2)
  step = mapping.map_step(algo, layout)
  with pytest.raises(
      ValueError,
      match=r"clock \(the number of steps taken\) must be an " r"integer in \[0, 2147483647\]",
  ):
    step(None, None, None, None, clock)


def test_bad_exchange_flags_schedules_and_arguments_are_refused():
  params, loss_fn = mlp_setup()
  algo = make("easgd", loss_fn)
  worker, shared = algo.init(params)
  for name in ("easgd", "local_sgd"):
    with pytest.raises(TypeError, match="exchange must be None or a Python bool"):
      make(name, loss_fn).step(worker, shared, None, jax.random.key(0), exchange=1)
  with pytest.raises(elastic.HyperparameterError, match="tau"):
    every_tau_steps(0)
  with pytest.raises(elastic.HyperparameterError, match="tau"):
    every_tau_steps(2.5)
  layout = worker_layout.make_layout(4, 2)
  with pytest.raises(TypeError, match="algorithm must be an easgd.core.algorithms.Algorithm"):
    mapping.map_step("easgd", layout)
  with pytest.raises(
      TypeError, match="layout must be an easgd.parallel.worker_layout.WorkerLayout"
  ):
    mapping.map_step(algo, "layout")


@pytest.mark.parametrize("name", ["easgd", "local_sgd"])
def test_a_clock_that_disagrees_with_the_state_gives_a_nan_loss(name):
  params, loss_fn = mlp_setup()
  algo = make(name, loss_fn)
  layout = worker_layout.make_layout(4, 2)
  step = mapping.map_step(algo, layout, donate_state=False)
  worker, shared = placement.place_state(algo, params, layout)
  xs, ys = random_batches(1, 4, 4)
  batch = placement.split_workers((xs[0], ys[0]), layout)
  key = jax.random.key(0)
  _, _, right = step(worker, shared, batch, key, 0)
  assert np.all(np.isfinite(placement.merge_workers(right)))
  wrong_clock = next(t for t in range(1, 2 * TAU) if algo.exchange_at(t) != algo.exchange_at(0))
  _, _, wrong = step(worker, shared, batch, key, wrong_clock)  # the state is at 0
  assert np.all(np.isnan(placement.merge_workers(wrong)))
  # a wrong clock that happens to name the same program is harmless: same values
  same = next(t for t in range(1, 2 * TAU) if algo.exchange_at(t) == algo.exchange_at(0))
  _, _, also = step(worker, shared, batch, key, same)
  np.testing.assert_array_equal(placement.merge_workers(also), placement.merge_workers(right))
