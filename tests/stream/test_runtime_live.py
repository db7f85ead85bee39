"""End to end on a real broker and a real stream worker: completions published -> the worker learns -> records on
job.runtime.v1 -> the scheduler's feed table -> a forecast for a new pod of the same signature; a restarted worker
goes on from exactly the statistics it had."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from gpuaware.contract import topics
from gpuaware.contract.events import JobCompletion, JobRuntime, encode
from gpuaware.local.stream_workers import StreamWorkerProcess
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.feed import StateFeed, StateView
from gpuaware.scheduler.kube import objects
from gpuaware.scheduler.kube.completions import completion_of, keys_of
from tests.scheduler.test_runtimes import _pod, _succeeded
from tests.support import produce, watch

pytestmark = pytest.mark.timeout(600)
WAIT_S = 240.0  # a worker's start and group join on a busy 2-core machine; a deadline, not a figure


def _completions(tenant: str, runs: list[float], first: int) -> list[JobCompletion]:
    out = []
    for i, s in enumerate(runs, first):
        pod = _succeeded(_pod(f"p{i}"), "2027-01-15T08:00:00Z", f"2027-01-15T{8 + int(s // 3600):02d}:"
                         f"{int(s % 3600) // 60:02d}:{int(s % 60):02d}Z")
        c = completion_of(pod, objects.workload_of(pod, tenant, 0.0).workload)
        assert c is not None
        out.append(c)
    return out


def _learned(kafka: KafkaSettings, key: str, n: int) -> JobRuntime:
    records = asyncio.run(watch(kafka, topics.JOB_RUNTIME, lambda seen: any(r.n >= n for r in seen),
                                lambda r: isinstance(r, JobRuntime) and r.signature_key == key, timeout_s=WAIT_S))
    return next(r for r in records if r.n >= n)


def test_completions_reach_the_schedulers_estimate_through_a_worker_that_restores_exactly_after_a_restart(
        kafka_settings: KafkaSettings, tmp_path: Path, unique) -> None:
    tenant = f"rt-{unique}"
    runs = [1200.0, 1500.0, 900.0, 1300.0, 1100.0]
    first = _completions(tenant, runs, 0)
    owner_key = first[0].signature[0]
    assert owner_key == f"owner:{tenant}/resnet"
    asyncio.run(produce(kafka_settings, [(topics.JOB_COMPLETIONS, c.key(), encode(c)) for c in first]))

    def worker(name: str) -> StreamWorkerProcess:
        w = StreamWorkerProcess(kafka_settings, f"rt-app-{unique}", tmp_path, name, node_identity="off",
                                standby_replicas=0)
        w.start()
        return w

    one = worker("w1")
    try:
        record = _learned(kafka_settings, owner_key, len(runs))
    finally:
        assert one.stop() == 0, one.log_tail()
    mean = sum(math.log(s) for s in runs) / len(runs)
    assert record.n == len(runs) and math.isclose(record.mean, mean, rel_tol=1e-12)

    # The scheduler's feed reads the topic into its table; a new pod of the same signature gets a forecast.
    async def feed() -> StateView:
        view = StateView()
        f = StateFeed(kafka_settings, view)
        await f.start()
        try:
            await f.catch_up()
        finally:
            await f.stop()
        return view

    view = asyncio.run(feed())
    assert view.runtimes.stats[owner_key].n == len(runs)
    pod = _pod("new")
    w = objects.workload_of(pod, tenant, 0.0).workload
    est = view.runtimes.estimate(keys_of(w, pod), None, [], view.runtimes.newest_ms)
    assert est is not None and est.source == "forecast" and abs(est.mu - mean) < 0.1

    # A second worker of the group (the first one's state gone with its process) learns one more completion
    # on top of exactly what was learned: restored from job.runtime.v1, nothing learned twice.
    more = _completions(tenant, [2000.0], len(runs))
    asyncio.run(produce(kafka_settings, [(topics.JOB_COMPLETIONS, c.key(), encode(c)) for c in more]))
    two = worker("w2")
    try:
        after = _learned(kafka_settings, owner_key, len(runs) + 1)
    finally:
        assert two.stop() == 0, two.log_tail()
    logs = [math.log(s) for s in [*runs, 2000.0]]
    m = sum(logs) / len(logs)
    assert after.n == len(logs) and math.isclose(after.mean, m, rel_tol=1e-12)
    assert math.isclose(after.m2, sum((x - m) ** 2 for x in logs), rel_tol=1e-9)
