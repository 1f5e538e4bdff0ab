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

from easgd.settings.config import TrainConfig

TAUS = (1, 4, 16)  # communication periods, local steps
BETAS = (0.1, 0.3, 0.9, 1.8)  # center moving rates; alpha = beta / p
EPOCHS = 10


def get_config() -> TrainConfig:
  # The package's defaults are this experiment's base: synchronous EASGD on MNIST-1D
  # (8000 / 2000 signals) with the small 1-D CNN, p = 4, 128 examples per step (32 per
  # worker), plain SGD at eta = 0.1 per local step, tau = 4, beta = 0.9, seed 0.
  return TrainConfig().replace(
      num_epochs=EPOCHS,  # passes over the training set
      keep_checkpoints=1,  # the notebook reads the final checkpoint only
      progress=False,
  )


def get_grid() -> dict[str, TrainConfig]:
  """``{"tau<tau>_beta<beta>": TrainConfig}``: 12 runs."""
  base = get_config()
  return {f"tau{t}_beta{b:g}": base.replace(tau=t, beta=b).validate() for t in TAUS for b in BETAS}
