"""Streaming elastic exchanges (``easgd.core.streaming``) in compiled programs and runs.

* The collectives of the compiled step programs, summed over the steps of 2 tau,
  equal ``algorithm.communication``: all-reduce result bytes are the fragment's
  bytes (``bytes``); an all-gather's result holds every worker's payload, so its
  bytes are p x one worker's payload (measured on 4 devices x 1 worker and on 2
  devices x 2 vmapped workers alike: the gathered array is [p, payload]), and
  ``gathered_bytes`` is that sum / p. XLA issues one all-gather per payload
  array (q and scales, or values and indices, of each leaf), one all-reduce per
  send: counts are compared as sends (steps whose program has the op).
* P = 1, V = 0, no compression is the algorithm without ``exchange``.
* A run with a fragment in flight resumes bit for bit.
* Bad settings on the command line: exit 2, one line naming the value.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from easgd import cli
from easgd.core import algorithms, streaming
from easgd.core.base import select_program
from easgd.methods import registry
from easgd.parallel import mapping, placement, worker_layout
from easgd.run import checkpoint, trainer
from easgd.settings.config import TrainConfig
from easgd.tasks import models

from testutil import TINY_DIGITS, mlp_setup, program_collectives, random_batches

P_WORKERS, TAU, B = 4, 4, 4
STEPS = 2 * TAU

# MLP 5 -> 16 -> 3: leaves (16,), (5, 16), (3,), (16, 3): 147 float32, 588 bytes
CONFIGS = {
    "P2-contiguous-V0": dict(fragments=2),
    "P3-strided-V1": dict(fragments=3, fragment_layout="strided", delay=1),
    "P2-V1-int8": dict(fragments=2, delay=1, compression="int8"),
    "P2-V0-int4": dict(fragments=2, compression="int4"),
    "P2-V0-topk": dict(fragments=2, compression="topk", topk_fraction=0.1),
}
LAYOUTS = {"4x1-pmap": (4, "pmap"), "2x2-shard_map": (2, "shard_map")}  # devices, backend


def build(params, loss_fn, num_devices, backend, **settings):
  cfg = TrainConfig(
      num_workers=P_WORKERS,
      tau=TAU,
      global_batch_size=B * P_WORKERS,
      mapping_backend=backend,
      **settings,
  ).validate()
  algo = registry.make_algorithm(cfg, loss_fn, optax.sgd(0.1), 100, params)
  layout = worker_layout.make_layout(P_WORKERS, num_devices, backend=backend)
  worker, shared = placement.place_state(algo, params, layout)
  xs, ys = random_batches(1, P_WORKERS, B)
  batch = placement.split_workers((xs[0], ys[0]), layout, kind="batch")
  return algo, layout, (worker, shared, batch, jax.random.key(0))


@pytest.fixture(scope="module")
def mlp():
  return mlp_setup()


@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("config_name", CONFIGS)
def test_the_compiled_programs_send_the_bytes_the_accounting_counts(mlp, config_name, layout_name):
  params, loss_fn = mlp
  num_devices, backend = LAYOUTS[layout_name]
  algo, layout, args = build(params, loss_fn, num_devices, backend, **CONFIGS[config_name])
  per_program = program_collectives(algo, layout, args)
  assert set(per_program) == set(algo.programs())  # one program per (send, apply) event
  measured = dict(all_reduces=0, bytes=0, all_gathers=0, gathered_bytes=0)
  for t in range(STEPS):
    reduces, gathers = per_program[select_program(algo.programs(), t)]
    send = streaming.events(
        t, TAU, CONFIGS[config_name]["fragments"], algo.hyperparameters["delay"]
    )[0]
    assert bool(reduces or gathers) == (send is not None)  # a collective exactly on a send
    assert len(reduces) <= 1  # one (variadic) all-reduce of the fragment's leaves
    measured["all_reduces"] += len(reduces)
    measured["bytes"] += sum(b for _, b in reduces)
    measured["all_gathers"] += bool(gathers)
    gathered = sum(b for _, b in gathers)
    assert gathered % P_WORKERS == 0  # [p, payload] per gathered array
    measured["gathered_bytes"] += gathered // P_WORKERS
    assert all(
        len(g) == num_devices for ops in (reduces, gathers) for groups, _ in ops for g in groups
    )
  comm = algo.communication(STEPS, models.param_bytes(params))
  assert measured == comm._asdict()
  compressed = "compression" in CONFIGS[config_name]
  assert (comm.all_gathers > 0, comm.all_reduces > 0) == (compressed, not compressed)


def test_the_counted_bytes_are_the_payload_formulas(mlp):
  """Hand-computed per-worker bytes of 2 tau = 8 steps (each fragment sent twice).
  P = 2 contiguous: F_0 = leaves (16,), (5, 16) (96 entries), F_1 = (3,), (16, 3) (51).
  none: 4 bytes an entry: 2 (384 + 204) = 1176. int8 (block 256, one scale a leaf):
  n + 4 a leaf: 2 ((20 + 84) + (7 + 52)) = 326. int4: ceil(n / 2) + 4: 2 ((12 + 44)
  + (6 + 28)) = 180. topk 0.1: 8 ceil(0.1 n) a leaf: 2 (8 (2 + 8) + 8 (1 + 5)) = 256."""
  params, loss_fn = mlp
  expected = {
      "P2-contiguous-V0": (4, 1176, 0, 0),
      "P2-V1-int8": (0, 0, 4, 326),
      "P2-V0-int4": (0, 0, 4, 180),
      "P2-V0-topk": (0, 0, 4, 256),
  }
  for name, want in expected.items():
    cfg = TrainConfig(num_workers=P_WORKERS, tau=TAU, **CONFIGS[name]).validate()
    algo = registry.make_algorithm(cfg, loss_fn, optax.sgd(0.1), 100, params)
    assert tuple(algo.communication(STEPS, 588)) == want, name


def two_equal_leaves():
  """(params, loss_fn): two 4 x 4 float32 matrices (64 bytes each), a linear model."""
  params = {"a": jnp.full((4, 4), 0.1), "b": jnp.full((4, 4), 0.2)}

  def loss_fn(p, batch, key):
    x, y = batch
    z = x[:, :4] @ p["a"] @ p["b"]
    return jnp.mean((z[:, 0] - y) ** 2)

  return params, loss_fn


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_the_peak_exchange_of_p_equal_fragments_is_one_pth_of_the_whole(compression):
  params, loss_fn = two_equal_leaves()
  peaks = {}
  for fragments in (1, 2):
    algo, layout, args = build(
        params, loss_fn, 4, "pmap", fragments=fragments, compression=compression
    )
    peaks[fragments] = max(
        sum(b for _, b in reduces) + sum(b for _, b in gathers) // P_WORKERS
        for reduces, gathers in program_collectives(algo, layout, args).values()
    )
  # none: 2 x 64 bytes at once, 64 a fragment; int8 (one scale a leaf): 2 x 20, 20
  assert peaks == ({1: 128, 2: 64} if compression == "none" else {1: 40, 2: 20})


# -- P = 1, V = 0, no compression: the algorithm as it was ------------------------


@pytest.mark.parametrize("factory", ["easgd", "eamsgd"])
def test_a_plain_exchange_is_the_algorithm_without_one(mlp, factory):
  params, loss_fn = mlp
  kw = dict(num_workers=P_WORKERS, tau=2, beta=0.9, learning_rate=0.1)
  if factory == "eamsgd":
    kw["momentum"] = 0.9
  make = getattr(algorithms, factory)
  plain = make(loss_fn, exchange=streaming.ExchangeTechniques(), **kw)
  shaped = make(loss_fn, exchange=streaming.ExchangeTechniques(param_shapes=params), **kw)
  base = make(loss_fn, **kw)
  layout = worker_layout.make_layout(P_WORKERS, 2)
  xs, ys = random_batches(5, P_WORKERS, B)
  results, texts = [], []
  for algo in (base, plain, shaped):
    assert list(algo.programs()) == list(base.programs())
    assert algo.hyperparameters == base.hyperparameters
    step = mapping.map_step(algo, layout, donate_state=False)
    worker, shared = placement.place_state(algo, params, layout)
    args = (placement.split_workers((xs[0], ys[0]), layout, kind="batch"), jax.random.key(0))
    texts.append({k: f.lower(worker, shared, *args).as_text() for k, f in step.programs.items()})
    for t in range(len(xs)):
      batch = placement.split_workers((xs[t], ys[t]), layout, kind="batch")
      worker, shared, loss = step(worker, shared, batch, jax.random.key(3), t)
    results.append(jax.tree.map(np.asarray, (worker, shared, loss)))
  assert texts[1] == texts[0] and texts[2] == texts[0]
  for other in results[1:]:
    assert jax.tree.structure(other) == jax.tree.structure(results[0])
    for x, y in zip(jax.tree.leaves(other), jax.tree.leaves(results[0]), strict=True):
      np.testing.assert_array_equal(x, y)


# -- resume with a fragment in flight -------------------------------------------


STREAM_RUN = dataclasses.replace(
    TINY_DIGITS, num_epochs=1, fragments=2, delay=1, compression="int8"
)
"""22 steps, tau 4: fragment 0 sent at t = 0, 4, ... applied at 1, 5, ...; fragment 1
sent at t = 2, 6, ... applied at 3, 7, ...: after 7 steps (t = 0..6) fragment 1 is in flight."""


def leaves_by_path(tree):
  return {
      jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)
  }


def test_a_run_with_a_fragment_in_flight_resumes_bit_for_bit(tmp_path):
  full = trainer.train_and_evaluate(STREAM_RUN, tmp_path / "full")
  cut = trainer.train_and_evaluate(STREAM_RUN, tmp_path / "cut", stop_after_steps=7)
  assert cut["status"] == "stopped" and cut["steps_done"] == 7
  saved = leaves_by_path(checkpoint.Checkpointer(tmp_path / "cut").restore(7))
  pending = [v for k, v in saved.items() if "pending" in k]
  errors = [v for k, v in saved.items() if "error" in k]
  assert pending and any(np.any(v != 0) for v in pending), sorted(saved)  # M in flight
  assert errors and any(np.any(v != 0) for v in errors), sorted(saved)  # int8 residuals
  done = trainer.train_and_evaluate(STREAM_RUN, tmp_path / "cut", resume=True)
  assert done["status"] == full["status"] == "complete"
  assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (
      tmp_path / "full" / "metrics.jsonl"
  ).read_text()
  last = checkpoint.Checkpointer(tmp_path / "full").latest_step()
  assert checkpoint.Checkpointer(tmp_path / "cut").latest_step() == last == 22
  want = leaves_by_path(checkpoint.Checkpointer(tmp_path / "full").restore(last))
  got = leaves_by_path(checkpoint.Checkpointer(tmp_path / "cut").restore(last))
  assert sorted(got) == sorted(want)
  state = [k for k in want if k.split("]")[0] in ("['worker'", "['shared'", "['center'")]
  assert any("pending" in k for k in state) and any("error" in k for k in state)
  for k in state:  # not the wall-clock entries (train_seconds)
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


# -- bad input on the command line ------------------------------------------------


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--fragments", "8", "--tau", "4"], "fragments=8 needs tau >= fragments"),
        (["--delay", "4", "--tau", "4"], "delay=4 must be below tau=4"),
        (["--fragments", "8", "--tau", "8"], "at most the 6 parameter leaves) must be an "),
        (["--algorithm", "async_easgd", "--compression", "int8"], "compression='int8' is not read"),
        (
            ["--compression", "topk", "--topk-fraction", "0"],
            "topk_fraction must be a finite real in (0, 1], got 0.0",
        ),
        (
            ["--compression", "topk", "--topk-fraction", "1.5"],
            "topk_fraction must be a finite real in (0, 1], got 1.5",
        ),
        (["--compression", "int3"], "unknown compression 'int3'; allowed: none, int8, int4, topk"),
    ],
)
def test_the_command_line_refuses_bad_streaming_settings(tmp_path, capsys, argv, named):
  workdir = tmp_path / "w"
  base = [
      "train",
      "--workdir",
      str(workdir),
      "--dataset",
      "digits",
      "--model",
      "mlp",
      "--no-progress",
  ]
  try:
    code = cli.main(base + argv)
  except SystemExit as e:  # argparse's own refusals
    code = e.code
  assert code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("easgd: error: ") and named in err[0], err
  assert not workdir.exists()
