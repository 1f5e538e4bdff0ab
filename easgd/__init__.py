"""easgd: Elastic Averaging SGD (Zhang, Choromanska & LeCun, NeurIPS 2015) on JAX.

Where things live (the layers, bottom up: core, parallel, analysis, training,
face; README "Architecture"):
  easgd.elastic     the update rules (eq. 5-6), the worker axis names, sums
                    across workers in float32, pure pytree functions
  easgd.momentum    the local step: Nesterov momentum (eq. 7) and the one
                    loss-and-gradient of every algorithm (model state included)
  easgd.algorithms  per-worker (init, step) pairs: EASGD and EAMSGD (one rule),
                    the one-model core of pmean SGD and the sequential methods
  easgd.async_schedule  the simulated time model: ticks, speeds, exchange orders
  easgd.asynchronous  Algorithms 1-2 (and the DOWNPOUR engine) simulated on it,
                    and their per-event rules
  easgd.async_log   the exchange log of a run and its replay
  easgd.baselines   DOWNPOUR family, sequential SGD/MSGD/ASGD/MVASGD, local
                    SGD, DiLoCo
  easgd.registry    the algorithm table: factories, the settings each reads
  easgd.workers     the worker mapping (pmap or shard_map over devices of vmap
                    over workers)
  easgd.distributed multi-process runs: jax.distributed setup, peer watchdog
  easgd.async_shared, async_threads, async_ray, async_driver
                    real asynchronous workers (runtime "threads" or "ray"): the
                    compiled rules, the center store and exchange log, the
                    threads and Ray backends, the scheduler; easgd.async_trainer
                    their training loop
  easgd.trainer     train_and_evaluate(config, workdir): Run, loss/eval, divergence
                    checks, stability warning
  easgd.optimizers  the local optimizer, its schedule counted in epochs
  easgd.rundir      the run directory: file names, workdir checks, set-aside of
                    an earlier run on overwrite, resume checks, metrics/summary
  easgd.checkpoint  layout-free Orbax checkpoints (resume, export)
  easgd.export      export_center: the center as a plain Flax parameter file
  easgd.files       the one atomic file writer (every layer may use it)
  easgd.progress    the training loops' progress: a bar on a terminal, one line
                    per epoch in a file, a pipe or a notebook
  easgd.compare     several algorithms on one data budget, plot + table
  easgd.stability   analysis: spectral radii, stable regions, ADMM (Section 4)
  easgd.sweep_engine  many configurations of an algorithm's own step as one
                    compiled program (vmap over configurations, divergence flags)
  easgd.sweep_grid  the (learning rate, tau, alpha) grid and its results
  easgd.quadratic   the quadratic model simulated (and swept) with EASGD's step
  easgd.hessian     the largest Hessian eigenvalue (the curvature h)
  easgd.sweep_network  the network problem of the sweep (model, data, h)
  easgd.sweep_report   the sweep's files, theory contour and heatmaps
  easgd.sweep       the ``easgd sweep`` command (SweepConfig, run_sweep)
  easgd.flags       command-line flags from a dataclass's fields
  easgd.checks      the one vocabulary of input checks (one message form)
  easgd.data        the data sets (MNIST-1D, Fashion-MNIST, digits, CIFAR-10)
  easgd.batches     which examples each worker reads at each step; crops
  easgd.models, easgd.config, easgd.cli
"""

from easgd.algorithms import Algorithm, Communication, easgd, pmean_sgd
from easgd.config import ConfigError, TrainConfig
from easgd.elastic import (HyperparameterError, easgd_update, elastic_difference,
                           elastic_exchange, resolve_alpha)
from easgd.compare import compare
from easgd.trainer import train_and_evaluate
from easgd.workers import WORKER_AXES, make_layout, map_workers

__version__ = "0.1.0"
