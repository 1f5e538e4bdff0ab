"""The runtime table: the one place that names the runtimes (``TrainConfig.runtime``).

Each row of :data:`TABLE` is a :class:`RuntimeSpec`: where the workers run, the
executor and backend that run them (import paths, imported when a run starts:
this module is read by the config, which imports no JAX), the runtime settings
it reads and what it supports. The config's checks, the algorithms each runtime
runs, the trainer's executor and the backend are all derived from it; adding a
runtime is one row here plus its executor or backend module (see
docs/guides/runtimes.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import Any, NamedTuple

from easgd.methods import registry


class Setting(NamedTuple):
  """A setting only some runtimes read, refused on the others.

  Attributes:
    note: said after "is not read by runtime 'x'" (may be empty).
    otherwise: said after the runtimes that read it (may be empty).
  """

  note: str = ""
  otherwise: str = ""


LINK_FIELDS = ("link_rate", "link_rates", "link_latency", "link_burst")
"""The emulated link's settings (``easgd.runtimes.link_emulation``)."""

SETTINGS = {
    "worker_delays": Setting(note=" (the simulation's stragglers are worker_speeds)"),
    "ray_address": Setting(otherwise=" or leave it None"),
    **{
        name: Setting(
            note=" (the emulated link is in the real workers' exchanges; processes across "
            "a shaped link: easgd link)"
        )
        for name in LINK_FIELDS
    },
}
"""The ``TrainConfig`` fields read by some runtimes only (a row's ``reads``), in
the order their refusal is looked for."""

ASYNC_SETTINGS = {
    "delay": Setting(
        note=" (the overlap of an exchange with a real worker's next local steps)",
        otherwise=", or delay 0",
    ),
}
"""The settings of the asynchronous algorithms (``easgd.methods.registry.OVERLAP``) that
only some runtimes run (a row's ``async_reads``); the synchronous algorithms that read
them run them on every runtime that runs them."""


@dataclasses.dataclass(frozen=True)
class RuntimeSpec:
  """One runtime of the table.

  Attributes:
    name: the value of ``TrainConfig.runtime`` (``--runtime``).
    help: what it is, one clause of the ``runtime`` field's help text.
    executor: ``"module:Class"`` of its ``easgd.runtimes.executor.Executor``;
      built as ``Class(run)`` without a backend, else as
      ``Class(run, log_path, faults)`` (``easgd.run.trainer``).
    backend: ``"module:Class"`` of its ``easgd.runtimes.driver.Backend``
      (built by ``easgd.runtimes.async_runs``), or None: one program, no
      workers of its own. A runtime with a backend is "real": its workers run
      for real, each at its own pace (:data:`REAL`).
    reads: the settings of :data:`SETTINGS` it reads.
    async_reads: the settings of :data:`ASYNC_SETTINGS` it runs for the asynchronous
      algorithms that read them.
    asynchronous_only: runs the asynchronous algorithms only (their
      ``Algorithm.async_rules``); False: every algorithm.
    simulated_schedule: reads the simulated exchange schedule
      (``easgd.methods.registry.SCHEDULE_FIELDS``) of the algorithms that read it.
    devices_per_worker: runs workers of several devices (``devices_per_worker`` > 1).
    multiprocess: runs under several JAX processes (``easgd.parallel.distributed``).
    chunk_steps: the most local steps handed to a worker at a time
      (``easgd.runtimes.driver.Driver``), or None without a backend.
    processes: each worker runs in a process of its own, which builds the run
      again from the config (so the task must have an import path).
    connect: ``"module:function"``, ``function(config)`` returning what
      ``close()`` ends, opened before the run is built (a cluster), or None.
    requires: ``(module, name, install hint)`` of a package it needs that
      easgd does not install by default, or None.
  """

  name: str
  help: str
  executor: str
  backend: str | None = None
  reads: tuple[str, ...] = ()
  async_reads: tuple[str, ...] = ()
  asynchronous_only: bool = False
  simulated_schedule: bool = False
  devices_per_worker: bool = False
  multiprocess: bool = False
  chunk_steps: int | None = None
  processes: bool = False
  connect: str | None = None
  requires: tuple[str, str, str] | None = None


TABLE: dict[str, RuntimeSpec] = {
    s.name: s
    for s in (
        RuntimeSpec(
            "spmd",
            "one SPMD program: the synchronous methods, and the asynchronous ones "
            "simulated deterministically with exchange_order, worker_speeds and staleness",
            "easgd.runtimes.spmd:SpmdExecutor",
            simulated_schedule=True,
            devices_per_worker=True,
            multiprocess=True,
        ),
        RuntimeSpec(
            "threads",
            "real asynchronous workers, one thread each, in this process",
            "easgd.runtimes.async_runs:AsyncExecutor",
            "easgd.runtimes.threads:ThreadBackend",
            reads=("worker_delays", *LINK_FIELDS),
            async_reads=("delay",),
            asynchronous_only=True,
            chunk_steps=8,
        ),
        RuntimeSpec(
            "ray",
            "real asynchronous workers as Ray actors; needs pip install 'easgd[ray]'",
            "easgd.runtimes.async_runs:AsyncExecutor",
            "easgd.runtimes.ray_actors:RayBackend",
            reads=("worker_delays", "ray_address", *LINK_FIELDS),
            asynchronous_only=True,
            chunk_steps=32,  # a chunk is one remote call
            processes=True,
            connect="easgd.runtimes.ray_actors:connect_to",
            requires=("ray", "Ray", "pip install 'easgd[ray]'"),
        ),
    )
}

NAMES = tuple(TABLE)
"""Every runtime name, in the table's order."""

DEFAULT = NAMES[0]
"""The default runtime (``TrainConfig.runtime``)."""

REAL = tuple(n for n, s in TABLE.items() if s.backend is not None)
"""The runtimes whose workers run for real, each at its own pace, on a backend."""


def _or(items) -> str:
  """``a, b or c``."""
  items = list(items)
  return " or ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


def either(names) -> str:
  """``'a', 'b' or 'c'`` (messages naming the allowed runtimes)."""
  return _or(repr(n) for n in names)


def help_text() -> str:
  """The ``runtime`` field's help: each row's name and help line."""
  return (
      "where the workers run (the table easgd.settings.runtime_table): "
      f"{_or(f'{n!r} ({s.help})' for n, s in TABLE.items())}. The real runtimes run the "
      "asynchronous algorithms (the table's asynchronous_only)."
  )


def runs_on(runtime: str) -> tuple[str, ...]:
  """The algorithms that run on ``runtime``, in the algorithm table's order."""
  only_async = TABLE[runtime].asynchronous_only
  return registry.names_where(lambda a: a.asynchronous or not only_async)


def runtimes_of(algorithm: str) -> tuple[str, ...]:
  """The runtimes that run ``algorithm``, in this table's order."""
  return tuple(n for n in NAMES if algorithm in runs_on(n))


def load(path: str) -> Any:
  """The object at ``"module:name"`` (a row's executor, backend or connect)."""
  module, _, name = path.partition(":")
  return getattr(importlib.import_module(module), name)


def relation_error(config) -> str | None:
  """The algorithm on a runtime that does not run it, or a runtime whose
  package is not installed: the one-line message, else None."""
  spec, runtimes = TABLE[config.runtime], runtimes_of(config.algorithm)
  if config.runtime not in runtimes:
    return (
        f"algorithm {config.algorithm!r} does not run on runtime {config.runtime!r} "
        f"(it runs on: {', '.join(runtimes)}); "
        f"runtime {config.runtime!r} runs: {', '.join(runs_on(config.runtime))}"
    )
  if spec.requires is not None and importlib.util.find_spec(spec.requires[0]) is None:
    _, name, install = spec.requires
    return f"runtime {config.runtime!r} needs {name}, which is not installed; {install}"
  return None


def devices_per_worker_error(config) -> str | None:
  """``devices_per_worker`` > 1 on a runtime that runs workers of one device."""
  if TABLE[config.runtime].devices_per_worker:
    return None
  where = either(n for n, s in TABLE.items() if s.devices_per_worker)
  return (
      f"devices_per_worker={config.devices_per_worker} runs on runtime {where} (one SPMD "
      f"program), got runtime {config.runtime!r}; allowed: runtime {where}, or "
      "devices_per_worker 1"
  )


def setting_refusal(config, name: str, value) -> str:
  """The one-line refusal of ``name`` (a :data:`SETTINGS` field) set to ``value`` on
  ``config``'s runtime, which does not read it (``easgd.settings.reads.RUNTIME_RULES``)."""
  readers = [n for n, s in TABLE.items() if name in s.reads]
  note, otherwise = SETTINGS[name]
  return (
      f"{name}={value!r} is not read by runtime {config.runtime!r}{note}; use runtime "
      f"{either(readers)}{otherwise}"
  )


def async_setting_refusal(config, name: str, value) -> str:
  """The one-line refusal of ``name`` (an :data:`ASYNC_SETTINGS` field) set to ``value``
  for an asynchronous algorithm on ``config``'s runtime, which does not run it."""
  readers = [n for n, s in TABLE.items() if name in s.async_reads]
  note, otherwise = ASYNC_SETTINGS[name]
  return (
      f"{name}={value!r} of algorithm {config.algorithm!r} is not read by runtime "
      f"{config.runtime!r}{note}; use runtime {either(readers)}{otherwise}"
  )


def schedule_refusal(config, name: str, value) -> str:
  """The one-line refusal of ``name`` (a field of the simulated exchange schedule,
  ``easgd.methods.registry.SCHEDULE_FIELDS``) set to ``value`` on a runtime without one."""
  simulated = either(n for n, s in TABLE.items() if s.simulated_schedule)
  return (
      f"{name}={value!r} sets the simulated exchange schedule (runtime {simulated}); "
      f"runtime {config.runtime!r} runs the workers for real, their order and "
      "staleness come from timing; for a straggler use worker_delays"
  )
