"""The extender round-trip timings: what the wrappers record on a served extender, and how they are summed up."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from gpuaware.bench import extender_round_trip
from gpuaware.bench.extender_round_trip import Timings, profiled, summary, timed
from gpuaware.local.fake_apiserver import make_pod
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.extender.server import Extender
from tests.scheduler.kube.extender.test_server import make_extender


def test_each_filter_is_timed_with_its_ranking_and_the_methods_are_restored_after():
    t = Timings()
    originals = (Extender._serve, Extender._settle, Extender._rank, ApiCalls.call)

    async def go() -> int:
        async with TestClient(TestServer(make_extender().app())) as http:
            pod = make_pod("new", scheduler="default-scheduler", annotations={"gpuaware.io/gpu-milli": "500"})
            resp = await http.post("/filter", json={"Pod": pod, "NodeNames": ["n1", "n2"]})
            return resp.status

    with timed(t):
        assert asyncio.run(go()) == 200
    assert (Extender._serve, Extender._settle, Extender._rank, ApiCalls.call) == originals
    out = summary(t)
    assert out["filter"]["requests"] == 1 and out["filter"]["nodes_asked_p50"] == 2
    assert out["filter"]["rank_ms_p50"] > 0
    assert out["filter"]["handler_ms_p50"] >= out["filter"]["rank_ms_p50"]


def test_the_summary_splits_a_binding_write_into_its_parts():
    t = Timings()
    t.requests = [("filter", 0.0, 0.002), ("bind", 0.01, 0.5), ("filter", 0.03, 0.031)]
    t.binds = [(0.01, 0.02, 0.45, 0.5)]
    t.cpu = {"process_s": 1.0, "wall_s": 4.0, "threads": {"MainThread": 0.8, "kube-api": 0.002}}
    out = summary(t)
    assert out["bind"]["queue_for_api_thread_ms_p50"] == 10.0 and out["bind"]["api_call_on_thread_ms_p50"] == 430.0
    assert out["bind"]["back_on_loop_ms_p50"] == 50.0 and out["api_thread_cpu_ms_per_bind"] == 2.0
    assert out["ms_between_filters_p50"] == 30.0 and out["process_cpu_s_per_s"] == 0.25
    assert extender_round_trip.summary(Timings())["filter"]["requests"] == 0


def test_a_profile_counts_the_threads_cpu_not_its_waits(tmp_path):
    import pstats
    import time

    def busy() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    def waiting() -> None:
        time.sleep(0.2)

    with profiled(tmp_path / "p.prof"):
        busy()
        waiting()
    stats = {f[2]: v[3] for f, v in pstats.Stats(str(tmp_path / "p.prof")).stats.items()}  # name -> cumulative
    assert stats["busy"] >= 0.04 and stats["waiting"] < 0.02
    with profiled(None):  # no path: nothing profiled, nothing written
        busy()
    assert [p.name for p in tmp_path.iterdir()] == ["p.prof"]
