"""Runs the CLI on each bad input and prints the table of docs/guides/bad_input.md.

python scripts/bad_inputs_table.py
"""

import contextlib
import io
import sys
import tempfile
from pathlib import Path

from easgd import cli

CASES = [
    ("communication period below 1", ["--tau", "0"]),
    ("negative alpha", ["--alpha", "-0.1"]),
    ("negative beta", ["--beta", "-1"]),
    ("alpha and beta together", ["--alpha", "0.1", "--beta", "0.9"]),
    ("workers not a multiple of the devices", ["--num-workers", "6", "--num-devices", "4"]),
    ("more devices than there are", ["--num-workers", "64", "--num-devices", "64"]),
    ("batch that does not split over workers", ["--global-batch-size", "130"]),
    ("a worker of 0 devices", ["--devices-per-worker", "0"]),
    (
        "devices per worker on the pmap backend",
        ["--devices-per-worker", "2", "--mapping-backend", "pmap"],
    ),
    (
        "devices per worker with an asynchronous algorithm",
        ["--devices-per-worker", "2", "--algorithm", "async_easgd"],
    ),
    ("devices per worker with BatchNorm", ["--devices-per-worker", "2", "--model", "cnn_bn"]),
    ("a per-worker batch that does not split over its devices", ["--devices-per-worker", "3"]),
    ("workers of several devices, more devices than there are", ["--devices-per-worker", "2"]),
    ("sharded parameters with one device per worker", ["--shard-params"]),
    ("batch larger than the data", ["--dataset", "digits", "--global-batch-size", "4000"]),
    ("data directory without the IDX files", ["--dataset", "fashion_mnist", "--data-dir", "{tmp}"]),
    ("unknown data set", ["--dataset", "cifar100"]),
    ("unknown model", ["--model", "resnet"]),
    ("unknown algorithm", ["--algorithm", "adam"]),
    ("a task that does not import", ["--task", "nosuch.tasks:make_task"]),
    (
        "a task path that names no factory",
        ["--task", "easgd.settings.builtin_tasks:BUILTIN_FACTORY"],
    ),
    (
        "a task argument the factory does not take",
        ["--task", "easgd.settings.builtin_tasks:builtin_task", "--task-arg", "width=3"],
    ),
    (
        "a built-in data setting beside a task",
        ["--task", "easgd.settings.builtin_tasks:builtin_task", "--model", "mlp"],
    ),
    ("learning rate not positive", ["--learning-rate", "0"]),
    ("momentum of 1", ["--optimizer", "nesterov", "--momentum", "1"]),
    ("momentum the optimizer would ignore", ["--momentum", "0.9"]),
    ("delta that turns EAMSGD into EASGD", ["--algorithm", "eamsgd", "--delta", "0"]),
    ("a setting the algorithm does not read", ["--algorithm", "pmean_sgd", "--tau", "8"]),
    ("asynchronous setting with a synchronous algorithm", ["--staleness", "2"]),
    (
        "communication period longer than the run",
        [
            "--dataset",
            "digits",
            "--model",
            "mlp",
            "--num-epochs",
            "1",
            "--algorithm",
            "local_sgd",
            "--tau",
            "12",
        ],
    ),
    (
        "a communication period that leaves the center untrained",
        ["--dataset", "digits", "--model", "mlp", "--num-epochs", "1", "--tau", "11"],
    ),
    ("an elastic force of 0 (the center never moves)", ["--beta", "0"]),
    ("learning rate that overflows float32", ["--learning-rate", "1e300"]),
    (
        "learning rate that overflows float32 once scaled",
        ["--learning-rate", "1e37", "--lr-scaling", "linear", "--lr-reference-batch", "1"],
    ),
    (
        "a learning-rate warm-up that rounds to no steps",
        ["--dataset", "digits", "--model", "mlp", "--num-epochs", "1", "--warmup-epochs", "0.01"],
    ),
    (
        "a step decay after the last epoch",
        ["--num-epochs", "3", "--lr-schedule", "step", "--lr-decay-epochs", "10"],
    ),
    (
        "a schedule in reference steps without the reference batch",
        ["--lr-schedule", "cosine", "--lr-schedule-unit", "reference_steps"],
    ),
    ("random flips of 1-D signals", ["--random-flip"]),
    ("a run longer than the int32 step clock", ["--num-epochs", "100000000000"]),
    ("an empty entry in a list", ["--algorithm", "async_easgd", "--worker-speeds", "1,,1,1"]),
    ("unknown parameter dtype", ["--param-dtype", "float8"]),
    (
        "a synchronous algorithm on real asynchronous workers",
        ["--runtime", "threads", "--algorithm", "easgd"],
    ),
    (
        "an injected delay on the simulated runtime",
        ["--algorithm", "async_easgd", "--worker-delays", "0,0,0,0.01"],
    ),
    (
        "an emulated link's rate without a unit",
        ["--runtime", "threads", "--algorithm", "async_easgd", "--link-rate", "10"],
    ),
    (
        "an emulated link on the simulated runtime",
        ["--algorithm", "async_easgd", "--link-rate", "10mbit"],
    ),
    (
        "start-up wait of 0 s",
        [
            "--coordinator-address",
            "127.0.0.1:1234",
            "--num-processes",
            "2",
            "--process-id",
            "1",
            "--startup-timeout",
            "0",
        ],
    ),
    (
        "coordinator port out of range",
        ["--coordinator-address", "h:70000", "--num-processes", "2", "--process-id", "1"],
    ),
    ("config file that is not Python", ["--config", "README.md"]),
    ("not a number", ["--tau", "two"]),
    ("workdir that holds a run", ["--workdir-holds-run"]),
    ("resume with a changed config", ["--resume-changed"]),
    ("resume and overwrite together", ["--resume-overwrite"]),
    ("an item of a task's data that cannot be read (every runtime)", ["--bad-item"]),
    ("resume of a task whose data grew", ["--resume-task-changed"]),
    ("export of a task whose model changed", ["--export-task-changed"]),
]

# A user's task module (written to the temporary directory): ROWS training rows,
# a hidden layer of WIDTH, item BAD unreadable.
TASK_MODULE = """
import flax.linen as nn, numpy as np, optax
from easgd.tasks.task import Task

class Items:
  def __init__(self, x, y):
    self.x, self.y = x, y
  def __len__(self):
    return len(self.x)
  def __getitem__(self, i):
    if i == {bad}:
      raise ValueError(f"row {{i}} is damaged")
    return self.x[i], self.y[i]

def make():
  x = np.random.default_rng(0).normal(size=({rows}, 8)).astype(np.float32)
  net = nn.Sequential([nn.Dense({width}), nn.Dense(2)])
  def evaluate(params, batch):
    logits = net.apply({{"params": params}}, batch[0])
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch[1])
    return {{"loss": xent, "correct": 1.0 * (logits.argmax(-1) == batch[1])}}
  return Task("user", lambda key: net.init(key, x[:1])["params"],
              lambda params, batch, key: evaluate(params, batch)["loss"].mean(), evaluate,
              Items(x, (x[:, 0] > 0).astype(np.int32)), (x[:64], (x[:64, 0] > 0).astype(np.int32)))
"""
TASK_FLAGS = ["--task", "usertask:make", "--num-workers", "2", "--global-batch-size", "32"]
TASK_FLAGS += ["--num-epochs", "1", "--tau", "2", "--no-progress"]


def write_task(tmp, rows=256, width=16, bad=-1):
  """``usertask.py`` in ``tmp`` (importable: ``tmp`` is on sys.path), imported afresh."""
  (Path(tmp) / "usertask.py").write_text(TASK_MODULE.format(rows=rows, width=width, bad=bad))
  if tmp not in sys.path:
    sys.path.insert(0, tmp)
  sys.modules.pop("usertask", None)


def quiet(argv):
  with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    return cli.main(argv)


def run(flags, tmp):
  work, command = str(Path(tmp) / "run"), None  # command: default `easgd train ... flags`
  if flags == ["--workdir-holds-run"]:
    (Path(tmp) / "run").mkdir(exist_ok=True)
    (Path(tmp) / "run" / "summary.json").write_text("{}")
    flags = []
  elif flags == ["--resume-changed"]:
    work = str(Path(tmp) / "resumed")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
      cli.main(
          [
              "train",
              "--workdir",
              work,
              "--dataset",
              "digits",
              "--model",
              "mlp",
              "--num-epochs",
              "1",
              "--no-progress",
          ]
      )
    flags = ["--resume", "--num-epochs", "5"]
  elif flags == ["--resume-overwrite"]:
    work = str(Path(tmp) / "resumed")
    flags = ["--resume", "--overwrite"]
  elif flags == ["--bad-item"]:
    work = str(Path(tmp) / "bad-item")
    write_task(tmp, bad=100)
    flags = [*TASK_FLAGS, "--runtime", "threads", "--algorithm", "async_easgd"]
  elif flags in (["--resume-task-changed"], ["--export-task-changed"]):
    work = str(Path(tmp) / flags[0].strip("-"))
    write_task(tmp)
    quiet(["train", "--workdir", work, *TASK_FLAGS, "--stop-after-steps", "1"])
    if flags == ["--resume-task-changed"]:
      write_task(tmp, rows=258)
      flags = [*TASK_FLAGS, "--resume"]
    else:
      write_task(tmp, width=8)
      command = ["export", "--workdir", work, "--out", str(Path(tmp) / "center.msgpack")]
  if command is None:
    command = ["train", "--workdir", work, *[f.format(tmp=tmp) for f in flags]]
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    try:
      code = cli.main(command)
    except SystemExit as e:
      code = e.code
  return code, err.getvalue().strip().replace(tmp, "DIR")


def main():
  print("| bad input | flags | exit | message |")
  print("|---|---|---|---|")
  with tempfile.TemporaryDirectory() as tmp:
    for what, flags in CASES:
      code, msg = run(flags, tmp)
      shown = {
          "--workdir-holds-run": "(--workdir DIR with a summary.json)",
          "--resume-changed": "--resume --num-epochs 5 (run had 1)",
          "--resume-overwrite": "--resume --overwrite",
          "--bad-item": "--task usertask:make --runtime threads (its item 100 raises)",
          "--resume-task-changed": "--task usertask:make --resume (258 rows; run had 256)",
          "--export-task-changed": "export (hidden layer 8 wide; run had 16)",
      }.get(flags[0], " ".join(flags).replace("{tmp}", "DIR"))
      print(f"| {what} | `{shown}` | {code} | `{msg}` |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
