"""The scheduler's cluster cache keeps its invariants whatever pod events arrive (hypothesis)."""

from __future__ import annotations

import contextlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaware.contract import annotations as ann
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.core.queue import Usage
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.queues import Queue, QueueSpecError
from tests.support import FUZZ, json_values, printable_text


def summed_again(cache: ClusterCache) -> dict:
    """What ``cache.usage`` must say: every running workload charged again, per (tenant, model)."""
    again = Usage(cache.usage.gpu_mem_by_model)
    for r in cache.running.values():
        again.add(r.workload, str(cache.cluster.models[r.allocation.node]))
    return {k: v for k, v in again.sums.items() if any(v)}


QUEUE = {"metadata": {"name": "q", "creationTimestamp": "2026-01-01T00:00:00Z"},
         "spec": {"tenant": "team", "namespaces": ["default"]}}


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "QUEUE", "NODES"]),
                          st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.sampled_from(["n0", "n1", "gone"])),
                          st.one_of(printable_text, st.builds(json.dumps, json_values))), max_size=12))
def test_the_cache_survives_any_sequence_of_pod_events_and_keeps_its_invariants(events):
    cache = ClusterCache()
    cache.sync_nodes([make_node("n0", gpus=2), make_node("n1", gpus=2)])
    for kind, name, node, gpus_annotation in events:
        if kind == "QUEUE":  # a queue comes or goes: the running pods' tenant changes
            cache.queue_event("DELETED" if node is None else "ADDED", QUEUE)
        elif kind == "NODES":  # the model is rebuilt
            cache.sync_nodes([make_node("n0", gpus=2), make_node("n1", gpus=2 if node is None else 4)])
        else:
            pod = make_pod(name, gpus=1 + len(name) % 2, annotations={ann.ANN_GPUS: gpus_annotation})
            if node:
                pod["spec"]["nodeName"] = node
            cache.pod_event(kind, pod)
        cache.cluster.check_invariants()
        # The sums a pass's ledger is built from follow every change, as charging each running pod would.
        assert {k: v for k, v in cache.usage.sums.items() if any(v)} == summed_again(cache)
    assert set(cache.cluster.allocations) == set(cache.running)


def test_a_synced_pod_is_parsed_once_and_known_workload_gives_what_the_cache_parsed(monkeypatch):
    from gpuaware.scheduler.kube import objects

    parsed: list[str] = []
    real = objects.workload_of

    def counting(pod, *args):
        parsed.append(pod["metadata"]["name"])
        return real(pod, *args)

    monkeypatch.setattr(objects, "workload_of", counting)
    cache = ClusterCache()
    cache.sync_nodes([make_node("n0", gpus=2)])
    bound = make_pod("bound", annotations={ann.ANN_GPUS: '[{"index": 0, "milli": 1000}]'})
    bound["spec"]["nodeName"] = "n0"
    pods = [make_pod("a"), make_pod("b", gpus=2), bound, make_pod("c", scheduler="default-scheduler")]
    cache.sync_pods(pods)
    assert sorted(parsed) == ["a", "b", "bound"]  # queued or charged: parsed once each
    known = [cache.known_workload(p) for p in pods[:3]]
    assert sorted(parsed) == ["a", "b", "bound"]  # nothing parsed again
    assert [w.num_gpu for w in known] == [1, 2, 1]
    assert known == [cache.workload(p) for p in pods[:3]]
    assert cache.known_workload(pods[3]).num_gpu == 1  # not ours: parsed where asked


def test_a_lifted_cordon_or_taint_gives_the_gpu_back_the_band_beneath_and_repeated_calls_keep_the_taint_lent():
    """Without live state a cordoned GPU stayed critical after its cordon was lifted (nothing wrote its band
    again), and a second ``apply_cordons`` forgot which GPUs were critical for a taint alone."""
    import numpy as np

    from gpuaware.contract import dra
    from gpuaware.contract.events import HealthBand
    cache = ClusterCache()
    node = make_node("h", gpus=0)
    cache.sync_nodes([node])
    cache.sync_slices([dra.resource_slice("h", [dra.gpu_device(g, uuid=f"GPU-h-{g}", product_name="NVIDIA H100",
                                                              memory_bytes=80 * 2**30) for g in range(3)])])
    cordoned = json.loads(json.dumps(node))
    cordoned["metadata"].setdefault("annotations", {})[ann.ANN_CORDONED] = "0"
    cache.node_event("MODIFIED", cordoned)
    assert cache.cluster.band[0].tolist()[:3] == [2, 0, 0]
    cache.node_event("MODIFIED", node)
    assert cache.cluster.band[0].tolist()[:3] == [0, 0, 0]
    cache.sync_taint_rules([{"metadata": {"name": "r"}, "spec": {
        "deviceSelector": {"driver": dra.DRIVER, "pool": "h", "device": "gpu-1"},
        "taint": {"key": dra.TAINT_XID, "effect": "NoSchedule"}}}])
    fresh = np.zeros(cache.cluster.band.shape, dtype=bool)
    fresh[0, 1] = True
    for _ in range(2):  # the live state's apply: it writes the band (degraded), then the cordons go on top
        cache.cluster.band[0, 1] = 1
        cache.apply_cordons(fresh)
        assert cache.cluster.band[0].tolist()[:3] == [0, 2, 0]
        assert cache.dra.taint_bands == {(0, 1): HealthBand.DEGRADED}
    cache.apply_cordons()  # nothing fresh: what lies beneath is kept
    assert cache.dra.taint_bands == {(0, 1): HealthBand.DEGRADED}
    cache.sync_taint_rules([])
    assert cache.cluster.band[0].tolist()[:3] == [0, 0, 0]  # sync_taint_rules rebuilds: no live state yet


_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
                     lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner,
                                                                                            max_size=3)),
                     max_leaves=12)
_queue_fields = st.fixed_dictionaries({}, optional={
    "metadata": st.one_of(_json, st.fixed_dictionaries({"name": _json}, optional={
        "generation": _json, "creationTimestamp": _json})),
    "spec": st.one_of(_json, st.fixed_dictionaries({}, optional={
        k: _json for k in ("tenant", "namespaces", "weight", "priorityClasses", "evictionMode")} | {
        "quota": st.one_of(_json, st.lists(st.one_of(_json, st.fixed_dictionaries({}, optional={
            "model": _json, "gpus": _json, "memoryGiB": _json})), max_size=2)),
        "borrowing": st.one_of(_json, st.fixed_dictionaries({}, optional={"enabled": _json, "limitGpus": _json}))}))})


@settings(max_examples=500, deadline=None)
@given(st.one_of(_json, _queue_fields))
def test_any_gpuqueue_object_is_read_or_refused_with_queue_spec_error(obj):
    with contextlib.suppress(QueueSpecError):
        Queue.of(obj)


def held(cache: ClusterCache) -> dict:
    """Everything a placement in flight may change in the cache."""
    return {"gpu_free": cache.cluster.gpu_free.tolist(), "allocations": sorted(cache.cluster.allocations),
            "running": sorted(cache.running), "usage": {k: v for k, v in cache.usage.sums.items() if any(v)},
            "reservations": sorted(cache.assumed), "claim_owner": dict(cache.dra.claim_owner),
            "pod_claims": dict(cache.dra.pod_claims), "in_flight": dict(cache.dra.state.in_flight),
            "picks": sorted(cache.dra.picks)}


def test_forget_undoes_assume_a_placement_with_claims_leaves_nothing_behind():
    """kube-scheduler's ForgetPod undoes AssumePod (Unreserve undoes Reserve). Un-reserving a placement here
    once dropped the reservation but left the pod running in the model (its GPUs, its quota use, the claims it
    was charged for)."""
    from gpuaware.contract import dra
    from gpuaware.scheduler.core.cluster import Allocation
    from gpuaware.scheduler.core.preemption import Running

    cache = ClusterCache()
    cache.sync_nodes([make_node("h", gpus=0)])
    cache.sync_slices([dra.resource_slice("h", [dra.gpu_device(g, uuid=f"GPU-h-{g}", product_name="NVIDIA H100",
                                                              memory_bytes=80 * 2**30) for g in range(2)])])
    cache.sync_classes([{"metadata": {"name": "gpu.nvidia.com"}, "spec": {}}])
    cache.sync_claims([{"metadata": {"name": "c", "namespace": "default", "resourceVersion": "1"},
                        "spec": {"devices": {"requests": [
                            {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}])
    pod = make_pod("p", gpus=0)
    pod["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimName": "c"}]
    cache.sync_pods([pod])
    before = held(cache)
    w = cache.pending["default/p"].workload
    alloc = Allocation(w.id, 0, [1], [1000], w.cpu_milli, w.memory_mib)
    cache.cluster.allocate(alloc)  # the core's placement
    assert cache.dra.pick_devices(w.id, alloc, cache.cluster) is None
    cache.assume(w.id, Running(w, alloc, 0.0, 0.0, None))
    assert held(cache) != before
    cache.forget(w.id)
    assert held(cache) == before


def test_a_view_follows_the_cache_through_a_relist_and_cannot_change_it():
    import pytest

    cache = ClusterCache()
    view = cache.view()  # taken once, as the readers take it
    cache.sync_nodes([make_node("n0", gpus=2)])
    cache.sync_pods([make_pod("a")])  # a re-list replaces the cache's maps
    assert list(view.pods) == ["default/a"] and list(view.pending) == ["default/a"] and list(view.nodes) == ["n0"]
    for mapping in (view.pods, view.pending, view.running, view.nodes, view.queues, view.assumed, view.rejected):
        with pytest.raises(TypeError):
            mapping["x"] = None  # type: ignore[index]
    assert "x" not in cache.pods and "x" not in cache.pending
