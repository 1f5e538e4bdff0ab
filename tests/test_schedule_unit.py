"""lr_schedule_unit: a schedule counted in the run's epochs or in the reference batch's steps.

Worked out by hand for N = 700 training examples, 32 examples per worker, p = 1, 2
and 4 workers (global batch G = 32 p) and the reference batch B_ref = 32 (the
1-worker run the schedule was written for), num_epochs = 4:

    run's steps per epoch S = N // G:      p = 1: 21, p = 2: 10, p = 4: 5
    run's total steps 4 S:                 84, 40, 20
    reference steps per epoch N // B_ref:  21 (for every p; not p S: 700 // 32 = 21)

A 'step' schedule decaying at epochs 1 and 3 (factor 0.1):

    'epochs':          decays at steps [S, 3 S] = [21, 63], [10, 30], [5, 15]
    'reference_steps': decays at steps [21, 63] for every p:
        p = 1: the same schedule as 'epochs' (the unit changes nothing at B_ref);
        p = 2: at step 21 = epoch 2.1 of the run; 63 is past its 40 steps (never comes);
        p = 4: both past its 20 steps: the rate never decays.

A cosine with a warm-up of 1 epoch: W = S ('epochs') or 21 ('reference_steps'),
rate eta t / W for t < W, then eta (1 + cos(pi (t - W) / (L - W))) / 2 with L =
4 S or 84. At p = 4 in reference steps the warm-up (21 steps) outlasts the
run's 20: the rate rises to eta 19 / 21 and never reaches the peak.
"""

import math
import sys

import numpy as np
import pytest

from easgd import cli
from easgd.run import trainer
from easgd.runtimes import optimizers
from easgd.settings.config import ConfigError, TrainConfig

N, PER_WORKER, B_REF, EPOCHS, ETA = 700, 32, 32, 4, 0.1
RUN_SPE = {1: 21, 2: 10, 4: 5}  # N // (32 p)


def config(p: int, unit: str, **changes) -> TrainConfig:
  return TrainConfig(
      num_workers=p,
      global_batch_size=PER_WORKER * p,
      num_epochs=EPOCHS,
      learning_rate=ETA,
      lr_schedule_unit=unit,
      lr_reference_batch=B_REF if unit == "reference_steps" else None,
      **changes,
  ).validate()


def _decay(*epochs):
  """A 'step' schedule decaying at ``epochs``."""
  return dict(lr_schedule="step", lr_decay_epochs=epochs)


def rates(cfg: TrainConfig, p: int) -> np.ndarray:
  """The schedule's rate at each step of the run (float64 of the float32 values)."""
  spe = RUN_SPE[p]
  sched = optimizers.make_schedule(cfg, spe, num_examples=N)
  return np.asarray([float(sched(t)) for t in range(EPOCHS * spe)])


def step_rates(total: int, decays: list[int]) -> np.ndarray:
  """eta, times 0.1 at each step of ``decays`` (those past ``total`` never come)."""
  return np.asarray([ETA * 0.1 ** sum(t >= d for d in decays) for t in range(total)])


def cosine_rates(total: int, warmup: int, length: int) -> np.ndarray:
  """Linear warm-up to eta over ``warmup`` steps, then the cosine to 0 at ``length``."""
  return np.asarray(
      [
          ETA * t / warmup
          if t < warmup
          else ETA * (1 + math.cos(math.pi * (t - warmup) / (length - warmup))) / 2
          for t in range(total)
      ]
  )


STEP_DECAYS = {
    ("epochs", 1): [21, 63],
    ("epochs", 2): [10, 30],
    ("epochs", 4): [5, 15],
    ("reference_steps", 1): [21, 63],
    ("reference_steps", 2): [21, 63],  # 63: past the run's 40 steps
    ("reference_steps", 4): [21, 63],  # both past the run's 20 steps
}


@pytest.mark.parametrize("unit, p", list(STEP_DECAYS))
def test_a_step_schedule_decays_at_the_units_steps(unit, p):
  cfg = config(p, unit, lr_schedule="step", lr_decay_epochs=(1.0, 3.0))
  total = EPOCHS * RUN_SPE[p]
  np.testing.assert_allclose(rates(cfg, p), step_rates(total, STEP_DECAYS[unit, p]), rtol=1e-6)
  r = cfg.resolve(RUN_SPE[p], N)
  spe = RUN_SPE[p] if unit == "epochs" else 21
  assert (r["lr_schedule_unit"], r["total_steps"], r["lr_decay_steps"]) == (
      unit,
      total,
      STEP_DECAYS[unit, p],
  )
  assert (r["schedule_steps_per_epoch"], r["schedule_steps"]) == (spe, EPOCHS * spe)


def test_reference_steps_decay_at_p_times_the_epochs_and_not_at_all_past_the_end():
  # the same decay epoch, in the run's epochs: 1 ('epochs'), 2.1 and never ('reference_steps')
  at_epoch = {}
  for p in (1, 2, 4):
    r = rates(config(p, "reference_steps", lr_schedule="step", lr_decay_epochs=(1.0, 3.0)), p)
    first = np.flatnonzero(r < ETA * 0.5)
    at_epoch[p] = first[0] / RUN_SPE[p] if first.size else None
  assert at_epoch == {1: 1.0, 2: 2.1, 4: None}
  for p in (1, 2, 4):
    r = rates(config(p, "epochs", lr_schedule="step", lr_decay_epochs=(1.0, 3.0)), p)
    assert np.flatnonzero(r < ETA * 0.5)[0] / RUN_SPE[p] == 1.0


@pytest.mark.parametrize("unit", ["epochs", "reference_steps"])
@pytest.mark.parametrize("p", [1, 2, 4])
def test_a_cosine_with_warmup_follows_the_units_length(unit, p):
  cfg = config(p, unit, lr_schedule="cosine", warmup_epochs=1.0)
  spe = RUN_SPE[p] if unit == "epochs" else 21
  expected = cosine_rates(EPOCHS * RUN_SPE[p], warmup=spe, length=EPOCHS * spe)
  np.testing.assert_allclose(rates(cfg, p), expected, rtol=1e-5, atol=1e-8)
  r = cfg.resolve(RUN_SPE[p], N)
  assert (r["lr_warmup_steps"], r["cosine_decay_steps"]) == (spe, EPOCHS * spe - spe)


def test_the_cut_cosine_in_numbers():
  # p = 4, reference steps: warm-up of 21 steps, the run's last step is 19
  last = rates(config(4, "reference_steps", lr_schedule="cosine", warmup_epochs=1.0), 4)[-1]
  assert last == pytest.approx(0.1 * 19 / 21, rel=1e-6)  # 0.0905, never the peak
  # no warm-up: cosine over 84 steps, at step 19: 0.05 (1 + cos(19 pi / 84)) = 0.08789
  last = rates(config(4, "reference_steps", lr_schedule="cosine"), 4)[-1]
  assert last == pytest.approx(0.05 * (1 + math.cos(19 * math.pi / 84)), rel=1e-6)
  assert last == pytest.approx(0.08789, abs=1e-5)
  # the same run in epochs ends near 0: 0.05 (1 + cos(19 pi / 20)) = 0.000616
  last = rates(config(4, "epochs", lr_schedule="cosine"), 4)[-1]
  assert last == pytest.approx(0.000616, abs=1e-6)


def test_the_reference_unit_checks_the_schedule_against_its_own_length():
  # 3.99 epochs x 21 = 83.79 -> step 84, the end of the 84-step schedule: lost
  cfg = config(4, "reference_steps", lr_schedule="step", lr_decay_epochs=(3.99,))
  with pytest.raises(
      ConfigError,
      match=r"^lr_decay_epochs=\(3.99,\) fall on steps \[84\] \(21 steps per epoch of "
      r"lr_reference_batch=32, warm-up 0 steps, 84 steps in the schedule\); allowed: "
      r"distinct steps after the warm-up and before the end of the schedule$",
  ):
    optimizers.make_schedule(cfg, 5, num_examples=N)
  # in epochs the same decay falls on step 20 of 20: refused, the run ends there
  with pytest.raises(ConfigError, match=r"fall on steps \[20\] .*before the end of the run$"):
    optimizers.make_schedule(config(4, "epochs", **_decay(3.99)), 5)
  # reference steps need the training set's size, and a reference batch it holds
  with pytest.raises(ConfigError, match="give num_examples N, the run's training examples$"):
    optimizers.make_schedule(cfg, 5)
  with pytest.raises(
      ConfigError,
      match=r"^lr_reference_batch=32 is more than the 31 training examples: .* allowed: "
      r"lr_reference_batch <= 31$",
  ):
    cfg.resolve(5, 31)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(lr_schedule_unit="reference_steps", **_decay(1.0)),
            "lr_schedule_unit 'reference_steps' counts the schedule in steps of a reference "
            "batch; give lr_reference_batch (the global batch the schedule was written for)",
        ),
        (
            dict(lr_schedule_unit="reference_steps", lr_reference_batch=32),
            "lr_schedule_unit='reference_steps' has no effect with lr_schedule 'constant' "
            "and warmup_epochs 0 (no schedule to count); use lr_schedule 'step' or 'cosine', "
            "or warmup_epochs > 0",
        ),
        (
            dict(lr_reference_batch=32, **_decay(1.0)),
            "lr_reference_batch=32 has no effect with lr_scaling 'none' and lr_schedule_unit "
            "'epochs'; use lr_scaling 'linear' or 'sqrt' or lr_schedule_unit "
            "'reference_steps', or leave it None",
        ),
        (dict(lr_schedule_unit="steps"), "unknown lr_schedule_unit 'steps'; allowed: epochs, "),
    ],
)
def test_bad_schedule_units_are_refused_in_one_line(changes, message):
  with pytest.raises(ConfigError) as e:
    TrainConfig(**changes).validate()
  assert str(e.value).startswith(message)


def test_the_reference_batch_serves_the_rate_and_the_schedule():
  TrainConfig(lr_scaling="linear", lr_reference_batch=32, **_decay(1.0)).validate()
  TrainConfig(lr_schedule_unit="reference_steps", lr_reference_batch=32, warmup_epochs=1).validate()
  both = TrainConfig(
      lr_scaling="linear", lr_schedule_unit="reference_steps", lr_reference_batch=32, **_decay(1.0)
  ).validate()
  assert both.lr_scale == 4.0  # 128 / 32
  assert both.resolve(10, 1280)["lr_decay_steps"] == [40]  # 1280 // 32 = 40 per epoch


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--lr-schedule", "step", "--lr-decay-epochs", "10", "--num-epochs", "20"]
            + ["--lr-schedule-unit", "reference_steps"],
            "easgd: error: lr_schedule_unit 'reference_steps' counts the schedule in steps",
        ),
        (["--random-flip"], "easgd: error: random_flip flips images; dataset 'mnist1d' holds"),
    ],
)
def test_the_command_line_refuses_them_with_exit_2(flags, message, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    sys.exit(cli.main(["train", "--workdir", str(tmp_path / "run"), *flags]))
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith(message)
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_run_records_the_schedules_length_in_reference_steps(tmp_path):
  # digits: 1438 training images; G = 64: 22 steps per epoch; B_ref = 16: 89 per epoch
  cfg = TrainConfig(
      dataset="digits",
      model="mlp",
      num_workers=2,
      global_batch_size=64,
      num_epochs=2,
      learning_rate=0.1,
      lr_schedule="step",
      lr_decay_epochs=(0.25, 1.0),  # steps 22 (round(22.25)) and 89: past the run's 44
      lr_schedule_unit="reference_steps",
      lr_reference_batch=16,
      eval_batch_size=64,
      progress=False,
  )
  summary = trainer.train_and_evaluate(cfg, tmp_path)
  r = summary["resolved"]
  assert (r["steps_per_epoch"], r["total_steps"]) == (22, 44)
  assert (r["lr_schedule_unit"], r["schedule_steps_per_epoch"], r["schedule_steps"]) == (
      "reference_steps",
      89,
      178,
  )
  assert r["lr_decay_steps"] == [22, 89]
  # the rate of each record: decayed once at step 22 (epoch 1), never again
  assert [h["learning_rate"] for h in summary["history"]] == pytest.approx([0.1, 0.01, 0.01])
