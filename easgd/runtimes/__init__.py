"""Real asynchronous workers: the shared programs and center, the driver, threads, Ray.

Public: the driver and its backends (``Driver``, ``ThreadBackend``,
``RayBackend``), the errors and faults, the center store and the run's log;
the modules ``shared``, ``driver``, ``threads``, ``ray_actors`` for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("shared", "driver", "threads", "ray_actors"),
    names={
        "easgd.runtimes.shared": (
            "AsyncSetup CenterStore InjectedFault replay_run write_log read_log"
        ),
        "easgd.runtimes.driver": "Driver Backend Fault WorkerLost WorkersLostError",
        "easgd.runtimes.threads": "ThreadBackend",
        "easgd.runtimes.ray_actors": "RayBackend",
    },
)
