"""The custom scheduler: pods with ``schedulerName: gpuaware`` placed by the same core as the simulator.

``LiveScheduler`` owns the loop and composes one part per concern:
- informers (threads) list + watch nodes, pods and GPUQueues into a bounded inbox (back-pressure);
  the loop applies changes to ``ClusterCache`` and, while this replica leads, runs a scheduling
  pass (``scheduling``) on the queue, plus all-or-nothing placement of complete gangs;
- each placement is a bind task (``binder``), each eviction (preemption, migration) an eviction
  task (``evictor``: checkpoint, then the Eviction API); pods that cannot be placed get a
  ``FailedScheduling`` Event (``unschedulable``);
- live GPU state from Kafka (``gpuaware.scheduler.feed``) marks GPUs degraded/critical and stale
  (``live_state``); a GPU turning critical is cordoned and its pods moved (``health``);
- periodically: power caps (``throttler``), GPUQueue status (``queue_status``) and the Workload API gangs'
  ``PodGroupScheduled`` condition (``podgroup_status``); every second
  the gauges (``snapshot``). Decisions go to a ``DecisionSink`` with an optional publisher.

Restart-safe by construction: the queue and the allocations are rebuilt from the API (bound pods
carry their GPUs in annotations), pending pods are ordered by creation time, and the Binding API
refuses a second binding of a pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpuaware.plumbing.kube.api import Informer, KubeApi, WatchSpec, wait_synced
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube import podgroups
from gpuaware.scheduler.kube.binder import Binder
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.completions import CompletionPublisher, Completions, discard_completion, watch_selector
from gpuaware.scheduler.kube.decisions import DecisionPublisher, DecisionSink, discard_decision
from gpuaware.scheduler.kube.departures import Departures
from gpuaware.scheduler.kube.dra.device_taints import DeviceTaints
from gpuaware.scheduler.kube.evictor import Evictor
from gpuaware.scheduler.kube.live_state import LiveGpuState
from gpuaware.scheduler.kube.podgroup_status import PodGroupStatusWriter
from gpuaware.scheduler.kube.quarantine import HealthReactions
from gpuaware.scheduler.kube.queue_status import QueueStatusWriter
from gpuaware.scheduler.kube.scheduling import SchedulingPass
from gpuaware.scheduler.kube.snapshot import queue_snapshot
from gpuaware.scheduler.kube.tasks import Tasks
from gpuaware.scheduler.kube.throttler import ControlPublisher, Throttler, discard_control
from gpuaware.scheduler.kube.unschedulable import UnschedulableReporter
from gpuaware.scheduler.metrics import QueueSnapshot, SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)

INBOX = 10_000  # informer changes not yet applied; a full inbox blocks the watches
COMPLETED_PAGE = 500  # pods that succeeded, listed this many at a time



TAINT_RULES = ("resource.k8s.io", "v1beta2", "devicetaintrules")


async def _discover(custom: Any, resource: tuple[str, str, str], timeout_s: float) -> bool:
    """``_serves`` within the start's time: an API server that does not answer fails the start as the informers'
    sync would (TimeoutError), not with the client's connection error."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(_serves, custom, *resource), timeout_s)
    except (OSError, HTTPError) as exc:
        raise TimeoutError(f"the API server did not answer the discovery of {'/'.join(resource[:2])}: {exc}") from exc


def _serves(custom: Any, group: str, version: str, plural: str) -> bool:
    """Whether the apiserver serves ``plural`` in ``group/version`` (DeviceTaintRules: beta and off by default on
    1.36; PodGroups: alpha, gate GenericWorkload): a watch of an API not served would only fail, again and again."""
    try:
        found = custom.get_api_resources(group, version)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == plural for r in found.resources or [])


class LiveScheduler:
    def __init__(self, api: KubeApi, settings: SchedulerSettings, view: StateView | None = None,
                 stats: SchedulerStats | None = None, *, decisions: DecisionPublisher = discard_decision,
                 control: ControlPublisher = discard_control, may_act: Callable[[], bool] | None = None,
                 events_api: KubeApi | None = None, completions: CompletionPublisher = discard_completion):
        self.api, self.settings, self.view = api, settings, view
        # May this replica write to the API and the control topic right now? With leader election, the
        # elector's is_leader(), which turns False at the renew deadline even before the loop notices.
        self.may_act = may_act or (lambda: True)
        self.stats = stats or SchedulerStats()
        self.sink = DecisionSink(decisions, on_pod=self.stats.pod_decided)
        self.cache = ClusterCache(scheduler_name=settings.name, unqueued=settings.unqueued)
        self.leading = asyncio.Event()
        self.snapshot = QueueSnapshot()
        self.tasks = Tasks()
        # Enough threads for ``bind_workers`` binds plus evictions. ``events_api``: a client of their own for
        # Events (as kube-scheduler's), default ``api``.
        self.calls = ApiCalls(api, self.stats, settings.bind_workers + 8, lambda: self.may_act(),
                              events_api=events_api, event_qps=settings.event_qps, event_burst=settings.event_burst,
                              event_queue=settings.event_queue)
        self.departures = Departures()
        if view is not None:
            self.stats.runtimes = view.runtimes  # its size and age, on scrape
        table = view.runtimes if view is not None else None
        self.completions = Completions(completions, self.cache.known_workload, self.departures.expected,
                                       lambda: self.may_act(), self.tasks.spawn, self.stats.forecasts,
                                       (lambda: table.newest_ms) if table is not None else None,
                                       settings.runtime_stale_after_s)
        self.evictor = Evictor(self.calls, self.cache, settings, self.stats)
        self.unschedulable = UnschedulableReporter(self.calls, self.cache.view(), self.stats, self.sink, self.tasks)
        self.binder = Binder(self.calls, self.cache, settings, self.stats, self.sink, self.departures, view,
                             on_bound=self.unschedulable.forget, wake=self.wake)
        self.passes = SchedulingPass(settings, self.cache, self.stats, self.sink, self.binder, self.evictor,
                                     self.departures, self.unschedulable, self.tasks,
                                     view.runtimes if view is not None else None)
        self.queue_status = QueueStatusWriter(self.calls, self.cache.view(), self.stats)
        self.podgroup_status = PodGroupStatusWriter(self.calls, self.cache.view(), self.stats,
                                                    self.unschedulable.refusal)
        # Without live state there are no bands to apply, no critical GPUs and no power to cap.
        self.gpu_state: LiveGpuState | None = None
        self.health: HealthReactions | None = None
        self.throttler: Throttler | None = None
        if view is not None:
            self.gpu_state = LiveGpuState(view, self.cache)
            self.health = HealthReactions(view, self.calls, self.cache, self.stats, self.sink, self.evictor,
                                          self.tasks, DeviceTaints(api.client) if settings.device_taints else None)
            self.throttler = Throttler(view, self.gpu_state, self.cache.view(), settings, self.stats, self.sink,
                                       self.tasks, control, may_act=lambda: self.may_act(),
                                       record=lambda n, g, w: self.calls.call(self.api.record_power_cap, n, g, w))
        # Filled by the informer threads without a round trip through the loop per change (that cost a
        # coroutine, a future and two thread switches per watch event under a burst); a full inbox blocks
        # the watches (back-pressure). ``_arrived`` wakes the loop, once per batch (``_signalled``).
        self._inbox: queue.Queue[tuple[str, str, Any]] = queue.Queue(maxsize=INBOX)
        self._arrived = asyncio.Event()
        self._signalled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._informers: list[Informer] = []
        self._dirty = True
        self._last_throttle = 0.0
        self._last_queue_status = 0.0
        self._last_podgroup_status = 0.0

    # ------------------------------------------------------------------ lifecycle
    async def start(self, sync_timeout_s: float = 60.0) -> None:
        self._loop = asyncio.get_running_loop()
        core, custom = self.api.core, self.api.custom
        specs = [
            WatchSpec("nodes", core.list_node),
            WatchSpec("pods", core.list_pod_for_all_namespaces, "status.phase!=Succeeded,status.phase!=Failed"),
            WatchSpec("completed", core.list_pod_for_all_namespaces, watch_selector(self.settings.name),
                      page=COMPLETED_PAGE, keep=self.completions.keep),
            WatchSpec("gpuqueues", lambda **kw: custom.list_cluster_custom_object(
                "gpuaware.io", "v1alpha1", "gpuqueues", **kw)),
        ]
        if self.settings.dra:
            dra = self.api.resource
            specs += [WatchSpec("deviceclasses", dra.list_device_class),
                      WatchSpec("resourceslices", dra.list_resource_slice),
                      WatchSpec("resourceclaims", dra.list_resource_claim_for_all_namespaces)]
            if await _discover(custom, TAINT_RULES, sync_timeout_s):
                specs.append(WatchSpec("devicetaintrules", lambda **kw: custom.list_cluster_custom_object(
                    *TAINT_RULES, **kw)))
            else:
                log.info("DeviceTaintRules are not served (gate DRADeviceTaintRules, resource.k8s.io/%s): only the "
                         "slices' device taints keep claims off devices", TAINT_RULES[1])
        groups = (podgroups.GROUP, podgroups.VERSION, podgroups.PLURAL)
        if await _discover(custom, groups, sync_timeout_s):
            specs.append(WatchSpec("podgroups", lambda **kw: custom.list_cluster_custom_object(*groups, **kw)))
        else:
            log.info("PodGroups are not served (gate GenericWorkload, %s/%s): gangs come from gpuaware.io/gang only",
                     *groups[:2])
        for spec in specs:
            self._informers.append(Informer(spec, self._on_sync(spec.name), self._on_event(spec.name)).start())
        # The API threads start while the informers list, not one by one in the first pass's Bindings. Scheduling
        # waits on no list of the pods that succeeded (they may be tens of thousands, kept by their owners).
        needed = [inf for inf in self._informers if inf.spec.name != "completed"]
        await asyncio.gather(asyncio.to_thread(wait_synced, needed, sync_timeout_s),
                             asyncio.to_thread(self.calls.start_threads))

    async def stop(self) -> None:
        for inf in self._informers:
            await asyncio.to_thread(inf.stop)
        await self.tasks.cancel_all()
        self.calls.shutdown()

    def _on_sync(self, name: str):
        return lambda items: self._put((name, "SYNC", items))

    def _on_event(self, name: str):
        return lambda kind, obj: self._put((name, kind, obj))

    def _put(self, item: tuple[str, str, Any]) -> None:
        """From an informer thread: blocks while the inbox is full (back-pressure on the watch)."""
        assert self._loop is not None
        self._inbox.put(item)
        if not self._signalled:  # a wake-up already on its way covers this item too
            self._signalled = True
            self._loop.call_soon_threadsafe(self._wake_loop)

    def _wake_loop(self) -> None:
        self._signalled = False
        self._arrived.set()

    def _drain(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._apply(item)

    def wake(self) -> None:
        """Something changed that the next pass should see: run it without waiting for the clock."""
        self._dirty = True

    async def run(self, stop: asyncio.Event) -> None:
        """Apply changes and schedule until ``stop``; schedules only while ``leading`` is set."""
        last_pass = last_snapshot = 0.0
        led = False
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), self.settings.pass_interval_s)
            self._arrived.clear()
            self._drain()
            self.stats.leader = self.leading.is_set()
            if self.leading.is_set() != led:
                led = self.leading.is_set()
                if led:  # completions held while a standby (or before the first pass) are published now
                    self.completions.lead()
            due = self._dirty or time.monotonic() - last_pass >= 1.0
            if self.leading.is_set() and due:
                await asyncio.sleep(self.settings.pass_interval_s)  # batch what arrives together
                self._drain()
                self.schedule_once()
                last_pass = time.monotonic()
            if self.leading.is_set():
                self._periodic(time.time())
            if time.monotonic() - last_snapshot >= 1.0:  # gauges for scrapes and the live view
                self.snapshot = queue_snapshot(self.cache.view(), self.view, time.time())
                last_snapshot = time.monotonic()

    # ------------------------------------------------------------------ changes
    def _apply(self, item: tuple[str, str, Any]) -> None:
        try:
            self._apply_one(item)
        except Exception:  # one odd object must not stop the scheduler; the next re-list repairs the cache
            log.exception("could not apply %s %s", item[0], item[1])

    def _apply_one(self, item: tuple[str, str, Any]) -> None:
        name, kind, obj = item
        if name == "completed":  # job.completions.v1; nothing the pass reads
            self.completions.sync(obj) if kind == "SYNC" else self.completions.event(kind, obj)
            return
        self._dirty = True
        if name == "nodes":
            self.cache.sync_nodes(obj) if kind == "SYNC" else self.cache.node_event(kind, obj)
            self.passes.nodes_changed()
        elif name == "pods":
            if kind == "SYNC":
                self.cache.sync_pods(obj)
                for pod in obj:
                    self.passes.learn(self.cache.known_workload(pod))
                return
            left = self.cache.pod_event(kind, obj)
            if left is not None:
                self.unschedulable.forget(left)
                self.departures.left(left)
            elif kind == "ADDED":
                self.passes.learn(self.cache.known_workload(obj))
        elif name == "gpuqueues":
            self.cache.sync_queues(obj) if kind == "SYNC" else self.cache.queue_event(kind, obj)
        elif name == "podgroups":
            self.cache.sync_pod_groups(obj) if kind == "SYNC" else self.cache.pod_group_event(kind, obj)
        elif name == "deviceclasses":
            self.cache.sync_classes(obj) if kind == "SYNC" else self.cache.class_event(kind, obj)
        elif name == "resourceslices":
            self.cache.sync_slices(obj) if kind == "SYNC" else self.cache.slice_event(kind, obj)
            self.passes.nodes_changed()
        elif name == "resourceclaims":
            self.cache.sync_claims(obj) if kind == "SYNC" else self.cache.claim_event(kind, obj)
        elif name == "devicetaintrules":
            self.cache.sync_taint_rules(obj) if kind == "SYNC" else self.cache.taint_rule_event(kind, obj)
            self.passes.nodes_changed()

    # ------------------------------------------------------------------ the pass and periodic work
    def schedule_once(self) -> None:
        """One pass: live state in, rejected requests reported, then gangs and the queue."""
        started = time.perf_counter()
        self._dirty = False
        now = time.time()
        if self.gpu_state is not None and self.health is not None and self.gpu_state.apply(now):
            self.health.react(self.gpu_state.where, self.gpu_state.changed, self.gpu_state.uuid_at)
        self.unschedulable.report_rejected()
        self.passes.run(now, started)

    def _periodic(self, now: float) -> None:
        if now - self._last_throttle >= self.settings.throttle_every_s:
            self._last_throttle = now
            if self.throttler is not None:
                self.throttler.throttle()
        if now - self._last_queue_status >= self.settings.queue_status_every_s and self.cache.tenancy.queues:
            self._last_queue_status = now
            self.tasks.spawn(self.queue_status.write())
        if now - self._last_podgroup_status >= self.settings.queue_status_every_s and self.cache.podgroups.groups:
            self._last_podgroup_status = now
            self.tasks.spawn(self.podgroup_status.write())
