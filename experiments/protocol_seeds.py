"""1 vs 2 vs 4 workers at a fixed per-worker batch: does the accuracy drop go away?

    easgd protocol --config experiments/protocol_seeds.py \
        --workdir paper_notes/figures/protocol_seeds --group-by num_workers

The question of notebook 01, with a controlled data order (every step's global
batch is fixed by (seed, epoch, step): easgd.tasks.batches.worker_batch_indices) and
intervals over seeds. MNIST-1D, the small CNN, 32 examples per worker per step,
8 epochs for every p (equal samples: p = 1 takes 1744 steps, p = 2 872, p = 4
432), 1000 of the 8000 training signals held out for validation.

* "1 worker": pmean SGD with p = 1 (plain SGD at batch 32), its rate chosen
  from 5 log-spaced rates on the validation split (the reference, and the
  rate the rules scale: lr_reference_batch = 32).
* pmean SGD at p = 2 and 4 with that rate scaled by lr_scaling none / linear
  (x p) / sqrt (x sqrt p), and with its own tuned rate (the best a rule could
  give).
* EASGD (tau = 4, beta = 0.9) at p = 2 and 4 with the same three rules, without
  and with a synchronous warm-up of one epoch (K = 109 steps at p = 2, 54 at
  p = 4: pmean SGD first, then EASGD counted from K).

Reported on 20 fresh seeds (tuned on 3), chosen by power: at 5 report seeds
the arms' final test errors spread by a median standard deviation of 1.76 pp
over seeds, and 20 seeds per arm resolve a difference of 1.2 pp at that spread
at 95% (``easgd.protocol.stats.seeds_to_resolve(1.76, 1.2)`` is 18); arms share
the seeds, so their paired differences resolve less.
"""

from easgd.protocol.config import Arm, ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

BATCH = 32  # examples per worker per step
RATES = log_grid(0.01, 1.0, 5)
RULES = ("none", "linear", "sqrt")
WARMUP = {2: 109, 4: 54}  # one epoch of steps at each p


def get_config() -> TrainConfig:
  return TrainConfig(
      algorithm="pmean_sgd",
      dataset="mnist1d",
      model="cnn",
      num_workers=1,
      global_batch_size=BATCH,  # the 1-worker reference
      num_epochs=8,  # equal samples for every p
      learning_rate=0.1,  # replaced by the chosen rate
      optimizer="sgd",
      validation_examples=1000,
      keep_checkpoints=1,
      progress=False,
  )


def get_protocol() -> ProtocolConfig:
  arms = [Arm("1 worker", "pmean_sgd", {}, RATES)]
  for p in (2, 4):
    size = dict(num_workers=p, global_batch_size=BATCH * p)
    for rule in RULES:
      scaling = {} if rule == "none" else dict(lr_scaling=rule, lr_reference_batch=BATCH)
      arms.append(
          Arm(f"pmean p={p} {rule}", "pmean_sgd", dict(size, **scaling), lr_from="1 worker")
      )
    arms.append(Arm(f"pmean p={p} tuned", "pmean_sgd", size, RATES))
    for k in (0, WARMUP[p]):
      for rule in RULES:
        scaling = {} if rule == "none" else dict(lr_scaling=rule, lr_reference_batch=BATCH)
        arms.append(
            Arm(
                f"easgd p={p} {rule}" + (f" K={k}" if k else ""),
                "easgd",
                dict(size, tau=4, beta=0.9, sync_warmup_steps=k, **scaling),
                lr_from="1 worker",
            )
        )
  return ProtocolConfig(
      name="seeds_workers",
      description=(
          "1 vs 2 vs 4 workers at 32 examples per worker and 8 epochs "
          "(equal samples) on MNIST-1D with the small CNN: pmean SGD and "
          "EASGD (tau = 4) with the 1-worker rate scaled none / linear / "
          "sqrt, EASGD with and without one epoch of synchronous warm-up, "
          "and pmean SGD with its own tuned rate."
      ),
      base=get_config(),
      arms=tuple(arms),
      tune_seeds=(0, 1, 2),
      report_seeds=tuple(range(100, 120)),
      eval_every_steps=54,
      targets=(0.3, 0.2),
      networks=(GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET),
      configs_per_batch=4,
  )
