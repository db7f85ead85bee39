"""Peer comparison, telemetry collapse and slow ECC storms: the fault shapes the first detectors missed."""

from __future__ import annotations

from dataclasses import replace

from gpuaware.agent.anomaly import EccRate, TelemetryCollapse
from gpuaware.agent.collectors.sim import SimCluster
from gpuaware.agent.core import AgentCore
from gpuaware.agent.peers import NodePeers
from gpuaware.agent.sampling import SamplingPolicy
from tests.support import reading, sim_cluster


def _run(cluster: SimCluster, clock: list[float], seconds: int) -> list:
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    events = []
    for s in range(seconds):
        clock[0] = float(s)
        events += [(s, e) for e in core.tick(float(s)).events]
    return events


def test_a_failing_fan_that_settles_below_the_throttle_point_is_flagged_against_its_peers():
    cluster, clock = sim_cluster("drift")
    cluster.gpus[0][5].faults = []  # the fan alone
    events = _run(cluster, clock, 700)
    flagged = [(s, e) for s, e in events if e.attributes.get("detector") == "thermal_peer"]
    assert flagged and all(e.gpu_uuid == cluster.gpus[0][2].uuid for _, e in flagged)
    assert 500 <= flagged[0][0] <= 510  # seconds after it starts: half-way over and rising fast
    assert cluster.gpus[0][2].temp < cluster.gpus[0][2].spec.slowdown_temp_c  # it settled below the throttle point
    assert not any(e.kind.startswith("THERMAL_THROTTLE") for _, e in events)


def test_a_warmer_room_heats_every_gpu_and_flags_none():
    peers = NodePeers(["H100"] * 4, [700.0] * 4)
    found = []
    for s in range(900):
        room = 0.0 if s < 600 else min(6.0, (s - 600) * 0.1)  # +6 °C on every GPU within a minute
        rs = {g: reading(float(s), power=300.0 + 50 * g, temp=30 + 31.5 * (300 + 50 * g) / 700 + room)
              for g in range(4)}
        found += peers.learn(rs)
    assert found == []


def _sbe(ts: float, count: int):
    r = reading(ts)
    r.ecc_sbe_volatile = count
    return r


def test_a_slow_sbe_storm_is_flagged_within_seconds_and_stray_errors_are_not():
    ecc = EccRate()
    count, fired = 0, None
    for s in range(120):
        count += 3 if s >= 60 else 0
        if ecc.learn_one(_sbe(float(s), count)) and fired is None:
            fired = s
    assert fired is not None and fired - 60 <= 3
    stray = EccRate()
    assert not any(stray.learn_one(_sbe(float(s), s // 600)) for s in range(3600))


def test_telemetry_collapse_fires_on_absent_fields_and_slow_reads_not_on_one_glitch():
    tc = TelemetryCollapse()
    for s in range(30):
        assert tc.learn_one(reading(float(s), read_s=0.002)) is None
    glitch = reading(30.0, read_s=0.002)
    glitch.power_w = None
    assert tc.learn_one(glitch) is None
    assert tc.learn_one(reading(31.0, read_s=0.002)) is None
    fired = []
    for s in range(32, 40):
        r = reading(float(s), read_s=0.3)
        if s % 2:
            r.temp_c = None
        fired.append(tc.learn_one(r))
    hits = [f for f in fired if f is not None]
    assert len(hits) == 1 and hits[0].detector == "telemetry_collapse" and "read took 300 ms" in hits[0].message


def test_collapse_precedes_the_loss_and_the_verdict_asks_for_a_drain_first():
    cluster, clock = sim_cluster("collapse")
    events = _run(cluster, clock, 600)
    gpu3 = cluster.gpus[0][3].uuid
    collapse = [s for s, e in events if e.gpu_uuid == gpu3 and e.attributes.get("detector") == "telemetry_collapse"]
    lost = [s for s, e in events if e.gpu_uuid == gpu3 and e.attributes.get("action") == "REBOOT_NODE"]
    drain = [s for s, e in events if e.gpu_uuid == gpu3 and e.attributes.get("action") == "DRAIN"]
    assert collapse and 500 <= collapse[0] <= 508
    assert drain and drain[0] < 560 <= lost[0]


def _flagged(readings_at, seconds: int = 300, full_at=None) -> list[tuple[int, str]]:
    peers = NodePeers(["H100"] * 4, [700.0] * 4)
    out = []
    for s in range(seconds):
        rs = readings_at(float(s))
        full = full_at(float(s)) if full_at else None
        out += [(s, g, f.detector) for g, f in peers.learn(rs, full)]
    return out


def test_a_gpu_losing_clocks_under_load_with_no_throttle_reason_is_flagged_and_its_peers_are_not():
    def full(ts):
        return {g: reading(ts, util=90.0, power=500.0, sm_clock_mhz=1500 if g == 3 and ts >= 250 else 1980, full=True)
                for g in range(4)}

    found = _flagged(lambda ts: {g: reading(ts, util=90.0, power=500.0) for g in range(4)}, full_at=full)
    assert {(g, d) for _, g, d in found} == {(3, "clock_peer")} and found[0][0] >= 250


def test_the_clock_of_the_watch_read_is_judged_without_waiting_for_a_full_sample():
    def reads(ts):
        return {g: reading(ts, util=90.0, power=500.0, sm_clock_mhz=1500 if g == 3 and ts >= 250 else 1980)
                for g in range(4)}

    stale = {g: reading(0.0, util=90.0, power=500.0, sm_clock_mhz=1980, full=True) for g in range(4)}
    found = _flagged(reads, full_at=lambda ts: stale)  # full samples from before the fault
    assert [(s, g, d) for s, g, d in found] == [(254, 3, "clock_peer")]


def test_power_off_its_peers_at_the_same_utilisation_is_flagged_a_gpu_at_another_utilisation_is_not():
    def reads(ts):
        rs = {g: reading(ts, util=80.0, power=500.0) for g in range(3)}
        rs[3] = reading(ts, util=80.0, power=700.0 if ts >= 250 else 500.0)
        return {**rs, 2: reading(ts, util=20.0, power=150.0)}  # idler: another operating point, no peers there

    found = _flagged(reads)
    assert {(g, d) for _, g, d in found} == {(3, "power_peer")}


def test_a_peer_itself_drawing_less_does_not_hide_a_gpu_drawing_far_less_and_a_hung_peer_flags_no_healthy_one():
    def reads(ts):
        rs = {g: reading(ts, util=95.0, power=670.0) for g in range(3)}
        rs[1] = reading(ts, util=95.0, power=550.0)  # a slow board: a fifth less, not an outlier itself
        rs[3] = reading(ts, util=95.0, power=370.0 if ts >= 250 else 670.0)  # 45% less than its healthy peers
        return rs

    found = _flagged(reads)
    assert {(g, d) for _, g, d in found} == {(3, "power_peer")} and found[0][0] >= 250

    def hung(ts):  # two healthy GPUs and a hung kernel at 100% busy drawing idle power
        return {0: reading(ts, util=100.0, power=670.0), 1: reading(ts, util=100.0, power=672.0),
                2: reading(ts, util=100.0, power=90.0)}

    assert {g for _, g, _ in _flagged(hung)} <= {2}


def test_a_slow_sbe_trickle_below_the_rate_rule_is_flagged_against_peers_that_see_none():
    def reads(ts):
        rs = {g: reading(ts) for g in range(4)}
        rs[1] = replace(reading(ts), ecc_sbe_volatile=int(max(0.0, ts - 220) / 12))  # 5 errors a minute, 1 per 12 s
        return rs

    found = _flagged(reads)
    assert {(g, d) for _, g, d in found} == {(1, "ecc_peer")}
    rate_rule = EccRate()
    assert all(rate_rule.learn_one(reads(float(s))[1]) is None for s in range(300))  # the absolute rule misses it


def test_a_healthy_node_at_different_loads_flags_nothing():
    found = _flagged(lambda ts: {g: reading(ts, util=20.0 * g, power=100.0 + 100.0 * g) for g in range(4)},
                     full_at=lambda ts: {g: reading(ts, util=20.0 * g, sm_clock_mhz=1980, full=True) for g in range(4)})
    assert found == []
