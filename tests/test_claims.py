"""The claims as a reviewer reads them, and every statement the guides make from the results.

Pairing by seed, the comparators the paper ran apart from the others, "EASGD better with a
larger tau", equivalence and power beside each inconclusive part, rankings only where an
interval resolves them; and the check that the guides' generated regions are the results'
output fails on a planted mismatch.
"""

import importlib.util
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from easgd.methods import registry
from easgd.protocol import claims as protocol_claims
from easgd.protocol import stats as protocol_stats

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "paper_notes" / "figures"
_spec = importlib.util.spec_from_file_location(
    "protocol_tables", ROOT / "scripts" / "protocol_tables.py"
)
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)

SEEDS = [100, 101, 102, 103]


def arm(
    algorithm,
    final,
    *,
    tau=4,
    p=4,
    model="cnn",
    seeds=None,
    workers=None,
    hits=None,
    num_steps=None,
    optimizer="sgd",
):
  """A results.json arm: 4 seeds, evaluations every 10 of 100 steps; with
  ``num_steps``, the run's local steps and samples (num_steps x 32 p) recorded."""
  steps = list(range(0, 101, 10))
  config = dict(tau=tau, num_workers=p, global_batch_size=32 * p, model=model, dataset="mnist1d")
  if optimizer != "sgd":
    config.update(optimizer=optimizer, momentum=0.99)
  out = dict(
      algorithm=algorithm,
      config=config,
      final_test_errors=list(final),
      test_errors_at_best_val=list(final),
      final_worker_test_errors=list(workers if workers is not None else [e + 0.01 for e in final]),
      report=dict(eval_steps=steps, **({"seeds": seeds} if seeds else {})),
      time_to_target={
          "0.3": dict(steps=list(hits or [50] * len(final)), n=len(final), reached=len(final))
      },
      compute_per_step_s=0.01,
      communication_curve=dict(all_reduces=steps, bytes=[s * 10**6 for s in steps]),
  )
  out["final_test_error"] = protocol_stats.mean_interval(final)
  if num_steps is not None:
    out.update(num_steps=num_steps, samples=num_steps * 32 * p)
  return out


def results(arms, name="synthetic"):
  return dict(
      protocol=dict(
          name=name,
          report_seeds=SEEDS,
          targets=[0.3],
          networks=[dict(name="1GbE", bandwidth_bytes_per_s=125e6, latency_s=50e-6)],
          base=dict(dataset="mnist1d", model="cnn"),
      ),
      arms=arms,
  )


# ---------------------------------------------------------------------------
# Pairing by seed
# ---------------------------------------------------------------------------


def test_arms_pair_by_seed_whatever_their_workers_not_across_models_or_seeds():
  r = results({})
  p4, p8 = arm("async_easgd", [0.1] * 4, p=4), arm("async_easgd", [0.1] * 4, p=8)
  assert protocol_claims.paired(r, p4, p8)  # seed i: the same initial parameters and data
  assert not protocol_claims.paired(r, p4, arm("async_easgd", [0.1] * 4, model="mlp"))
  assert not protocol_claims.paired(r, p4, arm("async_easgd", [0.1] * 4, seeds=[1, 2, 3, 4]))


def test_more_workers_is_judged_per_seed_and_its_interval_is_the_closed_form():
  # the p = 4 and p = 8 arms share every seed's effect (correlated seeds): the paired
  # interval is t_{n-1} * sd(differences) / sqrt(n) around the mean difference
  seed_effect = np.array([0.00, 0.04, -0.03, 0.05])
  p4 = 0.10 + seed_effect + np.array([0.012, 0.008, 0.011, 0.009])
  p8 = 0.10 + seed_effect
  r = results(
      {
          "async_easgd p=4": arm("async_easgd", p4, p=4),
          "async_easgd p=8": arm("async_easgd", p8, p=8),
      }
  )
  (workers,) = protocol_claims.claims(None, r)
  (part,) = workers["parts"]
  d = p4 - p8  # 0.012, 0.008, 0.011, 0.009: mean 0.01, sd sqrt(10/3) * 1e-3
  half = 3.182446305 * np.std(d, ddof=1) / 2  # t_3, 0.975 (tables); sqrt(4) = 2
  assert part["interval"]["paired"]
  assert part["interval"]["difference"] == pytest.approx(0.01)
  assert part["interval"]["low"] == pytest.approx(0.01 - half, rel=1e-7)
  assert part["verdict"] == "holds"  # Welch's interval of the same values contains 0
  assert protocol_stats.difference_interval(p4, p8)["low"] < 0
  assert "at p = 4 minus at p = 8 (the values run)" in workers["measurement"]


def fig3_like(extra=()):
  """Figure 3's asynchronous EASGD at p = 4 (432 local steps, 55,296 samples) and
  p = 8 (432 steps, 110,592 samples), and ``extra`` arms; per seed (test error):

    p=4                    0.10 0.14 0.07 0.15
    p=8                    0.09 0.12 0.06 0.14   (p=4 - p=8: +1, +2, +1, +1 pp)
    p=4 samples of p=8     0.08 0.13 0.07 0.12   (minus p=8: -1, +1, +1, -2 pp)
  """
  arms = {
      "async_easgd p=4": arm("async_easgd", [0.10, 0.14, 0.07, 0.15], p=4, num_steps=432),
      "async_easgd p=8": arm("async_easgd", [0.09, 0.12, 0.06, 0.14], p=8, num_steps=432),
  }
  arms.update(extra)
  return results(arms)


CONTROL = arm("async_easgd", [0.08, 0.13, 0.07, 0.12], p=4, num_steps=864)


def test_more_workers_at_equal_samples_is_a_part_of_its_own_with_its_paired_interval():
  r = fig3_like({"async_easgd p=4 samples of p=8": CONTROL})
  (workers,) = protocol_claims.claims(None, r)
  steps_part, samples_part = workers["parts"]
  assert steps_part["what"] == "async_easgd p=4 - async_easgd p=8 (test error at best val)"
  assert samples_part["what"] == (
      "async_easgd p=4 samples of p=8 - async_easgd p=8 (test error at best val, equal samples)"
  )
  # equal local steps: +1, +2, +1, +1 pp; mean 1.25 pp, sd 0.5 pp, half-width t_3 * 0.5 / 2
  assert steps_part["interval"]["difference"] == pytest.approx(0.0125)
  assert steps_part["interval"]["high"] == pytest.approx(0.0125 + 3.182446305 * 0.0025, rel=1e-7)
  assert steps_part["verdict"] == "holds"
  # equal samples: -1, +1, +1, -2 pp; mean -0.25 pp, sd sqrt(6.75 / 3) = 1.5 pp
  d = samples_part["interval"]
  assert d["paired"] and d["difference"] == pytest.approx(-0.0025)
  assert d["low"] == pytest.approx(-0.0025 - 3.182446305 * 0.0075, rel=1e-7)
  assert d["high"] == pytest.approx(-0.0025 + 3.182446305 * 0.0075, rel=1e-7)
  assert samples_part["verdict"] == "inconclusive"
  assert samples_part["comparator"] == "paper"
  assert workers["verdict"] == "inconclusive"
  assert workers["measurement"].startswith(
      "center test error at the evaluation with the lowest validation error at p = 4 minus at "
      "p = 8 (the values run), same local steps (more workers and more samples); in the parts "
      "marked 'equal samples', at p = 4 run for the samples of p = 8 (within 5%) minus at that "
      "p: more workers at equal samples (as run: asynchronous EASGD, Algorithm 1)"
  )
  assert workers["context"] == [
      "samples per run of the equal-samples parts: async_easgd p=4 samples of p=8 110,592 "
      "against async_easgd p=8 110,592"
  ]


def test_equal_samples_are_read_from_the_steps_where_not_recorded_and_within_5_percent():
  # no "samples": num_steps x global batch (1716 x 128 = 219,648 = 429 x 512 at p = 16)
  control = arm("async_easgd", [0.1] * 4, p=4, num_steps=1716)
  del control["samples"]
  p16 = arm("async_easgd", [0.1] * 4, p=16, num_steps=429)
  r = fig3_like({"async_easgd p=16": p16, "control": control})
  whats = [p["what"] for p in protocol_claims.claims(None, r)[0]["parts"]]
  assert whats == [
      "async_easgd p=4 - async_easgd p=8 (test error at best val)",
      "async_easgd p=4 - async_easgd p=16 (test error at best val)",
      "control - async_easgd p=16 (test error at best val, equal samples)",
  ]
  # 1.5 x the samples of p = 8 is no control, and p = 4 at 432 steps stays the base
  r = fig3_like({"longer": arm("async_easgd", [0.1] * 4, p=4, num_steps=648)})
  whats = [p["what"] for p in protocol_claims.claims(None, r)[0]["parts"]]
  assert whats == ["async_easgd p=4 - async_easgd p=8 (test error at best val)"]


def test_results_without_equal_samples_arms_give_the_committed_parts():
  fig3 = json.loads((FIGURES / "protocol_fig3" / "results.json").read_text())
  (workers,) = protocol_claims.claims(None, fig3)
  assert [(p["what"], p["text"], p["verdict"]) for p in workers["parts"]] == [
      (
          "async_easgd p=4 - async_easgd p=8 (test error at best val)",
          "+1.84 pp [+1.33, +2.34], resolves 0.51 pp",
          "holds",
      ),
      (
          "async_eamsgd p=4 - async_eamsgd p=8 (test error at best val)",
          "+0.16 pp [-0.25, +0.57], resolves 0.41 pp",
          "inconclusive",
      ),
  ]
  assert workers["measurement"] == (
      "center test error at the evaluation with the lowest validation error at p = 4 minus at "
      "p = 8 (the values run), same local steps (as run: asynchronous EASGD, Algorithm 1; "
      "asynchronous EAMSGD, Algorithm 2)"
  )
  assert workers["context"] == []


def test_momentum_baselines_are_compared_as_methods_the_paper_did_not_run():
  arms = {
      "async_eamsgd tau=4": arm("async_eamsgd", [0.1] * 4, hits=[40, 40, 40, 50]),
      "pmean_sgd nesterov": arm("pmean_sgd", [0.1] * 4, optimizer="nesterov", hits=[50] * 4),
      "local_sgd": arm("local_sgd", [0.1] * 4, optimizer="nesterov", hits=[60] * 4),
  }
  fastest, *_ = protocol_claims.claims(results(arms), None)
  by = {p["what"]: p for p in fastest["parts"]}
  # the name carries the optimizer, or the label adds it
  assert set(by) == {
      "async_eamsgd tau=4 - pmean_sgd nesterov",
      "async_eamsgd tau=4 - local_sgd [nesterov 0.99]",
  }
  assert {p["comparator"] for p in by.values()} == {"other"}
  assert fastest["by_comparator"]["paper"] == {"holds": 0, "does not hold": 0, "inconclusive": 0}


def test_the_differences_table_pairs_by_seed_and_marks_welch():
  one = [0.04, 0.05, 0.03, 0.06]
  r = results(
      {
          "1 worker": dict(
              arm("pmean_sgd", one, p=1), resolved_learning_rate=0.3, diverged=[False] * 4
          ),
          "p=2": dict(
              arm("pmean_sgd", [e + 0.01 for e in one], p=2),
              resolved_learning_rate=0.3,
              diverged=[False] * 4,
          ),
          "mlp": dict(
              arm("pmean_sgd", [0.05, 0.05, 0.04, 0.07], p=2, model="mlp"),
              resolved_learning_rate=0.3,
              diverged=[False, True, False, False],
          ),
      }
  )
  d = protocol_claims.differences(r, "1 worker")
  assert d["p=2"]["paired"] and d["p=2"]["resolvable"] == pytest.approx(0, abs=1e-12)  # 1 point
  assert not d["mlp"]["paired"]  # another model: seed i is not one unit of both
  table = protocol_claims.differences_markdown(r, "1 worker")
  assert (
      "| p=2 | 0.3 | 5.50 ± 2.05 | +1.00 pp [+1.00, +1.00], resolves 0.00 pp | yes | worse | 0/4 |"
      in table
  )
  assert "| no (Welch) |" in table and "| 1/4 |" in table


# ---------------------------------------------------------------------------
# The claims table as a reviewer reads it
# ---------------------------------------------------------------------------


def test_the_paper_marker_is_in_the_registry_table():
  paper = {n for n, s in registry.TABLE.items() if s.paper}
  assert {
      "easgd",
      "eamsgd",
      "async_easgd",
      "async_eamsgd",
      "downpour",
      "mdownpour",
      "sgd",
      "msgd",
  } <= paper
  assert not paper & {"pmean_sgd", "local_sgd", "diloco", "streaming_diloco"}


def test_parts_are_counted_apart_by_comparator_and_every_failing_part_is_shown():
  # EAMSGD reaches the target later than DiLoCo on every seed (does not hold, a method the
  # paper did not run), sooner than EASGD (holds, the paper's); seven local SGD arms at
  # other taus would push the failing part out of a "first few" listing
  arms = {
      "async_eamsgd tau=4": arm("async_eamsgd", [0.1] * 4, hits=[50, 50, 50, 60]),
      "diloco tau=4": arm("diloco", [0.1] * 4, hits=[10, 10, 10, 10]),
      "async_easgd tau=4": arm("async_easgd", [0.1] * 4, hits=[90, 100, 90, 100]),
  }
  for tau in (1, 2, 8, 16, 32, 64, 128):
    arms[f"async_eamsgd tau={tau}"] = arm("async_eamsgd", [0.1] * 4, tau=tau, hits=[50, 50, 50, 60])
    arms[f"local_sgd tau={tau}"] = arm("local_sgd", [0.1] * 4, tau=tau, hits=[50, 60, 50, 50])
  fastest, *_ = protocol_claims.claims(results(arms), None)
  assert fastest["by_comparator"]["paper"] == {"holds": 1, "does not hold": 0, "inconclusive": 0}
  assert fastest["by_comparator"]["other"]["does not hold"] == 1
  assert fastest["verdict_by_comparator"] == {"paper": "holds", "other": "does not hold"}
  summary = protocol_claims.comparator_summary(fastest)
  assert summary.startswith(
      "against the paper's comparators: 1 hold, 0 do not hold, 0 inconclusive (holds)"
  )
  assert "against methods the paper did not run: " in summary
  table = protocol_claims.claims_markdown([fastest], detail=False)
  assert "async_eamsgd tau=4 - diloco tau=4:" in table and "(does not hold)" in table
  detail = protocol_claims.claims_markdown([fastest])
  assert detail.count("\n| async_eamsgd") == len(fastest["parts"])  # every part, one row each


def test_easgd_with_a_larger_tau_is_a_claim_with_paired_intervals_for_every_pair():
  base = np.array([0.08, 0.10, 0.09, 0.12])
  arms = {
      f"async_easgd tau={t}": arm("async_easgd", base + extra, tau=t)
      for t, extra in ((1, 0.0), (16, 0.0005), (64, 0.04))
  }
  measured = {c["key"]: c for c in protocol_claims.claims(results(arms), None)}
  larger = measured["larger_tau"]
  assert larger["claim"] == "EASGD tends to reach a lower test error with a larger tau"
  whats = [p["what"] for p in larger["parts"]]
  assert whats == [
      "async_easgd tau=16 - async_easgd tau=1 (final test error)",
      "async_easgd tau=64 - async_easgd tau=1 (final test error)",
      "async_easgd tau=64 - async_easgd tau=16 (final test error)",
  ]
  by = {p["what"].split(" (")[0]: p for p in larger["parts"]}
  assert by["async_easgd tau=64 - async_easgd tau=1"]["verdict"] == "does not hold"
  assert by["async_easgd tau=64 - async_easgd tau=1"]["interval"]["difference"] == pytest.approx(
      0.04
  )
  assert larger["verdict"] == "does not hold"


def test_an_inconclusive_part_states_its_equivalence_bound_and_the_seeds_power_needs():
  # center minus mean worker per seed: +0.2, -0.2, +0.4, -0.4 pp (mean 0, sd sqrt(0.4/3) pp)
  center = np.array([0.100, 0.100, 0.100, 0.100])
  workers = center - np.array([0.002, -0.002, 0.004, -0.004])
  r = results({"async_easgd tau=4": arm("async_easgd", center, workers=workers)})
  center_claim = {c["key"]: c for c in protocol_claims.claims(r, None)}["center"]
  (part,) = center_claim["parts"]
  assert part["verdict"] == "inconclusive" and part["limited_by"] == "seeds"
  d = center - workers
  sd = np.std(d, ddof=1)
  # TOST at 1 pp: the 90% interval 0 +/- t_{3, 0.95} * sd / 2 lies inside +/-0.01
  half90 = scipy_stats.t.ppf(0.95, 3) * sd / 2
  eq = part["equivalence"]
  assert eq["equivalent"] and eq["high"] == pytest.approx(half90, rel=1e-9)
  assert eq["bound"] == protocol_claims.ERROR_BOUND
  assert part["seeds_for_power"] == protocol_stats.seeds_for_power(sd, 0.01, paired=True)
  sentence = protocol_claims.claim_sentence(center_claim)
  assert "the inconclusive part: equivalent within 1 pp (TOST)" in sentence
  assert f"needs up to {part['seeds_for_power']} seeds per arm (here 4)" in sentence


def test_a_time_part_says_when_the_evaluation_grid_not_the_seeds_leaves_it_open():
  # EAMSGD reaches the target 10, 10, 10 and 20 steps (one or two evaluations) before
  # local SGD: per seed -12.5 +/- 7.96 steps (t_3 * 5 / 2) excludes 0, the interval
  # widened by one evaluation interval (10 steps) does not
  arms = {
      "async_eamsgd tau=4": arm("async_eamsgd", [0.1] * 4, hits=[40, 40, 40, 40]),
      "local_sgd tau=4": arm("local_sgd", [0.1] * 4, hits=[50, 50, 50, 60]),
  }
  fastest, *_ = protocol_claims.claims(results(arms), None)
  (part,) = fastest["parts"]
  assert part["verdict"] == "inconclusive" and part["limited_by"] == "evaluation grid"
  assert part["equivalence"] is None  # one evaluation interval exceeds 10% of the time
  assert "resolved by the seeds but not by the evaluation grid" in protocol_claims.claim_sentence(
      fastest
  )


def test_a_replication_is_measured_beside_the_figure_2_experiment():
  fig2 = json.loads((FIGURES / "protocol_fig2" / "results.json").read_text())
  fashion = json.loads((FIGURES / "protocol_fashion" / "results.json").read_text())
  items = protocol_claims.claims(fig2, None, fashion)
  keys = [(c["key"], c["source"]) for c in items]
  assert keys == [
      ("fastest", "fig2_mnist1d"),
      ("fastest", "fashion_mlp"),
      ("robust", "fig2_mnist1d"),
      ("robust", "fashion_mlp"),
      ("larger_tau", "fig2_mnist1d"),
      ("larger_tau", "fashion_mlp"),
      ("center", "fig2_mnist1d"),
      ("center", "fashion_mlp"),
  ]
  larger = {c["source"]: c for c in items if c["key"] == "larger_tau"}
  part = next(
      p
      for p in larger["fig2_mnist1d"]["parts"]
      if p["what"].startswith("async_easgd tau=64 - async_easgd tau=1")
  )
  assert part["text"].startswith("+4.21 pp [+2.61, +5.81]") and part["verdict"] == "does not hold"
  assert [p["what"] for p in larger["fashion_mlp"]["parts"]] == [
      "async_easgd tau=16 - async_easgd tau=4 (final test error)"
  ]
  fastest = items[0]  # the audit's split: 2 failing parts, both against DiLoCo
  failing = [p for p in fastest["parts"] if p["verdict"] == "does not hold"]
  assert len(failing) == 2 and all(
      "diloco" in p["what"] and p["comparator"] == "other" for p in failing
  )
  assert fastest["by_comparator"]["paper"]["does not hold"] == 0


# ---------------------------------------------------------------------------
# Rankings only where an interval resolves them
# ---------------------------------------------------------------------------


def test_a_ranking_names_arms_whose_interval_contains_zero_as_not_resolved():
  a = [0.10, 0.12, 0.09, 0.11]
  r = results(
      {
          "low": arm("easgd", a),
          "tied": arm("easgd", [0.105, 0.115, 0.095, 0.12]),  # +0.38 pp, straddles 0
          "high": arm("easgd", [e + 0.02 for e in a]),  # +2 pp on every seed
      }
  )
  sentence = protocol_claims.ranking(r, ["low", "tied", "high"])
  assert sentence.startswith("lowest final test error not resolved among low (")
  assert (
      "and tied (+0.38 pp [-0.63, +1.38])" in sentence
      and "every other arm resolved above (nearest: high (+2.00 pp" in sentence
  )
  resolved = protocol_claims.ranking(r, ["low", "high"])
  assert resolved.startswith("low (") and "ends lowest in final test error" in resolved
  with pytest.raises(ValueError, match="at least two arms"):
    protocol_claims.ranking(r, ["low"])


# ---------------------------------------------------------------------------
# Every statement generated, and the check that catches a planted mismatch
# ---------------------------------------------------------------------------


def copy_of_the_repository(tmp_path) -> Path:
  """The files with generated regions (and the results they are read from), copied."""
  for region in tables.regions():
    target = tmp_path / region.path
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / region.path, target)
  for source in tables.result_paths():
    target = tmp_path / source.relative_to(ROOT)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)
  return tmp_path


@pytest.fixture(scope="module")
def committed_results():
  return tables.load_all()


def test_every_generated_region_is_the_results_output(committed_results):
  assert tables.mismatches(ROOT, committed_results) == []


def test_the_check_reports_a_number_changed_in_the_guide(tmp_path, committed_results):
  root = copy_of_the_repository(tmp_path)
  guide = root / "docs" / "guides" / "results.md"
  text = guide.read_text()
  assert "+4.21 pp [+2.61, +5.81]" in text
  guide.write_text(text.replace("+4.21 pp [+2.61, +5.81]", "+4.12 pp [+2.61, +5.81]", 1))
  found = tables.mismatches(root, committed_results)
  assert found and all(f.startswith("docs/guides/results.md: ") for f in found)
  assert any("committed" in f and "+4.12 pp" in f for f in found)
  assert any("generated" in f and "+4.21 pp" in f for f in found)


def test_the_check_reports_a_ranking_the_intervals_do_not_support(tmp_path, committed_results):
  # DiLoCo against asynchronous EAMSGD at tau = 4 on Fashion-MNIST: +0.13 pp [-0.13, +0.39]
  root = copy_of_the_repository(tmp_path)
  guide = root / "docs" / "guides" / "results.md"
  planted = "- DiLoCo ends lowest at tau = 4 on Fashion-MNIST, below asynchronous EAMSGD."
  text = guide.read_text().replace(
      "<!-- end of protocol tables -->", planted + "\n<!-- end of protocol tables -->"
  )
  guide.write_text(text)
  found = [f for f in tables.mismatches(root, committed_results) if not f.endswith("committed: ")]
  assert found == [f"docs/guides/results.md: committed: {planted}"]  # (and a blank line)
  sentence = tables.fashion_bullet(committed_results["fashion"])
  assert "at tau = 4: lowest final test error not resolved among diloco tau=4" in sentence


def test_the_check_reports_a_notebook_conclusion_typed_by_hand(tmp_path, committed_results):
  import nbformat

  root = copy_of_the_repository(tmp_path)
  path = root / "notebooks" / "04_effect_of_p.ipynb"
  nb = nbformat.read(path, as_version=4)
  nb.cells[-1].source = nb.cells[-1].source.replace("+1.84 pp", "+1.48 pp")
  nbformat.write(nb, path)
  found = tables.mismatches(root, committed_results)
  assert found and all(f.startswith("notebooks/04_effect_of_p.ipynb: ") for f in found)


def test_the_headings_and_wall_times_are_read_from_the_results(committed_results):
  fig3 = committed_results["fig3"]
  assert tables.title("fig3", fig3) == "Figure 3 setting: MNIST-1D, CNN, p in {4, 8}, tau = 10"
  assert tables.title("fig2", committed_results["fig2"]).endswith("p = 4, tau in {1, 4, 16, 64}")
  table = tables.wall_time_table(committed_results)
  minutes = committed_results["fig2"]["wall_time_s"] / 60
  assert f"| `experiments/protocol_fig2.py` | 36 | 10 | {minutes:.1f} min | over |" in table
  for text in (ROOT / "benchmarks" / "RESULTS.md", ROOT / "docs" / "guides" / "results.md"):
    body = text.read_text()
    assert "846 s" not in body and "<= 30 min" not in body  # the old run's time and budget
    assert table.strip() in body


def test_the_main_jobs_percentages_in_the_results_guide_are_committed_outputs():
  """Every "NN.NN%" the results guide states before the protocol section appears in a
  committed results.md of the main jobs (the tables are checked by test_readme)."""
  guide = (ROOT / "docs" / "guides" / "results.md").read_text()
  before = guide.split("## The comparison protocol", 1)[0]
  outputs = "".join(
      (FIGURES / name / "results.md").read_text()
      for name in ("mnist1d_main", "mnist1d_main_zen4", "fashion_mnist")
  )
  quoted = set(re.findall(r"\b(\d+\.\d\d)%", before))
  assert quoted and {q for q in quoted if f"{q}%" not in outputs} == set()
  fashion = (FIGURES / "fashion_mnist" / "results.md").read_text()
  easgd, pmean = (
      float(re.search(rf"^\| {a} \|(?:[^|]*\|){{4}} ([\d.]+)%", fashion, re.M)[1])
      for a in ("easgd", "pmean_sgd")
  )
  assert f"pmean SGD ends {pmean - easgd:.2f} points higher" in before
