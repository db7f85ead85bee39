"""The kube-scheduler extender: status codes per verb, node-cache-capable requests, the shipped
kube-scheduler configuration, TLS / mTLS / bearer token, the body limit, and malformed bodies."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.local.kube_control_plane import _Pki
from gpuaware.local.processes import free_port
from gpuaware.plumbing.kube.api import KubeApi
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.extender import access as extender_access
from gpuaware.scheduler.kube.extender import args as extender_args
from gpuaware.scheduler.kube.extender import offload
from gpuaware.scheduler.kube.extender.access import Access, server_context
from gpuaware.scheduler.kube.extender.server import Extender
from gpuaware.scheduler.metrics import QueueSnapshot, SchedulerCollector, SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings
from tests.support import REPO, running, wait_for

SCHEDULER_YAML = REPO / "deploy" / "base" / "scheduler" / "scheduler.yaml"
VERBS = ("filter", "prioritize", "preempt")


# --------------------------------------------------------------------------- helpers
def cluster() -> ClusterCache:
    """n0 full (a 2-GPU pod on 2 GPUs), n1 half used, n2 empty; n3 is an A100 node."""
    cache = ClusterCache()
    cache.sync_nodes([make_node(f"n{i}", gpus=2) for i in range(3)]
                     + [make_node("n3", gpus=2, product="NVIDIA-A100-SXM4-80GB")])
    bound = []
    for name, gpus, node in (("busy", 2, "n0"), ("half", 1, "n1")):
        pod = make_pod(name, gpus=gpus, scheduler="default-scheduler")
        pod["metadata"]["uid"] = f"uid-{name}"
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
        bound.append(pod)
    cache.sync_pods(bound)
    return cache


def make_extender(cache: ClusterCache | None = None, **kw: Any) -> Extender:
    core = Scheduler(profile("gpuaware", WorkloadMix(), 0))
    return Extender(cache or cluster(), lambda: core, lambda: True, **kw)


@contextlib.contextmanager
def served(ext: Extender, ssl_context: ssl.SSLContext | None = None) -> Iterator[int]:
    """The extender's app on a real loopback port, on its own loop in a thread (as kube-scheduler sees it)."""
    loop = asyncio.new_event_loop()
    port = free_port()
    runner = web.AppRunner(ext.app(), access_log=None)
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="extender-loop", daemon=True)
    thread.start()
    assert started.wait(10), "extender did not start"
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(90)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def post(port: int, path: str, body: bytes | dict | list, *, context: ssl.SSLContext | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30) if context
            else http.client.HTTPConnection("127.0.0.1", port, timeout=30))
    try:
        conn.request("POST" if path != "/healthz" else "GET", path, body=raw if path != "/healthz" else None,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, data.decode(errors="replace")


def gpu_pod(name: str = "new", **kw: Any) -> dict:
    return make_pod(name, scheduler="default-scheduler", **kw)


# --------------------------------------------------------------------------- 1. status codes per verb
@pytest.mark.parametrize("verb", VERBS)
def test_an_internal_error_is_a_500_not_a_200_that_reads_as_no_candidates(verb, monkeypatch):
    ext = make_extender()

    def boom(args: dict) -> Any:
        raise RuntimeError("cache exploded")

    monkeypatch.setattr(ext, verb, boom)
    with served(ext) as port:
        status, body = post(port, f"/{verb}", {"Pod": gpu_pod(), "NodeNames": ["n1"],
                                               "NodeNameToMetaVictims": {}})
    # kube-scheduler's HTTPExtender.send(): any status but 200 is an error (ignorable: the extender is
    # skipped); a 200 {"Error"} to /preempt decodes as an ExtenderPreemptionResult without candidates.
    assert status == 500, (status, body)
    assert "cache exploded" in str(body)
    assert ext.requests[(verb, 500)] == 1


def test_an_invalid_gpuaware_request_fails_every_node_unresolvably_and_gets_no_score():
    ext = make_extender()
    bad = gpu_pod(annotations={"gpuaware.io/gpu-milli": "5000"})
    with served(ext) as port:
        status, res = post(port, "/filter", {"Pod": bad, "NodeNames": ["n1", "n2"]})
        # Not "Error": an ignorable extender's error is skipped by kube-scheduler and the pod bound anyway.
        assert status == 200 and res["Error"] == "" and res["NodeNames"] == [] and not res["FailedNodes"]
        assert set(res["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
        assert "gpuaware.io/gpu-milli: 5000 is outside" in res["FailedAndUnresolvableNodes"]["n1"]
        status, res = post(port, "/filter", {"Pod": bad, "Nodes": {"items": [{"metadata": {"name": "n1"}}]}})
        assert status == 200 and res["Nodes"]["items"] == [] and set(res["FailedAndUnresolvableNodes"]) == {"n1"}
        status, prio = post(port, "/prioritize", {"Pod": bad, "NodeNames": ["n1", "n2"]})
        assert status == 200 and prio == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 0}]


def test_prioritize_scores_from_its_filters_ranking_of_the_same_pod_and_ranks_anew_otherwise():
    core = Scheduler(profile("gpuaware", WorkloadMix(), 0))
    ranked = []
    rank = core.rank
    core.rank = lambda *a, **kw: ranked.append(1) or rank(*a, **kw)
    ext = Extender(cluster(), lambda: core, lambda: True)
    pod = gpu_pod(annotations={"gpuaware.io/gpu-milli": "500"})
    pod["metadata"]["uid"] = "uid-new"
    args = {"Pod": pod, "NodeNames": ["n0", "n1", "n2", "n3"]}
    kept = ext.filter(args)["NodeNames"]
    assert len(ranked) == 1
    scores = ext.prioritize({"Pod": pod, "NodeNames": kept})
    assert len(ranked) == 1  # the filter's ranking, one scheduling cycle
    assert ext.prioritize({"Pod": pod, "NodeNames": kept}) == scores and len(ranked) == 2  # used once
    ext.filter(args)
    other = gpu_pod("other", annotations={"gpuaware.io/gpu-milli": "500"})
    other["metadata"]["uid"] = "uid-other"
    ext.prioritize({"Pod": other, "NodeNames": kept})
    assert len(ranked) == 4  # its own ranking, not the one the last /filter made for another pod


def test_filter_ranks_only_the_nodes_kube_scheduler_asks_about():
    """kube-scheduler sends a share of the nodes (percentageOfNodesToScore): only those are scored."""
    core = Scheduler(profile("gpuaware", WorkloadMix(), 0))
    asked = []
    rank = core.rank
    core.rank = lambda c, w, mask=None, among=None: asked.append(among.copy()) or rank(c, w, mask, among)
    ext = Extender(cluster(), lambda: core, lambda: True)
    pod = gpu_pod(annotations={"gpuaware.io/gpu-milli": "500"})
    pod["metadata"]["uid"] = "uid-new"
    res = ext.filter({"Pod": pod, "NodeNames": ["n1", "n2"]})
    assert [ext.cache.cluster.names[i] for i in asked[0].nonzero()[0]] == ["n1", "n2"]
    assert res["NodeNames"] == ["n1", "n2"]
    assert ext.prioritize({"Pod": pod, "NodeNames": ["n3"]}) == [{"Host": "n3", "Score": 0}]  # not ranked


def test_one_node_keeps_the_node_the_core_would_pick_so_kube_scheduler_skips_scoring():
    """``extender_one_node`` (shipped): of the nodes where the pod fits, /filter keeps the core's pick, the one
    ``schedule`` takes; kube-scheduler, left one feasible node, binds it without scoring or /prioritize."""
    core = Scheduler(profile("gpuaware", WorkloadMix(), 0))
    ext = Extender.from_settings(cluster(), lambda: core, lambda: True, SchedulerSettings(extender_port=0))
    assert ext.one_node
    half = gpu_pod(annotations={"gpuaware.io/gpu-milli": "500"})
    half["metadata"]["uid"] = "uid-half"
    alone = cluster()
    picked = Scheduler(profile("gpuaware", WorkloadMix(), 0)).schedule(alone.cluster, alone.parse(half).workload)
    res = ext.filter({"Pod": half, "NodeNames": ["n0", "n1", "n2", "n3"]})
    assert res["NodeNames"] == [alone.cluster.names[picked.allocation.node]] and res["FailedNodes"] == {}
    assert ext.prioritize({"Pod": half, "NodeNames": res["NodeNames"]}) == [{"Host": res["NodeNames"][0],
                                                                             "Score": 10}]
    # Nowhere to go: every node fails with the core's reason, as without it.
    res = ext.filter({"Pod": gpu_pod(gpus=2), "NodeNames": ["n0", "n1"]})
    assert res["NodeNames"] == [] and set(res["FailedNodes"]) == {"n0", "n1"}
    # A pod gpuaware has no say about passes everywhere.
    res = ext.filter({"Pod": gpu_pod(gpus=0), "NodeNames": ["n0", "n1", "n2"]})
    assert res["NodeNames"] == ["n0", "n1", "n2"]
    assert not Extender.from_settings(cluster(), lambda: core, lambda: True,
                                      SchedulerSettings(extender_port=0, extender_one_node=False)).one_node


def until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def one_node_extender(cache: ClusterCache | None = None, **kw: Any) -> Extender:
    core = Scheduler(profile("gpuaware", WorkloadMix(), 0))
    return Extender(cache or cluster(), lambda: core, lambda: True, one_node=True, **kw)


def test_one_node_filter_reserves_the_gpus_it_picked_so_the_next_filter_sees_them_taken():
    """kube-scheduler binds a pod a few milliseconds after its cycle, while the next pod's /filter is asked: the
    GPUs are held from the first pod's /filter on, so the second is not given them."""
    ext = one_node_extender()
    first, second = gpu_pod("first", gpus=1), gpu_pod("second", gpus=1)
    # n1 has one GPU free, n0 none: only one of the two fits.
    assert ext.filter({"Pod": first, "NodeNames": ["n0", "n1"]})["NodeNames"] == ["n1"]
    assert ext.cache.assumed["default/first"].node == "n1"
    res = ext.filter({"Pod": second, "NodeNames": ["n0", "n1"]})
    assert res["NodeNames"] == [] and set(res["FailedNodes"]) == {"n0", "n1"}
    # Asked again (kube-scheduler retries the pod), its earlier reservation goes first: the same GPU is free for it.
    assert ext.filter({"Pod": first, "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
    assert list(ext.cache.assumed) == ["default/first"]


def test_a_reservation_whose_bind_never_comes_lets_its_gpus_go_back():
    ext = one_node_extender(bind_wait_s=0.05)
    assert ext.filter({"Pod": gpu_pod("first", gpus=1), "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
    assert ext.filter({"Pod": gpu_pod("second", gpus=1), "NodeNames": ["n1"]})["NodeNames"] == []
    time.sleep(0.06)  # no /bind for "first" (a later plugin of kube-scheduler refused the node)
    assert ext.filter({"Pod": gpu_pod("second", gpus=1), "NodeNames": ["n1"]})["NodeNames"] == ["n1"]
    assert list(ext.cache.assumed) == ["default/second"]


def test_a_pod_filtered_again_while_its_binding_is_in_flight_keeps_its_node_and_is_not_allocated_twice():
    """kube-scheduler gives up on a /bind after its httpTimeout and tries the pod again while the Binding may still
    land: the answer is the node the pod holds, not a second allocation (which raised: a 500)."""
    ext = one_node_extender()
    pod = gpu_pod("first", gpus=1)
    assert ext.filter({"Pod": pod, "NodeNames": ["n1", "n2"]})["NodeNames"] == [node := ext.cache.assumed[
        "default/first"].node]
    ext._reserved.pop("default/first")  # as /bind does before it writes the Binding
    free = ext.cache.cluster.gpu_free.copy()
    assert ext.filter({"Pod": pod, "NodeNames": ["n1", "n2"]})["NodeNames"] == [node]
    assert (ext.cache.cluster.gpu_free == free).all() and list(ext.cache.assumed) == ["default/first"]


def test_reservations_lapse_on_time_while_served_even_with_no_request_after_them():
    ext = one_node_extender(bind_wait_s=0.1)
    with served(ext) as port:
        status, res = post(port, "/filter", {"Pod": gpu_pod("last", gpus=1), "NodeNames": ["n1"]})
        assert status == 200 and res["NodeNames"] == ["n1"]
        assert "default/last" in ext.cache.assumed
        until(lambda: not ext.cache.assumed)


def _serve_order(ext: Extender, args: dict) -> list[str]:
    """Whether other ready work on the loop ran before ``ext``'s /filter answer was made ("answered" first: not)."""
    async def scenario() -> list[str]:
        order: list[str] = []
        body = StreamReader(mock.Mock(_reading_paused=False), 2 ** 16, loop=asyncio.get_running_loop())
        body.feed_data(json.dumps(args).encode())
        body.feed_eof()
        request = make_mocked_request("POST", "/filter", headers={"Content-Type": "application/json"}, payload=body)

        async def other() -> None:
            order.append("other")

        task = asyncio.create_task(other())  # ready: it runs at the loop's next turn
        response = await ext._serve(request)
        order.append("answered")
        await task
        assert response.status == 200
        return order
    return asyncio.run(scenario())


def test_a_filter_answer_is_not_held_behind_other_ready_work():
    """kube-scheduler waits for /filter inside its one-pod-at-a-time cycle: the answer is made and handed on without
    giving the loop to whatever else is ready first (informer events, /bind completions), which added their work to
    every /filter. An answer that echoes Node objects (nodeCacheCapable: false) still lets them run between making
    it and writing it."""
    names = {"Pod": gpu_pod("first", gpus=1), "NodeNames": ["n1", "n2"]}
    assert _serve_order(one_node_extender(), names) == ["answered", "other"]
    nodes = {"Pod": gpu_pod("second", gpus=1), "Nodes": {"items": [make_node("n1", gpus=2), make_node("n2", gpus=2)]}}
    assert _serve_order(make_extender(), nodes) == ["other", "answered"]


# --------------------------------------------------------------------------- 2. nodeCacheCapable
def test_node_cache_capable_requests_get_names_back_from_the_extenders_own_cache():
    ext = make_extender()
    with served(ext) as port:
        status, res = post(port, "/filter", {"Pod": gpu_pod(gpus=2), "NodeNames": ["n0", "n1", "n2", "ghost"]})
        assert status == 200
        assert res["NodeNames"] == ["n2"] and res["Nodes"] is None and res["Error"] == ""
        assert set(res["FailedNodes"]) == {"n0", "n1", "ghost"}
        assert "not yet seen" in res["FailedNodes"]["ghost"]
        # kube-scheduler (nodeCacheCapable) sends NodeNameToMetaVictims: UIDs only.
        status, res = post(port, "/preempt", {"Pod": gpu_pod(gpus=2), "NodeNameToMetaVictims": {
            "n0": {"Pods": [{"UID": "uid-busy"}], "NumPDBViolations": 0},
            "n1": {"Pods": [], "NumPDBViolations": 0}}})
        assert status == 200 and list(res["NodeNameToMetaVictims"]) == ["n0"]


def shipped_extender_config() -> tuple[dict, dict]:
    """The KubeSchedulerConfiguration and the kubeadm static-pod patch of the shipped ConfigMap."""
    (cm,) = [d for d in yaml.safe_load_all(SCHEDULER_YAML.read_text())
             if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpuaware-kube-scheduler-extender"]
    patch = cm["data"].get("kube-scheduler.strategic.yaml")
    return yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"]), yaml.safe_load(patch) if patch else {}


def test_the_shipped_extender_is_node_cache_capable():
    (ext,) = shipped_extender_config()[0]["extenders"]
    assert ext["nodeCacheCapable"] is True


# --------------------------------------------------------------------------- 3. which pods reach it
def is_interested(extender: dict, pod: dict) -> bool:
    """kube-scheduler's HTTPExtender.IsInterested (pkg/scheduler/extender.go), in Python."""
    managed = {r["name"] for r in extender.get("managedResources") or []}
    if not managed:
        return True
    spec = pod["spec"]
    return any(name in managed for c in spec.get("containers", []) + spec.get("initContainers", [])
               for part in ("requests", "limits") for name in (c.get("resources") or {}).get(part) or {})


def test_fractional_only_and_whole_gpu_pods_both_reach_the_shipped_extender():
    (ext,) = shipped_extender_config()[0]["extenders"]
    fractional = gpu_pod("frac", gpus=0, annotations={"gpuaware.io/gpu-milli": "250"})
    assert is_interested(ext, fractional)
    assert is_interested(ext, gpu_pod("whole", gpus=1))


# --------------------------------------------------------------------------- 4. a host-network kube-scheduler
def test_a_host_network_kube_scheduler_can_resolve_and_reach_the_shipped_url():
    config, patch = shipped_extender_config()
    (ext,) = config["extenders"]
    host = ext["urlPrefix"].split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
    if host.endswith(".svc") or ".svc." in host:
        # A cluster-DNS name: kube-scheduler's static pod must use cluster DNS although on the host network.
        assert patch.get("spec", {}).get("dnsPolicy") == "ClusterFirstWithHostNet", patch
    policies = [d for d in yaml.safe_load_all((REPO / "deploy/base/networkpolicies.yaml").read_text())
                if d and d["metadata"]["name"] == "extender-from-kube-scheduler"]
    (policy,) = policies
    port = int(ext["urlPrefix"].rsplit(":", 1)[1].strip("/"))
    rules = [r for r in policy["spec"]["ingress"] if any(p["port"] == port for p in r.get("ports", []))]
    # A host-network client has its node's IP: a namespaceSelector never matches it.
    assert any(not r.get("from") or any("ipBlock" in f for f in r["from"]) for r in rules), rules


def test_tls_files_named_in_the_shipped_config_are_mounted_into_kube_scheduler():
    config, patch = shipped_extender_config()
    (ext,) = config["extenders"]
    assert ext["enableHTTPS"] is True
    tls = ext["tlsConfig"]
    assert not tls.get("insecure") and {"certFile", "keyFile", "caFile"} <= set(tls)
    (container,) = patch["spec"]["containers"]
    mounted = [m["mountPath"] for m in container["volumeMounts"]]
    for f in (tls["certFile"], tls["keyFile"], tls["caFile"]):
        assert any(f.startswith(m.rstrip("/") + "/") for m in mounted), (f, mounted)


def test_an_ignorable_extender_has_alerts_for_its_errors_and_for_being_bypassed():
    (ext,) = shipped_extender_config()[0]["extenders"]
    assert ext["ignorable"] is True  # every pod reaches it: a gpuaware outage must not stop all scheduling
    rules = yaml.safe_load((REPO / "gpuaware/dashboards/prometheus/rules.yml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert "gpuaware_scheduler_extender_requests_total" in exprs.get("SchedulerExtenderErrors", "")
    assert "scheduler_schedule_attempts_total" in exprs.get("SchedulerExtenderBypassed", "")


def test_requests_are_counted_by_verb_and_code_for_the_alerts():
    stats = SchedulerStats()
    ext = make_extender(stats=stats)
    with served(ext) as port:
        post(port, "/filter", {"Pod": gpu_pod(), "NodeNames": ["n1"]})
        post(port, "/filter", b"{")
    fams = {f.name: f for f in SchedulerCollector(stats, QueueSnapshot).collect()}
    samples = {tuple(sorted(s.labels.items())): s.value
               for s in fams["gpuaware_scheduler_extender_requests"].samples if s.name.endswith("_total")}
    assert samples[(("code", "200"), ("verb", "filter"))] == 1
    assert samples[(("code", "400"), ("verb", "filter"))] == 1


# --------------------------------------------------------------------------- 5. TLS, mTLS, token, body size
@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pki")
    ours, other = _Pki(root / "ours"), _Pki(root / "other")
    cert, key = ours.server("extender", "gpuaware-scheduler-extender",
                            ["DNS:gpuaware-scheduler-extender.gpuaware.svc", "DNS:localhost", "IP:127.0.0.1"])
    client, client_key = ours.client("kube-scheduler", "system:kube-scheduler")
    stranger, stranger_key = other.client("stranger", "someone")
    token = root / "token"
    token.write_text("s3cret-token\n")
    return {"ca": ours.ca_cert, "cert": cert, "key": key, "client": client, "client_key": client_key,
            "stranger": stranger, "stranger_key": stranger_key, "token": token}


def client_context(pki: dict[str, Path], cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert:
        ctx.load_cert_chain(str(pki[cert]), str(pki[cert + "_key"]))
    return ctx


def test_mtls_admits_kube_schedulers_client_certificate_and_refuses_others(pki):
    s = SchedulerSettings(extender_tls_cert_file=str(pki["cert"]), extender_tls_key_file=str(pki["key"]),
                          extender_client_ca_file=str(pki["ca"]))
    ext = make_extender(access=Access.from_settings(s))
    body = {"Pod": gpu_pod(), "NodeNames": ["n1", "n2"]}
    with served(ext, server_context(s)) as port:
        assert post(port, "/filter", body, context=client_context(pki, "client"))[0] == 200
        status, res = post(port, "/filter", body, context=client_context(pki))
        assert status == 401 and "client certificate" in res["Error"]
        with pytest.raises((ssl.SSLError, ConnectionError)):
            post(port, "/filter", body, context=client_context(pki, "stranger"))
        # Probes (the kubelet presents no certificate) still work.
        assert post(port, "/healthz", b"", context=client_context(pki))[0] == 200


def test_a_bearer_token_admits_other_callers_and_is_compared_in_constant_time(pki, monkeypatch):
    compared: list[tuple[bytes, bytes]] = []
    real = extender_access.hmac.compare_digest
    monkeypatch.setattr(extender_access.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    s = SchedulerSettings(extender_tls_cert_file=str(pki["cert"]), extender_tls_key_file=str(pki["key"]),
                          extender_client_ca_file=str(pki["ca"]), extender_token_file=str(pki["token"]))
    ext = make_extender(access=Access.from_settings(s))
    body = {"Pod": gpu_pod(), "NodeNames": ["n1"]}
    with served(ext, server_context(s)) as port:
        ctx = client_context(pki)
        assert post(port, "/filter", body, context=ctx, headers={"Authorization": "Bearer s3cret-token"})[0] == 200
        assert post(port, "/filter", body, context=ctx, headers={"Authorization": "Bearer nope"})[0] == 401
        assert post(port, "/filter", body, context=ctx)[0] == 401
    assert compared and all(b == b"s3cret-token" for _, b in compared)


@pytest.mark.parametrize(("fields", "named"), [
    ({"extender_tls_cert_file": "CERT"}, "extender_tls_key_file"),
    ({"extender_tls_key_file": "KEY"}, "extender_tls_cert_file"),
    ({"extender_client_ca_file": "CA"}, "extender_client_ca_file"),
    ({"extender_tls_cert_file": "/nonexistent.crt", "extender_tls_key_file": "KEY"}, "extender_tls_cert_file"),
    ({"extender_token_file": "EMPTY"}, "extender_token_file"),
    ({"extender_tls_cert_file": "CERT", "extender_tls_key_file": "KEY", "extender_token_file": "EMPTY"},
     "extender_token_file: .* is empty"),
    ({"extender_max_body_mib": 0}, "extender_max_body_mib"),
    ({"extender_max_body_mib": 1000}, "extender_max_body_mib"),
])
def test_bad_extender_security_settings_name_the_field(pki, tmp_path, fields, named):
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    subst = {"CERT": str(pki["cert"]), "KEY": str(pki["key"]), "CA": str(pki["ca"]), "EMPTY": str(empty)}
    with pytest.raises(ValidationError, match=named):
        SchedulerSettings(**{k: subst.get(v, v) if isinstance(v, str) else v for k, v in fields.items()})


async def post_async(port: int, body: dict, chunked: bool = False) -> int:
    """aiohttp's client, like Go's, reads an early answer while it still sends the body."""
    raw = json.dumps(body).encode()

    async def chunks():
        for i in range(0, len(raw), 1 << 16):
            yield raw[i:i + (1 << 16)]

    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(f"http://127.0.0.1:{port}/filter", data=chunks() if chunked else raw,
                                    headers={"Content-Type": "application/json"}) as resp:
                return resp.status
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            return -1


def test_a_body_over_the_limit_is_a_413_and_the_limit_is_configurable():
    assert SchedulerSettings().extender_max_body_mib == 2
    small = {"Pod": gpu_pod(), "NodeNames": [f"node-{i:06d}" for i in range(100_000)]}  # ~1.3 MiB
    big = {"Pod": gpu_pod(), "NodeNames": small["NodeNames"] * 2}
    ext = make_extender()
    with served(ext) as port:
        assert asyncio.run(post_async(port, small)) == 200
        assert asyncio.run(post_async(port, big)) == 413
        # No Content-Length: refused once the bytes read pass the limit; the connection is closed at once,
        # so a client still sending may see the reset before it reads the 413.
        assert asyncio.run(post_async(port, big, chunked=True)) in (413, -1)
        assert ext.requests[("filter", 413)] == 2
    with served(make_extender(max_body_bytes=1 << 20)) as port:
        assert asyncio.run(post_async(port, small)) == 413


def test_a_large_body_is_parsed_in_a_worker_process_and_its_nodes_echoed_as_they_came(monkeypatch):
    """Parsing holds the GIL even on a thread: this process parses no large JSON and builds no large object."""
    calls: list[int] = []
    real = orjson.loads

    def spy(raw, *a, **kw):
        calls.append(len(raw))
        return real(raw, *a, **kw)

    monkeypatch.setattr(orjson, "loads", spy)
    nodes = [make_node(f"big-{i}", gpus=8) for i in range(2000)] + [make_node("n2", gpus=2)]
    victims = {"n1": {"Pods": [{"metadata": {"name": "half", "uid": "uid-half"}}], "NumPDBViolations": 0}}
    body = json.dumps({"Pod": gpu_pod(), "Nodes": {"items": nodes}, "NodeNameToVictims": victims}).encode()
    assert len(body) > extender_args.OFFLOAD_BYTES
    try:
        with served(make_extender(max_body_bytes=len(body))) as port:
            status, res = post(port, "/filter", body)
            preempt_status, preempted = post(port, "/preempt", body)
    finally:
        offload.shutdown()
    assert status == 200 and len(res["FailedNodes"]) == 2000, res["FailedNodes"].get("n2")
    assert res["Nodes"]["items"] == [json.loads(json.dumps(nodes[-1]))]  # the kept node, as it came
    assert preempt_status == 200 and set(preempted["NodeNameToMetaVictims"]) <= {"n1"}
    assert not [n for n in calls if n > extender_args.OFFLOAD_BYTES], calls


def test_verbs_are_refused_with_a_503_while_the_extender_is_not_ready():
    ready = [False]
    core = Scheduler(profile("gpuaware", WorkloadMix(), 0))
    ext = Extender(cluster(), lambda: core, lambda: ready[0])
    with served(ext) as port:
        for verb in (*VERBS, "bind"):
            status, res = post(port, f"/{verb}", {"Pod": gpu_pod(), "NodeNames": ["n2"]})
            assert status == 503 and "not ready" in res["Error"], (verb, status, res)
        ready[0] = True
        status, res = post(port, "/filter", {"Pod": gpu_pod(), "NodeNames": ["n2"]})
        assert status == 200 and res["NodeNames"] == ["n2"], res
    assert ext.requests[("filter", 503)] == 1


# --------------------------------------------------------------------------- 6. malformed bodies
MALFORMED = [
    (b"not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"Pod": 5, "NodeNames": ["n1"]}', "Pod"),
    (b'{"NodeNames": ["n1"]}', "Pod"),
    (b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": "main"}}, "NodeNames": ["n1"]}',
     "Pod.spec.containers"),
    (b'{"Pod": {"metadata": {"name": "p", "annotations": []}}, "NodeNames": ["n1"]}', "Pod.metadata.annotations"),
    (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1]}', "NodeNames[0]"),
    (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {}}]}}', "Nodes.items[0].metadata.name"),
    (b'{"Pod": {"metadata": {"name": "p", "annotations": {"gpuaware.io/gpu-milli": 5}}}, "NodeNames": []}',
     "Pod.metadata.annotations"),
    (b'{"Pod": {"metadata": {"name": "p", "creationTimestamp": "yesterday"}}, "NodeNames": []}',
     "Pod.metadata.creationTimestamp"),
    (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": 3}]}}}',
     "NodeNameToMetaVictims.n1.Pods[0].UID"),
]


@pytest.mark.parametrize(("body", "names"), MALFORMED)
def test_malformed_bodies_are_a_400_naming_the_field(body, names):
    with served(make_extender()) as port:
        for verb in VERBS:
            status, res = post(port, f"/{verb}", body)
            assert status == 400, (verb, status, res)
            assert names in res["Error"], (verb, res)


text = st.text(max_size=12)
leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(), text)
values = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(text, inner, max_size=3)), max_leaves=10)


def maybe(valid: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(valid, values)


quantities = maybe(st.sampled_from(["1", "500m", "2Gi", "0", "-1", "1e3", "1.5", "x"]))
containers = st.lists(maybe(st.fixed_dictionaries({
    "name": maybe(text),
    "resources": maybe(st.fixed_dictionaries({}, optional={
        "requests": maybe(st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantities)),
        "limits": maybe(st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantities))}))})),
    max_size=2)
annotation_names = st.sampled_from(["gpuaware.io/gpu-milli", "gpuaware.io/gpu-models", "gpuaware.io/sharing",
                                    "gpuaware.io/gang", "gpuaware.io/gang-size", "gpuaware.io/preemptible",
                                    "gpuaware.io/duration-s", "other"])
pods = maybe(st.fixed_dictionaries({"metadata": maybe(st.fixed_dictionaries(
    {"name": maybe(text)},
    optional={"namespace": maybe(text), "uid": maybe(text), "creationTimestamp": maybe(text),
              "annotations": maybe(st.dictionaries(annotation_names, maybe(text), max_size=3))}))},
    optional={"spec": maybe(st.fixed_dictionaries({}, optional={
        "containers": maybe(containers), "initContainers": maybe(containers),
        "priority": maybe(st.integers(-2**31, 2**31))}))}))
node_names = st.sampled_from(["n0", "n1", "n2", "n3", "ghost"])
bodies = st.fixed_dictionaries({"Pod": pods}, optional={
    "NodeNames": maybe(st.lists(maybe(node_names), max_size=4)),
    "Nodes": maybe(st.fixed_dictionaries({"items": maybe(st.lists(maybe(st.fixed_dictionaries(
        {"metadata": maybe(st.fixed_dictionaries({"name": maybe(node_names)}))})), max_size=3))})),
    "NodeNameToMetaVictims": maybe(st.dictionaries(node_names, maybe(st.fixed_dictionaries({}, optional={
        "Pods": maybe(st.lists(maybe(st.fixed_dictionaries({"UID": maybe(st.sampled_from(["uid-busy", "x"]))})),
                               max_size=2)),
        "NumPDBViolations": maybe(st.integers(-5, 5))})), max_size=2)),
    "NodeNameToVictims": maybe(st.dictionaries(node_names, values, max_size=2)),
})


@settings(max_examples=500, deadline=None)
@given(verb=st.sampled_from((*VERBS, "bind")),
       body=st.one_of(st.binary(max_size=300), st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
                      values.map(lambda v: json.dumps(v).encode())))
def test_any_bytes_or_unicode_parse_or_raise_bad_request(verb, body):
    with contextlib.suppress(extender_args.BadRequest):
        extender_args.parse(body, verb)


@pytest.fixture(scope="module")
def fuzz_port() -> Iterator[int]:
    with served(make_extender()) as port:
        yield port


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(VERBS), body=st.one_of(bodies, values))
@example(verb="filter", body={"Pod": {"metadata": {"name": ""}, "spec": {"containers": None}}})  # was a 500
def test_fuzzed_extender_args_get_an_answer_or_a_400_with_a_reason_never_a_500(fuzz_port, verb, body):
    status, res = post(fuzz_port, f"/{verb}", json.dumps(body).encode())
    assert status in (200, 400), (status, res)
    if status == 400:
        assert isinstance(res, dict) and res["Error"].strip(), res
    elif verb == "filter":  # a 200 never carries an Error; an invalid request fails every node unresolvably
        assert res["Error"] == "", res
        assert all(v.startswith("gpuaware: invalid gpuaware request: ")
                   for v in res["FailedAndUnresolvableNodes"].values()), res
    elif verb == "prioritize":
        assert isinstance(res, list) and all(0 <= p["Score"] <= 10 for p in res), res
    else:
        assert isinstance(res, dict) and set(res) == {"NodeNameToMetaVictims"}, res


async def test_extender_answers_kube_scheduler_json(kube):
    for i in range(3):
        kube.create("nodes", make_node(f"n{i}", gpus=2))
    default_scheduler = KubeApi(kube.admin)  # kube-scheduler's part: it binds its own pods
    kube.create("pods", make_pod("busy", gpus=2, scheduler="default-scheduler"))
    default_scheduler.bind("default", "busy", "n0")
    kube.create("pods", make_pod("half", gpus=1, scheduler="default-scheduler"))
    default_scheduler.bind("default", "half", "n1")
    async with running(kube, lead=False) as live:
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


# --------------------------------------------------------------------------- DRA: kube-scheduler allocates
def test_a_pod_with_claims_is_filtered_by_health_only_and_not_steered():
    """kube-scheduler's DynamicResources plugin picks the devices; the extender only keeps it off nodes
    whose GPUs are all critical (docs/dra-scheduling.md, "Extender mode"), even without DRA informers."""
    cache = cluster()
    cache.cordoned["n2"] = {0, 1}
    cache.apply_cordons()
    ext = make_extender(cache)
    claimed = gpu_pod(gpus=0, annotations={"gpuaware.io/gpu-models": "A100"})
    claimed["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c"}]
    # n0 is full for the core's model, n1 half: a claim pod still passes both (kube-scheduler knows the devices).
    res = ext.filter({"Pod": claimed, "NodeNames": ["n0", "n1", "n2", "n3"]})
    assert res["NodeNames"] == ["n0", "n1", "n3"] and list(res["FailedNodes"]) == ["n2"]
    assert "every GPU of the node is critical" in res["FailedNodes"]["n2"] and not res["FailedAndUnresolvableNodes"]
    assert {p["Score"] for p in ext.prioritize({"Pod": claimed, "NodeNames": ["n0", "n1", "n3"]})} == {0}
    victims = {"n0": {"Pods": [{"UID": "uid-busy"}], "NumPDBViolations": 0}}
    assert ext.preempt({"Pod": claimed, "NodeNameToMetaVictims": victims}) == {"NodeNameToMetaVictims": victims}


def test_a_claim_pod_is_not_kept_off_a_node_whose_gpus_are_critical_for_device_taints_alone():
    """kube-scheduler decides taints per claim (a claim may tolerate them, or ask admin access); the extender
    cannot see the claims, so a GPU critical only for its device's taint does not fail the node."""
    from gpuaware.contract.events import HealthBand
    cache = cluster()
    c = cache.cluster
    i = c.index["n3"]
    for g in range(int(c.gpu_count[i])):
        c.set_band(i, g, HealthBand.CRITICAL)
        cache.dra.taint_bands[(i, g)] = HealthBand.HEALTHY  # as apply_cordons records a taint-only GPU
    ext = make_extender(cache)
    claimed = gpu_pod(gpus=0)
    claimed["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c"}]
    assert "n3" in ext.filter({"Pod": claimed, "NodeNames": ["n3"]})["NodeNames"]
    cache.dra.taint_bands.clear()  # critical by its health: failed
    assert "n3" in ext.filter({"Pod": claimed, "NodeNames": ["n3"]})["FailedNodes"]



@pytest.mark.parametrize(("body", "field"), [
    ({"PodNamespace": "d", "PodUID": "u", "Node": "n"}, "PodName"),
    ({"PodName": "p", "PodNamespace": "d", "PodUID": 7, "Node": "n"}, "PodUID"),
    ({"PodName": "p", "PodNamespace": "d", "PodUID": "u", "Node": ""}, "Node"),
])
def test_a_bind_body_that_is_not_extender_binding_args_names_the_field(body, field):
    with pytest.raises(extender_args.BadRequest, match=field):
        extender_args.parse(json.dumps(body).encode(), "bind")


def test_bind_reserves_the_gpus_writes_them_in_the_binding_and_refuses_a_node_without_room(kube):
    cache = cluster()
    calls = ApiCalls(KubeApi(kube.admin), SchedulerStats(), workers=2)
    pods = {name: kube.create("pods", make_pod(name, gpus=gpus, scheduler="default-scheduler"))
            for name, gpus in (("fits", 1), ("too-big", 2), ("old", 1))}
    for name in ("n0", "n2"):
        kube.create("nodes", make_node(name, gpus=2))
    cache.sync_pods(cache_pods := [*cache.pods.values(), *pods.values()])
    assert len(cache_pods) == 5

    def bind(name: str, node: str, uid: str | None = None) -> dict:
        uid = uid or pods[name]["metadata"]["uid"]
        status, res = post(port, "/bind", {"PodName": name, "PodNamespace": "default", "PodUID": uid,
                                           "Node": node})
        assert status == 200, res
        return res

    try:
        with served(make_extender(cache, calls=calls)) as port:
            assert bind("fits", "n2") == {"Error": ""}
            # n0's two GPUs are taken (by a pod kube-scheduler bound): nothing is written, nothing reserved.
            assert "n0 has no room left for default/too-big" in bind("too-big", "n0")["Error"]
            # A pod recreated under its name since kube-scheduler read it: the UID precondition refuses.
            assert bind("old", "n2", uid="uid-of-an-earlier-pod")["Error"].startswith("gpuaware: binding")
    finally:
        calls.shutdown()
    bound = {p["metadata"]["name"]: p for p in kube.objects("pods")}
    assert bound["fits"]["spec"]["nodeName"] == "n2"
    assert json.loads(bound["fits"]["metadata"]["annotations"]["gpuaware.io/gpus"])[0]["milli"] == 1000
    assert not bound["too-big"]["spec"].get("nodeName") and not bound["old"]["spec"].get("nodeName")
    assert set(cache.assumed) == {"default/fits"}
    assert "default/old" not in cache.running and "default/too-big" not in cache.running


def test_bind_writes_what_the_one_node_filter_reserved_and_decides_again_for_another_node(kube):
    cache = cluster()
    calls = ApiCalls(KubeApi(kube.admin), SchedulerStats(), workers=2)
    pods = {name: kube.create("pods", make_pod(name, gpus=1, annotations={"gpuaware.io/gpu-milli": "500"},
                                               scheduler="default-scheduler"))
            for name in ("kept", "moved")}
    for name in ("n1", "n2"):
        kube.create("nodes", make_node(name, gpus=2))
    cache.sync_pods([*cache.pods.values(), *pods.values()])
    ext = one_node_extender(cache, calls=calls)
    decided = []
    schedule = ext.core().schedule
    ext.core().schedule = lambda *a, **kw: decided.append(a[2] is not None and a[2].sum() == 1) or schedule(*a, **kw)

    def bind(name: str, node: str) -> dict:
        status, res = post(port, "/bind", {"PodName": name, "PodNamespace": "default",
                                           "PodUID": pods[name]["metadata"]["uid"], "Node": node})
        assert status == 200, res
        return res

    try:
        with served(ext) as port:
            for name in ("kept", "moved"):
                status, res = post(port, "/filter", {"Pod": cache.pods[f"default/{name}"], "NodeNames": ["n1", "n2"]})
                assert status == 200 and len(res["NodeNames"]) == 1, res
            reserved = {k: (a.node, list(a.running.allocation.gpus)) for k, a in cache.assumed.items()}
            assert len(decided) == 2
            assert bind("kept", reserved["default/kept"][0]) == {"Error": ""}
            assert len(decided) == 2  # the Binding carries the reservation: nothing decided again
            other = "n2" if reserved["default/moved"][0] == "n1" else "n1"
            assert bind("moved", other) == {"Error": ""}  # a node other than the one kept: decided for it
            assert decided[2:] == [True] and cache.assumed["default/moved"].node == other
    finally:
        calls.shutdown()
    bound = {p["metadata"]["name"]: p for p in kube.objects("pods")}
    assert bound["kept"]["spec"]["nodeName"] == reserved["default/kept"][0]
    gpus = json.loads(bound["kept"]["metadata"]["annotations"]["gpuaware.io/gpus"])
    assert [g["index"] for g in gpus] == reserved["default/kept"][1] and gpus[0]["milli"] == 500
    assert bound["moved"]["spec"]["nodeName"] == other


def test_a_reserved_bind_refuses_a_stale_uid_decides_again_on_a_cordoned_node_and_never_leaks_the_gpus(kube):
    cache = cluster()
    calls = ApiCalls(KubeApi(kube.admin), SchedulerStats(), workers=2)
    pods = {name: kube.create("pods", make_pod(name, gpus=1, scheduler="default-scheduler"))
            for name in ("a", "b", "late", "shut")}
    for name in ("n1", "n2"):
        kube.create("nodes", make_node(name, gpus=2))
    cache.sync_pods([*cache.pods.values(), *(pods[n] for n in ("a", "b", "shut"))])  # "late": not seen yet
    ext = one_node_extender(cache, calls=calls, bind_wait_s=0.2)

    def filter_(name: str, names: tuple[str, ...] = ("n2",)) -> str:
        (node,) = ext.filter({"Pod": pods[name], "NodeNames": list(names)})["NodeNames"]
        return node

    def bind(name: str, uid: str | None = None, node: str = "n2") -> tuple[int, dict]:
        return post(port, "/bind", {"PodName": name, "PodNamespace": "default",
                                    "PodUID": uid or pods[name]["metadata"]["uid"], "Node": node})

    try:
        with served(ext) as port:
            filter_("a")
            # A /bind from an earlier cycle, for a pod since replaced under the name: refused, the reservation kept.
            status, res = bind("a", uid="uid-of-an-earlier-pod")
            assert status == 200 and "the pod filtered last" in res["Error"]
            assert "default/a" in cache.assumed and "default/a" in ext._reserved
            assert bind("a") == (200, {"Error": ""})
            # n2 cordoned between /filter and /bind: decided again for n2 as it is now, nothing written.
            filter_("b")
            cache.node_mask[cache.cluster.index["n2"]] = False
            status, res = bind("b")
            assert status == 200 and "n2 has no room left for default/b" in res["Error"]
            assert "default/b" not in cache.assumed
            cache.node_mask[cache.cluster.index["n2"]] = True
            # Lapsed before its /bind, and the informer has not shown the pod: decided again from the pod filtered.
            filter_("late")
            until(lambda: "default/late" not in cache.assumed)
            assert bind("late") == (200, {"Error": ""})
            # The API threads gone (shutting down): a 500, and the reservation does not stay held.
            node = filter_("shut", ("n1", "n2"))  # n2 is full now
            calls.shutdown()
            status, _ = bind("shut", node=node)
            assert status == 500 and "default/shut" not in cache.assumed
    finally:
        calls.shutdown()
    bound = {p["metadata"]["name"]: p for p in kube.objects("pods")}
    assert bound["a"]["spec"]["nodeName"] == "n2" and not bound["b"]["spec"].get("nodeName")
    assert json.loads(bound["late"]["metadata"]["annotations"]["gpuaware.io/gpus"])[0]["milli"] == 1000
    assert not bound["shut"]["spec"].get("nodeName")
