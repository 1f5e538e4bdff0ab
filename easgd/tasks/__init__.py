"""The problem a run solves: the task seam, data sources and sets, batches, models.

Public: ``Task`` and its errors, the data sets and models; the modules
(``task``, ``sources``, ``data``, ``datasets``, ``loaders``, ``batches``,
``models``, ``names``) for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("names", "task", "sources", "data", "loaders", "datasets", "batches", "models"),
    names={
        "easgd.tasks.names": "MODELS",
        "easgd.tasks.sources": "TaskError",
        "easgd.tasks.task": "Task load_task",
        "easgd.tasks.data": "DataError Dataset",
        "easgd.tasks.datasets": "DATASETS load_dataset",
        "easgd.tasks.models": (
            "ModelError make_model init_params count_params param_bytes " "cross_entropy_loss"
        ),
    },
)
