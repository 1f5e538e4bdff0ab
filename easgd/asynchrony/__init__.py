"""Simulated asynchrony: the time model, the simulated methods, the exchange log and its replay.

Public: the simulated methods (``async_easgd``, ``async_eamsgd``, ``async_push``,
``simulate``), the exchange schedule, the exchange log and its replay; the
modules ``schedule``, ``simulation``, ``log`` for the rest.
"""

from easgd._util import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    modules=("schedule", "simulation", "log"),
    names={
        "easgd.asynchrony.names": "EXCHANGE_ORDERS PUSH_TIMINGS",
        "easgd.asynchrony.schedule": "ExchangeSchedule exchange_schedule draw_worker_speeds",
        "easgd.asynchrony.simulator": "AsyncRules simulate",
        "easgd.asynchrony.simulation": "async_easgd async_eamsgd async_push",
        "easgd.asynchrony.log": "exchange_log write_exchange_log Replayed replay",
    },
)
