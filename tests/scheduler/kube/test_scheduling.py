"""SchedulingPass and PassActions: what a pass decides becomes bind and eviction tasks; what it cannot place is
reported; gangs go all or nothing."""

from __future__ import annotations

from gpuaware.local.fake_apiserver import make_node, make_pod
from scheduler.core.framework import Decision
from scheduler.core.preemption import Running
from scheduler.core.workload import Workload
from scheduler.kube.cache import ClusterCache
from scheduler.kube.decisions import DecisionSink
from scheduler.kube.departures import Departures
from scheduler.kube.evictor import Evictor
from scheduler.kube.scheduling import MIX_REBUILD_EVERY, SchedulingPass
from scheduler.kube.unschedulable import UnschedulableReporter
from scheduler.metrics import SchedulerStats
from scheduler.settings import SchedulerSettings


class Binds:
    """Plays ``Binder``: records the binds a pass starts."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str, list[str]]] = []

    async def bind(self, w: Workload, d: Decision, victims: list[str], uid: str | None = None) -> None:
        assert d.allocation is not None
        self.started.append((w.id, f"n{d.allocation.node}", victims))


class Evictions(Evictor):
    """The real claim bookkeeping, without the API."""

    def __init__(self) -> None:
        super().__init__(None, None, SchedulerSettings(extender_port=0), SchedulerStats())  # type: ignore[arg-type]
        self.evicted: list[tuple[str, str]] = []

    async def evict(self, pod, r: Running, reason: str, event_reason: str) -> None:
        self.evicted.append((r.workload.id, event_reason))


class Events:
    def __init__(self) -> None:
        self.written: list[tuple[str, str]] = []

    def event(self, pod, reason: str, message: str, type_: str = "Normal") -> bool:
        self.written.append((pod["metadata"]["name"], message))
        return True


def setup(tasks, nodes: list[dict], pods: list[dict], settings: SchedulerSettings | None = None):
    cache = ClusterCache(scheduler_name="gpuaware")
    cache.sync_nodes(nodes)
    cache.sync_pods(pods)
    stats, sink, events, binds, evictions = SchedulerStats(), DecisionSink(), Events(), Binds(), Evictions()
    departures = Departures()
    reporter = UnschedulableReporter(events, cache, stats, sink, tasks)  # type: ignore[arg-type]
    passes = SchedulingPass(settings or SchedulerSettings(extender_port=0), cache, stats, sink, binds,  # type: ignore
                            evictions, departures, reporter, tasks)
    for p in pods:
        passes.learn(cache.workload(p))
    return passes, cache, binds, evictions, events, departures, stats


async def settle(tasks, wait_for) -> None:
    await wait_for(lambda: len(tasks) == 0, what="spawned tasks")


async def test_pods_that_fit_are_reserved_and_bound_the_rest_reported(tasks, wait_for):
    pods = [make_pod("a", gpus=1), make_pod("b", gpus=1), make_pod("huge", gpus=8)]
    passes, cache, binds, _, events, _, stats = setup(tasks, [make_node("n0", gpus=2)], pods)
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert sorted(binds.started) == [("default/a", "n0", []), ("default/b", "n0", [])]
    assert set(cache.reservations) == {"default/a", "default/b"} and set(cache.pending) == {"default/huge"}
    ((name, reason),) = events.written
    assert name == "huge" and reason
    assert stats.pass_latency.count == 1 and len(stats.decision_latencies) >= 2


async def test_pods_past_the_pass_budget_are_not_reported_and_identical_requests_get_the_tried_ones_reason(
        tasks, wait_for):
    """A burst past the budget used to get a "not tried" FailedScheduling Event per pod on every pass; a pod is
    reported once it is tried, or when a pod with an identical request was tried and did not fit."""
    pods = [make_pod("huge-1", gpus=8), make_pod("huge-2", gpus=8), make_pod("a", gpus=1),
            make_pod("b", gpus=1, cpu="2")]
    for i, p in enumerate(pods):
        p["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:0{i}Z"
    passes, _, binds, _, events, _, _ = setup(tasks, [make_node("n0", gpus=2)], pods,
                                              SchedulerSettings(extender_port=0, pass_budget=2))
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert [b[0] for b in binds.started] == ["default/a"]
    written = dict(events.written)
    assert set(written) == {"huge-1", "huge-2"}, written  # b was not tried: the budget ran out at a
    assert written["huge-2"] == f"an identical request did not fit: {written['huge-1']}"


async def test_a_gang_waits_for_all_its_members_then_lands_together(tasks, wait_for):
    gang = {"gpuaware.io/gang": "g", "gpuaware.io/gang-size": "2"}
    passes, cache, binds, _, events, _, _ = setup(tasks, [make_node("n0", gpus=2)],
                                                  [make_pod("g0", gpus=1, annotations=gang)])
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert binds.started == []
    assert events.written == [("g0", "gang default/g: 1 of 2 members exist; waiting for all before placing any")]
    cache.pod_event("ADDED", make_pod("g1", gpus=1, annotations=gang))
    passes.run(1001.0)
    await settle(tasks, wait_for)
    assert sorted(k for k, _, _ in binds.started) == ["default/g0", "default/g1"]


async def test_preemption_evicts_the_victim_and_the_preemptor_binds_after_it(tasks, wait_for):
    low = make_pod("low", gpus=1)
    low["spec"]["nodeName"] = "n0"
    passes, _, binds, evictions, _, departures, stats = setup(
        tasks, [make_node("n0", gpus=1)], [low, make_pod("high", gpus=1, priority=200_000)])
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert evictions.evicted == [("default/low", "Preempted")]
    assert binds.started == [("default/high", "n0", ["default/low"])]
    assert evictions.evicting("default/low")  # until its eviction task says otherwise
    assert not departures.expect("default/low").is_set()  # the bind waits on this
    assert stats.decisions[("PREEMPT", "priority")] == 1


def test_the_core_is_rebuilt_when_nodes_change_or_the_mix_has_grown(tasks):
    passes, cache, *_ = setup(tasks, [make_node("n0", gpus=1)], [])
    core = passes.core()
    assert passes.core() is core
    passes.nodes_changed()
    rebuilt = passes.core()
    assert rebuilt is not core
    for i in range(MIX_REBUILD_EVERY):
        passes.learn(cache.workload(make_pod(f"p{i}")))
    assert passes.core() is not rebuilt


async def test_a_gang_with_claims_gets_devices_for_all_its_members_or_for_none(tasks, wait_for):
    """A member whose claims' devices cannot be picked where the core placed it holds back the whole gang:
    no member starts, the others' devices are no longer in flight and their GPUs are free again."""
    from contract import dra
    gang = {"gpuaware.io/gang": "g", "gpuaware.io/gang-size": "2"}
    pods = [make_pod(f"m{i}", gpus=0, annotations=gang) for i in range(2)]
    for i, p in enumerate(pods):
        p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"c{i}"}]
    passes, cache, binds, _, events, _, _ = setup(tasks, [make_node("n0", gpus=0)], [])
    cache.sync_classes([{"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]}}])
    cache.sync_slices([dra.resource_slice("n0", [dra.gpu_device(g, uuid=f"GPU-{g}", product_name="NVIDIA H100",
                                                                memory_bytes=80 * 2**30) for g in range(2)])])
    cache.sync_claims([{"metadata": {"name": f"c{i}", "namespace": "default", "resourceVersion": "1"},
                        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}}}
                       for i in range(2)])
    cache.sync_pods(pods)
    real = cache.pick_devices
    cache.pick_devices = lambda key, alloc: "no device" if key.endswith("m1") and cache.release(key) is None \
        else real(key, alloc)
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert binds.started == [] and not cache.dra_picks and not cache.dra.in_flight
    assert set(cache.pending) == {"default/m0", "default/m1"} and not cache.cluster.allocations
    assert all("gang default/g: no device; none of its members placed" in m for _, m in events.written)
