"""The comparators and the one algorithm table (registry).

Public: the baselines' factories, the algorithm table and its questions
(``make_algorithm``, ``ALGORITHMS``, ``describe``); the modules ``downpour_family``
(the DOWNPOUR family), ``baselines`` (sequential methods, local SGD, DiLoCo),
``streaming_diloco`` (Streaming DiLoCo), ``averages`` and ``registry`` for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("averages", "downpour_family", "baselines", "streaming_diloco", "registry"),
    names={
        "easgd.methods.downpour_family": "downpour mdownpour adownpour mvadownpour",
        "easgd.methods.baselines": "sgd msgd asgd mvasgd local_sgd diloco",
        "easgd.methods.registry": (
            "AlgorithmSpec TABLE ALGORITHMS DEFAULT_COMPARISON ASYNC_ALGORITHMS "
            "MOMENTUM_ALGORITHMS make_algorithm describe"
        ),
    },
)
