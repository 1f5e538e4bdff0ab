"""easgd: Elastic Averaging SGD (Zhang, Choromanska & LeCun, NeurIPS 2015) on JAX.

The public API: the names in ``easgd.__all__`` (the factories, ``TrainConfig``
and ``train_and_evaluate``, the comparison protocol, the worker mapping, the
errors) and the subpackages, each with its own ``__all__``
(``easgd.training.param_bytes``, ``easgd.analysis.stability``, ...). Names are
imported on first use: ``import easgd`` imports no module of JAX, Flax, Optax,
Orbax or Ray.

Where things live (the layers, bottom up: core, parallel, analysis, training,
face; docs/guides/architecture.md):
  easgd.core.elastic     the update rules (eq. 5-6), the worker axis names, sums
                    across workers in float32, pure pytree functions
  easgd.core.momentum    the local step: Nesterov momentum (eq. 7) and the one
                    loss-and-gradient of every algorithm (model state included)
  easgd.core.algorithms  per-worker (init, step) pairs: EASGD and EAMSGD (one rule),
                    the one-model core of pmean SGD and the sequential methods
  easgd.asynchrony.schedule  the simulated time model: ticks, speeds, exchange orders
  easgd.asynchrony.simulation  Algorithms 1-2 (and the DOWNPOUR engine) simulated on it,
                    and their per-event rules
  easgd.asynchrony.log   the exchange log of a run and its replay
  easgd.methods.baselines   DOWNPOUR family, sequential SGD/MSGD/ASGD/MVASGD, local
                    SGD, DiLoCo
  easgd.methods.registry    the algorithm table: factories, the settings each reads
  easgd.parallel.worker_layout, mapping, data_parallel, accounting, placement
                    the worker layout on devices, the mapping (pmap or shard_map
                    over devices of vmap over workers), the data parallelism
                    inside a worker, communication by level, placement
  easgd.parallel.distributed multi-process runs: jax.distributed setup, peer watchdog
  easgd.runtimes.shared, threads, ray_actors, driver
                    real asynchronous workers (runtime "threads" or "ray"): the
                    compiled rules, the center store and exchange log, the
                    threads and Ray backends, the scheduler; easgd.runtimes.async_runs
                    their executor of the training loop
  easgd.tasks.task        Task: the one seam for a problem (model, loss, per-example
                    evaluation, random-access data sources), load_task of an
                    import path; easgd.settings.builtin_tasks the built-in data
                    sets and models as tasks, classifier_task of a Flax model
  easgd.run.trainer     train_and_evaluate(config, workdir): the one training loop
                    (run directory, lock, resume, checkpoints, evaluation, metrics,
                    summary) for every runtime, whose executor runs the steps:
                    easgd.runtimes.spmd or easgd.runtimes.async_runs
  easgd.runtimes.executor  the executors' contract and the checkpoint's tree (once)
  easgd.runtimes.training_run  Run: data, model, compiled step and evaluation, shared
                    by every executor
  easgd.runtimes.divergence  DivergenceError, its messages, the stability warning
  easgd.runtimes.optimizers  the local optimizer, its schedule counted in epochs
  easgd.run.rundir      the run directory: file names, workdir checks, set-aside of
                    an earlier run on overwrite, resume checks, metrics/summary
  easgd.run.checkpoint  layout-free Orbax checkpoints (resume, export)
  easgd.run.export      export_center: the center as a plain Flax parameter file
  easgd._util.files       the one atomic file writer (every layer may use it)
  easgd._util.progress    the training loops' progress: a bar on a terminal, one line
                    per epoch in a file, a pipe or a notebook
  easgd.run.compare     several algorithms on one data budget, plot + table
  easgd.analysis.stability   analysis: synchronous EASGD's spectral radii, stable regions (Section 4)
  easgd.analysis.round_robin  round-robin EASGD and ADMM (Section 4, Figure 1)
  easgd.sweeps.engine  many configurations of an algorithm's own step as one
                    compiled program (vmap over configurations, divergence flags)
  easgd.sweeps.grid  the (learning rate, tau, alpha) grid and its results
  easgd.sweeps.quadratic   the quadratic model simulated (and swept) with EASGD's step
  easgd.analysis.hessian     the largest Hessian eigenvalue (the curvature h)
  easgd.sweeps.network  the network problem of the sweep (model, data, h)
  easgd.sweeps.report   the sweep's files, theory contour and heatmaps
  easgd.sweeps.config        the ``easgd sweep`` config and flags (SweepConfig; no JAX)
  easgd.sweeps.command       the ``easgd sweep`` command (run_sweep)
  easgd.protocol.config, networks, programs, runs, stats, report, claims
                    the comparison protocol: its settings, the network model, the
                    shared programs, tuning and report runs, intervals, results.md,
                    the paper's claims
  easgd._util.flags       command-line flags from a dataclass's fields
  easgd._util.checks      the one vocabulary of input checks (one message form)
  easgd.tasks.datasets    the table of built-in data sets (MNIST-1D, Fashion-MNIST,
                    digits, CIFAR-10); their loaders: easgd.tasks.loaders
  easgd.tasks.data        the Dataset container and the validation split
  easgd.tasks.batches     which examples each worker reads at each step; crops
  easgd.tasks.models, easgd.settings.config, easgd.cli
"""

from easgd._util import lazy_exports

__version__ = "0.1.0"

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=(
        "core",
        "asynchrony",
        "methods",
        "analysis",
        "parallel",
        "tasks",
        "settings",
        "runtimes",
        "run",
        "sweeps",
        "protocol",
    ),
    names={
        "easgd.core.algorithms": "Algorithm Communication easgd eamsgd pmean_sgd",
        "easgd.core.elastic": (
            "WORKER_AXES HyperparameterError easgd_update elastic_difference "
            "elastic_exchange resolve_alpha"
        ),
        "easgd.methods.registry": "ALGORITHMS make_algorithm",
        "easgd.parallel.worker_layout": "LayoutError make_layout",
        "easgd.parallel.mapping": "map_workers map_step",
        "easgd.parallel.placement": "place_state split_workers merge_workers first_copy",
        "easgd.settings.config": "ConfigError TrainConfig",
        "easgd.tasks.task": "Task TaskError load_task",
        "easgd.settings.builtin_tasks": "classifier_task",
        "easgd.tasks.models": "param_bytes",
        "easgd.run.trainer": "train_and_evaluate",
        "easgd.runtimes.divergence": "DivergenceError StabilityWarning",
        "easgd.run.compare": "compare",
        "easgd.run.export": "export_center",
        "easgd.protocol.config": "Arm ProtocolConfig log_grid",
        "easgd.protocol.runs": "run_protocol",
    },
)
__all__ = ["__version__", *__all__]
