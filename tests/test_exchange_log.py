"""The exchange log of a simulated asynchronous run replays the run.

``easgd.asynchrony.log.write_exchange_log`` writes every exchange of a run
(slot, worker, its local clock, the center version it read) without running
the model. A float64 NumPy reference that reads only that file (and the data
and the method's published rule: Algorithm 1/2 for EASGD/EAMSGD, the authors'
``optim-downpour.lua`` for DOWNPOUR, Section 5 of the paper for MDOWNPOUR)
reproduces the device's center after every slot and every worker at the end.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd.asynchrony import simulation
from easgd.asynchrony.log import EXCHANGE_RECORD, exchange_log, write_exchange_log
from easgd.asynchrony.schedule import exchange_schedule
from easgd.core import algorithms
from easgd.methods.downpour_family import downpour, mdownpour
from easgd.parallel import placement

import linear_problem
from linear_problem import THETA0, loss_fn, np_grad

make_data = functools.partial(linear_problem.make_data, seed=3)

KEY = jax.random.key(5)
ALPHA, ETA = 0.2, 0.1
DELTA = {"async_eamsgd": 0.9, "mdownpour": 0.5}  # momentum (MDOWNPOUR: on the master)


def replay(records, kind, xs, ys, final_clocks):
  """Float64 replay of a run from its exchange records (JSON dicts), nothing else.

  Local steps between two exchanges of a worker use its mini-batch of slot 0
  (the tests with tau > 1 give each worker the same batch in every slot); a
  step that exchanges uses the batch of the record's slot.

  Returns:
    (center after each record [len + 1, 4], final worker params [p, 4]).
  """
  p = xs.shape[1]
  x = [THETA0.copy() for _ in range(p)]
  v = [np.zeros(4) for _ in range(p)]  # EAMSGD velocity
  acc = [np.zeros(4) for _ in range(p)]  # DOWNPOUR accumulated update
  clock = [0] * p
  centers = [THETA0.copy()]
  master_velocity = np.zeros(4)
  delta = DELTA.get(kind, 0.0)

  def grad(i, point, slot):
    return np_grad(point, xs[slot, i], ys[slot, i])

  def local_step(i, slot):
    if kind.startswith("async"):  # Algorithm 2 without the elastic term
      v[i] = delta * v[i] - ETA * grad(i, x[i] + delta * v[i], slot)
      x[i] = x[i] + v[i]
    else:  # optim-downpour.lua, a step without push
      dfdx = -ETA * grad(i, x[i], slot)
      acc[i] = acc[i] + dfdx
      x[i] = x[i] + dfdx
    clock[i] += 1

  for r in records:
    i = r["worker"]
    assert r["version"] == len(centers) - 1  # served one at a time, in order
    while clock[i] < r["local_step"]:
      local_step(i, 0)
    if kind.startswith("async"):  # Algorithm 1/2: exchange at the step's start
      snap = x[i].copy()
      d = ALPHA * (snap - centers[r["read_version"]])
      centers.append(centers[-1] + d)
      x[i] = x[i] - d
      v[i] = delta * v[i] - ETA * grad(i, snap + delta * v[i], r["slot"])
      x[i] = x[i] + v[i]
    else:  # push at the step's end, then fetch
      acc[i] = acc[i] - ETA * grad(i, x[i], r["slot"])
      if kind == "mdownpour":
        master_velocity = delta * master_velocity + acc[i]
        centers.append(centers[-1] + acc[i] + delta * master_velocity)
      else:
        centers.append(centers[-1] + acc[i])
      x[i] = centers[r["read_version"]].copy()
      acc[i] = np.zeros(4)
    clock[i] += 1
  for i in range(p):
    while clock[i] < final_clocks[i]:
      local_step(i, 0)
  return np.stack(centers), np.stack(x)


@pytest.mark.parametrize(
    "name,tau", [("async_easgd", 1), ("async_eamsgd", 3), ("downpour", 3), ("mdownpour", 1)]
)
def test_a_float64_replay_from_the_log_reproduces_the_device_run(name, tau, tmp_path):
  p = 4
  schedule = exchange_schedule(p, "random", (1, 3, 2, 2), staleness=1)
  num_steps = 6 * schedule.slots_per_tick
  xs, ys = (a.astype(np.float64) for a in make_data(num_steps, p))
  if tau > 1:  # every slot's batch of a worker equals its slot-0 batch
    xs, ys = (np.broadcast_to(a[:1], a.shape).copy() for a in (xs, ys))
  kw = dict(num_workers=p, tau=tau, learning_rate=ETA, schedule=schedule)
  if name == "async_easgd":
    algo = simulation.async_easgd(loss_fn, alpha=ALPHA, **kw)
  elif name == "async_eamsgd":
    algo = simulation.async_eamsgd(loss_fn, alpha=ALPHA, momentum=DELTA[name], **kw)
  elif name == "downpour":
    algo = downpour(loss_fn, **kw)
  else:
    algo = mdownpour(loss_fn, momentum=DELTA[name], **kw)
  with jax.enable_x64(True):
    init = {"w": jnp.asarray(THETA0[:3], jnp.float64), "b": jnp.asarray(THETA0[3], jnp.float64)}
    wt, ct, worker, shared = linear_problem.trajectory(algo, xs, ys, 2, KEY, init)
  path = tmp_path / "exchanges.jsonl"
  count = write_exchange_log(path, algo, KEY, num_steps)
  records = [json.loads(line) for line in path.read_text().splitlines()]
  assert count == len(records) == int(placement.first_copy(shared.master_clock))
  assert len({r["worker"] for r in records}) == p
  slots = [r["slot"] for r in records]
  assert slots == sorted(slots) and [r["time"] for r in records] == sorted(
      r["time"] for r in records
  )
  final_clocks = placement.merge_workers(worker.clock).tolist()
  centers, final_x = replay(records, name, xs, ys, final_clocks)
  served_by = np.searchsorted(slots, np.arange(num_steps), side="right")
  # measured: <= 1.4e-15 (values up to 6)
  np.testing.assert_allclose(ct, centers[served_by], rtol=0, atol=1e-14)
  np.testing.assert_allclose(wt[-1], final_x, rtol=0, atol=1e-14)
  assert np.ptp(final_x, axis=0).max() > 1e-3  # the workers differ


def test_exchange_log_fields_and_errors():
  # p = 2, speeds (1, 2), tau = 2, staleness 1, round-robin, DOWNPOUR: pushes
  # after local steps 0, 2, 4, ... at the step's end. Worker 0's steps end at
  # ticks 1, 2, 3 (slots 1, 3, 5), worker 1's at 0.5, 1, 1.5, ... (slots 0..5).
  schedule = exchange_schedule(2, worker_speeds=(1, 2), staleness=1)
  algo = downpour(loss_fn, num_workers=2, tau=2, learning_rate=0.1, schedule=schedule)
  log = exchange_log(algo, KEY, 6)
  assert log.dtype == EXCHANGE_RECORD
  assert [(r["slot"], r["worker"], r["local_step"], r["time"]) for r in log] == [
      (0, 1, 0, 0.5),
      (1, 0, 0, 1.0),
      (2, 1, 2, 1.5),
      (4, 1, 4, 2.5),
      (5, 0, 2, 3.0),
  ]
  assert log["version"].tolist() == [0, 1, 2, 3, 4]
  assert log["read_version"].tolist() == [0, 1, 2, 3, 4]  # fetch after own push, 1 late
  assert log["tick"].tolist() == [0, 0, 1, 2, 2]
  assert len(exchange_log(algo, KEY, 0)) == 0
  easgd = simulation.async_easgd(
      loss_fn, num_workers=2, tau=2, alpha=0.1, learning_rate=0.1, schedule=schedule
  )
  # at the step's start, clocks 0, 2, ...: worker 0 starts at ticks 0, 1, 2
  # (slots 0, 2, 4), worker 1 at 0, 0.5, 1, ... (slots 0..5); ties in tick order
  log = exchange_log(easgd, KEY, 6)
  assert [(r["slot"], r["worker"], r["local_step"]) for r in log] == [
      (0, 0, 0),
      (0, 1, 0),
      (2, 1, 2),
      (4, 0, 2),
      (4, 1, 4),
  ]
  assert log["read_version"].tolist() == [0, 0, 1, 2, 3]  # before its update, 1 late
  with pytest.raises(ValueError, match="no simulated exchange schedule"):
    exchange_log(
        algorithms.easgd(loss_fn, num_workers=2, tau=2, alpha=0.1, learning_rate=0.1), KEY, 6
    )
  with pytest.raises(ValueError, match="num_steps"):
    exchange_log(algo, KEY, -1)
