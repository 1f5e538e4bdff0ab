"""The simulated schedule's option names, importable without JAX.

The config (``easgd.settings.config``) declares its fields' allowed values
from these; ``easgd.asynchrony.schedule`` implements them.
"""

EXCHANGE_ORDERS = ("round_robin", "random")
"""Exchange orders within a tick."""

PUSH_TIMINGS = ("authors", "full_period")
"""After which local steps a DOWNPOUR-type worker pushes
(``easgd.asynchrony.schedule.async_push``)."""
