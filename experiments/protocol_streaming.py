"""Fragmented, delayed and compressed EASGD under the comparison protocol: bytes per sample.

    easgd protocol --config experiments/protocol_streaming.py \
        --workdir paper_notes/figures/protocol_streaming
    python experiments/protocol_streaming.py paper_notes/figures/protocol_streaming

The question: how few bytes per training sample can synchronous EASGD send (fragments,
an exchange applied one local step after it was sent, 8- or 4-bit or top-k compression
with error feedback: docs/guides/streaming.md) and still reach the test error of
full-precision EASGD within the difference the seeds resolve; and how that compares with
pmean SGD's bytes per sample; Streaming DiLoCo (its outer Nesterov step, the merge at
alpha = 1) beside it at equal bytes. Figure 2's setting (docs/guides/results.md): MNIST-1D, the
small 1-D CNN, p = 4 workers of 32 examples per step, 432 local steps per worker, every
arm's rate tuned on the validation split (5 log-spaced rates x 3 seeds) and reported on
16 fresh seeds at its chosen rate (the arms share the seeds, so the comparisons are
paired).

Bytes per sample (the table this file prints from ``results.json``): the bytes one worker
puts on the wire over the run, over the samples every worker together trained on: a ring
all-reduce of B payload bytes sends 2 (p - 1) / p B, a ring all-gather of an m-byte
payload (p - 1) m (``easgd.protocol.stats``), both per worker.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from easgd.protocol.config import Arm, ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

SGD_RATES = log_grid(0.01, 1.0, 5)  # plain SGD steps (EASGD's local SGD, pmean SGD)
STREAMING = dict(fragments=4, delay=1)  # 4 fragments, each applied 1 step after its send


def get_config() -> TrainConfig:
  """The base setting every arm starts from (``easgd train --config`` runs it)."""
  return TrainConfig(
      algorithm="easgd",  # synchronous EASGD, eq. (5)-(6)
      dataset="mnist1d",  # 8000 train / 2000 test signals, generated from the seed
      model="cnn",  # the small 1-D CNN (45k parameters)
      num_workers=4,  # p
      global_batch_size=128,  # examples per step, all workers (32 per worker)
      num_epochs=8,  # 8 x 54 = 432 local steps per worker
      learning_rate=0.1,  # replaced by each arm's chosen rate
      tau=4,  # communication period, local steps
      beta=0.9,  # center moving rate; alpha = beta / p (paper)
      validation_examples=1000,  # held out of the 8000 training signals
      progress=False,
  )


def get_protocol() -> ProtocolConfig:
  arms = [
      Arm("pmean_sgd", "pmean_sgd", {}, SGD_RATES),
      Arm("easgd tau=4", "easgd", dict(tau=4), SGD_RATES),  # full precision, the reference
      Arm("easgd tau=16 int8", "easgd", dict(tau=16, compression="int8", **STREAMING), SGD_RATES),
      Arm("easgd tau=16 int4", "easgd", dict(tau=16, compression="int4", **STREAMING), SGD_RATES),
      Arm(
          "easgd tau=16 top1%",
          "easgd",
          dict(tau=16, compression="topk", topk_fraction=0.01, **STREAMING),
          SGD_RATES,
      ),
      Arm("easgd tau=64 int4", "easgd", dict(tau=64, compression="int4", **STREAMING), SGD_RATES),
      Arm(
          "easgd tau=64 top1%",
          "easgd",
          dict(tau=64, compression="topk", topk_fraction=0.01, **STREAMING),
          SGD_RATES,
      ),
      # Streaming DiLoCo beside the elastic arms at the same fragments, delay, compression
      # and period (its bytes per sample within a few percent: it also syncs at the end)
      Arm(
          "streaming_diloco tau=16 top1%",
          "streaming_diloco",
          dict(tau=16, compression="topk", topk_fraction=0.01, **STREAMING),
          SGD_RATES,
      ),
      Arm(
          "streaming_diloco tau=64 int4",
          "streaming_diloco",
          dict(tau=64, compression="int4", **STREAMING),
          SGD_RATES,
      ),
  ]
  return ProtocolConfig(
      name="streaming_mnist1d",
      description=(
          "Fragmented (P = 4), delayed (V = 1) and compressed (int8, int4, top 1%) "
          "synchronous EASGD against full-precision EASGD and pmean SGD: Figure 2's "
          "setting (MNIST-1D, small CNN, p = 4, 432 local steps), rates tuned on a "
          "validation split, 16 paired report seeds."
      ),
      base=get_config(),
      arms=tuple(arms),
      tune_seeds=(0, 1, 2),  # 5 rates x 3 seeds per arm, on validation
      report_seeds=tuple(range(100, 116)),  # 16 fresh seeds at the chosen rate, on test
      eval_every_steps=27,  # half an epoch at p = 4
      targets=(0.5, 0.3),  # test errors of "time to target"
      networks=(GIGABIT_ETHERNET,),
      configs_per_batch=4,
  )


def wire_bytes_per_sample(arm: dict, num_workers: int) -> float:
  """Bytes one worker sends over the run per sample trained (module docstring)."""
  p = num_workers
  wire = 2 * (p - 1) / p * arm["bytes_per_worker"] + (p - 1) * arm.get(
      "gathered_bytes_per_worker", 0
  )
  return wire / arm["samples"]


REFERENCE = "easgd tau=4"
"""Full-precision synchronous EASGD: the test error the compressed arms are held to."""
EQUIVALENCE_PP = 1.0
"""The difference the report seeds are sized to resolve (percentage points): an arm is
"equivalent" to the reference where its paired 95% interval lies inside +/- this."""


def _errors(arm: dict) -> list[float]:
  """The final test error of each report seed (a diverged seed counts as 1)."""
  return [1.0 if e is None else float(e) for e in arm["final_test_errors"]]


def verdict(low: float, high: float) -> str:
  """The reading of a paired interval of arm minus reference (pp)."""
  if low > 0:
    return "worse"
  if high < 0:
    return "better"
  if -EQUIVALENCE_PP < low and high < EQUIVALENCE_PP:
    return f"equivalent within {EQUIVALENCE_PP:g} pp"
  return "not resolved"


def table(results: dict) -> str:
  """The markdown table of a ``results.json`` and the sentence it supports: each arm's
  final test error (mean over the report seeds, 95% interval), its difference from
  :data:`REFERENCE` per seed (paired: the arms share the report seeds) with its reading,
  bytes per sample, and pmean SGD's bytes per sample over the arm's."""
  from easgd.protocol import stats

  arms = results["arms"]
  pmean = wire_bytes_per_sample(arms["pmean_sgd"], arms["pmean_sgd"]["config"]["num_workers"])
  ref = _errors(arms[REFERENCE])
  lines = [
      f"| arm | final test error (%) | minus {REFERENCE}, paired (pp) | reading | "
      "bytes per sample per worker | pmean SGD's / this |",
      "| --- | --- | --- | --- | --- | --- |",
  ]
  held = []
  for name, arm in arms.items():
    err = arm["final_test_error"]
    per = wire_bytes_per_sample(arm, arm["config"]["num_workers"])
    if name == REFERENCE:
      diff, reading = "-", "reference"
    else:
      d = stats.mean_interval([100 * (a - b) for a, b in zip(_errors(arm), ref)])
      diff = f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"
      reading = verdict(d["low"], d["high"])
      if reading.startswith("equivalent") or reading == "better":
        held.append((per, name, diff, reading))
    lines.append(
        f"| {name} | {100 * err['mean']:.2f} +/- {100 * err['half_width']:.2f} | {diff} | "
        f"{reading} | {per:.3g} | {pmean / per:.1f}x |"
    )
  ours = [h for h in held if arms[h[1]]["algorithm"] == "easgd"]
  if ours:
    per, name, diff, reading = min(ours)
    sentence = (
        f"Fewest bytes at full-precision EASGD's test error: {name}, {per:.3g} bytes per "
        f"sample per worker, {pmean / per:.0f}x fewer than pmean SGD ({reading}: {diff} pp); "
        f"the target of 400x is {'met' if pmean / per >= 400 else 'not met'}."
    )
  else:
    sentence = (
        f"No fragmented, delayed or compressed EASGD arm is shown equivalent to "
        f"{REFERENCE} within {EQUIVALENCE_PP:g} pp (or better) at these seeds."
    )
  return "\n".join(lines) + "\n\n" + sentence


if __name__ == "__main__":
  print(table(json.loads((Path(sys.argv[1]) / "results.json").read_text())))
