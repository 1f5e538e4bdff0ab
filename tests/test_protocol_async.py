"""The paper's asynchronous arms (Algorithms 1-2 as the deterministic simulation) in the protocol.

Each arm's one-program runs equal ``easgd train`` runs of the same settings: the
round-robin order the paper's master serves, and a seeded random order. Arms that
differ in tau and the exchange order run as one program (both traced per
configuration), with the same values, bit for bit, as each configuration run alone.
"""

import jax
import numpy as np
import pytest

from easgd import TrainConfig, train_and_evaluate
from easgd.protocol import programs
from easgd.protocol.config import Arm, ProtocolConfig

BASE = TrainConfig(
    dataset="mnist1d",
    model="mlp",
    num_epochs=1,
    global_batch_size=384,
    num_workers=4,
    validation_examples=1000,
    progress=False,
)
"""18 steps (7000 training signals, 4 x 96 per step), as tests/test_protocol.py."""

ARMS = (
    Arm("async_easgd rr", "async_easgd", dict(tau=4, exchange_order="round_robin"), (0.1,)),
    Arm("async_easgd random", "async_easgd", dict(tau=4, exchange_order="random"), (0.1,)),
    Arm("async_eamsgd rr", "async_eamsgd", dict(tau=4, delta=0.9), (0.02,)),
)


@pytest.mark.parametrize("arm", ARMS, ids=[a.name for a in ARMS])
def test_an_asynchronous_arm_equals_easgd_train_of_its_settings(tmp_path, arm):
  config = ProtocolConfig("async", "", BASE, (arm,), eval_every_steps=9).validate()
  seeds = programs.SeedData(BASE, (5,))
  run = programs.prepare(config, seeds.num_train)[arm.name]
  configs = [dict(arm=arm.name, learning_rate=arm.learning_rates[0], seed=5)]
  out, _ = programs.run_program([run], configs, seeds, "report", config)
  cfg = run.config.replace(learning_rate=arm.learning_rates[0], seed=5)
  history = train_and_evaluate(cfg, tmp_path / "train")["history"]
  steps = list(run.eval_steps)
  for rec in history:  # steps 0 and 18
    k = steps.index(rec["step"])
    for split in ("val", "test"):
      assert out["curves"][f"{split}_loss"][0, k] == pytest.approx(rec[f"{split}_loss"], rel=1e-6)
      assert out["curves"][f"{split}_error"][0, k] == pytest.approx(rec[f"{split}_error"], abs=1e-6)


# Arms of one algorithm that differ in tau and in the exchange order: one program.
GROUPS = {
    "async_easgd": (
        Arm("easgd rr tau=4", "async_easgd", dict(tau=4, exchange_order="round_robin"), (0.1,)),
        Arm("easgd random tau=4", "async_easgd", dict(tau=4, exchange_order="random"), (0.1,)),
        Arm("easgd random tau=2", "async_easgd", dict(tau=2, exchange_order="random"), (0.05,)),
    ),
    "downpour": (
        Arm("downpour rr tau=1", "downpour", dict(tau=1), (0.01,)),
        Arm("downpour random tau=2", "downpour", dict(tau=2, exchange_order="random"), (0.01,)),
    ),
}


def _values(out: dict) -> dict:
  """Every array of a program's outputs, by name (curves, losses, final, center)."""
  flat = {"train_loss": out["train_loss"]}
  flat.update({f"curves/{k}": v for k, v in out["curves"].items()})
  flat.update({f"final/{k}": v for k, v in out.get("final", {}).items()})
  flat.update({f"center/{i}": np.asarray(v) for i, v in enumerate(jax.tree.leaves(out["center"]))})
  return flat


@pytest.mark.parametrize("algorithm", sorted(GROUPS))
def test_arms_differing_in_tau_and_order_run_as_one_program_equal_to_each_alone(algorithm):
  """The configurations of round-robin and random-order arms with different tau
  (two seeds each) run as ONE program, tau and the exchange order traced per
  configuration; each configuration's curves, training losses, final worker
  errors and final center equal, bit for bit, the same configuration run as its
  own program (tau and the order Python values there), one configuration per call
  in both (the chunk size k sets the compiled program: tests/test_protocol.py)."""
  arms = GROUPS[algorithm]
  config = ProtocolConfig(
      "async", "", BASE, arms, eval_every_steps=9, configs_per_batch=1
  ).validate()
  seeds = programs.SeedData(BASE, (5, 6))
  runs = programs.prepare(config, seeds.num_train)
  group = [runs[a.name] for a in arms]
  assert programs.group_programs(group) == [group]  # one program
  configs = [
      dict(arm=r.arm.name, learning_rate=r.arm.learning_rates[0], seed=s)
      for r in group
      for s in (5, 6)
  ]
  together, info = programs.run_program(group, configs, seeds, "report", config, return_center=True)
  assert {"tau", "exchange_order"} <= set(info["traced_fields"])
  assert info["compiles"] == 5  # init, step, evaluation, end, center: one each for all
  for i, c in enumerate(configs):
    alone, _ = programs.run_program(
        [runs[c["arm"]]], [c], seeds, "report", config, return_center=True
    )
    mine = _values(together)
    for name, value in _values(alone).items():
      np.testing.assert_array_equal(mine[name][i : i + 1], value, err_msg=f"{c} {name}")


def test_configurations_of_both_orders_sharing_a_call_equal_their_arm_alone():
  """Configurations of different arms (random and round-robin orders, tau 2 and 4)
  share each call (k = 2): each equals, bit for bit, its arm's own program, where
  its two seeds share the calls (k = 2 there too)."""
  arms = GROUPS["async_easgd"]
  config = ProtocolConfig("async", "", BASE, arms, eval_every_steps=9, configs_per_batch=2)
  config = config.validate()
  seeds = programs.SeedData(BASE, (5, 6))
  runs = programs.prepare(config, seeds.num_train)
  group = [runs[a.name] for a in arms]
  configs = [  # by seed, then arm: the calls hold (rr 4, random 4), (random 2, rr 4), ...
      dict(arm=r.arm.name, learning_rate=r.arm.learning_rates[0], seed=s)
      for s in (5, 6)
      for r in group
  ]
  together, _ = programs.run_program(group, configs, seeds, "tune", config, return_center=True)
  mine = _values(together)
  for r in group:
    rows = [i for i, c in enumerate(configs) if c["arm"] == r.arm.name]
    own = [configs[i] for i in rows]
    alone, _ = programs.run_program([r], own, seeds, "tune", config, return_center=True)
    for name, value in _values(alone).items():
      np.testing.assert_array_equal(mine[name][rows], value, err_msg=f"{r.arm.name} {name}")
