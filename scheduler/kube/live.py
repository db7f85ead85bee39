"""The custom scheduler: pods with ``schedulerName: gpuaware`` placed by the same core as the simulator.

One asyncio task per concern:
- informers (threads) list + watch nodes, pods and GPUQueues into a bounded inbox (back-pressure);
- the loop applies changes to ``ClusterCache`` and, while this replica leads, runs a scheduling
  pass (``scheduler.core.cycle``) on the queue, plus all-or-nothing placement of complete gangs;
- each placement is a bind task: wait for any preempted victims to be gone, POST the Binding
  carrying the GPUs and sharing mode as annotations (kube-apiserver sets a Binding's annotations
  on the pod with its node, in one write), write a ``Scheduled`` Event, publish the decision; a
  409 (already bound) or 404 (gone) releases the reservation;
- each eviction (preemption, migration off a critical GPU) is a task: ask a checkpointable pod to
  checkpoint (annotation, then wait for its answer or the timeout), then the Eviction API, retried
  while a PodDisruptionBudget blocks it;
- live GPU state from Kafka (``scheduler.feed``) marks GPUs degraded/critical and stale; a GPU
  turning critical is cordoned on its node (annotation) and its pods are checkpointed and evicted.

Restart-safe by construction: the queue and the allocations are rebuilt from the API (bound pods
carry their GPUs in annotations), pending pods are ordered by creation time, and the Binding API
refuses a second binding of a pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kubernetes.client.exceptions import ApiException

from contract import annotations
from contract.events import AgentControl, ControlKind, DecisionAction, GpuAssignment, HealthBand, SchedulerDecision
from plumbing import observability
from plumbing.kube.api import TRANSPORT_ERRORS, Informer, KubeApi, WatchSpec, api_error, now_rfc3339, wait_synced
from scheduler.core.cycle import PassStats, QueuePolicy, QueueState, place_gang, schedule_pass
from scheduler.core.framework import Decision, Scheduler
from scheduler.core.policies import profile
from scheduler.core.preemption import Running
from scheduler.core.queue import Tenant, TenantLedger, jain_index
from scheduler.core.throttle import throttle_decisions
from scheduler.core.workload import Workload
from scheduler.core.workload_mix import WorkloadMix
from scheduler.feed import StateView
from scheduler.kube import objects
from scheduler.kube.cache import ClusterCache
from scheduler.kube.objects import PodWorkload
from scheduler.metrics import PRIORITY_NAMES, QueueSnapshot, SchedulerStats
from scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)

UNKNOWN_DURATION_S = 24 * 3600.0  # running work without a duration estimate: assume it stays a day
MIX_REBUILD_EVERY = 256  # pods seen before the scores built from the workload mix (FGD, model reservation) are rebuilt


@dataclass
class Outcome:
    """What happened to one pod, for tests and the decision log."""

    key: str
    action: DecisionAction
    node: str | None = None
    reasons: list[str] = field(default_factory=list)


class DecisionSink:
    """Where decisions go besides Events: ``scheduler.decisions.v1`` (set by the runner) and a bounded log."""

    def __init__(self, keep: int = 10_000):
        self.recent: list[Outcome] = []
        self.keep = keep
        self.publish: Any = None  # async callable(SchedulerDecision) | None

    async def record(self, outcome: Outcome, w: Workload | None, assignments: list[GpuAssignment] | None = None,
                     sharing: str | None = None, score: float | None = None, latency_s: float | None = None) -> None:
        self.recent.append(outcome)
        if len(self.recent) > self.keep:
            del self.recent[: len(self.recent) - self.keep]
        if self.publish is None:
            return
        record = SchedulerDecision(
            decision_id=uuid.uuid4().hex, ts_ms=int(time.time() * 1000), workload_id=outcome.key,
            action=outcome.action, tenant=w.tenant if w else None,
            priority=PRIORITY_NAMES.get(w.priority) if w else None, node=outcome.node,
            assignments=assignments or [], sharing=sharing, reasons=outcome.reasons[:8], score=score,
            latency_us=int(latency_s * 1e6) if latency_s is not None else None)
        try:
            await self.publish(record)
        except Exception as exc:  # the decision stands; losing its log line must not stop scheduling
            log.warning("could not publish decision for %s: %s", outcome.key, exc)


class LiveScheduler:
    def __init__(self, api: KubeApi, settings: SchedulerSettings, view: StateView | None = None,
                 stats: SchedulerStats | None = None, sink: DecisionSink | None = None):
        self.api, self.settings, self.view = api, settings, view
        self.stats = stats or SchedulerStats()
        self.sink = sink or DecisionSink()
        self.cache = ClusterCache(scheduler_name=settings.name)
        self.queue_policy = QueuePolicy(pass_budget=settings.pass_budget) if settings.policy == "gpuaware" \
            else QueuePolicy.kube(pass_budget=settings.pass_budget)
        self.leading = asyncio.Event()
        self._inbox: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue(maxsize=10_000)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._informers: list[Informer] = []
        self._tasks: set[asyncio.Task] = set()
        self._bind_slots = asyncio.Semaphore(settings.bind_workers)
        self._gone: dict[str, asyncio.Event] = {}
        self._evicting: set[str] = set()
        self._reported: dict[str, str] = {}  # pod -> last FailedScheduling message written
        self._critical_seen: set[tuple[str, int]] = set()
        self._mix = WorkloadMix()
        self._mix_at_build = -1
        self._scheduler: Scheduler | None = None
        self._dirty = True
        self._applied_view: tuple[int, int] | None = None
        self._where: dict[str, tuple[int, int]] = {}
        self.band_changes: deque[tuple[float, str, int, int]] = deque(maxlen=10_000)  # (unix s, node, GPU, band)
        self._capped: dict[tuple[str, int], int] = {}  # (node, GPU index) -> cap in W we asked for
        self._queue_status_sent: dict[str, dict[str, Any]] = {}
        self._last_throttle = 0.0
        self._last_queue_status = 0.0
        self.control_publish: Any = None  # async callable(AgentControl) | None
        self._applied_at = 0.0
        # API calls block (the official client is synchronous): they get threads of their own,
        # enough for ``bind_workers`` binds plus evictions and events.
        self._pool = ThreadPoolExecutor(max_workers=settings.bind_workers + 8, thread_name_prefix="kube-api")
        self.snapshot = QueueSnapshot()

    # ------------------------------------------------------------------ lifecycle
    async def start(self, sync_timeout_s: float = 60.0) -> None:
        self._loop = asyncio.get_running_loop()
        core, custom = self.api.core, self.api.custom
        specs = [
            WatchSpec("nodes", core.list_node),
            WatchSpec("pods", core.list_pod_for_all_namespaces, "status.phase!=Succeeded,status.phase!=Failed"),
            WatchSpec("gpuqueues", lambda **kw: custom.list_cluster_custom_object(
                "gpuaware.io", "v1alpha1", "gpuqueues", **kw)),
        ]
        for spec in specs:
            self._informers.append(Informer(spec, self._on_sync(spec.name), self._on_event(spec.name)).start())
        await asyncio.to_thread(wait_synced, self._informers, sync_timeout_s)

    async def stop(self) -> None:
        for inf in self._informers:
            await asyncio.to_thread(inf.stop)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _on_sync(self, name: str):
        return lambda items: self._put((name, "SYNC", items))

    def _on_event(self, name: str):
        return lambda kind, obj: self._put((name, kind, obj))

    def _put(self, item: tuple[str, str, Any]) -> None:
        """From an informer thread: blocks while the inbox is full (back-pressure on the watch)."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._inbox.put(item), self._loop).result()

    async def run(self, stop: asyncio.Event) -> None:
        """Apply changes and schedule until ``stop``; schedules only while ``leading`` is set."""
        last_pass = last_snapshot = 0.0
        while not stop.is_set():
            try:
                item = await asyncio.wait_for(self._inbox.get(), self.settings.pass_interval_s)
                self._apply(item)
                while not self._inbox.empty():
                    self._apply(self._inbox.get_nowait())
            except TimeoutError:
                pass
            self.stats.leader = self.leading.is_set()
            due = self._dirty or time.monotonic() - last_pass >= 1.0
            if self.leading.is_set() and due:
                await asyncio.sleep(self.settings.pass_interval_s)  # batch what arrives together
                while not self._inbox.empty():
                    self._apply(self._inbox.get_nowait())
                self.schedule_once()
                last_pass = time.monotonic()
            if self.leading.is_set():
                self._periodic(time.time())
            if time.monotonic() - last_snapshot >= 1.0:  # gauges for scrapes and the live view
                self._snapshot()
                last_snapshot = time.monotonic()

    # ------------------------------------------------------------------ changes
    def _apply(self, item: tuple[str, str, Any]) -> None:
        try:
            self._apply_one(item)
        except Exception:  # one odd object must not stop the scheduler; the next re-list repairs the cache
            log.exception("could not apply %s %s", item[0], item[1])

    def _apply_one(self, item: tuple[str, str, Any]) -> None:
        name, kind, obj = item
        self._dirty = True
        if name == "nodes":
            self.cache.sync_nodes(obj) if kind == "SYNC" else self.cache.node_event(kind, obj)
            self._scheduler = None  # its plugin caches are per cluster arrays
        elif name == "pods":
            if kind == "SYNC":
                self.cache.sync_pods(obj)
                for pod in obj:
                    self._learn_shape(pod)
                return
            left = self.cache.pod_event(kind, obj)
            if left is not None:
                self._reported.pop(left, None)
                event = self._gone.pop(left, None)
                if event is not None:
                    event.set()
            elif kind == "ADDED":
                self._learn_shape(obj)
        elif name == "gpuqueues":
            self.cache.sync_queues(obj) if kind == "SYNC" else self.cache.queue_event(kind, obj)

    def _learn_shape(self, pod: dict[str, Any]) -> None:
        self._mix.add(self.cache.workload(pod))

    def core(self) -> Scheduler:
        """The framework with the configured policy; the workload mix its scores read follows the pods seen."""
        seen = len(self._mix)
        if self._scheduler is None or seen - self._mix_at_build >= MIX_REBUILD_EVERY:
            self._scheduler = Scheduler(profile(self.settings.policy, self._mix, 0))
            self._mix_at_build = seen
        return self._scheduler

    # ------------------------------------------------------------------ the pass
    def _ledger(self) -> TenantLedger:
        c = self.cache.cluster
        tenants = {q.tenant: Tenant(q.tenant, q.weight, int(q.quota_gpus * 1000), q.borrow)
                   for q in self.cache.queues.values()}
        ledger = TenantLedger(tenants, max(c.total_gpu_milli, 1), max(int(c.mem_cap.sum()), 1))
        for r in self.cache.running.values():
            ledger.charge(r.workload)
        return ledger

    def schedule_once(self) -> None:
        """One pass: live state in, gangs, then the queue. Placements and evictions start as tasks."""
        started = time.perf_counter()
        self._dirty = False
        now = time.time()
        self._apply_live_state(now)
        self._report_rejected()
        cache = self.cache
        if not cache.pending or len(cache.cluster) == 0:
            return
        core = self.core()
        ledger = self._ledger()
        hooks = _Hooks(self)
        singles, gangs = [], {}
        for _key, pw in cache.pending.items():
            if pw.workload.gang:
                gangs.setdefault(pw.workload.gang, []).append(pw)
            else:
                singles.append(pw.workload)
        for gang, members in gangs.items():
            self._place_gang(core, gang, members, hooks, now)
        finish_at = {k: r.started_s + (r.workload.duration_s or UNKNOWN_DURATION_S) for k, r in cache.running.items()}
        queue = QueueState(singles, cache.running, finish_at, ledger, cache.node_mask)
        pass_stats = PassStats()
        schedule_pass(core, cache.cluster, queue, self.queue_policy, hooks, pass_stats, now)
        for lat in pass_stats.latencies_s:
            self.stats.decision_latency.observe(lat)
            self.stats.decision_latencies.append(lat)
        for w in singles:
            if w.id in cache.pending:
                self._unschedulable(w, hooks.reasons.get(
                    w.id, "not tried this pass: an identical request did not fit, or the pass budget ran out"))
        self.stats.pass_latency.observe(time.perf_counter() - started)

    def _place_gang(self, core: Scheduler, gang: str, members: list[PodWorkload], hooks: _Hooks, now: float) -> None:
        size = max(m.gang_size for m in members)
        bound = sum(1 for r in self.cache.running.values() if r.workload.gang == gang)
        if len(members) + bound < size:
            for m in members:
                self._unschedulable(m.workload, f"gang {gang}: {len(members) + bound} of {size} members exist; "
                                                "waiting for all before placing any")
            return
        decisions, reasons = place_gang(core, self.cache.cluster, [m.workload for m in members], self.cache.node_mask)
        if not decisions:
            for m in members:
                self._unschedulable(m.workload, reasons[0])
            return
        for d in decisions:
            hooks.start(d.workload, d, now)

    def _unschedulable(self, w: Workload, reason: str) -> None:
        pod = self.cache.pods.get(w.id)
        if pod is None or self._reported.get(w.id) == reason:
            return
        self._reported[w.id] = reason
        self.stats.decisions[("UNSCHEDULABLE", _reason_class(reason))] += 1
        self._spawn(self._event(pod, "FailedScheduling", reason, "Warning"))
        self._spawn(self.sink.record(Outcome(w.id, DecisionAction.UNSCHEDULABLE, None, [reason]), w))

    def _report_rejected(self) -> None:
        for key, rej in self.cache.rejected.items():
            if self._reported.get(key) != rej.reason:
                self._reported[key] = rej.reason
                self.stats.decisions[("UNSCHEDULABLE", "invalid-request")] += 1
                self._spawn(self._event(rej.pod, "FailedScheduling", f"invalid gpuaware request: {rej.reason}",
                                        "Warning"))

    # ------------------------------------------------------------------ live GPU state
    def _apply_live_state(self, now: float) -> None:
        if self.view is None:
            return
        # New records, a rebuilt model, or time passing (staleness) change what the model should say.
        key = (self.view.version, id(self.cache.cluster))
        if key == self._applied_view and now - self._applied_at < 1.0:
            return
        self._applied_view, self._applied_at = key, now
        c = self.cache.cluster
        where: dict[str, tuple[int, int]] = {}
        for node_name, ns in self.view.nodes.items():
            i = c.index.get(node_name)
            if i is not None:
                for g in ns.gpus:
                    if g.index < c.max_gpus:
                        where[g.uuid] = (i, g.index)
        self._where = where
        before = c.band.copy()
        self.view.apply(c, where.get, int(now * 1000))
        self.cache.apply_cordons()  # a cordon stands whatever the stream says
        for i, g in np.argwhere(c.band != before):
            self.band_changes.append((now, c.names[int(i)], int(g), int(c.band[i, g])))
        for gpu_uuid, state in self.view.gpus.items():
            if gpu_uuid not in where:
                continue
            i, g = where[gpu_uuid]
            key = (c.names[i], g)
            if state.health_band != HealthBand.CRITICAL:
                self._critical_seen.discard(key)  # turning critical again (after a repair) acts again
            elif key not in self._critical_seen:
                self._critical_seen.add(key)
                self._spawn(self._cordon_and_migrate(c.names[i], g, gpu_uuid))

    async def _cordon_and_migrate(self, node: str, gpu: int, gpu_uuid: str) -> None:
        # The span continues the trace of the state that turned the GPU critical (agent event -> stream
        # state), so the decisions published inside it carry that trace to scheduler.decisions.v1.
        parent = observability.extract_context(self.view.band_trace.get(gpu_uuid) if self.view else None)
        attributes = {"gpuaware.node": node, "gpuaware.gpu.index": gpu, "gpuaware.gpu.uuid": gpu_uuid}
        with observability.tracer(__name__).start_as_current_span("scheduler.cordon_and_migrate", context=parent,
                                                                  attributes=attributes):
            await self._cordon(node, gpu)
            await self._migrate_off(node, gpu)

    async def _cordon(self, node: str, gpu: int) -> None:
        try:
            await self._call(self.api.cordon_gpu, node, gpu)
            self.stats.decisions[("CORDON", "gpu-critical")] += 1
            await self.sink.record(Outcome(f"{node}/gpu{gpu}", DecisionAction.CORDON, node,
                                           [f"GPU {gpu} of {node} is critical: cordoned"]), None)
        except ApiException as exc:
            self._api_failed("patch-node", exc)
            self._critical_seen.discard((node, gpu))  # tried again on the next state update
        except TRANSPORT_ERRORS as exc:
            self.stats.api_errors[("patch-node", 0)] += 1
            self._critical_seen.discard((node, gpu))
            log.warning("could not cordon GPU %d of %s: %s", gpu, node, exc)

    async def _migrate_off(self, node: str, gpu: int) -> None:
        i = self.cache.cluster.index.get(node)
        victims = [r for r in list(self.cache.running.values()) if r.allocation.node == i and gpu in r.allocation.gpus]
        for r in victims:
            pod = self.cache.pods.get(r.workload.id)
            if pod is None or r.workload.id in self._evicting:
                continue
            self.cache.release(r.workload.id)
            self._evicting.add(r.workload.id)
            reason = f"GPU {gpu} of {node} turned critical: checkpoint and move"
            self.stats.decisions[("MIGRATE", "gpu-critical")] += 1
            await self.sink.record(Outcome(r.workload.id, DecisionAction.MIGRATE, node, [reason]), r.workload)
            self._spawn(self._evict(pod, r, reason, "Migrated"))

    # ------------------------------------------------------------------ actions
    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _api_failed(self, verb: str, exc: ApiException) -> tuple[int, str, str]:
        code, reason, message = api_error(exc)
        self.stats.api_errors[(verb, code)] += 1
        return code, reason, message

    async def _event(self, pod: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        try:
            await self._call(self.api.event, pod, reason, message, type_)
        except ApiException as exc:
            self._api_failed("create-event", exc)
        except TRANSPORT_ERRORS as exc:  # an Event is best effort, as in kube-scheduler
            self.stats.api_errors[("create-event", 0)] += 1
            log.warning("event %s on %s not written: %s", reason, objects.key(pod), exc)

    async def bind(self, w: Workload, d: Decision, victims: list[str]) -> None:
        key, alloc = w.id, d.allocation
        assert alloc is not None
        ns, name = key.split("/", 1)
        node = self.cache.node_name(alloc.node)
        uuids = self._uuids(node)
        async with self._bind_slots:
            started = time.perf_counter()
            try:
                for v in victims:  # the preemptor lands only once its victims are gone
                    gone = self._gone.setdefault(v, asyncio.Event())
                    if v in self.cache.pods:
                        await asyncio.wait_for(gone.wait(), self.settings.checkpoint_timeout_s
                                               + self.settings.eviction_timeout_s)
                # One write: the GPUs are on the pod from the moment it has a node (the device plugin reads them).
                await self._call(self.api.bind, ns, name, node, {
                    annotations.ANN_GPUS: objects.gpus_annotation(alloc, uuids),
                    annotations.ANN_SHARING: objects.sharing_annotation(alloc)})
            except TimeoutError:
                self._requeue(key, f"victims of {key} were not gone in time; placement withdrawn")
                return
            except TRANSPORT_ERRORS as exc:
                self.stats.api_errors[("bind", 0)] += 1
                # Unknown whether the Binding landed: the pod's next watch event says; until then it is requeued
                # and a second Binding would get 409 (kept as the API's answer).
                self._requeue(key, f"bind interrupted: {exc}")
                return
            except ApiException as exc:
                code, reason, message = self._api_failed("bind", exc)
                self.cache.unreserve(key)
                self.cache.release(key)
                if code == 409:
                    log.info("%s: %s (already bound elsewhere: keeping the API's answer)", key, message)
                elif code != 404:
                    log.warning("%s: bind failed %s %s: %s; requeued", key, code, reason, message)
                    self._requeue(key, f"bind failed: {reason}")
                self._dirty = True
                return
            self.stats.bind_latency.observe(time.perf_counter() - started)
        pod = self.cache.pods.get(key, {"metadata": {"name": name, "namespace": ns}})
        gpus = ", ".join(f"{g}:{m}m" for g, m in zip(alloc.gpus, alloc.milli, strict=True)) or "none"
        self.stats.decisions[("PLACE", "preempted" if victims else "fits")] += 1
        self.stats.waited(w.tenant, w.priority, time.time() - w.submit_s)
        self._reported.pop(key, None)
        assignments = [GpuAssignment(uuids.get(g) or f"{node}/{g}", m, w.gpu_memory_mib)
                       for g, m in zip(alloc.gpus, alloc.milli, strict=True)]
        await asyncio.gather(
            self._event(pod, "Scheduled", f"Successfully assigned {key} to {node} (GPUs {gpus}; "
                                          f"{'; '.join(d.reasons)})"),
            self.sink.record(Outcome(key, DecisionAction.PLACE, node, d.reasons), w, assignments,
                             objects.sharing_annotation(alloc), d.score, d.latency_s))

    def _requeue(self, key: str, why: str) -> None:
        self.cache.unreserve(key)
        self.cache.release(key)
        pod = self.cache.pods.get(key)
        if pod is not None and not pod.get("spec", {}).get("nodeName"):
            self.cache._queue_if_ours(pod)
        log.info("%s: %s", key, why)
        self._dirty = True

    async def _evict(self, pod: dict[str, Any], r: Running, reason: str, event_reason: str) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        key = objects.key(pod)
        try:
            if r.workload.checkpointable and self.settings.checkpoint_timeout_s > 0:
                asked = now_rfc3339()
                await self._call(self.api.annotate_pod, ns, name, {annotations.ANN_CHECKPOINT_REQUEST: asked})
                await self._await_checkpoint(key, asked)
            await self._event(pod, event_reason, reason, "Normal")
            deadline = time.monotonic() + self.settings.eviction_timeout_s
            while True:
                try:
                    await self._call(self.api.evict, ns, name)
                    return
                except ApiException as exc:
                    if exc.status == 404:  # already gone (finished, or deleted by its owner): nothing to do
                        return
                    code, _, message = self._api_failed("evict", exc)
                    if code != 429 or time.monotonic() > deadline:
                        raise
                    log.info("%s: eviction blocked (%s); retrying", key, message)
                    await asyncio.sleep(self.settings.eviction_retry_s)
                except TRANSPORT_ERRORS:
                    self.stats.api_errors[("evict", 0)] += 1
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(self.settings.eviction_retry_s)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            code, reason_, message = api_error(exc) if isinstance(exc, ApiException) else (0, "transport", str(exc))
            log.warning("%s: could not evict (%s %s: %s); it keeps its GPUs", key, code, reason_, message)
            await self._event(pod, "EvictionFailed", f"{reason}: eviction failed: {message}", "Warning")
            self.cache.rebuild()  # it still runs: account it again
        finally:
            self._evicting.discard(key)

    async def _await_checkpoint(self, key: str, asked: str) -> None:
        deadline = time.monotonic() + self.settings.checkpoint_timeout_s
        while time.monotonic() < deadline:
            pod = self.cache.pods.get(key)
            if pod is None:
                return
            done = (pod["metadata"].get("annotations") or {}).get(annotations.ANN_CHECKPOINT_DONE, "")
            if done and done >= asked:
                return
            await asyncio.sleep(0.2)
        log.info("%s: no checkpoint within %.0fs; evicting anyway", key, self.settings.checkpoint_timeout_s)

    def _uuids(self, node: str) -> dict[int, str]:
        if self.view is None or node not in self.view.nodes:
            return {}
        return {g.index: g.uuid for g in self.view.nodes[node].gpus}

    # ------------------------------------------------------------------ throttling and queue status
    def _periodic(self, now: float) -> None:
        if now - self._last_throttle >= self.settings.throttle_every_s:
            self._last_throttle = now
            self._throttle()
        if now - self._last_queue_status >= self.settings.queue_status_every_s and self.cache.queues:
            self._last_queue_status = now
            self._spawn(self._write_queue_status())

    def _throttle(self) -> None:
        """Power caps from the core's throttle policy, sent to the agents on agent.control.v1."""
        if self.view is None:
            return
        c = self.cache.cluster
        power = np.zeros(c.gpu_free.shape)
        for gpu_uuid, (i, g) in self._where.items():
            state = self.view.gpus.get(gpu_uuid)
            if state is not None:
                power[i, g] = state.power_w
        prio = np.full(c.gpu_free.shape, -1)
        for r in self.cache.running.values():
            for g in r.allocation.gpus:
                prio[r.allocation.node, g] = max(prio[r.allocation.node, g], r.workload.priority)
        budget = np.full(len(c), self.settings.node_power_budget_w or np.inf)
        actions = throttle_decisions(power, c.temp, c.gpu_exists, budget, prio)
        want = {(c.names[a.node], a.gpu): (max(1, int(a.cap_w)), a.reason) for a in actions}
        uuid_of = {v: k for k, v in self._where.items()}
        for (node, g), (cap, reason) in want.items():
            if self._capped.get((node, g)) != cap:
                self._capped[(node, g)] = cap
                self._spawn(self._send_cap(node, g, uuid_of.get((c.index[node], g)), cap, reason))
        for (node, g) in [k for k in self._capped if k not in want]:
            del self._capped[(node, g)]
            i = c.index.get(node)
            self._spawn(self._send_cap(node, g, uuid_of.get((i, g)) if i is not None else None, 0,
                                       "back within budget and temperature"))

    async def _send_cap(self, node: str, gpu: int, gpu_uuid: str | None, cap_w: int, reason: str) -> None:
        what = f"power cap {cap_w} W on GPU {gpu} of {node}" if cap_w else f"power cap lifted on GPU {gpu} of {node}"
        self.stats.decisions[("THROTTLE", "thermal" if reason.startswith("thermal") else
                              "power" if cap_w else "lifted")] += 1
        await self.sink.record(Outcome(f"{node}/gpu{gpu}", DecisionAction.THROTTLE, node, [what, reason]), None)
        if self.control_publish is None or gpu_uuid is None:
            return
        try:
            await self.control_publish(AgentControl(uuid.uuid4().hex, int(time.time() * 1000), node,
                                                    ControlKind.POWER_CAP, None, gpu_uuid, cap_w, self.settings.name))
        except Exception as exc:  # the next round sends it again
            self._capped.pop((node, gpu), None)
            log.warning("could not send %s: %s", what, exc)

    async def _write_queue_status(self) -> None:
        """GPUQueue status: admitted, running and pending pods, GPUs used per model and borrowed."""
        c = self.cache.cluster
        for name, q in list(self.cache.queues.items()):
            tenant, quota = q.tenant, q.quota_gpus
            running = [r for r in self.cache.running.values() if r.workload.tenant == tenant]
            by_model: dict[str, float] = {}
            for r in running:
                model = str(c.models[r.allocation.node])
                by_model[model] = by_model.get(model, 0.0) + sum(r.allocation.milli) / 1000
            used = sum(by_model.values())
            status = {
                "admitted": len(running),  # placed: bound, or binding in flight
                "running": sum(1 for r in running if r.workload.id not in self.cache.reservations),
                "pending": sum(1 for pw in self.cache.pending.values() if pw.workload.tenant == tenant),
                "borrowedGpus": round(max(0.0, used - quota), 3),
                "quotaUsed": [{"model": m, "gpus": round(v, 3)} for m, v in sorted(by_model.items())],
                "observedGeneration": q.generation,
            }
            if self._queue_status_sent.get(name) == status:
                continue
            try:
                await self._call(self.api.patch_queue_status, name, status)
                self._queue_status_sent[name] = status
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                self.stats.api_errors[("patch-queue-status", getattr(exc, "status", 0) or 0)] += 1

    # ------------------------------------------------------------------ gauges
    def _snapshot(self) -> None:
        c, now = self.cache.cluster, time.time()
        snap = QueueSnapshot()
        for pw in self.cache.pending.values():
            k = (pw.workload.tenant, PRIORITY_NAMES.get(pw.workload.priority, "low"))
            snap.pending[k] = snap.pending.get(k, 0) + 1
            snap.oldest_wait_s[k] = max(snap.oldest_wait_s.get(k, 0.0), now - pw.workload.submit_s)
        weights = {}
        for q in self.cache.queues.values():
            snap.gpus_quota[q.tenant] = q.quota_gpus
            weights[q.tenant] = q.weight
        busy = allocated = 0.0
        for r in self.cache.running.values():
            t = r.workload.tenant
            snap.gpus_used[t] = snap.gpus_used.get(t, 0.0) + sum(r.allocation.milli) / 1000
            for g, m in zip(r.allocation.gpus, r.allocation.milli, strict=True):
                busy += float(c.util[r.allocation.node, g]) / 100 * m / 1000
                allocated += m / 1000
        if allocated and self.view is not None:  # without live state there is no utilisation to speak of
            snap.allocated_busy_ratio = round(busy / allocated, 4)
        for t, used in snap.gpus_used.items():
            if t in snap.gpus_quota:
                snap.gpus_borrowed[t] = max(0.0, used - snap.gpus_quota[t])
        shares = [snap.gpus_used.get(t, 0.0) / w for t, w in weights.items()]
        snap.jain = jain_index(shares)
        snap.running = len(self.cache.running)
        snap.cordoned_gpus = sum(len(v) for v in self.cache.cordoned.values())
        if self.view is not None:
            snap.stale_gpus = len(self.view.stale(int(now * 1000)))
        snap.allocated_gpu_share = c.allocated_gpu_milli / c.total_gpu_milli if c.total_gpu_milli else 0.0
        self.snapshot = snap


class _Hooks:
    """What a pass's decisions do in a live cluster."""

    def __init__(self, live: LiveScheduler):
        self.live = live
        self.victims: dict[str, list[str]] = {}
        self.reasons: dict[str, str] = {}

    def evict(self, victim: Running, preemptor: Workload, now: float) -> None:
        live, key = self.live, victim.workload.id
        pod = live.cache.pods.get(key)
        live.cache.release(key)
        self.victims.setdefault(preemptor.id, []).append(key)
        if pod is None or key in live._evicting:
            return
        live._evicting.add(key)
        live._gone.setdefault(key, asyncio.Event())
        reason = f"preempted by {preemptor.id} (priority {PRIORITY_NAMES.get(preemptor.priority)})"
        live.stats.decisions[("PREEMPT", "priority")] += 1
        live._spawn(live.sink.record(Outcome(key, DecisionAction.PREEMPT, live.cache.cluster.names[
            victim.allocation.node], [reason]), victim.workload))
        live._spawn(live._evict(pod, victim, reason, "Preempted"))

    def blocked(self, workload: Workload, decision: Decision, now: float) -> None:
        self.reasons[workload.id] = "; ".join(decision.reasons)

    def start(self, workload: Workload, decision: Decision, now: float) -> None:
        live, key = self.live, workload.id
        assert decision.allocation is not None
        live.cache.reserve(key, Running(workload, decision.allocation, now, 0.0, None))
        live._spawn(live.bind(workload, decision, self.victims.pop(key, [])))


def _reason_class(reason: str) -> str:
    """A low-cardinality label for a FailedScheduling reason."""
    for needle, label in (("gang", "gang-incomplete"), ("insufficient cpu", "cpu-memory"),
                          ("free GPUs", "gpus"), ("enough free compute", "gpus"), ("health", "health"),
                          ("model", "gpu-model"), ("capabilit", "capabilities"), ("reserved", "reservation")):
        if needle in reason:
            return label
    return "other"

