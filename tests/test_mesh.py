"""A worker of several devices: data parallel inside it, the algorithm across workers.

``devices_per_worker`` D > 1 puts each worker on a row of D devices of a
("devices", "data") mesh: its mini-batch of B examples is split B / D per
device, and ``data_parallel.data_parallel_loss`` averages the D gradients (and
losses) over "data" before the algorithm's own rule reads them. So a worker
of D devices must take the step it takes on one device with the same B
examples. On the 8 fake CPU devices, layouts workers x data = 4x2, 2x4 and
1x8 (8x1 is D = 1: the programs of one device per worker, checked bitwise
below), every synchronous algorithm of the issue (easgd, eamsgd, local_sgd,
diloco, pmean_sgd), 6 steps with tau = 2 (exchanges at t = 0, 2, 4; local
SGD and DiLoCo also average at the last step).

Tolerance: 1e-6 absolute on the parameters and the center, 1e-5 on the
per-step losses (float32: the D partial gradients are summed in another
order than the one batch's). Measured worst difference over the 15
algorithm x layout cases: 1.8e-7 on the parameters (eamsgd and diloco at
4x2), 2.4e-7 on the losses; the runs moved the center by 0.11 or more. Without
the averaging (the raw loss on the 2-D mesh: each device steps on its own
B / D examples) the parameters differ by 0.2 (easgd, 4x2), which the
control test checks (> 1e-2).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd.core import elastic
from easgd.core.base import Communication, select_program
from easgd.methods import registry
from easgd.parallel import accounting, data_parallel, mapping, placement, worker_layout
from easgd.runtimes.spmd import SpmdExecutor
from easgd.runtimes.training_run import Run
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import models

from testutil import all_reduce_ops, collective_dtypes, max_abs_diff, mlp_setup, random_batches

SYNCHRONOUS = ("easgd", "eamsgd", "local_sgd", "diloco", "pmean_sgd")
STEPS, B = 6, 8  # steps; per-worker batch (examples), split B / D per device
TOL = 1e-6


def config_of(algorithm, p, D):
  tau = {} if algorithm == "pmean_sgd" else dict(tau=2)
  return TrainConfig(
      algorithm=algorithm,
      num_workers=p,
      global_batch_size=B * p,
      mapping_backend="shard_map",
      devices_per_worker=D,
      **tau,
  ).validate()


def run_steps(algorithm, p, D, xs, ys, wrap=True):
  """The workers' parameters, the center and the losses after len(xs) steps."""
  params, loss_fn = mlp_setup()
  layout = worker_layout.make_layout(p, backend="shard_map", devices_per_worker=D)
  loss = data_parallel.data_parallel_loss(loss_fn, layout) if wrap else loss_fn
  algo = registry.make_algorithm(config_of(algorithm, p, D), loss, optax.sgd(0.3), len(xs))
  step = mapping.map_step(algo, layout)
  worker, shared = placement.place_state(algo, params, layout)
  key, losses = jax.random.key(3), []
  for t, (x, y) in enumerate(zip(xs, ys)):
    batch = placement.split_workers((x, y), layout, kind="batch")
    worker, shared, l = step(worker, shared, batch, key, t)
    losses.append(placement.merge_workers(l))
  out = (
      placement.merge_workers(algo.worker_params(worker, shared)),
      placement.first_copy(algo.center(shared)),
  )
  return out, np.stack(losses), params


@pytest.mark.parametrize("D", [2, 4, 8])  # layouts 4x2, 2x4, 1x8
@pytest.mark.parametrize("algorithm", SYNCHRONOUS)
def test_a_worker_of_D_devices_takes_the_step_of_one_device(algorithm, D):
  p = 8 // D
  xs, ys = random_batches(STEPS, p, B)
  many, many_loss, params = run_steps(algorithm, p, D, xs, ys)
  one, one_loss, _ = run_steps(algorithm, p, 1, xs, ys)  # the same examples, D = 1
  assert max_abs_diff(many, one) < TOL
  np.testing.assert_allclose(many_loss, one_loss, rtol=0, atol=1e-5)
  # the runs moved the parameters (the comparison is not vacuous)
  assert max_abs_diff(one[1], params) > 1e-2


@pytest.mark.parametrize("p, D", [(8, 1), (4, 2), (2, 4), (1, 8)])
@pytest.mark.parametrize("algorithm", SYNCHRONOUS)
def test_the_compiled_programs_communicate_by_level_what_the_accounting_counts(algorithm, p, D):
  """The all-reduces of the compiled step programs, by level, summed over the
  6 steps (tau = 2): each op's ``replica_groups`` names its level. On the
  [p, D] mesh of devices 0..7 (logical ids = device ids, checked), the rows
  {i D, ..., i D + D - 1} are the workers (groups of D: the "data" axis,
  within a worker) and the columns {k, k + D, ...} one device per worker
  (groups of p: across workers); no op has other groups. Measured, for every
  algorithm and layout here (param_bytes 588, the MLP 5 -> 16 -> 3): within
  a worker one all-reduce per step of 592 bytes (the gradient and the float32
  loss, XLA's one variadic op), across workers the algorithm's own count
  (easgd: 3 x 588 bytes at t = 0, 2, 4; pmean_sgd: 6 x 588); at 8x1 no
  "data" op, at 1x8 no op across workers. These equal
  ``accounting.communication_by_level`` exactly."""
  params, loss_fn = mlp_setup()
  layout = worker_layout.make_layout(p, backend="shard_map", devices_per_worker=D)
  assert [d.id for d in layout.mesh.devices.flat] == list(range(8))
  ids = np.arange(8).reshape(p, D)
  level_of = {
      tuple(sorted(tuple(map(int, r)) for r in ids)): "within_workers",
      tuple(sorted(tuple(map(int, c)) for c in ids.T)): "across_workers",
  }
  loss = data_parallel.data_parallel_loss(loss_fn, layout)
  algo = registry.make_algorithm(config_of(algorithm, p, D), loss, optax.sgd(0.3), STEPS)
  worker, shared = placement.place_state(algo, params, layout)
  xs, ys = random_batches(1, p, B)
  batch = placement.split_workers((xs[0], ys[0]), layout, kind="batch")
  programs = mapping.map_step(algo, layout, donate_state=False).programs
  per_call = {}
  for name, f in programs.items():
    ops = all_reduce_ops(f.lower(worker, shared, batch, jax.random.key(0)).compile().as_text())
    per_call[name] = {level: [0, 0] for level in accounting.LEVELS}
    for groups, nbytes in ops:
      assert groups in level_of, f"an all-reduce over {groups} is of neither level"
      per_call[name][level_of[groups]][0] += 1
      per_call[name][level_of[groups]][1] += nbytes
  table = algo.programs()
  measured = {level: [0, 0] for level in accounting.LEVELS}
  for t in range(STEPS):
    for level, (count, nbytes) in per_call[select_program(table, t)].items():
      measured[level][0] += count
      measured[level][1] += nbytes
  param_bytes = models.param_bytes(params)
  levels = accounting.communication_by_level(algo, STEPS, param_bytes, D)
  assert {k: Communication(*v) for k, v in measured.items()} == levels._asdict()
  assert levels.within_workers == (
      Communication(STEPS, STEPS * (param_bytes + 4)) if D > 1 else Communication(0, 0)
  )
  assert (levels.across_workers.all_reduces > 0) == (p > 1)
  # a synchronous program sends what the method counts
  assert algo.program_communication is None
  assert accounting.communication_by_level(algo, STEPS, param_bytes, D, program=True) == levels


ASYNC_CASES = [
    (name, p, d, dtype)
    for name in registry.ASYNC_ALGORITHMS
    for p, d, dtype in [(4, 4, "float32"), (4, 2, "float32")]
] + [  # bfloat16 parameters, messages gathered in float32; one worker: no collective
    ("async_easgd", 4, 2, "bfloat16"),
    ("downpour", 4, 2, "bfloat16"),
    ("async_easgd", 1, 1, "float32"),
]


@pytest.mark.parametrize("algorithm, p, num_devices, dtype", ASYNC_CASES)
def test_a_simulated_asynchronous_program_sends_every_message_every_slot(
    algorithm, p, num_devices, dtype
):
  """The one program of a simulated asynchronous method (one per slot, p
  workers on ``num_devices`` devices, tau = 2), read from its compiled HLO:
  two all-reduces per slot, the messages gathered into a zero-padded
  [p, ...] buffer (XLA's one variadic op over the leaves, p x 588 = 2352
  bytes in float32, for bfloat16 parameters too) and the [p] int32 due flags
  (p x 4 = 16 bytes), whether or not any worker is due; with vmapped workers
  the same bytes per device. Over 6 slots that is
  ``Algorithm.wire_communication``: (12, 6 x 4 x 592 = 14208), not the
  method's count of exchanges (``communication``: one per tau local steps
  per worker, which compares methods); p = 1 has no collective."""
  params, loss_fn = mlp_setup()
  params = jax.tree.map(lambda x: x.astype(dtype), params)
  layout = worker_layout.make_layout(p, num_devices, backend="shard_map")
  algo = registry.make_algorithm(config_of(algorithm, p, 1), loss_fn, optax.sgd(0.3), STEPS)
  worker, shared = placement.place_state(algo, params, layout)
  xs, ys = random_batches(1, p, B)
  batch = placement.split_workers((xs[0], ys[0]), layout, kind="batch")
  (program,) = mapping.map_step(algo, layout, donate_state=False).programs.values()
  hlo = program.lower(worker, shared, batch, jax.random.key(0)).compile().as_text()
  ops = all_reduce_ops(hlo)
  devices = tuple(d.id for d in layout.devices)
  assert all(groups in ((), (devices,)) for groups, _ in ops), ops
  P = elastic.reduced_bytes(params)
  assert P == 588
  want = sorted([p * P, p * 4]) if p > 1 else []
  assert sorted(nbytes for _, nbytes in ops) == want
  measured = Communication(STEPS * len(ops), STEPS * sum(nbytes for _, nbytes in ops))
  assert algo.wire_communication(STEPS, P) == measured
  assert measured == (Communication(12, 6 * 4 * 592) if p > 1 else Communication(0, 0))
  if p > 1:  # the method's count: fewer exchanges, one message each
    comm = algo.communication(STEPS, P)
    assert comm.all_reduces < measured.all_reduces and comm.bytes == comm.all_reduces * P


def wide_setup():
  """(params, loss_fn): an MLP 8 -> 16 -> 8, every parameter's first axis divisible by 8."""
  model = models.MLP(num_classes=8, hidden=(16,))
  params = models.init_params(model, (8,), jax.random.key(0))

  def loss_fn(p, batch, key):
    x, y = batch
    return models.cross_entropy_loss(model.apply({"params": p}, x), y)

  return params, loss_fn


def run_wide(algorithm, p, D, shard):
  """Like :func:`run_steps` on the wide MLP, with momentum where the algorithm
  takes it (optimizer state to shard), and the per-device bytes of the
  parameter-shaped state [d, w, ...] / [d, ...] read from the arrays' shards."""
  params, loss_fn = wide_setup()
  layout = worker_layout.make_layout(p, backend="shard_map", devices_per_worker=D)
  if shard:
    layout = data_parallel.shard_params(layout, params)
  loss = data_parallel.data_parallel_loss(loss_fn, layout)
  momentum = algorithm in ("easgd", "local_sgd", "pmean_sgd")
  optimizer = optax.sgd(0.3, momentum=0.9 if momentum else None)
  algo = registry.make_algorithm(config_of(algorithm, p, D), loss, optimizer, STEPS)
  step = mapping.map_step(algo, layout)
  worker, shared = placement.place_state(algo, params, layout)
  state = [x for x in jax.tree.leaves((worker, shared)) if x.ndim > 2]
  per_device = {
      d: sum(s.data.nbytes for x in state for s in x.addressable_shards if s.device == d)
      for d in layout.devices
  }
  rng, key, losses = np.random.default_rng(1), jax.random.key(3), []
  for t in range(STEPS):
    x = rng.normal(size=(p, B, 8)).astype(np.float32)
    y = rng.integers(0, 8, size=(p, B)).astype(np.int32)
    worker, shared, l = step(
        worker, shared, placement.split_workers((x, y), layout, "batch"), key, t
    )
    losses.append(placement.merge_workers(l))
  out = (
      placement.merge_workers(algo.worker_params(worker, shared)),
      placement.first_copy(algo.center(shared)),
  )
  return out, np.stack(losses), per_device, params


@pytest.mark.parametrize("algorithm", SYNCHRONOUS)
def test_sharded_parameters_equal_the_replicated_run_at_1_over_D_the_bytes(algorithm):
  """``shard_params`` on 4x2, 2x4 and 1x8: the parameters, the optimizer's
  and the algorithm's parameter-shaped state and the center are stored 1/D
  per device (read from the arrays' shards: every device of the layout
  holds exactly 1/D of the replicated run's bytes), and after 6 steps the
  workers, center and losses equal the replicated run's within TOL
  (measured: 0.0, bitwise, on this CPU: the all-gather and reduce-scatter
  sum in the all-reduce's order)."""
  for D in (2, 4, 8):
    whole, whole_losses, whole_bytes, params = run_wide(algorithm, 8 // D, D, False)
    split, split_losses, split_bytes, _ = run_wide(algorithm, 8 // D, D, True)
    assert max_abs_diff(split, whole) < TOL and np.max(np.abs(split_losses - whole_losses)) < TOL
    assert set(whole_bytes.values()) == {D * b for b in split_bytes.values()}, (D, split_bytes)
    assert len(set(split_bytes.values())) == 1  # every device holds its 1/D
    assert max_abs_diff(whole[1], params) > 1e-2  # the center moved: not vacuous


@pytest.mark.parametrize("algorithm, p, D", [("easgd", 4, 2), ("easgd", 2, 4), ("pmean_sgd", 1, 8)])
def test_sharded_programs_communicate_what_the_accounting_counts(algorithm, p, D):
  """With ``shard_params`` the compiled step programs, summed over 6 steps
  (tau = 2): across workers the all-reduces of the accounting, each of P / D
  bytes (a device's slice); within a worker, every step, one all-reduce of the
  4-byte loss, an all-gather whose results are the whole P bytes of the
  parameters and a reduce-scatter of the P-byte gradient to its P / D slice:
  the traffic of the one P + 4 byte all-reduce that ``communication_by_level``
  counts (P = 1632, the wide MLP)."""
  params, loss_fn = wide_setup()
  layout = data_parallel.shard_params(
      worker_layout.make_layout(p, backend="shard_map", devices_per_worker=D), params
  )
  ids = np.arange(8).reshape(p, D)
  rows = tuple(sorted(tuple(map(int, r)) for r in ids))
  algo = registry.make_algorithm(
      config_of(algorithm, p, D),
      data_parallel.data_parallel_loss(loss_fn, layout),
      optax.sgd(0.3),
      STEPS,
  )
  worker, shared = placement.place_state(algo, params, layout)
  x, y = np.zeros((p, B, 8), np.float32), np.zeros((p, B), np.int32)
  batch = placement.split_workers((x, y), layout, kind="batch")
  per_call = {}
  for name, f in mapping.map_step(algo, layout, donate_state=False).programs.items():
    hlo = f.lower(worker, shared, batch, jax.random.key(0)).compile().as_text()
    per_call[name] = {
        op: all_reduce_ops(hlo, op) for op in ("all-reduce", "all-gather", "reduce-scatter")
    }
  P = models.param_bytes(params)
  levels = accounting.communication_by_level(algo, STEPS, P, D, shard_params=True)
  across, within = [0, 0], [0, 0, 0]  # across: count, bytes; within: loss, gathered, scattered
  for t in range(STEPS):
    ops = per_call[select_program(algo.programs(), t)]
    for groups, nbytes in ops["all-reduce"]:
      if groups == rows:
        within[0] += nbytes
      else:
        across[0] += 1
        across[1] += nbytes
    assert {g for g, _ in ops["all-gather"] + ops["reduce-scatter"]} == {rows}
    within[1] += sum(b for _, b in ops["all-gather"])
    within[2] += sum(b for _, b in ops["reduce-scatter"])
  assert Communication(*across) == levels.across_workers
  assert levels.across_workers.bytes % (P // D) == 0
  assert within == [4 * STEPS, P * STEPS, P // D * STEPS]
  assert levels.within_workers == Communication(STEPS, STEPS * (P + 4))


@pytest.mark.parametrize("shard", [False, True])
def test_a_bfloat16_worker_of_2_devices_reduces_in_float32(shard):
  """The package's precision policy inside a worker: with bfloat16 parameters
  (2 workers of 2 devices, easgd, tau = 2), every all-reduce, all-gather and
  reduce-scatter of the compiled step programs operates on float32 values,
  within a worker (the gradient and loss over "data"; with ``shard_params``
  the parameters' all-gather and the gradient's reduce-scatter) as across
  workers (the elastic exchange). Read from each step program's HLO text as
  JAX hands it to XLA (``lower().as_text("hlo")``: what every backend
  compiles) and as compiled here; XLA's CPU compiler widens bfloat16
  collectives to float32 itself, so on CPU only the first can show a
  bfloat16 reduction."""
  params, loss_fn = wide_setup()
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  layout = worker_layout.make_layout(2, backend="shard_map", devices_per_worker=2)
  if shard:
    layout = data_parallel.shard_params(layout, params)
  algo = registry.make_algorithm(
      config_of("easgd", 2, 2),
      data_parallel.data_parallel_loss(loss_fn, layout),
      optax.sgd(0.3),
      STEPS,
  )
  worker, shared = placement.place_state(algo, params, layout)
  assert {str(x.dtype) for x in jax.tree.leaves(algo.worker_params(worker, shared))} == {"bfloat16"}
  x, y = np.zeros((2, B, 8), np.float32), np.zeros((2, B), np.int32)
  batch = placement.split_workers((x, y), layout, kind="batch")
  found, per_call = {}, {}
  kinds = ("all-reduce", "all-gather", "reduce-scatter") if shard else ("all-reduce",)
  for name, f in mapping.map_step(algo, layout, donate_state=False).programs.items():
    lowered = f.lower(worker, shared, batch, jax.random.key(0))
    for stage, hlo in (
        ("given", lowered.as_text("hlo")),
        ("compiled", lowered.compile().as_text()),
    ):
      for op, types in collective_dtypes(hlo).items():
        found.setdefault((stage, op), []).extend(types)
    per_call[name] = {op: all_reduce_ops(hlo, op) for op in kinds}  # the compiled program's
  for stage in ("given", "compiled"):
    assert {op for (s, op), types in found.items() if s == stage and types} == set(kinds), found
    for op in kinds:
      assert all(types == {"f32"} for types in found[stage, op]), (stage, op, found[stage, op])
  # the accounting counts what moves: the float32 bytes (twice the parameters' own)
  P = elastic.reduced_bytes(params)
  assert P == 2 * models.param_bytes(params)
  levels = accounting.communication_by_level(algo, STEPS, P, 2, shard_params=shard)
  moved = {"across": 0, "within": 0}  # result bytes of the compiled collectives, 6 steps
  for t in range(STEPS):
    ops = per_call[select_program(algo.programs(), t)]
    for op in kinds:
      for groups, nbytes in ops[op]:
        moved["within" if groups == ((0, 1), (2, 3)) else "across"] += nbytes
  assert moved["across"] == levels.across_workers.bytes > 0, (moved, levels)
  # within: the loss and the gradient's mean (the P + 4 all-reduce), or with shard_params
  # the loss, the parameters' all-gather (P) and the gradient's reduce-scatter (P / 2)
  within = STEPS * (4 + P + P // 2) if shard else levels.within_workers.bytes
  assert moved["within"] == within == levels.within_workers.bytes + (STEPS * P // 2) * shard


def test_a_parameter_that_cannot_be_split_is_one_layout_error():
  params, _ = mlp_setup()  # 5 -> 16 -> 3: the last bias (3,) has no axis divisible by 2
  layout = worker_layout.make_layout(4, backend="shard_map", devices_per_worker=2)
  with pytest.raises(worker_layout.LayoutError) as e:
    data_parallel.shard_params(layout, params)
  assert str(e.value) == (
      "shard_params: parameter ['Dense_1']['bias'] of shape (3,) has no axis divisible by "
      "devices_per_worker=2; allowed: parameters with an axis of a size divisible by 2, or "
      "devices_per_worker dividing one of [3]"
  )
  with pytest.raises(ConfigError, match="allowed: shard_params with devices_per_worker > 1"):
    TrainConfig(shard_params=True).validate()
  with pytest.raises(worker_layout.LayoutError, match=r"\(\) is a scalar, which cannot be split"):
    data_parallel.shard_params(layout, {"scale": np.float32(1.0), **wide_setup()[0]})


def test_parameters_whose_slices_share_a_shape_are_gathered_each_on_its_own_axis():
  """a (10, 4) and b (5, 8) both split to (5, 4) slices at D = 2: the loss
  gathers each leaf on its own axis, and 6 steps equal the replicated run
  (the loss reads both; a gather on the wrong axis fails to compile)."""
  params = {"a": np.ones((10, 4), np.float32) * 0.1, "b": np.ones((5, 8), np.float32) * 0.1}

  def loss_fn(p, batch, key):
    x, y = batch  # x [B, 10], y [B, 8]
    return jnp.mean((x @ p["a"] @ jnp.ones((4, 5)) @ p["b"] - y) ** 2)

  out = {}
  for shard in (False, True):
    layout = worker_layout.make_layout(2, backend="shard_map", devices_per_worker=2)
    if shard:
      layout = data_parallel.shard_params(layout, params)
      assert [a for _, a in layout.param_leaves] == [0, 1]  # both slices (5, 4)
    algo = registry.make_algorithm(
        config_of("easgd", 2, 2),
        data_parallel.data_parallel_loss(loss_fn, layout),
        optax.sgd(0.01),
        4,
    )
    step = mapping.map_step(algo, layout)
    worker, shared = placement.place_state(algo, params, layout)
    rng = np.random.default_rng(0)
    for t in range(4):
      x = rng.normal(size=(2, B, 10)).astype(np.float32)
      y = rng.normal(size=(2, B, 8)).astype(np.float32)
      worker, shared, _ = step(
          worker, shared, placement.split_workers((x, y), layout, "batch"), jax.random.key(0), t
      )
    out[shard] = placement.first_copy(algo.center(shared))
  assert max_abs_diff(out[True], out[False]) < TOL and max_abs_diff(out[False], params) > 1e-3


def test_sharded_parameters_over_several_processes_are_refused():
  import collections

  device = collections.namedtuple("FakeDevice", "id process_index platform")
  devices = [device(i, i // 4, "cpu") for i in range(8)]
  layout = worker_layout.make_layout(2, backend="shard_map", devices=devices, devices_per_worker=4)
  with pytest.raises(worker_layout.LayoutError) as e:
    data_parallel.shard_params(layout, wide_setup()[0])
  assert str(e.value) == (
      "shard_params runs in one process (a worker's slices are read back on one host); "
      "allowed with 2 processes: shard_params False"
  )


def test_without_the_gradient_average_a_worker_of_2_devices_differs():
  """Control: the raw loss on the 2-D mesh (each device its own B / D
  examples' gradient) is not the one-device step, so the test above can fail."""
  xs, ys = random_batches(STEPS, 4, B)
  raw, _, _ = run_steps("easgd", 4, 2, xs, ys, wrap=False)
  one, _, _ = run_steps("easgd", 4, 1, xs, ys)
  assert max_abs_diff(raw, one) > 1e-2


def test_the_batch_is_split_over_the_devices_of_its_worker():
  layout = worker_layout.make_layout(2, backend="shard_map", devices_per_worker=4)
  assert layout.mesh.shape == {"devices": 2, "data": 4}
  assert (layout.num_devices, layout.num_groups, layout.workers_per_device) == (8, 2, 1)
  x = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3)  # [p, B, 3]
  placed = placement.split_workers(x, layout, kind="batch")
  assert placed.shape == (2, 1, 8, 3)
  blocks = {(s.device.id, s.data.shape) for s in placed.addressable_shards}
  assert {shape for _, shape in blocks} == {(1, 1, 2, 3)} and len(blocks) == 8
  np.testing.assert_array_equal(placement.merge_workers(placed), x)
  # state values are whole on every device of a worker
  state = placement.split_workers(x, layout)
  assert {s.data.shape for s in state.addressable_shards} == {(1, 1, 8, 3)}


def test_the_trainer_runs_workers_of_2_devices_on_the_same_examples():
  """``Run`` and the spmd executor with devices_per_worker 2 (digits, MLP, 5 steps),
  with and without ``shard_params``: the batches are the same examples as with 1
  device per worker, and the workers and center agree to 1e-6 (measured:
  3.0e-8)."""
  out = {}
  for D, shard in ((2, True), (2, False), (1, False)):
    config = TrainConfig(
        dataset="digits",
        model="mlp",
        num_workers=4,
        global_batch_size=64,
        num_epochs=1,
        tau=2,
        mapping_backend="shard_map",
        devices_per_worker=D,
        shard_params=shard,
        progress=False,
    )
    run = Run(config)
    executor = SpmdExecutor(run)
    executor.initial_state()
    batch = placement.to_host(executor._batch(0))
    executor.run_to(5)
    algo = run.algorithm
    out[D] = (
        batch,
        placement.merge_workers(algo.worker_params(executor.worker, executor.shared)),
        placement.first_copy(algo.center(executor.shared)),
    )
    levels = executor.summary_fields()["communication"]
    out[D, shard] = out.pop(D) + (levels,)
  # 5 steps: exchanges at t = 0, 2, 4 across workers; with D = 2, every step
  # one all-reduce of the gradient and the float32 loss within each worker
  pb = run.param_bytes
  for (D, shard), (*_, levels) in out.items():
    across, within = levels["by_axis"]["across_workers"], levels["by_axis"]["within_workers"]
    sent = 3 * pb // 2 if shard else 3 * pb  # sharded: each device exchanges its half
    assert (levels["all_reduces"], levels["bytes"]) == (3, sent)  # today's fields: across
    assert (across["all_reduces"], across["bytes"], across["group_size"]) == (3, sent, 4)
    assert within["all_reduces"] == (5 if D == 2 else 0)
    assert within["bytes"] == (5 * (pb + 4) if D == 2 else 0) and within["group_size"] == D
    assert (across["mesh_axis"], within["mesh_axis"]) == ("devices", "data")
    assert within["bytes_per_step"] == within["bytes"] / 5
    assert "program" not in levels  # a synchronous program sends what the method counts
  assert "2 devices each" in Run(config.replace(devices_per_worker=2)).layout.describe()
  for two in ((2, False), (2, True)):
    assert max_abs_diff(out[two][0], out[1, False][0]) == 0  # the same examples
    assert max_abs_diff(out[two][1:3], out[1, False][1:3]) < TOL


def test_the_summary_of_a_simulated_asynchronous_run_adds_what_its_program_sends():
  """An spmd run of async EASGD (digits, MLP, 4 workers, tau = 2, 3 slots):
  ``communication`` keeps the method's count (the exchanges, as a real
  asynchronous run sends them) and ``program`` counts the compiled program's
  two all-reduces per slot of 4 x (P + 4) bytes (every worker's message and
  due flag)."""
  config = TrainConfig(
      dataset="digits",
      model="mlp",
      algorithm="async_easgd",
      num_workers=4,
      global_batch_size=64,
      num_epochs=1,
      tau=2,
      progress=False,
  )
  run = Run(config)
  executor = SpmdExecutor(run)
  executor.initial_state()
  executor.run_to(3)
  comm = executor.summary_fields()["communication"]
  P = run.exchange_bytes
  method = run.algorithm.communication(3, P)
  assert (comm["all_reduces"], comm["bytes"]) == (method.all_reduces, method.bytes)
  program = comm["program"]
  assert (program["all_reduces"], program["bytes"]) == (6, 3 * 4 * (P + 4))
  assert program["all_reduces_per_step"] == 2 and program["bytes_per_step"] == 4 * (P + 4)
  assert method.all_reduces < 6


def test_one_device_per_worker_is_the_unchanged_program():
  """D = 1 (layout 8x1): data_parallel_loss is the loss itself and the step
  program, "batch" argument and all, is the one of "worker" arguments."""
  params, loss_fn = mlp_setup()
  layout = worker_layout.make_layout(8, backend="shard_map", devices_per_worker=1)
  assert layout.mesh.axis_names == ("devices",) and layout.devices_per_worker == 1
  assert data_parallel.data_parallel_loss(loss_fn, layout) is loss_fn
  algo = registry.make_algorithm(config_of("easgd", 8, 1), loss_fn, optax.sgd(0.3), STEPS)
  worker, shared = placement.place_state(algo, params, layout)
  xs, ys = random_batches(1, 8, B)
  batch = placement.split_workers((xs[0], ys[0]), layout, kind="batch")
  key = jax.random.key(3)
  kinds = ("worker", "shared", "worker", "broadcast")
  old = mapping.map_workers(algo.step, layout, kinds, mapping.STEP_OUT_KINDS)
  new = mapping.map_workers(algo.step, layout, mapping.STEP_IN_KINDS, mapping.STEP_OUT_KINDS)
  assert "batch" in mapping.STEP_IN_KINDS
  args = (worker, shared, batch, key)
  assert new.lower(*args).as_text() == old.lower(*args).as_text()


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(devices_per_worker=0), "devices_per_worker must be an integer in [1,"),
        (
            dict(devices_per_worker=2, mapping_backend="pmap"),
            "needs the 2-D mesh of mapping_backend 'shard_map', got mapping_backend 'pmap'",
        ),
        (dict(devices_per_worker=2, algorithm="async_easgd"), "'async_easgd' is asynchronous"),
        (
            dict(devices_per_worker=2, algorithm="async_easgd", runtime="threads"),
            "runs on runtime 'spmd'",
        ),
        (dict(devices_per_worker=3), "per-worker batch 32"),
        (dict(devices_per_worker=2, num_devices=4), "allowed: 8 or None"),
        (dict(devices_per_worker=2, model="cnn_bn"), "BatchNorm"),
    ],
)
def test_bad_devices_per_worker_is_one_config_error(changes, words):
  config = TrainConfig(mapping_backend="shard_map").replace(**changes)
  with pytest.raises(ConfigError, match=None) as e:
    config.validate()
  assert words in str(e.value) and "\n" not in str(e.value)


def test_the_2d_mesh_is_chosen_when_a_worker_has_several_devices():
  """``mapping_backend`` None (the default): the 2-D mesh of 'shard_map' for
  devices_per_worker > 1, 'pmap' for one device per worker, the layout of an
  explicit 'pmap' (the same devices, the same programs); an explicit 'pmap'
  with D > 1 is one line."""
  config = TrainConfig(dataset="digits", model="mlp", num_workers=2, global_batch_size=32)
  assert config.mapping_backend is None and config.resolved_mapping_backend == "pmap"
  two = config.replace(devices_per_worker=2).validate()
  assert two.resolved_mapping_backend == "shard_map"
  assert Run(two).layout == Run(two.replace(mapping_backend="shard_map")).layout
  layout = Run(config).layout
  assert layout.backend == "pmap" and layout == Run(config.replace(mapping_backend="pmap")).layout
  assert worker_layout.make_layout(2, devices_per_worker=2).backend == "shard_map"
  assert worker_layout.make_layout(2) == worker_layout.make_layout(2, backend="pmap")
  with pytest.raises(ConfigError) as e:
    two.replace(mapping_backend="pmap").validate()
  assert str(e.value) == (
      "devices_per_worker=2 needs the 2-D mesh of mapping_backend 'shard_map', got "
      "mapping_backend 'pmap'; allowed: mapping_backend 'shard_map' or None (chosen from "
      "devices_per_worker), or devices_per_worker 1"
  )


def test_more_devices_than_there_are_is_a_layout_error():
  with pytest.raises(worker_layout.LayoutError, match="4 \\* 4 = 16 devices but only 8"):
    worker_layout.make_layout(4, backend="shard_map", devices_per_worker=4)
  with pytest.raises(worker_layout.LayoutError, match="needs the 'shard_map'"):
    worker_layout.make_layout(4, backend="pmap", devices_per_worker=2)


def test_workers_of_several_devices_over_several_processes_take_whole_rows():
  """The layouts of workers of D devices over 2 processes (devices listed as
  JAX lists a multi-process run's, process by process): one worker per
  process, several per process, a worker spanning both; refused, one line
  each, before anything compiles: a device count not taken equally from the
  processes, and a worker split unevenly between them. The runs themselves:
  ``tests/test_distributed.py``."""
  import collections

  device = collections.namedtuple("FakeDevice", "id process_index platform")
  eight = [device(i, i // 4, "cpu") for i in range(8)]  # 2 processes x 4 devices

  def rows(layout):  # the mesh's rows (layout.mesh wants real devices)
    ids, D = [d.id for d in layout.devices], layout.devices_per_worker
    return [ids[i : i + D] for i in range(0, len(ids), D)]

  per_node = worker_layout.make_layout(2, backend="shard_map", devices=eight, devices_per_worker=4)
  assert rows(per_node) == [[0, 1, 2, 3], [4, 5, 6, 7]] and per_node.num_processes == 2
  two_each = worker_layout.make_layout(4, backend="shard_map", devices=eight, devices_per_worker=2)
  assert rows(two_each) == [[0, 1], [2, 3], [4, 5], [6, 7]]
  spanning = worker_layout.make_layout(1, backend="shard_map", devices=eight, devices_per_worker=8)
  assert rows(spanning) == [list(range(8))]
  assert spanning.local_workers == slice(0, 1)  # the worker is this process's too
  half = worker_layout.make_layout(2, backend="shard_map", devices=eight, devices_per_worker=2)
  assert rows(half) == [[0, 1], [4, 5]]  # 2 devices from each process
  twelve = [device(i, i // 6, "cpu") for i in range(12)]  # 2 processes x 6 devices
  with pytest.raises(worker_layout.LayoutError) as e:
    worker_layout.make_layout(3, backend="shard_map", devices=twelve, devices_per_worker=4)
  assert str(e.value) == (
      "devices_per_worker=4 with 6 device(s) from each of the 2 processes would split a worker "
      "unevenly between processes; allowed: a divisor of 6 (workers inside a process; 6: one "
      "worker per process) or a multiple of 6 (workers spanning processes)"
  )
  with pytest.raises(worker_layout.LayoutError) as e:
    worker_layout.make_layout(1, backend="shard_map", devices=eight, devices_per_worker=3)
  assert str(e.value) == (
      "num_workers * devices_per_worker = 1 * 3 = 3 devices cannot be taken equally from the 2 "
      "processes (4 device(s) each at most); allowed: a multiple of 2 up to 8"
  )


def test_a_task_whose_loss_is_not_a_mean_of_examples_is_refused_before_compiling():
  import dataclasses

  from easgd.runtimes import training_run
  from easgd.settings import builtin_tasks

  config = TrainConfig(
      dataset="digits",
      model="mlp",
      num_workers=2,
      global_batch_size=32,
      mapping_backend="shard_map",
      devices_per_worker=2,
  )
  task = dataclasses.replace(builtin_tasks.task_of(config), name="mine", mean_of_examples=False)
  with pytest.raises(ConfigError) as e:
    Run(config, task)
  assert str(e.value) == (
      "devices_per_worker=2 averages a worker's loss and gradient over its devices, which are "
      "its whole batch's only for a loss that is a mean of independent per-example terms; task "
      "'mine' does not declare its loss one (mean_of_examples=False, the default); allowed: "
      "devices_per_worker 1, or, if the loss is such a mean, the task built with "
      "easgd.Task(..., mean_of_examples=True) (docs/guides/task.md)"
  )
  Run(config.replace(devices_per_worker=1), task)  # one device per worker: accepted
  stateful = dataclasses.replace(task, mean_of_examples=True, center_state=lambda p, b, a: ())
  with pytest.raises(ConfigError, match="task 'mine' has a center_state .*; allowed: "):
    # what Run checks after the task's own checks
    training_run.check_devices_per_worker(stateful, 2)
