"""Job runtimes on the real kube-apiserver: a pod that succeeds is published on job.completions.v1 with its runtime
even when it is deleted the moment it ends, and scored against the estimate it was placed with; a pod deleted while
running, or one that failed, is not. The queue order setting (``predicted``: by runtime) decides who goes first."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from gpuaware.contract.events import GpuState, HealthBand, JobCompletion, JobRuntime, NodeGpu, NodeState
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.plumbing.kube.api import Informer
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube import live as live_module
from gpuaware.scheduler.settings import SchedulerSettings
from tests.support import FAST, pods, running, wait_for


async def test_a_job_deleted_the_moment_it_succeeds_is_still_a_completion_and_a_deleted_or_failed_one_is_not(kube):
    sent: list[JobCompletion] = []

    async def publish(c: JobCompletion) -> None:
        sent.append(c)

    now_ms = int(time.time() * 1000)
    view = StateView()  # healthy GPUs, and a runtime table that says jobs here take about 15 minutes
    view.learn(NodeState("n0", now_ms, None, None, [NodeGpu(f"GPU-c-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY)
                                                    for g in range(4)], 2000, 0))
    for g in range(4):
        view.learn(GpuState(f"GPU-c-{g}", "n0", "H100", now_ms, now_ms, 0.0, 0.0, 100.0, 81920, 100.0, 40.0, 90.0,
                            HealthBand.HEALTHY, {}, [], None, None, 1))
    view.learn(JobRuntime("*", now_ms, 20, math.log(900), 20 * 0.25))
    kube.create("nodes", make_node("n0", gpus=4))
    for name in ("quick", "kept", "killed", "failed"):
        kube.create("pods", make_pod(name, gpus=1, annotations={"gpuaware.io/job": "train"}))
    async with running(kube, view=view, completions=publish) as live:
        await wait_for(lambda: all(p["spec"].get("nodeName") for p in pods(kube).values()), what="binding")
        await wait_for(lambda: all(p.get("status", {}).get("phase") == "Running" for p in pods(kube).values()),
                       what="kwok runs them")
        # No await between these calls: the scheduler sees none of them before the last. On kube-apiserver the pod
        # watch (terminal pods left out) delivers "quick" leaving as DELETED with its previous, Running object;
        # by the time anything could read the pod back, it is gone.
        kube.end_pod("quick", "Succeeded", "2027-01-15T08:00:00Z", "2027-01-15T08:10:00Z")
        kube.delete("pods", "quick")
        kube.end_pod("kept", "Succeeded", "2027-01-15T08:00:00Z", "2027-01-15T08:20:00Z")
        kube.delete("pods", "killed")  # deleted while running: no runtime completed
        kube.end_pod("failed", "Failed", "2027-01-15T08:00:00Z", "2027-01-15T08:05:00Z")
        await wait_for(lambda: len(sent) == 2, what="two completions")
        await wait_for(lambda: "default/failed" not in live.cache.running, what="the failed pod released")
        assert sorted((c.workload_id, c.runtime_s) for c in sent) == [("default/kept", 1200.0),
                                                                      ("default/quick", 600.0)]
        assert all(c.signature[0].startswith("owner:") and c.signature[0].endswith("/train") for c in sent), sent
        assert live.stats.forecasts.published == 2 and "default/quick" not in live.cache.running
        # Each scored against the forecast it was placed with (the table's global key).
        quality, p50 = live.stats.forecasts.summary(), round(view.runtimes.estimate(["*"], None, [], now_ms).p50())
        assert quality["completions"] == 2 and quality["unscored"] == 0 and set(quality["mae_log"]) == {"global"}
        assert {r["pod"]: (round(r["p50_s"]), r["actual_s"]) for r in quality["recent"]} == {
            "default/quick": (p50, 600.0), "default/kept": (p50, 1200.0)}
    # A restarted scheduler whose runtime table learned "kept" (its newest completion ended when "kept" did) lists
    # it as history: nothing is published twice.
    sent.clear()
    learned = StateView()
    learned.learn(JobRuntime("*", int(datetime(2027, 1, 15, 8, 20, tzinfo=UTC).timestamp() * 1000), 1, 0.0, 0.0))
    async with running(kube, view=learned, completions=publish) as live:
        await wait_for(lambda: live.completions.listed, what="the completions list")
        assert sent == []


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_job_that_succeeds_while_no_scheduler_publishes_or_at_a_handover_is_published_once(kube):
    sent: list[JobCompletion] = []

    async def publish(c: JobCompletion) -> None:
        sent.append(c)

    kube.create("nodes", make_node("n0", gpus=4))
    for name in ("before", "down", "handover"):
        kube.create("pods", make_pod(name, gpus=1))
    now, view = time.time(), StateView()
    async with running(kube, view=view, completions=publish):
        await wait_for(lambda: all(p.get("status", {}).get("phase") == "Running" for p in pods(kube).values()),
                       what="bound and running")
        kube.end_pod("before", "Succeeded", _iso(now - 900), _iso(now - 600))
        await wait_for(lambda: len(sent) == 1, what="the first completion")
    view.learn(JobRuntime("*", sent[0].ts_ms, 1, math.log(300), 0.0))  # the stream learned it: the watermark
    kube.end_pod("down", "Succeeded", _iso(now - 900), _iso(now - 300))  # no scheduler runs
    leader = [False]
    async with running(kube, view=view, lead=False, completions=publish, may_act=lambda: leader[0]) as standby:
        await wait_for(lambda: standby.completions.listed, what="the standby's list")
        kube.end_pod("handover", "Succeeded", _iso(now - 900), _iso(now - 100))  # the old leader is gone
        await wait_for(lambda: len(standby.completions.held) == 2, what="the standby holds both")
        assert [c.workload_id for c in sent] == ["default/before"]  # a standby publishes nothing
        leader[0] = True
        standby.leading.set()
        await wait_for(lambda: len(sent) == 3, what="held completions published")
        await asyncio.sleep(0.3)
    assert sorted(c.workload_id for c in sent) == ["default/before", "default/down", "default/handover"]


@pytest.mark.parametrize(("order", "first"), [("fair", "a-long"), ("predicted", "b-short")])
async def test_queue_order_setting_decides_who_gets_a_freed_gpu(kube, order, first):
    kube.create("nodes", make_node("n0", gpus=1))
    kube.create("pods", make_pod("blocker", gpus=1))
    settings = FAST.model_copy(update={"queue_order": order})
    async with running(kube, settings) as live:
        await wait_for(lambda: pods(kube)["blocker"]["spec"].get("nodeName"), what="the blocker bound")
        assert live.passes.queue_policy.order == order
        kube.create("pods", make_pod("a-long", gpus=1, annotations={"gpuaware.io/duration-s": "36000"}))
        kube.create("pods", make_pod("b-short", gpus=1, annotations={"gpuaware.io/duration-s": "60"}))
        await wait_for(lambda: {"default/a-long", "default/b-short"} <= set(live.cache.pending), what="both queued")
        kube.delete("pods", "blocker")
        await wait_for(lambda: any(p["spec"].get("nodeName") for n, p in pods(kube).items() if n != "blocker"),
                       what="one bound")
        assert [n for n, p in pods(kube).items() if p["spec"].get("nodeName") and n != "blocker"] == [first]


def test_an_unknown_queue_order_is_refused_with_the_values_it_takes():
    with pytest.raises(ValidationError, match=r"queue_order: 'sjf' is not one of fair, fifo, las, predicted"):
        SchedulerSettings(queue_order="sjf")


async def test_scheduling_waits_for_no_list_of_the_pods_that_succeeded_which_is_read_in_pages(kube, monkeypatch):
    sent: list[JobCompletion] = []

    async def publish(c: JobCompletion) -> None:
        sent.append(c)

    kube.create("nodes", make_node("n0", gpus=8))
    names = [f"done-{i}" for i in range(5)]
    for name in names:
        kube.create("pods", make_pod(name, gpus=1))
    now = time.time()
    async with running(kube, completions=publish):
        await wait_for(lambda: all(p.get("status", {}).get("phase") == "Running" for p in pods(kube).values()),
                       what="bound and running")
        for i, name in enumerate(names):
            kube.end_pod(name, "Succeeded", _iso(now - 900), _iso(now - 300 + 10 * i))
        await wait_for(lambda: len(sent) == 5, what="five completions")
    view = StateView()  # the stream learned the first three
    view.learn(JobRuntime("*", sorted(c.ts_ms for c in sent)[2], 3, math.log(600), 0.0))
    sent.clear()
    release, real = threading.Event(), Informer._list

    def held_back(informer: Informer) -> None:
        if informer.spec.name == "completed":
            release.wait(20)
        real(informer)

    monkeypatch.setattr(Informer, "_list", held_back)
    monkeypatch.setattr(live_module, "COMPLETED_PAGE", 2)
    kube.create("pods", make_pod("next", gpus=1))
    async with running(kube, view=view, completions=publish) as live:
        completed = next(inf for inf in live._informers if inf.spec.name == "completed")
        assert not completed.synced.is_set()  # started without it
        await wait_for(lambda: pods(kube)["next"]["spec"].get("nodeName"), what="a pod placed before that list")
        release.set()
        await wait_for(lambda: live.completions.listed, what="the completions list")
        assert completed.pages == 3  # five pods, two a page
        await wait_for(lambda: len(sent) == 2, what="the two the table had not learned")
    assert sorted(c.workload_id for c in sent) == ["default/done-3", "default/done-4"]
