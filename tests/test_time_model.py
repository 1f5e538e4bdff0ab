"""The time model of a run on a link (easgd.parallel.time_model, easgd.run.predict):
its predictions equal hand computations for a small case of each algorithm."""

from __future__ import annotations

import json
import math

import pytest

from easgd.parallel import time_model
from easgd.run import predict
from easgd.settings.config import TrainConfig

# a link of 1000 bytes/s with 10 ms per transfer, payload bytes only (no TCP framing)
LINK = time_model.LinkModel(1000.0, 0.01, framing=False)


def test_wire_bytes_adds_tcp_headers_and_acknowledgements():
  # 1448 payload bytes = 1 segment of 66 header bytes; 2896 received = 2 segments = 2 acks
  assert time_model.wire_bytes(1448, 2896) == pytest.approx(1448 + 66 + 2 * 66)
  assert time_model.wire_bytes(0, 0) == 0
  # a 9000-byte MTU: 8948-byte segments
  assert time_model.wire_bytes(8948, 0, mtu=9000) == pytest.approx(8948 + 66)


def test_ring_payload_is_two_g_minus_one_over_g_of_the_buffer():
  assert time_model.ring_payload(100, 2) == 100
  assert time_model.ring_payload(120, 4) == 180
  assert time_model.ring_payload(120, 1) == 0


@pytest.mark.parametrize(
    "algorithm, tau, exchanges",
    [
        # every step an all-reduce of the gradient: steps 1..8 (index 0 is not on the clock)
        ("pmean_sgd", 4, 8),
        # the elastic exchange at t = 0, 4, 8: t = 4 and 8 after step 1
        ("easgd", 4, 2),
        ("eamsgd", 4, 2),
        # the outer step after local steps t = 3, 7 ((t + 1) % tau == 0) and at the last, t = 8
        ("diloco", 4, 3),
        ("local_sgd", 4, 3),
    ],
)
def test_spmd_clock_is_steps_plus_the_exchanges_on_the_link(algorithm, tau, exchanges):
  config = TrainConfig(algorithm=algorithm, num_workers=2, tau=tau).for_algorithm(algorithm)[0]
  config = config.validate()
  # 9 steps: the clock counts steps 2..9, 8 steps of 0.01 s; each all-reduce of 100 bytes
  # over 2 processes sends 2 (2 - 1) / 2 x 100 = 100 bytes: 0.01 s + 100 / 1000 s
  got = predict.spmd_clock(config, 100, 9, 9, 0.01, 2, LINK)
  assert got == pytest.approx(8 * 0.01 + exchanges * (0.01 + 0.1))
  # one process: nothing crosses the link
  assert predict.spmd_clock(config, 100, 9, 9, 0.01, 1, LINK) == pytest.approx(0.08)
  assert predict.spmd_clock(config, 100, 9, 1, 0.01, 2, LINK) == 0.0


@pytest.mark.parametrize("algorithm", ["async_easgd", "downpour"])
def test_a_simulated_asynchronous_spmd_run_sends_every_message_every_slot(algorithm):
  config = TrainConfig(algorithm=algorithm, num_workers=2, tau=4).for_algorithm(algorithm)[0]
  config = config.validate()
  # the program of each slot gathers both workers' messages (2 x 100 bytes) and due flags
  # (2 x 4 bytes): 2 all-reduces of 208 bytes in all, whatever tau; steps 2..9 are 8 slots:
  # 16 all-reduces, 8 x 208 = 1664 bytes, over 2 processes 2 (2 - 1) / 2 x 1664 = 1664 sent
  (comm,) = predict.clock_communication(config, 100, 9, [9])
  assert (comm.all_reduces, comm.bytes) == (16, 1664)
  got = predict.spmd_clock(config, 100, 9, 9, 0.01, 2, LINK)
  assert got == pytest.approx(8 * 0.01 + 16 * 0.01 + 1664 / 1000)
  assert predict.spmd_clock(config, 100, 9, 9, 0.01, 1, LINK) == pytest.approx(0.08)


def test_async_worker_waits_its_token_buckets():
  # 32 steps of 0.01 s, exchanges before clocks 0 and 16 of 1000 bytes each way through
  # buckets of 100 bytes/s, 500 bytes, 0.5 s latency. At 0: push 0.5 + (1000 - 500) / 100
  # = 5.5 s, pull (its own full bucket) 5.5 s: 11 s. 16 steps: 11.16 s; both buckets full
  # again (refilled for > 10 s): 11 s more, 22.16 s; 16 steps: 22.32 s.
  link = time_model.LinkModel(100.0, 0.5, framing=False)
  got = time_model.async_seconds([32], 1, [0.01], 16, 1000, 1000, link, 500)
  assert got == [pytest.approx(22.32)]
  # a boundary after 16 steps, chunks of 8: nothing changes for one worker
  got = time_model.async_seconds([16, 32], 1, [0.01], 16, 1000, 1000, link, 500, chunk_steps=8)
  assert got == [pytest.approx(11.16), pytest.approx(22.32)]
  # a bucket not refilled: exchanges before clocks 0 and 1 (tau 1; pulls of 0 bytes: 0.5 s
  # each). Push 5.5 s (leaves -500 tokens), pull -> 6.0, a step of 1 s -> 7.0; the push at
  # 7.0 finds -500 + 100 x 7 = 200 tokens: 0.5 + 800 / 100 = 8.5 -> 15.5, pull -> 16.0, step
  got = time_model.async_seconds([2], 1, [1.0], 1, 1000, 0, link, 500)
  assert got == [pytest.approx(17.0)]


def test_async_workers_take_chunks_share_the_cores_and_exchange():
  # Two workers, 4 steps in all; tau 2, offset 1: an exchange before clock 1 (1000 bytes each
  # way, 1000 B/s, an empty bucket: 1 s push + 1 s pull). Chunks: worker 0 gets 4 / 2 = 2
  # steps, worker 1 (2 left) 1. Both take step 0 at 0.02 s (two computing); worker 0
  # exchanges to 2.02; worker 1's chunk is done (rate 50/s, 1 step counted) and it gets the
  # last step, whose exchange also ends at 2.02; both step to 2.04, the boundary.
  link = time_model.LinkModel(1000.0, 0.0, framing=False)
  got = time_model.async_seconds([4], 2, [0.01, 0.02], 2, 1000, 1000, link, 0, offset=1)
  assert got == [pytest.approx(2.04)]


def test_a_straggler_sleeps_and_the_other_computes_alone():
  # 3 steps in all, no exchange (tau 4, offset 3), worker 1 sleeps 5 ms after each step.
  # Chunks: worker 0 gets 2 steps, worker 1 one. Step 0 of both at 0.02 s (two computing);
  # worker 1 sleeps to 0.025 while worker 0 computes alone at 0.01 s a step: half its step by
  # 0.025 (worker 1's chunk is collected: nothing left to hand out), the rest by 0.03.
  link = time_model.LinkModel(math.inf, 0.0, framing=False)
  got = time_model.async_seconds(
      [3], 2, [0.01, 0.02], 4, 0, 0, link, 0, offset=3, delays_s=(0.0, 0.005)
  )
  assert got == [pytest.approx(0.03)]
  # one step time for every k: worker 0's second step takes 0.02 s, to 0.04
  got = time_model.async_seconds([3], 2, [0.02], 4, 0, 0, link, 0, offset=3, delays_s=(0, 0.005))
  assert got == [pytest.approx(0.04)]


def test_link_model_of_tc_spellings():
  model, burst = predict.link_model("10mbit", "5ms")
  assert (model.rate_bytes_s, model.latency_s, burst) == (1.25e6, 0.005, 16384)
  model, burst = predict.link_model()
  assert math.isinf(model.rate_bytes_s) and math.isinf(burst) and model.latency_s == 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rate", "10"], "--rate '10' is not a rate"),
        (["--rate", "10mbit", "--latency=0ms"], "--latency '0ms' is not a latency"),
        (["--rate", "10mbit", "--target-error", "1.5"], "--target-error 1.5 must lie in"),
        (["--rate", "10mbit"], "holds no run (config.json is missing)"),
    ],
)
def test_predict_bad_input_is_one_line_exit_2(tmp_path, capsys, flags, message):
  from easgd import cli

  status = cli.main(["predict", "--run", str(tmp_path / "none"), *flags])
  err = capsys.readouterr().err.strip()
  assert status == 2 and "\n" not in err and message in err, err


def test_predict_refuses_a_run_measured_behind_an_emulated_link(tmp_path, capsys):
  from easgd import cli

  config = TrainConfig(
      algorithm="async_easgd", runtime="threads", num_workers=2, link_rate="20mbit"
  ).validate()
  (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
  assert cli.main(["predict", "--run", str(tmp_path), "--rate", "20mbit"]) == 2
  err = capsys.readouterr().err.strip()
  assert "was measured behind an emulated link (link_rate '20mbit'" in err and "\n" not in err
  assert cli.main(["predict", "--run", str(tmp_path), "--worker-delays", "a,b"]) == 2
  assert "--worker-delays 'a,b' must be seconds per worker" in capsys.readouterr().err
