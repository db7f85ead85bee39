"""One scheduling pass over the queue: the part the simulator and the live scheduler share.

A pass walks the pending workloads in queue order and, for each, runs the framework's cycle
(``Scheduler.schedule``); when nothing fits it may preempt (checkpoint-aware victim selection,
reclaim of borrowed quota), wait for room that frees up soon instead, or reserve the node where a
blocked high-priority job will fit first and backfill only work that ends before then. Deferrable
work waits while the cluster runs above its peak threshold.

The pass itself does no I/O and keeps no clock: what happens to a started or evicted workload is
the caller's (``PassHooks``): the simulator moves its event clock, the live scheduler binds pods
and calls the Eviction API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpuaware.scheduler.core.cluster import ClusterState
from gpuaware.scheduler.core.demand import SIGNAL as DEMAND
from gpuaware.scheduler.core.demand import DemandOutlook
from gpuaware.scheduler.core.framework import Decision, Scheduler
from gpuaware.scheduler.core.policy_specs import ORDERS
from gpuaware.scheduler.core.preemption import Running, earliest_fit, select_victims
from gpuaware.scheduler.core.queue import TenantLedger, queue_order
from gpuaware.scheduler.core.runtime import SIGNAL as DURATION
from gpuaware.scheduler.core.runtime import expected_duration
from gpuaware.scheduler.core.status import Code, Reason
from gpuaware.scheduler.core.workload import PriorityLevel, Workload

PREEMPTION = "preemption"  # who reports preemption's reasons
QUOTA = "quota"
GANG = "gang"


@dataclass(frozen=True)
class QueuePolicy:
    """How a pass treats the queue. ``gpuaware`` turns everything on; ``kube`` is what a cluster does today."""

    fair_share: bool = True  # DRF order within a priority; off: FIFO
    defer_when_peak: bool = True
    patient_preemption: bool = True  # wait (per-priority grace) when running work frees room soon
    reclaim_borrowed: bool = True
    reserve_and_backfill: bool = True
    pass_budget: int = 64  # cycles per pass
    preemption_tries_per_pass: int = 4  # victim searches are the expensive part of a pass
    preempt_grace_s: tuple[float, float, float] = (0.0, 300.0, 30.0)  # per priority (low, medium, high)
    reclaim_after_s: float = 300.0  # an owner waits this long before its borrowed quota is reclaimed
    peak_util: float = 0.9
    defer_max_s: float = 3600.0
    demand_aware: bool = False  # defer and close borrowing by the demand forecast (``demand.py``) when there is one
    # Order within a priority (queue.queue_order): fair (DRF, or arrival without fair_share), fifo, las, predicted.
    order: str = "fair"
    aging_gpus: float = 0.1  # predicted order: GPU-seconds of predicted service forgiven per second waited

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"order: {self.order!r} is not one of {', '.join(ORDERS)}")
        if self.aging_gpus < 0:
            raise ValueError(f"aging_gpus: {self.aging_gpus} must be >= 0")

    @classmethod
    def kube(cls, **kw) -> QueuePolicy:
        return cls(fair_share=False, defer_when_peak=False, patient_preemption=False, reclaim_borrowed=False,
                   reserve_and_backfill=False, **kw)


@dataclass
class PassStats:
    deferred: set[str] = field(default_factory=set)
    backfilled: int = 0
    preemptions: int = 0
    reclaims: int = 0  # preemptions of borrowed work at the preemptor's priority or above
    preemptions_avoided: int = 0
    latencies_s: list[float] = field(default_factory=list)
    held_by_demand: int = 0  # cycles skipped because the demand forecast deferred the work or closed borrowing


class PassHooks(Protocol):
    def evict(self, victim: Running, preemptor: Workload, now: float) -> None:
        """Release the victim's allocation from the cluster model and requeue it."""

    def start(self, workload: Workload, decision: Decision, now: float) -> bool:
        """The workload got ``decision.allocation``: take it off the queue and record it running. False when it
        did not go after all (the live scheduler's devices for its claims could not be picked): its allocation
        is released and nothing is charged for it."""

    def blocked(self, workload: Workload, decision: Decision, now: float) -> None:
        """Nothing fits ``workload`` this pass; ``decision.why`` says why."""


@dataclass
class QueueState:
    """What a pass reads: the queue, the running work, and when each running workload should end (expected:
    ``runtime.PredictedEnds``; infinite when unknown)."""

    pending: list[Workload]
    running: dict[str, Running]
    finish_at: Mapping[str, float]
    ledger: TenantLedger | None
    node_mask: np.ndarray | None = None  # False: the node takes no new work (cordoned, not ready)
    # Hold each tenant to its limits (borrowing, per-model quota) and charge the ledger as the pass places
    # work. The live scheduler does; the simulator keeps its own ledger and limits no tenant.
    enforce_quota: bool = False
    demand: DemandOutlook | None = None  # the cluster demand forecast; None: none (or stale)
    attained: Mapping[str, float] | None = None  # GPU-seconds each pending workload has run so far (las, predicted)


def request_shape(w: Workload) -> tuple:
    """Workloads of one shape are alike to every filter: when one does not fit, the pass skips the others."""
    return (w.priority, w.cpu_milli, w.memory_mib, w.num_gpu, w.gpu_milli, w.models)


def schedule_pass(scheduler: Scheduler, cluster: ClusterState, queue: QueueState, policy: QueuePolicy,
                  hooks: PassHooks, stats: PassStats, now: float, only: list[Workload] | None = None) -> None:
    """Place what fits, in queue order. ``only``: try just these (an arrival alone cannot unblock others)."""
    ledger = queue.ledger if policy.fair_share else None
    order = only if only is not None else queue_order(queue.pending, policy.order, ledger, now, queue.attained,
                                                      policy.aging_gpus)
    by_duration = policy.order == "predicted"
    blocked: set[tuple] = set()
    attempts = 0
    reservation: tuple[int, float, int] | None = None  # (node, time, priority)
    victim_searches = 0
    outlook = queue.demand if policy.demand_aware else None
    defer = False
    if policy.defer_when_peak:
        now_share = cluster.allocated_gpu_milli / max(cluster.total_gpu_milli, 1)
        defer = outlook.defers(now_share, policy.peak_util) if outlook is not None else now_share >= policy.peak_util
    for w in order:
        if attempts >= policy.pass_budget:
            break
        if request_shape(w) in blocked:
            continue
        if defer and w.deferrable and now - w.submit_s < policy.defer_max_s:
            stats.deferred.add(w.id)
            stats.held_by_demand += outlook is not None
            continue
        if outlook is not None and outlook.blocks_borrowing(w, queue.ledger, policy.peak_util):
            stats.held_by_demand += 1
            continue
        attempts += 1
        mask = queue.node_mask
        if queue.enforce_quota and queue.ledger is not None:
            mask, refused = quota_mask(cluster, queue.ledger, w, mask)
            if refused is not None:
                hooks.blocked(w, Decision(w, None, [refused], None, 0.0, len(cluster)), now)
                continue
        backfill = reservation is not None and w.priority < reservation[2]
        held_off = backfill and now + expected_duration(w.runtime, w.duration_s) > reservation[1]
        if held_off:
            mask = np.ones(len(cluster), dtype=bool) if mask is None else mask.copy()
            mask[reservation[0]] = False  # would delay the reserved job: not on its node
        d = scheduler.schedule(cluster, w, mask)
        if d.allocation is not None and reservation is not None and w.priority < reservation[2]:
            stats.backfilled += 1
        stats.latencies_s.append(d.latency_s)
        if d.allocation is None:
            d, searched = _preempt_for(scheduler, cluster, queue, policy, hooks, stats, now, w, d,
                                       can_search=victim_searches < policy.preemption_tries_per_pass)
            victim_searches += searched
        if outlook is not None:
            d.signals = sorted({*d.signals, DEMAND})
        if (by_duration or backfill) and w.runtime is not None and w.runtime.source != "declared":
            # A learned runtime (forecast, or a declared one calibrated) ordered the queue or was checked against a
            # reservation; it steered when it kept the job off the reserved node.
            d.signals = sorted({*d.signals, DURATION})
            if held_off and d.allocation is not None:
                d.steered_by = sorted({*d.steered_by, DURATION})
        if d.allocation is None:
            hooks.blocked(w, d, now)
            blocked.add(request_shape(w))
            if policy.reserve_and_backfill and reservation is None and w.priority == PriorityLevel.HIGH:
                fit = earliest_fit(cluster.snapshot(), w, queue.running, queue.finish_at, now)
                if fit is not None:
                    reservation = (fit[0], fit[1], w.priority)
            continue
        if hooks.start(w, d, now) and queue.enforce_quota and queue.ledger is not None:
            queue.ledger.charge(w, model=str(cluster.models[d.allocation.node]))


def quota_mask(cluster: ClusterState, ledger: TenantLedger, w: Workload, mask: np.ndarray | None,
               members: Sequence[Workload] = ()) -> tuple[np.ndarray | None, Reason | None]:
    """The node mask narrowed to the GPU models ``w``'s tenant may still use (for ``members``, a whole gang:
    the models the whole gang fits); or why it may use none."""
    if not ledger.admits(w, sum(m.gpu_milli_total for m in members) if members else None):
        return mask, Reason(Code.QUOTA, QUOTA, f"tenant {w.tenant} has used its quota and borrowing limit")
    full = ledger.models_full(w, cluster.model_names, members)
    if not full:
        return mask, None
    allowed = ~np.isin(cluster.models, sorted(full))
    if not allowed.any():
        return mask, Reason(Code.QUOTA, QUOTA, f"tenant {w.tenant} has used its quota (GPUs or GPU memory) of "
                                               f"{', '.join(sorted(full))}")
    return (allowed if mask is None else mask & allowed), None


def _preempt_for(scheduler: Scheduler, cluster: ClusterState, queue: QueueState, policy: QueuePolicy,
                 hooks: PassHooks, stats: PassStats, now: float, w: Workload, d: Decision,
                 can_search: bool) -> tuple[Decision, bool]:
    """Make room for ``w`` by preempting, if its priority or owed quota allows; (decision, searched)."""
    ledger = queue.ledger
    owed = (policy.reclaim_borrowed and ledger is not None and ledger.within_quota(w)
            and now - w.submit_s >= policy.reclaim_after_s)
    wants_victims = w.priority > PriorityLevel.LOW or owed
    grace = policy.preempt_grace_s[min(w.priority, PriorityLevel.HIGH)]
    if wants_victims and policy.patient_preemption and not owed and grace > 0:
        fit = earliest_fit(cluster.snapshot(), w, queue.running, queue.finish_at, now)
        if fit is not None and fit[1] - now <= grace:
            stats.preemptions_avoided += 1  # room frees up soon: wait (and reserve) instead of evicting
            return d, False
    if not wants_victims or not can_search:
        return d, False
    # Reclaim only from tenants over their quota, at no higher priority: this converges (a tenant
    # under quota is never a reclaim victim) instead of trading GPUs back and forth.
    reclaim = (lambda r: r.workload.tenant != w.tenant and r.workload.priority <= w.priority
               and ledger.over_quota(r.workload.tenant) > 0) if owed and ledger is not None else None
    pick = select_victims(cluster.snapshot(), w, queue.running, now, allowed_nodes=queue.node_mask, reclaimable=reclaim)
    if pick is None:
        failed = Reason(Code.PREEMPTION_FAILED, PREEMPTION, "no node frees enough by preempting")
        return Decision(w, None, [*d.why, failed], None, d.latency_s, d.nodes), True
    for victim in pick[1]:
        hooks.evict(victim, w, now)
        stats.preemptions += 1
        if victim.workload.priority >= w.priority:
            stats.reclaims += 1
    again = scheduler.schedule(cluster, w, queue.node_mask)
    victims = ", ".join(v.workload.id for v in pick[1])
    return Decision(w, again.allocation, [*again.why, Reason(Code.PREEMPTED, PREEMPTION, f"preempted {victims}")],
                    again.score, d.latency_s + again.latency_s, again.nodes, again.signals, again.steered_by), True


def gang_failure(member: Decision, size: int) -> Decision:
    """A gang none of whose ``size`` members was placed, because ``member`` did not fit."""
    w = member.workload
    why = Reason(Code.GANG_INCOMPLETE, GANG, f"gang {w.gang}: member {w.id} does not fit "
                                             f"({'; '.join(member.reasons)}); none of its {size} members placed")
    return Decision(w, None, [why], None, member.latency_s, member.nodes)


def place_gang(scheduler: Scheduler, cluster: ClusterState, members: list[Workload],
               node_mask: np.ndarray | None = None) -> tuple[list[Decision], list[str]]:
    """All members placed, or none: (decisions, []) on success, ([], reasons) with the cluster unchanged."""
    placed: list[Decision] = []
    for w in sorted(members, key=lambda m: (-m.gpu_milli_total, m.id)):  # biggest first: hardest to fit
        d = scheduler.schedule(cluster, w, node_mask)
        if d.allocation is None:
            for done in placed:
                cluster.release(done.workload.id)
            return [], gang_failure(d, len(members)).reasons
        placed.append(d)
    return placed, []
