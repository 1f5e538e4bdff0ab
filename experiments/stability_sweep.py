"""Notebook 2's empirical sweep: 8 tau x 8 alpha, EASGD on MNIST-1D (one compiled program).

    python experiments/stability_sweep.py --workdir runs/sweep_mnist1d

is the same as

    easgd sweep --workdir runs/sweep_mnist1d --problem network --model mlp \
      --tau 1,2,4,8,16,32,64,128 --alpha 0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.8 \
      --learning-rate 0.2 --num-workers 4 --num-steps 300
"""

import argparse

from easgd.sweeps import command, report


def get_sweep_config() -> command.SweepConfig:
  return command.SweepConfig(
      problem="network",
      model="mlp",
      dataset="mnist1d",
      tau=(1, 2, 4, 8, 16, 32, 64, 128),  # communication periods (steps)
      alpha=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8),  # moving rates
      learning_rate=(0.2,),
      num_workers=(4,),
      num_steps=300,  # steps per configuration
      per_worker_batch_size=32,
  )  # examples per worker per step


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  args = parser.parse_args()
  for result in command.run_sweep(get_sweep_config(), args.workdir).values():
    print(report.summarize(result))
