"""The scheduler's runtime table: forecasts for pods that declare nothing, declared durations calibrated against
completions, and a clean fallback when the table is stale or empty; completions from the pod watch."""

from __future__ import annotations

import asyncio
import math

from gpuaware.contract.events import JobCompletion, JobRuntime, decode
from gpuaware.contract.runtime import declared_keys
from gpuaware.local.fake_apiserver import make_pod
from gpuaware.scheduler.kube import objects
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.completions import Completions, completion_of, keys_of
from gpuaware.scheduler.kube.scheduling import SchedulingPass
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.runtimes import RuntimeTable
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.stream.runtime import RuntimeForecaster
from gpuaware.stream.runtime_topic import RuntimeLearner

HOUR_MS = 3_600_000
T0 = 1_800_000_000_000


def _pod(name: str, declared: float | None = None, owner: str = "resnet") -> dict:
    ann = {"gpuaware.io/job": owner, **({"gpuaware.io/duration-s": str(declared)} if declared else {})}
    pod = make_pod(name, namespace="team", gpus=1, cpu="4", memory="16Gi", annotations=ann)
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


def _succeeded(pod: dict, start: str, end: str) -> dict:
    pod["spec"]["nodeName"] = "n0"
    pod["status"] = {"phase": "Succeeded", "startTime": start, "containerStatuses": [
        {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": end}}}]}
    return pod


def _table_from(completions: list[JobCompletion], stale_after_s: float = 86_400.0) -> RuntimeTable:
    """What the feed builds from what the stream's learner publishes for ``completions``."""
    learner, table = RuntimeLearner(RuntimeForecaster()), RuntimeTable(stale_after_s)
    for offset, c in enumerate(completions):
        for key, value in learner.learn(c, offset):
            table.learn(decode(value, JobRuntime)) if value is not None else table.forget(key.decode())
    return table


def _completion(name: str, seconds: float, declared: float | None = None) -> JobCompletion:
    pod = _succeeded(_pod(name, declared), "2027-01-15T08:00:00Z", f"2027-01-15T08:{seconds // 60:02.0f}:00Z")
    c = completion_of(pod, objects.workload_of(pod, "team", 0.0).workload)
    assert c is not None
    return c


def test_a_succeeded_pod_is_a_completion_with_its_runtime_and_signature():
    pod = _succeeded(_pod("a", declared=600), "2027-01-15T08:00:00Z", "2027-01-15T08:20:00Z")
    w = objects.workload_of(pod, "team", 0.0).workload
    c = completion_of(pod, w)
    assert c is not None and c.runtime_s == 1200.0 and c.signature == keys_of(w, pod)
    assert c.signature[0] == "owner:team/resnet" and c.declared_s == 600.0
    assert c.declared_keys == declared_keys("team", "resnet") == ["declared:team/resnet", "declared:team"]
    failed = dict(pod, status=dict(pod["status"], phase="Failed"))
    assert completion_of(failed, w) is None  # a failed job did not complete its runtime


def test_only_completions_are_published_once_not_preempted_deleted_or_listed_ones():
    sent: list[JobCompletion] = []

    async def run() -> None:
        async def publish(c: JobCompletion) -> None:
            sent.append(c)

        tasks: list = []
        done = Completions(publish, lambda p: objects.workload_of(p, "team", 0.0).workload,
                           lambda key: key == "team/preempted", lambda: True,
                           lambda coro: tasks.append(asyncio.ensure_future(coro)),
                           newest_ms=lambda: 1_800_000_000_000)  # the table learned up to 2027-01-15T08:00:00Z
        done.sync([_succeeded(_pod("old"), "2027-01-15T07:00:00Z", "2027-01-15T07:10:00Z")])  # history
        ok = _succeeded(_pod("ok"), "2027-01-15T08:00:00Z", "2027-01-15T08:10:00Z")
        done.event("ADDED", ok)
        done.event("MODIFIED", ok)  # seen: not twice
        done.event("ADDED", _succeeded(_pod("preempted"), "2027-01-15T08:00:00Z", "2027-01-15T08:10:00Z"))
        deleted = _succeeded(_pod("deleted"), "2027-01-15T08:00:00Z", "2027-01-15T08:10:00Z")
        deleted["metadata"]["deletionTimestamp"] = "2027-01-15T08:05:00Z"
        done.event("ADDED", deleted)
        # A re-list after a watch gap: a completion the gap hid is published, the ones seen are not.
        gap = _succeeded(_pod("gap"), "2027-01-15T08:00:00Z", "2027-01-15T08:30:00Z")
        done.sync([ok, gap, _succeeded(_pod("old"), "2027-01-15T07:00:00Z", "2027-01-15T07:10:00Z")])
        await asyncio.gather(*tasks)

    asyncio.run(run())
    assert [(c.workload_id, c.runtime_s) for c in sent] == [("team/ok", 600.0), ("team/gap", 1800.0)]


def test_a_pod_of_a_learned_signature_gets_a_forecast_and_a_stale_or_empty_table_falls_back_to_unknown():
    runs = [1200.0, 1260.0, 1140.0, 1200.0, 1320.0]
    table = _table_from([_completion(f"p{i}", s) for i, s in enumerate(runs)])
    pod = _pod("new")
    w = objects.workload_of(pod, "team", 0.0).workload
    now = table.newest_ms + 60_000
    est = table.estimate(keys_of(w, pod), None, [], now)
    assert est is not None and est.source == "forecast"
    mean = sum(math.log(s) for s in runs) / len(runs)
    assert abs(est.mu - mean) < 0.05  # five completions of the owner outweigh the prior
    assert 1000 < est.p50() < 1400
    # No completion learned for longer than the setting: unknown, as without the stream.
    assert table.estimate(keys_of(w, pod), None, [], table.newest_ms + 86_401_000) is None
    assert RuntimeTable().estimate(keys_of(w, pod), None, [], now) is None  # nothing learned at all
    # A tombstone drops a key: the pod falls back to the keys above it.
    table.forget(keys_of(w, pod)[0])
    assert table.estimate(keys_of(w, pod), None, [], now) is not None


def test_the_learners_record_of_what_it_learned_is_no_key_of_the_table():
    table = _table_from([_completion("p0", 1200.0), _completion("p1", 900.0)])
    assert table.stats and not [k for k in table.stats if k.startswith("#")]


def test_a_declared_duration_is_exact_until_calibrated_then_centred_at_declared_times_the_learned_ratio():
    pod = _pod("new", declared=600)
    w = objects.workload_of(pod, "team", 0.0).workload
    dkeys = declared_keys("team", "resnet")
    other = _table_from([_completion("x", 900.0)])  # history, but none of a declared duration
    exact = other.estimate(keys_of(w, pod), 600.0, dkeys, other.newest_ms)
    assert exact is not None and exact.source == "declared" and exact.sigma == 0 and exact.p50() == 600.0
    # Jobs of this owner run twice what they declare, give or take.
    table = _table_from([_completion(f"d{i}", 600.0 * r, declared=600.0) for i, r in enumerate((1.9, 2.0, 2.1, 2.0))])
    est = table.estimate(keys_of(w, pod), 600.0, dkeys, table.newest_ms)
    assert est is not None and est.source == "calibrated" and 0 < est.sigma < 0.5
    assert 1000 < est.p50() < 1250  # 600 s x about 2 (shrunk a little towards the declaration)
    stale = table.estimate(keys_of(w, pod), 600.0, dkeys, table.newest_ms + 86_401_000)
    assert stale is not None and stale.source == "declared" and stale.p50() == 600.0


def test_the_pass_sets_each_pending_pods_estimate_from_the_table_and_follows_it():
    table = _table_from([_completion(f"p{i}", 1200.0) for i in range(4)])
    cache = ClusterCache()
    pod = _pod("new")
    cache.pods["team/new"] = pod
    w = objects.workload_of(pod, "team", 0.0).workload
    passes = SchedulingPass(SchedulerSettings(), cache, SchedulerStats(), None, None, None, None, None, None,
                            runtimes=table)
    passes.estimate(w, table.newest_ms / 1000)
    assert w.runtime is not None and w.runtime.source == "forecast" and 1000 < w.runtime.p50() < 1400
    passes.estimate(w, table.newest_ms / 1000 + 86_401)  # a day later with nothing learned: stale
    assert w.runtime is None
