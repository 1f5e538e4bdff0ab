"""Real asynchronous workers on threads, checked against the explicit-order replay.

Four workers run async EASGD, async EAMSGD and DOWNPOUR for real (one thread
each, on two fake CPU devices, two of them slowed down by injected delays), on
the quadratic F(x) = sum_k h_k x_k^2 / 2 + xi . x (gradient noise xi fixed by
worker and local step, as in ``easgd.sweeps.quadratic``) and on a small MLP. Then:

* the run's exchange log, replayed by ``easgd.asynchrony.log.replay`` with the
  same compiled programs, gives every worker's state and the center bit for
  bit; replayed op by op (uncompiled) it gives them to float32 rounding;
* no exchange is lost: the center is its initial value plus the sum of the
  elastic differences the workers received (EASGD, EAMSGD) or of the updates
  they pushed (DOWNPOUR), summed in float64 on the workers' side;
* each worker exchanged at exactly the local steps its schedule names:
  ceil(n / tau) times in n local steps (Algorithm 1 and the authors' DOWNPOUR
  exchange at t = 0, tau, ...), floor(n / tau) with push_timing "full_period";
* a worker that raises stops, the others finish the budget, and it is said
  (a warning); an error of the user's data stops the run and is no fault;
* through the trainer: a run interrupted and resumed continues its log, and
  the whole log replays the final checkpoint bit for bit.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd import cli
from easgd.asynchrony import simulation
from easgd.asynchrony.log import async_rules
from easgd.methods.downpour_family import downpour
from easgd.run import checkpoint, trainer
from easgd.runtimes import async_runs, threads, training_run
from easgd.runtimes.driver import Driver, WorkerFaultWarning, WorkersLostError
from easgd.runtimes.shared import AsyncSetup, UserFault, read_log, replay_run, unstack_workers
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import batches

from testutil import interrupt_once, mlp_setup, random_batches

KEY = jax.random.key(11)
P, TAU = 4, 3
DELAYS = (0.0, 0.002, 0.0, 0.005)  # seconds after each local step: stragglers
H = jnp.asarray([1.0, 0.5, 2.0, 1.5], jnp.float32)


def quadratic_loss(params, batch, key):
  del key
  return 0.5 * jnp.sum(H * params["x"] ** 2) + jnp.dot(batch, params["x"])


def quadratic_problem():
  noise = np.random.default_rng(0).normal(size=(P, 512, 4)).astype(np.float32)
  params = {"x": jnp.asarray([1.0, -2.0, 0.5, 3.0], jnp.float32)}
  return quadratic_loss, params, lambda i, t: noise[i, t % 512], 0.1


def mlp_problem():
  params, loss = mlp_setup(seed=0)
  x, y = random_batches(64, P, 8, seed=2)
  return loss, params, lambda i, t: (x[t % 64, i], y[t % 64, i]), 0.1


def make(name, loss, lr, push_timing="authors"):
  kw = dict(num_workers=P, tau=TAU, learning_rate=lr)
  if name == "async_easgd":
    return simulation.async_easgd(loss, beta=0.9, **kw)
  if name == "async_eamsgd":
    return simulation.async_eamsgd(loss, beta=0.9, momentum=0.9, **dict(kw, learning_rate=lr / 10))
  return downpour(loss, push_timing=push_timing, **kw)


def run_threads(setup, total, faults=()):
  devices = threads.worker_devices(P, jax.devices()[:2])
  backend = threads.ThreadBackend(setup, P, devices=devices, delays_s=DELAYS, record=True)
  for worker, clock in faults:
    backend.arm_fault(worker, clock)
  try:
    backend.warm_up()
    driver = Driver(backend, [0] * P, chunk_steps=4)
    driver.run_to(total)
    states, shared, log = backend.state()
    sums = [loop.sums for loop in backend.loops]
  finally:
    backend.close()
  return driver, states, shared, log, sums


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_bitwise(a, b):
  for x, y in zip(leaves(a), leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def max_diff(a, b):
  return max(
      float(np.max(np.abs(x.astype(np.float64) - y), initial=0))
      for x, y in zip(leaves(a), leaves(b), strict=True)
  )


@pytest.mark.parametrize("problem", ["quadratic", "mlp"])
@pytest.mark.parametrize("name", ["async_easgd", "async_eamsgd", "downpour"])
def test_a_real_run_replays_bit_for_bit_and_loses_no_exchange(name, problem):
  loss, params, batch_fn, lr = (quadratic_problem if problem == "quadratic" else mlp_problem)()
  algo = make(name, loss, lr)
  setup = AsyncSetup(algo, params, batch_fn, KEY)
  driver, states, shared, log, sums = run_threads(setup, 40 * P)
  clocks = [int(s.clock) for s in states]
  assert sum(clocks) == 40 * P and not driver.faults
  assert len(set(clocks)) > 1  # the delays made the workers' paces differ
  workers_in_order = [r["worker"] for r in log]
  assert workers_in_order != sorted(workers_in_order)  # exchanges interleave

  # the log through the replay: the same compiled programs give the same bits
  same = replay_run(setup, log, clocks)
  assert_bitwise(jax.device_get(same.workers), states)
  assert_bitwise(jax.device_get(same.shared), shared)
  # op by op (uncompiled): float32 rounding. Measured over 18 runs: <= 1.8e-7
  # (parameters up to 0.9)
  eager = replay_run(setup, log, clocks, compiled=False)
  assert max_diff(jax.device_get(eager.workers), states) < 1e-6
  assert max_diff(jax.device_get(eager.shared), shared) < 1e-6

  # no lost exchange: what the master added is what the workers sent/received
  index = 0 if name == "downpour" else 1  # pushed updates; elastic differences
  total = jax.tree.map(lambda *xs: sum(xs), *[s[index] for s in sums])
  expected = jax.tree.map(lambda c0, d: np.asarray(c0, np.float64) + d, params, total)
  # float32 center against a float64 sum; measured over 18 runs: <= 5.2e-7
  assert max_diff(shared.center, expected) < 2e-6

  # exchanges at exactly the due local steps: t = 0, tau, 2 tau, ...
  for i, n in enumerate(clocks):
    steps = [r["local_step"] for r in log if r["worker"] == i]
    assert steps == list(range(0, n, TAU))
    assert len(steps) == -(-n // TAU)  # ceil(n / tau)
  assert [r["version"] for r in log] == list(range(len(log)))
  assert all(r["read_version"] == r["version"] + (name == "downpour") for r in log)


def test_downpour_pushing_full_periods_exchanges_floor_n_over_tau_times():
  loss, params, batch_fn, lr = quadratic_problem()
  setup = AsyncSetup(make("downpour", loss, lr, "full_period"), params, batch_fn, KEY)
  _, states, shared, log, _ = run_threads(setup, 25 * P)
  for i, state in enumerate(states):
    n = int(state.clock)
    steps = [r["local_step"] for r in log if r["worker"] == i]
    assert steps == list(range(TAU - 1, n, TAU)) and len(steps) == n // TAU
  assert_bitwise(
      jax.device_get(replay_run(setup, log, [int(s.clock) for s in states]).shared),
      shared,
  )


def test_a_worker_that_raises_stops_and_the_others_finish():
  loss, params, batch_fn, lr = quadratic_problem()
  setup = AsyncSetup(make("async_easgd", loss, lr), params, batch_fn, KEY)
  # before its local step 2: inside its first chunk (4 steps), whatever the timing
  with pytest.warns(WorkerFaultWarning) as said:
    driver, states, shared, log, _ = run_threads(setup, 30 * P, faults=[(1, 2)])
  assert [str(w.message) for w in said] == [
      "worker 1 failed at local step 2 (InjectedFault: fault injected into worker 1 before its "
      "local step 2); it stays stopped, the other workers take its share of the steps"
  ]
  clocks = [int(s.clock) for s in states]
  assert clocks[1] == 2 and sum(clocks) == 30 * P  # the others took its share
  (fault,) = driver.faults
  assert (fault.worker, fault.local_step, fault.restarted_at) == (1, 2, None)
  assert fault.error.startswith("InjectedFault: fault injected into worker 1")
  assert driver.alive == [True, False, True, True]
  assert [r for r in log if r["event"] == "fault"] == [
      dict(r, event="fault", worker=1, local_step=2) for r in log if r["event"] == "fault"
  ]
  same = replay_run(setup, log, clocks)
  assert_bitwise(jax.device_get(same.workers), states)
  assert_bitwise(jax.device_get(same.shared), shared)


def test_every_worker_failing_is_one_error():
  loss, params, batch_fn, lr = quadratic_problem()
  setup = AsyncSetup(make("async_easgd", loss, lr), params, batch_fn, KEY)
  with pytest.raises(
      WorkersLostError,
      match=r"every worker stopped with \d+ of the run.s local steps left; faults: worker \d at local step 2: InjectedFault",
  ):
    with pytest.warns(WorkerFaultWarning, match="failed at local step 2"):
      run_threads(setup, 30 * P, faults=[(i, 2) for i in range(P)])


def test_an_error_of_the_users_data_stops_the_run_and_is_no_fault():
  loss, params, batch_fn, lr = quadratic_problem()

  def bad_batch(i, t):  # worker 2's batch of its local step 5 cannot be read
    if (i, t) == (2, 5):
      raise ValueError("item 77 cannot be read")
    return batch_fn(i, t)

  algo = make("async_easgd", loss, lr)
  setup = AsyncSetup(algo, params, bad_batch, KEY, user_errors=(ValueError,))
  backend = threads.ThreadBackend(setup, P, devices=[None] * P)
  try:
    backend.warm_up()
    driver = Driver(backend, [0] * P, chunk_steps=4)
    with pytest.raises(UserFault, match=r"^item 77 cannot be read$"):
      driver.run_to(30 * P)
    assert not driver.faults and driver.alive == [True] * P and driver.clocks[2] == 5
    assert not [r for r in backend.state()[2] if r["event"] != "exchange"]  # none logged
  finally:
    backend.close()


# -- through the trainer -------------------------------------------------------

# digits, tiny MLP: 1438 training images / 64 = 22 steps per epoch, 2 epochs
TINY = TrainConfig(
    algorithm="async_easgd",
    dataset="digits",
    model="mlp",
    num_workers=P,
    num_devices=2,
    global_batch_size=64,
    num_epochs=2,
    learning_rate=0.1,
    tau=2,
    beta=0.9,
    eval_batch_size=64,
    progress=False,
    runtime="threads",
    worker_delays=(0, 0, 0, 0.002),
)


def restore(workdir, run):
  ckpt = checkpoint.Checkpointer(workdir)
  try:
    rules = async_rules(run.algorithm)
    return ckpt.restore(target=async_runs._checkpoint_target(run, rules))
  finally:
    ckpt.close()


def test_an_interrupted_run_resumes_and_continues_its_log(tmp_path):
  first = trainer.train_and_evaluate(TINY, tmp_path, stop_after_steps=7)
  assert first["status"] == "stopped" and first["steps_done"] == 7
  log7 = read_log(tmp_path / "exchanges.jsonl")
  state7 = restore(tmp_path, training_run.Run(TINY))
  assert int(state7["log_length"]) == len(log7)
  assert int(state7["worker"].clock.sum()) == 7 * P  # a step is p local steps
  trainer.train_and_evaluate(TINY, tmp_path, resume=True, stop_after_steps=30)
  done = trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  assert done["status"] == "complete" and done["steps_done"] == 44
  assert [r["step"] for r in done["history"]] == [0, 22, 44]
  log = read_log(tmp_path / "exchanges.jsonl")
  assert log[: len(log7)] == log7  # the log goes on
  assert [r["version"] for r in log] == list(range(len(log)))
  run = training_run.Run(TINY)
  final = restore(tmp_path, run)
  clocks = final["worker"].clock.tolist()
  assert sum(clocks) == 44 * P
  assert done["exchanges_per_worker"] == [-(-n // 2) for n in clocks]
  # the whole log, from the start, replays the final checkpoint bit for bit
  out = replay_run(async_runs.make_setup(run), log, clocks)
  assert_bitwise(jax.device_get(out.workers), unstack_workers(final["worker"], P))
  assert_bitwise(out.shared.center, final["shared"].center)
  metrics = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert metrics[-1]["exchanges"] == len(log) and metrics[-1]["faults"] == 0
  assert metrics[-1]["test_accuracy"] > 0.8  # it learned (10 classes)
  assert done["layout"] == "4 workers = 4 threads on 2 device(s) [cpu, threads; evaluation: pmap]"


def test_a_worker_fault_is_reported_not_raised(tmp_path):
  with pytest.warns(WorkerFaultWarning, match="worker 3 failed at local step 5"):
    s = trainer.train_and_evaluate_async(TINY.replace(num_epochs=1), tmp_path, faults={3: 5})
  assert s["status"] == "complete" and s["steps_done"] == 22
  (fault,) = s["faults"]
  assert (fault["worker"], fault["local_step"], fault["restarted_at"]) == (3, 5, None)
  assert s["final"]["faults"] == 1 and s["worker_local_steps"][3] == 5


def test_the_batches_are_the_spmd_trainers(tmp_path):
  run = training_run.Run(TINY)
  batch_fn = async_runs.make_batch_fn(run)
  train_x, train_y = run.task.train.arrays
  for t in (0, 5, 21, 22, 50):
    epoch, k = t // 22 + 1, t % 22
    ix = batches.worker_batch_indices(len(train_y), P, 16, TINY.seed, epoch)[k]
    for i in range(P):
      x, y = batch_fn(i, t)
      np.testing.assert_array_equal(x, train_x[ix[i]])
      np.testing.assert_array_equal(y, train_y[ix[i]])


@pytest.mark.parametrize(
    "changes,match",
    [
        (
            dict(algorithm="easgd", tau=4),
            "algorithm 'easgd' does not run on runtime 'threads' "
            r"\(it runs on: spmd\); runtime 'threads' runs: async_easgd",
        ),
        (dict(staleness=2), "staleness=2 sets the simulated exchange schedule"),
        (dict(worker_delays=(0.1,)), "worker_delays has 1 entries; expected one per worker"),
        (dict(worker_delays=(0, 0, 0, -1)), r"worker_delays entry \(seconds per local step\)"),
        (dict(ray_address="auto"), "ray_address='auto' is not read by runtime 'threads'"),
        (
            dict(runtime="spmd"),
            r"worker_delays=\(0, 0, 0, 0.002\) is not read by runtime " "'spmd'",
        ),
        (dict(runtime="mpi"), "unknown runtime 'mpi'; allowed: spmd, threads, ray"),
    ],
)
def test_runtime_settings_are_checked_before_anything_starts(changes, match):
  with pytest.raises(ConfigError, match=match):
    TINY.replace(**changes).validate()


def test_the_command_line_refuses_a_synchronous_algorithm_in_one_line(tmp_path, capsys):
  status = cli.main(
      ["train", "--workdir", str(tmp_path / "w"), "--runtime", "threads", "--algorithm", "easgd"]
  )
  err = capsys.readouterr().err
  assert status == 2 and err.count("\n") == 1
  assert err.startswith("easgd: error: algorithm 'easgd' does not run on runtime")
  assert not (tmp_path / "w").exists()


def replays_its_checkpoint(workdir, cfg=TINY):
  """The whole log replays the latest checkpoint bit for bit; returns its clocks."""
  run = training_run.Run(cfg)
  final = restore(workdir, run)
  clocks = final["worker"].clock.tolist()
  log = read_log(workdir / "exchanges.jsonl")
  assert int(final["log_length"]) == len(log)
  out = replay_run(async_runs.make_setup(run), log, clocks)
  assert_bitwise(jax.device_get(out.workers), unstack_workers(final["worker"], P))
  assert_bitwise(out.shared.center, final["shared"].center)
  return clocks


# the epoch-end points of the boundary's sequence (evaluate, record, log,
# checkpoint): calls 2 are step 22's evaluation and record, save 1 step 22's,
# save 2 the end's (44)
@pytest.mark.parametrize(
    "point,call,after",
    [("_evaluate", 2, False), ("write_metrics", 2, False), ("save", 1, True), ("save", 2, True)],
)
def test_an_interrupt_at_any_point_of_a_boundary_resumes(tmp_path, monkeypatch, point, call, after):
  owner = {"_evaluate": trainer, "write_metrics": trainer.rundir, "save": checkpoint.Checkpointer}[
      point
  ]
  with monkeypatch.context() as m:
    fired = interrupt_once(m, owner, point, call, after)
    with pytest.raises(KeyboardInterrupt):
      trainer.train_and_evaluate(TINY, tmp_path)
  assert fired
  done = trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  assert done["status"] == "complete" and done["final_step"] == 44
  metrics = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert metrics == done["history"] and [r["step"] for r in metrics] == [0, 22, 44]
  clocks = replays_its_checkpoint(tmp_path)  # the log and the checkpoint agree
  log = read_log(tmp_path / "exchanges.jsonl")
  assert metrics[-1]["exchanges"] == len(log) == done["exchanges"]
  assert metrics[-1]["worker_local_steps"] == clocks == done["worker_local_steps"]


def test_summaries_report_the_clocks_and_faults_of_their_checkpoint(tmp_path):
  # worker 3 raises before its local step 2: inside its first chunk (>= 3 steps)
  with pytest.warns(WorkerFaultWarning, match="worker 3 failed at local step 2"):
    first = trainer.train_and_evaluate_async(TINY, tmp_path, stop_after_steps=8, faults={3: 2})
  clocks = restore(tmp_path, training_run.Run(TINY))["worker"].clock.tolist()
  assert first["status"] == "stopped" and first["steps_done"] == 8
  assert first["worker_local_steps"] == clocks and sum(clocks) == 8 * P
  assert first["exchanges_per_worker"] == [-(-n // 2) for n in clocks]  # tau = 2
  assert first["final_step"] == 0 and first["final"]["step"] == 0
  (fault,) = first["faults"]
  assert fault["error"].startswith("InjectedFault: fault injected into worker 3")
  assert (fault["worker"], fault["local_step"], fault["restarted_at"]) == (3, 2, None)
  assert first["stopped_workers"] == [3]
  # resumed: the fault is the checkpoint's, worker 3 stays stopped (threads), and says so
  with pytest.warns(WorkerFaultWarning) as said:
    done = trainer.train_and_evaluate(TINY, tmp_path, resume=True)
  assert [str(w.message) for w in said] == [
      f"worker 3 stays stopped (its fault at local step 2: {fault['error']}); the other "
      "workers take its share of the steps"
  ]
  assert done["status"] == "complete" and done["faults"] == [fault]
  assert done["stopped_workers"] == [3]
  clocks = replays_its_checkpoint(tmp_path)
  assert clocks[3] == 2 and sum(clocks) == 44 * P
  assert done["worker_local_steps"] == clocks and done["final"]["faults"] == 1


def scaled_center_evaluate(monkeypatch, at_step):
  """Run.evaluate sees a center of inf * itself at ``at_step``: a NaN test loss."""
  evaluate = training_run.Run.evaluate

  def scaled(self, worker, shared, epoch, step, losses):
    if step == at_step:
      shared = jax.tree.map(
          lambda x: x * np.float32(np.inf) if jnp.issubdtype(x.dtype, jnp.floating) else x, shared
      )
    return evaluate(self, worker, shared, epoch, step, losses)

  monkeypatch.setattr(training_run.Run, "evaluate", scaled)


@pytest.mark.parametrize("runtime", ["spmd", "threads"])
def test_a_non_finite_evaluation_stops_the_run_before_its_checkpoint(
    tmp_path, monkeypatch, runtime
):
  cfg = TINY.replace(checkpoint_every_steps=11)
  if runtime == "spmd":
    cfg = cfg.replace(runtime="spmd", worker_delays=())
  scaled_center_evaluate(monkeypatch, 22)
  with pytest.raises(
      trainer.DivergenceError,
      match=r"the evaluated center's test_loss is nan at step 22 \(epoch 1\)",
  ):
    trainer.train_and_evaluate(cfg, tmp_path)
  metrics = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in metrics] == [0]  # the diverged record is not written
  assert checkpoint.Checkpointer(tmp_path).latest_step() == 11  # the last good one


@pytest.mark.parametrize("runtime", ["spmd", "threads"])
def test_a_non_finite_step_0_evaluation_is_a_divergence(tmp_path, monkeypatch, runtime):
  cfg = TINY if runtime == "threads" else TINY.replace(runtime="spmd", worker_delays=())
  scaled_center_evaluate(monkeypatch, 0)
  with pytest.raises(
      trainer.DivergenceError,
      match=r"the evaluated center's test_loss is nan at step 0 \(epoch 0\)",
  ):
    trainer.train_and_evaluate(cfg, tmp_path)
  assert not (tmp_path / "metrics.jsonl").exists()
