"""The paper's synchronous rules as pure per-worker (init, step) pairs; no devices.

Public: the factories (``easgd``, ``eamsgd``, ``pmean_sgd``), their state and
communication types, the elastic update (eq. 5-6) and the worker axis names;
the modules ``base`` (the interface), ``algorithms``, ``elastic``, ``momentum``, ``streaming``
(fragmented, delayed and compressed elastic exchanges), ``warmup`` for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("base", "algorithms", "elastic", "momentum", "streaming", "warmup"),
    names={
        "easgd.core.base": "Algorithm Communication WorkerState SharedState",
        "easgd.core.algorithms": "easgd eamsgd pmean_sgd shared_model_algorithm",
        "easgd.core.elastic": (
            "WORKER_AXES DEVICE_AXIS LOCAL_AXIS HyperparameterError MappingError "
            "easgd_update elastic_difference elastic_exchange resolve_alpha worker_mean "
            "worker_sum tree_l2_distance"
        ),
        "easgd.core.momentum": "nesterov_velocity loss_and_grad",
        "easgd.core.warmup": "sync_warmup",
        "easgd.core.names": "FRAGMENT_LAYOUTS COMPRESSIONS",
        "easgd.core.streaming": "ExchangeTechniques Compression",
    },
)
