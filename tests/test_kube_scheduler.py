"""The scheduler in Kubernetes, driven through the real ``kubernetes`` client against the fake API server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiokafka import AIOKafkaProducer
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from contract import annotations, topics
from contract.events import GpuState, HealthBand, NodeGpu, NodeState, encode
from gpuaware.local.fake_apiserver import FakeApiServer, make_node, make_pod
from plumbing import observability
from plumbing.kafka_settings import KafkaSettings
from plumbing.kube.api import MERGE_PATCH, Informer, KubeApi, WatchSpec, connect
from scheduler.feed import StateFeed, StateView
from scheduler.kube import objects
from scheduler.kube.extender import Extender
from scheduler.kube.leader import LeaderElector
from scheduler.kube.live import LiveScheduler
from scheduler.settings import SchedulerSettings

FAST = SchedulerSettings(pass_interval_s=0.02, checkpoint_timeout_s=2.0, eviction_retry_s=0.2,
                         eviction_timeout_s=3.0, extender_port=0)


async def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(fake: FakeApiServer, settings: SchedulerSettings = FAST, view: StateView | None = None,
                  lead: bool = True, **publishers) -> AsyncIterator[LiveScheduler]:
    live = LiveScheduler(KubeApi(connect(fake.url)), settings, view, **publishers)
    await live.start()
    if lead:
        live.leading.set()
    stop = asyncio.Event()
    task = asyncio.create_task(live.run(stop))
    try:
        yield live
    finally:
        stop.set()
        await task
        await live.stop()


def pods(fake: FakeApiServer) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in fake.objects("pods")}


def gpus_of(pod: dict) -> list[dict]:
    return json.loads(pod["metadata"]["annotations"][annotations.ANN_GPUS])


def events(fake: FakeApiServer, reason: str) -> list[dict]:
    return [e for e in fake.objects("events") if e["reason"] == reason]


# --------------------------------------------------------------------------- translation (pure)
def test_pods_and_nodes_translate_to_the_core_model():
    node = objects.node_spec(make_node("n1", gpus=4, product="NVIDIA-A100-SXM4-80GB", cpu="32", memory="256Gi"))
    assert (node.name, node.gpus, node.model, node.cpu_milli, node.memory_mib) == ("n1", 4, "A100", 32000, 262144)
    assert node.gpu_memory_mib == 80 * 1024
    plain = objects.workload_of(make_pod("p", gpus=2, cpu="500m", memory="2Gi"), "t", 0.0).workload
    assert (plain.num_gpu, plain.gpu_milli, plain.cpu_milli, plain.memory_mib) == (2, 1000, 500, 2048)
    frac = objects.workload_of(make_pod("f", gpus=0, annotations={
        "gpuaware.io/gpu-milli": "250", "gpuaware.io/sharing": "mps", "gpuaware.io/gpu-models": "H100,A100",
        "gpuaware.io/gang": "g", "gpuaware.io/gang-size": "4"}, priority=200_000), "vision", 0.0)
    w = frac.workload
    assert (w.num_gpu, w.gpu_milli, w.models, w.priority, w.preemptible, w.gang, frac.gang_size) == \
        (1, 250, ("H100", "A100"), 2, False, "default/g", 4)
    assert w.labels == {"sharing": "mps"} and w.tenant == "vision"


@pytest.mark.parametrize(("annotations", "gpus", "message"), [
    ({"gpuaware.io/gpu-milli": "1500"}, 0, "gpuaware.io/gpu-milli: 1500 is outside 1..999"),
    ({"gpuaware.io/gpu-milli": "500"}, 2, "a fraction is of one GPU"),
    ({"gpuaware.io/sharing": "vgpu"}, 1, "gpuaware.io/sharing: 'vgpu' is not one of"),
    ({"gpuaware.io/preemptible": "maybe"}, 1, "gpuaware.io/preemptible: 'maybe' is not true or false"),
    ({"gpuaware.io/gang-size": "3"}, 1, "gpuaware.io/gang-size: needs gpuaware.io/gang"),
])
def test_bad_pod_requests_are_rejected_with_the_annotation(annotations, gpus, message):
    with pytest.raises(objects.PodSpecError, match=message.replace(".", r"\.").replace("(", r"\(")):
        objects.workload_of(make_pod("p", gpus=gpus, annotations=annotations), "t", 0.0)


# --------------------------------------------------------------------------- the fake behaves like the API server
def test_fake_api_server_refuses_a_second_binding_a_stale_update_and_a_pdb_violating_eviction():
    with FakeApiServer() as fake:
        api = KubeApi(connect(fake.url))
        fake.create("nodes", make_node("n1"))
        fake.create("pods", make_pod("p", labels={"app": "x"}))
        fake.create("pods", make_pod("q", labels={"app": "x"}))
        api.bind("default", "p", "n1")
        with pytest.raises(ApiException) as second:
            api.bind("default", "p", "n1")
        assert second.value.status == 409 and "already assigned to node" in json.loads(second.value.body)["message"]
        pod = api.read_pod("default", "p")
        stale = dict(pod, metadata={**pod["metadata"], "resourceVersion": "1"})
        with pytest.raises(ApiException) as conflict:
            api.core.replace_namespaced_pod("p", "default", stale, _preload_content=False)
        assert conflict.value.status == 409
        api.bind("default", "q", "n1")
        fake.create("poddisruptionbudgets", {"metadata": {"name": "x", "namespace": "default"},
                                             "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "x"}}}},
                    group="policy")
        with pytest.raises(ApiException) as blocked:
            api.evict("default", "p")
        body = json.loads(blocked.value.body)
        assert blocked.value.status == 429 and body["details"]["causes"][0]["reason"] == "DisruptionBudget"
        assert "p" in pods(fake)


def test_informer_relists_after_410_gone_and_follows_bookmarks():
    with FakeApiServer(window=5, bookmark_every_s=0.2) as fake:
        core = k8s.CoreV1Api(connect(fake.url))
        seen: dict[str, str] = {}
        syncs: list[int] = []

        def on_sync(items):
            syncs.append(len(items))
            seen.clear()
            seen.update({i["metadata"]["name"]: "SYNC" for i in items})

        inf = Informer(WatchSpec("nodes", core.list_node), on_sync,
                       lambda kind, obj: seen.__setitem__(obj["metadata"]["name"], kind), watch_timeout_s=30).start()
        try:
            assert inf.synced.wait(5)
            fake.create("nodes", make_node("a"))
            deadline = time.monotonic() + 5
            while "a" not in seen and time.monotonic() < deadline:
                time.sleep(0.02)
            assert seen["a"] == "ADDED"
            time.sleep(0.5)  # a bookmark moves the informer's resourceVersion to the head
            assert int(inf.resource_version) == fake.store.rv
            # Drop the informer's position out of the retained window: the next watch gets 410 and re-lists.
            inf.resource_version = "1"
            for i in range(10):
                fake.create("nodes", make_node(f"b{i}"))
            inf._resp.close() if inf._resp is not None else None
            deadline = time.monotonic() + 5
            while len(syncs) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(syncs) >= 2 and syncs[-1] == 11 and inf.relists >= 2
        finally:
            inf.stop()


# --------------------------------------------------------------------------- the custom scheduler
async def test_pending_pods_are_bound_to_the_gpus_the_core_chose_with_annotations_and_events():
    with FakeApiServer() as fake:
        for i in range(3):
            fake.create("nodes", make_node(f"n{i}", gpus=4))
        fake.create("pods", make_pod("whole", gpus=2))
        fake.create("pods", make_pod("frac", gpus=0, annotations={"gpuaware.io/gpu-milli": "300",
                                                                   "gpuaware.io/sharing": "mps"}))
        fake.create("pods", make_pod("other", gpus=1, scheduler="default-scheduler"))
        fake.create("pods", make_pod("bad", gpus=0, annotations={"gpuaware.io/gpu-milli": "5000"}))
        async with running(fake) as live:
            await wait_for(lambda: all(pods(fake)[n]["spec"].get("nodeName") for n in ("whole", "frac")),
                           what="binding")
            await wait_for(lambda: events(fake, "FailedScheduling"), what="FailedScheduling")
            # Events are written after the binding: wait for them too.
            await wait_for(lambda: len(events(fake, "Scheduled")) == 2, what="Scheduled events")
            p = pods(fake)
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
            (failed,) = events(fake, "FailedScheduling")
            assert failed["involvedObject"]["name"] == "bad" and "gpu-milli: 5000" in failed["message"]
            assert {e["involvedObject"]["name"] for e in events(fake, "Scheduled")} == {"whole", "frac"}
            live.cache.cluster.check_invariants()


async def test_restart_rebuilds_from_the_api_binds_nothing_twice_and_keeps_queue_order():
    with FakeApiServer() as fake:
        fake.create("nodes", make_node("n0", gpus=8))
        for i in range(6):
            fake.create("pods", make_pod(f"a{i}", gpus=1))
        async with running(fake):
            await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(fake).values()), what="first six")
        first = {n: gpus_of(p) for n, p in pods(fake).items()}
        # While no scheduler runs, four more arrive; two GPUs are left, so the two oldest must win.
        for i in range(4):
            fake.create("pods", make_pod(f"b{i}", gpus=1))
            time.sleep(1.05)  # distinct creation seconds: creationTimestamp has second precision
        posts_before = fake.store.requests.get("POST", 0)
        async with running(fake) as live:
            await wait_for(lambda: sum(1 for p in pods(fake).values() if p["spec"].get("nodeName")) == 8,
                           what="two more")
            await asyncio.sleep(0.3)
            assert live.stats.api_errors == {}  # no 409: nothing was bound twice
        p = pods(fake)
        assert {n for n, pod in p.items() if pod["spec"].get("nodeName")} == {*first, "b0", "b1"}
        used = [g["index"] for pod in p.values() if pod["spec"].get("nodeName") for g in gpus_of(pod)]
        assert sorted(used) == list(range(8))  # every GPU once: the restart saw the first six's GPUs
        assert all(gpus_of(p[n]) == first[n] for n in first)
        assert fake.store.requests["POST"] > posts_before


async def test_gang_is_placed_all_or_nothing():
    with FakeApiServer() as fake:
        fake.create("nodes", make_node("n0", gpus=4))
        gang = {"gpuaware.io/gang": "train", "gpuaware.io/gang-size": "3"}
        for i in range(2):
            fake.create("pods", make_pod(f"g{i}", gpus=2, annotations=gang))
        async with running(fake):
            await wait_for(lambda: len(events(fake, "FailedScheduling")) >= 2, what="gang waiting")
            assert not any(p["spec"].get("nodeName") for p in pods(fake).values())
            assert "2 of 3 members exist" in events(fake, "FailedScheduling")[0]["message"]
            fake.create("pods", make_pod("g2", gpus=2, annotations=gang))  # 6 GPUs asked, 4 exist
            await wait_for(lambda: any("none of its 3 members placed" in e["message"]
                                       for e in events(fake, "FailedScheduling")), what="gang refused")
            assert not any(p["spec"].get("nodeName") for p in pods(fake).values())
            fake.create("nodes", make_node("n1", gpus=4))
            await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(fake).values()), what="gang placed")


async def test_stale_gpu_state_takes_only_preemptible_work():
    now_ms = int(time.time() * 1000)
    view = StateView(stale_after_ms=60_000)
    view.learn(NodeState("n0", now_ms, None, None, [NodeGpu(f"GPU-n0-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY)
                                                    for g in range(2)], 2000, 0))
    for g in range(2):  # both GPUs last sampled 5 minutes ago
        view.learn(GpuState(f"GPU-n0-{g}", "n0", "H100", now_ms - 300_000, now_ms - 299_000, 10.0, 5.0, 100.0,
                            81920, 100.0, 50.0, 95.0, HealthBand.HEALTHY, {}, [], None, None, 1))
    with FakeApiServer() as fake:
        fake.create("nodes", make_node("n0", gpus=2))
        fake.create("pods", make_pod("critical-job", gpus=1, priority=200_000))  # high: not preemptible
        fake.create("pods", make_pod("batch-job", gpus=1))
        async with running(fake, view=view) as live:
            await wait_for(lambda: pods(fake)["batch-job"]["spec"].get("nodeName"), what="batch placed")
            await wait_for(lambda: events(fake, "FailedScheduling"), what="high refused")
            assert not pods(fake)["critical-job"]["spec"].get("nodeName")
            await wait_for(lambda: live.snapshot.stale_gpus == 2, what="gauges (refreshed every second)")
            assert "health" in events(fake, "FailedScheduling")[0]["message"]


async def test_gpu_turning_critical_on_the_broker_cordons_it_checkpoints_and_evicts_its_pods(
        kafka_settings: KafkaSettings, unique):
    node = f"crit-{unique}"
    uuids = [f"GPU-{unique}-{g}" for g in range(2)]
    now_ms = int(time.time() * 1000)
    producer = AIOKafkaProducer(**kafka_settings.producer_kwargs())
    await producer.start()

    async def publish_state(g: int, band: HealthBand, headers: list[tuple[str, bytes]] | None = None) -> None:
        ts = int(time.time() * 1000)
        await producer.send_and_wait(topics.GPU_STATE, encode(GpuState(
            uuids[g], node, "H100", ts, ts + 10, 50.0, 20.0, 1000.0, 81920, 300.0, 60.0,
            95.0 if band == HealthBand.HEALTHY else 10.0, band, {}, [], None, None, 1)), key=uuids[g].encode(),
            headers=headers)

    await producer.send_and_wait(topics.NODE_STATE, encode(NodeState(node, now_ms, None, None, [
        NodeGpu(u, g, "H100", 81920, 0, HealthBand.HEALTHY) for g, u in enumerate(uuids)], 2000, 0)),
        key=node.encode())
    for g in range(2):
        await publish_state(g, HealthBand.HEALTHY)
    view = StateView()
    feed = StateFeed(kafka_settings, view)
    await feed.start()
    await feed.catch_up()
    try:
        with FakeApiServer() as fake:
            fake.create("nodes", make_node(node, gpus=2))
            fake.create("pods", make_pod("ckpt", gpus=1, annotations={"gpuaware.io/checkpoint": "true"}))
            fake.create("pods", make_pod("plain", gpus=1))
            published: list[tuple[str, str]] = []

            async def capture(record) -> None:  # what scheduler.wiring publishes, with the same headers
                traceparent = dict(observability.inject_headers()).get("traceparent", b"").decode()
                published.append((str(record.action), traceparent))

            async with running(fake, view=view, decisions=capture) as live:
                await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(fake).values()), what="placed")
                on_gpu = {n: gpus_of(p)[0]["index"] for n, p in pods(fake).items()}
                assert {g["uuid"] for p in pods(fake).values() for g in gpus_of(p)} == set(uuids)
                victim = "ckpt"
                bad_gpu = on_gpu[victim]
                # The stream's state carries the trace begun at the agent's event.
                trace_id = "5a" * 16
                traceparent = f"00-{trace_id}-{'3' * 16}-01".encode()
                await publish_state(bad_gpu, HealthBand.CRITICAL, [("traceparent", traceparent)])
                # The workload is asked to checkpoint first; it answers through the documented annotation.
                await wait_for(
                    lambda: annotations.ANN_CHECKPOINT_REQUEST in pods(fake)[victim]["metadata"]["annotations"],
                    what="checkpoint request")
                assert victim in pods(fake)
                KubeApi(connect(fake.url)).annotate_pod("default", victim, {
                    annotations.ANN_CHECKPOINT_DONE: objects_time()})
                await wait_for(lambda: victim not in pods(fake), what="eviction")
                nodes = {n["metadata"]["name"]: n for n in fake.objects("nodes")}
                assert nodes[node]["metadata"]["annotations"][annotations.ANN_CORDONED] == str(bad_gpu)
                assert "plain" in pods(fake)  # the healthy GPU's pod stays
                assert any(e["involvedObject"]["name"] == victim for e in events(fake, "Migrated"))
                # Its replacement does not land on the critical GPU: it waits (the only other GPU is busy).
                fake.create("pods", make_pod("ckpt-2", gpus=1))
                await wait_for(lambda: any(e["involvedObject"]["name"] == "ckpt-2"
                                           for e in events(fake, "FailedScheduling")), what="replacement refused")
                assert not pods(fake)["ckpt-2"]["spec"].get("nodeName")
                assert live.stats.decisions[("MIGRATE", "gpu-critical")] == 1
                # Repaired: the operator releases the cordon and the GPU reports healthy; the waiting pod
                # lands there, and when the GPU turns critical again it is cordoned and moved again.
                await publish_state(bad_gpu, HealthBand.HEALTHY)
                KubeApi(connect(fake.url)).core.patch_node(node, {"metadata": {"annotations": {
                    annotations.ANN_CORDONED: None}}}, _content_type=MERGE_PATCH)
                await wait_for(lambda: pods(fake)["ckpt-2"]["spec"].get("nodeName"), what="placed after repair")
                assert gpus_of(pods(fake)["ckpt-2"])[0]["index"] == bad_gpu
                await publish_state(bad_gpu, HealthBand.CRITICAL)
                await wait_for(lambda: "ckpt-2" not in pods(fake), what="evicted again")
                nodes = {n["metadata"]["name"]: n for n in fake.objects("nodes")}
                assert nodes[node]["metadata"]["annotations"][annotations.ANN_CORDONED] == str(bad_gpu)
                assert live.stats.decisions[("MIGRATE", "gpu-critical")] == 2
                # The cordon and the migration continue that trace on scheduler.decisions.v1.
                actions = {a: tp for a, tp in published if a.endswith(("CORDON", "MIGRATE"))}
                assert len(actions) == 2 and all(tp.split("-")[1] == trace_id for tp in actions.values()), published
    finally:
        await feed.stop()
        await producer.stop()


def objects_time() -> str:
    from plumbing.kube.api import now_rfc3339

    return now_rfc3339()


def test_gpus_cordoned_at_once_are_all_kept_with_an_operators_own_cordon():
    """Several GPUs of one node turning critical together are cordoned by concurrent writers; a
    read-modify-write without the resourceVersion precondition keeps only the last writer's GPU."""
    from concurrent.futures import ThreadPoolExecutor

    with FakeApiServer() as fake:
        node = make_node("n0", gpus=8)
        node["metadata"]["annotations"] = {annotations.ANN_CORDONED: "7"}
        fake.create("nodes", node)
        apis = [KubeApi(connect(fake.url)) for _ in range(6)]
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda a: a[1].cordon_gpu("n0", a[0]), enumerate(apis)))
        (node,) = fake.objects("nodes")
        assert annotations.cordoned_gpus(node) == {0, 1, 2, 3, 4, 5, 7}
        assert node["metadata"]["annotations"][annotations.ANN_CORDONED] == "0,1,2,3,4,5,7"


async def test_preemption_evicts_lower_priority_work_for_high_priority_pods():
    with FakeApiServer() as fake:
        fake.create("nodes", make_node("n0", gpus=2))
        for i in range(2):
            fake.create("pods", make_pod(f"low{i}", gpus=1))
        async with running(fake) as live:
            await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(fake).values()), what="low placed")
            fake.create("pods", make_pod("high", gpus=1, priority=200_000))
            await wait_for(lambda: pods(fake).get("high", {}).get("spec", {}).get("nodeName"), what="high placed")
            assert sum(1 for n in pods(fake) if n.startswith("low")) == 1
            assert len(events(fake, "Preempted")) == 1
            await wait_for(lambda: live.stats.decisions[("PLACE", "preempted")] == 1, what="decision counted")


# --------------------------------------------------------------------------- leader election
async def test_only_one_replica_leads_and_another_takes_over_when_it_stops_renewing():
    with FakeApiServer() as fake:
        api = KubeApi(connect(fake.url))
        a = LeaderElector(api, "gpuaware", "gpuaware-scheduler", "a", lease_duration_s=2, renew_deadline_s=1.5,
                          retry_period_s=0.3)
        b = LeaderElector(api, "gpuaware", "gpuaware-scheduler", "b", lease_duration_s=2, renew_deadline_s=1.5,
                          retry_period_s=0.3)
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        ta, tb = asyncio.create_task(a.run(stop_a)), asyncio.create_task(b.run(stop_b))
        leaders = []
        for _ in range(20):
            await asyncio.sleep(0.1)
            leaders.append((a.leading.is_set(), b.leading.is_set()))
        assert all(not (x and y) for x, y in leaders) and any(x or y for x, y in leaders)
        first, second = (a, b) if a.leading.is_set() else (b, a)
        (stop_a if first is a else stop_b).set()
        await (ta if first is a else tb)
        await wait_for(lambda: second.leading.is_set(), timeout=6, what="takeover")
        lease = api.read_lease("gpuaware", "gpuaware-scheduler")
        assert lease["spec"]["holderIdentity"] == second.identity and lease["spec"]["leaseTransitions"] == 1
        (stop_b if second is b else stop_a).set()
        await (tb if second is b else ta)


# --------------------------------------------------------------------------- the extender
async def test_extender_answers_kube_scheduler_json():
    with FakeApiServer() as fake:
        for i in range(3):
            fake.create("nodes", make_node(f"n{i}", gpus=2))
        fake.create("pods", make_pod("busy", gpus=2, scheduler="default-scheduler"))
        KubeApi(connect(fake.url)).bind("default", "busy", "n0")
        fake.create("pods", make_pod("half", gpus=1, scheduler="default-scheduler"))
        KubeApi(connect(fake.url)).bind("default", "half", "n1")
        async with running(fake, lead=False) as live:
            await wait_for(lambda: len(live.cache.running) == 2, what="cache")
            ext = Extender(live.cache, live.passes.core, lambda: True)
            async with TestClient(TestServer(ext.app())) as http:
                nodes = [make_node(f"n{i}", gpus=2) for i in range(3)] + [make_node("unknown")]
                pod = make_pod("new", gpus=1, scheduler="default-scheduler")
                res = await (await http.post("/filter", json={"Pod": pod, "Nodes": {"items": nodes},
                                                              "NodeNames": None})).json()
                assert set(res) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
                assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["n1", "n2"]
                assert set(res["FailedNodes"]) == {"n0", "unknown"} and res["Error"] == ""
                res = await (await http.post("/filter", json={"Pod": pod, "NodeNames": ["n0", "n2"]})).json()
                assert res["NodeNames"] == ["n2"]
                prio = await (await http.post("/prioritize", json={"Pod": pod, "NodeNames": ["n1", "n2"]})).json()
                assert {p["Host"] for p in prio} == {"n1", "n2"} and all(0 <= p["Score"] <= 10 for p in prio)
                scores = {p["Host"]: p["Score"] for p in prio}
                assert scores["n1"] > scores["n2"]  # filling the half-used node keeps a whole one free
                plain = make_pod("cpu-only", gpus=0, scheduler="default-scheduler")
                res = await (await http.post("/filter", json={"Pod": plain, "NodeNames": ["n0", "n1"]})).json()
                assert res["NodeNames"] == ["n0", "n1"] and res["FailedNodes"] == {}
                uid = live.cache.pods["default/busy"]["metadata"]["uid"]
                res = await (await http.post("/preempt", json={
                    "Pod": make_pod("vip", gpus=2, scheduler="default-scheduler"),
                    "NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": uid}], "NumPDBViolations": 0},
                                              "n1": {"Pods": [], "NumPDBViolations": 0}}})).json()
                assert list(res["NodeNameToMetaVictims"]) == ["n0"]
                bad = await http.post("/filter", data=b"not json")
                assert bad.status == 400
                assert (await http.get("/healthz")).status == 200 and (await http.get("/readyz")).status == 200


# --------------------------------------------------------------------------- tenants, queue status, throttling
async def test_tenant_comes_from_the_namespace_queue_and_queue_status_is_kept_current():
    with FakeApiServer() as fake:
        fake.create("nodes", make_node("n0", gpus=4, product="NVIDIA-A100-SXM4-80GB"))
        fake.create("gpuqueues", {"metadata": {"name": "vision"}, "spec": {
            "tenant": "vision", "namespaces": ["vision-train"], "weight": 2, "quota": [{"model": "*", "gpus": 1}]}},
            group="gpuaware.io", version="v1alpha1")
        # A pod cannot name its tenant: the annotation is not part of the contract and is ignored.
        fake.create("pods", make_pod("a", namespace="vision-train", gpus=2,
                                     annotations={"gpuaware.io/tenant": "someone-else"}))
        fake.create("pods", make_pod("b", namespace="other", gpus=1))
        settings = FAST.model_copy(update={"queue_status_every_s": 0.1})
        async with running(fake, settings) as live:
            await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(fake).values()), what="placed")
            assert live.cache.running["vision-train/a"].workload.tenant == "vision"
            assert live.cache.running["other/b"].workload.tenant == "default"

            def status():
                (q,) = fake.objects("gpuqueues", group="gpuaware.io", version="v1alpha1")
                return q.get("status") or {}

            await wait_for(lambda: status().get("running") == 1, what="queue status")
            assert status()["quotaUsed"] == [{"model": "A100", "gpus": 2.0}]
            assert status()["borrowedGpus"] == 1.0  # 2 GPUs on a quota of 1
            await wait_for(lambda: live.snapshot.gpus_used == {"vision": 2.0, "default": 1.0}, what="gauges")


async def test_hot_gpu_gets_a_power_cap_on_the_control_topic_and_it_is_lifted_when_cool():
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

    with FakeApiServer() as fake:
        fake.create("nodes", make_node("n0", gpus=2))
        settings = FAST.model_copy(update={"throttle_every_s": 0.1})
        async with running(fake, settings, view=view, control=control) as live:
            await wait_for(lambda: sent, what="power cap")
            (cap,) = sent
            assert (cap.target, cap.gpu_uuid, cap.kind.value) == ("n0", "GPU-hot-0", "POWER_CAP")
            assert cap.power_cap_w == 420  # 70% of its 600 W draw
            view.learn(state(0, 70.0))
            await wait_for(lambda: len(sent) == 2, what="cap lifted")
            assert sent[1].gpu_uuid == "GPU-hot-0" and sent[1].power_cap_w == 0
            assert live.stats.decisions[("THROTTLE", "thermal")] == 1
