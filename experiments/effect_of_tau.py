"""Effect of the communication period tau (paper, Section 5.1, Figure 2), small scale.

The configs of notebooks/03_effect_of_tau.ipynb (full mode): EASGD, EAMSGD and
DOWNPOUR at tau in {1, 4, 16, 64} with p = 4, and the two methods that do not
depend on tau, MSGD and pmean SGD, run once as references. MNIST-1D and the small
1-D CNN instead of CIFAR-10 and the paper's 7-layer net; 8 epochs; 32 examples
per worker per step (global batch 128). Synchronous EASGD/EAMSGD (the paper ran
the asynchronous variants), DOWNPOUR simulated asynchronously (round-robin
exchanges, ``easgd.asynchrony.simulation``).

Learning rates (the paper's per-method grid is not published; these are fixed by
a rule, not tuned): eta = 0.1 for the SGD-type methods (the project default);
Nesterov momentum delta = 0.9 with eta = 0.01 for EAMSGD and MSGD, the same
effective step eta / (1 - delta) = 0.1; DOWNPOUR at eta = 0.1 and, as a check at
the large periods, at eta = 0.1 / p = 0.025 (its center adds all p workers'
pushes). beta = 0.9 (alpha = 0.9 / p) as in the paper.

Run one variant:
  easgd train --config experiments/effect_of_tau.py --algorithm eamsgd --delta 0.9 \
      --learning-rate 0.01 --tau 16 --workdir runs/effect_of_tau/eamsgd_tau16
All of them:
  import runpy, easgd
  for name, cfg in runpy.run_path("experiments/effect_of_tau.py")["get_grid"]().items():
      easgd.train_and_evaluate(cfg, f"runs/effect_of_tau/{name}")
"""

from easgd.settings.config import TrainConfig

TAUS = (1, 4, 16, 64)  # communication periods, local steps (paper, p = 4)
NUM_WORKERS = 4  # p
EPOCHS = 8  # passes over the 8000 training signals
LEARNING_RATE = 0.1  # eta of the SGD-type methods
DELTA = 0.9  # Nesterov delta of EAMSGD and MSGD
MOMENTUM_LEARNING_RATE = 0.01  # eta of EAMSGD and MSGD: eta / (1 - delta) = 0.1
DOWNPOUR_CHECK_TAUS = (16, 64)  # DOWNPOUR also at eta / p at these periods
ELASTIC = ("easgd", "eamsgd", "downpour")  # the methods swept over tau
REFERENCES = ("msgd", "pmean_sgd")  # no tau: run once


def get_config() -> TrainConfig:
  return TrainConfig(
      algorithm="easgd",  # synchronous EASGD, eq. (5)-(6)
      dataset="mnist1d",  # 8000 train / 2000 test signals, generated locally
      model="cnn",  # the small 1-D CNN
      num_workers=NUM_WORKERS,  # p
      global_batch_size=128,  # examples per step, all workers (32 per worker)
      num_epochs=EPOCHS,  # passes over the training set
      learning_rate=LEARNING_RATE,  # eta, per local step (constant)
      optimizer="sgd",  # plain local SGD (the momentum methods need it)
      tau=4,  # communication period, local steps
      beta=0.9,  # center moving rate; alpha = beta / p (paper)
      keep_checkpoints=1,
      progress=False,
      seed=0,
  )


def variant(
    base: TrainConfig, algorithm: str, tau: int | None = None, learning_rate: float | None = None
) -> TrainConfig:
  """``base`` for ``algorithm`` (at ``tau``), with its learning rate and delta."""
  momentum = algorithm in ("eamsgd", "msgd")
  lr = learning_rate or (MOMENTUM_LEARNING_RATE if momentum else LEARNING_RATE)
  return base.replace(
      algorithm=algorithm,
      tau=tau or base.tau,
      learning_rate=lr,
      **(dict(delta=DELTA) if momentum else {}),
  ).validate()


def get_grid() -> dict[str, TrainConfig]:
  """``{"<algorithm>_tau<tau>" or "<algorithm>": TrainConfig}``: 12 + 2 + 2 runs."""
  base = get_config()
  grid = {f"{a}_tau{t}": variant(base, a, t) for a in ELASTIC for t in TAUS}
  grid.update({a: variant(base, a) for a in REFERENCES})
  for t in DOWNPOUR_CHECK_TAUS:
    grid[f"downpour_tau{t}_lr{LEARNING_RATE / NUM_WORKERS:g}"] = variant(
        base, "downpour", t, LEARNING_RATE / NUM_WORKERS
    )
  return grid
