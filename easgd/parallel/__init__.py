"""Where workers run: device mapping (pmap / shard_map of vmap) and processes.

Public: the worker layout (``make_layout``), the mapped step (``map_step``),
placement (``place_state``, ...), the data-parallel worker (``shard_params``,
``data_parallel_loss``), communication by level (``communication_by_level``),
the multi-process errors; the modules for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=(
        "worker_layout",
        "mapping",
        "data_parallel",
        "accounting",
        "placement",
        "distributed",
    ),
    names={
        "easgd.parallel.names": "BACKENDS",
        "easgd.parallel.worker_layout": "LayoutError WorkerLayout make_layout",
        "easgd.parallel.mapping": "map_workers vmap_workers map_step",
        "easgd.parallel.data_parallel": "shard_params data_parallel_loss",
        "easgd.parallel.accounting": "communication_by_level LevelCommunication",
        "easgd.parallel.placement": "place_state split_workers merge_workers first_copy to_host",
        "easgd.parallel.distributed": ("DistributedError StartupError ProcessSetup EXIT_PEER_LOST"),
    },
)
