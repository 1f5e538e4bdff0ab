"""Why does accuracy drop from 1 to 2 GPUs at the same epochs? A decay counted in steps, measured.

    easgd protocol --config experiments/protocol_schedule.py \\
        --workdir paper_notes/figures/protocol_schedule --group-by num_workers

The seeds' question: a CIFAR-10 run with random crops and flips and a decay
schedule loses accuracy (86% -> 84%) when moved from 1 to 2 GPUs at the same
epochs and the same per-GPU batch. The likeliest cause is a schedule written
in steps for 1 GPU: at p GPUs an epoch has 1/p of the steps, so each decay
arrives at p times the epochs, or never. Here at the scale of a 2-core CPU
(CIFAR-10 cannot be fetched; experiments/cifar10.py runs the same arms on a
CIFAR-10 directory the user gives):

* the task: 10000 Fashion-MNIST training images (a fixed subset, 2000 of them
  held out for validation) and 5000 test images, random 24x24 crops and
  horizontal flips drawn from (seed, epoch, step), centre crops for
  evaluation, the small CNN with BatchNorm (``cnn_bn``: each worker normalises
  its own mini-batch), experiments/tasks.py ``fashion_subset``;
* pmean SGD at 32 examples per worker, heavy-ball momentum 0.9, weight decay
  5e-4, 10 epochs for every p (equal samples: p = 1 takes 2500 steps, p = 2
  1250, p = 4 625), a step decay x 0.1 at epochs 5 and 7.5 (half and three
  quarters of the run, as CIFAR recipes do);
* "1 worker": its rate chosen from 5 log-spaced rates over two decades on the
  validation split (3 tuning seeds, a grid extended by one log step, at most
  2, at an edge): the rate the rules scale (lr_reference_batch = 32);
* p = 2 and 4, each with the decay counted per epoch (``lr_schedule_unit``
  "epochs": at epochs 5 and 7.5 for every p) and per step of the 1-worker run
  (``lr_schedule_unit`` "reference_steps": at steps 1250 and 1875, i.e.
  epochs 10 and 15 at p = 2 and 20 and 30 at p = 4, past the run's end: the
  decay never comes), crossed with the 1-worker rate unchanged (``none``),
  the linear rule (x p, Goyal et al. 2017) with 1 epoch of linear warm-up
  (counted in the same unit as the decay), and the square-root rule
  (x sqrt p).

Reported on 6 fresh seeds that every arm shares (seed i: the same
initialisation; the global batch of each step fixed by (seed, epoch, step)),
so differences to "1 worker" are paired per seed. Each arm reports its final
test error, test loss and training loss (the workers' mean loss over the last
evaluation interval), which answers the seeds' "lower loss, lower accuracy"
from the same runs. The cut that keeps the run within an hour on 2 cores:
the subset of the data, 10 epochs, and no arm with a p-worker rate tuned on
its own (the rules are what the question asks about).
"""

from easgd.protocol.config import Arm, ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

BATCH = 32  # examples per worker per step
RATES = log_grid(0.003, 0.3, 5)  # heavy-ball momentum 0.9: eta / (1 - 0.9) over 0.03 .. 3
RULES = ("none", "linear", "sqrt")
UNITS = {"epochs": "per epoch", "reference_steps": "per step"}
WORKERS = (2, 4)
WARMUP_EPOCHS = 1.0  # of the linear rule (in the decay's unit)


def get_config() -> TrainConfig:
  """The 1-worker reference (``easgd train --config`` runs it)."""
  return TrainConfig(
      algorithm="pmean_sgd",
      task="experiments.tasks:fashion_subset",  # 10000 train (2000 held out), 5000 test
      num_workers=1,
      global_batch_size=BATCH,
      num_epochs=10,  # equal samples for every p
      learning_rate=0.03,  # replaced by the chosen rate
      lr_schedule="step",
      lr_decay_epochs=(5.0, 7.5),
      lr_decay_factor=0.1,
      optimizer="momentum",
      momentum=0.9,
      weight_decay=5e-4,
      validation_examples=2000,
      keep_checkpoints=1,
      progress=False,
  )


def arm_overrides(p: int, unit: str, rule: str) -> dict:
  """The TrainConfig fields of the arm at p workers, schedule unit and rate rule."""
  out = dict(num_workers=p, global_batch_size=BATCH * p, lr_schedule_unit=unit)
  if rule != "none":
    out["lr_scaling"] = rule
  if rule == "linear":
    out["warmup_epochs"] = WARMUP_EPOCHS
  if rule != "none" or unit == "reference_steps":
    out["lr_reference_batch"] = BATCH
  return out


def schedule_arms(batch: int = BATCH, rates=RATES, workers=WORKERS) -> tuple[Arm, ...]:
  """The experiment's arms at ``batch`` examples per worker: "1 worker" with
  the rate grid ``rates``, then for each p of ``workers``, each unit of
  :data:`UNITS` and each rule of :data:`RULES` pmean SGD at the 1-worker rate
  (experiments/cifar10.py runs the same arms on CIFAR-10)."""
  arms = [Arm("1 worker", "pmean_sgd", {}, rates)]
  for p in workers:
    for unit, label in UNITS.items():
      for rule in RULES:
        overrides = arm_overrides(p, unit, rule)
        overrides.update(global_batch_size=batch * p)
        if "lr_reference_batch" in overrides:
          overrides["lr_reference_batch"] = batch
        arms.append(Arm(f"p={p} {label} {rule}", "pmean_sgd", overrides, lr_from="1 worker"))
  return tuple(arms)


def get_protocol() -> ProtocolConfig:
  return ProtocolConfig(
      name="schedule_workers",
      description=(
          "1 vs 2 vs 4 workers at 32 examples per worker and 10 epochs (equal "
          "samples) on a Fashion-MNIST subset with random crops and flips and "
          "the BatchNorm CNN: a step decay at epochs 5 and 7.5 counted per epoch "
          "or per step of the 1-worker run, crossed with the 1-worker rate "
          "scaled none / linear (with warm-up) / sqrt."
      ),
      base=get_config(),
      arms=schedule_arms(),
      tune_seeds=(0, 1, 2),
      report_seeds=tuple(range(100, 106)),
      eval_every_steps=125,  # 1 epoch at p = 2
      targets=(0.2,),
      networks=(GIGABIT_ETHERNET,),
      eval_chunk=5000,  # one chunk: the BatchNorm statistics computed once per evaluation
      configs_per_batch=1,  # vmapped 2-D convolutions cost ~4x the configurations in turn here
  )
