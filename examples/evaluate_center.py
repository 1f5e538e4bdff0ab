"""The BatchNorm policy measured: an exported center evaluated with three kinds of statistics.

For a run of a task with ``center_state`` (``examples.resnet_cnn``), after
``easgd export --workdir RUN --out center.msgpack``::

  python examples/evaluate_center.py --export center.msgpack

evaluates the exported center on the task's whole test set with

* ``center``: the statistics the export wrote, recomputed from the center over
  the run's ``bn_stats_examples`` (what the run's evaluation uses);
* ``worker_batch``: the statistics of one worker's mini-batch (the first
  ``--batch`` examples of a seeded permutation of the training set), i.e. what
  a worker's BatchNorm sees in training;
* ``test_batch``: each test batch normalised with its own statistics
  (train-mode BatchNorm at test time, batches of ``--batch``).

and prints one JSON line of test accuracy and loss per kind. The task is
rebuilt from the ``.json`` the export writes beside the parameters, through
the task's own ``evaluate`` and ``center_state``.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def evaluate_center(export: str, batch: int = 32, seed: int = 0) -> dict:
  """Test accuracy and loss of an exported center under the three statistics.

  Args:
    export: the exported parameter file (``easgd export --out``), with its
      ``.json`` and ``.batch_stats.msgpack`` beside it.
    batch: examples of the worker's mini-batch and of each test batch.
    seed: the permutation the worker's mini-batch is drawn from.

  Returns:
    ``{kind: {"test_accuracy", "test_loss"}}`` for ``center``,
    ``worker_batch`` and ``test_batch``.
  """
  from flax import serialization  # noqa: PLC0415

  from easgd.tasks.sources import take  # noqa: PLC0415
  from easgd.tasks.task import load_task  # noqa: PLC0415

  with open(export + ".json") as f:
    meta = json.load(f)
  task = load_task(meta["task"]["factory"], meta["task"]["factory_args"])
  with open(export, "rb") as f:
    params = serialization.msgpack_restore(f.read())
  with open(export + ".batch_stats.msgpack", "rb") as f:
    center_stats = serialization.msgpack_restore(f.read())

  def evaluated(source, idx):
    out = take(source, idx)
    return out if task.eval_transform is None else task.eval_transform(out)

  rng = np.random.default_rng(seed)
  worker = evaluated(task.train, rng.permutation(len(task.train))[:batch])
  worker_stats = task.center_state(params, worker, None)
  kinds = {"center": [], "worker_batch": [], "test_batch": []}
  for start in range(0, len(task.test), batch):
    b = evaluated(task.test, np.arange(start, min(start + batch, len(task.test))))
    kinds["center"].append(task.evaluate(params, b, center_stats))
    kinds["worker_batch"].append(task.evaluate(params, b, worker_stats))
    kinds["test_batch"].append(task.evaluate(params, b, task.center_state(params, b, None)))
  return {
      kind: dict(
          test_accuracy=float(np.mean(np.concatenate([np.asarray(o["correct"]) for o in outs]))),
          test_loss=float(np.mean(np.concatenate([np.asarray(o["loss"]) for o in outs]))),
      )
      for kind, outs in kinds.items()
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--export", required=True, help="the file easgd export --out wrote")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  for kind, values in evaluate_center(args.export, args.batch, args.seed).items():
    print(json.dumps(dict(statistics=kind, **values)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
