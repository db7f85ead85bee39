"""The agent's pure parts on simulated GPUs: sampling, detectors, health, spool, exporter."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.anomaly import HalfSpaceTrees
from agent.collectors.sim import SimCluster, load_scenario, scenario_library
from agent.core import AgentCore, BatchBuilder
from agent.evaluation import EXPECTED, run_scenario
from agent.exporter import DCGM_LABELS, AgentCollector, AgentStats
from agent.health import HealthScorer
from agent.readings import Reading
from agent.sampling import AdaptiveSampler, PolicyError, SamplingPolicy, parse_policy
from agent.spool import DiskSpool, SpoolRecord
from contract import events
from contract.events import HealthBand


def _cluster(name: str = "baseline", **update):
    scenario = load_scenario(name).model_copy(update=update)
    clock = [0.0]
    return SimCluster(scenario, clock=lambda: clock[0], epoch=0.0), clock


def test_the_simulator_is_deterministic_given_a_seed():
    runs = []
    for _ in range(2):
        cluster, clock = _cluster(nodes=1, gpus_per_node=4)
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
    cluster, clock = _cluster(nodes=1, gpus_per_node=8)
    utils = []
    for s in range(0, 3600, 10):
        clock[0] = float(s)
        utils.append([cluster.node(0).read(g, False).util_gpu for g in range(8)])
    utils = np.array(utils)
    assert utils.min() >= 0 and utils.max() <= 100
    assert utils.std(axis=0).max() > 1  # at least one GPU's load varies over the hour


@pytest.mark.parametrize("path", [p for p in scenario_library() if load_scenario(p).faults], ids=lambda p: p.stem)
def test_each_fault_raises_its_event_and_drops_health(path):
    result = run_scenario(path)
    assert result.faults
    for f in result.faults:
        assert f.detected, f"{f.kind} on {f.node}/{f.gpu} raised none of {EXPECTED[f.kind]}"
        assert f.delay_s is not None and f.delay_s <= 3.0, f
        assert f.health_min_after < f.health_before, f
    assert result.false_alarms == 0


def test_healthy_gpus_raise_no_alarms_and_sampling_backs_off():
    result = run_scenario(next(p for p in scenario_library() if p.stem == "baseline"))
    assert result.false_alarms == 0
    assert result.samples_fixed / result.samples_adaptive >= 5
    assert result.abs_err_sum / result.abs_err_n <= 2.0


def _reading(ts, util=50.0, temp=60.0, power=300.0, **kw):
    return Reading(ts=ts, util_gpu=util, temp_c=temp, power_w=power, fb_used_mib=1000.0, ecc_sbe_volatile=0,
                   ecc_dbe_volatile=0, throttle_reasons=0, **kw)


def test_sampler_backs_off_while_stable_and_snaps_to_the_floor():
    policy = SamplingPolicy(floor_s=1, ceiling_s=30, backoff=2)
    s = AdaptiveSampler(policy, fb_total_mib=80000, power_limit_w=700)
    t, taken = 0.0, []
    while t < 200:
        r = _reading(t)
        if s.due(r):
            s.taken(r, changed=s.outside_deadband(r) not in (None, "first") if s.last else False)
            taken.append(t)
        t += 1
    assert s.interval == 30
    assert len(taken) < 20
    jump = _reading(t, util=90.0)
    assert s.outside_deadband(jump) == "util_gpu" and s.due(jump)
    s.taken(jump, changed=True)
    assert s.interval == 1
    s.taken(_reading(t + 1, util=90.0), changed=False)
    assert s.interval == 2
    s.snap()
    assert s.due(_reading(t + 1.5, util=90.0))


def test_policy_validation_names_the_field():
    with pytest.raises(PolicyError, match=r"floor_s: 10\.0 is above ceiling_s 5\.0"):
        parse_policy("floor_s: 10\nceiling_s: 5\n")
    with pytest.raises(PolicyError, match=r"deadbands\.util_gpu"):
        parse_policy("deadbands:\n  util_gpu: -1\n")
    with pytest.raises(PolicyError, match="samplng_floor"):
        parse_policy("samplng_floor: 1\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        parse_policy("floor_s: [1\n")
    p = parse_policy("ceiling_s: 60\nnodes:\n  gpu-node-7:\n    floor_s: 5\n")
    assert p.for_node("gpu-node-7").floor_s == 5 and p.for_node("other").floor_s == 1


def test_health_drops_on_a_double_bit_error_and_recovers_as_it_ages():
    h = HealthScorer(slowdown_temp_c=87)
    h.learn_one(_reading(0))
    assert h.update_band() is None and h.score == 100
    h.learn_one(Reading(ts=1, ecc_dbe_volatile=1, temp_c=60))
    assert h.score <= 40
    assert h.update_band() == (HealthBand.HEALTHY, HealthBand.CRITICAL)
    h.learn_one(Reading(ts=1 + 6 * 3600, ecc_dbe_volatile=1, temp_c=60))
    assert h.score == pytest.approx(70, abs=1)
    assert h.update_band() == (HealthBand.CRITICAL, HealthBand.DEGRADED)
    h.learn_one(Reading(ts=1 + 24 * 3600, ecc_dbe_volatile=1, temp_c=60))
    assert h.score > 95 and h.update_band() == (HealthBand.DEGRADED, HealthBand.HEALTHY)
    assert h.components()["ecc"] == pytest.approx(h.score)


def test_health_band_does_not_flap_at_a_boundary():
    h = HealthScorer()
    h.penalties["thermal"] = 21.0
    h.update_band()
    assert h.band is HealthBand.DEGRADED
    h.penalties["thermal"] = 19.0  # score 81: past 80, but not by the 3-point margin
    assert h.update_band() is None
    h.penalties["thermal"] = 16.0
    assert h.update_band() == (HealthBand.DEGRADED, HealthBand.HEALTHY)


def test_half_space_trees_score_outliers_above_inliers():
    rng = np.random.default_rng(0)
    hst = HalfSpaceTrees(n_features=4, seed=1, window_size=100)
    for x in rng.normal(0.3, 0.03, size=(400, 4)).clip(0, 1):
        hst.learn_one(x)
    inlier = np.mean([hst.score_one(x) for x in rng.normal(0.3, 0.03, size=(50, 4)).clip(0, 1)])
    outlier = hst.score_one(np.array([0.95, 0.05, 0.9, 0.95]))
    assert 0 <= inlier < outlier <= 1


def test_spool_keeps_order_survives_restart_and_drops_oldest_only_past_its_bound(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    for i in range(10):
        spool.push(SpoolRecord("t", f"k{i}".encode(), f"v{i}".encode() * 10, [("h", b"x")]))
    assert [r.key for r in spool.peek(3)] == [b"k0", b"k1", b"k2"]
    spool.ack(spool.peek(4)[-1].position)
    assert spool.depth == 6
    reopened = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    assert [r.key for r in reopened.peek(100)] == [f"k{i}".encode() for i in range(4, 10)]
    assert reopened.peek(1)[0].headers == [("h", b"x")]
    for i in range(10, 200):
        reopened.push(SpoolRecord("t", f"k{i}".encode(), b"v" * 100))
    assert reopened.dropped > 0
    kept = reopened.peek(1000)
    assert len(kept) + reopened.dropped == 196
    keys = [int(r.key[1:]) for r in kept]
    assert keys == sorted(keys) and keys[-1] == 199  # oldest went first, newest kept


def test_spool_truncates_a_torn_tail(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    spool.push(SpoolRecord("t", None, b"complete"))
    seg = sorted(tmp_path.glob("*.seg"))[-1]
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x40partial")
    again = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    assert [r.value for r in again.peek(10)] == [b"complete"]
    assert again.peek(1)[0].key is None


def test_exporter_speaks_dcgm_names_and_leaves_unsupported_fields_out():
    cluster, clock = _cluster("thermal")
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    for s in range(0, 30):
        clock[0] = float(s)
        core.tick(float(s))
    core.tracks[0].last_sample.mem_temp_c = None  # a GPU without an HBM sensor
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats()))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_PROF_SM_ACTIVE",
                 "gpuaware_gpu_health_score", "gpuaware_agent_sampling_interval_seconds"):
        assert families[name].samples, name
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert len(util) == 8 and set(util[0].labels) == set(DCGM_LABELS)
    assert util[0].labels["Hostname"] == "sim-node-000" and util[0].labels["UUID"].startswith("GPU-")
    mem_temp = [s.labels["gpu"] for s in families["DCGM_FI_DEV_MEMORY_TEMP"].samples]
    assert "0" not in mem_temp
    comps = {s.labels["component"] for s in families["gpuaware_gpu_health_component"].samples}
    assert {"ecc", "xid", "thermal", "power", "throttle", "pcie"} <= comps


def test_batches_are_decodable_and_carry_every_sample_once():
    cluster, clock = _cluster(nodes=1, gpus_per_node=4)
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    builder = BatchBuilder(core.node, core.devices)
    taken, published = [], []
    for s in range(120):
        clock[0] = float(s)
        out = core.tick(float(s))
        taken += [(core.devices[i].uuid, seq) for i, seq, _ in out.samples]
        builder.add(out.samples)
        if s % 5 == 4 and (batch := builder.build()) is not None:
            decoded = events.decode(events.encode(batch))
            assert decoded == batch and decoded.batch_seq == len(published) + 1
            published.append(decoded)
    keys = [(b.gpus[x.gpu].uuid, x.seq) for b in published for x in b.samples]
    assert sorted(keys) == sorted(taken) and len(set(keys)) == len(keys) == core.samples_taken
