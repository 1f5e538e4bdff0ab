"""EASGD, EAMSGD and pmean SGD on the Transformer example under the comparison protocol.

    python examples/make_data.py text --out runs/data/gpl3.txt
    easgd protocol --config examples/protocol_lm.py --workdir examples/outputs/transformer_lm_protocol

A user task (``examples.transformer_lm:make_task``) through ``easgd
protocol``: every method's learning rate chosen on a validation split held out
of the training windows, then rerun on fresh seeds on the test text
(``easgd.protocol.runs``). Sized to a 2-core CPU (the run time is in
results.md):

* the text: the GNU GPL version 3 (``examples/make_data.py``'s default,
  35,149 bytes): 988 training windows of 33 bytes, of which 128 are held out
  for validation, and 109 test windows;
* a smaller model than the example's default (1 block, d_model 32);
* 4 workers, 16 windows per worker per step (13 steps per epoch), 6 epochs;
* EASGD (tau 4) and pmean SGD with Adam locally, EAMSGD (tau 4, delta 0.99)
  with its own momentum (it needs plain SGD locally); 3 log-spaced rates per
  method over one decade, 3 tuning seeds, 3 report seeds.

The error is the next-byte error (one minus the next-byte accuracy). The
text's path is a task argument: ``--task-arg path=FILE --task-arg
context=32 ...`` replaces the file's task arguments.
"""

from easgd.protocol.config import Arm, ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

TASK_ARGS = ("path=runs/data/gpl3.txt", "context=32", "d_model=32", "num_layers=1")
ADAM_RATES = log_grid(3e-3, 3e-2, 3)  # base learning rates of Adam
MOMENTUM_RATES = log_grid(0.03, 0.3, 3)  # EAMSGD: plain SGD, momentum delta = 0.99


def get_config() -> TrainConfig:
  return TrainConfig(
      algorithm="easgd",
      task="examples.transformer_lm:make_task",
      task_args=TASK_ARGS,
      num_workers=4,
      global_batch_size=64,  # 16 windows per worker per step
      num_epochs=6,  # 13 steps per epoch on the 860 windows left for training
      learning_rate=0.003,  # replaced by each arm's chosen rate
      optimizer="adam",
      tau=4,
      beta=0.9,
      validation_examples=128,  # windows held out of the 988 training windows
      keep_checkpoints=1,
      progress=False,
  )


def get_protocol() -> ProtocolConfig:
  arms = (
      Arm("easgd tau=4", "easgd", dict(tau=4), ADAM_RATES),
      Arm("eamsgd tau=4", "eamsgd", dict(tau=4, delta=0.99, optimizer="sgd"), MOMENTUM_RATES),
      Arm("pmean_sgd", "pmean_sgd", {}, ADAM_RATES),
  )
  return ProtocolConfig(
      name="transformer_lm",
      description=(
          "EASGD (tau 4) and pmean SGD with Adam locally and EAMSGD (tau 4) on the "
          "byte-level Transformer example (1 block, d_model 32) over the GNU GPL "
          "version 3, p = 4, 6 epochs, 3 rates x 3 seeds per method on a "
          "validation split of 128 windows."
      ),
      base=get_config(),
      arms=arms,
      tune_seeds=(0, 1, 2),
      report_seeds=(100, 101, 102),
      eval_every_steps=13,  # about once per epoch
      targets=(0.75, 0.7),  # next-byte errors
      networks=(GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET),
  )
