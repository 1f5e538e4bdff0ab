"""The comparison protocol: config, networks, programs, runs, statistics, report, claims.

Public: ``ProtocolConfig``, ``Arm``, ``Network``, ``TwoLevelNetwork``, ``log_grid`` and
``run_protocol``, the statistics of the report and its files; the modules
``config``, ``networks``, ``programs``, ``runs``, ``stats``, ``report``, ``claims`` for the
rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("config", "networks", "programs", "runs", "stats", "report", "claims"),
    names={
        "easgd.protocol.config": "ProtocolError Arm ProtocolConfig log_grid load_protocol_file",
        "easgd.protocol.networks": (
            "Network GIGABIT_ETHERNET HUNDRED_GIGABIT_ETHERNET TwoLevelNetwork NVLINK_NODES_100GBE"
        ),
        "easgd.protocol.runs": "run_protocol",
        "easgd.protocol.stats": "mean_interval difference_interval verdict",
        "easgd.protocol.report": "load_results results_markdown write_report",
    },
)
