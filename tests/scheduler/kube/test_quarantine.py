"""HealthReactions: a GPU turning critical is cordoned on its node and its pods are moved off, once per turn."""

from __future__ import annotations

import time

from gpuaware.contract import annotations
from gpuaware.contract.events import (
    DecisionAction,
    GpuState,
    HealthAction,
    HealthBand,
    HealthVerdict,
    NodeGpu,
    NodeState,
    SchedulerDecision,
)
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.decisions import DecisionSink
from gpuaware.scheduler.kube.evictor import Evictor
from gpuaware.scheduler.kube.live_state import LiveGpuState
from gpuaware.scheduler.kube.quarantine import HealthReactions
from gpuaware.scheduler.settings import SchedulerSettings

SETTINGS = SchedulerSettings(checkpoint_timeout_s=0.0, eviction_retry_s=0.05, eviction_timeout_s=1.0,
                             extender_port=0)


def gpu(g: int, band: HealthBand) -> GpuState:
    ts = int(time.time() * 1000)
    return GpuState(f"GPU-{g}", "n0", "H100", ts, ts, 50.0, 20.0, 1000.0, 81920, 300.0, 60.0, 90.0, band)


def setup(kube, listed, calls, stats, tasks, node_in_api: bool = True):
    node = make_node("n0", gpus=2)
    if node_in_api:
        kube.create("nodes", node)
    for g in range(2):
        p = make_pod(f"on{g}", gpus=1, annotations={annotations.ANN_GPUS: f'[{{"index":{g},"milli":1000}}]'})
        p["spec"]["nodeName"] = "n0"
        kube.create("pods", p)
    cache = listed()
    if not node_in_api:
        cache.sync_nodes([node])
    view = StateView()
    view.learn(NodeState("n0", int(time.time() * 1000), None, None,
                         [NodeGpu(f"GPU-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY) for g in range(2)], 2000, 0))
    for g in range(2):
        view.learn(gpu(g, HealthBand.HEALTHY))
    published: list[SchedulerDecision] = []

    async def publish(record: SchedulerDecision) -> None:
        published.append(record)

    state = LiveGpuState(view, cache)
    health = HealthReactions(view, calls, cache, stats, DecisionSink(publish), Evictor(calls, cache, SETTINGS, stats),
                             tasks)
    return view, state, health, published


def step(state: LiveGpuState, health: HealthReactions) -> None:
    """What the loop does before each pass."""
    if state.apply(time.time()):
        health.react(state.where)


def pod_names(kube) -> set[str]:
    return {p["metadata"]["name"] for p in kube.objects("pods")}


async def test_critical_gpu_is_cordoned_and_its_pod_moved_the_others_stay(kube, listed, calls, stats, tasks, wait_for):
    view, state, health, published = setup(kube, listed, calls, stats, tasks)
    step(state, health)
    assert len(tasks) == 0  # all healthy: nothing to do
    view.learn(gpu(1, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: "on1" not in pod_names(kube), what="pod on the critical GPU evicted")
    (node,) = kube.objects("nodes")
    assert annotations.cordoned_gpus(node) == {1}
    assert "on0" in pod_names(kube)
    await wait_for(lambda: len(tasks) == 0, what="reaction done")
    assert [r.action for r in published] == [DecisionAction.CORDON, DecisionAction.MIGRATE]
    assert stats.decisions[("CORDON", "gpu-critical")] == 1 and stats.decisions[("MIGRATE", "gpu-critical")] == 1
    await wait_for(lambda: [e["involvedObject"]["name"] for e in kube.objects("events")
                            if e["reason"] == "Migrated"] == ["on1"], what="the Migrated Event")


async def test_acts_once_while_critical_and_again_after_a_repair(kube, listed, calls, stats, tasks, wait_for):
    view, state, health, _published = setup(kube, listed, calls, stats, tasks)
    health.validate_s = 0.05  # the repair: the GPU reads PASS for this long, then it is back in service
    view.learn(gpu(0, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: len(tasks) == 0, what="first reaction")
    view.learn(gpu(0, HealthBand.CRITICAL))  # still critical: no second cordon
    step(state, health)
    await wait_for(lambda: len(tasks) == 0, what="chain advanced")
    assert stats.decisions[("CORDON", "gpu-critical")] == 1

    def passing() -> bool:
        healthy = gpu(0, HealthBand.HEALTHY)
        healthy.verdict, healthy.recommended_action = HealthVerdict.PASS, HealthAction.NONE
        view.learn(healthy)
        step(state, health)
        return ("n0", 0) not in health.chains and len(tasks) == 0

    await wait_for(passing, what="validated and back in service")
    view.learn(gpu(0, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: len(tasks) == 0, what="second reaction")
    assert stats.decisions[("CORDON", "gpu-critical")] == 2


async def test_an_operator_lifting_the_cordon_mid_chain_ends_it_and_a_new_critical_acts_again(
        kube, listed, calls, stats, tasks, wait_for):
    """Found in tests/system/test_scheduler.py: the operator released the cordon while the chain waited for
    validation, a pod landed on the GPU, and the GPU turning critical again left that pod on it."""
    view, state, health, _published = setup(kube, listed, calls, stats, tasks)
    view.learn(gpu(0, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: len(tasks) == 0, what="first reaction")
    health.cache.sync_nodes(kube.objects("nodes"))  # the Node watch shows the cordon
    step(state, health)
    assert ("n0", 0) in health.chains
    node = {n["metadata"]["name"]: n for n in kube.objects("nodes")}["n0"]
    node["metadata"]["annotations"].pop(annotations.ANN_CORDONED)  # the operator's uncordon, as the watch shows it
    health.cache.sync_nodes([node])
    view.learn(gpu(0, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: len(tasks) == 0, what="second reaction")
    assert stats.decisions[("RESUME", "operator")] == 1
    assert stats.decisions[("CORDON", "gpu-critical")] == 2 and ("n0", 0) in health.chains


async def test_a_refused_cordon_is_tried_again_on_the_next_update(kube, listed, calls, stats, tasks, wait_for):
    view, state, health, _published = setup(kube, listed, calls, stats, tasks, node_in_api=False)
    view.learn(gpu(0, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: len(tasks) == 0, what="reaction")
    assert stats.api_errors[("patch-node", 404)] == 1 and ("CORDON", "gpu-critical") not in stats.decisions
    kube.create("nodes", make_node("n0", gpus=2))
    view.learn(gpu(0, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: stats.decisions[("CORDON", "gpu-critical")] == 1, what="cordon on retry")


def verdict_gpu(g: int, action: HealthAction) -> GpuState:
    state = gpu(g, HealthBand.DEGRADED)
    state.verdict, state.recommended_action = HealthVerdict.WARNING, action
    return state


async def test_a_verdict_asking_for_a_drain_cordons_an_info_one_does_not(kube, listed, calls, stats, tasks, wait_for):
    view, state, health, _published = setup(kube, listed, calls, stats, tasks)
    step(state, health)
    view.learn(verdict_gpu(0, HealthAction.WATCH))
    step(state, health)
    assert len(tasks) == 0
    view.learn(verdict_gpu(0, HealthAction.DRAIN))
    step(state, health)
    await wait_for(lambda: "on0" not in pod_names(kube), what="pod on the GPU to drain evicted")
    (node,) = kube.objects("nodes")
    assert annotations.cordoned_gpus(node) == {0}


async def test_the_circuit_breaker_holds_and_dry_run_makes_no_api_call(kube, listed, calls, stats, tasks, wait_for):
    view, state, health, published = setup(kube, listed, calls, stats, tasks)
    step(state, health)
    health.breaker.quarantined.append((time.time(), "another-node"))  # the cluster's quota is spent
    view.learn(gpu(1, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: len(tasks) == 0, what="decision recorded")
    (node,) = kube.objects("nodes")
    assert annotations.cordoned_gpus(node) == set() and "on1" in pod_names(kube)
    assert [r.action for r in published] == [DecisionAction.DEFER] and "breaker held" in published[0].reasons[0]
    assert stats.decisions[("DEFER", "breaker-held")] == 1 and health.breaker.held == 1
    health.breaker.quarantined.clear()
    health.dry_run = True
    view.learn(gpu(1, HealthBand.CRITICAL))
    step(state, health)  # the held GPU is tried again: now allowed, but in dry run
    await wait_for(lambda: len(tasks) == 0, what="dry-run decision recorded")
    (node,) = kube.objects("nodes")
    assert annotations.cordoned_gpus(node) == set() and "on1" in pod_names(kube)
    assert published[-1].action == DecisionAction.CORDON and published[-1].reasons[0].startswith("dry run")
