"""easgd: Elastic Averaging SGD (Zhang, Choromanska & LeCun, NeurIPS 2015) on JAX.

The public API: the names in ``easgd.__all__`` (the factories, ``TrainConfig`` and
``train_and_evaluate``, the comparison protocol, the worker mapping, the errors) and
the subpackages, each with its own ``__all__``. Names are imported on first use:
``import easgd`` imports no module of JAX, Flax, Optax, Orbax or Ray.

The subpackages, bottom up (a module imports only from its own subpackage or one
below; docs/guides/architecture.md; tests/test_layout.py checks this map against
the tree):
  easgd._util       private utilities: checks, atomic files, flags, progress
  easgd.core        the paper's synchronous rules as per-worker (init, step) pairs
  easgd.asynchrony  simulated asynchrony: time model, simulation, exchange log, replay
  easgd.methods     the comparators and the one algorithm table
  easgd.analysis    theory: stability (Section 4), the largest Hessian eigenvalue
  easgd.parallel    where workers run: devices and processes
  easgd.tasks       the problem: the task seam, data sources and sets, batches, models
  easgd.settings    what a run is told: TrainConfig and the task a config names
  easgd.runtimes    where steps execute: the SPMD program, real asynchronous workers
  easgd.run         the one training loop, run directory, checkpoints, export, compare
  easgd.sweeps      many configurations as one program: grids, curves, the sweep
  easgd.protocol    the comparison protocol: config, runs, statistics, report
  easgd.cli         the ``easgd`` command
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
        "easgd.core.base": "Algorithm Communication",
        "easgd.core.algorithms": "easgd eamsgd pmean_sgd",
        "easgd.core.elastic": (
            "WORKER_AXES HyperparameterError easgd_update elastic_difference "
            "elastic_exchange resolve_alpha"
        ),
        "easgd.methods.registry": "ALGORITHMS make_algorithm",
        "easgd.parallel.worker_layout": "LayoutError make_layout",
        "easgd.parallel.mapping": "map_workers map_step",
        "easgd.parallel.placement": "place_state split_workers merge_workers first_copy",
        "easgd.settings.config": "ConfigError TrainConfig",
        "easgd.tasks.sources": "TaskError",
        "easgd.tasks.task": "Task load_task",
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
