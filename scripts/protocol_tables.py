"""Prints, writes and checks every statement the guides make from the committed protocol outputs.

    python scripts/protocol_tables.py           # the results guide's protocol section on stdout
    python scripts/protocol_tables.py --write   # rewrite every generated region (below)
    python scripts/protocol_tables.py --check   # exit 1, naming each line that differs

Reads ``paper_notes/figures/protocol_{fig2,fig3,fashion,seeds,schedule,streaming}/results.json``
and ``protocol_bigbatch/<variant>/results.json``
(written by ``easgd protocol``) and generates, from them alone:

* the protocol section of ``docs/guides/results.md`` (between ``<!-- protocol tables:
  scripts/protocol_tables.py -->`` and ``<!-- end of protocol tables -->``): the claims of
  the paper's Section 5 (``easgd.protocol.claims``), each experiment's table with 95%
  intervals, the seeds question's table, the wall times against the budget, and the
  sentences that read them ("What these runs say": rankings only where an interval
  excludes 0, "not resolved" otherwise);
* ``paper_notes/figures/protocol_claims.md``: every part of every claim;
* the claims table of ``paper_notes/README.md``;
* the wall-time table of ``benchmarks/RESULTS.md``;
* the conclusions of ``notebooks/01_multi_gpu_questions.ipynb``, ``03_effect_of_tau.ipynb``
  and ``04_effect_of_p.ipynb``.

Nothing there is typed by hand: ``--check`` (run by ``tests/test_claims.py``) fails on any
line of these regions that is not this script's output. ``--rewrite`` also rewrites each
experiment's results.md and curves.png.
"""

from __future__ import annotations

import argparse
import difflib
import json
import runpy
import sys
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from easgd._util.files import write_text_atomic  # noqa: E402
from easgd.methods import registry  # noqa: E402
from easgd.protocol import claims as protocol_claims  # noqa: E402
from easgd.protocol import report as protocol_report  # noqa: E402
from easgd.protocol import stats as protocol_stats  # noqa: E402

FIGURES = ROOT / "paper_notes" / "figures"
EXPERIMENTS = dict(
    fig2="tau",
    fig3="num_workers",
    fashion="tau",
    seeds="num_workers",
    schedule="num_workers",
    streaming="tau",
)
"""The experiments of one protocol run each (``protocol_<name>``) and their --group-by."""
BIGBATCH = "bigbatch"
"""The experiment run once per task variant: ``protocol_bigbatch/<variant>/results.json``."""
BUDGET_MINUTES = 60
"""The budget of one protocol experiment: 60 minutes on 2 otherwise idle cores."""
TITLES = dict(
    fig2="Figure 2 setting",
    fig3="Figure 3 setting",
    fashion="Replication",
    seeds="Equal epochs",
    schedule="The decay counted per epoch or per step",
    streaming="Fragments, delay and compression (bytes per sample)",
)
CLAIMS_FILE = "paper_notes/figures/protocol_claims.md"


def load(name, figures=FIGURES):
  path = Path(figures) / f"protocol_{name}" / "results.json"
  return json.loads(path.read_text()) if path.is_file() else None


def experiment(name: str) -> dict:
  """The names of ``experiments/protocol_<name>.py`` (its table and sentences)."""
  return runpy.run_path(str(ROOT / "experiments" / f"protocol_{name}.py"))


def load_all(figures=FIGURES) -> dict:
  """Every experiment's results (None where not run); ``BIGBATCH``: ``{variant: results}``."""
  out = {n: load(n, figures) for n in EXPERIMENTS}
  out[BIGBATCH] = experiment(BIGBATCH)["load"](Path(figures) / f"protocol_{BIGBATCH}") or None
  return out


def result_paths(figures=FIGURES) -> list[Path]:
  """The committed results.json files the generated regions read."""
  paths = [Path(figures) / f"protocol_{n}" / "results.json" for n in EXPERIMENTS]
  paths += sorted((Path(figures) / f"protocol_{BIGBATCH}").glob("*/results.json"))
  return [p for p in paths if p.is_file()]


def _set(values) -> str:
  values = sorted(set(values))
  return f"= {values[0]}" if len(values) == 1 else "in {" + ", ".join(map(str, values)) + "}"


def title(name: str, results: dict) -> str:
  """An experiment's heading, its p and tau read from its arms (the elastic ones)."""
  arms = list(results["arms"].values())
  elastic = [a for a in arms if registry.TABLE[a["algorithm"]].family == "elastic"] or arms
  label = protocol_claims.experiment_label(results)
  ps = [a["config"]["num_workers"] for a in elastic]
  if name in ("seeds", "schedule"):
    workers = " vs ".join(map(str, sorted({a["config"]["num_workers"] for a in arms})))
    return f"{TITLES[name]}: {workers} workers ({label})"
  taus = [a["config"]["tau"] for a in elastic]
  return f"{TITLES[name]}: {label}, p {_set(ps)}, tau {_set(taus)}"


def budget(results) -> str:
  proto = results["protocol"]
  arms = list(results["arms"].values())
  steps = sorted({a["num_steps"] for a in arms})
  grids = sorted({len(a["learning_rates"]) for a in arms if a["learning_rates"]})
  return (
      f"{len(arms)} arms, {'/'.join(map(str, grids))} rates x "
      f"{len(proto['tune_seeds'])} tuning seeds per arm, "
      f"{len(proto['report_seeds'])} report seeds, "
      f"{'/'.join(map(str, steps))} local steps; "
      f"{results['wall_time_s'] / 60:.1f} min on this 2-core CPU, shared with other jobs"
  )


def wall_time_table(results: dict) -> str:
  """Each experiment's wall time (``wall_time_s``) against :data:`BUDGET_MINUTES`."""
  lines = [
      f"| experiment | arms | report seeds | wall time (`wall_time_s`) | "
      f"within {BUDGET_MINUTES} min on 2 idle cores |",
      "|---|---|---|---|---|",
  ]
  runs = [(f"protocol_{n}.py", r) for n, r in results.items() if n != BIGBATCH]
  runs += [
      (f"protocol_{BIGBATCH}.py` `variant={v}", r) for v, r in (results.get(BIGBATCH) or {}).items()
  ]
  for name, r in runs:
    if r is None:
      continue
    minutes = r["wall_time_s"] / 60
    lines.append(
        f"| `experiments/{name}` | {len(r['arms'])} | "
        f"{len(r['protocol']['report_seeds'])} | {minutes:.1f} min | "
        f"{'met' if minutes <= BUDGET_MINUTES else 'over'} |"
    )
  notes = {r["machine"].get("note") for _, r in runs if r is not None} - {None}
  return (
      "\n".join(lines)
      + "\n\nThe wall times are measured on this project's 2-core CPU "
      + f"({'; '.join(sorted(notes))}): a time over the budget was not measured on idle "
      + "cores, and each experiment file states what it cut to fit.\n"
  )


# ---------------------------------------------------------------------------
# The sentences that read the tables
# ---------------------------------------------------------------------------


def rankings_bullet(results: dict, heading: str) -> str:
  """Which arm ends lowest at each tau, and among the tau-free references."""
  arms = results["arms"]
  per_tau = {}
  for n, a in arms.items():
    if "tau" in registry.TABLE[a["algorithm"]].reads:
      per_tau.setdefault(a["config"]["tau"], []).append(n)
  refs = [n for n, a in arms.items() if "tau" not in registry.TABLE[a["algorithm"]].reads]
  bits = [
      f"at tau = {tau}: {protocol_claims.ranking(results, names)}"
      for tau, names in sorted(per_tau.items())
      if len(names) > 1
  ]
  if len(refs) > 1:
    bits.append(f"the tau-free references: {protocol_claims.ranking(results, refs)}")
  n = len(results["protocol"]["report_seeds"])
  return (
      f"**{heading}** (final test error, {n} report seeds, paired by seed): "
      + "; ".join(bits)
      + "."
  )


def grid_facts(results: dict) -> str:
  arms = list(results["arms"].values())
  tuned = [a for a in arms if a["learning_rates"]]
  first = sorted({len(a["learning_rates"]) - len(a["grid_extended"]) for a in tuned})
  extended = [len(a["grid_extended"]) for a in tuned if a["grid_extended"]]
  edges = sum(a["grid_edge"] is not None for a in tuned)
  steps = sorted({len(a["grid_extended"]) for a in tuned if a["grid_extended"]})
  return (
      f"grids of {'/'.join(map(str, first))} rates, {len(extended)} of the {len(tuned)} "
      f"extended by {' or '.join(map(str, steps)) or 'no'} log step(s), {edges} left at an edge"
  )


def workers_bullet(results: dict) -> str:
  """Figure 3: each method's final test error from the smallest to each larger p."""
  by_algo: dict[str, dict[int, str]] = {}
  for n, a in results["arms"].items():
    by_algo.setdefault(a["algorithm"], {})[a["config"]["num_workers"]] = n
  bits = []
  for algo, arms in by_algo.items():
    if len(arms) < 2:
      continue
    ps = sorted(arms)
    base = results["arms"][arms[ps[0]]]
    for p in ps[1:]:
      other = results["arms"][arms[p]]
      d = protocol_stats.difference_interval(
          other["final_test_errors"],
          base["final_test_errors"],
          paired=protocol_claims.paired(results, other, base),
      )
      v = protocol_stats.verdict(d, holds_if="negative")
      word = {"holds": "lower", "does not hold": "higher"}.get(v, "not resolved")
      bits.append(
          f"{algo} {protocol_stats.format_interval(base['final_test_error'])}% -> "
          f"{protocol_stats.format_interval(other['final_test_error'])}% "
          f"(p = {p} minus p = {ps[0]}: {_diff(d)}, {word})"
      )
  n = len(results["protocol"]["report_seeds"])
  return (
      f"**Final test error from p = 4 to p = 8, every method** ({n} report seeds, paired by "
      f"seed; the claim above reads the test error at the best validation point): "
      + "; ".join(bits)
      + "."
  )


def _diff(d: dict) -> str:
  return f"{100 * d['difference']:+.2f} pp [{100 * d['low']:+.2f}, {100 * d['high']:+.2f}]"


def seeds_bullet(results: dict) -> str:
  """The equal-epochs question: each p against one worker, what ends lowest, what diverges."""
  arms = results["arms"]
  ref = next(n for n, a in arms.items() if a["config"]["num_workers"] == 1)
  ref_arm = arms[ref]
  diffs = protocol_claims.differences(results, ref)
  ps = sorted({a["config"]["num_workers"] for a in arms.values()} - {1})
  n = len(results["protocol"]["report_seeds"])
  out = [
      f"**{' -> '.join(['1'] + list(map(str, ps)))} workers at equal epochs** "
      f"({protocol_claims.experiment_label(results)}, `{results['protocol']['name']}`, "
      f"{n} report seeds, every arm paired with one worker by seed): one worker ends at "
      f"{protocol_stats.format_interval(ref_arm['final_test_error'])}% final test error "
      f"(rate {ref_arm['resolved_learning_rate']:.3g})."
  ]
  for p in ps:
    here = {k: a for k, a in arms.items() if a["config"]["num_workers"] == p}
    worse = [k for k in here if diffs[k]["low"] > 0]
    better = [k for k in here if diffs[k]["high"] < 0]
    open_ = [k for k in here if k not in worse and k not in better]
    equivalent = [k for k in open_ if diffs[k]["equivalence"]["equivalent"]]
    tuned = [
        a
        for a in here.values()
        if a["learning_rates"] and a["config"].get("lr_scaling", "none") == "none"
    ]
    rates = sorted({f"{a['resolved_learning_rate']:.3g}" for a in tuned})
    sentence = (
        f"At p = {p}: {len(worse)} of {len(here)} arms end resolved worse than one worker, "
        f"{len(better)} resolved better, {len(open_)} not resolved"
        + (f" ({', '.join(open_)})" if open_ else "")
        + (
            f", of which {len(equivalent)} equivalent within "
            f"{100 * protocol_claims.ERROR_BOUND:g} pp"
            if open_
            else ""
        )
        + "; "
        + protocol_claims.ranking(results, list(here))
        + "."
    )
    if rates:
      sentence += f" The rate tuned at p = {p} on its own: {', '.join(rates)}."
    failing = [
        f"{k} ({sum(a['diverged'])} diverged"
        + (f", {sum(a['collapsed'])} collapsed" if "collapsed" in a else "")
        + f"; final errors {100 * min(a['final_test_errors']):.1f} to "
        f"{100 * max(a['final_test_errors']):.1f}%)"
        for k, a in here.items()
        if any(a["diverged"]) or any(a.get("collapsed", []))
    ]
    if failing:
      sentence += f" Seeds flagged failed: {'; '.join(failing)}."
    out.append(sentence)
  return " ".join(out)


def fashion_bullet(results: dict) -> str:
  steps = sorted({a["num_steps"] for a in results["arms"].values()})
  head = (
      f"Which method ends lowest, {protocol_claims.experiment_label(results)} "
      f"(`{results['protocol']['name']}`; {'/'.join(map(str, steps))} local steps; "
      f"{grid_facts(results)})"
  )
  return rankings_bullet(results, head)


def statements(results: dict) -> dict[str, list[str]]:
  """The bullets, per experiment, that the guide and the notebooks quote."""
  fig2, fig3, fashion = results["fig2"], results["fig3"], results["fashion"]
  items = protocol_claims.claims(fig2, fig3, *([fashion] if fashion else []))
  out = {k: [] for k in EXPERIMENTS}
  for c in items:
    where = next(
        k
        for k in ("fig2", "fig3", "fashion")
        if results[k] and results[k]["protocol"]["name"] == c["source"]
    )
    out[where].append(protocol_claims.claim_sentence(c))
  if fig2:
    out["fig2"].append(rankings_bullet(fig2, f"Which method ends lowest, {title('fig2', fig2)}"))
  if fig3:
    out["fig3"].append(workers_bullet(fig3))
  if fashion:
    out["fashion"].append(fashion_bullet(fashion))
  if results["seeds"]:
    out["seeds"].append(seeds_bullet(results["seeds"]))
  if results["schedule"]:
    said = experiment("schedule")["sentences"](results["schedule"])
    out["schedule"].append(
        f"**Why 1 -> 2 -> 4 workers lose accuracy: the decay counted per step** "
        f"({protocol_claims.experiment_label(results['schedule'])}, "
        f"`{results['schedule']['protocol']['name']}`): " + " ".join(said)
    )
  if results.get(BIGBATCH):
    out[BIGBATCH] = [bigbatch_bullet(results[BIGBATCH])]
  return out


def bigbatch_bullet(by_variant: dict) -> str:
  """pmean SGD against one worker with the p-times batch, each variant."""
  exp = experiment(BIGBATCH)
  bits = []
  for v, r in by_variant.items():
    d = exp["comparison"](r)
    word = "worse" if d["low"] > 0 else "better" if d["high"] < 0 else "not resolved"
    if word == "not resolved":
      eq = d["equivalence"]["equivalent"]
      word += (
          f", {'equivalent' if eq else 'not shown equivalent'} within {exp['EQUIVALENCE_PP']:g} pp"
      )
    bits.append(f"`{v}` {_diff(d)} ({word})")
  n = len(next(iter(by_variant.values()))["protocol"]["report_seeds"])
  return (
      f"**pmean SGD over p = {exp['P']} workers against one worker with the p-times batch** "
      f"(final test error, pmean minus one worker, {n} report seeds paired by seed): "
      + "; ".join(bits)
      + "."
  )


# ---------------------------------------------------------------------------
# The generated regions
# ---------------------------------------------------------------------------


def section(results: dict) -> str:
  """The protocol section of docs/guides/results.md."""
  fig2, fig3, fashion = results["fig2"], results["fig3"], results["fashion"]
  items = protocol_claims.claims(fig2, fig3, *([fashion] if fashion else []))
  out = [
      "### The paper's claims, measured (`easgd protocol`)",
      "",
      "Every part of every claim, with its interval, pairing, equivalence bound and the "
      f"seeds {protocol_claims.POWER:.0%} power needs: `{CLAIMS_FILE}`.",
      "",
      protocol_claims.claims_markdown(items, detail=False),
  ]
  for name in EXPERIMENTS:
    r = results[name]
    if r is None:
      continue
    out += [
        f"### {title(name, r)}",
        "",
        f"`easgd protocol --config experiments/protocol_{name}.py --workdir "
        f"paper_notes/figures/protocol_{name}` ({budget(r)}); full tables in "
        f"`paper_notes/figures/protocol_{name}/results.md`.",
        "",
    ]
    if name == "seeds":
      out.append(protocol_claims.differences_markdown(r, "1 worker"))
    elif name == "schedule":
      out.append(experiment("schedule")["table"](r))
    elif name == "streaming":  # the experiment's own table and the sentence it supports
      out.append(experiment("streaming")["table"](r))
    else:
      out.append(protocol_report.compact_markdown(r))
  if results.get(BIGBATCH):
    exp = experiment(BIGBATCH)
    first = next(iter(results[BIGBATCH].values()))
    out += [
        f"### One big batch where the model couples the batch: pmean SGD, p = {exp['P']}, "
        f"against one worker with the p-times batch",
        "",
        f"`easgd protocol --config experiments/protocol_{BIGBATCH}.py --task-arg variant=V "
        f"--workdir paper_notes/figures/protocol_{BIGBATCH}/V` for V in "
        f"{', '.join(results[BIGBATCH])} ({budget(first)} each).",
        "",
        exp["table"](results[BIGBATCH]),
    ]
  out += [
      f"### Wall times against the budget ({BUDGET_MINUTES} minutes per experiment)",
      "",
      wall_time_table(results),
      "### What these runs say",
      "",
      "Each sentence is printed from the results files above; a ranking is stated only where "
      'the 95% interval of the difference excludes 0, and "not resolved" otherwise.',
      "",
  ]
  said = statements(results)
  for name in ("fig2", "fig3", "fashion", "seeds", "schedule", BIGBATCH):
    out += [f"- {s}" for s in said.get(name, [])]
  return "\n".join(out) + "\n"


def claims_file(results: dict) -> str:
  items = protocol_claims.claims(
      results["fig2"], results["fig3"], *([results["fashion"]] if results["fashion"] else [])
  )
  return (
      "# The paper's Section 5 claims, measured\n\n"
      "Generated by `python scripts/protocol_tables.py --write` from the committed "
      "results.json files (`easgd.protocol.claims`). A part's interval is paired by seed "
      "where its arms share their report seeds, task and model "
      '(`easgd.protocol.claims.paired`), else Welch\'s; "equivalent" is the TOST at the '
      "smallest difference of interest (the 90% interval inside the bound); the seeds for "
      f"{protocol_claims.POWER:.0%} power resolve that difference at the realised spread "
      "(`easgd.protocol.stats.seeds_for_power`).\n\n" + protocol_claims.claims_markdown(items)
  )


def paper_notes_table(results: dict) -> str:
  items = protocol_claims.claims(
      results["fig2"], results["fig3"], *([results["fashion"]] if results["fashion"] else [])
  )
  return protocol_claims.claims_markdown(items, detail=False)


def conclusion(results: dict, *names: str) -> str:
  """A notebook's conclusion: the statements of the experiments ``names``."""
  said = statements(results)
  names = [n for n in names if said.get(n)]
  src = ", ".join(
      f"`paper_notes/figures/protocol_{n}/{'*/' if n == BIGBATCH else ''}results.json`"
      for n in names
  )
  return (
      f"Printed by `scripts/protocol_tables.py` from {src or 'no results yet'} (rankings only "
      "where the 95% interval excludes 0):\n\n"
      + "\n".join(f"- {s}" for n in names for s in said[n])
      + "\n"
  )


class Region(NamedTuple):
  """A generated part of a committed file: between two marker lines (or the
  whole file when ``begin`` is None; in a notebook, of its last markdown cell)."""

  path: str
  begin: str | None
  end: str | None
  make: Callable[[dict], str]


def regions() -> list[Region]:
  mark = "scripts/protocol_tables.py"
  return [
      Region(
          "docs/guides/results.md",
          f"<!-- protocol tables: {mark} -->",
          "<!-- end of protocol tables -->",
          section,
      ),
      Region(CLAIMS_FILE, None, None, claims_file),
      Region(
          "paper_notes/README.md",
          f"<!-- claims table: {mark} -->",
          "<!-- end of claims table -->",
          paper_notes_table,
      ),
      Region(
          "benchmarks/RESULTS.md",
          f"<!-- protocol wall times: {mark} -->",
          "<!-- end of protocol wall times -->",
          wall_time_table,
      ),
      Region(
          "notebooks/01_multi_gpu_questions.ipynb",
          f"<!-- conclusion: {mark} -->",
          "<!-- end of conclusion -->",
          lambda r: conclusion(r, BIGBATCH, "schedule", "seeds"),
      ),
      Region(
          "notebooks/03_effect_of_tau.ipynb",
          f"<!-- conclusion: {mark} -->",
          "<!-- end of conclusion -->",
          lambda r: conclusion(r, "fig2"),
      ),
      Region(
          "notebooks/04_effect_of_p.ipynb",
          f"<!-- conclusion: {mark} -->",
          "<!-- end of conclusion -->",
          lambda r: conclusion(r, "fig3"),
      ),
  ]


def _text_of(root: Path, region: Region) -> str:
  """The committed text the region lives in (a notebook: its last markdown cell)."""
  path = root / region.path
  if path.suffix == ".ipynb":
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return [c for c in nb.cells if c.cell_type == "markdown"][-1].source
  return path.read_text() if path.is_file() else ""


def _split(text: str, region: Region) -> tuple[str, str, str]:
  """(before, the region's committed content, after); ValueError without the markers."""
  if region.begin is None:
    return "", text, ""
  if region.begin not in text or region.end not in text:
    raise ValueError(
        f"{region.path} must hold the lines {region.begin!r} and {region.end!r} around "
        "its generated part"
    )
  before, rest = text.split(region.begin, 1)
  inside, after = rest.split(region.end, 1)
  return before + region.begin + "\n", inside.strip("\n") + "\n", "\n" + region.end + after


def mismatches(root: Path = ROOT, results: dict | None = None) -> list[str]:
  """Every line of a generated region that is not what this script generates.

  Args:
    root: the repository root whose committed files are checked.
    results: the experiments' results (default: the committed ones under ``root``).

  Returns:
    One line per difference, ``path: - committed`` or ``path: + generated``;
    empty when every region is this script's output.
  """
  root = Path(root)
  results = results or load_all(root / "paper_notes" / "figures")
  out = []
  for region in regions():
    try:
      _, committed, _ = _split(_text_of(root, region), region)
    except ValueError as e:
      out.append(str(e))
      continue
    generated = region.make(results).strip("\n") + "\n"
    for line in difflib.unified_diff(
        committed.splitlines(), generated.splitlines(), lineterm="", n=0
    ):
      if line.startswith(("---", "+++", "@@")):
        continue
      kind = "committed" if line.startswith("-") else "generated"
      out.append(f"{region.path}: {kind}: {line[1:]}")
  return out


def write(root: Path = ROOT, results: dict | None = None) -> list[str]:
  """Rewrites every region from the results; returns the paths written."""
  results = results or load_all(root / "paper_notes" / "figures")
  written = []
  for region in regions():
    path = root / region.path
    generated = region.make(results).strip("\n") + "\n"
    if path.suffix == ".ipynb":
      import nbformat

      nb = nbformat.read(path, as_version=4)
      cell = [c for c in nb.cells if c.cell_type == "markdown"][-1]
      before, _, after = _split(cell.source, region)
      cell.source = before + generated + after
      nbformat.write(nb, path)
    else:
      before, _, after = _split(path.read_text() if path.is_file() else "", region)
      write_text_atomic(path, before + generated + after)
    written.append(region.path)
  return written


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--write", action="store_true", help="rewrite every generated region")
  parser.add_argument(
      "--check", action="store_true", help="exit 1 naming each line that is not generated"
  )
  parser.add_argument(
      "--claims-out", default=None, help="also write the claims file (every part) here"
  )
  parser.add_argument(
      "--rewrite", action="store_true", help="rewrite each experiment's results.md and curves.png"
  )
  args = parser.parse_args(argv)
  results = load_all()
  if args.rewrite:
    for name, group_by in EXPERIMENTS.items():
      if results[name] is not None:
        protocol_report.write_report(FIGURES / f"protocol_{name}", group_by)
  if args.check:
    found = mismatches(ROOT, results)
    print("\n".join(found) or "every generated region is the results' output")
    return 1 if found else 0
  if args.write:
    for path in write(ROOT, results):
      print(f"wrote {path}")
  else:
    print(section(results))
  if args.claims_out:
    write_text_atomic(args.claims_out, claims_file(results))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
