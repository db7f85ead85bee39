"""The scheduler with its neighbours: its process on the real kube-apiserver as its ServiceAccount; the live one
fed GPU health by a broker."""

from __future__ import annotations

import subprocess
import time

from aiokafka import AIOKafkaProducer

from gpuaware.contract import annotations, topics
from gpuaware.contract.events import GpuState, HealthBand, NodeGpu, NodeState, encode
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.plumbing import observability
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.plumbing.kube.api import MERGE_PATCH, KubeApi
from gpuaware.scheduler.feed import StateFeed, StateView
from tests.support import ENV, GPUAWARE, events, gpus_of, pods, running, wait_for


async def test_gpu_turning_critical_on_the_broker_cordons_it_checkpoints_and_evicts_its_pods(
        kafka_settings: KafkaSettings, unique, kube):
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
        kube.create("nodes", make_node(node, gpus=2))
        kube.create("pods", make_pod("ckpt", gpus=1, annotations={"gpuaware.io/checkpoint": "true"}))
        kube.create("pods", make_pod("plain", gpus=1))
        published: list[tuple[str, str]] = []

        async def capture(record) -> None:  # what gpuaware.scheduler.wiring publishes, with the same headers
            traceparent = dict(observability.inject_headers()).get("traceparent", b"").decode()
            published.append((str(record.action), traceparent))

        async with running(kube, view=view, decisions=capture) as live:
            await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(kube).values()), what="placed")
            on_gpu = {n: gpus_of(p)[0]["index"] for n, p in pods(kube).items()}
            assert {g["uuid"] for p in pods(kube).values() for g in gpus_of(p)} == set(uuids)
            victim = "ckpt"
            bad_gpu = on_gpu[victim]
            # The stream's state carries the trace begun at the agent's event.
            trace_id = "5a" * 16
            traceparent = f"00-{trace_id}-{'3' * 16}-01".encode()
            await publish_state(bad_gpu, HealthBand.CRITICAL, [("traceparent", traceparent)])
            # The workload is asked to checkpoint first; it answers through the documented annotation.
            await wait_for(
                lambda: annotations.ANN_CHECKPOINT_REQUEST in pods(kube)[victim]["metadata"]["annotations"],
                what="checkpoint request")
            assert victim in pods(kube)
            KubeApi(kube.admin).annotate_pod("default", victim, {
                annotations.ANN_CHECKPOINT_DONE: objects_time()})
            await wait_for(lambda: victim not in pods(kube), what="eviction")
            nodes = {n["metadata"]["name"]: n for n in kube.objects("nodes")}
            assert nodes[node]["metadata"]["annotations"][annotations.ANN_CORDONED] == str(bad_gpu)
            assert "plain" in pods(kube)  # the healthy GPU's pod stays
            assert any(e["involvedObject"]["name"] == victim for e in events(kube, "Migrated"))
            # Its replacement does not land on the critical GPU: it waits (the only other GPU is busy).
            kube.create("pods", make_pod("ckpt-2", gpus=1))
            await wait_for(lambda: any(e["involvedObject"]["name"] == "ckpt-2"
                                       for e in events(kube, "FailedScheduling")), what="replacement refused")
            assert not pods(kube)["ckpt-2"]["spec"].get("nodeName")
            assert live.stats.decisions[("MIGRATE", "gpu-critical")] == 1
            # Repaired: the operator releases the cordon and the GPU reports healthy; the waiting pod
            # lands there, and when the GPU turns critical again it is cordoned and moved again.
            await publish_state(bad_gpu, HealthBand.HEALTHY)
            KubeApi(kube.admin).core.patch_node(node, {"metadata": {"annotations": {
                annotations.ANN_CORDONED: None}}}, _content_type=MERGE_PATCH)
            await wait_for(lambda: pods(kube)["ckpt-2"]["spec"].get("nodeName"), what="placed after repair")
            assert gpus_of(pods(kube)["ckpt-2"])[0]["index"] == bad_gpu
            await publish_state(bad_gpu, HealthBand.CRITICAL)
            await wait_for(lambda: "ckpt-2" not in pods(kube), what="evicted again")
            nodes = {n["metadata"]["name"]: n for n in kube.objects("nodes")}
            assert nodes[node]["metadata"]["annotations"][annotations.ANN_CORDONED] == str(bad_gpu)
            assert live.stats.decisions[("MIGRATE", "gpu-critical")] == 2
            # The cordon and the migration continue that trace on scheduler.decisions.v1.
            actions = {a: tp for a, tp in published if a.endswith(("CORDON", "MIGRATE"))}
            assert len(actions) == 2 and all(tp.split("-")[1] == trace_id for tp in actions.values()), published
    finally:
        await feed.stop()
        await producer.stop()


def objects_time() -> str:
    from gpuaware.plumbing.kube.api import now_rfc3339

    return now_rfc3339()


def test_scheduler_process_as_its_serviceaccount_binds_pods_on_the_real_apiserver(kube):
    """The scheduler process on kube-apiserver v1.36.3 with kwok nodes, acting as the ``gpuaware-scheduler``
    ServiceAccount with exactly the shipped RBAC and admission policies: Bindings (pod UID precondition,
    the GPU annotations carried onto the pod), Events, its metrics and extender, SIGTERM."""
    import signal
    import urllib.request

    from gpuaware.local.processes import free_port

    metrics, extender = free_port(), free_port()
    kube.create("nodes", make_node("n0", gpus=4))
    for i in range(3):
        kube.create("pods", make_pod(f"p{i}", gpus=1))
    account = kube.accounts["gpuaware-scheduler"]
    proc = subprocess.Popen([*GPUAWARE, "scheduler", "--no-state-feed", "--metrics-port", str(metrics),
                             "--extender-port", str(extender)],
                            env={**ENV, "KUBECONFIG": str(account)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(p["spec"].get("nodeName") for p in kube.objects("pods")):
            time.sleep(0.2)
        got = kube.objects("pods")
        assert all(p["spec"].get("nodeName") == "n0" for p in got), [p["spec"].get("nodeName") for p in got]
        gpus = sorted(p["metadata"]["annotations"].get(annotations.ANN_GPUS) for p in got)
        assert len(set(gpus)) == 3 and None not in gpus, gpus  # three different GPUs, on the pods
        # The decision is counted when the Binding call returns, a moment after the API server shows the node.
        placed = 'gpuaware_scheduler_decisions_total{action="PLACE",reason="fits"} 3.0'
        deadline = time.monotonic() + 10
        while True:
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
            if placed in text or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert placed in text
        assert "gpuaware_scheduler_leader 1.0" in text
        assert urllib.request.urlopen(f"http://127.0.0.1:{extender}/readyz", timeout=5).status == 200
        # No call the shipped RBAC or admission policies refused (nor any other failed call).
        assert not [line for line in text.splitlines() if line.startswith("gpuaware_scheduler_api_errors_total{")]
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
