"""Throttler: a hot GPU gets a power cap on the control topic, lifted once it cools; a failed send is resent."""

from __future__ import annotations

import time

from gpuaware.contract.events import AgentControl, ControlKind, DecisionAction, GpuState, HealthBand, NodeGpu, NodeState
from gpuaware.local.fake_apiserver import make_node
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.decisions import DecisionSink
from gpuaware.scheduler.kube.live_state import LiveGpuState
from gpuaware.scheduler.kube.throttler import Throttler
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings


def state(g: int, temp: float) -> GpuState:
    ts = int(time.time() * 1000)
    return GpuState(f"GPU-hot-{g}", "n0", "H100", ts, ts, 90.0, 50.0, 1000.0, 81920, 600.0, temp, 90.0,
                    HealthBand.HEALTHY)


class Agents:
    def __init__(self, fail: int = 0) -> None:
        self.sent: list[AgentControl] = []
        self.fail = fail

    async def __call__(self, record: AgentControl) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("broker away")
        self.sent.append(record)


def setup(tasks, publish=None):
    cache = ClusterCache(scheduler_name="gpuaware")
    cache.sync_nodes([make_node("n0", gpus=2)])
    view = StateView()
    view.learn(NodeState("n0", int(time.time() * 1000), None, None,
                         [NodeGpu(f"GPU-hot-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY) for g in range(2)], 2000, 0))
    view.learn(state(0, 91.0))
    view.learn(state(1, 60.0))
    gpu_state = LiveGpuState(view, cache)
    gpu_state.apply(time.time())
    sink, stats = DecisionSink(), SchedulerStats()
    kw = {"publish": publish} if publish is not None else {}
    throttler = Throttler(view, gpu_state, cache.view(), SchedulerSettings(extender_port=0), stats, sink, tasks, **kw)
    return view, gpu_state, throttler, sink, stats


async def round_(throttler: Throttler, gpu_state: LiveGpuState, wait_for) -> None:
    gpu_state.apply(time.time() + 2)  # past the re-apply interval: the new temperatures are in the model
    throttler.throttle()
    await wait_for(lambda: len(throttler.tasks) == 0, what="caps sent")


async def test_hot_gpu_is_capped_once_and_lifted_when_it_cools(tasks, wait_for):
    agents = Agents()
    view, gpu_state, throttler, sink, stats = setup(tasks, agents)
    await round_(throttler, gpu_state, wait_for)
    (cap,) = agents.sent
    assert (cap.target, cap.gpu_uuid, cap.kind, cap.power_cap_w) == ("n0", "GPU-hot-0", ControlKind.POWER_CAP, 420)
    await round_(throttler, gpu_state, wait_for)
    assert len(agents.sent) == 1  # unchanged: not sent again
    view.learn(state(0, 70.0))
    await round_(throttler, gpu_state, wait_for)
    assert agents.sent[1].gpu_uuid == "GPU-hot-0" and agents.sent[1].power_cap_w == 0
    assert stats.decisions[("THROTTLE", "thermal")] == 1 and stats.decisions[("THROTTLE", "lifted")] == 1
    assert [o.action for o in sink.recent] == [DecisionAction.THROTTLE] * 2


async def test_a_cap_that_could_not_be_sent_is_sent_on_the_next_round(tasks, wait_for):
    agents = Agents(fail=1)
    _, gpu_state, throttler, _, _ = setup(tasks, agents)
    await round_(throttler, gpu_state, wait_for)
    assert agents.sent == [] and throttler.capped == {}
    await round_(throttler, gpu_state, wait_for)
    assert [r.power_cap_w for r in agents.sent] == [420]


async def test_without_a_publisher_caps_are_still_decided_and_logged(tasks, wait_for):
    _, gpu_state, throttler, sink, _ = setup(tasks)
    await round_(throttler, gpu_state, wait_for)
    assert throttler.capped == {("n0", 0): 420}
    (outcome,) = sink.recent
    assert outcome.reasons[0] == "power cap 420 W on GPU 0 of n0"


async def test_no_cap_is_sent_once_the_replica_may_no_longer_act(tasks, wait_for):
    agents = Agents()
    _, gpu_state, throttler, _, _ = setup(tasks, agents)
    throttler.may_act = lambda: False  # the Lease's renew deadline passed
    await round_(throttler, gpu_state, wait_for)
    assert agents.sent == [] and throttler.capped == {}  # forgotten, so a new leader's round decides afresh


async def test_caps_are_recorded_on_the_node_and_a_new_leader_lifts_its_predecessors(tasks, wait_for):
    """Issue 17 item 11: caps were kept only in the leader's memory, so after a failover they were never lifted."""
    from gpuaware.contract import annotations

    agents, recorded = Agents(), {}

    async def record(node: str, gpu: int, cap_w: int) -> None:
        caps = recorded.setdefault(node, {})
        caps.pop(gpu, None) if cap_w == 0 else caps.__setitem__(gpu, cap_w)

    _, gpu_state, old, _, _ = setup(tasks, agents)
    old._record = record
    await round_(old, gpu_state, wait_for)
    assert recorded == {"n0": {0: 420}}
    # The leader dies; the next one reads the Node with the annotation the first one wrote.
    view2, gpu_state2, new, _, _ = setup(tasks, agents)
    node = make_node("n0", gpus=2)
    node["metadata"].setdefault("annotations", {})[annotations.ANN_POWER_CAPS] = annotations.power_caps_value(
        recorded["n0"])
    gpu_state2.cache.sync_nodes([node])
    gpu_state2.apply(time.time())
    new._record = record
    view2.learn(state(0, 70.0))  # cool by now
    await round_(new, gpu_state2, wait_for)
    assert [(r.gpu_uuid, r.power_cap_w) for r in agents.sent] == [("GPU-hot-0", 420), ("GPU-hot-0", 0)]
    assert recorded == {"n0": {}}


def test_power_cap_commands_are_keyed_per_gpu_so_compaction_keeps_each():
    cap = AgentControl("c", 0, "n0", ControlKind.POWER_CAP, None, "GPU-1", 300)
    policy = AgentControl("p", 0, "n0", ControlKind.SAMPLING_POLICY, "floor_s: 1\n")
    assert cap.key() == b"n0/GPU-1" and policy.key() == b"n0"


def test_the_power_caps_annotation_reads_only_what_is_well_formed():
    from gpuaware.contract import annotations

    def node(raw):
        return {"metadata": {"annotations": {annotations.ANN_POWER_CAPS: raw}}}

    assert annotations.power_caps(node('{"0":300,"3":250}')) == {0: 300, 3: 250}
    for bad in ("not json", "[1]", '{"x":1}', '{"0":-5}', '{"0":true}', '{"0":"300"}'):
        assert annotations.power_caps(node(bad)) == {}
    assert annotations.power_caps_value({}) is None
