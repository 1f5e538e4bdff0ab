"""The paper's Figure 2 setting under the comparison protocol (MNIST-1D, CNN, p = 4).

    easgd protocol --config experiments/protocol_fig2.py \
        --workdir paper_notes/figures/protocol_fig2

Section 5.1, Figure 2 of the paper: p = 4 workers, tau in {1, 4, 16, 64},
EASGD, EAMSGD (delta 0.99), DOWNPOUR, MDOWNPOUR (tau = 1 only, as in the
paper), sequential SGD and MSGD (one worker), and beside them local SGD,
DiLoCo and pmean SGD. Here at the scale of a 2-core CPU: MNIST-1D (8000
training signals, of which 1000 are held out for validation; 2000 test
signals) and the small 1-D CNN (45k parameters) instead of CIFAR-10 and the
7-layer net. EASGD and EAMSGD run both as the paper ran them, asynchronously
(Algorithms 1 and 2 on the package's deterministic simulation: the workers
served round-robin, as the paper's master serves them, and in a seeded
random order), and synchronously (eq. (5)-(6), the package's default); the
DOWNPOUR family on the same asynchronous simulation. The cut made for
the budget: the random order at tau = 4 and 16 only (the round-robin order at
every tau). The asynchronous arms of one algorithm run as one program (tau and
the exchange order traced per configuration, as the synchronous arms' tau);
the committed run predates that and took the wall time its results.md gives,
over the 60-minute budget.

Budget: 8 epochs of the 7000 training signals at 32 examples per worker
per step, 432 local steps per worker (p = 4: 54 steps per epoch); the
sequential methods run one worker at 32 examples per step for 2 epochs
(436 steps: the same local steps, a quarter of the samples). The center is
evaluated every 27 steps (half an epoch at p = 4).

Learning rates: log-spaced rates over two decades per method (5; DOWNPOUR 6
over 2.5 decades), chosen on the validation split by the mean final validation
error of 3 seeds, a grid extended by one log step (at most 2) where its best
rate lies at an edge; reported on 10 fresh seeds at the chosen rate. Plain SGD
steps (EASGD, local SGD, DiLoCo's inner steps, pmean SGD, SGD) 0.01 .. 1;
DOWNPOUR 0.001 .. 0.32 (its center adds every worker's push); Nesterov delta =
0.99 methods (EAMSGD, MSGD) 0.001 .. 0.1; MDOWNPOUR 1e-4 .. 1e-2 (its master
adds all p workers' pushes to a momentum of 0.99). beta = 0.9 (alpha = 0.225);
DiLoCo's outer SGD: rate 0.7, Nesterov 0.9.

Seeds by power: at 3 report seeds the arms' final test errors spread by a
median standard deviation of 0.91 pp over seeds; 10 seeds per arm resolve a
difference of 1 pp at that spread at 95% (``easgd.protocol.stats.
seeds_to_resolve(0.91, 1.0)`` is 8; paired comparisons of arms that share
the seeds resolve less).
"""

from easgd.protocol.config import Arm, ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

TAUS = (1, 4, 16, 64)  # communication periods, local steps (paper)
SGD_RATES = log_grid(0.01, 1.0, 5)  # plain SGD steps
DOWNPOUR_RATES = log_grid(1e-3, 0.3162, 6)  # its center adds all p workers' pushes
MOMENTUM_RATES = log_grid(1e-3, 0.1, 5)  # delta = 0.99: eta / (1 - delta) over 0.1 .. 10
MDOWNPOUR_RATES = log_grid(1e-4, 1e-2, 5)  # master momentum over all p pushes
DELTA = 0.99  # Nesterov momentum of EAMSGD, MSGD, MDOWNPOUR
RANDOM_ORDER_TAUS = (4, 16)  # the seeded random exchange order, at these tau only (budget)


def get_config() -> TrainConfig:
  """The base setting every arm starts from (``easgd train --config`` runs it)."""
  return TrainConfig(
      algorithm="easgd",  # synchronous EASGD, eq. (5)-(6)
      dataset="mnist1d",  # 8000 train / 2000 test signals, generated from the seed
      model="cnn",  # the small 1-D CNN (45k parameters)
      num_workers=4,  # p
      global_batch_size=128,  # examples per step, all workers (32 per worker)
      num_epochs=8,  # the budget: 8 x 54 = 432 local steps per worker
      learning_rate=0.1,  # replaced by each arm's chosen rate
      optimizer="sgd",  # plain local SGD (the momentum methods need it)
      tau=4,  # communication period, local steps
      beta=0.9,  # center moving rate; alpha = beta / p (paper)
      validation_examples=1000,  # held out of the 8000 training signals
      keep_checkpoints=1,
      progress=False,
  )


def get_protocol() -> ProtocolConfig:
  arms = []
  for tau in TAUS:
    arms += [
        Arm(f"easgd tau={tau}", "easgd", dict(tau=tau), SGD_RATES),
        Arm(f"eamsgd tau={tau}", "eamsgd", dict(tau=tau, delta=DELTA), MOMENTUM_RATES),
    ]
    orders = (("round_robin", ""), ("random", " random"))
    for order, label in orders if tau in RANDOM_ORDER_TAUS else orders[:1]:
      arms += [
          Arm(
              f"async_easgd{label} tau={tau}",
              "async_easgd",
              dict(tau=tau, exchange_order=order),
              SGD_RATES,
          ),
          Arm(
              f"async_eamsgd{label} tau={tau}",
              "async_eamsgd",
              dict(tau=tau, delta=DELTA, exchange_order=order),
              MOMENTUM_RATES,
          ),
      ]
    arms += [
        Arm(f"downpour tau={tau}", "downpour", dict(tau=tau), DOWNPOUR_RATES),
        Arm(f"local_sgd tau={tau}", "local_sgd", dict(tau=tau), SGD_RATES),
        Arm(f"diloco tau={tau}", "diloco", dict(tau=tau), SGD_RATES),
    ]
  arms += [
      Arm("mdownpour tau=1", "mdownpour", dict(tau=1, delta=DELTA), MDOWNPOUR_RATES),
      Arm("pmean_sgd", "pmean_sgd", {}, SGD_RATES),
      Arm(
          "sgd (1 worker)",
          "sgd",
          dict(num_workers=1, global_batch_size=32, num_epochs=2),
          SGD_RATES,
      ),
      Arm(
          "msgd (1 worker)",
          "msgd",
          dict(num_workers=1, global_batch_size=32, num_epochs=2, delta=DELTA),
          MOMENTUM_RATES,
      ),
  ]
  return ProtocolConfig(
      name="fig2_mnist1d",
      description=(
          "The paper's Figure 2 setting (p = 4, tau in {1, 4, 16, 64}) on "
          "MNIST-1D with the small CNN, 432 local steps per worker, every "
          "method's rate tuned on a validation split."
      ),
      base=get_config(),
      arms=tuple(arms),
      tune_seeds=(0, 1, 2),  # 5 rates x 3 seeds per arm, on validation
      report_seeds=tuple(range(100, 110)),  # 10 fresh seeds at the chosen rate, on test
      eval_every_steps=27,  # half an epoch at p = 4
      targets=(0.5, 0.3, 0.2),  # test errors of "time to target"
      networks=(GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET),
      configs_per_batch=4,
  )  # configurations per call of the step program
