"""Is pmean SGD over p workers one worker with a p times larger batch, where the model couples the batch?

    for v in cnn cnn_bn dropout; do
      easgd protocol --config experiments/protocol_bigbatch.py --task-arg variant=$v \\
          --workdir paper_notes/figures/protocol_bigbatch/$v
    done

For a loss that is the mean of independent per-example terms, pmean SGD over
p workers of B examples takes the gradient of the mean over the same pB
examples that one worker with batch pB takes (every step's global batch is
fixed by (seed, epoch, step): easgd.tasks.batches.worker_batch_indices): the
two runs are one computation, equal up to float rounding (notebook 01 shows it
to 1.5e-8 after 10 steps). Where the model couples the examples of a batch
they are not:

* ``cnn``: the small 1-D CNN, mean loss: the control, equal by construction;
* ``cnn_bn``: the same CNN with BatchNorm: each pmean worker normalises its own
  32 examples, the one worker all 128 (the package's policy,
  easgd.tasks.models);
* ``dropout``: an MLP with dropout 0.5 after each hidden layer
  (experiments/tasks.py): each worker draws its own masks from its key; the
  one worker draws one set for all 128 examples (the same distribution,
  other draws).

Each variant is one protocol run (one task per protocol): MNIST-1D (8000
training signals, 1000 held out for validation; 2000 test), 8 epochs at 128
examples per step (432 steps), plain SGD with a cosine decay to 0: "1 worker, batch 128" with its rate chosen from
5 log-spaced rates over two decades on the validation split (3 tuning seeds,
a grid extended by one log step, at most 2, at an edge), "pmean p=4" (32 per
worker) at that same rate, both reported on 20 fresh seeds that they share
(seed i: the same initialisation and the same examples at every step), so
their difference is judged per seed (paired). The answer is the final test
error of pmean p=4 minus that of the one worker with its paired 95% interval
(easgd.protocol.claims.differences_markdown).
"""

from easgd.protocol.config import Arm, ProtocolConfig, log_grid
from easgd.protocol.networks import GIGABIT_ETHERNET
from easgd.settings.config import TrainConfig

P = 4  # workers of pmean SGD
BATCH = 128  # examples per step, all workers together
RATES = log_grid(0.01, 1.0, 5)  # plain SGD steps


def get_config() -> TrainConfig:
  """The one worker with the p-times batch (``easgd train --config`` runs it)."""
  return TrainConfig(
      algorithm="pmean_sgd",
      task="experiments.tasks:mnist1d_variant",  # MNIST-1D from the seed
      task_args=("variant=cnn",),  # --task-arg variant=cnn_bn | dropout
      num_workers=1,
      global_batch_size=BATCH,
      num_epochs=8,  # 8 x 54 = 432 steps
      learning_rate=0.1,  # replaced by the chosen rate
      lr_schedule="cosine",  # to 0 at the end: the final error is not one noisy step's
      optimizer="sgd",
      validation_examples=1000,
      keep_checkpoints=1,
      progress=False,
  )


def get_protocol() -> ProtocolConfig:
  arms = (
      Arm("1 worker, batch 128", "pmean_sgd", {}, RATES),
      Arm(f"pmean p={P}", "pmean_sgd", dict(num_workers=P), lr_from="1 worker, batch 128"),
  )
  return ProtocolConfig(
      name="bigbatch",
      description=(
          f"pmean SGD over p = {P} workers of {BATCH // P} examples against one "
          f"worker with batch {BATCH}, at the one worker's tuned rate, on MNIST-1D "
          "(432 steps); the task's variant says what couples the batch."
      ),
      base=get_config(),
      arms=arms,
      tune_seeds=(0, 1, 2),
      report_seeds=tuple(range(100, 120)),
      eval_every_steps=54,  # one epoch
      targets=(0.3,),
      networks=(GIGABIT_ETHERNET,),
      configs_per_batch=5,
  )


VARIANTS = ("cnn", "cnn_bn", "dropout")
"""The task variants run (experiments/tasks.py ``VARIANTS``), one workdir each."""
EQUIVALENCE_PP = 1.0
"""The equivalence bound of "no difference" (TOST), percentage points."""


def load(root) -> dict:
  """``{variant: results.json}`` of the variants run under ``root``
  (``root/<variant>/results.json``)."""
  import json
  from pathlib import Path

  out = {}
  for v in VARIANTS:
    path = Path(root) / v / "results.json"
    if path.is_file():
      out[v] = json.loads(path.read_text())
  return out


def comparison(results: dict) -> dict:
  """pmean p=4 minus the one worker, final test error (fractions): the paired
  95% interval (the arms share the report seeds) and the TOST at
  :data:`EQUIVALENCE_PP`."""
  from easgd.protocol import stats

  arms = results["arms"]
  a, b = arms[f"pmean p={P}"]["final_test_errors"], arms["1 worker, batch 128"]["final_test_errors"]
  d = stats.difference_interval(a, b, paired=True)
  d["equivalence"] = stats.equivalence(a, b, EQUIVALENCE_PP / 100, paired=True)
  return d


def table(by_variant: dict) -> str:
  """One row per variant: the two arms' final test errors, their paired
  difference and what it reads, and a sentence per variant."""
  import runpy
  from pathlib import Path

  from easgd.protocol import stats

  what = runpy.run_path(str(Path(__file__).with_name("tasks.py")))["VARIANTS"]
  lines = [
      f"| variant | rate | one worker, batch {BATCH}: final test error % | pmean p={P} | "
      "pmean minus one worker, paired (pp) | reading | seeds |",
      "|---|---|---|---|---|---|---|",
  ]
  for v, r in by_variant.items():
    arms = r["arms"]
    one, pm = arms[f"1 worker, batch {BATCH}"], arms[f"pmean p={P}"]
    d = comparison(r)
    if d["low"] > 0:
      reading = "pmean worse"
    elif d["high"] < 0:
      reading = "pmean better"
    elif d["equivalence"]["equivalent"]:
      reading = f"not resolved; equivalent within {EQUIVALENCE_PP:g} pp"
    else:
      reading = f"not resolved; not shown equivalent within {EQUIVALENCE_PP:g} pp"
    lines.append(
        f"| `{v}`: {what[v]} | {one['resolved_learning_rate']:.3g} | "
        f"{stats.format_interval(one['final_test_error'])} | "
        f"{stats.format_interval(pm['final_test_error'])} | "
        f"{100 * d['difference']:+.2f} [{100 * d['low']:+.2f}, {100 * d['high']:+.2f}] | "
        f"{reading} | {len(pm['final_test_errors'])} |"
    )
  return "\n".join(lines) + "\n"
