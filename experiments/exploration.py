"""Exploration: how far the workers drift from the center, against tau and beta.

The configs of notebooks/05_exploration.ipynb (full mode): EASGD at p = 4 with
tau in {1, 4, 16} and beta in {0.1, 0.3, 0.9, 1.8} (alpha = beta / p in {0.025,
0.075, 0.225, 0.45}; beta = 1.8 diverged at every tau with eta = 0.1), MNIST-1D and the small 1-D CNN, 32 examples per worker per step, eta =
0.1, 10 epochs. The notebook reads the mean worker-center distance from the
metrics and evaluates every worker of the final checkpoint against the center.

Run one variant:
  easgd train --config experiments/exploration.py --tau 16 --beta 0.3 \
      --workdir runs/exploration/tau16_beta0.3
"""
from easgd.config import TrainConfig

TAUS = (1, 4, 16)                  # communication periods, local steps
BETAS = (0.1, 0.3, 0.9, 1.8)       # center moving rates; alpha = beta / p
EPOCHS = 10


def get_config() -> TrainConfig:
  return TrainConfig(
      algorithm="easgd",           # synchronous EASGD, eq. (5)-(6)
      dataset="mnist1d",           # 8000 train / 2000 test signals, generated locally
      model="cnn",                 # the small 1-D CNN
      num_workers=4,               # p
      global_batch_size=128,       # examples per step, all workers (32 per worker)
      num_epochs=EPOCHS,           # passes over the training set
      learning_rate=0.1,           # eta, per local step (constant)
      optimizer="sgd",
      tau=4,                       # communication period, local steps
      beta=0.9,                    # center moving rate; alpha = beta / p
      keep_checkpoints=1,
      progress=False,
      seed=0,
  )


def get_grid() -> dict[str, TrainConfig]:
  """``{"tau<tau>_beta<beta>": TrainConfig}``: 12 runs."""
  base = get_config()
  return {f"tau{t}_beta{b:g}": base.replace(tau=t, beta=b).validate()
          for t in TAUS for b in BETAS}
