"""SchedulingPass and PassActions: what a pass decides becomes bind and eviction tasks; what it cannot place is
reported; gangs go all or nothing."""

from __future__ import annotations

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.core.framework import Decision
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.decisions import DecisionSink
from gpuaware.scheduler.kube.departures import Departures
from gpuaware.scheduler.kube.evictor import Evictor
from gpuaware.scheduler.kube.scheduling import MIX_REBUILD_EVERY, SchedulingPass
from gpuaware.scheduler.kube.unschedulable import UnschedulableReporter
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings


class Binds:
    """Plays ``Binder``: records the binds a pass starts, and the claims it is asked to deallocate."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str, list[str]]] = []
        self.claims = self
        self.deallocated: list[tuple[list[str], str]] = []

    async def deallocate(self, claims: list[dict], uid: str) -> None:
        self.deallocated.append(([c["metadata"]["name"] for c in claims], uid))

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
    reporter = UnschedulableReporter(events, cache.view(), stats, sink, tasks)  # type: ignore[arg-type]
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
    assert set(cache.assumed) == {"default/a", "default/b"} and set(cache.pending) == {"default/huge"}
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
    from gpuaware.contract import dra
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
    real = cache.dra.pick_devices
    cache.dra.pick_devices = lambda key, alloc, cluster: "no device" if key.endswith("m1") and \
        cache.release(key) is None else real(key, alloc, cluster)
    ledgers = []
    build = passes.ledger
    passes.ledger = lambda: ledgers.append(build()) or ledgers[-1]  # type: ignore[method-assign]
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert binds.started == [] and not cache.dra.picks and not cache.dra.state.in_flight
    assert not any(ledgers[0].gpu_used.values())  # nothing charged to the tenant for a gang that did not go
    assert set(cache.pending) == {"default/m0", "default/m1"} and not cache.cluster.allocations
    assert all("gang default/g: no device; none of its members placed" in m for _, m in events.written)


def claimed_setup(tasks, names: list[str], claim_of: dict[str, str], node_cpu: str = "64", priority: int = 0,
                  others: tuple[dict, ...] = ()):
    """Pods with one claim each (``claim_of``: pod -> claim) on node n0 with two H100s published as slices
    (and ``others``, pods without claims)."""
    from gpuaware.contract import dra
    node = make_node("n0", gpus=0)
    node["status"]["allocatable"]["cpu"] = node["status"]["capacity"]["cpu"] = node_cpu
    passes, cache, binds, _, events, _, _ = setup(tasks, [node], [])
    cache.sync_classes([{"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]}}])
    cache.sync_slices([dra.resource_slice("n0", [dra.gpu_device(g, uuid=f"GPU-{g}", product_name="NVIDIA H100",
                                                                memory_bytes=80 * 2**30) for g in range(2)])])
    cache.sync_claims([{"metadata": {"name": c, "namespace": "default", "resourceVersion": "1"},
                        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}}}
                       for c in sorted(set(claim_of.values()))])
    pods = [claimed_pod(name, claim_of[name], i, priority) for i, name in enumerate(names)]
    cache.sync_pods([*pods, *others])
    return passes, cache, binds, events, pods


def allocated_on_n0(claim: dict, device: str, user: str = "a") -> dict:
    """``claim`` as the API shows it once allocated on n0 (``device``) and reserved for pod ``user``."""
    return dict(claim, status={
        "allocation": {"devices": {"results": [{"request": "g", "driver": "gpu.nvidia.com", "pool": "n0",
                                                "device": device}]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": ["n0"]}]}]}},
        "reservedFor": [{"resource": "pods", "name": user, "uid": f"uid-{user}"}]})


def claimed_pod(name: str, claim: str, i: int = 0, priority: int = 0) -> dict:
    p = make_pod(name, gpus=0, priority=priority)
    p["metadata"]["uid"] = f"uid-{name}"
    p["metadata"]["creationTimestamp"] = f"2026-11-28T10:00:0{i}Z"
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return p


async def test_pods_sharing_a_new_claim_are_not_each_given_devices_for_it_in_one_pass(tasks, wait_for):
    """Both queued with the claim unallocated: the first places it, the second waits for that allocation (and
    then joins it) instead of picking a second device for the same claim, which one write would lose; and
    nothing is preempted for the one that waits (here: the pod on n0's other GPU)."""
    low = make_pod("low", gpus=1)
    low["spec"]["nodeName"] = "n0"
    passes, cache, binds, events, _ = claimed_setup(tasks, ["a", "b"], {"a": "team", "b": "team"},
                                                    priority=200_000, others=(low,))
    passes.run(1000.0)
    await settle(tasks, wait_for)
    cache.pod_event("ADDED", claimed_pod("c", "team", 3, priority=200_000))  # another, while a's write is in flight
    passes.run(1001.0)
    await settle(tasks, wait_for)
    assert passes.evictor.evicted == []
    assert [k for k, _, _ in binds.started] == ["default/a"]
    assert "default/b" in cache.pending and cache.dra.claim_owner == {"default/team": "default/a"}
    assert len(cache.dra.picks["default/a"]) == 1
    assert ("b", "its claim default/team is being allocated for default/a; it goes where that puts it") in \
        events.written
    assert cache.cluster.gpu_free[0].tolist() == [0, 0]  # low's, and one device for the claim, not two


async def test_a_pod_whose_claims_are_allocated_waits_for_their_node_and_is_never_placed_elsewhere(tasks, wait_for):
    from gpuaware.local.fake_apiserver import make_node as node_of
    passes, cache, binds, events, pods = claimed_setup(tasks, ["a", "b"], {"a": "team", "b": "team"}, node_cpu="1")
    cache.sync_nodes([*cache.nodes.values(), node_of("n1", gpus=0)])  # room elsewhere, none on n0 for two pods
    team = allocated_on_n0(cache.dra.state.claims["default/team"], "gpu-1")
    cache.claim_event("MODIFIED", team)
    bound = dict(pods[0], spec={**pods[0]["spec"], "nodeName": "n0"})
    cache.pod_event("MODIFIED", bound)  # a runs there with the claim's GPU, and takes n0's one CPU
    assert cache.dra.joins == {"default/b": "n0"}
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert binds.started == [] and "default/b" in cache.pending
    assert ("b", "its claims are allocated on n0, which has 0m CPU and 1047552 MiB free "
                 "(1000m and 1024 MiB asked)") in events.written


async def test_a_pod_resuming_its_claims_waits_for_their_node_and_is_never_placed_elsewhere(tasks, wait_for):
    """Its claims say n0 (written before a restart cut its Binding short); n0 is gone for now. Placed on n1,
    its Binding would go out with no claim written for n1."""
    from gpuaware.local.fake_apiserver import make_node as node_of
    passes, cache, binds, events, _ = claimed_setup(tasks, ["a"], {"a": "mine"})
    mine = allocated_on_n0(cache.dra.state.claims["default/mine"], "gpu-0")
    cache.claim_event("MODIFIED", mine)
    assert "default/a" in cache.dra.resumes
    cache.sync_nodes([node_of("n1", gpus=2)])  # n0 gone (its slices not yet), plain GPUs on n1
    passes.run(1000.0)
    passes.run(1000.5)  # its deallocation still in flight: not asked twice
    await settle(tasks, wait_for)
    passes.run(1001.0)
    await settle(tasks, wait_for)
    assert binds.started == [] and "default/a" in cache.pending and "default/a" in cache.dra.resumes
    assert ("a", "its claims are allocated on a node that is gone; deallocating them, so that it can go "
                 "elsewhere") in events.written
    # kube-scheduler's PostFilter: the claim, reserved for this pod alone, is deallocated (asked again on the
    # second pass: this cache never saw the first one's write land).
    assert binds.deallocated == [(["mine"], "uid-a")] * 2


async def test_a_withdrawn_placement_whose_claim_stays_allocated_leaves_its_device_taken(tasks, wait_for):
    """The claim's allocation was written, the Binding failed and so did the release write: the API says the
    device is taken, so the model must too (as the claim's hold), and the claim is no longer the pod's."""
    passes, cache, _, _, _ = claimed_setup(tasks, ["a"], {"a": "mine"})
    passes.run(1000.0)
    await settle(tasks, wait_for)
    (_, device), = cache.dra.picks["default/a"]
    written = allocated_on_n0(cache.dra.state.claims["default/mine"], device.name)
    cache.claim_event("MODIFIED", written)
    slot = cache.dra.state.inventory.nodes["n0"].slot_of[device.ref]
    assert cache.cluster.gpu_free[0, slot] == 0 and "claim:default/mine" not in cache.cluster.allocations
    cache.forget("default/a")
    assert cache.cluster.gpu_free[0, slot] == 0 and "claim:default/mine" in cache.cluster.allocations
    assert "default/a" not in cache.cluster.allocations and cache.dra.claim_owner == {}
    cache.claim_event("MODIFIED", dict(written, status={}))  # released after all
    assert cache.cluster.gpu_free[0].tolist() == [1000, 1000]


async def test_a_withdrawn_placement_of_a_pod_the_watch_shows_bound_keeps_what_it_holds(tasks, wait_for):
    """The Binding's answer was lost (the binder withdraws), but the watch already shows the pod on its node:
    its GPU stays charged, to it."""
    passes, cache, _, _, pods = claimed_setup(tasks, ["a"], {"a": "mine"})
    passes.run(1000.0)
    await settle(tasks, wait_for)
    slots = cache.running["default/a"].allocation.gpus
    cache.pod_event("MODIFIED", dict(pods[0], spec={**pods[0]["spec"], "nodeName": "n0"}))
    cache.forget("default/a")
    assert "default/a" in cache.running and cache.cluster.gpu_free[0, slots[0]] == 0
    assert cache.dra.claim_owner == {"default/mine": "default/a"}


async def test_a_pod_recreated_under_the_name_of_one_resuming_its_claims_is_read_afresh(tasks, wait_for):
    from gpuaware.local.fake_apiserver import make_node as node_of
    passes, cache, binds, _, pods = claimed_setup(tasks, ["a"], {"a": "mine"})
    mine = allocated_on_n0(cache.dra.state.claims["default/mine"], "gpu-0")
    cache.claim_event("MODIFIED", mine)
    cache.sync_nodes([node_of("n1", gpus=2)])  # n0 gone: a waits for it
    passes.run(1000.0)
    await settle(tasks, wait_for)
    cache.pod_event("DELETED", pods[0])
    again = make_pod("a", gpus=1)  # a new pod of the name, plain GPUs: nothing of the old one's claims
    again["metadata"]["uid"] = "uid-a2"
    cache.pod_event("ADDED", again)
    assert "default/a" not in cache.dra.resumes
    passes.run(1001.0)
    await settle(tasks, wait_for)
    assert [k for k, _, _ in binds.started] == ["default/a"]


async def test_gang_members_naming_one_new_claim_are_not_placed_and_say_why(tasks, wait_for):
    gang = {"gpuaware.io/gang": "g", "gpuaware.io/gang-size": "2"}
    passes, cache, binds, events, _ = claimed_setup(tasks, [], {})
    cache.sync_claims([{"metadata": {"name": "team", "namespace": "default", "resourceVersion": "1"},
                        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}}}])
    members = [claimed_pod(f"m{i}", "team", i) for i in range(2)]
    for m in members:
        m["metadata"]["annotations"].update(gang)
    cache.sync_pods(members)
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert binds.started == [] and not cache.dra.picks and not cache.dra.claim_owner
    assert sorted(cache.cluster.gpu_free[0].tolist()) == [1000, 1000]
    assert ("m1", "gang default/g: claim default/team of default/m1 is also default/m0's and not allocated yet; "
                  "a gang's claims are allocated per member (allocate it first, or give each its own)") \
        in events.written


async def test_a_rebuild_keeps_the_claim_with_the_placement_in_flight_that_allocated_it(tasks, wait_for):
    """a's claim write landed, b joined it and is bound, a's Binding is still in flight; the model is then rebuilt
    (a node changed). The claim's device stays a's (its reservation), b is charged nothing for it."""
    passes, cache, binds, _, pods = claimed_setup(tasks, ["a", "b"], {"a": "team", "b": "team"})
    passes.run(1000.0)
    await settle(tasks, wait_for)
    (_, device), = cache.dra.picks["default/a"]
    cache.claim_event("MODIFIED", allocated_on_n0(cache.dra.state.claims["default/team"], device.name))
    passes.run(1001.0)
    await settle(tasks, wait_for)
    assert [k for k, _, _ in binds.started] == ["default/a", "default/b"]
    cache.pod_event("MODIFIED", dict(pods[1], spec={**pods[1]["spec"], "nodeName": "n0"}))
    cache.rebuild()
    assert "default/a" in cache.assumed and cache.dra.claim_owner == {"default/team": "default/a"}
    assert cache.running["default/b"].allocation.gpus == []
    assert sorted(cache.cluster.gpu_free[0].tolist()) == [0, 1000]


async def test_a_later_first_available_alternative_that_fits_is_taken_before_preempting_for_the_first(tasks,
                                                                                                      wait_for):
    """Two GPUs, else one: one of n0's two GPUs is a low-priority pod's. Preempting it would give the first
    alternative; the second fits as it is, so that is what the pod gets (kube-scheduler, too, preempts only
    when no node fits any subrequest). Preemption is for when none fits: then for each in order."""
    low = make_pod("low", gpus=1)
    low["spec"]["nodeName"] = "n0"
    passes, cache, binds, _, _ = claimed_setup(tasks, [], {}, others=(low,))
    cache.sync_claims([{"metadata": {"name": "either", "namespace": "default", "resourceVersion": "1"},
                        "spec": {"devices": {"requests": [{"name": "g", "firstAvailable": [
                            {"name": f"x{n}", "deviceClassName": "gpu", "count": n} for n in (2, 1)]}]}}}])
    cache.pod_event("ADDED", claimed_pod("a", "either", priority=200_000))
    assert [a.num_gpu for a in (cache.dra.asks["default/a"], *cache.dra.asks["default/a"].then)] == [2, 1]
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert passes.evictor.evicted == [] and [k for k, _, _ in binds.started] == ["default/a"]
    assert [r.name for r, _ in cache.dra.picks["default/a"]] == ["g/x1"]
    cache.pod_event("ADDED", claimed_pod("b", "either2", priority=200_000))  # n0 is full now: none fits
    cache.sync_claims([*cache.dra.state.claims.values(), {
        "metadata": {"name": "either2", "namespace": "default", "resourceVersion": "1"},
        "spec": {"devices": {"requests": [{"name": "g", "firstAvailable": [
            {"name": f"x{n}", "deviceClassName": "gpu", "count": n} for n in (2, 1)]}]}}}])
    passes.run(1001.0)
    await settle(tasks, wait_for)
    # Two GPUs would take a's (as high as b: not a victim); one GPU takes low's.
    assert passes.evictor.evicted == [("default/low", "Preempted")]
    assert [k for k, _, _ in binds.started] == ["default/a", "default/b"]
    assert [r.name for r, _ in cache.dra.picks["default/b"]] == ["g/x1"]


async def test_a_pod_sharing_a_new_claim_with_one_that_cannot_go_allocates_it_itself(tasks, wait_for):
    """a arrived first but fits no node (its CPU); b names the same new claim: b allocates it, rather than
    waiting for a forever."""
    a, b = claimed_pod("a", "team", 0), claimed_pod("b", "team", 1)
    a["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1000"
    passes, cache, binds, _, _ = claimed_setup(tasks, [], {}, others=(a, b))
    cache.sync_claims([{"metadata": {"name": "team", "namespace": "default", "resourceVersion": "1"},
                        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}}}])
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert [k for k, _, _ in binds.started] == ["default/b"] and cache.dra.claim_owner == {"default/team": "default/b"}


async def test_a_claim_tolerating_a_device_taint_gets_that_gpu_and_only_its_own_cycle_sees_it_usable(tasks,
                                                                                                     wait_for):
    """n0's GPU 0 is held by a claim, GPU 1 tainted by a DeviceTaintRule. A pod whose claim does not tolerate
    the taint waits; one whose claim does is placed on GPU 1 and its claim gets gpu-1; after its cycle the GPU
    is critical in the model again. A GPU gpuaware cordoned is not lent, whatever the claim tolerates."""
    from gpuaware.contract import dra
    passes, cache, binds, _, _ = claimed_setup(tasks, [], {})
    held = {"metadata": {"name": "held", "namespace": "default", "resourceVersion": "1"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}}}
    tolerant = {"metadata": {"name": "tolerant", "namespace": "default", "resourceVersion": "1"},
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                    "deviceClassName": "gpu", "tolerations": [{"key": dra.TAINT_XID, "operator": "Exists"}]}}]}}}
    plain = {"metadata": {"name": "plain", "namespace": "default", "resourceVersion": "1"},
             "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}}}
    cache.sync_claims([allocated_on_n0(held, "gpu-0"), tolerant, plain])
    cache.sync_taint_rules([{"metadata": {"name": "xid"}, "spec": {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n0", "device": "gpu-1"},
        "taint": {"key": dra.TAINT_XID, "value": "79", "effect": "NoExecute"}}}])
    assert cache.cluster.band[0].tolist()[:2] == [0, 2]
    cache.pod_event("ADDED", claimed_pod("b", "plain", 1))
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert binds.started == [] and "default/b" in cache.pending
    cache.cordoned["n0"] = {1}  # gpuaware's own cordon (its health chain is emptying the GPU): not lent
    cache.apply_cordons()
    cache.pod_event("ADDED", claimed_pod("c", "tolerant", 2))
    passes.run(1001.0)
    await settle(tasks, wait_for)
    assert binds.started == [] and "default/c" in cache.pending
    del cache.cordoned["n0"]
    cache.apply_cordons()  # the cordon lifted: the GPU back to what lies beneath, its taint again
    cache.apply_cordons()  # (called again, as the live state's apply does every pass: the taint still lent)
    passes.run(1002.0)
    await settle(tasks, wait_for)
    assert [k for k, _, _ in binds.started] == ["default/c"]
    assert [d.name for _, d in cache.dra.picks["default/c"]] == ["gpu-1"]
    assert cache.cluster.band[0].tolist()[:2] == [0, 2] and "default/b" in cache.pending


async def test_an_admin_access_claim_goes_where_its_gpus_are_though_in_use_and_takes_none(tasks, wait_for):
    """Both of n0's GPUs held by claims; a pod with an adminAccess claim for two GPUs is placed there with no GPU
    in the model, its claim written with adminAccess results, and once the claim says so no device is taken."""
    from gpuaware.scheduler.kube.dra import claims as dra_claims
    passes, cache, binds, _, _ = claimed_setup(tasks, [], {})
    held = [{"metadata": {"name": f"held{g}", "namespace": "default", "resourceVersion": "1"},
             "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}}}
            for g in range(2)]
    watch = {"metadata": {"name": "watch", "namespace": "default", "resourceVersion": "1", "uid": "cw"},
             "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                 "deviceClassName": "gpu", "count": 2, "adminAccess": True}}]}}}
    cache.sync_claims([allocated_on_n0(held[0], "gpu-0", "x"), allocated_on_n0(held[1], "gpu-1", "y"), watch])
    assert cache.cluster.gpu_free[0].tolist()[:2] == [0, 0]
    cache.pod_event("ADDED", claimed_pod("mon", "watch"))
    passes.run(1000.0)
    await settle(tasks, wait_for)
    assert [k for k, _, _ in binds.started] == ["default/mon"]
    assert cache.running["default/mon"].allocation.gpus == [] and cache.cluster.gpu_free[0].tolist()[:2] == [0, 0]
    picks = cache.dra.picks["default/mon"]
    assert [d.name for _, d in picks] == ["gpu-0", "gpu-1"] and not cache.dra.state.in_flight
    written = dra_claims.allocation_status(watch, "n0", picks, claimed_pod("mon", "watch"))
    cache.claim_event("MODIFIED", written)
    assert all(r["adminAccess"] for r in written["status"]["allocation"]["devices"]["results"])
    assert set(cache.dra.state.taken_by.values()) == {"default/held0", "default/held1"}  # the watch claim takes none
