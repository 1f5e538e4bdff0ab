"""Signals at random instants: every SIGTERM exits 143, every SIGINT 130, what was saved intact.

For each command (``compare``, ``protocol``; ``train`` on request), --count runs
of a small configuration (digits / MLP for ``compare`` and ``train``, MNIST-1D /
MLP for ``protocol``: seconds per run) are started as ``python -X faulthandler
-m easgd.cli ...`` in a fresh workdir each, and one signal is sent to each at an
instant drawn (``random.Random(--seed)``) uniformly between --earliest seconds
after the start and 0.9 x the command's uninterrupted wall time (measured first,
once per command). A run that ends before its instant is retried with a new
instant (at most --count more runs per command) and counted as "ended first"; its
wall time becomes the new bound when shorter (the load of a shared machine changes).

Each run is checked for:

* its exit status (143 for SIGTERM, 130 for SIGINT; a crash shows as -11, a
  lost signal as 0) and its last stderr line (``easgd: terminated (SIGTERM)``
  / ``easgd: interrupted``);
* what it saved: every ``.json`` / ``.jsonl`` file under the workdir is strict
  JSON (NaN refused), no lock file (``.easgd.lock``, ``.easgd.lock.json``) is
  left behind, and a ``results.json`` present is complete (``compare``: a row
  per algorithm; ``protocol``: a ``results.md`` beside it);
* a resume: for ``train``, and for each run of a ``compare`` that saved a
  checkpoint and is not complete, ``easgd train --workdir RUN --resume`` (on
  every --resume-every-th signal, to bound the time) must exit 0 with a complete
  ``summary.json``. The protocol writes nothing until every arm has run and has
  no resume.

Run: ``python benchmarks/signals.py`` (30 SIGTERMs under ``compare`` and 30
under ``protocol``: about 20 minutes on 2 cores); ``--pythonpath DIR`` runs
another checkout's code (e.g. ``/work/main``), ``--signal INT`` sends SIGINT.
Prints a Markdown table; the stderr of every run that fails a check is kept
under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROTOCOL_FILE = """\
from easgd import TrainConfig
from easgd.protocol.config import Arm, ProtocolConfig


def get_protocol():
  base = TrainConfig(dataset="mnist1d", model="mlp", num_epochs=1, global_batch_size=384,
                     validation_examples=1000, progress=False)
  arms = (Arm("easgd", "easgd", {}, (0.05, 0.1)), Arm("pmean", "pmean_sgd", {}, (0.05, 0.1)))
  return ProtocolConfig("signals", "signals at random instants", base, arms,
                        tune_seeds=(0, 1, 2), report_seeds=(3, 4, 5), eval_every_steps=6,
                        targets=(0.5,), max_grid_extensions=0)
"""

SMALL = [
    "--dataset",
    "digits",
    "--model",
    "mlp",
    "--num-epochs",
    "2",
    "--global-batch-size",
    "128",
    "--checkpoint-every-steps",
    "3",
    "--no-progress",
]
ALGORITHMS = ["easgd", "pmean_sgd"]
EXPECTED = {"TERM": (143, "easgd: terminated (SIGTERM)"), "INT": (130, "easgd: interrupted")}


def command(kind: str, work: Path, scratch: Path) -> list[str]:
  """The easgd command line of one run of ``kind`` into ``work``."""
  head = [sys.executable, "-X", "faulthandler", "-m", "easgd.cli"]
  if kind == "protocol":
    return head + ["protocol", "--config", str(scratch / "proto.py"), "--workdir", str(work)]
  if kind == "compare":
    return head + ["compare", "--workdir", str(work), "--algorithms", ",".join(ALGORITHMS), *SMALL]
  return head + ["train", "--workdir", str(work), *SMALL]


def strict_json(path: Path) -> None:
  """Parses ``path`` (JSON or JSON lines) refusing NaN and Infinity; raises ValueError."""

  def refuse(name):
    raise ValueError(f"{name} in {path}")

  text = path.read_text()
  if path.suffix == ".jsonl":
    for line in text.splitlines():
      json.loads(line, parse_constant=refuse)
  else:
    json.loads(text, parse_constant=refuse)


def check_saved(kind: str, work: Path) -> list[str]:
  """What is wrong with the files a stopped run left in ``work`` (empty: intact)."""
  problems = []
  if not work.exists():
    return problems
  for p in sorted(work.rglob("*")):
    if p.suffix in (".json", ".jsonl") and p.is_file() and "checkpoints" not in p.parts:
      try:
        strict_json(p)
      except ValueError as e:
        problems.append(f"{p.relative_to(work)} does not parse: {e}")
    if p.name in (".easgd.lock", ".easgd.lock.json"):
      problems.append(f"lock file left: {p.relative_to(work)}")
  results = work / "results.json"
  if results.is_file() and not problems:
    if kind == "compare":
      rows = json.loads(results.read_text())["rows"]
      if [r["algorithm"] for r in rows] != ALGORITHMS:
        problems.append(f"results.json rows: {[r['algorithm'] for r in rows]}")
    if kind == "protocol" and not (work / "results.md").is_file():
      problems.append("results.json without results.md")
  return problems


def resumable_runs(kind: str, work: Path) -> list[Path]:
  """The run directories of ``work`` that hold a checkpoint and no complete summary."""
  runs = [work] if kind == "train" else [work / a for a in ALGORITHMS]
  out = []
  for run in runs:
    ck = run / "checkpoints"
    if not (ck.is_dir() and any(n.isdigit() for n in os.listdir(ck))):
      continue
    summary = run / "summary.json"
    if summary.is_file() and json.loads(summary.read_text())["status"] == "complete":
      continue
    out.append(run)
  return out


def resume(run: Path, env: dict) -> str | None:
  """Resumes ``run`` to its end; None when it completes, else what went wrong."""
  cmd = [sys.executable, "-m", "easgd.cli", "train", "--workdir", str(run), "--resume"]
  done = subprocess.run(cmd, env=env, cwd=run, capture_output=True, text=True, timeout=600)
  if done.returncode != 0:
    return f"resume exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
  if json.loads((run / "summary.json").read_text())["status"] != "complete":
    return "resume did not complete"
  return None


def one_run(cmd, env, delay, signum, cwd):
  """Starts ``cmd``, sends ``signum`` after ``delay`` s.

  Returns (exit status, stderr, whether the signal was sent, seconds from the start
  to the signal or, when the run ended first, to its end)."""
  proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  start = time.monotonic()
  while proc.poll() is None and time.monotonic() - start < delay:
    time.sleep(0.005)
  delivered = proc.poll() is None
  if delivered:
    proc.send_signal(signum)
  else:  # ended first: its wall time bounds the later instants
    delay = time.monotonic() - start
  try:
    _, err = proc.communicate(timeout=600)
  except subprocess.TimeoutExpired:
    proc.kill()
    _, err = proc.communicate()
    return "hung", err.decode(errors="replace"), delivered, delay
  return proc.returncode, err.decode(errors="replace"), delivered, delay


def run_kind(kind, args, env, rng, scratch, out) -> dict:
  """--count signals under ``kind``; returns the counts and the failures."""
  signum = getattr(signal, f"SIG{args.signal}")
  code, last_line = EXPECTED[args.signal]
  t0 = time.monotonic()
  base = scratch / f"{kind}-calibrate"
  done = subprocess.run(
      command(kind, base, scratch), env=env, cwd=scratch, capture_output=True, timeout=900
  )
  wall = first_wall = time.monotonic() - t0
  if done.returncode != 0:
    raise SystemExit(f"{kind}: the uninterrupted run failed:\n{done.stderr.decode()[-3000:]}")
  shutil.rmtree(base)
  counts: dict = {}
  failures = []
  delivered = ended_first = resumes = 0
  attempts = 0
  while delivered < args.count and attempts < 2 * args.count:
    attempts += 1
    work = scratch / f"{kind}-{attempts}"
    delay = rng.uniform(args.earliest, 0.9 * wall)
    status, err, sent, at = one_run(command(kind, work, scratch), env, delay, signum, scratch)
    if not sent:
      ended_first += 1
      wall = min(wall, at)  # the machine's load changed: a faster run bounds the instants
      shutil.rmtree(work, ignore_errors=True)
      continue
    delivered += 1
    counts[status] = counts.get(status, 0) + 1
    problems = []
    lines = err.rstrip().splitlines()
    if status != code:
      problems.append(f"exit {status}")
    elif not lines or lines[-1] != last_line:
      problems.append(f"last stderr line {lines[-1:]!r}")
    problems += check_saved(kind, work)
    if status == code and not problems and delivered % args.resume_every == 0:
      for run in resumable_runs(kind, work):
        resumes += 1
        why = resume(run, env)
        if why:
          problems.append(f"{run.name}: {why}")
    if problems:
      failures.append(dict(run=attempts, delay_s=round(delay, 2), problems=problems))
      (out / f"{kind}-{attempts}.stderr").write_text(err)
    print(
        f"{kind} #{attempts}: signal at {delay:.2f} s, exit {status}"
        + (f"; {'; '.join(problems)}" if problems else ""),
        file=sys.stderr,
        flush=True,
    )
    shutil.rmtree(work, ignore_errors=True)
  return dict(
      kind=kind,
      wall_s=(first_wall, wall),
      delivered=delivered,
      ended_first=ended_first,
      counts=counts,
      resumes=resumes,
      failures=failures,
  )


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--commands", default="compare,protocol", help="comma-separated")
  parser.add_argument("--count", type=int, default=30, help="signals per command")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--signal", choices=sorted(EXPECTED), default="TERM")
  parser.add_argument("--earliest", type=float, default=1.0, help="seconds after the start")
  parser.add_argument("--resume-every", type=int, default=3, help="resume every n-th run")
  parser.add_argument("--pythonpath", default=str(ROOT), help="the checkout whose code runs")
  parser.add_argument("--out", default=None, help="where failing runs' stderr is kept")
  args = parser.parse_args(argv)
  env = dict(os.environ, PYTHONPATH=args.pythonpath, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  rng = random.Random(args.seed)
  out = Path(args.out or tempfile.mkdtemp(prefix="easgd-signals-out-"))
  out.mkdir(parents=True, exist_ok=True)
  results = []
  with tempfile.TemporaryDirectory(prefix="easgd-signals-") as tmp:
    scratch = Path(tmp)
    (scratch / "proto.py").write_text(PROTOCOL_FILE)
    for kind in args.commands.split(","):
      results.append(run_kind(kind, args, env, rng, scratch, out))
  code, _ = EXPECTED[args.signal]
  print(f"\nSIG{args.signal} at random instants (seed {args.seed}), code of {args.pythonpath}\n")
  print(
      f"| command | uninterrupted run (s): first, shortest | signals | exit {code} | other exits | saved files intact | resumes | ended before the signal |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for r in results:
    other = ", ".join(f"{k}: {v}" for k, v in sorted(r["counts"].items(), key=str) if k != code)
    bad_files = sum(1 for f in r["failures"] if any("exit" not in p for p in f["problems"]))
    print(
        f"| {r['kind']} | {r['wall_s'][0]:.0f}, {r['wall_s'][1]:.0f} | {r['delivered']} | {r['counts'].get(code, 0)} | "
        f"{other or '-'} | {r['delivered'] - bad_files}/{r['delivered']} | {r['resumes']} | "
        f"{r['ended_first']} |"
    )
  for r in results:
    for f in r["failures"]:
      print(
          f"- {r['kind']} run {f['run']} (signal at {f['delay_s']} s): {'; '.join(f['problems'])}"
      )
  print(f"\nstderr of failing runs: {out}")
  return 0 if all(not r["failures"] for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
