"""The protocol's network model: one link, or two levels (inside and between nodes).

Closed-form cases worked out by hand. An all-reduce of b bytes per device
over g devices costs l + 2 (g - 1) / g * b / beta at its link (latency l,
bandwidth beta); a level of a run (within a worker: groups of its D devices,
every step; across workers: one device per worker, the algorithm's count)
runs at ``inside`` when each of its groups lies in one node of n devices,
else at ``between``. The network used: inside 1 GB/s and 1 us, between
0.1 GB/s and 10 us, n = 4 devices per node; 10 steps of 0.01 s compute,
parameters of 1e6 bytes.
"""

import dataclasses

import pytest

from easgd.protocol import stats as protocol_stats
from easgd.protocol.config import ProtocolError
from easgd.protocol.networks import (
    GIGABIT_ETHERNET,
    HUNDRED_GIGABIT_ETHERNET,
    NVLINK_NODES_100GBE,
    Network,
    TwoLevelNetwork,
    network_from_dict,
)

FAST, SLOW = Network("fast", 1e9, 1e-6), Network("slow", 1e8, 1e-5)
NET = TwoLevelNetwork("nodes of 4", FAST, SLOW, 4)
P = 1_000_000  # parameter bytes
STEPS, COMPUTE = 10, 0.01


def links(p, D):
  return {level: link.name for level, link in NET.links(p, D).items()}


def test_a_level_is_inside_when_each_of_its_groups_lies_in_one_node():
  # devices numbered worker by worker: worker i on i D .. i D + D - 1; node = device // 4
  assert links(8, 1) == dict(across_workers="slow", within_workers="fast")  # 0..7: 2 nodes
  assert links(4, 1) == dict(across_workers="fast", within_workers="fast")  # 0..3: 1 node
  assert links(2, 4) == dict(across_workers="slow", within_workers="fast")  # a worker = a node
  assert links(2, 2) == dict(across_workers="fast", within_workers="fast")  # {0,2},{1,3}; rows
  # D = 3: worker 1 holds devices 3, 4, 5 (nodes 0 and 1); column {0, 3, 6} spans nodes
  assert links(3, 3) == dict(across_workers="slow", within_workers="slow")
  assert links(1, 8) == dict(across_workers="fast", within_workers="slow")  # no group across


def test_pmean_sgd_over_all_devices_pays_the_slow_link_every_step():
  # pmean SGD, 8 workers of 1 device on 2 nodes: 10 all-reduces of 1e6 bytes over g = 8
  # 10 x 0.01 + 10 x 1e-5 + 2 x 7/8 x 1e7 / 1e8 = 0.1 + 1e-4 + 0.175
  s = NET.modelled_seconds(STEPS, COMPUTE, (10, 10 * P), (0, 0), 8, 1)
  assert s == pytest.approx(0.2751, rel=1e-12)


def test_easgd_on_workers_of_a_node_pays_the_slow_link_every_tau_steps():
  # EASGD, 2 workers of D = 4 devices (a worker = a node), tau = 5: across 2 x 1e6
  # bytes over g = 2 at the slow link: 2 x 1e-5 + 2 x 1/2 x 2e6 / 1e8 = 0.02002;
  # within 10 x (1e6 + 4) bytes over g = 4 at the fast link:
  # 10 x 1e-6 + 2 x 3/4 x 10000040 / 1e9 = 1e-5 + 0.01500006 = 0.01501006
  s = NET.modelled_seconds(STEPS, COMPUTE, (2, 2 * P), (10, 10 * (P + 4)), 2, 4)
  assert s == pytest.approx(0.1 + 0.02002 + 0.01501006, rel=1e-12)
  # the same 4 workers of one device each fit one node: both levels at the fast link
  # 2 x 1e-6 + 2 x 3/4 x 2e6 / 1e9 = 0.003002
  s = NET.modelled_seconds(STEPS, COMPUTE, (2, 2 * P), (0, 0), 4, 1)
  assert s == pytest.approx(0.1 + 0.003002, rel=1e-12)


def test_one_link_is_the_flat_model_for_one_device_per_worker():
  for p, a, b in ((4, 10, 10 * P), (2, 3, 3 * P), (1, 0, 0)):
    flat = protocol_stats.modelled_seconds(STEPS, COMPUTE, a, b, p, 125e6, 50e-6)
    assert GIGABIT_ETHERNET.modelled_seconds(STEPS, COMPUTE, (a, b), (0, 0), p, 1) == flat
  # a worker of 2 devices on one link: within 10 x (1e6 + 4) over g = 2 at 1 GbE
  s = GIGABIT_ETHERNET.modelled_seconds(STEPS, COMPUTE, (0, 0), (10, 10 * (P + 4)), 1, 2)
  assert s == pytest.approx(0.1 + 10 * 50e-6 + 10 * (P + 4) / 125e6, rel=1e-12)


def test_the_nvlink_nodes_constant_and_its_results_json_form():
  net = NVLINK_NODES_100GBE
  assert (net.devices_per_node, net.inside.bandwidth_bytes_per_s) == (8, 300e9)
  assert net.between == HUNDRED_GIGABIT_ETHERNET and net.between.bandwidth_bytes_per_s == 12.5e9
  assert network_from_dict(dataclasses.asdict(net)) == net.validate()
  assert network_from_dict(dataclasses.asdict(GIGABIT_ETHERNET)) == GIGABIT_ETHERNET
  # 4 workers of 8 devices: within at NVLink, across at 100 GbE
  assert {k: v.name for k, v in net.links(4, 8).items()} == dict(
      across_workers="100GbE", within_workers="NVLink"
  )


@pytest.mark.parametrize(
    "network, words",
    [
        (TwoLevelNetwork("x", FAST, SLOW, 0), "devices_per_node of network 'x' must be an integer"),
        (
            TwoLevelNetwork("x", FAST, SLOW, 2.0),
            "devices_per_node of network 'x' must be an integer",
        ),
        (
            TwoLevelNetwork("x", Network("fast", 0.0, 1e-6), SLOW, 4),
            "bandwidth_bytes_per_s of network 'fast' (inside of network 'x') must be",
        ),
        (
            TwoLevelNetwork("x", FAST, Network("slow", -1e8, 1e-5), 4),
            "bandwidth_bytes_per_s of network 'slow' (between of network 'x') must be",
        ),
        (TwoLevelNetwork("x", FAST, "100GbE", 4), "between of network 'x' must be an easgd"),
        (TwoLevelNetwork("", FAST, SLOW, 4), "a network's name must be a non-empty string"),
        (Network("y", 0.0, 1e-6), "bandwidth_bytes_per_s of network 'y' must be"),
        (Network("y", 1e9, -1.0), "latency_s of network 'y' must be"),
    ],
)
def test_a_bad_network_is_one_line_naming_the_value(network, words):
  with pytest.raises(ProtocolError) as e:
    network.validate()
  assert words in str(e.value) and "\n" not in str(e.value)


def test_the_protocol_reports_modelled_times_on_a_two_level_network(tmp_path):
  """A tiny protocol (MNIST-1D, MLP, 1 epoch = 18 steps, p = 4) on 1 GbE and
  on nodes of 2 devices: results.json's modelled times are the model's on
  each arm's layout (4 x 1 devices: across workers at the slow link; 4 workers
  of 2 devices, modelled on the same simulated runs: within at the fast link
  every step, across at the slow one), and results.md names the links."""
  from easgd.protocol import report as protocol_report
  from easgd.protocol import runs
  from easgd.protocol.config import Arm, ProtocolConfig
  from easgd.settings.config import TrainConfig

  nodes = TwoLevelNetwork("nodes of 2", Network("fast", 1e9, 1e-6), Network("slow", 1e7, 1e-4), 2)
  base = TrainConfig(
      dataset="mnist1d",
      model="mlp",
      num_epochs=1,
      global_batch_size=384,
      num_workers=4,
      validation_examples=1000,
      progress=False,
  )
  two = dict(devices_per_worker=2, mapping_backend="shard_map")
  arms = (
      Arm("easgd", "easgd", dict(tau=4), (0.1,)),
      Arm("easgd D=2", "easgd", dict(tau=4, **two), (0.1,)),
      Arm("pmean", "pmean_sgd", {}, (0.1,)),
  )
  config = ProtocolConfig(
      "levels",
      "two levels",
      base,
      arms,
      eval_every_steps=6,
      targets=(0.8,),
      networks=(GIGABIT_ETHERNET, nodes),
  )
  results = runs.run_protocol(config, tmp_path, log=lambda line: None)
  pb = results["param_bytes"]
  for name, arm in results["arms"].items():
    entry = arm["time_to_target"]["0.8"]
    assert "summary" in entry, f"{name} did not reach 80% test error on every seed"
    D = 2 if name == "easgd D=2" else 1
    step_s = arm["compute_per_step_s"]
    for network in (GIGABIT_ETHERNET, nodes):
      expected = []
      for h in entry["steps"]:  # the first evaluation step at the target, per seed
        a = h if name == "pmean" else -(-h // 4)  # exchanges at t = 0, 4, 8, ... < h
        within = (h, h * (pb + 4)) if D == 2 else (0, 0)
        expected.append(network.modelled_seconds(h, step_s, (a, a * pb), within, 4, D))
      got = entry["summary"]["modelled_s"][network.name]["mean"]
      assert got == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    assert arm["within_worker_all_reduces"] == (arm["num_steps"] if D == 2 else 0)
    assert arm["within_worker_bytes"] == (arm["num_steps"] * (pb + 4) if D == 2 else 0)
  # by hand, on nodes of 2 devices: 4 workers of 1 device span 2 nodes (across: slow);
  # 4 workers of 2 devices: each worker one node (within: fast), across {0,2,4,6}: slow
  assert {k: v.name for k, v in nodes.links(4, 1).items()} == dict(
      across_workers="slow", within_workers="fast"
  )
  assert {k: v.name for k, v in nodes.links(4, 2).items()} == dict(
      across_workers="slow", within_workers="fast"
  )
  protocol_report.write_report(tmp_path, group_by="")
  text = (tmp_path / "results.md").read_text()
  assert "nodes of 2: 2 devices per node, inside 1 GB/s, 1 us, between nodes 0.01 GB/s" in text
  assert "80% on nodes of 2" in text
