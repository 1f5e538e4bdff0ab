"""Where workers run: device mapping (pmap / shard_map of vmap) and processes.

Public: the worker layout and the mapped step (``make_layout``, ``map_step``,
``place_state``, ...), the communication by level (``communication_by_level``),
the multi-process errors; the modules ``workers`` and
``distributed`` for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("workers", "distributed"),
    names={
        "easgd.parallel.workers": (
            "BACKENDS LayoutError WorkerLayout make_layout shard_params data_parallel_loss "
            "map_workers vmap_workers map_step "
            "place_state split_workers merge_workers first_copy to_host "
            "communication_by_level LevelCommunication"
        ),
        "easgd.parallel.distributed": ("DistributedError StartupError ProcessSetup EXIT_PEER_LOST"),
    },
)
