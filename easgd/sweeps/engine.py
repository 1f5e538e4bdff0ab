"""The sweep engine: many configurations of one algorithm as ONE compiled program.

``jit(vmap over configurations(build(**hyperparameters), scan over steps(algorithm.step
over the simulated workers)))``: :func:`make_sweep_fn` builds it, with per-configuration
divergence flags of the workers and of the center; :class:`CompileCounter` counts the
compilations. What it computes and why the center is watched apart:
docs/guides/stability.md.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), eq. (5)-(6), Algorithm 1.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Collection, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from optax.tree_utils import tree_where

from easgd._util import checks
from easgd.core import elastic
from easgd.core.base import Algorithm
from easgd.parallel import mapping

Params = Any
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
RUN_ARGUMENTS = ("worker_params", "center", "batches", "eval_data", "key")
"""The arguments of a sweep program that ``per_config`` may batch."""
MAX_STEPS = 2**31 - 1
"""The most steps of one sweep: the step counter and ``diverged_step`` are int32."""


class SweepError(elastic.HyperparameterError):
  """A sweep grid or setting is outside its allowed range (one-line message)."""


def check_int(
    name: str, value, minimum: int, maximum: int | None = None, *, what: str | None = None
) -> int:
  """``int(value)`` for an integer in [minimum, maximum] (None: unbounded above).

  Raises:
    SweepError: anything else (bools and floats included), in the words of
      ``easgd._util.checks.integer``.
  """
  return checks.integer(name, value, minimum, maximum, error=SweepError, what=what)


def check_real(name: str, value, minimum: float, strictly: bool) -> float:
  """``float(value)`` for a finite real >= ``minimum`` (> if ``strictly``);
  else :class:`SweepError`."""
  return checks.real(name, value, minimum, open_low=strictly, error=SweepError)


def check_factor(value) -> float:
  """The divergence factor c, a finite real > 1; else :class:`SweepError`."""
  return checks.real("divergence_factor", value, 1, open_low=True, error=SweepError)


class CompileCounter:
  """Counts XLA compilations (and their seconds) while the context is open.

  Listens to the ``/jax/core/compile/backend_compile_duration`` event of
  ``jax.monitoring``: one event per backend compilation, cache hits excluded.
  The sweeps record it per program (``info["programs"]``); tests and
  ``benchmarks/`` use it to show that a second grid compiles nothing.

  Example:
    >>> with CompileCounter() as cc:
    ...   _ = jax.jit(lambda x: x + 1)(1.0)
    >>> cc.count
    1
  """

  def __init__(self):
    self.count = 0
    self.seconds = 0.0
    self.names = []  # the compiled functions, e.g. "jit(run)"

  def _listen(self, event, duration_secs, **kwargs):
    if event == COMPILE_EVENT:
      self.count += 1
      self.seconds += float(duration_secs)
      self.names.append(kwargs.get("fun_name"))

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listen)
    return False


def run_timed(run: Callable, args: tuple, num_configs: int) -> tuple[Any, dict]:
  """Runs one compiled sweep program; returns (outputs, wall time and compile info).

  The info dict: ``configs``, ``wall_s``, ``compiles``, ``compile_s``,
  ``compiled`` (the names of the compiled functions).
  """
  start = time.perf_counter()
  with CompileCounter() as cc:
    out = jax.block_until_ready(run(*args))
  return out, dict(
      configs=num_configs,
      wall_s=round(time.perf_counter() - start, 3),
      compiles=cc.count,
      compile_s=round(cc.seconds, 3),
      compiled=cc.names,
  )


# ----------------------------------------------------------------------------
# An algorithm on simulated workers
# ----------------------------------------------------------------------------


def start_state(algorithm: Algorithm, worker_params: Params, center: Params):
  """The start of ``algorithm`` with worker i at ``worker_params[i]``.

  Each worker's state is ``algorithm.init`` of its own start (the workers may
  start apart, e.g. spread around the minimum of a quadratic); the shared
  state is ``algorithm.init(center)``'s (EASGD: the center x~ and the clock).

  Args:
    algorithm: an :class:`~easgd.core.algorithms.Algorithm`.
    worker_params: pytree with leading axis [p].
    center: pytree without it.

  Returns:
    ``(worker_state [p, ...], shared_state)``.
  """
  worker = jax.vmap(lambda params: algorithm.init(params)[0])(worker_params)
  return worker, algorithm.init(center)[1]


def simulated_step(algorithm: Algorithm, num_workers: int) -> Callable:
  """``step(worker [p], shared, batch [p], key) -> (worker, shared, losses [p])``:
  ``algorithm.step`` on ``num_workers`` simulated workers
  (``easgd.parallel.mapping.vmap_workers``), nestable under vmap, scan and jit."""
  return mapping.vmap_workers(
      algorithm.step, num_workers, mapping.STEP_IN_KINDS, mapping.STEP_OUT_KINDS
  )


def simulated_params(algorithm: Algorithm, num_workers: int) -> Callable:
  """``params(worker [p], shared) -> pytree [p, ...]``: every worker's iterate
  (``algorithm.worker_params``; the one model, repeated, for one-model methods)."""
  mapped = mapping.vmap_workers(
      lambda w, s: (algorithm.worker_params(w, s),), num_workers, ("worker", "shared"), ("worker",)
  )
  return lambda worker, shared: mapped(worker, shared)[0]


# ----------------------------------------------------------------------------
# The one-program sweep
# ----------------------------------------------------------------------------


class SweepState(NamedTuple):
  """Carry of one configuration's scan.

  Attributes:
    worker: the algorithm's worker state, leading axis [p].
    shared: its shared state (EASGD: the center x~ and the clock).
    diverged: bool scalar, set at the first bad step and never cleared (the
      state is frozen from then on).
    workers_diverged: bool scalar, the workers' test fired at that step.
    center_diverged: bool scalar, the center's parameters were non-finite at
      that step.
    diverged_step: int32 scalar, that step (-1 while not diverged).
    initial_loss: float32 scalar, mean worker loss at step 0.
    last_loss: float32 scalar, mean worker loss of the last good step.
  """

  worker: Any
  shared: Any
  diverged: jax.Array
  workers_diverged: jax.Array
  center_diverged: jax.Array
  diverged_step: jax.Array
  initial_loss: jax.Array
  last_loss: jax.Array


def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return functools.reduce(jnp.logical_and, leaves, jnp.bool_(True))


def _above(loss, reference, factor):
  """loss is non-finite or exceeds factor * |reference| (a tiny floor for 0)."""
  limit = factor * jnp.maximum(jnp.abs(reference), jnp.finfo(jnp.float32).tiny)
  return ~jnp.isfinite(loss) | (loss > limit)


def make_sweep_fn(
    build: Callable[..., Algorithm],
    num_workers: int,
    num_steps: int,
    eval_fn: Callable | None = None,
    *,
    per_config: Collection[str] = (),
) -> Callable:
  """Builds the one-program sweep of an algorithm: all configurations, all steps.

  For each configuration c with hyperparameters H_c, ``algorithm =
  build(**H_c)`` (H_c traced: 0-d arrays) starts from :func:`start_state` and
  takes, for t = 0, ..., num_steps - 1, ``algorithm.step`` on every worker
  with ``batches[t]`` and the run's ``key`` (the step derives the worker's
  key, ``easgd.core.algorithms.worker_key``). For EASGD with plain SGD:

      (x^i_{t+1}, x~_{t+1}) = eq. (5)-(6) with u^i_t = -eta g^i_t(x^i_t),
                              exchange on the steps where tau divides t

  With L_t = mean_i of the step's losses, x^i = ``algorithm.worker_params``,
  x~ = ``algorithm.center`` and F the ``center_loss`` of ``eval_fn``, a
  configuration is

      workers_diverged  if for some t: L_t not finite, L_t > c |L_0|, or
                        x^i_{t+1} not finite                  (per step)
      center_diverged   if for some t: x~_{t+1} not finite    (per step), or
                        F(x~_T) not finite or F(x~_T) > c |F(x~_0)|  (end)

  with c = ``divergence_factor``, T = num_steps and x~_0 the start of the
  center. A per-step test freezes the configuration at its state at the
  start of step t; the end test sees the (possibly frozen) final center (see
  docs/guides/stability.md).

  Args:
    build: ``build(**hyperparameters) -> Algorithm`` for ``num_workers``
      workers with the default axis name (``easgd.core.elastic.WORKER_AXES``),
      e.g. ``functools.partial(easgd.core.algorithms.easgd, loss_fn,
      num_workers=p)``; called inside the configurations' ``vmap`` with one
      configuration's values (0-d arrays).
    num_workers: p, an integer >= 1 (static: it sets shapes).
    num_steps: steps per configuration, an integer in [1, :data:`MAX_STEPS`]
      (static).
    eval_fn: optional ``eval_fn(center, eval_data) -> dict of float32
      scalars`` holding ``center_loss`` (used by the center's end test),
      evaluated on the start center and on each configuration's final
      center (inside the same program). Without it the center is tested for
      finiteness only.
    per_config: names of :data:`RUN_ARGUMENTS` that carry a leading
      configuration axis [n] (their own start, batches or key per
      configuration); the others are shared by every configuration.

  Returns:
    A jitted ``run(hyperparameters, worker_params, center, batches,
    eval_data, key, divergence_factor) -> dict`` where ``hyperparameters``
    maps ``build``'s argument names to [n] arrays (float32 rates, int32
    tau); ``worker_params`` a pytree with leading axis [p] (the workers'
    start); ``center`` a pytree (the center's start); ``batches`` a pytree
    with leading axes [num_steps, p]; ``eval_data`` any pytree for
    ``eval_fn``; ``key`` a PRNG key; ``divergence_factor`` a float32 scalar.
    The dict holds [n] arrays ``diverged``, ``workers_diverged``,
    ``center_diverged`` (bool), ``diverged_step`` (int32), ``initial_loss``,
    ``final_loss``, ``worker_center_distance``, ``initial_center_loss`` (NaN
    without ``eval_fn``), the ``eval_fn`` metrics, and ``center`` (the final
    centers, leading axis [n]). Compiled once per shape.

  Raises:
    SweepError: num_workers not an integer >= 1, num_steps not an integer in
      [1, :data:`MAX_STEPS`], an unknown
      ``per_config`` name; ``eval_fn`` without a ``center_loss`` (when the
      program is traced).

  References:
    Zhang, Choromanska, LeCun (2015), eq. (5)-(6).
  """
  num_workers = check_int("num_workers", num_workers, 1)
  num_steps = check_int("num_steps", num_steps, 1, MAX_STEPS, what="int32 step counter")
  unknown = set(per_config) - set(RUN_ARGUMENTS)
  if unknown:
    raise SweepError(
        f"per_config names unknown arguments {sorted(unknown)}; allowed: "
        f"{', '.join(RUN_ARGUMENTS)}"
    )
  one_config = _one_config_fn(
      build, num_workers, num_steps, None if eval_fn is None else _checked_eval(eval_fn)
  )
  configs = jax.vmap(
      one_config, in_axes=(0, *(0 if name in per_config else None for name in RUN_ARGUMENTS), None)
  )

  @jax.jit
  def run(
      hyperparameters: Mapping[str, jax.Array],
      worker_params,
      center,
      batches,
      eval_data,
      key,
      divergence_factor,
  ):
    return configs(
        dict(hyperparameters),
        worker_params,
        center,
        batches,
        eval_data,
        key,
        jnp.asarray(divergence_factor, jnp.float32),
    )

  return run


def _checked_eval(eval_fn: Callable) -> Callable:
  """``eval_fn`` whose metrics must hold ``center_loss``; else :class:`SweepError`."""

  def evaluate(center, eval_data):
    metrics = dict(eval_fn(center, eval_data))
    if "center_loss" not in metrics:
      raise SweepError(
          f"eval_fn must return 'center_loss' (the center's divergence "
          f"test), got {sorted(metrics)}"
      )
    return metrics

  return evaluate


def _one_config_fn(build, num_workers: int, num_steps: int, evaluate) -> Callable:
  """One configuration of :func:`make_sweep_fn`: ``one_config(hyper,
  worker_params, center0, batches, eval_data, key, factor) -> dict``, the scan
  over the steps and the end of the run (``evaluate`` as :func:`_checked_eval`
  makes it, or None)."""

  def one_config(hyper, worker_params, center0, batches, eval_data, key, factor):
    algorithm = build(**hyper)
    params_of = simulated_params(algorithm, num_workers)
    worker, shared = start_state(algorithm, worker_params, center0)
    initial_center_loss = (
        jnp.float32(jnp.nan)
        if evaluate is None
        else jnp.asarray(evaluate(algorithm.center(shared), eval_data)["center_loss"], jnp.float32)
    )
    body = _sweep_body(algorithm, simulated_step(algorithm, num_workers), params_of, key, factor)
    false = jnp.bool_(False)
    init = SweepState(
        worker,
        shared,
        false,
        false,
        false,
        jnp.int32(-1),
        jnp.float32(jnp.nan),
        jnp.float32(jnp.nan),
    )
    state, _ = lax.scan(body, init, (jnp.arange(num_steps, dtype=jnp.int32), batches))
    return _end_of_sweep(
        algorithm, params_of, state, initial_center_loss, evaluate, eval_data, factor, num_steps
    )

  return one_config


def _sweep_body(algorithm: Algorithm, step: Callable, params_of: Callable, key, factor) -> Callable:
  """The scan body of one configuration: ``body(state, (t, batch)) -> (state,
  None)``, the step and the per-step divergence tests (:class:`SweepState`;
  a diverged configuration's state is frozen)."""

  def body(state, xs):
    t, batch = xs
    worker, shared, losses = step(state.worker, state.shared, batch, key)
    loss = jnp.mean(losses.astype(jnp.float32))
    initial = jnp.where(t == 0, loss, state.initial_loss)
    workers_bad = _above(loss, initial, factor) | ~_all_finite(params_of(worker, shared))
    center_bad = ~_all_finite(algorithm.center(shared))
    first = (workers_bad | center_bad) & ~state.diverged
    diverged = state.diverged | first
    new = SweepState(
        worker=tree_where(diverged, state.worker, worker),
        shared=tree_where(diverged, state.shared, shared),
        diverged=diverged,
        workers_diverged=state.workers_diverged | (first & workers_bad),
        center_diverged=state.center_diverged | (first & center_bad),
        diverged_step=jnp.where(first, t, state.diverged_step),
        initial_loss=initial,
        last_loss=jnp.where(diverged, state.last_loss, loss),
    )
    return new, None

  return body


def _end_of_sweep(
    algorithm: Algorithm,
    params_of: Callable,
    state: SweepState,
    initial_center_loss,
    evaluate,
    eval_data,
    factor,
    num_steps: int,
) -> dict:
  """One configuration's outputs of :func:`make_sweep_fn` from its final scan
  state: the distances, the ``evaluate`` metrics and the center's end test."""
  center = algorithm.center(state.shared)
  dist = jax.vmap(elastic.tree_l2_distance, in_axes=(0, None))(
      params_of(state.worker, state.shared), center
  )
  out = dict(
      worker_center_distance=jnp.mean(dist),
      center=center,
      initial_loss=state.initial_loss,
      final_loss=state.last_loss,
      initial_center_loss=initial_center_loss,
  )
  center_end_bad = jnp.bool_(False)
  if evaluate is not None:
    metrics = evaluate(center, eval_data)
    out.update(metrics)
    center_end_bad = _above(
        jnp.asarray(metrics["center_loss"], jnp.float32), initial_center_loss, factor
    )
  out.update(
      diverged=state.diverged | center_end_bad,
      workers_diverged=state.workers_diverged,
      center_diverged=state.center_diverged | center_end_bad,
      diverged_step=jnp.where(
          state.diverged,
          state.diverged_step,
          jnp.where(center_end_bad, jnp.int32(num_steps), jnp.int32(-1)),
      ),
  )
  return out


def run_with_algorithm(
    algorithm: Algorithm,
    params0: Params,
    batches,
    key,
    *,
    num_workers: int,
    eval_fn: Callable | None = None,
    eval_data=None,
) -> dict[str, Any]:
  """Runs ONE configuration of ``algorithm`` as its own program (no divergence test).

  ``algorithm`` is built with Python hyperparameters (e.g.
  ``easgd.core.algorithms.easgd(loss_fn, optax.sgd(0.1), num_workers=4, tau=4,
  alpha=0.1)``), so every configuration compiles its own program; its step
  runs on the simulated workers (:func:`simulated_step`) from the common start
  ``params0``, scanned over ``batches``. This is what one would run without
  the sweep: tests compare the sweep against it and
  ``benchmarks/sweep_vs_sequential.py`` times it.

  Args:
    algorithm: the configuration's algorithm (default axis name).
    params0: common start of workers and center (no worker axis).
    batches: pytree with leading axes [num_steps, p].
    key: the run's base key.
    num_workers: p, as the algorithm was built with.
    eval_fn, eval_data: optional final evaluation of the center.

  Returns:
    dict(worker_params [p, ...], center, losses float32 [num_steps, p], and
    the ``eval_fn`` metrics), device arrays, after ``block_until_ready``.
  """
  step = simulated_step(algorithm, num_workers)
  params_of = simulated_params(algorithm, num_workers)

  @jax.jit
  def run(params0, batches, key, eval_data):
    worker_params = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_workers, *a.shape)), params0)
    worker, shared = start_state(algorithm, worker_params, params0)

    def body(carry, batch):
      w, s, loss = step(*carry, batch, key)
      return (w, s), loss

    (worker, shared), losses = lax.scan(body, (worker, shared), batches)
    out = dict(
        worker_params=params_of(worker, shared), center=algorithm.center(shared), losses=losses
    )
    if eval_fn is not None:
      out.update(eval_fn(algorithm.center(shared), eval_data))
    return out

  return jax.block_until_ready(run(params0, batches, key, eval_data))
