"""The comparators and the one algorithm table (registry).

Public: the baselines' factories, the algorithm table and its questions
(``make_algorithm``, ``ALGORITHMS``, ``describe``); the modules ``baselines``
and ``registry`` for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("baselines", "registry"),
    names={
        "easgd.methods.baselines": (
            "downpour mdownpour adownpour mvadownpour sgd msgd asgd mvasgd local_sgd diloco"
        ),
        "easgd.methods.registry": (
            "AlgorithmSpec TABLE ALGORITHMS DEFAULT_COMPARISON ASYNC_ALGORITHMS "
            "MOMENTUM_ALGORITHMS RUNTIMES make_algorithm describe"
        ),
    },
)
