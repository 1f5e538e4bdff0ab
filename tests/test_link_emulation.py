"""The emulated link of the real asynchronous runtimes (``easgd.runtimes.link_emulation``).

* the token bucket against hand-computed delays on a fake clock (a full bucket,
  its refill, the latency, a transfer larger than the bucket);
* a threads run charges each worker's link exactly the bytes of the exchanges its
  log records (``easgd.core.elastic.reduced_bytes``, the communication accounting);
* a run with a link replays from its exchange log to its checkpoint bit for bit
  (the link changes time, never results);
* bad link settings: one line each, and runtime 'spmd' refuses them.
"""

import math
import re

import jax
import pytest
from test_real_async import TINY, replays_its_checkpoint

from easgd import cli
from easgd.asynchrony import simulation as asynchronous
from easgd.core import elastic
from easgd.run import trainer
from easgd.runtimes import async_runs, link_emulation
from easgd.runtimes import driver as async_driver
from easgd.runtimes import shared as async_shared
from easgd.runtimes import threads as async_threads
from easgd.settings.config import ConfigError, TrainConfig

from testutil import mlp_setup, random_batches

P = 4


def test_the_token_bucket_charges_the_hand_computed_delays():
  # r = 1024 B/s, B = 512 B, L = 0.25 s: every delay is exact in binary
  now = [0.0]
  bucket = link_emulation.TokenBucket(1024, 512, 0.25, clock=lambda: now[0])
  assert bucket.charge(256) == 0.25  # a full bucket: the latency only; 256 left
  assert bucket.charge(512) == 0.25 + 256 / 1024  # 256 short: 0.5 s; -256 left
  now[0] = 0.5
  assert bucket.charge(128) == 0.25  # refilled by 512 to 256; 128 left
  assert bucket.charge(128, now=10.0) == 0.25  # refilled to the burst, 512; 384 left
  assert bucket.charge(2048, now=10.0) == 0.25 + (2048 - 384) / 1024  # larger than B
  assert bucket.charge(0, now=10.5) == 0.25 + (1664 - 512) / 1024  # its debt, 1.125 s
  assert bucket.charge(1, now=1e9) == 0.25  # full again, never above B
  unlimited = link_emulation.TokenBucket(math.inf, math.inf, 0.125)
  assert unlimited.charge(10**12, now=0.0) == 0.125


def test_a_transfer_waits_at_least_its_bytes_over_the_rate():
  bucket = link_emulation.TokenBucket(1000, 100, 0.0)
  for t in range(5):  # back to back at the same time: queued behind each other
    delay = bucket.charge(1000, now=0.0)
    assert delay >= (1000 * (t + 1) - 100) / 1000


def test_the_settings_give_each_worker_its_link():
  c = TrainConfig(algorithm="async_easgd", runtime="threads")
  assert link_emulation.worker_links(c) is None
  slow = c.replace(link_rates=("1gbit", "1gbit", "1gbit", "10mbit"), link_latency="5ms")
  specs = link_emulation.worker_links(slow.validate())
  assert specs[0] == link_emulation.LinkSpec(1.25e8, 125000.0, 0.005)  # 1 ms at 1 Gbit/s
  assert specs[3] == link_emulation.LinkSpec(1.25e6, 16384, 0.005)  # at least 16 KiB
  burst = c.replace(link_rate="8kbps", link_burst="1k").validate()
  assert link_emulation.worker_links(burst) == [link_emulation.LinkSpec(8000.0, 1024.0, 0.0)] * P
  latency = link_emulation.worker_links(c.replace(link_latency="100us").validate())
  assert latency == [link_emulation.LinkSpec(math.inf, math.inf, 1e-4)] * P


def test_a_threads_run_charges_exactly_the_bytes_of_its_logged_exchanges():
  params, loss = mlp_setup(seed=0)
  x, y = random_batches(64, P, 8, seed=2)
  algo = asynchronous.async_easgd(loss, num_workers=P, tau=3, learning_rate=0.1, beta=0.9)
  setup = async_shared.AsyncSetup(
      algo, params, lambda i, t: (x[t % 64, i], y[t % 64, i]), jax.random.key(11)
  )
  links = [link_emulation.LinkSpec(1e9, 1e6, 0.0)] * 3 + [link_emulation.LinkSpec(1e6, 1e3, 1e-3)]
  backend = async_threads.ThreadBackend(setup, P, devices=[None] * P, links=links)
  try:
    backend.warm_up()
    driver = async_driver.Driver(backend, [0] * P, chunk_steps=4)
    driver.run_to(20 * P)
    states, _, log = backend.state()
  finally:
    backend.close()
  exchange_bytes = elastic.reduced_bytes(params)  # what the accounting counts per exchange
  per_worker = async_runs._exchanges_per_worker(log, P)
  assert per_worker.sum() == len(log) > 0
  for i, loop in enumerate(backend.loops):
    assert loop.link.pushed_bytes == loop.link.pulled_bytes == per_worker[i] * exchange_bytes
    assert per_worker[i] == -(-int(states[i].clock) // 3)  # ceil(n / tau)
  slow = backend.loops[3].link  # each transfer waits its latency, and the bytes over 1 MB/s
  assert slow.waited_s >= per_worker[3] * 2 * (1e-3 + (exchange_bytes - 1e3) / 1e6)


LINKED = TINY.replace(
    num_epochs=1,
    worker_delays=(),
    link_rates=("1gbit", "1gbit", "1gbit", "10mbit"),
    link_latency="1ms",
)


def test_a_run_behind_a_link_replays_its_checkpoint_bit_for_bit(tmp_path):
  done = trainer.train_and_evaluate(LINKED, tmp_path)
  assert done["status"] == "complete" and done["steps_done"] == 22
  clocks = replays_its_checkpoint(tmp_path, LINKED)  # the link changes time, never results
  assert sum(clocks) == 22 * P
  log = async_shared.read_log(tmp_path / "exchanges.jsonl")
  assert set(log[0]) == {"event", "worker", "local_step", "version", "read_version", "time_s"}


RATES = "bit, kbit, mbit, gbit, tbit, kibit, mibit, gibit, tibit, bps, kbps, mbps, gbps, tbps"


@pytest.mark.parametrize(
    "changes,line",
    [
        (
            dict(link_rate="10"),
            f"link_rate '10' is not a rate: a positive number (at least 1bit) with a unit, "
            f"one of {RATES} (e.g. 100mbit, 1gbit)",
        ),
        (
            dict(link_rates=("1gbit", "1gbit", "1gbit", "-1mbit")),
            f"link_rates[3] '-1mbit' is not a rate: a positive number (at least 1bit) with a "
            f"unit, one of {RATES} (e.g. 100mbit, 1gbit)",
        ),
        (
            dict(link_latency="5 parsecs"),
            "link_latency '5 parsecs' is not a latency: a positive number (at least 1us) with "
            "a unit, one of s, sec, secs, ms, msec, msecs, us, usec, usecs (e.g. 5ms)",
        ),
        (
            dict(link_rate="1mbit", link_burst="0kb"),
            "link_burst '0kb' is not a size: a positive number (at least 1b) with a unit, "
            "one of b, k, kb, m, mb, g, gb (e.g. 64kb)",
        ),
        (
            dict(link_rates=("1mbit",)),
            "link_rates has 1 entries; expected one per worker (num_workers=4)",
        ),
        (
            dict(link_rate="1mbit", link_rates=("1mbit",) * 4),
            "give link_rate (every worker) or link_rates (each worker), not both",
        ),
        (
            dict(link_burst="64kb"),
            "link_burst='64kb' is the size of a rate's token bucket; give link_rate or "
            "link_rates, or leave link_burst None",
        ),
        (
            dict(runtime="spmd", link_rate="10mbit"),
            "link_rate='10mbit' is not read by runtime 'spmd' (the emulated link is in the "
            "real workers' exchanges; processes across a shaped link: easgd link); use "
            "runtime 'threads' or 'ray'",
        ),
    ],
)
def test_bad_link_settings_are_refused_in_one_line(changes, line):
  base = LINKED.replace(link_rates=(), link_latency=None)
  with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
    base.replace(**changes).validate()


def test_the_command_line_refuses_a_bad_rate_in_one_line(tmp_path, capsys):
  argv = ["train", "--workdir", str(tmp_path / "w"), "--algorithm", "async_easgd"]
  assert cli.main([*argv, "--runtime", "threads", "--link-rate", "fast"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("easgd: error: link_rate 'fast' is not a rate")
  assert cli.main([*argv, "--link-rate", "10mbit"]) == 2  # runtime spmd
  err = capsys.readouterr().err
  assert err.count("\n") == 1
  assert err.startswith("easgd: error: link_rate='10mbit' is not read by runtime 'spmd'")
  assert not (tmp_path / "w").exists()
