"""One scheduling pass over the queue, by the same core as the simulator (``gpuaware.scheduler.core.cycle``).

Before a pass, each pending pod's runtime estimate is taken from the runtime table the feed keeps
(``gpuaware.scheduler.runtimes``: a forecast from its signature, or its declared duration calibrated), cached per
pod until the table changes; without a table, or with a stale one, a declared duration is exact and any other is
unknown.

Complete gangs are placed all or nothing first, then single pods through ``schedule_pass`` (queue
order, fair shares, preemption). A pass only decides: each placement becomes a bind task
(``Binder``), each preempted victim an eviction task (``Evictor``), through ``PassActions``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import numpy as np

from gpuaware.contract.events import DecisionAction
from gpuaware.contract.runtime import declared_keys, owner_of
from gpuaware.scheduler.core.cycle import (
    PassStats,
    QueuePolicy,
    QueueState,
    place_gang,
    quota_mask,
    request_shape,
    schedule_pass,
)
from gpuaware.scheduler.core.framework import Decision, Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.queue import TenantLedger
from gpuaware.scheduler.core.runtime import PredictedEnds
from gpuaware.scheduler.core.status import Code, Reason, label_of, reason_label
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from gpuaware.scheduler.kube.binder import Binder
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.completions import keys_of
from gpuaware.scheduler.kube.decisions import DecisionSink, Outcome
from gpuaware.scheduler.kube.departures import Departures
from gpuaware.scheduler.kube.dra.state import claim_key
from gpuaware.scheduler.kube.evictor import Evictor
from gpuaware.scheduler.kube.objects import PodWorkload
from gpuaware.scheduler.kube.tasks import Tasks
from gpuaware.scheduler.kube.unschedulable import UnschedulableReporter
from gpuaware.scheduler.metrics import PRIORITY_NAMES, SchedulerStats
from gpuaware.scheduler.runtimes import RuntimeTable
from gpuaware.scheduler.settings import SchedulerSettings

MIX_REBUILD_EVERY = 256  # pods seen before the scores built from the workload mix (FGD, model reservation) are rebuilt
GANG_LABEL = label_of(Code.GANG_INCOMPLETE)


class PassActions:
    """What a pass's decisions do in a live cluster (``gpuaware.scheduler.core.cycle.PassHooks``)."""

    def __init__(self, cache: ClusterCache, binder: Binder, evictor: Evictor, departures: Departures,
                 sink: DecisionSink, stats: SchedulerStats, tasks: Tasks):
        self.cache, self.binder, self.evictor, self.departures = cache, binder, evictor, departures
        self.sink, self.stats, self.tasks = sink, stats, tasks
        self.victims: dict[str, list[str]] = {}  # preemptor -> pods evicted for it
        self.reasons: dict[str, str] = {}  # pod -> why it was blocked
        self.labels: dict[str, str] = {}  # pod -> the low-cardinality label of why (from the reason codes)
        self.shapes: dict[tuple, tuple[str, str]] = {}  # request shape -> (reason, label) of one that did not fit

    def evict(self, victim: Running, preemptor: Workload, now: float) -> None:
        key = victim.workload.id
        pod = self.cache.pods.get(key)
        self.cache.release(key)
        self.victims.setdefault(preemptor.id, []).append(key)
        if pod is None or not self.evictor.claim(key):
            return
        self.departures.expect(key)
        reason = f"preempted by {preemptor.id} (priority {PRIORITY_NAMES.get(preemptor.priority)})"
        self.stats.decisions[("PREEMPT", "priority")] += 1
        self.tasks.spawn(self.sink.record(Outcome(key, DecisionAction.PREEMPT, self.cache.cluster.names[
            victim.allocation.node], [reason]), victim.workload))
        self.tasks.spawn(self.evictor.evict(pod, victim, reason, "Preempted"))

    def blocked(self, workload: Workload, decision: Decision, now: float) -> None:
        self.reasons[workload.id] = "; ".join(decision.reasons)
        self.labels[workload.id] = reason_label(decision)
        self.shapes.setdefault(request_shape(workload), (self.reasons[workload.id], self.labels[workload.id]))

    def why_not_placed(self, w: Workload) -> tuple[str, str] | None:
        """(reason, label) for a pod this pass left pending, or None when it was not tried (the pass budget ran
        out first, or the demand forecast held it): nothing to report for it yet, as kube-scheduler reports a
        pod only once it has tried it (an Event for every pod past the pass budget would be a write to the
        apiserver the Bindings wait on)."""
        if w.id in self.reasons:
            return self.reasons[w.id], self.labels[w.id]
        same = self.shapes.get(request_shape(w))
        return None if same is None else (f"an identical request did not fit: {same[0]}", same[1])

    def start(self, workload: Workload, decision: Decision, now: float) -> bool:
        key = workload.id
        assert decision.allocation is not None
        if key in self.cache.dra.asks and key not in self.cache.dra.picks:  # (a gang's are picked beforehand)
            # The core's GPUs as the claims' devices.
            why = self.cache.dra.pick_devices(key, decision.allocation, self.cache.cluster)
            if why is not None:
                self.reasons[key] = why
                self.labels[key] = "dra-devices"
                return False
        self.cache.assume(key, Running(workload, decision.allocation, now, 0.0, None))
        self.stats.forecasts.placed(key, workload.runtime)  # scored against the runtime when it completes
        uid = (self.cache.pods.get(key) or {}).get("metadata", {}).get("uid")  # of the pod decided for, now
        self.tasks.spawn(self.binder.bind(workload, decision, self.victims.pop(key, []), uid))
        return True


class SchedulingPass:
    def __init__(self, settings: SchedulerSettings, cache: ClusterCache, stats: SchedulerStats, sink: DecisionSink,
                 binder: Binder, evictor: Evictor, departures: Departures, reporter: UnschedulableReporter,
                 tasks: Tasks, runtimes: RuntimeTable | None = None):
        self.settings, self.cache, self.stats, self.sink = settings, cache, stats, sink
        self.binder, self.evictor, self.departures, self.reporter, self.tasks = \
            binder, evictor, departures, reporter, tasks
        knobs = {"pass_budget": settings.pass_budget, "order": settings.queue_order}
        self.queue_policy = QueuePolicy(**knobs) if settings.policy == "gpuaware" else QueuePolicy.kube(**knobs)
        self._mix = WorkloadMix()
        self._deallocating: set[str] = set()  # claims being deallocated (``_strand``)
        self._mix_at_build = -1
        self._scheduler: Scheduler | None = None
        self.runtimes = runtimes
        # pod -> (table version, minute, declared, keys, declared keys, estimate): what ``estimate`` worked out last
        self._estimates: dict[str, tuple] = {}

    def estimate(self, w: Workload, now: float) -> None:
        """Set ``w.runtime`` from the runtime table (the module's docstring)."""
        table = self.runtimes
        if table is None:
            return
        minute = int(now // 60)  # staleness is judged again each minute even with no new record
        known = self._estimates.get(w.id)
        if known is not None and known[0] == table.version and known[1] == minute:
            w.runtime = known[5]
            return
        pod = self.cache.pods.get(w.id)
        if known is None or known[2] != w.duration_s:
            keys = keys_of(w, pod) if pod is not None else []
            dkeys = declared_keys(w.tenant, owner_of(pod) if pod is not None else None)
        else:
            keys, dkeys = known[3], known[4]
        w.runtime = table.estimate(keys, w.duration_s, dkeys, int(now * 1000))
        self._estimates[w.id] = (table.version, minute, w.duration_s, keys, dkeys, w.runtime)

    def learn(self, w: Workload) -> None:
        """A pod seen: its shape joins the workload mix the scores read."""
        self._mix.add(w)

    def nodes_changed(self) -> None:
        self._scheduler = None  # its plugin caches are per cluster arrays

    def core(self) -> Scheduler:
        """The framework with the configured policy; the workload mix its scores read follows the pods seen."""
        seen = len(self._mix)
        if self._scheduler is None or seen - self._mix_at_build >= MIX_REBUILD_EVERY:
            self._scheduler = Scheduler(profile(self.settings.policy, self._mix, 0))
            self._mix_at_build = seen
        return self._scheduler

    def ledger(self) -> TenantLedger:
        c = self.cache.cluster
        ledger = TenantLedger(self.cache.tenancy.tenants(), max(c.total_gpu_milli, 1), max(int(c.mem_cap.sum()), 1),
                              gpu_mem_by_model=self.cache.usage.gpu_mem_by_model)
        # From the sums the cache keeps as pods start and end: charging every running pod again cost ~9.5 ms a
        # pass with 4,000 running (0.01 ms from the sums), and grows with the cluster.
        ledger.charge_usage(self.cache.usage)
        return ledger

    def run(self, now: float, started: float | None = None) -> None:
        """Gangs, then the queue; placements and evictions start as tasks. ``started``: perf_counter at pass start."""
        started = time.perf_counter() if started is None else started
        cache = self.cache
        if not cache.pending or len(cache.cluster) == 0:
            return
        core = self.core()
        ledger = self.ledger()
        actions = PassActions(cache, self.binder, self.evictor, self.departures, self.sink, self.stats, self.tasks)
        for key in [k for k in cache.dra.resumes if k in cache.pending]:
            self._resume(key, actions, now)
        for key in [k for k in cache.dra.joins if k in cache.pending]:
            self._join(key, actions, now)
        singles, gangs = [], {}
        if self.runtimes is not None:
            for key in [k for k in self._estimates if k not in cache.pending]:
                del self._estimates[key]
        for key, pw in cache.pending.items():
            self.estimate(pw.workload, now)
            if key in cache.dra.resumes or key in cache.dra.joins:
                continue  # waiting for the node their claims name (above), never placed elsewhere
            if pw.workload.gang:
                gangs.setdefault(pw.workload.gang, []).append(pw)
            else:
                singles.append(pw.workload)
        for gang, members in gangs.items():
            self._place_gang(core, gang, members, actions, now, ledger)
        # When running work ends: by its runtime estimate (a declared duration), else unknown (never waited for).
        finish_at = PredictedEnds(cache.running, now)
        # Pods whose claims select devices on some nodes only (gpuaware.scheduler.kube.dra.claims), offer alternatives
        # (firstAvailable) or tolerate device taints go one at a time, with the node mask narrowed to their nodes
        # and the GPUs they tolerate lent to their cycle.
        alone = {w.id for w in singles if (ask := cache.dra.asks.get(w.id))
                 and (ask.nodes is not None or ask.then or ask.tolerating)}
        alone |= cache.dra.co_claimants(cache.pending) if cache.dra.asks else set()
        queue = QueueState([w for w in singles if w.id not in alone], cache.running, finish_at, ledger,
                           cache.node_mask, enforce_quota=True)
        pass_stats = PassStats()
        schedule_pass(core, cache.cluster, queue, self.queue_policy, actions, pass_stats, now)
        for w in sorted((w for w in singles if w.id in alone), key=lambda w: (w.submit_s, w.id)):
            if w.id in cache.pending:
                self._place_alone(core, w, finish_at, ledger, actions, pass_stats, now)
        for lat in pass_stats.latencies_s:
            self.stats.decision_latency.observe(lat)
            self.stats.decision_latencies.append(lat)
        for w in singles:
            if w.id in cache.pending and (why := actions.why_not_placed(w)) is not None:
                self.reporter.unschedulable(w, *why)
        self.stats.pass_latency.observe(time.perf_counter() - started)

    def _pick_gang_devices(self, gang: str, decisions: list[Decision], members: list[PodWorkload]) -> bool:
        """The claims' devices of every member with claims, or of none: all or nothing, as the gang."""
        picked: list[str] = []
        for d in decisions:
            key = d.workload.id
            if key not in self.cache.dra.asks:
                continue
            why = self.cache.dra.pick_devices(key, d.allocation, self.cache.cluster)
            if why is None:
                picked.append(key)
                continue
            for k in picked:
                self.cache.dra.drop_picks(k, k in self.cache.running)
            for other in decisions:  # pick_devices released the failed member's allocation already
                if other.workload.id != key and other.workload.id in self.cache.cluster.allocations:
                    self.cache.cluster.release(other.workload.id)
            for m in members:
                self.reporter.unschedulable(m.workload, f"gang {gang}: {why}; none of its members placed", GANG_LABEL)
            return False
        return True

    def _gang_claims_shared(self, gang: str, members: list[PodWorkload]) -> str | None:
        """Why a gang cannot go when a claim not allocated yet is named by two of its members, or is being
        allocated for a pod outside it: a gang's devices are picked for every member at once, so no member can
        wait for another's allocation and then join it."""
        keys = {m.workload.id for m in members}
        named: dict[str, str] = {}
        for m in members:
            ask = self.cache.dra.asks.get(m.workload.id)
            for claim in ask.claims if ask is not None else ():
                other = named.get(claim) or self.cache.dra.claim_owner.get(claim)
                if other is not None and other != m.workload.id and (claim in named or other not in keys):
                    return (f"gang {gang}: claim {claim} of {m.workload.id} is also {other}'s and not allocated yet; "
                            "a gang's claims are allocated per member (allocate it first, or give each its own)")
                named[claim] = m.workload.id
        return None

    def _resume(self, key: str, actions: PassActions, now: float) -> None:
        """A pod whose claims were allocated for it on a node before a restart is bound there (their devices)."""
        w = self.cache.pending[key].workload
        alloc = self.cache.dra.resume(key, self.cache.pending.get(key), self.cache.cluster)
        if alloc is None:
            self._strand(w, "its claims are allocated on a node that is gone")
            return
        node = self.cache.node_name(alloc.node)
        why = Reason(Code.SCHEDULED, "dra", f"{node} gpus={alloc.gpus}: its claims were allocated there already")
        actions.start(w, Decision(w, alloc, [why], nodes=len(self.cache.cluster)), now)

    def _place_alone(self, core: Scheduler, w: Workload, finish_at: Mapping[str, float], ledger: TenantLedger,
                     actions: PassActions, pass_stats: PassStats, now: float) -> None:
        """One pod whose claims narrow its nodes or offer alternatives: each alternative in order where it fits
        without preempting anyone (kube-scheduler takes a later subrequest before it preempts), then each in
        order with preemption; if none goes, it is left asking its first."""
        cache = self.cache
        if (why := cache.dra.claim_wait(w.id)) is not None:
            self.reporter.unschedulable(w, why, "dra-devices")
            return
        first = cache.dra.asks[w.id]
        asks = (first, *first.then)
        tries = [(ask, False) for ask in asks] + [(ask, True) for ask in asks] if first.then else [(first, True)]
        for ask, preempt in tries:
            wa = cache.try_ask(w.id, ask) if first.then else w
            mask = cache.node_mask if ask.nodes is None else \
                np.isin(np.asarray(cache.cluster.names), sorted(ask.nodes)) & cache.node_mask
            policy = self.queue_policy if preempt else dataclasses.replace(self.queue_policy,
                                                                           preemption_tries_per_pass=0)
            one = QueueState([wa], cache.running, finish_at, ledger, mask, enforce_quota=True)
            with cache.dra.tolerated(ask, cache.cluster):
                schedule_pass(core, cache.cluster, one, policy, actions, pass_stats, now, only=[wa])
            if w.id not in cache.pending:
                return
        if first.then:
            cache.try_ask(w.id, first)

    def _strand(self, w: Workload, why: str) -> None:
        """A pod whose claims are allocated where it cannot go: reported, and the claims deallocated where no
        other pod uses them (kube-scheduler's DRA PostFilter), so that it is placed afresh once they are."""
        pod = self.cache.pods.get(w.id)
        claims = [c for c in self.cache.dra.stranded_claims(pod) if claim_key(c) not in self._deallocating]
        if claims and pod is not None:
            keys = {claim_key(c) for c in claims}
            self._deallocating |= keys
            why += "; deallocating them, so that it can go elsewhere"

            async def deallocate() -> None:
                try:
                    await self.binder.claims.deallocate(claims, pod["metadata"]["uid"])
                finally:
                    self._deallocating -= keys

            self.tasks.spawn(deallocate())
        self.reporter.unschedulable(w, why, "dra-devices")

    def _join(self, key: str, actions: PassActions, now: float) -> None:
        """A pod whose claims are all allocated already (shared) goes to their node, with no device of its own."""
        cache = self.cache
        pw = cache.pending[key]
        w = pw.workload
        alloc, why = cache.dra.join(key, pw, cache.pods[key], cache.cluster, cache.node_mask)
        if alloc is None:
            self._strand(w, why)
            return
        node = self.cache.node_name(alloc.node)
        reason = Reason(Code.SCHEDULED, "dra", f"{node}: its claims are allocated there already (shared)")
        actions.start(w, Decision(w, alloc, [reason], nodes=len(self.cache.cluster)), now)

    def _place_gang(self, core: Scheduler, gang: str, members: list[PodWorkload], actions: PassActions,
                    now: float, ledger: TenantLedger | None = None) -> None:
        size = max(m.gang_size for m in members)
        bound = sum(1 for r in self.cache.running.values() if r.workload.gang == gang)
        if len(members) + bound < size:
            for m in members:
                self.reporter.unschedulable(m.workload, f"gang {gang}: {len(members) + bound} of {size} members "
                                                        "exist; waiting for all before placing any", GANG_LABEL)
            return
        first = members[0].workload
        if (why := self._gang_claims_shared(gang, members)) is not None:
            for m in members:
                self.reporter.unschedulable(m.workload, why, GANG_LABEL)
            return
        mask = self.cache.node_mask
        if ledger is not None:
            # The whole gang, or none of it, within the tenant's quota, borrowing limit and per-model quotas
            # and GPU memory caps: only models the whole gang fits stay open to it.
            mask, refused = quota_mask(self.cache.cluster, ledger, first, mask, [m.workload for m in members])
            if refused is not None:
                for m in members:
                    self.reporter.unschedulable(m.workload, f"gang {gang}: {refused.message}", GANG_LABEL)
                return
        for m in members:  # members whose claims select devices on some nodes only: the gang goes there
            ask = self.cache.dra.asks.get(m.workload.id)
            if ask is not None and ask.nodes is not None:
                mask = mask & np.isin(np.asarray(self.cache.cluster.names), sorted(ask.nodes))
        decisions, reasons = place_gang(core, self.cache.cluster, [m.workload for m in members], mask)
        if not decisions:
            for m in members:
                self.reporter.unschedulable(m.workload, reasons[0], GANG_LABEL)
            return
        if not self._pick_gang_devices(gang, decisions, members):
            return  # (nothing charged to the tenant for it)
        if ledger is not None:
            for d in decisions:
                ledger.charge(d.workload, model=str(self.cache.cluster.models[d.allocation.node]))
        for d in decisions:
            actions.start(d.workload, d, now)
