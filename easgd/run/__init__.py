"""The run: the one training loop, its directory, lock, checkpoints, events, export, comparisons.

Public: ``train_and_evaluate``, the checkpoints, the lock's error, export; the
modules (``trainer``, ``rundir``, ``compare``, ...) for the rest. The function
``compare`` is ``easgd.compare`` (``easgd.run.compare`` is its module).
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=(
        "checkpoint",
        "rundir",
        "tensorboard",
        "runlock",
        "trainer",
        "export",
        "compare",
        "plotting",
    ),
    names={
        "easgd.run.checkpoint": "CheckpointError Checkpointer",
        "easgd.run.runlock": "WorkdirInUseError",
        "easgd.run.trainer": "train_and_evaluate train_and_evaluate_async",
        "easgd.run.export": "export_center",
        "easgd.run.plotting": "plot_comparison",
    },
)
