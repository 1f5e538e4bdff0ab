"""An emulated link in the exchange path of the real asynchronous runtimes.

Each worker of a "threads" or "ray" run may sit behind a link of its own
(``TrainConfig.link_rate``, ``link_rates``, ``link_latency``, ``link_burst``): a
token bucket for the bandwidth plus a fixed latency, one bucket for the
worker's pushes (worker -> center) and one for its pulls (center -> worker).
The worker sleeps on its own thread (or actor) for the delay its bucket
charges; the link changes time, never results. No root is needed. See
docs/guides/runtimes.md ("An emulated link").
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import jax

from easgd.core import elastic
from easgd.parallel import link


@dataclasses.dataclass(frozen=True)
class LinkSpec:
  """One worker's link (picklable: a Ray actor builds its :class:`WorkerLink`).

  Attributes:
    rate_bytes_s: the bucket's refill rate r, bytes/s (``math.inf``: no limit).
    burst_bytes: the bucket's size B, bytes (what leaves at once from a full bucket).
    latency_s: the fixed latency L of every transfer, seconds (>= 0).
  """

  rate_bytes_s: float
  burst_bytes: float
  latency_s: float


class TokenBucket:
  r"""A token bucket of rate r (bytes/s) and size B (bytes), plus a latency L (s).

  The bucket starts full. With ``tokens`` the bucket's content after the last
  transfer (at time t0; negative while a transfer larger than the content is
  still being paid for), a transfer of b bytes at time t has

      tokens(t) = min(B, tokens + r (t - t0))
      delay     = L + max(0, (b - tokens(t)) / r)

  and leaves ``tokens = tokens(t) - b``, ``t0 = t``. With r = inf the delay is L.

  Args:
    rate_bytes_s: r, > 0 (``math.inf``: no limit).
    burst_bytes: B, > 0.
    latency_s: L, >= 0.
    clock: the time in seconds when :meth:`charge` is given none (monotonic).
  """

  def __init__(
      self,
      rate_bytes_s: float,
      burst_bytes: float,
      latency_s: float,
      clock: Callable[[], float] = time.monotonic,
  ):
    self.rate, self.burst, self.latency = float(rate_bytes_s), float(burst_bytes), float(latency_s)
    self.clock = clock
    self.tokens, self.last = self.burst, None

  def charge(self, nbytes: int, now: float | None = None) -> float:
    """Charges a transfer of ``nbytes`` bytes at time ``now`` (s; None: ``clock()``).

    Returns:
      The delay in seconds before the transfer has arrived (class docstring).
    """
    now = self.clock() if now is None else float(now)
    if math.isinf(self.rate):
      return self.latency
    tokens = self.burst if self.last is None else self.tokens + self.rate * (now - self.last)
    tokens = min(self.burst, tokens)
    self.tokens, self.last = tokens - nbytes, now
    return self.latency + max(0.0, (nbytes - tokens) / self.rate)


class WorkerLink:
  """One worker's link: a :class:`TokenBucket` for its pushes and one for its pulls.

  Attributes:
    pushed_bytes, pulled_bytes: the bytes charged so far (ints), each transfer
      ``easgd.core.elastic.reduced_bytes`` of its message or reply (what the
      communication accounting counts for one exchange).
    waited_s: the delays charged so far, seconds.
  """

  def __init__(self, spec: LinkSpec, clock: Callable[[], float] = time.monotonic):
    self.spec = spec
    self.up = TokenBucket(spec.rate_bytes_s, spec.burst_bytes, spec.latency_s, clock)
    self.down = TokenBucket(spec.rate_bytes_s, spec.burst_bytes, spec.latency_s, clock)
    self.pushed_bytes = self.pulled_bytes = 0
    self.waited_s = 0.0

  def push(self, message) -> float:
    """The delay (s) of sending ``message`` (a pytree) to the center; waits for it to
    be computed first (the transfer starts then)."""
    nbytes, delay = self._charge(self.up, message)
    self.pushed_bytes += nbytes
    return delay

  def pull(self, reply) -> float:
    """The delay (s) of receiving ``reply`` (a pytree) from the center."""
    nbytes, delay = self._charge(self.down, reply)
    self.pulled_bytes += nbytes
    return delay

  def _charge(self, bucket: TokenBucket, tree) -> tuple[int, float]:
    nbytes = elastic.reduced_bytes(jax.block_until_ready(tree))
    delay = bucket.charge(nbytes)
    self.waited_s += delay
    return nbytes, delay


def worker_links(config) -> list[LinkSpec] | None:
  """Each worker's :class:`LinkSpec` from a validated ``TrainConfig``, or None (no link).

  A link is set by ``link_rate``, ``link_rates`` (one per worker, replacing
  ``link_rate``) or ``link_latency``; the rate of a worker without one is
  unlimited, the latency without ``link_latency`` 0, the burst without
  ``link_burst`` ``easgd.parallel.link.Link.default_burst`` of the rate; rates in
  whole bit/s, bursts in whole bytes and latencies in whole microseconds, as
  ``easgd.parallel.link.Link.parse`` rounds them.
  """
  rates = list(config.link_rates) or [config.link_rate] * config.num_workers
  if all(r is None for r in rates) and config.link_latency is None:
    return None
  latency = 0.0
  if config.link_latency is not None:  # whole microseconds, bit/s and bytes, as tc's
    latency = round(link.seconds(config.link_latency) * 1e6) / 1e6
  specs = []
  for rate in rates:
    if rate is None:
      specs.append(LinkSpec(math.inf, math.inf, latency))
      continue
    bit_s = round(link.rate_bit_s(rate))
    burst = link.Link.default_burst(bit_s)
    if config.link_burst is not None:
      burst = link.size_bytes(config.link_burst)
    specs.append(LinkSpec(bit_s / 8, round(burst), latency))
  return specs
