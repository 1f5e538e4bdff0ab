"""A real slow link between the processes of a run: network namespaces shaped by ``tc``.

:class:`Link` is the link (rate, queue latency, burst) parsed from tc spellings;
:func:`network` makes N network namespaces joined by veth pairs (a bridge for N > 2)
whose egress is shaped by the token-bucket filter, and removes all of it on every
exit; :func:`run_processes` runs ``easgd train`` once per namespace; :func:`main_link`
is ``easgd link``. See docs/guides/slow_link.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator, Sequence

from easgd._util import files

NETNS_DIR = Path("/etc/netns")
"""Where ``ip netns exec NAME`` finds the files it bind-mounts over ``/etc`` (our hosts file)."""
PORT = 29400
"""The coordinator's port in namespace 0 (the namespaces are fresh: every port is free)."""
IP_TIMEOUT_S = 20.0
"""The longest one ``ip`` or ``tc`` command may take."""
MAX_PROCESSES = 64
"""The most processes one link joins (one /24; veth names of at most 15 characters)."""
GRACE_S = 60.0
"""How long the processes get to stop after a signal is passed on, before SIGKILL."""

_RATE_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "kibit": 2**10,
    "mibit": 2**20,
    "gibit": 2**30,
    "tibit": 2**40,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
}
_TIME_UNITS = {
    "s": 1,
    "sec": 1,
    "secs": 1,
    "ms": 1e-3,
    "msec": 1e-3,
    "msecs": 1e-3,
    "us": 1e-6,
    "usec": 1e-6,
    "usecs": 1e-6,
}
_SIZE_UNITS = {"b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?\s*([a-z]+)\s*$", re.I)


class LinkError(ValueError):
  """A link that cannot be asked for or made: a bad rate, latency or burst, too few
  processes, a machine that cannot make namespaces. Its text is one line."""


def _quantity(flag: str, text, units: dict, what: str, example: str, least: str) -> float:
  """``text`` (a positive number and one of ``units``) in the base unit (bit/s, s, bytes).

  Raises:
    LinkError: no unit, an unknown unit, a number that is not positive and finite, or
      one below ``least`` of the base unit.
  """
  text = str(text)
  match = _NUMBER.match(text)
  value = None
  if match and match.group(2).lower() in units:
    value = float(text[: match.start(2)]) * units[match.group(2).lower()]
  smallest = float(least.rstrip("abcdefghijklmnopqrstuvwxyz")) * units[least.lstrip("0123456789.")]
  if value is None or not (smallest <= value < float("inf")):
    raise LinkError(
        f"{flag} {text!r} is not {what}: a positive number (at least {least}) with a unit, "
        f"one of {', '.join(units)} (e.g. {example})"
    )
  return value


def rate_bit_s(text, flag: str = "--rate") -> float:
  """A rate in tc's spelling (e.g. ``"10mbit"``; bps, kbps... are bytes/s) in bit/s.

  Raises:
    LinkError: not a positive number of at least 1 bit/s with a unit (one line naming
      ``flag``, the value and the units).
  """
  return _quantity(flag, text, _RATE_UNITS, "a rate", "100mbit, 1gbit", "1bit")


def seconds(text, flag: str = "--latency") -> float:
  """A time in tc's spelling (e.g. ``"5ms"``: s, ms, us, sec, msec, usec) in seconds.

  Raises:
    LinkError: not a positive number of at least 1 us with a unit (one line).
  """
  return _quantity(flag, text, _TIME_UNITS, "a latency", "5ms", "1us")


def size_bytes(text, flag: str = "--burst") -> float:
  """A size in tc's spelling (e.g. ``"64kb"``: b; k, kb, m, mb, g, gb of 1024) in bytes.

  Raises:
    LinkError: not a positive number of at least 1 byte with a unit (one line).
  """
  return _quantity(flag, text, _SIZE_UNITS, "a size", "64kb", "1b")


@dataclasses.dataclass(frozen=True)
class Link:
  """The link each process's egress is shaped to (``tc ... tbf rate R burst B latency L``).

  Attributes:
    rate_bit_s: the rate in bit/s (integer, >= 1).
    latency_s: tbf's latency in seconds: the longest a packet waits in the shaper's
      queue before it is dropped (queue size = rate x latency + burst). Not a
      propagation delay: that needs ``netem``, which these kernels lack.
    burst_bytes: the token bucket's size in bytes (what may leave at full speed).
  """

  rate_bit_s: int
  latency_s: float
  burst_bytes: int

  DEFAULT_LATENCY = "50ms"
  DEFAULT_BURST_S = 1e-3
  """Default burst: the bytes of 1 ms at the rate, at least :attr:`MIN_BURST_BYTES`."""
  MIN_BURST_BYTES = 16 * 2**10

  @classmethod
  def parse(cls, rate, latency=None, burst=None) -> "Link":
    """The link of the user's strings, in tc's spellings.

    Args:
      rate: e.g. ``"100mbit"``, ``"1gbit"``, ``"10mbit"`` (bit, kbit, mbit, gbit, tbit
        and kibit...; bps, kbps... are bytes/s), at least 1 bit/s.
      latency: e.g. ``"5ms"`` (s, ms, us and tc's sec/msec/usec), at least 1 us;
        None: :attr:`DEFAULT_LATENCY`.
      burst: e.g. ``"64kb"`` (b; k, kb, m, mb, g, gb of 1024), at least 1 byte;
        None: 1 ms of traffic at ``rate``, at least 16 KiB.

    Raises:
      LinkError: a value without a valid unit, or not positive; its line names the value
        and the units allowed.
    """
    rate = rate_bit_s(rate)
    latency_s = seconds(cls.DEFAULT_LATENCY if latency is None else latency)
    burst_bytes = cls.default_burst(rate) if burst is None else size_bytes(burst)
    return cls(round(rate), round(latency_s * 1e6) / 1e6, round(burst_bytes))

  @classmethod
  def default_burst(cls, rate: float) -> float:
    """The default burst in bytes of a rate in bit/s: 1 ms of traffic, at least 16 KiB."""
    return max(cls.MIN_BURST_BYTES, rate / 8 * cls.DEFAULT_BURST_S)

  def tbf(self) -> list[str]:
    """tc's arguments after ``root``: ``tbf rate Rbit burst Bb latency Lus`` (exact integers)."""
    return [
        "tbf",
        "rate",
        f"{self.rate_bit_s}bit",
        "burst",
        f"{self.burst_bytes}b",
        "latency",
        f"{round(self.latency_s * 1e6)}us",
    ]


@dataclasses.dataclass(frozen=True)
class Network:
  """The namespaces :func:`network` made, one per process.

  Attributes:
    tag: the run's token in every name it made (``ez<pid><letter>``).
    namespaces: ``ip netns`` names, process i's at index i.
    addresses: process i's IPv4 address (on :attr:`subnet`).
    subnet: the private /24 the run uses.
    hostname: the name each namespace's hosts file maps to its own address.
  """

  tag: str
  namespaces: tuple[str, ...]
  addresses: tuple[str, ...]
  subnet: str
  hostname: str

  def exec_prefix(self, i: int) -> list[str]:
    """The command prefix that runs a program in process ``i``'s namespace."""
    return ["ip", "netns", "exec", self.namespaces[i]]


_tags = itertools.count()


def _new_tag() -> str:
  """``ez<pid><letter>``: unique to this process and this call (veth names stay <= 15 chars)."""
  return f"ez{os.getpid()}{'abcdefghijklmnopqrstuvwxyz'[next(_tags) % 26]}"


def _sh(cmd: Sequence[str]) -> subprocess.CompletedProcess:
  """Runs ``cmd`` (``ip``/``tc``), bounded by :data:`IP_TIMEOUT_S`; never raises on its status."""
  try:
    return subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
  except subprocess.TimeoutExpired:
    return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {IP_TIMEOUT_S:g} s")


def _do(cmd: Sequence[str]) -> None:
  """Runs ``cmd``; raises :class:`LinkError` naming it and its message if it fails."""
  out = _sh(cmd)
  if out.returncode != 0:
    said = (out.stderr or out.stdout).strip().splitlines()
    raise LinkError(
        f"cannot make the link: '{' '.join(cmd)}' failed: "
        f"{said[-1] if said else f'exit status {out.returncode}'}"
    )


def unavailable() -> str | None:
  """Why namespaces cannot be made here (not root; no ``ip`` or ``tc``), or None."""
  if os.geteuid() != 0:
    return f"network namespaces need root (this user has uid {os.geteuid()})"
  for tool, package in (("ip", "iproute2"), ("tc", "iproute2")):
    if shutil.which(tool) is None:
      return f"no '{tool}' command on PATH (package {package})"
  return None


def free_subnet(seed: int | None = None) -> ipaddress.IPv4Network:
  """A /24 of 10.213.0.0/16 that no address of ``ip -o addr`` overlaps.

  Raises:
    LinkError: every candidate is used, or ``ip -o addr`` fails.
  """
  out = _sh(["ip", "-o", "addr"])
  if out.returncode != 0:
    raise LinkError(f"'ip -o addr' failed: {out.stderr.strip()}")
  used = [
      ipaddress.ip_network(m, strict=False) for m in re.findall(r"\binet (\S+/\d+)", out.stdout)
  ]
  start = os.getpid() if seed is None else seed
  for k in range(256):
    candidate = ipaddress.ip_network(f"10.213.{(start + k) % 256}.0/24")
    if not any(candidate.overlaps(u) for u in used):
      return candidate
  raise LinkError("no free /24 in 10.213.0.0/16 (every one overlaps an address of 'ip -o addr')")


class _Made:
  """What :func:`network` asked for, recorded before each command (removal tolerates absence)."""

  def __init__(self):
    self.namespaces: list[str] = []
    self.links: list[str] = []  # veth ends that start in the root namespace
    self.dirs: list[Path] = []
    self.netns_dir_made = False


def _create(made: _Made, link: Link, n: int, tag: str, hostname: str) -> Network:
  subnet = free_subnet()
  hosts = [str(subnet.network_address + i + 1) for i in range(n)]
  spaces = [f"easgd-{tag}-{i}" for i in range(n)]
  ends = [f"{tag}v{i}" for i in range(n)]  # the end inside process i's namespace
  for ns in spaces:
    made.namespaces.append(ns)
    _do(["ip", "netns", "add", ns])
  if n == 2:
    made.links += ends
    _do(["ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1]])
  else:
    hub, bridge = f"easgd-{tag}-hub", f"{tag}br"
    made.namespaces.append(hub)
    _do(["ip", "netns", "add", hub])
    _do(["ip", "-n", hub, "link", "add", bridge, "type", "bridge"])
    _do(["ip", "-n", hub, "link", "set", bridge, "up"])
    for i, end in enumerate(ends):
      port = f"{tag}p{i}"
      made.links += [end, port]
      _do(["ip", "link", "add", end, "type", "veth", "peer", "name", port])
      _do(["ip", "link", "set", port, "netns", hub])
      _do(["ip", "-n", hub, "link", "set", port, "master", bridge])
      _do(["ip", "-n", hub, "link", "set", port, "up"])
  for ns, end, address in zip(spaces, ends, hosts):
    _do(["ip", "link", "set", end, "netns", ns])
    _do(["ip", "-n", ns, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", end])
    _do(["ip", "-n", ns, "link", "set", end, "up"])
    _do(["ip", "-n", ns, "link", "set", "lo", "up"])
    _do(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", end, "root", *link.tbf()])
  if not NETNS_DIR.exists():
    made.netns_dir_made = True
  for ns, address in zip(spaces, hosts):
    made.dirs.append(NETNS_DIR / ns)
    (NETNS_DIR / ns).mkdir(parents=True, exist_ok=True)
    (NETNS_DIR / ns / "hosts").write_text(
        f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{address}\t{hostname}\n"
    )
  return Network(tag, tuple(spaces), tuple(hosts), str(subnet), hostname)


def leftovers(tag: str) -> list[str]:
  """What of the run ``tag`` is still on the machine: namespaces, links, /etc/netns entries."""
  found = [f"namespace {n}" for n in _sh(["ip", "netns", "list"]).stdout.split() if tag in n]
  found += [
      f"link {m}" for m in re.findall(r"^\d+: ([^:@\s]+)", _sh(["ip", "-o", "link"]).stdout, re.M)
  ]
  found = [f for f in found if tag in f]
  if NETNS_DIR.is_dir():
    found += [f"{NETNS_DIR / p.name}" for p in NETNS_DIR.iterdir() if tag in p.name]
  return found


def _teardown(made: _Made, tag: str) -> None:
  """Removes what ``made`` records (deleting a namespace deletes its veth ends); warns
  naming anything that stays."""
  for ns in reversed(made.namespaces):
    _sh(["ip", "netns", "del", ns])
  for name in made.links:  # only those never moved into a namespace are still here
    if _sh(["ip", "link", "show", name]).returncode == 0:
      _sh(["ip", "link", "del", name])
  for d in made.dirs:
    shutil.rmtree(d, ignore_errors=True)
  if made.netns_dir_made:
    with contextlib.suppress(OSError):  # another run's entry: it stays
      NETNS_DIR.rmdir()
  left = leftovers(tag)
  if left:
    warnings.warn(
        f"the link's teardown left {', '.join(left)}; remove with 'ip netns del'", stacklevel=2
    )


@contextlib.contextmanager
def network(link: Link, num_processes: int) -> Iterator[Network]:
  """N network namespaces joined through links shaped to ``link``; all removed on exit.

  Process i's namespace holds one veth end with address ``10.213.X.(i+1)/24`` (a /24
  that no address of ``ip -o addr`` overlaps), ``lo`` up, its egress shaped by
  ``tc qdisc add dev END root tbf ...`` (:meth:`Link.tbf`), and a hosts file
  (``/etc/netns/NAME/hosts``) mapping this machine's hostname to that address (gloo
  binds to it). N = 2: one veth pair; N > 2: a bridge in one more namespace.
  Everything is removed when the block ends: normally, by an exception, or by
  SIGINT/SIGTERM (raised as KeyboardInterrupt: ``easgd._util.files.terminate_as_interrupt``,
  turned on here if the caller has not); signals are held back while the namespaces
  are made and removed, so none is left half made.

  Args:
    link: the shaping of every process's egress.
    num_processes: N >= 2.

  Yields:
    The :class:`Network` (names, addresses).

  Raises:
    LinkError: N < 2; namespaces cannot be made here (not root, no ``ip``/``tc``); an
      ``ip``/``tc`` command failed (then what was made is removed first).
  """
  if num_processes < 2:
    raise LinkError(
        f"a link joins 2 or more processes; --num-processes {num_processes} is the spmd "
        "single-process runtime, which no link can cross"
    )
  if num_processes > MAX_PROCESSES:
    raise LinkError(
        f"--num-processes {num_processes}: a link joins at most {MAX_PROCESSES} processes"
    )
  reason = unavailable()
  if reason:
    raise LinkError(f"cannot make network namespaces: {reason}")
  own = contextlib.ExitStack()
  if not files.sigterm_is_interrupt():
    own.enter_context(files.terminate_as_interrupt())
  with own:
    made, tag = _Made(), _new_tag()
    try:
      with files.interrupts_deferred():
        net = _create(made, link, num_processes, tag, socket.gethostname())
      yield net
    finally:
      with files.interrupts_deferred():
        _teardown(made, tag)


# -- the processes -------------------------------------------------------------

_SET_BY_LINK = ("--num-processes", "--process-id", "--coordinator-address")


def train_command(train_args: Sequence[str], net: Network, i: int, port: int) -> list[str]:
  """Process ``i``'s command: ``ip netns exec NS python -m easgd.cli train ... --process-id i``."""
  return [
      *net.exec_prefix(i),
      sys.executable,
      "-m",
      "easgd.cli",
      *train_args,
      "--num-processes",
      str(len(net.namespaces)),
      "--process-id",
      str(i),
      "--coordinator-address",
      f"{net.addresses[0]}:{port}",
  ]


def check_train_args(train_args: Sequence[str]) -> list[str]:
  """The train command after ``--`` (``train ...``), without the leading ``--``.

  Raises:
    LinkError: no command, one other than ``train``, or one that sets a flag the link sets.
  """
  args = list(train_args)
  if args[:1] == ["--"]:
    args = args[1:]
  if not args or args[0] != "train":
    got = f"got {' '.join(args)!r}" if args else "got none"
    raise LinkError(
        "easgd link runs a train command given after '--' (e.g. easgd link --rate 10mbit "
        f"--num-processes 2 -- train --workdir W --mapping-backend shard_map); {got}"
    )
  for flag in _SET_BY_LINK:
    if any(a == flag or a.startswith(flag + "=") for a in args):
      raise LinkError(f"the link sets {flag} itself; remove it from the train command")
  return args


def _stream(pipe, out, prefix: str) -> None:
  for line in pipe:
    out.write(prefix + line)
    out.flush()


def _status(code: int) -> int:
  """A process's exit status as a shell reports it (killed by signal N: 128 + N)."""
  return 128 - code if code < 0 else code


def run_processes(commands: Sequence[Sequence[str]], env=None) -> int:
  """Runs ``commands`` at once, their output on this one's, each line ``[i] ``-prefixed.

  On SIGINT/SIGTERM (KeyboardInterrupt) every process still running gets SIGTERM (an
  ``easgd`` command stops as by Ctrl-C, exit 143); after :data:`GRACE_S` seconds,
  SIGKILL; then the interrupt is raised again.

  Returns:
    The worst exit status (the largest; a process killed by signal N counts 128 + N).
  """
  procs, threads = [], []
  try:
    for i, cmd in enumerate(commands):
      p = subprocess.Popen(
          list(cmd),
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          errors="replace",
      )
      procs.append(p)
      for pipe, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
        t = threading.Thread(target=_stream, args=(pipe, out, f"[{i}] "), daemon=True)
        t.start()
        threads.append(t)
    while any(p.poll() is None for p in procs):
      files.check_interrupt()
      time.sleep(0.1)
  except KeyboardInterrupt:
    _stop(procs, signal.SIGTERM)
    raise
  finally:
    _stop(procs, signal.SIGKILL, grace_s=0)
    for t in threads:
      t.join(5)
  return max(_status(p.returncode) for p in procs)


def _stop(procs, sig, grace_s: float = GRACE_S) -> None:
  """Sends ``sig`` to the running ``procs``, waits up to ``grace_s``, then SIGKILLs them."""
  for p in procs:
    if p.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        p.send_signal(sig)
  deadline = time.monotonic() + grace_s
  for p in procs:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def add_link_arguments(p) -> None:
  """The flags of ``easgd link`` (argparse): the link, N, and the train command after ``--``."""
  p.add_argument(
      "--rate",
      required=True,
      help="each process's egress rate, a number with tc's unit: bit, kbit, mbit, gbit, tbit "
      "(kibit...: of 1024), bps, kbps, mbps, gbps (bytes/s); e.g. 100mbit, 1gbit",
  )
  p.add_argument(
      "--latency",
      default=None,
      help="tbf's latency: the longest a packet waits in the shaper's queue before it is "
      f"dropped (not a propagation delay); s, ms, us; default {Link.DEFAULT_LATENCY}",
  )
  p.add_argument(
      "--burst",
      default=None,
      help="tbf's burst (bucket size): b, kb, mb, gb (of 1024); default 1 ms at the rate, "
      "at least 16kb",
  )
  p.add_argument(
      "--num-processes",
      type=int,
      required=True,
      metavar="N",
      help="the processes (2 or more), one per network namespace",
  )
  p.add_argument(
      "--port",
      type=int,
      default=PORT,
      help="the coordinator's port in process 0's namespace (default: %(default)s)",
  )
  p.add_argument(
      "train_command",
      nargs="...",
      metavar="-- train --workdir W ...",
      help="the easgd train command each process runs; the link adds --num-processes, "
      "--process-id and --coordinator-address",
  )


def main_link(args) -> int:
  """``easgd link``: checks everything, makes the link, runs the processes, removes the link.

  Returns:
    The worst exit status of the processes; 2 with one line ``easgd: error: ...`` for
    bad input or a machine that cannot make namespaces (nothing left behind).
  """
  try:
    train_args = check_train_args(args.train_command)
    if not 1 <= args.port <= 65535:
      raise LinkError(f"--port {args.port} is not a port: an integer in [1, 65535]")
    link = Link.parse(args.rate, args.latency, args.burst)
    with network(link, args.num_processes) as net:
      print(
          f"easgd link: {args.num_processes} processes on {net.subnet}, egress of each "
          f"shaped to {' '.join(link.tbf())} ({', '.join(net.namespaces)})",
          file=sys.stderr,
          flush=True,
      )
      commands = [train_command(train_args, net, i, args.port) for i in range(args.num_processes)]
      return run_processes(commands, env={**os.environ, "PYTHONUNBUFFERED": "1"})
  except LinkError as e:
    print(f"easgd: error: {e}", file=sys.stderr)
    return 2
