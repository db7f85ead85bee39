"""Graded verdicts: the XID taxonomy, repeat and burst rules, the score's bands, hysteresis, the node's verdict,
and the verdict travelling from the agent's event to gpu.state."""

from __future__ import annotations

import pytest

from gpuaware.agent.core import AgentCore
from gpuaware.agent.readings import XidEvent
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.agent.verdict import HOUR, IMPROVE_AFTER_S, NodeVerdicts
from gpuaware.contract.events import EventKind, HealthAction, HealthBand, HealthVerdict
from gpuaware.stream.processor import StreamProcessor
from tests.support import sim_cluster, telemetry_batch

V, A = HealthVerdict, HealthAction
OK = {"ecc": 100.0}


def judge(nv: NodeVerdicts, gpu: int, now: float, score: float = 100.0, band: HealthBand = HealthBand.HEALTHY,
          lost: bool = False):
    return nv.judge(gpu, now, score, band, OK, lost, True)


def test_app_xids_on_several_gpus_are_the_workloads_and_on_one_gpu_the_gpus():
    nv = NodeVerdicts(4)
    for g in (0, 1, 2):
        nv.learn_xid(g, 10.0 + g, 13)
    j = judge(nv, 0, 20.0)
    assert (j.verdict, j.action) == (V.INFO, A.NONE) and "the workload" in j.reasons[0]
    lone = NodeVerdicts(4)
    for t in (10.0, 3000.0, 9000.0):
        lone.learn_xid(3, t, 31)
    j = judge(lone, 3, 9001.0)
    assert (j.verdict, j.action) == (V.WARNING, A.DRAIN) and "3x in 24 h on this GPU only" in j.reasons[0]


@pytest.mark.parametrize("xid, verdict, action", [
    (48, V.CRITICAL, A.RESET_GPU), (63, V.WARNING, A.RESET_GPU), (64, V.CRITICAL, A.SERVICE_REQUEST),
    (74, V.CRITICAL, A.RESET_GPU), (79, V.CRITICAL, A.REBOOT_NODE), (94, V.WARNING, A.DRAIN),
    (95, V.CRITICAL, A.RESET_GPU), (119, V.CRITICAL, A.RESET_GPU), (120, V.CRITICAL, A.RESET_GPU),
    (9999, V.WARNING, A.WATCH),
])
def test_each_hardware_xid_has_its_documented_verdict_and_action(xid, verdict, action):
    nv = NodeVerdicts(2)
    nv.learn_xid(0, 5.0, xid)
    j = judge(nv, 0, 6.0)
    assert (j.verdict, j.action) == (verdict, action)
    assert judge(nv, 1, 6.0).verdict is V.PASS  # the other GPU is not touched


def test_repeats_escalate_a_burst_in_an_hour_and_five_in_a_day_to_a_service_request():
    nv = NodeVerdicts(1)
    for t in (0.0, 600.0, 1200.0):
        nv.learn_xid(0, t, 74)
    assert judge(nv, 0, 1201.0).action is A.REBOOT_NODE  # reset -> reboot after 3 in an hour
    for t in (5 * HOUR, 9 * HOUR):
        nv.learn_xid(0, t, 74)
    j = judge(nv, 0, 9 * HOUR + 1)
    assert (j.verdict, j.action) == (V.CRITICAL, A.SERVICE_REQUEST) and "5x in 24 h" in j.reasons[0]
    # A hardware XID is held for its window (a day for 74), then forgotten unless it repeats.
    once = NodeVerdicts(1)
    once.learn_xid(0, 0.0, 74)
    assert judge(once, 0, 23 * HOUR).verdict is V.CRITICAL
    judge(once, 0, 25 * HOUR)
    assert judge(once, 0, 25 * HOUR + IMPROVE_AFTER_S).verdict is V.PASS


def test_score_bands_map_to_verdicts_and_a_verdict_improves_only_after_it_held():
    nv = NodeVerdicts(1)
    assert judge(nv, 0, 0.0).verdict is V.PASS
    assert (judge(nv, 0, 1.0, 90.0).verdict, nv.gpus[0].current.action) == (V.INFO, A.WATCH)
    assert judge(nv, 0, 2.0, 60.0, HealthBand.DEGRADED).verdict is V.WARNING
    assert (judge(nv, 0, 3.0, 30.0, HealthBand.CRITICAL).action) is A.DRAIN
    assert judge(nv, 0, 4.0).verdict is V.CRITICAL  # better, but not for long enough
    assert judge(nv, 0, 4.0 + IMPROVE_AFTER_S).verdict is V.PASS
    assert (judge(nv, 0, 50.0, lost=True).action) is A.REBOOT_NODE


def test_the_node_is_its_worst_gpu_and_half_its_gpus_needing_a_reset_reboots_it():
    nv = NodeVerdicts(4)
    for g in range(4):
        judge(nv, g, 0.0)
    assert nv.node().verdict is V.PASS and nv.node().reasons == ["all GPUs pass"]
    nv.learn_xid(1, 1.0, 95)
    judge(nv, 1, 1.0)
    node = nv.node()
    assert (node.verdict, node.action) == (V.CRITICAL, A.RESET_GPU) and node.reasons[0].startswith("gpu 1:")
    nv.learn_xid(2, 2.0, 119)
    judge(nv, 2, 2.0)
    assert nv.node().action is A.REBOOT_NODE


def test_the_agent_event_carries_the_verdict_and_the_stream_publishes_it():
    cluster, clock = sim_cluster(nodes=1, gpus_per_node=2)
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    healthy = []
    for s in range(5):
        clock[0] = float(s)
        healthy += core.tick(float(s)).events
    assert healthy == []  # a healthy GPU's first verdict (PASS) is no event
    cluster.gpus[0][1].pending_xids.append(XidEvent(1, 5.0, 95))
    clock[0] = 5.0
    evs = [e for e in core.tick(5.0).events if e.kind is EventKind.HEALTH_CHANGE]
    assert evs and evs[-1].attributes["verdict"] == "CRITICAL" and evs[-1].attributes["action"] == "RESET_GPU"
    assert "uncontained ECC" in evs[-1].attributes["reasons"]
    proc = StreamProcessor({})
    uuid = core.devices[1].uuid
    batch = telemetry_batch(core.node, 1, 1_700_000_000_000)  # the GPU's own node: the stream refuses others
    batch.gpus[0].uuid = uuid
    proc.on_telemetry(batch, 0, 1_700_000_000_000)
    (state,) = proc.on_event(evs[-1], 0, 1_700_000_000_050)
    assert (state.verdict, state.recommended_action) == (V.CRITICAL, A.RESET_GPU)
    assert any("uncontained ECC" in r for r in state.verdict_reasons)


def test_a_gpu_reset_ends_the_fault_and_the_agent_judges_the_gpu_afresh():
    """XID 119 holds CRITICAL / reset for 24 h; the reset the action asks for clears it (docs/health.md): the
    simulated reset ends what a reset clears, the agent learns it from the collector and reads PASS at once."""
    cluster, clock = sim_cluster(nodes=1, gpus_per_node=2)
    collector = cluster.node(0)
    core = AgentCore(collector, SamplingPolicy(), clock=lambda: clock[0])
    cluster.gpus[0][1].pending_xids.append(XidEvent(1, 1.0, 119))
    for s in range(1, 20):
        clock[0] = float(s)
        core.tick(float(s))
    assert (core.tracks[1].verdict.verdict, core.tracks[1].verdict.action) == (V.CRITICAL, A.RESET_GPU)
    collector.reset_gpu(1)
    clock[0] = 20.0
    evs = [e for e in core.tick(20.0).events if e.kind is EventKind.HEALTH_CHANGE]
    assert [e.attributes["verdict"] for e in evs] == ["PASS"]  # sent: the stream and scheduler see it
    assert collector.gpu_resets() == []  # told once
    for s in range(21, 21 + int(IMPROVE_AFTER_S) + 5):  # and it holds: the XID is not judged again
        clock[0] = float(s)
        core.tick(float(s))
        assert core.tracks[1].verdict.verdict is V.PASS



def test_a_forecast_its_detector_lowered_is_no_longer_held_at_its_worst_and_the_verdict_follows_after_the_hold():
    # A CRITICAL thermal forecast (heading for slowdown) the peers withdrew once the GPU settled below slowdown:
    # a sighting at a lower grade is held at the worst since it opened; a lowered one is not, and the verdict
    # improves once the better one has held IMPROVE_AFTER_S (no flapping).
    nv = NodeVerdicts(1)
    nv.learn_finding(0, 10.0, "thermal_peer", V.CRITICAL, A.DRAIN)
    assert judge(nv, 0, 10.0).verdict is V.CRITICAL
    nv.learn_finding(0, 20.0, "thermal_peer", V.WARNING, A.DRAIN)
    assert judge(nv, 0, 20.0).verdict is V.CRITICAL and judge(nv, 0, 60.0).verdict is V.CRITICAL
    nv.learn_finding(0, 100.0, "thermal_peer", V.WARNING, A.DRAIN, lowered=True)
    assert judge(nv, 0, 100.0).verdict is V.CRITICAL
    nv.learn_finding(0, 100.0 + IMPROVE_AFTER_S, "thermal_peer", V.WARNING, A.DRAIN)
    j = judge(nv, 0, 100.0 + IMPROVE_AFTER_S)
    assert (j.verdict, j.action) == (V.WARNING, A.DRAIN) and "thermal_peer" in j.reasons[0]
