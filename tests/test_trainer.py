"""train_and_evaluate and compare end to end on small real data (scikit-learn digits)."""

import json

import jax
import numpy as np
import pytest

from easgd.methods import registry
from easgd.parallel import mapping, placement, worker_layout
from easgd.run import checkpoint, rundir, tensorboard, trainer
from easgd.run.compare import compare
from easgd.runtimes import optimizers
from easgd.settings import builtin_tasks
from easgd.settings.config import ConfigError, TrainConfig
from easgd.tasks import batches, datasets, models

from testutil import TINY_DIGITS

TINY = TINY_DIGITS.replace(tau=3, eval_batch_size=32)


def test_train_writes_metrics_and_exact_center_evaluation(tmp_path):
  summary = trainer.train_and_evaluate(TINY, tmp_path)
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  on_disk = json.loads((tmp_path / "summary.json").read_text())
  assert [r["epoch"] for r in lines] == [0, 1, 2]
  ds = datasets.load_dataset("digits")
  n_test = len(ds.test_y)
  assert n_test % TINY.num_workers != 0  # the exactness below is not trivial
  assert all(r["test_count"] == n_test for r in lines)
  # resolved config and communication are recorded
  assert on_disk["config"]["resolved_alpha"] == pytest.approx(0.9 / 4)
  steps = on_disk["total_steps"]
  assert steps == 2 * batches.steps_per_epoch(len(ds.train_y), 4, 16)
  assert on_disk["communication"]["all_reduces"] == -(-steps // 3)
  assert on_disk["communication"]["bytes"] == -(-steps // 3) * on_disk["param_bytes"]
  assert on_disk["shared_copies_equal"] is True
  assert lines[-1]["test_accuracy"] > 0.5  # it learned (10 classes, chance 0.1)
  assert lines[1]["worker_center_distance"] > 0
  assert summary["final"] == lines[-1]


def test_center_accuracy_matches_direct_evaluation(tmp_path):
  # rebuild the trained center by hand and evaluate it with one apply
  cfg = TINY.replace(num_epochs=1)
  ds = datasets.load_dataset("digits")
  model = models.make_model("mlp", 10)
  summary = trainer.train_and_evaluate(cfg, tmp_path)
  # rebuild the final center deterministically: same seed, same data order
  layout = worker_layout.make_layout(4, 2)
  params = models.init_params(model, ds.input_shape, jax.random.split(jax.random.key(cfg.seed))[0])
  spe = batches.steps_per_epoch(len(ds.train_y), 4, 16)
  algo = registry.make_algorithm(
      cfg, builtin_tasks.make_loss_fn(model), optimizers.make_optimizer(cfg, spe), spe
  )
  w, s = placement.place_state(algo, params, layout)
  step = mapping.map_workers(
      algo.step, layout, ("worker", "shared", "worker", "broadcast"), ("worker", "shared", "worker")
  )
  key = jax.random.split(jax.random.key(cfg.seed))[1]
  for ix in batches.worker_batch_indices(len(ds.train_y), 4, 16, cfg.seed, 1):
    w, s, _ = step(w, s, placement.split_workers((ds.train_x[ix], ds.train_y[ix]), layout), key)
  center = placement.first_copy(algo.center(s))
  logits = model.apply({"params": center}, ds.test_x)
  correct = int(np.sum(np.argmax(logits, -1) == ds.test_y))
  assert summary["final"]["test_accuracy"] == correct / len(ds.test_y)
  assert correct > 0.5 * len(ds.test_y)


def test_pmean_baseline_runs_and_counts_every_step(tmp_path):
  s = trainer.train_and_evaluate(TINY.for_algorithm("pmean_sgd")[0], tmp_path)
  assert s["communication"]["all_reduces"] == s["total_steps"]
  assert s["final"]["worker_center_distance"] == 0.0


def test_schedule_is_counted_in_epochs():
  cfg = TrainConfig(
      num_epochs=10,
      learning_rate=0.2,
      lr_schedule="step",
      lr_decay_epochs=(5.0,),
      lr_decay_factor=0.1,
      warmup_epochs=1.0,
  )
  for steps_per_epoch in (10, 40):  # e.g. 4 workers vs 1 worker at another batch
    sched = optimizers.make_schedule(cfg, steps_per_epoch)
    lr_at = lambda epoch: float(sched(int(epoch * steps_per_epoch)))
    assert lr_at(0.5) == pytest.approx(0.1)
    assert lr_at(3) == pytest.approx(0.2)
    assert lr_at(6) == pytest.approx(0.02)
  cos = optimizers.make_schedule(cfg.replace(lr_schedule="cosine", warmup_epochs=0.0), 7)
  assert float(cos(0)) == pytest.approx(0.2)
  assert float(cos(35)) == pytest.approx(0.1, rel=1e-5)
  assert float(cos(70)) == pytest.approx(0.0, abs=1e-7)


def test_workdir_with_a_run_is_not_overwritten(tmp_path):
  (tmp_path / "summary.json").write_text('{"keep": true}')
  with pytest.raises(
      ConfigError, match=r"already holds a run; .*\(--overwrite\) or " r"resume \(--resume\)$"
  ):
    trainer.train_and_evaluate(TINY, tmp_path)
  assert json.loads((tmp_path / "summary.json").read_text()) == {"keep": True}
  # compare cannot resume: its message offers only what it has
  (tmp_path / "easgd").mkdir()
  (tmp_path / "easgd" / "summary.json").write_text("{}")
  with pytest.raises(
      ConfigError,
      match=r"already holds a run; choose another " r"directory, pass overwrite \(--overwrite\)$",
  ):
    compare(TINY.replace(num_epochs=1), tmp_path, ["easgd"])


def test_compare_writes_plot_and_table(tmp_path):
  rows = compare(TINY.replace(num_epochs=1), tmp_path)
  assert [r["algorithm"] for r in rows] == ["easgd", "pmean_sgd"]
  assert (tmp_path / "comparison.png").stat().st_size > 10_000
  table = (tmp_path / "results.md").read_text()
  assert "easgd" in table and "pmean_sgd" in table
  # EASGD with tau = 3 communicates a third as often as pmean SGD
  easgd_row, pmean_row = rows
  assert easgd_row["all_reduces_per_worker"] == -(-pmean_row["all_reduces_per_worker"] // 3)


def test_warns_outside_the_analytic_stable_region(tmp_path):
  # beta = 3.6 (alpha = 0.9 with 4 workers): the elastic map alone is unstable
  with pytest.warns(trainer.StabilityWarning, match=r"alpha=0.9 \(beta=3.6\), tau=3"):
    trainer.train_and_evaluate(TINY.replace(beta=3.6), tmp_path / "a", stop_after_steps=1)
  # with a curvature estimate, eta*h = learning_rate * curvature is checked
  with pytest.warns(trainer.StabilityWarning, match=r"eta\*h=3"):
    trainer.train_and_evaluate(TINY.replace(curvature=30.0), tmp_path / "b", stop_after_steps=1)
  import warnings

  with warnings.catch_warnings():
    warnings.simplefilter("error", trainer.StabilityWarning)
    trainer.train_and_evaluate(TINY.replace(curvature=1.0), tmp_path / "c", stop_after_steps=1)


def test_overwrite_keeps_the_earlier_run_until_the_new_one_completes(tmp_path):
  trainer.train_and_evaluate(TINY.replace(num_epochs=1), tmp_path)
  before = (tmp_path / "summary.json").read_text()
  diverging = TINY.replace(
      num_epochs=1, learning_rate=1e30, warmup_epochs=0.5, checkpoint_every_steps=1
  )
  with pytest.raises(trainer.DivergenceError):
    trainer.train_and_evaluate(diverging, tmp_path, overwrite=True)
  aside = tmp_path / rundir.PREVIOUS_RUN_DIR
  assert (aside / "summary.json").read_text() == before  # recoverable
  assert (aside / "checkpoints").is_dir()
  assert tensorboard.event_files(aside)  # its events too
  trainer.train_and_evaluate(TINY.replace(num_epochs=1), tmp_path, overwrite=True)
  assert not aside.exists()  # dropped once it stands
  assert len(tensorboard.event_files(tmp_path)) == 1  # the new run's, not the failed one's
  assert (tmp_path / "summary.json").read_text() != "{}"


def test_two_failed_overwrites_in_a_row_keep_the_last_finished_run(tmp_path):
  trainer.train_and_evaluate(TINY.replace(num_epochs=1), tmp_path)
  before = (tmp_path / "metrics.jsonl").read_text()
  diverging = TINY.replace(
      num_epochs=1, learning_rate=1e30, warmup_epochs=0.5, checkpoint_every_steps=1
  )
  for _ in range(2):
    with pytest.raises(trainer.DivergenceError):
      trainer.train_and_evaluate(diverging, tmp_path, overwrite=True)
  aside = tmp_path / rundir.PREVIOUS_RUN_DIR
  assert (aside / "metrics.jsonl").read_text() == before
  assert (aside / "summary.json").is_file()


def test_numpy_scalars_in_the_config_are_plain_values_in_the_written_files(tmp_path):
  cfg = TINY.replace(
      num_epochs=1,
      tau=np.int64(3),
      learning_rate=np.float32(0.1),
      num_workers=np.int64(4),
      global_batch_size=np.int32(64),
      lr_schedule="step",
      lr_decay_epochs=(np.float64(0.5),),
  )
  summary = trainer.train_and_evaluate(cfg, tmp_path, stop_after_steps=np.int64(5))
  assert summary["status"] == "stopped" and summary["steps_done"] == 5
  written = json.loads((tmp_path / "summary.json").read_text())["config"]
  assert written["tau"] == 3 and type(written["tau"]) is int
  assert written["lr_decay_epochs"] == [0.5]
  assert json.loads((tmp_path / "config.json").read_text())["num_workers"] == 4


def test_decay_points_that_would_be_merged_or_ignored_are_refused():
  step = TINY.replace(lr_schedule="step")
  with pytest.raises(ConfigError, match="allowed: distinct steps after the warm-up"):
    optimizers.make_schedule(step.replace(lr_decay_epochs=(0.5, 0.51)), 10)
  with pytest.raises(ConfigError, match="allowed: distinct steps after the warm-up"):
    optimizers.make_schedule(step.replace(lr_decay_epochs=(0.5,), warmup_epochs=1.0), 10)
  with pytest.raises(ConfigError, match="has no effect with lr_schedule 'constant'"):
    TINY.replace(lr_decay_epochs=(0.5,)).validate()
  schedule = optimizers.make_schedule(step.replace(lr_decay_epochs=(0.5, 0.8)), 10)
  assert [float(schedule(t)) for t in (4, 5, 8)] == pytest.approx([0.1, 0.01, 0.001])


def test_empty_workdir_is_refused(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ConfigError, match="workdir must be a non-empty path"):
    trainer.train_and_evaluate(TINY, "")
  assert not any(tmp_path.iterdir())


def test_unwritable_workdir_is_refused_before_compiling(tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(ConfigError, match="cannot be written"):
    trainer.train_and_evaluate(TINY, tmp_path / "file" / "run")


def test_compare_refuses_to_overwrite_an_earlier_comparison(tmp_path):
  compare(TINY.replace(num_epochs=1), tmp_path, ["easgd"])
  table = (tmp_path / "results.md").read_text()
  with pytest.raises(ConfigError, match="already holds a comparison"):
    compare(TINY.replace(num_epochs=1), tmp_path, ["pmean_sgd", "local_sgd"])
  assert (tmp_path / "results.md").read_text() == table


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(lr_decay_epochs=5.0), "lr_decay_epochs must be a tuple"),
        (dict(worker_speeds=3), "worker_speeds must be a sequence"),
        (dict(learning_rate=10**400), "learning_rate must be a finite real"),
        (dict(progress="no"), "progress must be a bool"),
        (dict(data_dir=123), "data_dir must be a path string"),
        (dict(tau=2**31), r"tau \(communication period\) must be an integer in \[1, 1073741824\]"),
    ],
)
def test_validate_raises_config_errors_not_type_errors(changes, match):
  with pytest.raises(ConfigError, match=match):
    TINY.replace(**changes).validate()


def test_huge_eval_batch_is_clamped_to_the_shard(tmp_path):
  s = trainer.train_and_evaluate(TINY.replace(num_epochs=1, eval_batch_size=10**9), tmp_path)
  assert s["final"]["test_count"] == 359


def test_pmean_sgd_gives_one_model_however_the_global_batch_is_split(tmp_path):
  """The examples of global step t depend on (seed, epoch, t) only: pmean SGD with
  1, 2, 4 or 8 workers (8 also as 2 devices x 4) at a fixed global batch of 64 is
  the same model after 20 steps (float32 summation order only: measured <= 3e-8)."""
  cfg = TrainConfig(
      dataset="digits",
      model="mlp",
      algorithm="pmean_sgd",
      global_batch_size=64,
      num_epochs=1,
      learning_rate=0.1,
      eval_batch_size=64,
      progress=False,
  )
  models_by_split = {}
  for p, d in [(1, 1), (2, 2), (4, 4), (8, 8), (8, 2)]:
    workdir = tmp_path / f"p{p}_d{d}"
    trainer.train_and_evaluate(
        cfg.replace(num_workers=p, num_devices=d), workdir, stop_after_steps=20
    )
    ckpt = checkpoint.Checkpointer(workdir)
    try:
      assert ckpt.latest_step() == 20
      models_by_split[p, d] = ckpt.restore(20)["center"]
    finally:
      ckpt.close()
  ref = jax.tree.leaves(models_by_split[1, 1])
  for split, params in models_by_split.items():
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(params), ref))
    assert gap <= 1e-6, (split, gap)
