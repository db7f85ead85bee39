"""A pod's ResourceClaims as the core's request, the devices picked for a placement, and what is left to
kube-scheduler (with the reason). Slices are built with ``gpuaware.contract.dra`` as NVIDIA's driver shapes them."""

from __future__ import annotations

from typing import Any

import pytest

from gpuaware.contract import dra
from gpuaware.local.fake_apiserver import make_node
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.dra import claims as dra_claims
from gpuaware.scheduler.kube.dra.claims import (
    MAX_RESERVED_FOR,
    ClaimsNotReady,
    UnsupportedClaim,
    allocated,
    allocation_status,
    ask_of,
    pick,
    reserved_status,
    resumed,
    shared_node,
)
from gpuaware.scheduler.kube.dra.inventory import DraInventory
from gpuaware.scheduler.kube.dra.plugin import DraPlugin
from gpuaware.scheduler.kube.objects import PodSpecError, PodWorkload

GB = 2**30
GPU_CLASS = {"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [{"cel": {"expression":
             'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"'}}]}}
MIG_CLASS = {"metadata": {"name": "mig.nvidia.com"}, "spec": {"selectors": [{"cel": {"expression":
             'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"'}}]}}
CLASSES = {"gpu.nvidia.com": GPU_CLASS, "mig.nvidia.com": MIG_CLASS}
PARTS = tuple([dra.MigPartition("1g.10gb", 19, p, 1, 9856 * 2**20, 14) for p in range(7)]
              + [dra.MigPartition("7g.80gb", 0, 0, 8, 79 * 2**30, 98, 7, 5, 0, 1, 1)])


def gpus(node: str, n: int, product: str = "NVIDIA H100 80GB HBM3", islands: int = 2, tainted: int | None = None):
    return [dra.gpu_device(i, uuid=f"GPU-{node}-{i}", product_name=product, memory_bytes=80 * GB,
                           nvlink_island=i * islands // n,
                           taints=[dra.device_taint()] if i == tainted else ()) for i in range(n)]


def a100_mig(node: str) -> list[dict[str, Any]]:
    devices = [dra.gpu_device(0, uuid=f"GPU-{node}-0", product_name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * GB,
                              partitions=PARTS)]
    devices += [dra.mig_device(0, p, parent_uuid=f"GPU-{node}-0", product_name="NVIDIA A100-SXM4-80GB")
                for p in PARTS]
    return [dra.resource_slice(node, devices, slice_count=2),
            dra.resource_slice(node, shared_counters=[dra.gpu_counter_set(0, 80 * GB, PARTS)], slice_count=2)]


def inventory(*slices: dict[str, Any]) -> DraInventory:
    inv = DraInventory()
    inv.sync(list(slices))
    return inv


def claim(name: str, *requests: dict[str, Any], constraints: list[dict] | None = None,
          status: dict | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": list(requests)}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"}, "spec": spec,
            "status": status or {}}


def exactly(name: str = "gpus", cls: str = "gpu.nvidia.com", count: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "count": count, **extra}}


def pod(*claims: str, templates: dict[str, str] | None = None, name: str = "p", uid: str = "u1") -> dict[str, Any]:
    refs = [{"name": c, "resourceClaimName": c} for c in claims]
    refs += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"schedulerName": "gpuaware", "containers": [{"name": "c"}], "resourceClaims": refs}}


def claims(*objs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"ns/{c['metadata']['name']}": c for c in objs}


def test_whole_gpus_add_up_over_requests_and_claims_and_the_models_come_from_the_devices():
    inv = inventory(dra.resource_slice("h", gpus("h", 8)),
                    dra.resource_slice("a", gpus("a", 8, "NVIDIA A100-SXM4-80GB")))
    sel = {"selectors": [{"cel": {"expression": 'device.capacity["gpu.nvidia.com"].memory.compareTo('
                                                'quantity("64Gi")) >= 0 && device.attributes["gpu.nvidia.com"]'
                                                '.productName.contains("H100")'}}]}
    ask = ask_of(pod("c1", "c2"), claims(claim("c1", exactly(count=2), exactly("more", **sel)),
                                         claim("c2", exactly(count=3))), CLASSES, inv)
    assert (ask.kind, ask.num_gpu, ask.gpu_milli) == ("gpu", 6, 1000)
    assert ask.models == ("H100",) and ask.nodes is None  # every H100 matches: the core places by model


def test_a_selector_matching_part_of_a_model_narrows_the_nodes():
    inv = inventory(dra.resource_slice("h1", gpus("h1", 2)), dra.resource_slice("h2", gpus("h2", 2)))
    one = {"selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].uuid == "GPU-h2-1"'}}]}
    ask = ask_of(pod("c"), claims(claim("c", exactly(**one))), CLASSES, inv)
    assert ask.nodes == frozenset({"h2"})


@pytest.mark.parametrize(("request_", "constraints", "why"), [
    ({"name": "g"}, None, "requests[0]: neither `exactly` nor `firstAvailable`"),
    ({"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com",
                                       "tolerations": [{"operator": "Exists", "value": "x"}]}]}, None,
     "requests[0].firstAvailable[0].tolerations[0].value: must be empty with operator Exists"),
    (exactly(tolerations=[{"key": "k", "operator": "In"}]), None, "tolerations[0].operator: 'In' is not one of"),
    (exactly(tolerations=[{"value": "v"}]), None, "tolerations[0].key: required with operator Equal"),
    (exactly(allocationMode="All"), None, "allocationMode: 'All'"),
    (exactly(adminAccess=True, capacity={"requests": {"memory": "1Gi"}}), None, "not read with adminAccess"),
    (exactly(), [{"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/uuid"}], "matchAttribute"),
    (exactly(), [{"requests": ["gpus"], "distinctAttribute": "gpu.nvidia.com/uuid"}], "only matchAttribute"),
    (exactly(selectors=[{"cel": {"expression": "device.attributes['x'].y.matches('z')"}}]), None, "matches()"),
])
def test_what_gpuaware_does_not_allocate_is_refused_with_the_field_and_reason(request_, constraints, why):
    inv = inventory(dra.resource_slice("h", gpus("h", 8)))
    with pytest.raises(PodSpecError) as info:  # UnsupportedClaim, or UnsupportedCel for the selector
        ask_of(pod("c"), claims(claim("c", request_, constraints=constraints)), CLASSES, inv)
    assert why in str(info.value)


def test_a_claim_allocated_already_or_not_there_yet_is_not_placed():
    inv = inventory(dra.resource_slice("h", gpus("h", 8)))
    taken = claim("c", exactly(), status={"allocation": {"devices": {"results": []}}})
    with pytest.raises(UnsupportedClaim, match="allocated already"):
        ask_of(pod("c"), claims(taken), CLASSES, inv)
    with pytest.raises(ClaimsNotReady, match="template 'gpu-template'"):
        ask_of(pod(templates={"g": "gpu-template"}), {}, CLASSES, inv)
    with pytest.raises(ClaimsNotReady, match="DeviceClass 'nope'"):
        ask_of(pod("c"), claims(claim("c", exactly(cls="nope"))), CLASSES, inv)


def test_whole_gpus_and_a_mig_partition_in_one_pod_are_refused():
    inv = inventory(*a100_mig("m"))
    with pytest.raises(UnsupportedClaim, match="whole GPUs or one MIG partition"):
        ask_of(pod("c"), claims(claim("c", exactly(), exactly("part", cls="mig.nvidia.com"))), CLASSES, inv)


def test_an_nvlink_pair_is_repicked_on_one_island_when_the_cores_gpus_span_two():
    inv = inventory(dra.resource_slice("h", gpus("h", 4, islands=2)))  # islands: [0, 0, 1, 1]
    pair = claim("c", exactly(count=2), constraints=[{"requests": ["gpus"], "matchAttribute": dra.ATTR_NVLINK_ISLAND}])
    ask = ask_of(pod("c"), claims(pair), CLASSES, inv)
    assert ask.needs_island
    slots, picked = pick(ask, inv.nodes["h"], [1, 2], [1, 2, 3], set(), lambda d: True)
    assert slots == [2, 3] and [d.name for _, d in picked] == ["gpu-2", "gpu-3"]
    assert isinstance(pick(ask, inv.nodes["h"], [1, 2], [1, 2], set(), lambda d: True), str)  # no island has 2


def test_a_mig_partition_is_picked_where_the_shared_counters_still_allow_it():
    inv = inventory(*a100_mig("m"))
    profile = {"selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'}}]}
    ask = ask_of(pod("c"), claims(claim("c", exactly(cls="mig.nvidia.com", **profile))), CLASSES, inv)
    assert (ask.kind, ask.num_gpu, ask.gpu_milli) == ("mig", 1, 143)
    first = ("gpu.nvidia.com", "m", dra.mig_device_name(0, "1g.10gb", 19, 0))
    taken = {first}
    slots, picked = pick(ask, inv.nodes["m"], [0], [0], taken, lambda d: inv.fits_counters(d, taken))
    assert slots == [0] and picked[0][1].name == dra.mig_device_name(0, "1g.10gb", 19, 1)
    whole = {("gpu.nvidia.com", "m", "gpu-0")}  # the whole GPU holds every memory slice: no partition fits
    assert isinstance(pick(ask, inv.nodes["m"], [0], [0], whole, lambda d: inv.fits_counters(d, whole)), str)


def test_slices_give_a_node_its_gpus_and_a_tainted_device_takes_nothing_new():
    cache = ClusterCache()
    node = make_node("h", gpus=0)
    cache.sync_nodes([node])
    cache.sync_slices([dra.resource_slice("h", gpus("h", 4, tainted=2))])
    c = cache.cluster
    assert (int(c.gpu_count[0]), str(c.models[0]), int(c.gpu_mem_cap[0, 0])) == (4, "H100", 80 * 1024)
    assert c.nvlink[0].tolist() == [0, 0, 1, 1]
    assert c.band[0].tolist() == [0, 0, 2, 0]  # the taint keeps the core off it, as it keeps kube-scheduler


def test_allocated_claims_hold_their_gpus_with_or_without_their_pod_and_other_drivers_devices_are_no_slot():
    cache = ClusterCache()
    cache.sync_nodes([make_node("h", gpus=0)])
    nic = dra.resource_slice("h", [{"name": "eth1", "attributes": {"type": {"string": "nic"}}}],
                             driver="nic.example.com", name="h-nic")
    cache.sync_slices([dra.resource_slice("h", gpus("h", 4)), nic])
    results = [{"request": "g", "driver": dra.DRIVER, "pool": "h", "device": "gpu-1"},
               {"request": "n", "driver": "nic.example.com", "pool": "h", "device": "eth1"}]
    held = claim("c", exactly(), status={"allocation": {"devices": {"results": results}},
                                         "reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]})
    cache.sync_claims([held])
    assert cache.cluster.gpu_free[0].tolist() == [1000, 0, 1000, 1000]  # a hold: no pod known yet
    running = pod("c")
    running["spec"]["nodeName"] = "h"
    cache.sync_pods([running])  # (a new model: rebuilt)
    c = cache.cluster
    assert c.gpu_free[0].tolist() == [1000, 0, 1000, 1000] and "claim:ns/c" not in c.allocations
    assert cache.running["ns/p"].allocation.gpus == [1] and cache.running["ns/p"].allocation.milli == [1000]
    assert cache.running["ns/p"].workload.num_gpu == 1
    cache.pod_event("DELETED", running)  # ended: the devices stay taken until the claim is deallocated
    assert c.gpu_free[0].tolist() == [1000, 0, 1000, 1000] and "claim:ns/c" in c.allocations
    cache.claim_event("DELETED", held)
    assert c.gpu_free[0].tolist() == [1000] * 4


def test_a_pool_being_republished_hands_out_nothing_until_all_its_slices_are_there():
    devices, counters = a100_mig("m")  # two slices: the devices, then the counters
    inv = inventory(devices)
    assert inv.nodes["m"].gpus[0].tainted and all(m.tainted for m in inv.nodes["m"].migs)
    inv.event("ADDED", counters)
    assert not inv.nodes["m"].gpus[0].tainted and not any(m.tainted for m in inv.nodes["m"].migs)


def shareable(node: str, n: int, memory: int = 80 * GB) -> dict[str, Any]:
    return dra.resource_slice(node, [dra.gpu_device(i, uuid=f"GPU-{node}-{i}", product_name="NVIDIA H100 80GB HBM3",
                                                    memory_bytes=memory, shareable=True) for i in range(n)])


def test_a_memory_request_on_shareable_gpus_is_a_share_of_the_smallest_and_written_with_a_share_id():
    inv = inventory(shareable("s", 2), shareable("t", 1, memory=40 * GB))
    c = claim("c", exactly(capacity={"requests": {"memory": "10Gi"}}))
    c["metadata"]["uid"] = "u1"
    ask = ask_of(pod("c"), claims(c), CLASSES, inv)
    assert (ask.kind, ask.num_gpu, ask.gpu_milli) == ("share", 1, 250)  # 10 of the smallest's 40 GiB
    assert DraPlugin.asking(PodWorkload(Workload("p"), 1), ask).workload.memory_share  # placed by memory left
    free = {"gpu-0": False, "gpu-1": True}  # what the claims leave of each GPU's memory
    slots, picked = pick(ask, inv.nodes["s"], [0], [0, 1], set(), lambda d: free[d.name])
    assert slots == [1] and [d.name for _, d in picked] == ["gpu-1"]
    (result,) = allocation_status(c, "s", picked, pod("c"))["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": str(10 * GB)} and result["shareID"]
    assert allocated(c | {"status": {"allocation": {"devices": {"results": [result]}}}}) == [
        (("gpu.nvidia.com", "s", "gpu-1"), 10 * GB)]


def test_a_memory_request_on_gpus_that_do_not_allow_sharing_takes_a_whole_gpu():
    inv = inventory(dra.resource_slice("w", gpus("w", 2)))
    ask = ask_of(pod("c"), claims(claim("c", exactly(capacity={"requests": {"memory": "10Gi"}}))), CLASSES, inv)
    assert (ask.kind, ask.gpu_milli) == ("gpu", 1000)
    assert not DraPlugin.asking(PodWorkload(Workload("p"), 1), ask).workload.memory_share


def test_two_memory_shares_in_one_pod_are_refused():
    inv = inventory(shareable("s", 2))
    two = claim("c", exactly(count=2, capacity={"requests": {"memory": "10Gi"}}))
    with pytest.raises(UnsupportedClaim, match="2 memory shares requested"):
        ask_of(pod("c"), claims(two), CLASSES, inv)


def test_a_shareable_gpu_taken_whole_is_written_as_a_share_of_all_its_memory():
    inv = inventory(shareable("s", 1))
    c = claim("c", exactly())
    ask = ask_of(pod("c"), claims(c), CLASSES, inv)
    assert ask.kind == "gpu"
    _, picked = pick(ask, inv.nodes["s"], [0], [0], set(), lambda d: True)
    (result,) = allocation_status(c, "s", picked, pod("c"))["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": str(80 * GB)} and result["shareID"]


def on_node(node: str, *devices: str, users: tuple[tuple[str, str], ...] = (("p", "u1"),)) -> dict[str, Any]:
    """A claim status: allocated on ``node`` (its ``devices``), reserved for ``users`` (name, uid)."""
    return {"allocation": {"devices": {"results": [{"request": "gpus", "driver": dra.DRIVER, "pool": node,
                                                    "device": d} for d in devices]},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in users]}


def test_a_pod_whose_claims_are_all_allocated_goes_where_they_are_and_mixed_or_split_ones_are_refused():
    one = claims(claim("a", exactly(), status=on_node("h", "gpu-0", users=(("first", "u0"),))),
                 claim("b", exactly(), status=on_node("h", "gpu-1", users=())),
                 claim("fresh", exactly()),
                 claim("far", exactly(), status=on_node("g", "gpu-0")))
    assert shared_node(pod("a", "b"), one) == "h"  # in use by another pod, or by none yet: either is shared
    assert shared_node(pod("fresh"), one) is None  # nothing allocated: the pod asks for devices
    with pytest.raises(UnsupportedClaim, match="ns/a is allocated already and ns/fresh is not"):
        shared_node(pod("a", "fresh"), one)
    with pytest.raises(UnsupportedClaim, match=r"allocated on different nodes \(g, h\)"):
        shared_node(pod("a", "far"), one)
    full = tuple((f"p{i}", f"u-{i}") for i in range(MAX_RESERVED_FOR))
    crowded = claims(claim("a", exactly(), status=on_node("h", "gpu-0", users=full)))
    with pytest.raises(ClaimsNotReady, match="reserved for 256 pods"):
        shared_node(pod("a"), crowded)
    assert shared_node(pod("a", name="p3", uid="u-3"), crowded) == "h"  # one of them: it is in already


def test_a_claim_reserved_for_other_pods_too_is_not_resumed_as_the_pods_own():
    inv = inventory(dra.resource_slice("h", gpus("h", 2)))
    alone = claims(claim("a", exactly(), status=on_node("h", "gpu-0")))
    assert resumed(pod("a"), alone, inv) is not None  # reserved for it alone: its own placement, cut short
    both = claims(claim("a", exactly(), status=on_node("h", "gpu-0", users=(("first", "u0"), ("p", "u1")))))
    # Rewriting the allocation for this pod alone would take the first pod off the claim: shared instead.
    assert resumed(pod("a"), both, inv) is None
    assert shared_node(pod("a"), both) == "h"


def test_joining_a_shared_claim_adds_the_pod_and_keeps_the_allocation():
    c = claim("a", exactly(), status=on_node("h", "gpu-0", users=(("first", "u0"),)))
    joined = reserved_status(c, pod("a"))
    assert joined is not None
    assert [r["uid"] for r in joined["status"]["reservedFor"]] == ["u0", "u1"]
    assert joined["status"]["allocation"] == c["status"]["allocation"]
    assert reserved_status(joined, pod("a")) is None  # in already: nothing to write


def test_a_claim_shared_by_bound_pods_is_charged_once_and_stays_taken_until_deallocated():
    cache = ClusterCache()
    cache.sync_nodes([make_node("h", gpus=0)])
    cache.sync_slices([dra.resource_slice("h", gpus("h", 4))])
    shared = claim("c", exactly(), status=on_node("h", "gpu-1", "gpu-2", users=(("p", "u1"), ("q", "u2"))))
    cache.sync_claims([shared])
    first, second = pod("c"), pod("c", name="q", uid="u2")
    for i, p in enumerate((first, second)):
        p["spec"]["nodeName"] = "h"
        p["metadata"]["creationTimestamp"] = f"2026-11-28T10:00:0{i}Z"
    cache.sync_pods([first, second])
    c = cache.cluster
    assert c.gpu_free[0].tolist() == [1000, 0, 0, 1000]
    assert cache.running["ns/p"].workload.num_gpu == 2 and cache.running["ns/p"].allocation.gpus == [1, 2]
    # The second pod holds no device of its own: its GPUs are counted once, in the model and the quotas.
    assert cache.running["ns/q"].workload.num_gpu == 0 and cache.running["ns/q"].allocation.gpus == []
    cache.pod_event("DELETED", first)  # the other pod still uses them: taken, and now charged to it (its quota)
    assert c.gpu_free[0].tolist() == [1000, 0, 0, 1000] and "claim:ns/c" not in c.allocations
    assert cache.running["ns/q"].workload.num_gpu == 2 and cache.dra.claim_owner == {"ns/c": "ns/q"}
    cache.claim_event("MODIFIED", {**shared, "status": on_node("h", "gpu-1", "gpu-2", users=(("q", "u2"),))})
    assert c.gpu_free[0].tolist() == [1000, 0, 0, 1000]
    cache.rebuild()  # read again from scratch (a new model): the pod left is charged for it
    c = cache.cluster
    assert cache.running["ns/q"].workload.num_gpu == 2 and c.gpu_free[0].tolist() == [1000, 0, 0, 1000]
    cache.pod_event("DELETED", second)
    assert c.gpu_free[0].tolist() == [1000, 0, 0, 1000]  # a hold until deallocated
    cache.claim_event("DELETED", shared)
    assert c.gpu_free[0].tolist() == [1000] * 4


def first_available(name: str, *subs: tuple[str, str, int]) -> dict[str, Any]:
    """A ``firstAvailable`` request: (subrequest name, productName, count) in order."""
    return {"name": name, "firstAvailable": [
        {"name": n, "deviceClassName": "gpu.nvidia.com", "count": count, "selectors": [{"cel": {"expression":
         f'device.attributes["gpu.nvidia.com"].productName == "{product}"'}}]} for n, product, count in subs]}


def test_first_available_subrequests_are_asks_in_order_and_those_no_device_matches_are_passed_over():
    inv = inventory(dra.resource_slice("h", gpus("h", 8)),
                    dra.resource_slice("a", gpus("a", 4, product="NVIDIA A100-SXM4-80GB")))
    c = claim("c", first_available("gpu", ("b200", "NVIDIA B200", 1), ("h100", "NVIDIA H100 80GB HBM3", 2),
                                   ("a100", "NVIDIA A100-SXM4-80GB", 4)))
    ask = ask_of(pod("c"), claims(c), CLASSES, inv)
    # No B200 anywhere: passed over. Two H100s first, then four A100s where no two H100s fit.
    assert (ask.num_gpu, ask.models, [r.name for r in ask.requests]) == (2, ("H100",), ["gpu/h100"])
    assert [(a.num_gpu, a.models, [r.name for r in a.requests]) for a in ask.then] == [(4, ("A100",), ["gpu/a100"])]
    picked = pick(ask, inv.nodes["h"], [0, 1], list(range(8)), set(), lambda d: True)
    assert not isinstance(picked, str)
    body = allocation_status(c, "h", picked[1], pod("c"))
    assert [r["request"] for r in body["status"]["allocation"]["devices"]["results"]] == ["gpu/h100"] * 2
    nothing = claim("c", first_available("gpu", ("b200", "NVIDIA B200", 1)))
    with pytest.raises(UnsupportedClaim, match="match no devices"):
        ask_of(pod("c"), claims(nothing), CLASSES, inv)
    many = claim("c", *(first_available(f"r{i}", ("h", "NVIDIA H100 80GB HBM3", 1), ("a", "NVIDIA A100-SXM4-80GB", 1))
                        for i in range(5)))  # 2^5 alternatives
    with pytest.raises(UnsupportedClaim, match="more than 16 alternatives"):
        ask_of(pod("c"), claims(many), CLASSES, inv)


def test_reading_a_pod_that_is_not_in_the_queue_keeps_nothing_of_its_claims():
    """kube-scheduler's pod with a claim, read by the extender: what it asks is answered, nothing kept for a
    pass (the entries stayed until the pod was bound or deleted)."""
    cache = ClusterCache(scheduler_name="gpuaware")
    cache.sync_nodes([make_node("h", gpus=0)])
    cache.sync_slices([dra.resource_slice("h", gpus("h", 2))])
    cache.sync_classes(list(CLASSES.values()))
    cache.sync_claims([claim("c", exactly())])
    theirs = pod("c")
    theirs["spec"]["schedulerName"] = "default-scheduler"
    cache.sync_pods([theirs])
    assert cache.known_workload(theirs).num_gpu == 1
    assert not cache.dra.asks and not cache.dra.joins and not cache.dra.resumes


@pytest.mark.parametrize(("tolerations", "taken"), [
    ([], False),
    ([{"key": dra.TAINT_UNHEALTHY, "operator": "Exists"}], True),
    ([{"key": dra.TAINT_UNHEALTHY, "operator": "Exists", "effect": "NoSchedule"}], True),
    ([{"key": dra.TAINT_UNHEALTHY, "operator": "Exists", "effect": "NoExecute"}], False),  # another effect
    ([{"key": dra.TAINT_UNHEALTHY, "value": "xid-79"}], True),  # Equal, the default operator
    ([{"key": dra.TAINT_UNHEALTHY, "value": "xid-48"}], False),
    ([{"key": dra.TAINT_XID, "operator": "Exists"}], False),  # another key
    ([{"operator": "Exists"}], True),  # every taint
])
def test_a_request_has_a_tainted_device_only_where_its_tolerations_cover_the_taint(tolerations, taken):
    devices = gpus("h", 2)
    devices[1]["taints"] = [dra.device_taint(dra.TAINT_UNHEALTHY, "xid-79", "NoSchedule")]
    inv = inventory(dra.resource_slice("h", devices))
    extra = {"tolerations": tolerations} if tolerations else {}
    ask = ask_of(pod("c"), claims(claim("c", exactly(count=2, **extra))), CLASSES, inv)
    assert ask.tolerating == bool(tolerations) and ask.tolerates(inv.nodes["h"].gpus[1]) == taken
    assert not ask.tolerates(inv.nodes["h"].gpus[0])  # not tainted: nothing to lend
    out = pick(ask, inv.nodes["h"], [0, 1], [0, 1], set(), lambda d: True)
    assert isinstance(out, str) != taken


def test_every_taint_of_a_device_must_be_tolerated_and_a_pool_being_republished_tolerates_nothing():
    devices = gpus("h", 1)
    devices[0]["taints"] = [dra.device_taint(dra.TAINT_XID, "79", "NoExecute"), dra.device_taint()]
    inv = inventory(dra.resource_slice("h", devices))
    one = exactly(tolerations=[{"key": dra.TAINT_XID, "operator": "Exists"}])
    both = exactly(tolerations=[{"key": dra.TAINT_XID, "operator": "Exists"},
                                {"key": dra.TAINT_UNHEALTHY, "operator": "Exists"}])
    assert not ask_of(pod("c"), claims(claim("c", one)), CLASSES, inv).tolerates(inv.nodes["h"].gpus[0])
    assert ask_of(pod("c"), claims(claim("c", both)), CLASSES, inv).tolerates(inv.nodes["h"].gpus[0])
    devices_only, _ = a100_mig("m")  # its counters' slice not there yet
    inv = inventory(devices_only)
    anything = exactly(tolerations=[{"operator": "Exists"}])
    ask = ask_of(pod("c"), claims(claim("c", anything)), CLASSES, inv)
    assert inv.nodes["m"].gpus[0].tainted and not ask.tolerates(inv.nodes["m"].gpus[0])


def test_admin_access_goes_to_a_node_with_the_gpus_in_use_or_not_and_takes_none():
    inv = inventory(dra.resource_slice("h", gpus("h", 2)),
                    dra.resource_slice("a", gpus("a", 1, "NVIDIA A100-SXM4-80GB")))
    ask = ask_of(pod("c"), claims(claim("c", exactly(count=2, adminAccess=True))), CLASSES, inv)
    assert (ask.kind, ask.num_gpu, ask.nodes) == ("admin", 0, frozenset({"h"}))  # a has one GPU only
    picked = dra_claims.pick_admin(ask, inv.nodes["h"])
    assert [d.name for _, d in picked] == ["gpu-0", "gpu-1"]
    written = allocation_status(claim("c", exactly(count=2, adminAccess=True)), "h", picked, pod("c"))
    results = written["status"]["allocation"]["devices"]["results"]
    assert all(r["adminAccess"] is True and "shareID" not in r for r in results)
    assert allocated(written) == []  # the devices stay free for others
    with pytest.raises(UnsupportedClaim, match="adminAccess and other requests in one pod"):
        ask_of(pod("c", "d"), claims(claim("c", exactly(adminAccess=True)), claim("d", exactly())), CLASSES, inv)
    with pytest.raises(UnsupportedClaim, match="match no node"):
        ask_of(pod("c"), claims(claim("c", exactly(count=3, adminAccess=True))), CLASSES, inv)


def test_the_requests_tolerations_are_copied_into_the_allocation_result_and_kept_on_a_rewrite():
    """kube-controller-manager's taint eviction reads a result's tolerations (not the request's): without them a
    pod on a NoExecute-tainted device it tolerates would be evicted."""
    devices = gpus("h", 1)
    devices[0]["taints"] = [dra.device_taint(dra.TAINT_XID, "79", "NoExecute")]
    inv = inventory(dra.resource_slice("h", devices))
    tolerations = [{"key": dra.TAINT_XID, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
    c = claim("c", exactly(tolerations=tolerations))
    ask = ask_of(pod("c"), claims(c), CLASSES, inv)
    picked = pick(ask, inv.nodes["h"], [0], [0], set(), lambda d: True)
    assert not isinstance(picked, str)
    written = allocation_status(c, "h", picked[1], pod("c"))
    (result,) = written["status"]["allocation"]["devices"]["results"]
    assert result["tolerations"] == tolerations
    again = resumed(pod("c"), claims(dict(written, status={**written["status"], "reservedFor": [
        {"resource": "pods", "name": "p", "uid": "u1"}]})), inv)
    assert again is not None
    rewritten = allocation_status(c, "h", again[1], pod("c"))
    assert rewritten["status"]["allocation"]["devices"]["results"][0]["tolerations"] == tolerations


def test_a_request_without_tolerations_gets_the_untainted_gpu_whatever_the_request_order():
    devices = gpus("h", 2)
    devices[1]["taints"] = [dra.device_taint(dra.TAINT_XID, "79", "NoSchedule")]
    inv = inventory(dra.resource_slice("h", devices))
    tolerant = exactly("t", tolerations=[{"key": dra.TAINT_XID, "operator": "Exists"}])
    for order in ((tolerant, exactly("p")), (exactly("p"), tolerant)):
        ask = ask_of(pod("c"), claims(claim("c", *order)), CLASSES, inv)
        got = pick(ask, inv.nodes["h"], [0, 1], [0, 1], set(), lambda d: True)
        assert not isinstance(got, str), got
        assert sorted((r.name, d.name) for r, d in got[1]) == [("p", "gpu-0"), ("t", "gpu-1")]


def test_admin_access_claims_of_one_pod_may_name_the_same_device_but_one_claim_names_it_once():
    inv = inventory(dra.resource_slice("h", gpus("h", 1)))
    ask = ask_of(pod("a", "b"), claims(claim("a", exactly(adminAccess=True)), claim("b", exactly(adminAccess=True))),
                 CLASSES, inv)
    assert ask.nodes == frozenset({"h"})
    assert [d.name for _, d in dra_claims.pick_admin(ask, inv.nodes["h"])] == ["gpu-0", "gpu-0"]
    with pytest.raises(UnsupportedClaim, match="match no node"):  # two requests of one claim: two devices
        ask_of(pod("a"), claims(claim("a", exactly("x", adminAccess=True), exactly("y", adminAccess=True))),
               CLASSES, inv)
