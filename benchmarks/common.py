"""Shared pieces of the benchmark scripts: fake devices, timing, a model.

Timing method (every script): each candidate is a closure that runs ``steps``
steps and blocks on the result. After ``warmup`` untimed calls per candidate
(compilation, caches), the candidates are timed in ROUND-ROBIN order
``repeats`` times (A B C A B C ...), so that load from other processes on the
machine hits all of them alike; a candidate's figure is the MEDIAN over its
repeats of (wall time / steps). Ratios are of these medians.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def force_cpu_devices(n: int) -> None:
  """Fakes ``n`` CPU devices; must run before JAX is imported."""
  if "jax" in sys.modules:
    raise RuntimeError("force_cpu_devices must run before JAX is imported")
  flags = [
      f
      for f in os.environ.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count")
  ]
  os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])


def machine() -> str:
  import jax

  dev = jax.devices()[0]
  return (
      f"{platform.machine()} {os.cpu_count()} CPU cores, {jax.device_count()} "
      f"{dev.platform} device(s) ({dev.device_kind}), JAX {jax.__version__}, "
      f"Python {platform.python_version()}"
  )


def time_side_by_side(
    candidates: dict, steps: int, repeats: int, warmup: int = 2
) -> dict[str, dict]:
  """Median seconds per step of each candidate, timed round-robin (see module doc).

  Args:
    candidates: name -> ``run(steps)`` that runs ``steps`` steps and blocks.
    steps: steps per timed call.
    repeats: timed calls per candidate.
    warmup: untimed calls per candidate first.

  Returns:
    name -> {"median_s": float, "all_s": list of per-step seconds}.
  """
  for run in candidates.values():
    for _ in range(warmup):
      run(steps)
  times = {name: [] for name in candidates}
  for _ in range(repeats):
    for name, run in candidates.items():
      t0 = time.perf_counter()
      run(steps)
      times[name].append((time.perf_counter() - t0) / steps)
  return {name: dict(median_s=statistics.median(t), all_s=t) for name, t in times.items()}


def one_step_late(previous, current):
  """Waits for ``previous`` (last step's loss) and returns ``current``.

  A loop calling this after each step keeps at most two steps in flight: the
  device stays busy, but the queue cannot grow without bound. With hundreds of
  queued steps, XLA's in-process CPU all-reduce deadlocked on this 2-core
  machine ("Termination timeout for all reduce ... only 1 of them arrived").
  """
  if previous is not None:
    previous.block_until_ready()
  return current


def step_loop(f, carry, *args, clock: bool = False):
  """A timed loop over a compiled step ``f(*carry, *args) -> (*carry, loss)``.

  Returns ``(run, state)``: ``run(steps)`` takes ``steps`` steps from
  ``state["carry"]`` (waiting one step late, see :func:`one_step_late`), blocks
  until the carry is ready, and stores the new carry and the last loss in
  ``state`` (``state["loss"]``), so repeated calls continue the same run.
  With ``clock=True`` the step count so far is passed as a last argument
  (``easgd.parallel.mapping.map_step``'s ``step_fn(..., clock)``).
  """
  import jax  # lazily, like the rest of this module (see force_cpu_devices)

  state = {"carry": tuple(carry), "loss": None, "clock": 0}

  def run(steps):
    c, last = state["carry"], None
    for _ in range(steps):
      *c, loss = f(*c, *args, *((state["clock"],) if clock else ()))
      state["clock"] += 1
      last = one_step_late(last, loss)
    jax.block_until_ready(c)
    state["carry"], state["loss"] = tuple(c), last

  return run, state


def spread(all_s) -> str:
  """Relative half-range of repeats around the median, as text."""
  m = statistics.median(all_s)
  return f"+-{50 * (max(all_s) - min(all_s)) / m:.0f}%"


def mlp_setup(hidden=(256, 256), input_shape=(28, 28, 1), num_classes=10, seed=0):
  """(model, params, loss_fn) of the trainer's MLP on Fashion-MNIST-shaped input."""
  import jax

  from easgd.settings import builtin_tasks
  from easgd.tasks import models

  model = models.MLP(num_classes=num_classes, hidden=tuple(hidden))
  params = models.init_params(model, input_shape, jax.random.key(seed))
  return model, params, builtin_tasks.make_loss_fn(model)


def random_batch(shape_lead, input_shape=(28, 28, 1), num_classes=10, seed=1):
  """Host arrays x [*shape_lead, *input_shape] float32, y [*shape_lead] int32."""
  import numpy as np

  rng = np.random.default_rng(seed)
  x = rng.normal(size=(*shape_lead, *input_shape)).astype(np.float32)
  y = rng.integers(0, num_classes, size=shape_lead).astype(np.int32)
  return x, y


def int_list(text: str) -> tuple[int, ...]:
  return tuple(int(t) for t in text.split(",") if t.strip())


# -- compiled HLO text ---------------------------------------------------------

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}


def shape_bytes(type_text: str) -> int:
  """Bytes of an HLO type such as ``f32[784,256]{1,0}`` or a tuple of them."""
  import re

  total = 0
  for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", type_text):
    if dtype not in DTYPE_BYTES:
      continue
    n = 1
    for d in dims.split(","):
      if d:
        n *= int(d)
    total += n * DTYPE_BYTES[dtype]
  return total


def parse_hlo(text: str):
  """Computations of an HLO module: name -> list of (op, type_text, line), and
  the name of the ENTRY computation."""
  import re

  comps, entry, current = {}, None, None
  header = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
  for line in text.splitlines():
    if current is None:
      m = header.match(line)  # computations start in column 0, ops are indented
      if m and not line[:1].isspace():
        current = m.group(2)
        comps[current] = []
        if m.group(1):
          entry = current
      continue
    if line.strip() == "}":
      current = None
      continue
    m = re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*)$", line)
    if not m:
      continue
    rest = m.group(1)
    if rest.startswith("("):  # tuple type: up to the matching parenthesis
      depth = 0
      for i, ch in enumerate(rest):  # noqa: B007 (i is read after the loop)
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
          break
      type_text, rest = rest[: i + 1], rest[i + 1 :].lstrip()
    else:
      type_text, _, rest = rest.partition(" ")
    op = rest.split("(", 1)[0].strip()
    comps[current].append((op, type_text, line))
  return comps, entry


def _callees(line: str):
  import re

  names = []
  for key in ("branch_computations", "called_computations"):
    m = re.search(key + r"=\{([^}]*)\}", line)
    if m:
      names += [n.strip().lstrip("%") for n in m.group(1).split(",")]
  for key in ("true_computation", "false_computation", "calls", "body", "condition", "to_apply"):
    m = re.search(key + r"=%?([\w.\-]+)", line)
    if m:
      names.append(m.group(1))
  return names


def collectives(text: str, op_name: str = "all-reduce"):
  """All-reduce ops (or ``op_name``) of a compiled program, split by where they run.

  Returns:
    dict with "always" and "conditional" entries, each {"count", "bytes"}: ops
    reachable from ENTRY without passing a ``conditional`` run every call;
    ops only reachable through a conditional's branches run when it takes that
    branch (EASGD: the exchange). Bytes are the ops' result sizes (= operand
    sizes for all-reduce), per device.
  """
  comps, entry = parse_hlo(text)
  out = {"always": {"count": 0, "bytes": 0}, "conditional": {"count": 0, "bytes": 0}}
  seen = set()

  def walk(name, under_cond):
    if (name, under_cond) in seen or name not in comps:
      return
    seen.add((name, under_cond))
    for op, type_text, line in comps[name]:
      if op in (op_name, op_name + "-start"):
        slot = out["conditional" if under_cond else "always"]
        slot["count"] += 1
        slot["bytes"] += shape_bytes(type_text)
      for callee in _callees(line):
        walk(callee, under_cond or op == "conditional")

  walk(entry, False)
  return out


def op_bytes(text: str, op_name: str = "copy") -> tuple[int, int]:
  """(count, result bytes) of every ``op_name`` op in the program."""
  comps, _ = parse_hlo(text)
  ops = [(op, t) for c in comps.values() for op, t, _ in c if op == op_name]
  return len(ops), sum(shape_bytes(t) for _, t in ops)
