"""Gangs from the Workload API (issue 45, item 4): a pod's ``spec.schedulingGroup.podGroupName`` and its PodGroup's
gang policy (``scheduling.k8s.io/v1alpha2``, what kube-apiserver 1.36 serves with the GenericWorkload gate), placed
all or nothing by the same core as ``gpuaware.io/gang``. Parsing alone, then the live scheduler on a real
kube-apiserver v1.36 with the gate on, as the shipped ServiceAccount; and on the session's apiserver (gate off),
where PodGroups are not watched at all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.objects import PodSpecError
from gpuaware.scheduler.kube.podgroups import PodGroups, gang_size
from tests.real_kube import NS, Kube, prepare
from tests.support import events, need, pods, running, shipped_rbac, wait_for

SCHED = {"group": "scheduling.k8s.io", "version": "v1alpha2"}


def podgroup(name: str, policy: dict, namespace: str = "default") -> dict:
    return {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"schedulingPolicy": policy}}


def member(name: str, group: str, gpus: int = 2, **kw) -> dict:
    pod = make_pod(name, gpus=gpus, **kw)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def test_a_podgroups_gang_policy_gives_the_size_and_basic_none():
    assert gang_size(podgroup("g", {"gang": {"minCount": 3}})) == 3
    assert gang_size(podgroup("g", {"basic": {}})) == 1
    for bad in (0, -1, "3", True, None, 5000):
        with pytest.raises(PodSpecError, match="minCount"):
            gang_size(podgroup("g", {"gang": {"minCount": bad}}))


def test_a_pod_naming_a_podgroup_is_a_gang_member_once_the_group_is_seen():
    groups = PodGroups()
    pod = member("p", "train")
    assert groups.gang_of(pod, None) is None  # not served: the field is not read
    groups.sync([])
    with pytest.raises(PodSpecError, match="waiting for PodGroup default/train"):
        groups.gang_of(pod, None)
    groups.event("ADDED", podgroup("train", {"gang": {"minCount": 3}}))
    assert groups.gang_of(pod, None) == ("default/podgroup:train", 3)
    assert groups.gang_of(make_pod("q"), None) is None
    with pytest.raises(PodSpecError, match="both name a gang"):
        groups.gang_of(pod, "default/train")
    groups.event("ADDED", podgroup("solo", {"basic": {}}))
    assert groups.gang_of(member("s", "solo"), None) is None
    groups.event("DELETED", podgroup("train", {"gang": {"minCount": 3}}))
    with pytest.raises(PodSpecError, match="waiting"):
        groups.gang_of(pod, None)


def test_the_cache_requeues_a_waiting_member_when_its_podgroup_arrives():
    cache = ClusterCache()
    cache.sync_pod_groups([])
    cache.sync_pods([member("p0", "train")])
    assert "waiting for PodGroup" in cache.rejected["default/p0"].reason
    cache.pod_group_event("ADDED", podgroup("train", {"gang": {"minCount": 2}}))
    pw = cache.pending["default/p0"]
    assert (pw.workload.gang, pw.gang_size) == ("default/podgroup:train", 2)
    cache.pod_group_event("DELETED", podgroup("train", {"gang": {"minCount": 2}}))
    assert "default/p0" in cache.rejected


# ------------------------------------------------------------------ on kube-apiserver 1.36 with the gate on
def scheduled(kube: Kube, name: str) -> dict | None:
    """The PodGroupScheduled condition of PodGroup ``default/name``, or None."""
    group = kube.request("GET", Kube.path("podgroups", namespace="default", name=name, **SCHED))
    return next((c for c in (group.get("status") or {}).get("conditions") or []
                 if c["type"] == "PodGroupScheduled"), None)


@pytest.fixture(scope="module")
def gated_cp() -> Iterator[Kube]:
    from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries

    need(find_binaries, BinariesMissing)
    with KubeControlPlane(kwok=True, feature_gates={"GenericWorkload": True},
                          apiserver_args=["--runtime-config=scheduling.k8s.io/v1alpha2=true"]) as cp:
        prepare(cp, shipped_rbac(cp))
        yield Kube(cp, {"gpuaware-scheduler": cp.serviceaccount_kubeconfig(NS, "gpuaware-scheduler", create=False)})


@pytest.fixture
def gated(gated_cp: Kube) -> Iterator[Kube]:
    """The gated control plane for one test, emptied of its objects (PodGroups and Workloads too) afterwards."""
    yield gated_cp
    gated_cp.clean()
    for plural in ("podgroups", "workloads"):
        gated_cp.request("DELETE", Kube.path(plural, namespace="default", **SCHED), None, {"gracePeriodSeconds": 0})


async def test_a_workload_api_gang_is_bound_all_together_or_not_at_all(gated):
    """A Workload's gang template copied into a PodGroup of minCount 3; three 2-GPU pods name it. With room for
    two of them none is bound; with room for three all are."""
    kube = gated
    kube.create("workloads", {"metadata": {"name": "train"}, "spec": {"podGroupTemplates": [
        {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 3}}}]}}, **SCHED)
    group = podgroup("train-0", {"gang": {"minCount": 3}})
    group["spec"]["podGroupTemplateRef"] = {"workload": {"workloadName": "train", "podGroupTemplateName": "workers"}}
    kube.create("podgroups", group, **SCHED)
    kube.create("nodes", make_node("n0", gpus=4))
    for i in range(3):
        created = kube.create("pods", member(f"w{i}", "train-0"))
        assert created["spec"]["schedulingGroup"] == {"podGroupName": "train-0"}  # the gate keeps the field
    async with running(kube) as live:
        assert "podgroups" in [i.spec.name for i in live._informers]
        await wait_for(lambda: any("none of its 3 members placed" in e["message"]
                                   for e in events(kube, "FailedScheduling")), what="the gang refused")
        assert not any(p["spec"].get("nodeName") for p in pods(kube).values())
        assert "gang default/podgroup:train-0" in events(kube, "FailedScheduling")[0]["message"]
        # The PodGroup says so too (its /status, written as the shipped ServiceAccount).
        await wait_for(lambda: scheduled(kube, "train-0") is not None, what="PodGroupScheduled written")
        cond = scheduled(kube, "train-0")
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        assert "none of its 3 members placed" in cond["message"]
        kube.create("nodes", make_node("n1", gpus=2))
        await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(kube).values()), what="the gang bound")
        assert len(pods(kube)) == 3
        await wait_for(lambda: (scheduled(kube, "train-0") or {}).get("status") == "True", what="the group scheduled")
        cond = scheduled(kube, "train-0")
        assert (cond["reason"], cond["message"]) == ("Scheduled", "3 bound (minCount 3)")


async def test_a_member_waits_for_its_podgroup_and_goes_when_it_arrives(gated):
    kube = gated
    kube.create("nodes", make_node("n0", gpus=4))
    for i in range(2):
        kube.create("pods", member(f"l{i}", "late", gpus=1))
    async with running(kube) as live:
        await wait_for(lambda: "default/l0" in live.cache.rejected, what="waiting for the PodGroup")
        assert "waiting for PodGroup default/late" in live.cache.rejected["default/l0"].reason
        assert not any(p["spec"].get("nodeName") for p in pods(kube).values())
        kube.create("podgroups", podgroup("late", {"gang": {"minCount": 2}}), **SCHED)
        await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(kube).values()), what="the gang bound")


async def test_without_the_gate_podgroups_are_not_watched(kube, caplog):
    kube.create("nodes", make_node("n0", gpus=1))
    kube.create("pods", make_pod("p", gpus=1))
    with caplog.at_level("INFO", logger="gpuaware.scheduler.kube.live"):
        async with running(kube) as live:
            await wait_for(lambda: pods(kube)["p"]["spec"].get("nodeName"), what="bound")
            assert "podgroups" not in [i.spec.name for i in live._informers]
    assert sum("PodGroups are not served" in r.message for r in caplog.records) == 1
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
