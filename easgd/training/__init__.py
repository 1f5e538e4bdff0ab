"""Training: config, data, batches, models, optimizers, checkpoints, run directory, the run loop, export, comparisons.

Public: ``TrainConfig`` and ``train_and_evaluate`` with their errors, the data
sets, models, optimizers, checkpoints and export; the modules (``compare``,
``rundir``, ``batches``, ...) for the rest. The function ``compare`` is
``easgd.compare`` (``easgd.training.compare`` is its module).
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=(
        "config",
        "names",
        "task",
        "sources",
        "builtin_tasks",
        "data",
        "batches",
        "models",
        "optimizers",
        "checkpoint",
        "rundir",
        "tensorboard",
        "runlock",
        "executor",
        "spmd",
        "async_runs",
        "divergence",
        "trainer",
        "export",
        "compare",
        "plotting",
    ),
    names={
        "easgd.training.config": "TrainConfig ConfigError",
        "easgd.training.task": "Task TaskError load_task",
        "easgd.training.builtin_tasks": "classifier_task builtin_task",
        "easgd.training.data": "DATASETS DataError Dataset load_dataset",
        "easgd.training.models": (
            "MODELS ModelError make_model init_params count_params param_bytes "
            "cross_entropy_loss"
        ),
        "easgd.training.optimizers": "make_optimizer make_schedule",
        "easgd.training.checkpoint": "CheckpointError Checkpointer",
        "easgd.training.runlock": "WorkdirInUseError",
        "easgd.training.executor": "Executor Snapshot",
        "easgd.training.divergence": "DivergenceError StabilityWarning",
        "easgd.training.trainer": "train_and_evaluate train_and_evaluate_async",
        "easgd.training.export": "export_center",
        "easgd.training.plotting": "plot_comparison plot_tau_alpha_heatmap",
    },
)
