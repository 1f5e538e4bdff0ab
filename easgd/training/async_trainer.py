"""The training loop of the real asynchronous runtimes (``runtime`` "threads", "ray").

``easgd.training.trainer.train_and_evaluate`` hands a config whose ``runtime`` is not
"spmd" to :func:`train_and_evaluate_async`, which trains the same algorithm
(the rules of ``Algorithm.async_rules``, the same local optimizer, data,
model and evaluation as the SPMD trainer) with real asynchronous workers:
``easgd.runtimes.threads`` (one thread per worker, this process) or
``easgd.runtimes.ray_actors`` (Ray actors, on this machine or a cluster).

Data: worker i's local step at its clock t reads worker i's rows of global
batch t of the SPMD trainer's order (``easgd.training.batches.worker_batch_indices`` of
epoch t // steps_per_epoch + 1, its step t % steps_per_epoch; the crops of
``crop_rng(seed, epoch, t)``), and the key
``easgd.asynchrony.log.local_key(step_key, i, t)``: a function of (seed, worker,
local step) only, so a replay rebuilds every batch (:func:`make_setup`). A
worker that runs ahead reads later global batches.

Budget: the run takes ``total_steps * num_workers`` local steps summed over
the workers (the synchronous run's number of gradient evaluations), handed
out by ``easgd.runtimes.driver.Driver``; a fast worker takes more of them. A
"step" of the run (metrics ``step``, ``--stop-after-steps``,
``checkpoint_every_steps``, epochs) is num_workers local steps: at step s the
workers' clocks sum to s * num_workers. At each boundary (an epoch end, a
checkpoint, the end) every worker is idle; the state is copied to the host,
checked for non-finite values, and the workers go on while the checkpoint is
saved and the center evaluated.

Files: those of ``easgd.training.rundir``. ``exchanges.jsonl`` is the real run's log
(``easgd.runtimes.shared``: one record per exchange, restart or fault, with the
worker, its local clock and the center version it read), rewritten before
every checkpoint, after the boundary's metrics record; a resumed run goes on
with it, cut to the checkpoint's length (records and metrics past the
checkpoint, left by an interrupt, are redone). Checkpoints hold every
worker's state (its clock included), the master's state (center and master
clock), the evaluated center, the losses since the last evaluation and the
log's length. Metrics records are the SPMD trainer's, with ``all_reduces`` /
``bytes_communicated`` the mean exchanges per worker so far, and ``exchanges``,
``worker_local_steps``, ``faults`` and ``wall_time_s`` (seconds of training
since the start, compilation excluded) added.

Faults: a worker that raises (threads) or whose process dies (Ray) does not
stop the others; Ray restarts it from the current center. Each fault is
logged (with its error) and listed in the summary (``faults``, with
``restarted_at``; ``stopped_workers``) and counted in the metrics. A resumed
run goes on with the faults of its checkpoint's log: a stopped worker stays
stopped and Ray's restarts count over the whole run. The
SPMD runtime, for the same fault, stops the whole run (a Python exception in
the step, or ``easgd.parallel.distributed``'s watchdog when a process dies, exit 3);
``--resume`` then continues from the last checkpoint.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Mapping

import jax
import numpy as np

from easgd.runtimes import driver as async_driver, shared as async_shared, threads as async_threads
from easgd.asynchrony import log as async_log
from easgd.training import batches, data, models, rundir, runlock, trainer
from easgd.parallel import distributed, workers
from easgd.training.config import ConfigError, TrainConfig
from easgd._util.progress import progress_bar

CHUNK_STEPS = {"threads": 8, "ray": 32}
"""Local steps handed to a worker at a time (``easgd.runtimes.driver.Driver``): a
Ray chunk is one remote call, so it is longer."""


def make_batch_fn(dataset: data.Dataset, config: TrainConfig, steps_per_epoch: int):
  """``batch_fn(worker, clock)``: worker's rows of global batch ``clock``.

  Args:
    dataset: the training data.
    config: the run's config (num_workers, per-worker batch, seed, crops).
    steps_per_epoch: global steps per epoch of the SPMD order.

  Returns:
    ``batch_fn(i, t) -> (x [B, ...], y [B])``, the rows of worker i in global
    batch t of the SPMD trainer (module docstring); thread-safe.
  """
  n, p = len(dataset.train_y), config.num_workers
  b, seed = config.per_worker_batch_size, config.seed

  @functools.lru_cache(maxsize=2 * p + 2)  # workers may be in different epochs
  def epoch_indices(epoch):
    return batches.worker_batch_indices(n, p, b, seed, epoch)

  def batch_fn(worker, clock):
    epoch, t = clock // steps_per_epoch + 1, clock % steps_per_epoch
    ix = epoch_indices(epoch)[t]  # [p, B]: global batch `clock`
    if config.crop_size is None:
      return dataset.train_x[ix[worker]], dataset.train_y[ix[worker]]
    x = batches.random_crop(dataset.train_x[ix], config.crop_size,
                         batches.crop_rng(seed, epoch, clock))
    return x[worker], dataset.train_y[ix[worker]]
  return batch_fn


def make_setup(run: trainer.Run) -> async_shared.AsyncSetup:
  """The ``AsyncSetup`` of a run: its algorithm, initial params, batches, key."""
  return async_shared.AsyncSetup(
      run.algorithm, run.init_params,
      make_batch_fn(run.dataset, run.config, run.steps_per_epoch), run.step_key)


def ray_setup(fields: Mapping[str, Any]) -> async_shared.AsyncSetup:
  """:func:`make_setup` from config fields, in a Ray actor's process (one device)."""
  config = TrainConfig(**fields).replace(num_devices=1)
  return make_setup(trainer.Run(config))


def _checkpoint_target(run: trainer.Run, rules) -> dict:
  p = run.config.num_workers
  worker = async_log.init_worker(rules, run.init_params)
  shared = async_log.init_shared(rules, run.init_params)
  return dict(
      worker=jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (p, *np.shape(x))),
                          worker),
      shared=jax.tree.map(np.asarray, shared),
      center=jax.tree.map(np.asarray, run.algorithm.center(shared)),
      loss_sum=np.zeros(p, np.float64), loss_count=np.zeros(p, np.int64),
      step=np.asarray(0, np.int64), log_length=np.asarray(0, np.int64),
      train_seconds=np.asarray(0.0, np.float64))


def _resumed_log(path, length: int) -> list[dict]:
  try:
    log = async_shared.read_log(path)
  except (OSError, ValueError) as e:
    raise ConfigError(f"cannot resume: '{path}' (the exchange log) cannot be read: "
                      f"{e}; start the run again with --overwrite") from None
  if len(log) < length:
    raise ConfigError(f"cannot resume: '{path}' holds {len(log)} records, the "
                      f"checkpoint {length}; start the run again with --overwrite")
  return log[:length]  # records after the checkpoint are redone


def _clocks(stacked) -> list[int]:
  """Each worker's local clock in a stacked worker state (a checkpoint's)."""
  return [int(c) for c in np.asarray(stacked.clock).reshape(-1)]


def _exchanges_per_worker(log, p: int) -> np.ndarray:
  counts = np.zeros(p, np.int64)
  for r in log:
    if r.get("event", "exchange") == "exchange":
      counts[r["worker"]] += 1
  return counts


def _make_backend(config, run, setup, worker_states, shared, log, elapsed_s):
  p = config.num_workers
  kw = dict(delays_s=config.worker_delays, workers=worker_states, shared=shared,
            log=log, elapsed_s=elapsed_s)
  if config.runtime == "threads":
    devices = async_threads.worker_devices(p, list(run.layout.devices))
    return async_threads.ThreadBackend(setup, p, devices=devices, **kw)
  from easgd.runtimes import ray_actors as async_ray
  return async_ray.RayBackend(functools.partial(ray_setup, config.to_dict_fields()), p,
                              **kw)


def train_and_evaluate_async(config: TrainConfig, workdir, *, overwrite: bool = False,
                             resume: bool = False, stop_after_steps: int | None = None,
                             faults: Mapping[int, int] | None = None) -> dict[str, Any]:
  """Trains ``config`` with real asynchronous workers (``runtime`` threads or ray).

  The same contract as ``easgd.training.trainer.train_and_evaluate`` (files, resume,
  checkpoints, evaluation of the center, divergence checks, summary), with
  the differences of the module docstring.

  Args:
    config: the run's configuration (``runtime`` "threads" or "ray").
    workdir: output directory.
    overwrite, resume, stop_after_steps: as ``easgd.training.trainer.train_and_evaluate``
      (a step is num_workers local steps).
    faults: ``{worker: local_step}``: make that worker fail before that local
      step (threads: it raises; Ray: its process exits), for tests and
      experiments.

  Returns:
    The summary (also ``workdir/summary.json``), with ``"history"``. It
    describes the latest checkpoint (``steps_done``): ``worker_local_steps``
    (its clocks), ``exchanges_per_worker``, ``faults`` (every fault of the run
    up to it, from the log: worker, local step, error, ``restarted_at``) and
    ``stopped_workers`` (those a fault stopped for good: on threads every
    faulted worker, also after a resume; on Ray one whose restarts ran out);
    ``final`` is the last metrics record, of step ``final_step``.

  Raises:
    ConfigError: bad config or workdir (before anything starts); a runtime
      that is "spmd"; several JAX processes.
    easgd.training.runlock.WorkdirInUseError: another command holds ``workdir``.
    easgd.parallel.distributed.StartupError: the Ray cluster cannot be reached.
    easgd.training.trainer.DivergenceError: a non-finite loss or state, or a non-finite
      evaluated test or validation loss.
    easgd.runtimes.driver.WorkersLostError: every worker stopped.
  """
  config = config.validate()
  if config.runtime not in ("threads", "ray"):
    raise ConfigError(f"train_and_evaluate_async runs runtime 'threads' or 'ray', "
                      f"got {config.runtime!r}")
  if distributed.is_multiprocess():
    raise ConfigError(f"runtime {config.runtime!r} runs in one process (Ray spreads "
                      "the workers over hosts); drop the multi-process flags")
  workdir = rundir.workdir_path(workdir)
  hint = trainer.stability_warning(config)
  if hint:
    warnings.warn(hint, trainer.StabilityWarning, stacklevel=3)
  with runlock.hold_workdir(workdir, "train"):  # one run per workdir, before its checks
    rundir.check_start(config, workdir, overwrite=overwrite, resume=resume)
    connection = None
    if config.runtime == "ray":
      from easgd.runtimes import ray_actors as async_ray
      connection = async_ray.connect(config.ray_address)
    try:
      return _train(config, workdir, resume, stop_after_steps, faults)
    finally:
      if connection is not None:
        connection.close()


def _train(config, workdir, resume, stop_after_steps, faults):
  run = trainer.Run(config)
  rules = async_log.async_rules(run.algorithm)
  setup = make_setup(run)
  p, spe = config.num_workers, run.steps_per_epoch
  ckpt = rundir.open_run(config, workdir, resume=resume)
  start = time.perf_counter()
  earlier_wall_time_s = rundir.earlier_wall_time(workdir) if resume else 0.0
  log_path = workdir / rundir.EXCHANGES_FILE
  if resume and ckpt.latest_step() is not None:
    try:
      restored = ckpt.restore(target=_checkpoint_target(run, rules))
      step = int(restored["step"])
      history = rundir.resumed_history(config, workdir, spe, step)
      log = _resumed_log(log_path, int(restored["log_length"]))
    except ConfigError:
      ckpt.close()
      raise
    worker_states = async_shared.unstack_workers(restored["worker"], p)
    shared = restored["shared"]
    loss_sum, loss_count = restored["loss_sum"], restored["loss_count"]
    train_seconds = float(restored["train_seconds"])
    final_clocks = _clocks(restored["worker"])
    # what an interrupt left past the checkpoint is redone: the files say so now
    async_shared.write_log(log_path, log)
    rundir.write_metrics(workdir, history)
  else:
    step, log, worker_states, shared = 0, [], None, None
    loss_sum, loss_count, train_seconds = np.zeros(p), np.zeros(p, np.int64), 0.0
    init_worker = async_log.init_worker(rules, run.init_params)
    init_shared = async_log.init_shared(rules, run.init_params)
    history = [_evaluate(run, async_shared.stack_workers([init_worker] * p),
                         jax.device_get(init_shared), 0, 0, None, [], [0] * p, 0.0)]
    rundir.write_metrics(workdir, history)
    final_clocks = [0] * p
  final_log = log  # the log of the latest checkpoint, which the summary describes

  last = run.total_steps if stop_after_steps is None else min(run.total_steps,
                                                              stop_after_steps)
  progress = progress_bar(run.total_steps, spe, initial=step,
                          desc=f"{config.algorithm} p={p} [{config.runtime}]",
                          disable=not (config.progress and step < last))
  backend = _make_backend(config, run, setup, worker_states, shared, log, train_seconds)
  try:
    for worker, clock in (faults or {}).items():
      backend.arm_fault(int(worker), int(clock))
    backend.warm_up()  # compile every program before the clock starts
    driver = async_driver.Driver(
        backend, [0] * p if worker_states is None else
        [int(w.clock) for w in worker_states], chunk_steps=CHUNK_STEPS[config.runtime],
        on_progress=lambda total: progress.update(total // p - progress.n),
        faults=async_driver.logged_faults(log))  # resumed: a stopped worker stays so
    driver.loss_sum[:], driver.loss_count[:] = loss_sum, loss_count
    train_start = time.perf_counter() - train_seconds
    pending = None  # the last boundary's checkpoint and evaluation
    while step < last:
      epoch = step // spe + 1
      boundary = min(epoch * spe, last)
      every = config.checkpoint_every_steps
      if every:
        boundary = min(boundary, (step // every + 1) * every)
      driver.run_to(boundary * p, while_running=pending)
      step = boundary
      seconds = time.perf_counter() - train_start
      workers_now, shared_now, log_now = backend.state()
      stacked = async_shared.stack_workers(workers_now)
      shared_now = shared_now._replace(step=np.asarray(step, np.int32))
      _check_finite(run, driver, stacked, shared_now, step)
      evaluate = step == epoch * spe and (epoch % config.eval_every_epochs == 0
                                          or epoch == config.num_epochs)
      train_loss = None
      if evaluate:
        s, c = driver.take_losses()
        train_loss = float(s.sum() / c.sum()) if c.sum() else None
      state = dict(worker=stacked, shared=shared_now,
                   center=run.algorithm.center(shared_now),
                   loss_sum=driver.loss_sum.copy(), loss_count=driver.loss_count.copy(),
                   step=np.asarray(step, np.int64),
                   log_length=np.asarray(len(log_now), np.int64),
                   train_seconds=np.asarray(seconds, np.float64))
      pending = functools.partial(
          _boundary, run, workdir, ckpt, history, state, log_now, epoch if evaluate
          else None, train_loss, list(driver.clocks), seconds, progress)
      final_clocks, final_log = _clocks(stacked), log_now
    if pending is not None:
      pending()
  finally:
    backend.close()
    progress.close()
    ckpt.close()

  per_worker = _exchanges_per_worker(final_log, p)
  faults_now = async_driver.logged_faults(final_log)
  mean = int(round(float(np.mean(per_worker))))
  summary = dict(
      status="complete" if step == run.total_steps else "stopped",
      config=config.to_dict(),
      algorithm=dict(name=run.algorithm.name, **rules.hyperparameters),
      runtime=config.runtime,
      layout=_describe(config, run), num_devices=run.layout.num_devices,
      jax_version=jax.__version__, platform=run.layout.devices[0].platform,
      num_params=models.count_params(run.init_params), param_bytes=run.param_bytes,
      train_examples=len(run.dataset.train_y), test_examples=len(run.dataset.test_y),
      steps_per_epoch=spe, total_steps=run.total_steps, steps_done=step,
      resolved=run.resolved, center_lag_steps=None,
      communication=dict(all_reduces=mean, bytes=mean * run.param_bytes,
                         all_reduces_per_step=mean / max(step, 1),
                         bytes_per_step=mean * run.param_bytes / max(step, 1)),
      exchanges=int(per_worker.sum()), exchanges_per_worker=per_worker.tolist(),
      # the clocks, exchanges and faults of the latest checkpoint (steps_done)
      worker_local_steps=final_clocks,
      faults=[f._asdict() for f in faults_now],
      stopped_workers=async_driver.stopped_workers(faults_now),
      final_step=history[-1]["step"],  # the step of `final` (<= steps_done)
      final=history[-1],
      best_test_accuracy=max(r["test_accuracy"] for r in history),
      wall_time_s=round(earlier_wall_time_s + time.perf_counter() - start, 3))
  rundir.write_summary(workdir, summary)
  rundir.drop_previous_run(workdir)
  summary["history"] = history
  return summary


def _describe(config, run) -> str:
  """The layout line: where the workers run, and the mapping that evaluates."""
  p = config.num_workers
  evaluation = f"evaluation: {run.layout.backend}"  # mapping_backend is read here
  if config.runtime == "threads":
    return (f"{p} workers = {p} threads on {run.layout.num_devices} device(s) "
            f"[{run.layout.devices[0].platform}, threads; {evaluation}]")
  return (f"{p} workers = {p} Ray actors [{config.ray_address or 'local Ray'}, ray; "
          f"{evaluation}]")


def _check_finite(run, driver, stacked, shared, step) -> None:
  """Raises DivergenceError at a non-finite loss or state (never saved)."""
  if driver.nonfinite is not None:
    w, t, value = driver.nonfinite
    c = run.config
    raise trainer.DivergenceError(
        f"training diverged: worker {w} had a non-finite loss ({value}) at its local "
        f"step {t}; algorithm={c.algorithm}, learning_rate={c.learning_rate}, "
        f"runtime={c.runtime}; lower the learning rate")
  run.check_finite(np.zeros((0, run.config.num_workers), np.float32), step,
                   dict(worker=stacked, shared=shared, step=step))


def _evaluate(run, stacked, shared, epoch, step, train_loss, log, clocks, seconds):
  """One metrics record: the center on every test example once (SPMD evaluation)."""
  rec = run.evaluate(workers.split_workers(stacked, run.layout),
                     workers.replicate_per_device(shared, run.layout), epoch, step, None)
  per = _exchanges_per_worker(log, run.config.num_workers)
  mean = int(round(float(np.mean(per))))
  rec.update(train_loss=train_loss, all_reduces=mean,
             bytes_communicated=mean * run.param_bytes, exchanges=int(per.sum()),
             worker_local_steps=[int(c) for c in clocks],
             faults=sum(r.get("event") == "fault" for r in log),
             wall_time_s=round(seconds, 3))
  return rec


def _boundary(run, workdir, ckpt, history, state, log, epoch, train_loss, clocks,
              seconds, progress) -> None:
  """A boundary's files: (epoch ends) the evaluation's record, the log, the checkpoint.

  Both files come before the checkpoint: an interrupt between them leaves a
  record and log entries past the latest checkpoint, which a resumed run
  drops and redoes; a non-finite evaluation (DivergenceError) writes nothing.
  """
  step = int(state["step"])
  if epoch is not None:
    rec = _evaluate(run, state["worker"], state["shared"], epoch, step, train_loss, log,
                    clocks, seconds)
    history.append(rec)
    rundir.write_metrics(workdir, history)
    progress.set_postfix(test_acc=f"{rec['test_accuracy']:.4f}", refresh=False)
  async_shared.write_log(workdir / rundir.EXCHANGES_FILE, log)
  ckpt.save(step, state)
