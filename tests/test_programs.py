"""The declared program table (``Algorithm.phases``, ``programs``, ``program_at``).

An algorithm with phases declares them; the mapping compiles each named
program and runs the one the host's clock names, with nothing else to know.
Worked table for EASGD with tau = 3 and a declared first phase "start" at
t = 0 (which exchanges, as EASGD's own schedule does at t = 0):

    clock     0        1      2      3     4      5
    program   "start"  False  False  True  False  False
"""

import functools

import jax
import numpy as np
import optax
import pytest

from easgd.core import algorithms
from easgd.core.base import Program
from easgd.parallel import mapping, placement, worker_layout

from testutil import STEP_KINDS, max_abs_diff, mlp_setup, random_batches

TAU = 3


def with_start_phase(algo):
  """``algo`` with a declared phase "start" (the exchange step at t = 0) and its
  own step, on its own schedule, after."""
  return algo._replace(
      phases={
          "start": Program(functools.partial(algo.step, exchange=True), lambda t: t == 0),
          None: Program(algo.step, lambda t: t >= 1, algo.exchange_at),
      }
  )


def test_declared_phases_are_what_the_mapping_compiles_and_runs():
  params, loss_fn = mlp_setup()
  plain = algorithms.easgd(loss_fn, optax.sgd(0.2), num_workers=4, tau=TAU, beta=0.9)
  algo = with_start_phase(plain)
  assert [algo.program_at(t) for t in range(6)] == ["start", False, False, True, False, False]
  assert [algo.program_at(t, exchange_on_host=False) for t in range(3)] == ["start", None, None]
  layout = worker_layout.make_layout(4, 2)
  step_fn = mapping.map_step(algo, layout, donate_state=False)
  assert set(step_fn.programs) == {"start", False, True}
  single = mapping.map_workers(plain.step, layout, *STEP_KINDS)
  xs, ys = random_batches(6, 4, 4)
  key = jax.random.key(5)
  a = b = placement.place_state(algo, params, layout)
  for t in range(6):
    batch = placement.split_workers((xs[t], ys[t]), layout)
    *a, loss_a = single(*a, batch, key)
    *b, loss_b = step_fn(*b, batch, key, t)
    assert np.isfinite(placement.merge_workers(loss_b)).all()
  assert max_abs_diff(placement.to_host(a), placement.to_host(b)) <= 2.4e-7  # as test_map_step
  # the declared "start" program at a later clock: its runs_at says no, NaN loss
  w, s = placement.place_state(algo, params, layout)
  w, s, _ = step_fn(w, s, placement.split_workers((xs[0], ys[0]), layout), key, 0)
  _, _, bad = step_fn.programs["start"](w, s, placement.split_workers((xs[1], ys[1]), layout), key)
  assert np.isnan(placement.merge_workers(bad)).all()


def test_a_table_that_does_not_name_one_program_per_clock_is_refused():
  _, loss_fn = mlp_setup()
  plain = algorithms.easgd(loss_fn, optax.sgd(0.2), num_workers=4, tau=TAU, beta=0.9)
  gap = plain._replace(phases={"start": Program(plain.step, lambda t: t == 0)})
  with pytest.raises(ValueError, match=r"exactly one program for clock 1, got \[\]"):
    gap.program_at(1)
  step_fn = mapping.map_step(gap, worker_layout.make_layout(4, 2))
  with pytest.raises(ValueError, match="exactly one program for clock 1"):
    step_fn(None, None, None, None, 1)
