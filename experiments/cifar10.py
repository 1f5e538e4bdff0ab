"""The paper's CIFAR-10 experiments (Section 5.1): the 7-layer net on 28x28 crops.

For users with a GPU and the data. CIFAR-10 is never downloaded: unpack
cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) and point
the environment variable CIFAR10_DIR at the folder (either cifar-10-batches-py/
or the folder that contains it); unset, it is "data/cifar-10-batches-py",
relative to the working directory. The directory is read when training starts,
not by get_config() or TrainConfig.validate().

Fixed as in the paper: model (3,28) C(64,24) P(64,12) C(128,8) P(128,4) C(64,2)
D(256,1) S(10,1) with dropout 0.5 and zero biases; random 28x28 training crops and
the centre crop for testing; mini-batch 128 per worker; L2 weight decay 1e-4;
beta = 0.9 (alpha = 0.9 / p); Nesterov momentum 0.99 for EAMSGD. Not from the
paper: the learning rates (its grid is unpublished; LEARNING_RATES below are
untuned starting points, sweep them), the epoch count (the paper plots against
wall-clock time), and synchronous execution (the paper ran the asynchronous
variants; "async_easgd" / "async_eamsgd" are the closer match, pass them to
get_grid).

Run the default (EASGD, p = 4, tau = 4):
  CIFAR10_DIR=/data/cifar-10-batches-py easgd train --config experiments/cifar10.py \
      --workdir runs/cifar10/easgd_p4_tau4
One variant of the grid from the command line (flags override the file):
  easgd train --config experiments/cifar10.py --algorithm eamsgd --delta 0.99 \
      --learning-rate 0.005 --num-workers 8 --global-batch-size 1024 --tau 16 \
      --workdir runs/cifar10/eamsgd_p8_tau16
The whole grid from Python:
  import runpy, easgd.run.trainer
  grid = runpy.run_path("experiments/cifar10.py")["get_grid"]()
  for name, cfg in grid.items():
      easgd.run.trainer.train_and_evaluate(cfg, f"runs/cifar10/{name}")

The schedule question on CIFAR-10 (get_protocol(): the arms of
experiments/protocol_schedule.py, 1 vs 2 vs 4 workers at equal epochs with a
step decay counted per epoch or per step of the 1-worker run, crossed with
the rate rules), with the BatchNorm CNN on random 28x28 crops and flips, 128
examples per worker, heavy-ball momentum 0.9, weight decay 5e-4, 30 epochs,
decays x 0.1 at epochs 15 and 22.5:
  CIFAR10_DIR=/data/cifar-10-batches-py easgd protocol --config experiments/cifar10.py \
      --workdir runs/cifar10/schedule --group-by num_workers
"""

import os
import runpy
from pathlib import Path

from easgd.methods.registry import ALGORITHMS
from easgd.protocol.config import ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

PER_WORKER_BATCH = 128  # examples per worker per step (paper)
PAPER_NUM_WORKERS = (4, 8, 16)  # p (paper: CIFAR p in {4, 8, 16})
PAPER_TAUS = (1, 4, 16, 64)  # communication periods, local steps (paper, p = 4)
PAPER_ALGORITHMS = ("easgd", "eamsgd", "downpour")  # listed if registered
LEARNING_RATES = {  # eta per local step; untuned starting points
    "easgd": 0.05,
    "async_easgd": 0.05,
    "eamsgd": 0.005,
    "async_eamsgd": 0.005,  # with Nesterov delta 0.99 (default)
    "downpour": 0.01,  # the center receives all p workers' pushes
}


def get_config() -> TrainConfig:
  return TrainConfig(
      algorithm="easgd",  # synchronous EASGD, eq. (5)-(6)
      dataset="cifar10",  # 50000 train / 10000 test images, 32x32x3
      data_dir=os.path.expanduser(  # CIFAR-10 python batches (never downloaded)
          os.environ.get("CIFAR10_DIR", "data/cifar-10-batches-py")
      ),
      crop_size=28,  # pixels: random 28x28 train crops, centre crop test
      model="cifar",  # the paper's 7-layer net, dropout 0.5, biases 0
      num_workers=4,  # p
      global_batch_size=4 * PER_WORKER_BATCH,  # examples per step, all workers
      num_epochs=100,  # passes over the training set
      learning_rate=LEARNING_RATES["easgd"],  # eta, per local step (constant)
      lr_schedule="constant",  # the paper's eta is a constant
      optimizer="sgd",  # plain local SGD (momentum algorithms need it)
      weight_decay=1e-4,  # L2 coefficient added to the gradient (paper)
      tau=4,  # communication period, local steps
      beta=0.9,  # center moving rate; alpha = beta / p (paper)
      eval_batch_size=500,  # test examples per worker per evaluation batch
      seed=0,  # initial parameters, data order and crops
  )


def get_grid(
    num_workers=PAPER_NUM_WORKERS, taus=PAPER_TAUS, algorithms=None
) -> dict[str, TrainConfig]:
  """The paper's CIFAR-10 variants, every (algorithm, p, tau), as TrainConfigs.

  Each variant overrides get_config() only in: algorithm, num_workers,
  global_batch_size (128 per worker), tau and learning_rate (LEARNING_RATES);
  the momentum methods take the default Nesterov delta = 0.99 (the paper's).

  Args:
    num_workers: the values of p (paper: 4, 8, 16).
    taus: the communication periods, in local steps (paper: 1, 4, 16, 64;
      its tau sweep was at p = 4, so the cross product is a superset).
    algorithms: names of ``easgd.methods.registry.ALGORITHMS``; None = those of
      PAPER_ALGORITHMS ("easgd", "eamsgd", "downpour") that are registered.

  Returns:
    ``{"<algorithm>_p<p>_tau<tau>": TrainConfig}`` in the order algorithm, p,
    tau; 36 entries by default.

  Raises:
    easgd.settings.config.ConfigError: an unknown algorithm or a bad p or tau.
  """
  if algorithms is None:
    algorithms = [a for a in PAPER_ALGORITHMS if a in ALGORITHMS]
  base = get_config()
  grid = {}
  for algorithm in algorithms:
    for p in num_workers:
      for tau in taus:
        grid[f"{algorithm}_p{p}_tau{tau}"] = base.replace(
            algorithm=algorithm,
            num_workers=p,  # p
            global_batch_size=p * PER_WORKER_BATCH,  # 128 examples per worker
            tau=tau,  # local steps
            learning_rate=LEARNING_RATES.get(algorithm, base.learning_rate),
        ).validate()
  return grid


SCHEDULE = runpy.run_path(str(Path(__file__).with_name("protocol_schedule.py")))
"""experiments/protocol_schedule.py's names (its arms, read by get_protocol)."""


def get_protocol() -> ProtocolConfig:
  """The schedule question (experiments/protocol_schedule.py) on CIFAR-10."""
  base = TrainConfig(
      algorithm="pmean_sgd",
      dataset="cifar10",
      data_dir=get_config().data_dir,  # CIFAR10_DIR
      crop_size=28,  # random 28x28 training crops, the centre crop for evaluation
      random_flip=True,  # and horizontal flips
      model="cnn_bn",  # BatchNorm: each worker normalises its own mini-batch
      num_workers=1,
      global_batch_size=PER_WORKER_BATCH,
      num_epochs=30,
      learning_rate=0.1,  # replaced by the chosen rate
      lr_schedule="step",
      lr_decay_epochs=(15.0, 22.5),
      lr_decay_factor=0.1,
      optimizer="momentum",
      momentum=0.9,
      weight_decay=5e-4,
      validation_examples=5000,  # held out of the 50000 training images
      keep_checkpoints=1,
      progress=False,
  )
  return ProtocolConfig(
      name="schedule_workers_cifar10",
      description=(
          "1 vs 2 vs 4 workers at 128 examples per worker and 30 epochs on CIFAR-10 "
          "with random crops and flips and the BatchNorm CNN: a step decay counted "
          "per epoch or per step of the 1-worker run, crossed with the 1-worker "
          "rate scaled none / linear (with warm-up) / sqrt."
      ),
      base=base,
      arms=SCHEDULE["schedule_arms"](PER_WORKER_BATCH, log_grid(0.01, 1.0, 5)),
      tune_seeds=(0, 1, 2),
      report_seeds=tuple(range(100, 106)),
      eval_every_steps=195,  # 1 epoch at p = 2 (45000 / 256 steps)
      targets=(0.2,),
      networks=(GIGABIT_ETHERNET,),
      eval_chunk=5000,
      configs_per_batch=1,
  )
