"""Effect of the number of workers p (paper, Section 5.1, Figure 3), small scale.

The configs of notebooks/04_effect_of_p.ipynb (full mode): EASGD and EAMSGD with
p in {4, 8, 16} at a fixed per-worker batch (32 examples, so the global batch
grows with p: 128, 256, 512) and a fixed communication period tau = 4, beta = 0.9
(alpha = 0.9 / p). Every p runs (about) the same number of local steps per
worker: 496 = 8 epochs at p = 4, 16 at p = 8; 480 = 32 epochs of 15 steps at
p = 16. In the paper each worker has its own GPU, so wall-clock time is
proportional to the local steps and larger p processes more samples in the same
time. MNIST-1D and the small 1-D CNN instead
of CIFAR-10. Learning rates as in experiments/effect_of_tau.py (eta = 0.1;
EAMSGD: delta = 0.9, eta = 0.01). DOWNPOUR is left out: its asynchronous
simulation took about twice as long as EASGD per run at p = 4 in notebook 03 and
costs more at p = 16 (one all-reduce of all p parameter copies per step), too
slow for a 2-core CPU.

Run one variant:
  easgd train --config experiments/effect_of_p.py --num-workers 16 \
      --global-batch-size 512 --num-epochs 32 --workdir runs/effect_of_p/easgd_p16
All of them:
  import runpy, easgd
  for name, cfg in runpy.run_path("experiments/effect_of_p.py")["get_grid"]().items():
      easgd.train_and_evaluate(cfg, f"runs/effect_of_p/{name}")
"""

from easgd.settings.config import TrainConfig

NUM_WORKERS = (4, 8, 16)  # p (paper, CIFAR-10)
PER_WORKER_BATCH = 32  # examples per worker per step
BASE_EPOCHS = 8  # epochs at p = 4; p workers run BASE_EPOCHS * p / 4
TAU = 4  # communication period, local steps
LEARNING_RATE = 0.1  # eta of EASGD
DELTA = 0.9  # Nesterov delta of EAMSGD
MOMENTUM_LEARNING_RATE = 0.01  # eta of EAMSGD: eta / (1 - delta) = 0.1
ALGORITHMS = ("easgd", "eamsgd")


def get_config() -> TrainConfig:
  return TrainConfig(
      algorithm="easgd",  # synchronous EASGD, eq. (5)-(6)
      dataset="mnist1d",  # 8000 train / 2000 test signals, generated locally
      model="cnn",  # the small 1-D CNN
      num_workers=4,  # p
      global_batch_size=4 * PER_WORKER_BATCH,  # grows with p (get_grid)
      num_epochs=BASE_EPOCHS,  # passes over the training set, at p = 4
      learning_rate=LEARNING_RATE,  # eta, per local step (constant)
      optimizer="sgd",
      tau=TAU,  # communication period, local steps
      beta=0.9,  # center moving rate; alpha = beta / p (paper)
      keep_checkpoints=1,
      progress=False,
      seed=0,
  )


def get_grid() -> dict[str, TrainConfig]:
  """``{"<algorithm>_p<p>": TrainConfig}``: the same local steps for every p."""
  base = get_config()
  grid = {}
  for a in ALGORITHMS:
    for p in NUM_WORKERS:
      momentum = a == "eamsgd"
      grid[f"{a}_p{p}"] = base.replace(
          algorithm=a,
          num_workers=p,
          global_batch_size=p * PER_WORKER_BATCH,
          num_epochs=BASE_EPOCHS * p // 4,
          learning_rate=MOMENTUM_LEARNING_RATE if momentum else LEARNING_RATE,
          **(dict(delta=DELTA) if momentum else {}),
      ).validate()
  return grid
