"""What a run is told: ``TrainConfig``, its checks, and the task a config names.

Public: ``TrainConfig``, ``ConfigError``, ``classifier_task``, ``builtin_task``;
the modules ``config``, ``builtin_tasks`` and ``runtime_table`` (the runtimes) for
the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("config", "builtin_tasks", "runtime_table"),
    names={
        "easgd.settings.config": "TrainConfig ConfigError",
        "easgd.settings.builtin_tasks": "classifier_task builtin_task",
    },
)
