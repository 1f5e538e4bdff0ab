"""The networks of the protocol's modelled wall-clock time: one link, or nodes of devices.

A network turns a run's measured compute per step and its all-reduces (per level: across
workers, within a worker) into modelled seconds (``modelled_seconds``; ring all-reduce,
``easgd.protocol.stats.allreduce_seconds``). See docs/guides/protocol.md and
docs/guides/multi_device.md#communication-by-level.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import numpy as np

from easgd._util import checks
from easgd._util.flags import REQUIRED, option
from easgd.protocol.config import ProtocolError

_int = functools.partial(checks.integer, error=ProtocolError)
_real = functools.partial(checks.real, error=ProtocolError)


LEVELS = ("across_workers", "within_workers")
"""The levels of a run's communication (``easgd.parallel.accounting.communication_by_level``)."""


@dataclasses.dataclass(frozen=True)
class Network:
  r"""A network of the modelled wall-clock time: one link for every all-reduce.

  One all-reduce of b bytes per device over a group of g devices costs

  .. math::

     \ell + \frac{2 (g - 1)}{g}\, \frac{b}{\beta}

  (l = ``latency_s``, beta = ``bandwidth_bytes_per_s``; ring all-reduce
  traffic per device; ``easgd.protocol.stats.allreduce_seconds``). Both
  levels of a run (:data:`LEVELS`) use this link: across workers g = p,
  within a worker of D devices g = D. Every field carries its meaning and
  unit in its help text.
  """

  name: str = option("1GbE", "the network's name (keys the modelled times)")
  bandwidth_bytes_per_s: float = option(
      125e6, "link bandwidth per device (per worker when a worker is one device), bytes per second"
  )
  latency_s: float = option(50e-6, "seconds added to every all-reduce")

  def validate(self, what: str = "") -> "Network":
    """Checks the fields; returns self. ``what``: where the network sits, for
    the message (e.g. " (inside of network 'x')").

    Raises:
      ProtocolError: an empty name, a bandwidth that is not a finite real > 0,
        a latency that is not a finite real >= 0.
    """
    if not isinstance(self.name, str) or not self.name:
      raise ProtocolError(f"a network's name must be a non-empty string, got {self.name!r}{what}")
    _real(
        f"bandwidth_bytes_per_s of network {self.name!r}{what}",
        self.bandwidth_bytes_per_s,
        0,
        open_low=True,
    )
    _real(f"latency_s of network {self.name!r}{what}", self.latency_s, 0)
    return self

  def links(self, num_workers: int, devices_per_worker: int = 1) -> dict[str, "Network"]:
    """The link of each level (:data:`LEVELS`): this one for both."""
    del num_workers, devices_per_worker
    return {level: self for level in LEVELS}

  def modelled_seconds(
      self,
      steps: int,
      compute_per_step_s: float,
      across: Sequence[int],
      within: Sequence[int] = (0, 0),
      num_workers: int = 1,
      devices_per_worker: int = 1,
  ) -> float:
    """Modelled seconds of ``steps`` local steps: compute plus each level's
    all-reduces at its link (:meth:`links`), no overlap.

    Args:
      steps: local steps.
      compute_per_step_s: measured seconds of one worker's local step.
      across: (all-reduces, bytes per device[, all-gathers, gathered bytes per
        device]) across workers, in groups of ``num_workers`` devices
        (``Algorithm.communication``).
      within: (all-reduces, bytes per device) within each worker, in groups
        of ``devices_per_worker`` devices.
      num_workers, devices_per_worker: the modelled layout, p x D devices.

    Returns:
      ``steps * compute_per_step_s`` + the levels'
      ``easgd.protocol.stats.allreduce_seconds`` (a group of 1 costs 0).
    """
    from easgd.protocol import stats

    links = self.links(num_workers, devices_per_worker)
    total = steps * compute_per_step_s
    for level, comm, group in (
        ("across_workers", across, num_workers),
        ("within_workers", within, devices_per_worker),
    ):
      count, nbytes = comm[:2]
      gathers, gathered = tuple(comm[2:4]) or (0, 0)  # compressed exchanges
      link = links[level]
      total += stats.allreduce_seconds(
          count, nbytes, group, link.bandwidth_bytes_per_s, link.latency_s
      ) + stats.allgather_seconds(
          gathers, gathered, group, link.bandwidth_bytes_per_s, link.latency_s
      )
    return total


GIGABIT_ETHERNET = Network("1GbE", 125e6, 50e-6)
"""1 Gbit/s = 125 MB/s, 50 us per all-reduce (a switched LAN)."""
HUNDRED_GIGABIT_ETHERNET = Network("100GbE", 12.5e9, 5e-6)
"""100 Gbit/s = 12.5 GB/s, 5 us per all-reduce (RDMA-class)."""
DEFAULT_NETWORKS = (GIGABIT_ETHERNET, HUNDRED_GIGABIT_ETHERNET)
"""The networks of the modelled times of a task with a per-example "correct"
(``ProtocolConfig.networks`` None)."""


@dataclasses.dataclass(frozen=True)
class TwoLevelNetwork:
  r"""A network of nodes: a fast link inside a node, a slow one between nodes.

  The layout is p workers of D devices (worker i on devices i D, ..., i D + D - 1), node k
  holds devices k n, ..., k n + n - 1 (n = ``devices_per_node``). A level's all-reduces
  (:data:`LEVELS`) run at ``inside`` when every group of the level lies in one node, else at
  ``between`` (a ring whose slowest link is ``between``), each costing

  .. math::

     \ell + \frac{2 (g - 1)}{g}\, \frac{b}{\beta}

  per all-reduce of b bytes per device over g devices; bandwidths are per device. A
  hierarchical all-reduce is not modelled (the flat group's time is an upper bound for it).
  See docs/guides/multi_device.md#communication-by-level.

  Example:
    >>> net = TwoLevelNetwork("x", Network("in", 100.0, 0.0), Network("out", 10.0, 1.0), 4)
    >>> sorted((k, v.name) for k, v in net.links(num_workers=2, devices_per_worker=4).items())
    [('across_workers', 'out'), ('within_workers', 'in')]
    >>> net.modelled_seconds(0, 0.0, across=(1, 40), within=(2, 40), num_workers=2,
    ...                      devices_per_worker=4)   # 1 + 1 x 40 / 10 + 1.5 x 40 / 100
    5.6
  """

  name: str = option(REQUIRED, "the network's name (keys the modelled times)")
  inside: Network = option(REQUIRED, "the link between the devices of one node (a Network)")
  between: Network = option(REQUIRED, "the link between nodes, per device (a Network)")
  devices_per_node: int = option(REQUIRED, "devices of one node, n (an integer >= 1)")

  def validate(self, what: str = "") -> "TwoLevelNetwork":
    """Checks the fields; returns self.

    Raises:
      ProtocolError: an empty name, ``inside`` or ``between`` not a valid
        :class:`Network`, ``devices_per_node`` not an integer >= 1.
    """
    if not isinstance(self.name, str) or not self.name:
      raise ProtocolError(f"a network's name must be a non-empty string, got {self.name!r}")
    for field in ("inside", "between"):
      link = getattr(self, field)
      if not isinstance(link, Network):
        raise ProtocolError(
            f"{field} of network {self.name!r} must be an easgd.protocol.networks.Network, "
            f"got {link!r}"
        )
      link.validate(f" ({field} of network {self.name!r})")
    _int(f"devices_per_node of network {self.name!r}", self.devices_per_node, 1)
    return self

  def links(self, num_workers: int, devices_per_worker: int = 1) -> dict[str, Network]:
    """The link of each level on the layout of ``num_workers`` x
    ``devices_per_worker`` devices: ``inside`` where every group of the level
    lies in one node, else ``between`` (class docstring)."""
    p = _int("num_workers", num_workers, 1)
    D = _int("devices_per_worker", devices_per_worker, 1)
    node = np.arange(p * D).reshape(p, D) // self.devices_per_node
    one_node = dict(
        within_workers=bool(np.all(node == node[:, :1])),  # each row (a worker) in one node
        across_workers=bool(np.all(node == node[:1, :])),  # each column in one node
    )
    return {level: self.inside if one_node[level] else self.between for level in LEVELS}

  modelled_seconds = Network.modelled_seconds


NVLINK_NODES_100GBE = TwoLevelNetwork(
    "8xNVLink+100GbE", Network("NVLink", 300e9, 2e-6), HUNDRED_GIGABIT_ETHERNET, 8
)
"""Nodes of 8 devices: an NVLink-class 300 GB/s and 2 us per all-reduce
inside a node, 100 Gbit/s = 12.5 GB/s and 5 us per device between nodes
(assumed figures of the model, not measured here)."""


def network_from_dict(d: Mapping[str, Any]) -> "Network | TwoLevelNetwork":
  """The network of its ``results.json`` form (``dataclasses.asdict``)."""
  if "inside" in d:
    return TwoLevelNetwork(
        d["name"], Network(**d["inside"]), Network(**d["between"]), d["devices_per_node"]
    )
  return Network(**d)
