"""The Figure 2 methods on Fashion-MNIST under the comparison protocol (MLP, p = 4).

    easgd protocol --config experiments/protocol_fashion.py \
        --workdir paper_notes/figures/protocol_fashion

The methods of experiments/protocol_fig2.py at p = 4 and tau in {4, 16}
(MDOWNPOUR at tau = 1 only, as in the paper) on Fashion-MNIST (Debian's IDX
files; 60000 training images, of which 5000 are held out for validation;
10000 test images), sized to this project's 2-core CPU (the run time is in results.md):

* the MLP (269k parameters), not the CNN: on this CPU one step of the CNN on
  4 x 32 images costs about 20 times the MLP's (XLA:CPU convolutions at this
  size), which would leave under one epoch for the whole grid;
* 2 epochs for the p = 4 arms (2 x 429 = 858 local steps per worker at 32
  examples per worker); the sequential methods (one worker, 32 examples per
  step) run 1 epoch, the least whole-epoch budget: 1718 local steps, twice the
  others' steps and half their samples;
* EASGD and EAMSGD both synchronously (eq. (5)-(6)) and as the paper ran
  them, asynchronously (Algorithms 1 and 2 on the package's deterministic
  simulation, the workers served round-robin as the paper's master serves
  them; the seeded random order is cut here for the budget: it is measured
  in experiments/protocol_fig2.py);
* 3 log-spaced rates per method over one decade (3 tuning seeds each), a
  grid extended by one log step (at most 2) where its best rate lies at an
  edge; the center evaluated every 78 steps;
* seeds by power: at 3 report seeds the arms' final test errors spread by
  0.11 to 2.92 pp over seeds (median 0.39 pp, 11 of 14 arms at most
  0.61 pp); 5 report seeds resolve a difference of 1 pp at a spread of
  0.61 pp at 95% (``easgd.protocol.stats.seeds_to_resolve(0.61, 1.0)`` is 5;
  paired comparisons of arms that share the seeds resolve less).
"""

from easgd.protocol.config import Arm, ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

TAUS = (4, 16)
SGD_RATES = log_grid(0.03, 0.3, 3)
DOWNPOUR_RATES = log_grid(0.01, 0.1, 3)
MOMENTUM_RATES = log_grid(3e-3, 3e-2, 3)
MDOWNPOUR_RATES = log_grid(3e-4, 3e-3, 3)
DELTA = 0.99


def get_config() -> TrainConfig:
  return TrainConfig(
      algorithm="easgd",
      dataset="fashion_mnist",
      model="mlp",
      num_workers=4,
      global_batch_size=128,  # 32 per worker
      num_epochs=2,  # 858 local steps per worker
      learning_rate=0.1,  # replaced by each arm's chosen rate
      optimizer="sgd",
      tau=4,
      beta=0.9,
      validation_examples=5000,  # held out of the 60000 training images
      keep_checkpoints=1,
      progress=False,
  )


def get_protocol() -> ProtocolConfig:
  arms = []
  for tau in TAUS:
    arms += [
        Arm(f"easgd tau={tau}", "easgd", dict(tau=tau), SGD_RATES),
        Arm(f"eamsgd tau={tau}", "eamsgd", dict(tau=tau, delta=DELTA), MOMENTUM_RATES),
        Arm(
            f"async_easgd tau={tau}",
            "async_easgd",
            dict(tau=tau, exchange_order="round_robin"),
            SGD_RATES,
        ),
        Arm(
            f"async_eamsgd tau={tau}",
            "async_eamsgd",
            dict(tau=tau, delta=DELTA, exchange_order="round_robin"),
            MOMENTUM_RATES,
        ),
        Arm(f"downpour tau={tau}", "downpour", dict(tau=tau), DOWNPOUR_RATES),
        Arm(f"local_sgd tau={tau}", "local_sgd", dict(tau=tau), SGD_RATES),
        Arm(f"diloco tau={tau}", "diloco", dict(tau=tau), SGD_RATES),
    ]
  sequential = dict(num_workers=1, global_batch_size=32, num_epochs=1)
  arms += [
      Arm("mdownpour tau=1", "mdownpour", dict(tau=1, delta=DELTA), MDOWNPOUR_RATES),
      Arm("pmean_sgd", "pmean_sgd", {}, SGD_RATES),
      Arm("sgd (1 worker)", "sgd", sequential, SGD_RATES),
      Arm("msgd (1 worker)", "msgd", dict(sequential, delta=DELTA), MOMENTUM_RATES),
  ]
  return ProtocolConfig(
      name="fashion_mlp",
      description=(
          "The Figure 2 methods at p = 4, tau in {4, 16} on Fashion-MNIST with "
          "the MLP, EASGD and EAMSGD synchronous and asynchronous, 858 local "
          "steps per worker (2 epochs), 3 rates x 3 seeds per method on a "
          "validation split, 5 report seeds: a grid sized to this 2-core CPU "
          "(the run time is in results.md)."
      ),
      base=get_config(),
      arms=tuple(arms),
      tune_seeds=(0, 1, 2),
      report_seeds=(100, 101, 102, 103, 104),
      eval_every_steps=78,
      targets=(0.3, 0.2, 0.16),
      networks=(GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET),
      configs_per_batch=4,
  )
