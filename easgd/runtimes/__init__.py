"""Where a run's steps execute: the SPMD program and real asynchronous workers.

Public: the executors' contract (``Executor``, ``Snapshot``), the driver and its
backends (``Driver``, ``ThreadBackend``, ``RayBackend``), the errors and faults,
the center store and the run's log, the local optimizer and the divergence
errors; the modules for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=(
        "shared",
        "driver",
        "threads",
        "ray_actors",
        "optimizers",
        "divergence",
        "executor",
        "training_run",
        "spmd",
        "async_runs",
        "link_emulation",
    ),
    names={
        "easgd.runtimes.shared": (
            "AsyncSetup CenterStore InjectedFault replay_run write_log read_log"
        ),
        "easgd.runtimes.driver": "Driver Backend Fault WorkerLost WorkersLostError",
        "easgd.runtimes.threads": "ThreadBackend",
        "easgd.runtimes.ray_actors": "RayBackend",
        "easgd.runtimes.optimizers": "make_optimizer make_schedule",
        "easgd.runtimes.executor": "Executor Snapshot",
        "easgd.runtimes.divergence": "DivergenceError StabilityWarning",
    },
)
