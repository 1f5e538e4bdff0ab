"""Training: config, data, batches, models, optimizers, checkpoints, run directory, the run loop, export, comparisons."""
