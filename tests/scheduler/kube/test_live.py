"""The live scheduler on the real kube-apiserver as its shipped ServiceAccount: binding with annotations and
events, a restart that binds nothing twice, gangs, stale GPU state, preemption, tenants and queue status, power caps."""

from __future__ import annotations

import time

from gpuaware.contract import annotations
from gpuaware.contract.events import GpuState, HealthBand, NodeGpu, NodeState
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.feed import StateView
from tests.support import FAST, events, gpus_of, pods, running, wait_for


async def test_pending_pods_are_bound_to_the_gpus_the_core_chose_with_annotations_and_events(kube):
    for i in range(3):
        kube.create("nodes", make_node(f"n{i}", gpus=4))
    kube.create("pods", make_pod("whole", gpus=2))
    kube.create("pods", make_pod("frac", gpus=0, annotations={"gpuaware.io/gpu-milli": "300",
                                                               "gpuaware.io/sharing": "mps"}))
    kube.create("pods", make_pod("other", gpus=1, scheduler="default-scheduler"))
    kube.create("pods", make_pod("bad", gpus=0, annotations={"gpuaware.io/gpu-milli": "5000"}))
    async with running(kube) as live:
        await wait_for(lambda: all(pods(kube)[n]["spec"].get("nodeName") for n in ("whole", "frac")),
                       what="binding")
        await wait_for(lambda: events(kube, "FailedScheduling"), what="FailedScheduling")
        # Events are written after the binding: wait for them too.
        await wait_for(lambda: len(events(kube, "Scheduled")) == 2, what="Scheduled events")
        p = pods(kube)
        whole, frac = gpus_of(p["whole"]), gpus_of(p["frac"])
        assert [g["milli"] for g in whole] == [1000, 1000] and len({g["index"] for g in whole}) == 2
        assert frac[0]["milli"] == 300 and p["frac"]["metadata"]["annotations"][annotations.ANN_SHARING] == "mps"
        # The core's model holds exactly what the annotations say.
        for name in ("whole", "frac"):
            alloc = live.cache.cluster.allocations[f"default/{name}"]
            assert live.cache.cluster.names[alloc.node] == p[name]["spec"]["nodeName"]
            assert alloc.gpus == [g["index"] for g in gpus_of(p[name])]
        assert not p["other"]["spec"].get("nodeName")  # not ours: left to the default scheduler
        assert not p["bad"]["spec"].get("nodeName")
        (failed,) = events(kube, "FailedScheduling")
        assert failed["involvedObject"]["name"] == "bad" and "gpu-milli: 5000" in failed["message"]
        assert {e["involvedObject"]["name"] for e in events(kube, "Scheduled")} == {"whole", "frac"}
        live.cache.cluster.check_invariants()


async def test_restart_rebuilds_from_the_api_binds_nothing_twice_and_keeps_queue_order(kube):
    kube.create("nodes", make_node("n0", gpus=8))
    for i in range(6):
        kube.create("pods", make_pod(f"a{i}", gpus=1))
    async with running(kube):
        await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(kube).values()), what="first six")
    first = {n: gpus_of(p) for n, p in pods(kube).items()}
    # While no scheduler runs, four more arrive; two GPUs are left, so the two oldest must win.
    # creationTimestamp has second precision, so several of these may share one: their arrival order is
    # then the list's, by name, which is their creation order here. No sleep between them is needed.
    for i in range(4):
        kube.create("pods", make_pod(f"b{i}", gpus=1))
    async with running(kube) as live:
        await wait_for(lambda: sum(1 for p in pods(kube).values() if p["spec"].get("nodeName")) == 8,
                       what="two more")
        await wait_for(lambda: len(live.tasks) == 0, what="every bind finished")
        assert live.stats.api_errors == {}  # no 409: nothing was bound twice
    p = pods(kube)
    assert {n for n, pod in p.items() if pod["spec"].get("nodeName")} == {*first, "b0", "b1"}
    used = [g["index"] for pod in p.values() if pod["spec"].get("nodeName") for g in gpus_of(pod)]
    assert sorted(used) == list(range(8))  # every GPU once: the restart saw the first six's GPUs
    assert all(gpus_of(p[n]) == first[n] for n in first)


async def test_gang_is_placed_all_or_nothing(kube):
    kube.create("nodes", make_node("n0", gpus=4))
    gang = {"gpuaware.io/gang": "train", "gpuaware.io/gang-size": "3"}
    for i in range(2):
        kube.create("pods", make_pod(f"g{i}", gpus=2, annotations=gang))
    async with running(kube):
        await wait_for(lambda: len(events(kube, "FailedScheduling")) >= 2, what="gang waiting")
        assert not any(p["spec"].get("nodeName") for p in pods(kube).values())
        assert "2 of 3 members exist" in events(kube, "FailedScheduling")[0]["message"]
        kube.create("pods", make_pod("g2", gpus=2, annotations=gang))  # 6 GPUs asked, 4 exist
        await wait_for(lambda: any("none of its 3 members placed" in e["message"]
                                   for e in events(kube, "FailedScheduling")), what="gang refused")
        assert not any(p["spec"].get("nodeName") for p in pods(kube).values())
        kube.create("nodes", make_node("n1", gpus=4))
        await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(kube).values()), what="gang placed")


async def test_stale_gpu_state_takes_only_preemptible_work(kube):
    now_ms = int(time.time() * 1000)
    view = StateView(stale_after_ms=60_000)
    view.learn(NodeState("n0", now_ms, None, None, [NodeGpu(f"GPU-n0-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY)
                                                    for g in range(2)], 2000, 0))
    for g in range(2):  # both GPUs last sampled 5 minutes ago
        view.learn(GpuState(f"GPU-n0-{g}", "n0", "H100", now_ms - 300_000, now_ms - 299_000, 10.0, 5.0, 100.0,
                            81920, 100.0, 50.0, 95.0, HealthBand.HEALTHY, {}, [], None, None, 1))
    kube.create("nodes", make_node("n0", gpus=2))
    kube.create("pods", make_pod("critical-job", gpus=1, priority=200_000))  # high: not preemptible
    kube.create("pods", make_pod("batch-job", gpus=1))
    # In no queue: under the default unqueued policy (best-effort) both would be preemptible.
    async with running(kube, FAST.model_copy(update={"unqueued": "allow"}), view=view) as live:
        await wait_for(lambda: pods(kube)["batch-job"]["spec"].get("nodeName"), what="batch placed")
        await wait_for(lambda: events(kube, "FailedScheduling"), what="high refused")
        assert not pods(kube)["critical-job"]["spec"].get("nodeName")
        await wait_for(lambda: live.snapshot.stale_gpus == 2, what="gauges (refreshed every second)")
        assert "health" in events(kube, "FailedScheduling")[0]["message"]


async def test_preemption_evicts_lower_priority_work_for_high_priority_pods(kube):
    kube.create("nodes", make_node("n0", gpus=2))
    for i in range(2):
        kube.create("pods", make_pod(f"low{i}", gpus=1))
    async with running(kube) as live:
        await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(kube).values()), what="low placed")
        kube.create("pods", make_pod("high", gpus=1, priority=200_000))
        await wait_for(lambda: pods(kube).get("high", {}).get("spec", {}).get("nodeName"), what="high placed")
        assert sum(1 for n in pods(kube) if n.startswith("low")) == 1
        assert len(events(kube, "Preempted")) == 1
        await wait_for(lambda: live.stats.decisions[("PLACE", "preempted")] == 1, what="decision counted")


async def test_tenant_comes_from_the_namespace_queue_and_queue_status_is_kept_current(kube):
    kube.create("nodes", make_node("n0", gpus=4, product="NVIDIA-A100-SXM4-80GB"))
    kube.create("gpuqueues", {"metadata": {"name": "vision"}, "spec": {
        "tenant": "vision", "namespaces": ["vision-train"], "weight": 2, "quota": [{"model": "*", "gpus": 1}]}},
        group="gpuaware.io", version="v1alpha1")
    # A pod cannot name its tenant: the annotation is not part of the contract and is ignored.
    kube.create("pods", make_pod("a", namespace="vision-train", gpus=2,
                                 annotations={"gpuaware.io/tenant": "someone-else"}))
    kube.create("pods", make_pod("b", namespace="other", gpus=1))
    settings = FAST.model_copy(update={"queue_status_every_s": 0.1})
    async with running(kube, settings) as live:
        await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(kube).values()), what="placed")
        assert live.cache.running["vision-train/a"].workload.tenant == "vision"
        assert live.cache.running["other/b"].workload.tenant == "unqueued"  # scheduler.unqueued: best-effort

        def status():
            (q,) = kube.objects("gpuqueues", group="gpuaware.io", version="v1alpha1")
            return q.get("status") or {}

        await wait_for(lambda: status().get("running") == 1, what="queue status")
        assert status()["quotaUsed"] == [{"model": "A100", "gpus": 2.0}]
        assert status()["borrowedGpus"] == 1.0  # 2 GPUs on a quota of 1
        await wait_for(lambda: live.snapshot.gpus_used == {"vision": 2.0, "unqueued": 1.0}, what="gauges")


async def test_hot_gpu_gets_a_power_cap_on_the_control_topic_and_it_is_lifted_when_cool(kube):
    now_ms = int(time.time() * 1000)
    view = StateView()
    view.learn(NodeState("n0", now_ms, None, None, [NodeGpu(f"GPU-hot-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY)
                                                    for g in range(2)], 2000, 0))

    def state(g: int, temp: float) -> GpuState:
        ts = int(time.time() * 1000)
        return GpuState(f"GPU-hot-{g}", "n0", "H100", ts, ts, 90.0, 50.0, 1000.0, 81920, 600.0, temp, 90.0,
                        HealthBand.HEALTHY, {}, [], None, None, 1)

    view.learn(state(0, 91.0))
    view.learn(state(1, 60.0))
    sent: list = []

    async def control(record) -> None:
        sent.append(record)

    kube.create("nodes", make_node("n0", gpus=2))
    settings = FAST.model_copy(update={"throttle_every_s": 0.1})
    async with running(kube, settings, view=view, control=control) as live:
        await wait_for(lambda: sent, what="power cap")
        (cap,) = sent
        assert (cap.target, cap.gpu_uuid, cap.kind.value) == ("n0", "GPU-hot-0", "POWER_CAP")
        assert cap.power_cap_w == 420  # 70% of its 600 W draw
        view.learn(state(0, 70.0))
        await wait_for(lambda: len(sent) == 2, what="cap lifted")
        assert sent[1].gpu_uuid == "GPU-hot-0" and sent[1].power_cap_w == 0
        assert live.stats.decisions[("THROTTLE", "thermal")] == 1
