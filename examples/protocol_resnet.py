"""EASGD, EAMSGD and pmean SGD on the ResNet (BatchNorm) example under the comparison protocol.

    python examples/make_data.py images --source digits --out runs/data/digits.npz
    easgd protocol --config examples/protocol_resnet.py --workdir examples/outputs/resnet_cnn_protocol

A user task with BatchNorm (``examples.resnet_cnn:make_task``, its
``center_state``) through ``easgd protocol``: each evaluation of the center
normalises with statistics recomputed from the evaluated parameters over the
run's ``bn_stats_examples`` fixed training examples, as ``easgd train`` does.
No random crops: the protocol refuses a task with ``augment``. Sized to a
2-core CPU (the run time is in results.md):

* scikit-learn's 8x8 digits, all of them (``make_data.py images --source
  digits``): 1438 training images, of which 238 are held out for
  validation, and 359 test images;
* a smaller ResNet than the example's default (2 blocks, 8/16 channels);
* 4 workers, 32 images per worker per step (9 steps per epoch), 8 epochs;
  the center's statistics from 512 training images;
* EASGD (tau 4) and pmean SGD with plain SGD locally, EAMSGD (tau 4, delta
  0.99); 3 log-spaced rates per method over one decade, 3 tuning seeds,
  3 report seeds.
"""

from easgd.protocol.config import Arm, ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

TASK_ARGS = ("path=runs/data/digits.npz", "width=8", "blocks=2")
SGD_RATES = log_grid(0.3, 3.0, 3)
PMEAN_RATES = log_grid(1.0, 10.0, 3)  # pmean SGD: up to a rate where it diverges
MOMENTUM_RATES = log_grid(0.03, 0.3, 3)  # EAMSGD: its step is about 1 / (1 - delta) larger


def get_config() -> TrainConfig:
  return TrainConfig(
      algorithm="easgd",
      task="examples.resnet_cnn:make_task",
      task_args=TASK_ARGS,
      num_workers=4,
      global_batch_size=128,  # 32 images per worker per step
      num_epochs=8,  # 9 steps per epoch on the 1200 images left for training
      learning_rate=0.1,  # replaced by each arm's chosen rate
      optimizer="sgd",
      tau=4,
      beta=0.9,
      validation_examples=238,  # held out of the 1438 training images
      bn_stats_examples=512,  # the center's BatchNorm statistics: 128 images per worker
      keep_checkpoints=1,
      progress=False,
  )


def get_protocol() -> ProtocolConfig:
  arms = (
      Arm("easgd tau=4", "easgd", dict(tau=4), SGD_RATES),
      Arm("eamsgd tau=4", "eamsgd", dict(tau=4, delta=0.99), MOMENTUM_RATES),
      Arm("pmean_sgd", "pmean_sgd", {}, PMEAN_RATES),
  )
  return ProtocolConfig(
      name="resnet_cnn",
      description=(
          "EASGD (tau 4), EAMSGD (tau 4) and pmean SGD on the ResNet example with "
          "BatchNorm (2 blocks, 8/16 channels) over scikit-learn's 8x8 digits, "
          "p = 4, 8 epochs, 3 rates x 3 seeds per method on a validation split "
          "of 238 images; the center evaluated with statistics recomputed from it."
      ),
      base=get_config(),
      arms=arms,
      tune_seeds=(0, 1, 2),
      report_seeds=(100, 101, 102),
      eval_every_steps=9,  # once per epoch
      targets=(0.2, 0.1),
      networks=(GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET),
  )
