"""The precision policy: bfloat16 parameters, float32 centers and cross-worker sums.

Every algorithm of the table is built for bfloat16 parameters and its compiled
programs traced (pmap backend, 4 workers on 2 devices): every all-reduce
(``psum``, which ``pmean`` is built on) of a float value must be float32, and
every center (the evaluated model of the elastic, averaging and push methods,
and the running averages) must be float32, while the workers' parameters keep
bfloat16.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd.core import algorithms, elastic
from easgd.methods import registry
from easgd.parallel import mapping, placement, worker_layout
from easgd.run import trainer
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import models

from linear_problem import loss_fn, make_data, params0


def reductions(jaxpr, out=None):
  """(primitive, input dtypes, axes) of every cross-device reduction, recursively."""
  out = [] if out is None else out
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("psum", "all_gather", "psum_scatter", "reduce_scatter"):
      out.append((eqn.primitive.name, tuple(str(v.aval.dtype) for v in eqn.invars)))
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          reductions(sub.jaxpr, out)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          reductions(sub, out)
  return out


def bf16(tree):
  return jax.tree.map(lambda x: jnp.asarray(x).astype(jnp.bfloat16), tree)


@pytest.mark.parametrize("name", registry.ALGORITHMS)
def test_every_reduction_across_workers_and_every_center_is_float32(name):
  cfg, _ = TrainConfig(num_workers=4, tau=2).for_algorithm(name)
  algo = registry.make_algorithm(cfg.validate(), loss_fn, optax.sgd(0.1), 8)
  layout = worker_layout.make_layout(4, 2)
  worker, shared = algo.init(bf16(params0()))
  center = algo.center(shared)
  # the one-model methods evaluate their model itself; every other center is float32
  one_model = name in ("pmean_sgd", "sgd", "msgd")
  assert {str(x.dtype) for x in jax.tree.leaves(center)} == {
      "bfloat16" if one_model else "float32"
  }, name
  assert {str(x.dtype) for x in jax.tree.leaves(algo.worker_params(worker, shared))} == {"bfloat16"}
  worker = placement.replicate_per_worker(worker, layout)
  shared = placement.replicate_per_device(shared, layout)
  x, y = make_data(1, 4, n=5)
  batch = placement.split_workers((x[0], y[0]), layout)
  found = []
  for program in mapping.map_step(algo, layout, donate_state=False).programs.values():
    found += reductions(jax.make_jaxpr(program)(worker, shared, batch, jax.random.key(0)).jaxpr)
  assert found, f"{name}: no reduction across workers traced"
  floats = [dtypes for _, dtypes in found if any("float" in d for d in dtypes)]
  assert floats and all(set(d) <= {"float32", "int32", "bool"} for d in floats), (name, found)


def test_a_bfloat16_run_keeps_the_center_close_to_a_float64_run():
  """500 exchanges of EASGD (p = 4, tau = 1) on the linear problem: the center of
  a bfloat16 run against the float64 run of the same rule. With the center and
  the elastic sum in float32 the gap is the workers' own bfloat16 rounding."""
  xs, ys = make_data(500, 4)
  layout = worker_layout.make_layout(4, 1)

  def run(params, dtype):
    algo = algorithms.easgd(loss_fn, optax.sgd(0.05), num_workers=4, tau=1, beta=0.9)
    step = mapping.map_step(algo, layout)
    w, s = placement.place_state(algo, params, layout)
    for t in range(len(xs)):
      batch = placement.split_workers((xs[t].astype(dtype), ys[t].astype(dtype)), layout)
      w, s, _ = step(w, s, batch, jax.random.key(0), t)
    return placement.first_copy(algo.center(s))

  low = run(bf16(params0()), np.float32)
  with jax.enable_x64(True):
    ref = run(jax.tree.map(lambda v: jnp.asarray(v, jnp.float64), params0()), np.float64)
  assert {str(v.dtype) for v in jax.tree.leaves(low)} == {"float32"}
  gap = max(
      float(np.max(np.abs(np.asarray(a, np.float64) - b)))
      for a, b in zip(jax.tree.leaves(low), jax.tree.leaves(ref))
  )
  assert gap < 2e-2, gap  # bfloat16 workers: eps 2**-8 = 3.9e-3 per rounding


def test_the_precision_policy_is_a_config_setting_and_reaches_the_model():
  cfg = TrainConfig(param_dtype="bfloat16", compute_dtype="bfloat16").validate()
  model = models.make_model(
      cfg.model, 10, param_dtype=cfg.param_dtype, compute_dtype=cfg.compute_dtype
  )
  params = models.init_params(model, (40, 1), jax.random.key(0))
  assert {str(x.dtype) for x in jax.tree.leaves(params)} == {"bfloat16"}
  with pytest.raises(
      ConfigError, match="unknown param_dtype 'float8'; allowed: float32, " "bfloat16"
  ):
    TrainConfig(param_dtype="float8").validate()


def test_a_bfloat16_training_run_has_a_float32_center(tmp_path):
  cfg = TrainConfig(
      dataset="digits",
      model="mlp",
      num_workers=2,
      global_batch_size=64,
      num_epochs=1,
      eval_batch_size=64,
      progress=False,
      param_dtype="bfloat16",
      compute_dtype="bfloat16",
  )
  summary = trainer.train_and_evaluate(cfg, tmp_path)
  assert summary["final"]["test_accuracy"] > 0.5
  # the communication counts the float32 bytes every exchange moves: twice the parameters'
  assert summary["communication"]["bytes"] == summary["communication"]["all_reduces"] * 2 * (
      summary["param_bytes"]
  )
  from easgd.run import checkpoint

  ckpt = checkpoint.Checkpointer(tmp_path)
  try:
    state = ckpt.restore(ckpt.latest_step())
  finally:
    ckpt.close()
  assert {str(x.dtype) for x in jax.tree.leaves(state["center"])} == {"float32"}
  assert {str(x.dtype) for x in jax.tree.leaves(state["worker"]["params"])} == {"bfloat16"}
  assert elastic.reduction_dtype(jnp.bfloat16) == jnp.float32


def test_a_non_finite_bfloat16_parameter_is_caught_before_it_is_saved():
  from easgd.runtimes import spmd, training_run
  from easgd.runtimes.divergence import DivergenceError

  config = TrainConfig(dataset="digits", model="mlp", param_dtype="bfloat16", num_epochs=1)
  run = training_run.Run(config)
  worker, shared = run.initial_state()
  state = spmd.to_checkpoint(run, worker, shared, 0, [])
  run.check_finite([], 0, state)  # finite: passes
  bad = dict(state)
  leaves, treedef = jax.tree_util.tree_flatten(bad["worker"])
  i = next(k for k, a in enumerate(leaves) if a.dtype == jnp.bfloat16)
  leaves[i] = np.array(leaves[i])
  leaves[i].reshape(-1)[0] = np.nan  # worker 0
  bad["worker"] = jax.tree_util.tree_unflatten(treedef, leaves)
  with pytest.raises(DivergenceError, match="worker 0 has non-finite parameters"):
    run.check_finite([], 0, bad)
