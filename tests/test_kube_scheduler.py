"""The extender's HTTP API as kube-scheduler calls it, on a live scheduler's cache of the fake API server (the
extender tests left of the old file, to join tests/scheduler/kube/test_extender.py)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from gpuaware.local.fake_apiserver import FakeApiServer, make_node, make_pod
from plumbing.kube.api import KubeApi, connect
from scheduler.kube.extender import Extender
from tests.support import running, wait_for


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
