"""The comparison protocol: config, runs, statistics, report.

Public: ``ProtocolConfig``, ``Arm``, ``Network``, ``TwoLevelNetwork``, ``log_grid`` and
``run_protocol``, the statistics of the report and its files; the modules
``config``, ``runs``, ``stats``, ``report`` for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("config", "runs", "stats", "report"),
    names={
        "easgd.protocol.config": (
            "ProtocolError Arm ProtocolConfig Network log_grid load_protocol_file "
            "GIGABIT_ETHERNET HUNDRED_GIGABIT_ETHERNET TwoLevelNetwork NVLINK_NODES_100GBE"
        ),
        "easgd.protocol.runs": "run_protocol",
        "easgd.protocol.stats": "mean_interval difference_interval verdict",
        "easgd.protocol.report": "load_results results_markdown write_report",
    },
)
