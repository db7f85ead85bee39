"""The simulated GPUs: deterministic given a seed, replaying GenTD26, and their scenarios validated on load."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuaware.agent.collectors.sim import Fault, Scenario, SimCluster, load_scenario
from tests.support import FUZZ, KINDS_SCENARIO, json_values, sim_cluster


def test_the_simulator_is_deterministic_given_a_seed():
    runs = []
    for _ in range(2):
        cluster, clock = sim_cluster(nodes=1, gpus_per_node=4)
        col = cluster.node(0)
        seen = []
        for s in range(0, 600, 7):
            clock[0] = float(s)
            reads = [col.read(g, True) for g in range(4)]
            seen.append([(r.util_gpu, r.power_w, r.temp_c, r.fb_used_mib) for r in reads])
        runs.append(seen)
    assert runs[0] == runs[1]
    flat = np.array(runs[0], dtype=float)
    assert flat[..., 1].max() > flat[..., 1].min()  # power moves with the replayed utilisation


def test_simulated_gpus_replay_the_gentd26_series():
    cluster, clock = sim_cluster(nodes=1, gpus_per_node=8)
    utils = []
    for s in range(0, 3600, 10):
        clock[0] = float(s)
        utils.append([cluster.node(0).read(g, False).util_gpu for g in range(8)])
    utils = np.array(utils)
    assert utils.min() >= 0 and utils.max() <= 100
    assert utils.std(axis=0).max() > 1  # at least one GPU's load varies over the hour


def test_scenario_workloads_are_validated() -> None:
    from pydantic import ValidationError

    from gpuaware.agent.collectors.sim import Scenario

    with pytest.raises(ValidationError, match="workloads"):
        Scenario.model_validate({**KINDS_SCENARIO, "workloads": ["mining"]})
    assert load_scenario("baseline").workloads == ["trace"]


@FUZZ
@given(st.dictionaries(st.sampled_from(["name", "nodes", "gpus_per_node", "models", "faults", "workloads",
                                        "seed", "duration_s"]), json_values, max_size=5))
def test_scenario_loads_or_raises_value_error(tmp_path_factory, tree):
    path = tmp_path_factory.mktemp("scn") / "s.yaml"
    path.write_text(yaml.safe_dump(tree))
    try:
        load_scenario(path)
    except ValueError as exc:
        assert str(path) in str(exc)


def test_each_gpu_replays_the_pod_and_scaled_memory_numpys_draws_gave():
    """The simulator draws its pods in pure Python (gpuaware.agent.rng) and rounds as the float32 numpy code did,
    so a scenario's fleet is the one it always was."""
    from gpuaware.agent import traces

    cluster, _ = sim_cluster(nodes=2, gpus_per_node=4)
    duty, mem = traces.gentd26()
    pods = sorted(set(duty) & set(mem))
    rng = np.random.default_rng(cluster.scenario.seed)
    for row in cluster.gpus:
        for gpu in row:
            pod = pods[int(rng.integers(len(pods)))]
            assert gpu.offset_min == int(rng.integers(0, len(duty[pod])))
            assert gpu.util_series is duty[pod]
            m = np.array(mem[pod], dtype=np.float32)
            expected = m / (float(m.max()) or 1.0) * (0.2 + 0.7 * ((gpu.gid * 7919) % 100) / 100) \
                * gpu.spec.fb_total_mib
            assert expected.dtype == np.float32
            assert gpu.mem_series.tolist() == expected.tolist()


def test_a_reset_ends_a_faults_run_but_not_a_dead_gpu_or_an_operators_cap():
    cluster, _ = sim_cluster(nodes=1, gpus_per_node=2)
    gpu = cluster.gpus[0][0]
    gpu.faults = [Fault(kind="stuck_util", node=0, gpu=0, at_s=1), Fault(kind="power_cap", node=0, gpu=0, at_s=1),
                  Fault(kind="dead", node=0, gpu=0, at_s=50)]
    gpu.advance_to(10, 0.0)
    gpu.reset()
    assert not gpu.faults[0].active(12) and gpu.faults[1].active(12) and gpu.faults[2].active(60)


def test_a_degraded_board_loses_clocks_with_no_throttle_reason_and_a_failing_vrm_draws_off_the_curve():
    """The fault shapes of the clock and power peer checks (gpuaware/agent/peers.py): nothing a throttle rule reads."""
    scenario = Scenario(name="board-test", nodes=1, gpus_per_node=3, models=["H100"], workloads=["training-compute"],
                        faults=[Fault(kind="clock_degraded", node=0, gpu=1, at_s=10, clock_factor=0.8),
                                Fault(kind="power_skew", node=0, gpu=2, at_s=10, power_factor=0.55)])
    clock = [0.0]
    node = SimCluster(scenario, clock=lambda: clock[0], epoch=0.0).node(0)
    clock[0] = 20.0
    healthy, slow, skewed = (node.read(g, full=False) for g in range(3))
    assert healthy.throttle_reasons == slow.throttle_reasons == skewed.throttle_reasons == 0
    assert slow.sm_clock_mhz == int(healthy.sm_clock_mhz * 0.8)  # watched: on the watch read
    assert 0.75 < slow.power_w / healthy.power_w < 0.9  # its dynamic power falls with the clock: under the power rule
    assert skewed.sm_clock_mhz == healthy.sm_clock_mhz and skewed.power_w < 0.6 * healthy.power_w


def test_the_simulated_clock_can_start_at_the_agents_first_read():
    """`gpuaware up`: agents that start late (their Kafka topic check) still see a fault's onset at its at_s
    on their own clock, so its lead time is measured on one timeline."""
    from gpuaware.agent.collectors.sim import Scenario, SimCluster

    scenario = Scenario.model_validate({
        "name": "late", "seed": 3, "duration_s": 120, "nodes": 1, "gpus_per_node": 1, "models": ["H100"],
        "faults": [{"kind": "thermal_runaway", "node": 0, "gpu": 0, "at_s": 10, "rise_c_per_s": 3.0}]})
    clock = [1000.0]
    cluster = SimCluster(scenario, clock=lambda: clock[0], start_on_first_read=True)
    node = cluster.node(0)
    clock[0] = 1016.0  # the agent's first read comes 16 s after the cluster was built
    first = node.read(0, full=False)
    assert cluster.epoch == 1016.0 and first.ts == 1016.0
    clock[0] = 1025.0  # 9 s on its clock: the fault (at 10 s) has not started
    cool = node.read(0, full=False).temp_c
    assert abs(cool - first.temp_c) < 1.0
    clock[0] = 1040.0
    hot = node.read(0, full=False)
    assert hot.temp_c > cool + 20  # it began at 10 s on the agent's clock
    gpu = cluster.gpus[0][0]
    assert gpu.crossed_s is None or gpu.crossed_s >= 10
    # Built without it, the clock starts at construction: the same read sees the fault 16 s older.
    eager = SimCluster(scenario, clock=lambda: clock[0])
    assert eager.epoch == 1040.0


def test_a_warming_room_heats_every_gpu_of_its_node_and_no_other():
    """A room is the environment, not a fault: every GPU of the node takes in warmer air, the next node's none."""
    def temps(rooms: list[dict]) -> list[float]:
        scenario = Scenario.model_validate({
            "name": "room", "seed": 3, "nodes": 2, "gpus_per_node": 2, "models": ["L40S"],
            "workloads": ["training-compute"], "rooms": rooms})
        clock = [0.0]
        cluster = SimCluster(scenario, clock=lambda: clock[0], epoch=0.0)
        clock[0] = 900.0
        return [cluster.node(n).read(g, full=False).temp_c for n in range(2) for g in range(2)]

    still = temps([])
    warm = temps([{"node": 0, "at_s": 100, "rise_c": 8, "ramp_s": 300}])
    assert [round(w - s, 1) for w, s in zip(warm, still, strict=True)] == [8.0, 8.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"rooms\.0: node 2"):
        Scenario.model_validate({"name": "room", "nodes": 2, "rooms": [{"node": 2, "at_s": 0, "rise_c": 5}]})
