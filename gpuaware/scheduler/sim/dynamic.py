"""The dynamic experiment: the trace with its lifetimes, synthesized tenants and priorities, GPU faults.

What the trace lacks is synthesized, deterministically from the seed and the pod name:

- **arrivals**: ``jobs`` pods drawn (seeded, with replacement) from the trace, arriving as a Poisson
  stream whose rate makes the offered GPU load (rate x mean requested GPU x mean duration)
  ``target_load`` of the cluster's capacity; durations are the trace's deletion - creation, capped
  at ``max_duration_s``;
- **cluster**: a seeded sample of ``node_fraction`` of the nodes (the model mix kept in expectation),
  so that a few thousand jobs reach a steady state with queues in a few simulated hours;
- **priority** from QoS: LS -> high (2), Burstable/Guaranteed -> medium (1), BE -> low (0);
  high is not preemptible; BE work checkpoints every ``checkpoint_every_s``;
- **tenants**: four, with weights 4:3:2:1, by a hash of the pod name; quotas proportional to weight;
- **faults**: every ``fault_every_s`` a random GPU turns critical for ``fault_duration_s``;
- **power**: a GPU draws idle + (board - idle) x its allocated share (board power by model, 300 W
  for unknown models); each node's GPU budget is ``power_budget`` of its GPUs' board power, checked
  every ``rebalance_every_s``. ``gpuaware`` caps GPUs to 70% power, lowest priority first, until
  the node is within budget; under every other policy the node's own power capping caps all its
  GPUs alike. A capped GPU's jobs run at ``capped_speed``. ``power_over_budget_node_h`` counts
  node-hours whose uncapped draw was over budget. In the stream world (``stream``) a GPU draws what the
  agent's physical model gives at the usage its jobs replay, not its allocated share, the budget is of
  that model's boards, and ``gpuaware`` caps per GPU only with the stream's power readings (its
  ``thermal`` part: the live throttler reads ``gpu.state.v1``, and caps for power where a node budget is
  set); without them the node's own capping acts;
- **heterogeneity** (``heterogeneity``): each GPU job gets a Gavel model class (by a hash of its
  name, among classes measured on K80, P100 and V100); the trace duration is taken as its time on
  a V100 and scales with the class's measured (or, for models Gavel lacks, FP32-prior) throughput
  on the GPU model it runs on; models with no data at all (openb's undisclosed G1-G3) run at V100
  speed.

**stream** (``stream``, the ``--ablation stream`` experiment only): per-job usage, co-location
slowdown, temperature and power and the stream's forecasts and fingerprints, ticked every minute
(``stream_model.py``); ``gpuaware`` then uses the signals its ``stream.cfg.parts`` name.

``gpuaware`` runs its full stack: FGD+best-fit placement with GPU sharing, DRF-fair queue order,
quotas with borrowing, checkpoint-aware preemption, migration (checkpoint then move) off a
failing GPU, a reservation for the first blocked high-priority job with backfill of work that ends
before it, and deferral of deferrable work (a share of the low-priority jobs) while the cluster is
above ``peak_util`` allocated, up to ``defer_max_s``. Every other policy runs what a cluster does
today around its placement plugin: priority-then-FIFO order, kube-style preemption (victims restart
from scratch), and a failing GPU kills its workloads (they restart from scratch). ``k8s-default``
also rounds fractions up to whole GPUs.

Size: one module on purpose (~450 lines): the event loop, the job model and the gpuaware-specific
reactions (deferral, checkpointed preemption, migration off failing GPUs) share the simulation's state
at every step; split, each part would reach into the others' fields.
"""

from __future__ import annotations

import heapq
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from gpuaware.contract.events import HealthBand
from gpuaware.plumbing.traces import traces_dir
from gpuaware.scheduler.core.cluster import Allocation, ClusterState
from gpuaware.scheduler.core.cycle import PassStats, QueuePolicy, QueueState
from gpuaware.scheduler.core.cycle import schedule_pass as run_pass
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.queue import Tenant, TenantLedger, jain_index
from gpuaware.scheduler.core.rebalance import consolidation_moves
from gpuaware.scheduler.core.throttle import throttle_decisions
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload import PriorityLevel, Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from gpuaware.scheduler.sim.stream_model import StreamModel

REFERENCE_MODEL = "V100M16"
BOARD_POWER_W = {"P100": 250.0, "T4": 70.0, "V100M16": 300.0, "V100M32": 300.0, "A10": 150.0}


@cache
def gavel_table() -> ThroughputTable:
    return ThroughputTable.from_gavel(json.loads((traces_dir() / "gavel" / "simulation_throughputs.json").read_text()))


def gavel_classes(table: ThroughputTable) -> list[str]:
    return sorted(j for j, per_gpu in table.solo.items() if {"k80", "p100", "v100"} <= set(per_gpu) and " x" not in j)

QOS_PRIORITY = {"LS": PriorityLevel.HIGH, "Guaranteed": PriorityLevel.MEDIUM, "Burstable": PriorityLevel.MEDIUM,
                "BE": PriorityLevel.LOW}
TENANT_WEIGHTS = {"team-a": 4.0, "team-b": 3.0, "team-c": 2.0, "team-d": 1.0}


@dataclass
class DynamicConfig:
    jobs: int = 4000
    node_fraction: float = 0.05
    target_load: float = 1.2
    max_duration_s: float = 2 * 3600.0
    checkpoint_every_s: float = 600.0
    fault_every_s: float = 1800.0
    fault_duration_s: float = 3600.0
    deferrable_share: float = 0.3  # of low-priority jobs
    heterogeneity: bool = True
    reclaim_after_s: float = 300.0  # an owner waits this long before its borrowed quota is reclaimed
    rebalance_every_s: float = 600.0
    preemption_tries_per_pass: int = 4  # victim searches are the expensive part of a pass
    # gpuaware preempts only when running work will not free room for the job within this long,
    # per priority (low, medium, high); kube's default preemption evicts as soon as a pod does not fit.
    preempt_grace_s: tuple[float, float, float] = (0.0, 300.0, 30.0)
    check_invariants: bool = False  # after every event (slow; for tests)
    power_budget: float = 0.8
    capped_speed: float = 0.85
    migration_overhead_s: float = 30.0
    peak_util: float = 0.9
    defer_max_s: float = 3600.0
    pass_budget: int = 64


@dataclass
class JobStats:
    workload: Workload
    duration_s: float
    banked_s: float = 0.0
    first_start_s: float | None = None
    finish_s: float | None = None
    epoch: int = 0


@dataclass
class DynamicResult:
    policy: str
    seed: int
    jobs: dict[str, JobStats] = field(default_factory=dict)
    preemptions: int = 0
    preemptions_avoided: int = 0
    reclaims: int = 0  # preemptions of borrowed work at the preemptor's priority or above
    migrations: int = 0
    consolidations: int = 0
    throttles: int = 0
    over_budget_node_s: float = 0.0
    killed_by_faults: int = 0
    requested_gpu_s: float = 0.0
    allocated_gpu_s: float = 0.0
    served_by_tenant: dict[str, float] = field(default_factory=dict)
    demand_by_tenant: dict[str, float] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)
    end_s: float = 0.0
    deferred: set[str] = field(default_factory=set)
    unschedulable: list[str] = field(default_factory=list)
    backfilled: int = 0


def _tenant(name: str, seed: int) -> str:
    h = zlib.crc32(f"{seed}:{name}".encode()) % 10
    return "team-a" if h < 4 else "team-b" if h < 7 else "team-c" if h < 9 else "team-d"


def make_jobs(pods, capacity_milli: int, seed: int, cfg: DynamicConfig) -> list[tuple[float, Workload, float]]:
    usable = [p for p in pods if p.deletion_s is not None and p.deletion_s > p.creation_s]
    if not usable:
        raise ValueError("the pod trace has no pods with creation and deletion times (needed for lifetimes)")
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(usable), size=cfg.jobs)
    durations = np.array([min(usable[i].deletion_s - usable[i].creation_s, cfg.max_duration_s) for i in picks])
    milli = np.array([usable[i].workload.gpu_milli_total for i in picks], dtype=float)
    rate = cfg.target_load * capacity_milli / max(float((milli * durations).mean()), 1e-9)
    classes = gavel_classes(gavel_table()) if cfg.heterogeneity else []
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=cfg.jobs))
    jobs = []
    for k, (i, t, d) in enumerate(zip(picks, arrivals, durations, strict=True)):
        p = usable[i].workload
        prio = QOS_PRIORITY.get(p.qos, PriorityLevel.LOW)
        low = prio == PriorityLevel.LOW
        wid = f"{p.id}-{k}"
        w = Workload(wid, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, models=p.models,
                     tenant=_tenant(wid, seed), priority=prio, qos=p.qos, preemptible=prio < PriorityLevel.HIGH,
                     checkpointable=low, duration_s=float(d), submit_s=float(t),
                     deferrable=low and (zlib.crc32(wid.encode()) % 1000) < cfg.deferrable_share * 1000,
                     labels={"gavel_class": classes[zlib.crc32(wid.encode()) % len(classes)]}
                     if classes and p.num_gpu else {})
        jobs.append((float(t), w, float(d)))
    return jobs


def _could_ever_fit(cluster: ClusterState, w: Workload) -> bool:
    ok = (cluster.cpu_cap >= w.cpu_milli) & (cluster.mem_cap >= w.memory_mib) & (cluster.gpu_count >= w.num_gpu)
    if w.models and w.num_gpu:
        ok &= np.isin(cluster.models, list(w.models))
    return bool(ok.any())


def run_dynamic(nodes, pods, policy: str, seed: int, cfg: DynamicConfig | None = None,
                progress: Callable[[float], None] | None = None, stream: StreamModel | None = None) -> DynamicResult:
    cfg = cfg or DynamicConfig()
    full = policy == "gpuaware"
    pick = np.random.default_rng(seed + 7919).random(len(nodes)) < cfg.node_fraction
    nodes = [n for n, keep in zip(nodes, pick, strict=True) if keep] or nodes[:1]
    cluster = ClusterState(nodes)
    if stream is not None:
        stream.attach(cluster)
    table = gavel_table() if cfg.heterogeneity else None
    parts = stream.cfg.parts if stream is not None else None
    scheduler = Scheduler(profile(policy, WorkloadMix.of(p.workload for p in pods), seed, table, stream=parts),
                          seed=seed)
    ref_speed: dict[str, float | None] = {}

    def speed(w: Workload, node: int) -> float:
        """Work per wall second on this node's GPU model, relative to the reference model."""
        job = w.labels.get("gavel_class")
        if table is None or not job:
            return 1.0
        if job not in ref_speed:
            ref_speed[job] = table.throughput(job, REFERENCE_MODEL)
        here = table.throughput(job, str(cluster.models[node]))
        return here / ref_speed[job] if here and ref_speed[job] else 1.0

    rng = np.random.default_rng(seed)
    total_w = sum(TENANT_WEIGHTS.values())
    ledger = TenantLedger({t: Tenant(t, wt, int(cluster.total_gpu_milli * wt / total_w)) for t, wt in
                           TENANT_WEIGHTS.items()}, cluster.total_gpu_milli, int(cluster.mem_cap.sum()))
    res = DynamicResult(policy, seed)
    events: list[tuple[float, int, str, object]] = []
    seq = 0

    def push(t: float, kind: str, payload: object) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, payload))
        seq += 1

    jobs = make_jobs(pods, cluster.total_gpu_milli, seed, cfg)
    for t, w, d in jobs:
        if stream is not None:
            stream.prepare(w)
        if not _could_ever_fit(cluster, w):
            res.unschedulable.append(w.id)  # no node of the sample is big enough, even empty
            continue
        res.jobs[w.id] = JobStats(w, d)
        res.demand_by_tenant[w.tenant] = res.demand_by_tenant.get(w.tenant, 0.0) + w.gpu_milli_total * d
        push(t, "arrive", w)
    horizon = jobs[-1][0] + cfg.max_duration_s
    t = cfg.fault_every_s
    gpus = np.argwhere(cluster.gpu_exists)
    for k in range(1, int(horizon // cfg.rebalance_every_s) + 1):
        push(k * cfg.rebalance_every_s, "rebalance", None)
    if stream is not None:
        for k in range(1, int(horizon // stream.cfg.tick_s) + 1):
            push(k * stream.cfg.tick_s, "stream", None)
    board = np.array([BOARD_POWER_W.get(str(m), 300.0) for m in cluster.models])[:, None] * cluster.gpu_exists
    idle = 0.2 * board
    budget = cfg.power_budget * board.sum(axis=1)
    capped: set[tuple[int, int]] = set()
    while t < horizon:
        n, g = gpus[int(rng.integers(len(gpus)))]
        push(t, "fault", (int(n), int(g)))
        push(t + cfg.fault_duration_s, "recover", (int(n), int(g)))
        t += cfg.fault_every_s

    pending: list[Workload] = []
    running: dict[str, Running] = {}
    finish_at: dict[str, float] = {}
    speed_of: dict[str, float] = {}

    def account(r: Running, now: float) -> float:
        ran = max(0.0, now - r.started_s)
        req = r.workload.gpu_milli_total / 1000 * ran
        res.requested_gpu_s += req
        res.allocated_gpu_s += sum(r.allocation.milli) / 1000 * ran
        res.served_by_tenant[r.workload.tenant] = res.served_by_tenant.get(r.workload.tenant, 0.0) + req * 1000
        return ran

    def stop(r: Running, now: float, keep_progress: bool, checkpoint_now: bool = False) -> None:
        cluster.release(r.workload.id)
        ledger.charge(r.workload, -1)
        del running[r.workload.id]
        ran = account(r, now)
        job = res.jobs[r.workload.id]
        if keep_progress:
            kept = ran if r.checkpoint_every_s is None or checkpoint_now else ran - ran % r.checkpoint_every_s
            job.banked_s += kept * speed_of.pop(r.workload.id, 1.0)
        else:
            job.banked_s = 0.0
        job.epoch += 1
        pending.append(r.workload)
        if stream is not None:
            stream.stopped(r.workload.id)

    def start(w: Workload, alloc, now: float) -> None:
        job = res.jobs[w.id]
        borrowed = full and not ledger.within_quota(w)
        ledger.charge(w, 1)
        running[w.id] = Running(w, alloc, now, job.banked_s,
                                cfg.checkpoint_every_s if (w.checkpointable and full) else None, borrowed)
        if job.first_start_s is None:
            job.first_start_s = now
        if stream is not None:
            stream.started(w, now)
        speed_of[w.id] = run_speed(w, alloc)
        finish_at[w.id] = now + max(1.0, (job.duration_s - job.banked_s) / speed_of[w.id])
        push(finish_at[w.id], "finish", (w.id, job.epoch))

    def run_speed(w: Workload, alloc: Allocation) -> float:
        slow = any((alloc.node, g) in capped for g in alloc.gpus)
        base = speed(w, alloc.node) * (cfg.capped_speed if slow else 1.0)
        return base * stream.factor(w.id) if stream is not None else base

    def respeed(r: Running, now: float, new_speed: float) -> None:
        """Bank the progress made at the old speed, then continue at ``new_speed``."""
        job = res.jobs[r.workload.id]
        job.banked_s += max(0.0, now - r.started_s) * speed_of[r.workload.id]
        account(r, now)
        r.started_s = now
        r.done_s = job.banked_s
        speed_of[r.workload.id] = new_speed
        job.epoch += 1
        finish_at[r.workload.id] = now + max(1.0, (job.duration_s - job.banked_s) / speed_of[r.workload.id])
        push(finish_at[r.workload.id], "finish", (r.workload.id, job.epoch))

    def recharge(r: Running, milli: int, mem: int, now: float) -> None:
        """The forecast part: charge a shared job its forecast compute and memory instead of its request."""
        a = r.allocation
        n, g = a.node, a.gpus[0]
        milli = min(milli, a.milli[0] + int(cluster.gpu_free[n, g]))  # growing back only into what is free
        if cluster.gpu_mem_cap[n, g]:
            mem = min(mem, (a.gpu_memory_mib or [0])[0] + int(cluster.gpu_mem_free[n, g]))
        account(r, now)
        job = res.jobs[r.workload.id]
        job.banked_s += max(0.0, now - r.started_s) * speed_of[r.workload.id]
        r.started_s, r.done_s = now, job.banked_s
        r.allocation = Allocation(a.workload_id, n, [g], [milli], a.cpu_milli, a.memory_mib, [mem], a.sharing)
        cluster.resize(r.allocation)

    class Hooks:
        def evict(self, victim: Running, preemptor: Workload, now: float) -> None:
            stop(victim, now, keep_progress=full)

        def start(self, w: Workload, decision, now: float) -> bool:
            pending.remove(w)
            start(w, decision.allocation, now)
            return True

        def blocked(self, w: Workload, decision, now: float) -> None:
            pass

    queue = QueueState(pending, running, finish_at, ledger)
    knobs = dict(pass_budget=cfg.pass_budget, preemption_tries_per_pass=cfg.preemption_tries_per_pass,
                 preempt_grace_s=cfg.preempt_grace_s, reclaim_after_s=cfg.reclaim_after_s,
                 peak_util=cfg.peak_util, defer_max_s=cfg.defer_max_s)
    queue_policy = QueuePolicy(**knobs, demand_aware=stream is not None and stream.uses("demand")) if full \
        else QueuePolicy.kube(**knobs)
    stats = PassStats(deferred=res.deferred, latencies_s=res.latencies_s)
    hooks = Hooks()

    def schedule_pass(now: float, only: list[Workload] | None = None) -> None:
        run_pass(scheduler, cluster, queue, queue_policy, hooks, stats, now, only)

    total_events = len(events)
    handled = 0
    while events:
        now, _, kind, payload = heapq.heappop(events)
        handled += 1
        if kind == "arrive":
            pending.append(payload)
            schedule_pass(now, only=[payload])
            res.end_s = now
            continue
        elif kind == "finish":
            wid, epoch = payload
            job = res.jobs[wid]
            if wid not in running or epoch != job.epoch:
                continue
            r = running.pop(wid)
            running[wid] = r  # stop() expects it registered
            cluster.release(wid)
            ledger.charge(r.workload, -1)
            del running[wid]
            account(r, now)
            job.finish_s = now
            if stream is not None:
                stream.stopped(wid)
        elif kind == "fault":
            n, g = payload
            cluster.set_band(n, g, HealthBand.CRITICAL)
            for r in [r for r in running.values() if r.allocation.node == n and g in r.allocation.gpus]:
                stop(r, now, keep_progress=full, checkpoint_now=full)
                if full:
                    res.migrations += 1
                else:
                    res.killed_by_faults += 1
        elif kind == "stream":
            tick = stream.tick(now, cluster, running, pending)
            for wid in tick.kill:
                if wid in running:
                    stop(running[wid], now, keep_progress=full)
            for wid, (milli, mem) in tick.recharge.items():
                if wid in running:
                    recharge(running[wid], milli, mem, now)
            queue.demand = stream.outlook() if full else None
            for r in running.values():
                want = run_speed(r.workload, r.allocation)
                if abs(want - speed_of[r.workload.id]) > 0.02 * speed_of[r.workload.id]:
                    respeed(r, now, want)
        elif kind == "recover":
            cluster.set_band(*payload, HealthBand.HEALTHY)
        elif kind == "rebalance":
            node_budget = budget
            if stream is not None and stream.power is not None and stream.limit is not None:
                # What the GPUs draw at the usage their jobs replay, not at their requests, against the boards
                # of the same physical model (its boards differ from BOARD_POWER_W: the agent has no P100 or A10).
                power = stream.power
                node_budget = cfg.power_budget * stream.limit.sum(axis=1)
            else:
                share = (cluster.gpu_cap - cluster.gpu_free) / 1000.0
                power = np.where(cluster.gpu_exists, idle + (board - idle) * share, 0.0)
            over = power.sum(axis=1) > node_budget + 1e-6
            if full and (stream is None or stream.uses("thermal")):
                prio = np.full(cluster.gpu_free.shape, -1)
                for r in running.values():
                    for g in r.allocation.gpus:
                        prio[r.allocation.node, g] = max(prio[r.allocation.node, g], r.workload.priority)
                now_capped = {(a.node, a.gpu) for a in
                              throttle_decisions(power, cluster.temp, cluster.gpu_exists, node_budget, prio)}
            else:
                # No scheduler-level throttling (other policies, or gpuaware without the stream's power readings:
                # the live throttler reads them from gpu.state.v1): the node's own power capping caps every GPU alike.
                now_capped = {(int(n_), int(g_)) for n_ in np.flatnonzero(over)
                              for g_ in np.flatnonzero(cluster.gpu_exists[n_])}
            res.over_budget_node_s += float(over.sum()) * cfg.rebalance_every_s
            res.throttles += len(now_capped - capped)
            capped = now_capped
            for r in running.values():
                want = run_speed(r.workload, r.allocation)
                if abs(want - speed_of[r.workload.id]) > 1e-9:
                    respeed(r, now, want)
            if not full:
                continue
            movable = {wid for wid, r in running.items() if r.workload.preemptible}
            for m in consolidation_moves(cluster, movable=movable):
                r = running[m.workload_id]
                mem = (r.allocation.gpu_memory_mib or [0])[0]
                if mem and cluster.gpu_mem_cap[m.to_node, m.to_gpu] and cluster.gpu_mem_free[m.to_node, m.to_gpu] < mem:
                    continue  # the move plans compute only; the stream model's jobs also hold GPU memory
                stop(r, now, keep_progress=True, checkpoint_now=True)
                pending.remove(r.workload)
                a = r.allocation
                moved = Allocation(a.workload_id, m.to_node, [m.to_gpu], a.milli, a.cpu_milli, a.memory_mib,
                                   a.gpu_memory_mib, a.sharing)
                try:
                    cluster.allocate(moved)
                except ValueError:  # the plan counted on a move skipped above: stay
                    cluster.allocate(a)
                    start(r.workload, a, now)
                    continue
                res.jobs[m.workload_id].banked_s -= cfg.migration_overhead_s * speed(r.workload, m.to_node)
                start(r.workload, moved, now)
                res.consolidations += 1
        if pending:
            schedule_pass(now)
        res.end_s = now
        if cfg.check_invariants:
            cluster.check_invariants()
            if full:
                for t_name, tenant in ledger.tenants.items():
                    own = sum(r.workload.gpu_milli_total for r in running.values()
                              if r.workload.tenant == t_name and not r.borrowed)
                    assert own <= tenant.quota_gpu_milli, f"{t_name} runs {own} milli of its own over its quota"
        if progress and handled % 2000 == 0:
            progress(handled / max(total_events, 1))
    res.preemptions, res.reclaims = stats.preemptions, stats.reclaims
    res.preemptions_avoided, res.backfilled = stats.preemptions_avoided, stats.backfilled
    return res


def summarize(results: list[DynamicResult]) -> dict:
    def per_priority(fn) -> dict[str, float | None]:
        out = {}
        for level in reversed(PriorityLevel):  # high first: the reports' order
            vals = [v for r in results for j in r.jobs.values() if j.workload.priority == level
                    and (v := fn(j)) is not None]
            out[level.label] = vals
        return out

    waits = per_priority(lambda j: None if j.first_start_s is None else j.first_start_s - j.workload.submit_s)
    jcts = per_priority(lambda j: None if j.finish_s is None else j.finish_s - j.workload.submit_s)
    jain = []
    for r in results:
        # Per tenant, the mean share of a job's time in the system spent running (1 = never waited);
        # Jain's index over tenants of that: 1 when every tenant is served equally promptly.
        x = []
        for t in sorted({j.workload.tenant for j in r.jobs.values()}):
            eff = [j.duration_s / max(j.finish_s - j.workload.submit_s, j.duration_s) for j in r.jobs.values()
                   if j.workload.tenant == t and j.finish_s is not None]
            if eff:
                x.append(float(np.mean(eff)))
        x_arr = np.array(x)
        jain.append(jain_index(x_arr.tolist()) or 1.0)
    lat = np.concatenate([np.asarray(r.latencies_s) for r in results])
    unfinished = sum(1 for r in results for j in r.jobs.values() if j.finish_s is None)
    return {
        "policy": results[0].policy,
        "seeds": [r.seed for r in results],
        "jobs": sum(len(r.jobs) for r in results),
        "unfinished": unfinished,
        "unschedulable": sum(len(r.unschedulable) for r in results),
        "queue_wait_mean_s": {k: round(float(np.mean(v)), 1) if v else None for k, v in waits.items()},
        "queue_wait_p95_s": {k: round(float(np.percentile(v, 95)), 1) if v else None for k, v in waits.items()},
        "mean_jct_s": {k: round(float(np.mean(v)), 1) if v else None for k, v in jcts.items()},
        "busy_share_of_allocated": round(sum(r.requested_gpu_s for r in results)
                                         / max(sum(r.allocated_gpu_s for r in results), 1e-9), 4),
        "jain_fairness": round(float(np.mean(jain)), 4),
        "preemptions": sum(r.preemptions for r in results),
        "preemptions_avoided": sum(r.preemptions_avoided for r in results),
        "quota_reclaims": sum(r.reclaims for r in results),
        "migrations": sum(r.migrations for r in results),
        "consolidations": sum(r.consolidations for r in results),
        "throttles": sum(r.throttles for r in results),
        "power_over_budget_node_h": round(sum(r.over_budget_node_s for r in results) / 3600, 2),
        "killed_by_faults": sum(r.killed_by_faults for r in results),
        "deferred_jobs": sum(len(r.deferred) for r in results),
        "backfilled": sum(r.backfilled for r in results),
        "decisions_per_s": round(float(len(lat) / max(lat.sum(), 1e-9)), 1),
        "p99_decision_ms": round(float(np.percentile(lat, 99) * 1000), 3) if len(lat) else None,
    }
