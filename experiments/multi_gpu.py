"""Notebook 1's runs: 1 vs 2 workers of pmean SGD at a fixed per-worker batch, and EASGD.

Fashion-MNIST, MLP, 10 epochs, batch 128 per worker, learning rate 0.05 (the
notebook's full mode). ``get_grid()`` names every run of the notebook:

    easgd train --config experiments/multi_gpu.py --workdir runs/nb1_one_worker
"""

from easgd.settings.config import TrainConfig

BATCH_PER_WORKER = 128  # examples per worker per step
EPOCHS = 10  # passes over the training set
LR = 0.05  # peak learning rate per step


def get_config() -> TrainConfig:
  """The 1-worker reference of the notebook."""
  return TrainConfig(
      dataset="fashion_mnist",
      model="mlp",
      algorithm="pmean_sgd",
      num_workers=1,
      global_batch_size=BATCH_PER_WORKER,
      num_epochs=EPOCHS,
      learning_rate=LR,
  )


def get_grid() -> dict[str, TrainConfig]:
  """Every run of notebook 1, by the name the notebook prints."""
  base, b, half = get_config(), BATCH_PER_WORKER, EPOCHS / 2
  two = dict(num_workers=2, global_batch_size=2 * b)
  grid = {
      "1 worker": base,
      "2 workers, same lr": base.replace(**two),
      "2 workers, lr x 2": base.replace(**two, learning_rate=2 * LR),
      "1 worker, decay at half (epochs)": base.replace(lr_schedule="step", lr_decay_epochs=(half,)),
      "2 workers, lr x 2, decay at half (epochs)": base.replace(
          **two, learning_rate=2 * LR, lr_schedule="step", lr_decay_epochs=(half,)
      ),
      # the 1-worker decay step, counted in steps, falls at epoch 2 * half = EPOCHS for 2
      # workers, the end of the run: it never comes (and easgd refuses it), so that run
      # is "2 workers, lr x 2"
  }
  four = dict(num_workers=4, global_batch_size=4 * b, beta=0.9)
  grid["pmean SGD"] = base.replace(**four)
  for tau in (1, 4, 16):
    grid[f"EASGD tau={tau}"] = base.replace(**four, algorithm="easgd", tau=tau)
  return grid
