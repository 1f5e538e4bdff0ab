"""The paper's asynchronous arms (Algorithms 1-2 as the deterministic simulation) in the protocol.

Each arm's one-program runs equal ``easgd train`` runs of the same settings: the
round-robin order the paper's master serves, and a seeded random order.
"""

import pytest

from easgd import TrainConfig, train_and_evaluate
from easgd.protocol import runs
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
  seeds = runs.SeedData(BASE, (5,))
  run = runs.prepare(config, seeds.num_train)[arm.name]
  configs = [dict(arm=arm.name, learning_rate=arm.learning_rates[0], seed=5)]
  out, _ = runs.run_program([run], configs, seeds, "report", config)
  cfg = run.config.replace(learning_rate=arm.learning_rates[0], seed=5)
  history = train_and_evaluate(cfg, tmp_path / "train")["history"]
  steps = list(run.eval_steps)
  for rec in history:  # steps 0 and 18
    k = steps.index(rec["step"])
    for split in ("val", "test"):
      assert out["curves"][f"{split}_loss"][0, k] == pytest.approx(rec[f"{split}_loss"], rel=1e-6)
      assert out["curves"][f"{split}_error"][0, k] == pytest.approx(rec[f"{split}_error"], abs=1e-6)
