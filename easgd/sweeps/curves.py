"""Learning curves of many configurations from ONE compiled step program.

The sweep engine (``easgd.sweeps.engine``) with what a comparison protocol needs
besides: evaluations of the center along the way (a learning curve, not only
the end), each configuration's own data order gathered inside the program,
and an evaluation of every worker at the end. The configurations run the
algorithm's own ``Algorithm.step`` on the simulated workers
(``easgd.parallel.mapping.vmap_workers``), built inside a vmap from one
configuration's traced hyperparameters, as ``make_sweep_fn`` does:

    step program = jit( vmap over k configurations (
                     algorithm = build(**hyperparameters)     <- traced values
                     batch = batch_fn(data, config_data, t)   <- its own order
                     algorithm.step over the simulated workers ))
    for t in 0 .. T - 1:                                   <- on the host
      for each chunk of k configurations: state = step program(state, t)
      if t + 1 is an evaluation step: eval program on every chunk

One step program, one evaluation program (and one for the end) are compiled
for the whole grid, whatever n is; the host walks the steps and the chunks of
k configurations (``configs_per_batch``; None: all n in one chunk).

Why the host loop and chunks, not a ``lax.scan`` over steps as
``make_sweep_fn``: on XLA:CPU a convolution inside a loop or ``lax.cond`` body
runs about 5x slower than at the top level of a program (measured with the
MNIST-1D CNN, 4 workers x 32 examples: 16 ms per step in a ``lax.scan``,
2.9 ms per step called from the host; an MLP is unaffected), and a vmap over
many configurations of a small CNN costs up to 2x more per configuration than
over a few (their working set leaves the caches). Chunks of about 4
configurations called from the host avoid both; the values are the same for
any k (the configurations are independent). For the same reason an
algorithm with phases (a synchronous warm-up, ``easgd.core.warmup``) runs
each declared phase as its own step program, the one
``Algorithm.programs(exchange_on_host=False)`` names for clock t chosen on the
host (t < K: the warm-up; t >= K: the algorithm), not a branch.

Unlike ``make_sweep_fn`` no configuration is frozen when it diverges: its
values become non-finite and stay within that configuration, and the caller
reads divergence from the curves.

References:
  S. Zhang, A. Choromanska, Y. LeCun. Deep learning with Elastic Averaging SGD.
  NeurIPS 2015 (arXiv:1412.6651), Section 5 (the center is what is evaluated).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from easgd._util import checks
from easgd._util.files import check_interrupt
from easgd.core.base import WARMUP, Algorithm, select_program
from easgd.parallel import mapping
from easgd.sweeps.engine import SweepError, simulated_params, start_state


def check_eval_steps(eval_steps: Sequence[int], num_steps: int) -> np.ndarray:
  """The evaluation steps as a sorted int array starting at 0 and ending at num_steps.

  Raises:
    SweepError: a step outside [0, num_steps], a repeated step, or 0 or
      num_steps missing.
  """
  steps = checks.integer_array("eval_steps", list(eval_steps), 0, num_steps, error=SweepError)
  if steps.ndim != 1 or len(set(steps.tolist())) != len(steps):
    raise SweepError(f"eval_steps must be distinct steps, got {list(eval_steps)}")
  steps = np.sort(steps)
  if steps[0] != 0 or steps[-1] != num_steps:
    raise SweepError(
        f"eval_steps must include 0 and num_steps={num_steps}, got " f"{steps.tolist()}"
    )
  return steps


def _pad(tree, n: int, size: int):
  """Host arrays with leading axis n padded to size by repeating the last entry."""
  return jax.tree.map(
      lambda a: np.concatenate([a, np.repeat(a[-1:], size - n, axis=0)]) if size > n else a, tree
  )


def make_curve_fn(
    build: Callable[..., Algorithm],
    num_workers: int,
    num_steps: int,
    eval_steps: Sequence[int],
    *,
    batch_fn: Callable,
    eval_fn: Callable,
    eval_chunks: int = 1,
    final_fn: Callable | None = None,
    configs_per_batch: int | None = None,
    warmup_steps: int = 0,
    return_center: bool = False,
) -> Callable:
  """Builds the one-program learning curves of many configurations of an algorithm.

  For configuration c with hyperparameters H_c (traced 0-d arrays), start
  params x_0 (workers and center equal) and key k_c:

      algorithm = build(**H_c);  state = algorithm.init(x_0) on every worker
      for t = 0 .. T - 1:
        state, losses_t = algorithm.step(state, batch_fn(data, cfg_c, t), k_c)
        if t + 1 in eval_steps:
          curves[t + 1] = sum over j < eval_chunks of eval_fn(center, data, cfg_c, j)

  and ``curves[0]`` is the evaluation of the start.

  Args:
    build: ``build(**hyperparameters) -> Algorithm`` for ``num_workers``
      workers (default axis name), called inside the vmap with one
      configuration's values.
    num_workers: p, an integer >= 1 (static: shapes).
    num_steps: T, steps per configuration, an integer >= 1.
    eval_steps: the steps after which the center is evaluated; must hold 0
      (the start) and T (:func:`check_eval_steps`).
    batch_fn: ``batch_fn(data, config_data, t) -> batch`` with leading axis [p]
      (each worker's mini-batch of step t; ``t`` an int32 scalar), e.g. a
      gather of the configuration's indices from the shared data.
    eval_fn: ``eval_fn(center, data, config_data, j) -> dict of float32
      scalars``, ADDITIVE over the evaluation chunks j = 0 .. eval_chunks - 1
      (e.g. the summed loss and the number of correct predictions of chunk j
      of the validation examples): the curves hold the sums over j.
    eval_chunks: how many chunks an evaluation has (each a call of the
      evaluation program, so no loop holds the forward pass).
    final_fn: optional ``final_fn(worker_params [p, ...], center, data,
      config_data, j) -> dict of arrays``, additive over j likewise, once
      after the last step (e.g. every worker's test errors).
    configs_per_batch: k, configurations per call of the step program; None:
      all n at once.
    warmup_steps: K of the algorithm's synchronous warm-up (``easgd.core.warmup``;
      ``build`` must then return an algorithm wrapped with that K), checked
      against the programs the algorithm declares
      (``Algorithm.programs(exchange_on_host=False)``, of which step t runs the
      one ``program_at(t)`` names): steps t < K run its warm-up program. 0: none.
    return_center: also return the final centers (leading axis [n]).

  Returns:
    ``run(hyperparameters, params0, key, config_data, data) -> dict`` of host
    arrays: ``hyperparameters`` maps ``build``'s argument names to [n] arrays;
    ``params0`` a pytree with leading axis [n] (each configuration's start);
    ``key`` [n] PRNG keys; ``config_data`` any pytree with leading axis [n];
    ``data`` any pytree shared by all. The dict holds ``curves`` (each
    ``eval_fn`` quantity as [n, E], E = len(eval_steps)), ``train_loss``
    [n, E] (the mean worker mini-batch loss over the steps since the
    previous evaluation; NaN at step 0), ``final`` (the ``final_fn``
    quantities, [n, ...]) and, with ``return_center``, ``center``. Its
    ``programs`` attribute holds the jitted step, evaluation and final
    programs (one compilation each per shape).

  Raises:
    SweepError: num_workers, num_steps, eval_chunks or configs_per_batch not
      integers >= 1; warmup_steps not in [0, num_steps); bad eval_steps;
      (from ``run``) the algorithm's warm-up program does not run exactly at
      the steps t < warmup_steps.
  """
  p = checks.integer("num_workers", num_workers, 1, error=SweepError)
  T = checks.integer("num_steps", num_steps, 1, error=SweepError)
  steps = check_eval_steps(eval_steps, T)
  chunks = checks.integer("eval_chunks", eval_chunks, 1, error=SweepError)
  k_warm = checks.integer("warmup_steps", warmup_steps, 0, T - 1, error=SweepError)
  if configs_per_batch is not None:
    configs_per_batch = checks.integer("configs_per_batch", configs_per_batch, 1, error=SweepError)
  programs = _CurvePrograms(build, p, batch_fn, eval_fn, final_fn)

  def run(hyperparameters: Mapping[str, Any], params0, key, config_data, data):
    names = _program_names(build, hyperparameters, T, k_warm)
    parts, n, k = _chunks(hyperparameters, params0, key, config_data, configs_per_batch)
    programs.key_impl = jax.random.key_impl(key)
    return _run_chunks(
        programs,
        parts,
        jax.tree.map(jnp.asarray, data),
        names,
        set(steps.tolist()),
        chunks,
        n,
        k,
        final=final_fn is not None,
        center=return_center,
    )

  run.programs = dict(
      init=programs.init, step=programs.step, eval=programs.eval, final=programs.final
  )
  return run


class _CurvePrograms:
  """The jitted programs of :func:`make_curve_fn`, each vmapped over a chunk of
  configurations (one compilation each per shape); ``key_impl`` is the PRNG
  implementation of the keys the run was given (set before the step runs)."""

  def __init__(self, build, p, batch_fn, eval_fn, final_fn):
    def init_one(hyper, params0):
      algorithm = build(**hyper)
      worker0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (p, *a.shape)), params0)
      worker, shared = start_state(algorithm, worker0, params0)
      return worker, shared, jnp.float32(0)

    def step_one(hyper, state, key_data, config_data, data, t, name):
      key = jax.random.wrap_key_data(key_data, impl=self.key_impl)
      program = build(**hyper).programs(exchange_on_host=False)[name]
      mapped = mapping.vmap_workers(program.step, p, mapping.STEP_IN_KINDS, mapping.STEP_OUT_KINDS)
      worker, shared, total = state
      worker, shared, losses = mapped(worker, shared, batch_fn(data, config_data, t), key)
      return worker, shared, total + jnp.mean(losses.astype(jnp.float32))

    def eval_one(hyper, state, config_data, data, j):
      algorithm = build(**hyper)
      return {
          name: jnp.asarray(v, jnp.float32)
          for name, v in eval_fn(algorithm.center(state[1]), data, config_data, j).items()
      }

    def final_one(hyper, state, config_data, data, j):
      algorithm = build(**hyper)
      worker, shared, _ = state
      return final_fn(
          simulated_params(algorithm, p)(worker, shared),
          algorithm.center(shared),
          data,
          config_data,
          j,
      )

    def center_one(hyper, state):
      return build(**hyper).center(state[1])

    per = (0, 0, 0, 0, None, None)
    self.key_impl = None
    self.init = jax.jit(jax.vmap(init_one))
    self.step = jax.jit(
        jax.vmap(step_one, in_axes=per + (None,)), static_argnums=6, donate_argnums=1
    )
    self.eval = jax.jit(jax.vmap(eval_one, in_axes=(0, 0, 0, None, None)))
    self.final = jax.jit(jax.vmap(final_one, in_axes=(0, 0, 0, None, None)))
    self.center = jax.jit(jax.vmap(center_one))


def _program_names(build, hyperparameters, num_steps: int, warmup_steps: int) -> list:
  """The name of the program each step t < num_steps runs, read from the table
  ``build`` declares (``Algorithm.programs(exchange_on_host=False)``) for one
  configuration's values, traced abstractly (nothing runs or compiles).

  Raises:
    SweepError: the steps that run the warm-up program are not t < warmup_steps.
  """
  table = {}

  def declare(hyper):
    table.update(build(**hyper).programs(exchange_on_host=False))
    return ()

  one = {
      name: jax.ShapeDtypeStruct(np.shape(v)[1:], np.asarray(v).dtype)
      for name, v in dict(hyperparameters).items()
  }
  jax.eval_shape(declare, one)
  names = [select_program(table, t) for t in range(num_steps)]
  if [name == WARMUP for name in names] != [t < warmup_steps for t in range(num_steps)]:
    raise SweepError(
        f"warmup_steps={warmup_steps} but build() returned an algorithm "
        f"without that synchronous warm-up"
    )
  return names


def _chunks(hyperparameters, params0, key, config_data, configs_per_batch):
  """The configurations on the device in chunks of k (the last padded):
  ``(parts, n, k)``, each part ``(hyper, params0, key_data, config_data)``."""
  host = jax.tree.map(
      np.asarray, (dict(hyperparameters), params0, jax.random.key_data(key), config_data)
  )
  n = int(np.shape(jax.tree.leaves(host[0])[0])[0])
  k = n if configs_per_batch is None else min(configs_per_batch, n)
  size = -(-n // k) * k
  host = _pad(host, n, size)
  parts = [jax.device_put(jax.tree.map(lambda a: a[i : i + k], host)) for i in range(0, size, k)]
  return parts, n, k


def _evaluate(program, chunks: int, hyper, state, config_data, data):
  """The sums over the evaluation chunks of ``program``, on the host (float64)."""
  total = None
  for j in range(chunks):
    part = jax.tree.map(
        lambda a: np.asarray(a, np.float64), program(hyper, state, config_data, data, np.int32(j))
    )
    total = part if total is None else jax.tree.map(np.add, total, part)
  return total


def _run_chunks(
    programs, parts, data, names, evaluated, chunks, n, k, *, final: bool, center: bool
) -> dict:
  """The host loop of :func:`make_curve_fn`: every step of every chunk, the
  evaluations after the steps in ``evaluated``; the outputs of its ``run``."""
  evaluate = lambda program, h, s, c: _evaluate(program, chunks, h, s, c, data)
  states = [programs.init(h, x0) for h, x0, _, _ in parts]
  records = [[evaluate(programs.eval, h, s, c)] for (h, _, _, c), s in zip(parts, states)]
  losses = [[np.full((k,), np.nan, np.float32)] for _ in parts]
  since = 0
  for t, name in enumerate(names):
    check_interrupt()  # a signal whose exception was swallowed stops here
    tt = np.int32(t)
    for i, (h, _, key_i, c) in enumerate(parts):
      states[i] = programs.step(h, states[i], key_i, c, data, tt, name)
    since += 1
    if t + 1 in evaluated:
      for i, (h, _, _, c) in enumerate(parts):
        records[i].append(evaluate(programs.eval, h, states[i], c))
        worker, shared, total = states[i]
        losses[i].append(np.asarray(total) / since)  # waits for this chunk
        states[i] = (worker, shared, jax.device_put(np.zeros((k,), np.float32)))
      since = 0
  cat = lambda xs: np.concatenate([np.asarray(x) for x in xs])[:n]
  out = dict(
      curves={
          name: cat([np.stack([np.asarray(r[name]) for r in rec], axis=1) for rec in records])
          for name in records[0][0]
      },
      train_loss=cat([np.stack(l, axis=1) for l in losses]),
  )
  if final:
    finals = [evaluate(programs.final, h, s, c) for (h, _, _, c), s in zip(parts, states)]
    out["final"] = jax.tree.map(lambda *xs: cat(xs), *finals)
  if center:
    centers = [programs.center(h, s) for (h, _, _, _), s in zip(parts, states)]
    out["center"] = jax.tree.map(lambda *xs: cat(xs), *centers)
  return out
