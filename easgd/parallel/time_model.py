r"""The time model of a run on a link: its measured step time plus what its exchanges cost.

A run's training clock on a link of rate r (bytes/s) and latency L (s) is predicted from
the same run measured without the link (its step time, the run's own compiled programs)
and from what its exchanges put on the link, per level and per worker. Equations, with
their terms, in docs/guides/slow_link.md ("The time model"):

* synchronous programs across processes (:func:`spmd_seconds`): one process's clock,

  .. math::

     T = n\,t_\text{step} + N\,L + \frac{w\!\left(\tfrac{2(P-1)}{P} B,\;
         \tfrac{2(P-1)}{P} B\right)}{r}

  (n steps, t_step the measured seconds per step, N all-reduces of B payload bytes in all
  across the P processes, w the bytes on the wire: :func:`wire_bytes`); a level whose groups
  lie inside one process is in t_step already;
* real asynchronous workers behind emulated links (:func:`async_seconds`): worker i's clock
  between two boundaries of the run (where every worker stops)

  .. math::

     T_i = n_i\,t(k) + \sum_{j=1}^{E_i} \left(d^\uparrow_{ij} + d^\downarrow_{ij}\right)

  (n_i local steps, each of t(k) seconds while k workers compute at once, measured without
  the link; E_i exchanges whose push and pull each wait the token bucket's delay
  d = L + max(0, (b - tokens) / r)); the boundary comes at max_i T_i.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from easgd._util import checks

FRAME_HEADER_BYTES = 66
"""Bytes of headers on the wire per TCP segment: Ethernet 14, IPv4 20, TCP 20 and its
timestamp option 12 (tbf counts a packet from its Ethernet header)."""
ACK_EVERY_SEGMENTS = 1
"""TCP's delayed acknowledgement: one header-only segment (:data:`FRAME_HEADER_BYTES`)
acknowledges every 2 segments received."""


def wire_bytes(sent: float, received: float = 0.0, mtu: int = 1500) -> float:
  r"""Bytes one endpoint puts on the wire to send ``sent`` and receive ``received``
  payload bytes over TCP:

  .. math::

     w(s, v) = s + h\,\frac{s}{m} + h\,\frac{v}{2m}

  (h = :data:`FRAME_HEADER_BYTES`, m = mtu - 52 the segment's payload, one acknowledgement
  per :data:`ACK_EVERY_SEGMENTS` segments received).

  Args:
    sent, received: payload bytes (floats >= 0).
    mtu: the link's MTU in bytes (> 52).

  Returns:
    float, bytes.

  Raises:
    ValueError: a negative size, an MTU <= 52.
  """
  sent = checks.real("sent", sent, 0)
  received = checks.real("received", received, 0)
  mss = checks.integer("mtu", mtu, 53) - 52
  h = FRAME_HEADER_BYTES
  return sent + h * sent / mss + h * received / (ACK_EVERY_SEGMENTS * mss)


def ring_payload(nbytes: float, group: int) -> float:
  """Payload bytes one member of a ring all-reduce of ``nbytes`` over ``group``
  members sends (and receives): 2 (g - 1) / g times the buffer; 0 for g = 1.

  Raises:
    ValueError: a group that is not an integer >= 1, a negative or non-finite size.
  """
  g = checks.integer("group", group, 1)
  return 2.0 * (g - 1) / g * checks.real("nbytes", nbytes, 0)


@dataclasses.dataclass(frozen=True)
class LinkModel:
  """The link of the model: its rate, latency and framing.

  Attributes:
    rate_bytes_s: r, bytes per second (> 0; ``math.inf``: no limit).
    latency_s: L, seconds added to every transfer (>= 0).
    mtu: bytes; with ``framing`` the wire carries :func:`wire_bytes`.
    framing: count TCP/IP framing (a real link, ``easgd link``); False for the
      emulated link of the threads and Ray runtimes, which charges payload bytes.
  """

  rate_bytes_s: float
  latency_s: float = 0.0
  mtu: int = 1500
  framing: bool = True

  def __post_init__(self):
    if not math.isinf(self.rate_bytes_s):
      checks.real("rate_bytes_s", self.rate_bytes_s, 0, open_low=True)
    checks.real("latency_s", self.latency_s, 0)

  def wire(self, sent: float, received: float) -> float:
    """Bytes on the wire for ``sent`` and ``received`` payload bytes."""
    return wire_bytes(sent, received, self.mtu) if self.framing else float(sent)


def spmd_seconds(
    num_steps: int,
    step_s: float,
    all_reduces: int,
    nbytes: float,
    num_processes: int,
    link: LinkModel,
) -> float:
  """Predicted seconds of ``num_steps`` steps of a synchronous program across
  processes (module docstring, first equation).

  Args:
    num_steps: n, steps (int >= 0).
    step_s: t_step, the measured seconds of one step without the link.
    all_reduces: N, the all-reduces across processes in those steps.
    nbytes: B, their payload bytes per device in all (``Communication.bytes``).
    num_processes: P, the processes the all-reduces' groups span (1: no link crossed).
    link: the link between the processes.

  Returns:
    float, seconds.

  Raises:
    ValueError: a negative or non-integer count, a negative step time or size.
  """
  n = checks.integer("num_steps", num_steps, 0)
  t = checks.real("step_s", step_s, 0)
  count = checks.integer("all_reduces", all_reduces, 0)
  P = checks.integer("num_processes", num_processes, 1)
  if P == 1 or count == 0:
    return n * t
  payload = ring_payload(nbytes, P)
  return n * t + count * link.latency_s + link.wire(payload, payload) / link.rate_bytes_s


def async_seconds(
    boundaries: Sequence[int],
    num_workers: int,
    step_s: Sequence[float],
    tau: int,
    push_bytes: float,
    pull_bytes: float,
    link: LinkModel,
    burst_bytes: float,
    *,
    chunk_steps: int | None = None,
    offset: int = 0,
    delays_s: Sequence[float] = (),
) -> list[float]:
  r"""Predicted clock of real asynchronous workers behind emulated links, sharing a machine.

  The run goes from boundary to boundary (its evaluations and checkpoints): boundary k is
  reached when the workers' local steps sum to ``boundaries[k]`` and every worker has
  stopped. In between, as ``easgd.runtimes.driver`` does, each idle worker (in index
  order) is handed a chunk of

  .. math::

     n_i = \max(1, \min(c, \lceil R\, v_i / \textstyle\sum_j v_j \rceil, R))

  steps (c = ``chunk_steps``, None: unbounded; R the steps not yet handed out; v_i the
  worker's measured rate, steps per second of its last chunk averaged with the rate before:
  equal shares until every worker has one). Before each step whose clock c (the worker's
  own, from 0 over the run) has c mod ``tau`` = ``offset``, the worker pushes
  ``push_bytes`` (waiting its push bucket's delay), then pulls ``pull_bytes`` (its pull
  bucket's), each bucket of rate ``link.rate_bytes_s`` and size ``burst_bytes`` (one pair
  per worker, as ``easgd.runtimes.link_emulation``). The workers share the machine's
  cores: while k workers compute at once each step takes ``step_s[k - 1]`` seconds
  (``step_s`` of one entry: the same for every k). A straggler's ``delays_s[i]`` seconds
  follow each of its steps (a sleep, as ``worker_delays``: no core used). Center service
  time is not counted. One worker:

  .. math::

     T = n\,t + \sum_{k=1}^{E} \left(d^\uparrow_k + d^\downarrow_k\right)

  Returns:
    list of floats: the clock (seconds) at each boundary.

  Raises:
    ValueError: a negative step count or step time, no step time, tau < 1.
  """
  if not step_s:
    raise ValueError("step_s must hold at least one step time (seconds per step)")
  t_of = [checks.real("step_s", t, 0) for t in step_s]
  tau = checks.integer("tau", tau, 1)
  p = checks.integer("num_workers", num_workers, 1)
  c_max = math.inf if chunk_steps is None else checks.integer("chunk_steps", chunk_steps, 1)
  delays = [checks.real("delays_s", d, 0) for d in delays_s] or [0.0] * p
  buckets = [(_Bucket(link, burst_bytes), _Bucket(link, burst_bytes)) for _ in range(p)]
  clock = [0] * p  # each worker's clock: steps taken
  end = [None] * p  # the clock at which the worker's chunk ends (None: idle)
  start = [0.0] * p  # when its chunk began
  rate = [None] * p  # measured steps per second
  size = [0] * p  # steps of its chunk
  left = [0.0] * p  # of the step in progress: the part left (0: at a step boundary)
  wake = [0.0] * p  # waiting (on the link, or a straggler's sleep) until
  now, out = 0.0, []
  total = 0

  def due(i):
    return clock[i] < end[i] and clock[i] % tau == offset

  def fill(target):
    for i in range(p):
      remaining = target - total - sum(n for n, e in zip(size, end) if e is not None)
      if remaining <= 0:
        return
      if end[i] is None:
        known = [r for r in rate if r]
        share = remaining * rate[i] / sum(known) if rate[i] and len(known) == p else remaining / p
        size[i] = max(1, min(c_max, math.ceil(share), remaining))
        end[i], start[i] = clock[i] + size[i], now
        wake[i] = _exchange(buckets[i], now, push_bytes, pull_bytes) if due(i) else now

  for target in boundaries:
    fill(target)
    while True:
      finished = [i for i in range(p) if end[i] == clock[i] and wake[i] <= now]
      for i in finished:  # the chunk is collected: its rate measured, its steps counted
        seconds = now - start[i]
        if seconds > 0:
          r = size[i] / seconds
          rate[i] = r if rate[i] is None else 0.5 * (rate[i] + r)
        total += size[i]
        end[i] = None
      if finished:
        fill(target)
      busy = [i for i in range(p) if end[i] is not None]
      if not busy:
        break
      waiting = [i for i in busy if wake[i] > now]
      active = [i for i in busy if wake[i] <= now]  # (its chunk not done: not collected)
      t = t_of[min(len(active), len(t_of)) - 1] if active else 0.0
      for i in active:
        if left[i] <= 0:
          left[i] = 1.0
      dt = min([left[i] * t for i in active] + [wake[i] - now for i in waiting])
      now += dt
      for i in active:
        left[i] -= dt / t if t > 0 else left[i]
        if left[i] <= 1e-9:  # the step is done (then its straggler's sleep)
          left[i] = 0.0
          clock[i] += 1
          wake[i] = now + delays[i]
          if due(i):
            wake[i] = _exchange(buckets[i], wake[i], push_bytes, pull_bytes)
    out.append(now)
  return out


def _exchange(buckets, now: float, push_bytes: float, pull_bytes: float) -> float:
  """The time a worker's exchange starting at ``now`` has arrived: push, then pull."""
  up, down = buckets
  t = now + up.charge(push_bytes, now)
  return t + down.charge(pull_bytes, t)


class _Bucket:
  """One direction of an emulated link: a transfer of b bytes at time t waits
  L + max(0, (b - tokens) / r), the bucket full at the first transfer, refilled at r up
  to its size between transfers, each transfer taking its bytes (the content going
  negative while it is paid for)."""

  def __init__(self, link: LinkModel, burst_bytes: float):
    self.r, self.B, self.L = link.rate_bytes_s, float(burst_bytes), link.latency_s
    self.tokens, self.last = self.B, None

  def charge(self, nbytes: float, now: float) -> float:
    if math.isinf(self.r):
      return self.L
    if self.last is not None:
      self.tokens = min(self.B, self.tokens + self.r * (now - self.last))
    delay = self.L + max(0.0, (nbytes - self.tokens) / self.r)
    self.tokens, self.last = self.tokens - nbytes, now
    return delay
