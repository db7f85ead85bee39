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

**runtimes** (``durations``): the core never sees a job's true runtime. It sees nothing (``unknown``, a live
scheduler without forecasts), the stream's online runtime forecaster's estimate made as the job (re)enters the
queue, learned in completion order from the run's own completions and, unless ``runtime_history`` is
``none``, first from the trace's pods the run does not draw (``jobs.history``: the cluster's past)
(``forecast``), or, as the ``oracle`` ceiling only, the truth. ``runtime_history`` ``all`` (the
``features_oracle`` ceiling only) has the forecaster learn every pod of the trace first, the run's own included.

One ``Simulation`` per run: one method per event, the truth about each job in its ``JobStats``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

from gpuaware.contract.events import HealthBand
from gpuaware.scheduler.core.cluster import Allocation, ClusterState
from gpuaware.scheduler.core.cycle import PassStats, QueuePolicy, QueueState
from gpuaware.scheduler.core.cycle import schedule_pass as run_pass
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.queue import Tenant, TenantLedger, gpu_weight, jain_index
from gpuaware.scheduler.core.rebalance import consolidation_moves
from gpuaware.scheduler.core.runtime import PredictedEnds, RuntimeEstimate
from gpuaware.scheduler.core.throttle import throttle_decisions
from gpuaware.scheduler.core.workload import PriorityLevel, Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from gpuaware.scheduler.sim.jobs import (
    BOARD_POWER_W,
    REFERENCE_MODEL,
    TENANT_WEIGHTS,
    DynamicConfig,
    DynamicResult,
    JobStats,
    RuntimeModel,
    could_ever_fit,
    gavel_table,
    history,
    job_keys,
    make_jobs,
)
from gpuaware.scheduler.sim.stream_model import StreamModel


def run_dynamic(nodes, pods, policy: str, seed: int, cfg: DynamicConfig | None = None,
                progress: Callable[[float], None] | None = None, stream: StreamModel | None = None,
                runtime: RuntimeModel | None = None) -> DynamicResult:
    """One run of the dynamic experiment (``Simulation``)."""
    return Simulation(nodes, pods, policy, seed, cfg or DynamicConfig(), stream, runtime).run(progress)


class Simulation:
    """One run: the sampled cluster, the queue, the running work and the event clock, one method per event.

    What the core may know of each job is set as it enters the queue (``estimate``); the truth (its runtime,
    when it will end, how fast it runs) stays in its ``JobStats`` and in ``finish_at``, which only the oracle
    ceiling hands the core.
    """

    def __init__(self, nodes, pods, policy: str, seed: int, cfg: DynamicConfig, stream: StreamModel | None,
                 runtime: RuntimeModel | None) -> None:
        if cfg.durations == "forecast" and runtime is None:
            raise ValueError("durations='forecast' needs the runtime forecaster (runtime=)")
        self.cfg, self.stream, self.runtime = cfg, stream, runtime
        self.full = full = policy == "gpuaware"
        self.forecasting = full and cfg.durations == "forecast"
        self.oracle = full and cfg.durations == "oracle"
        if self.forecasting:
            for keys, seconds in history(pods, seed, cfg):
                runtime.learn_one(keys, seconds)
        pick = np.random.default_rng(seed + 7919).random(len(nodes)) < cfg.node_fraction
        nodes = [n for n, keep in zip(nodes, pick, strict=True) if keep] or nodes[:1]
        self.cluster = cluster = ClusterState(nodes)
        if stream is not None:
            stream.attach(cluster)
        self.table = gavel_table() if cfg.heterogeneity else None
        parts = stream.cfg.parts if stream is not None else None
        self.scheduler = Scheduler(profile(policy, WorkloadMix.of(p.workload for p in pods), seed, self.table,
                                           stream=parts), seed=seed)
        self.ref_speed: dict[str, float | None] = {}
        rng = np.random.default_rng(seed)
        total_w = sum(TENANT_WEIGHTS.values())
        self.ledger = TenantLedger({t: Tenant(t, wt, int(cluster.total_gpu_milli * wt / total_w)) for t, wt in
                                    TENANT_WEIGHTS.items()}, cluster.total_gpu_milli, int(cluster.mem_cap.sum()))
        self.res = res = DynamicResult(policy, seed)
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        jobs = make_jobs(pods, cluster.total_gpu_milli, seed, cfg)
        for t, w, d in jobs:
            if stream is not None:
                stream.prepare(w, d)
            if not could_ever_fit(cluster, w):
                res.unschedulable.append(w.id)  # no node of the sample is big enough, even empty
                continue
            res.jobs[w.id] = JobStats(w, d)
            res.demand_by_tenant[w.tenant] = res.demand_by_tenant.get(w.tenant, 0.0) + w.gpu_milli_total * d
            self.push(t, "arrive", w)
        horizon = jobs[-1][0] + cfg.max_duration_s
        gpus = np.argwhere(cluster.gpu_exists)
        for k in range(1, int(horizon // cfg.rebalance_every_s) + 1):
            self.push(k * cfg.rebalance_every_s, "rebalance", None)
        if stream is not None:
            for k in range(1, int(horizon // stream.cfg.tick_s) + 1):
                self.push(k * stream.cfg.tick_s, "stream", None)
        self.board = np.array([BOARD_POWER_W.get(str(m), 300.0) for m in cluster.models])[:, None] \
            * cluster.gpu_exists
        self.idle = 0.2 * self.board
        self.budget = cfg.power_budget * self.board.sum(axis=1)
        self.capped: set[tuple[int, int]] = set()
        t = cfg.fault_every_s
        while t < horizon:
            n, g = gpus[int(rng.integers(len(gpus)))]
            self.push(t, "fault", (int(n), int(g)))
            self.push(t + cfg.fault_duration_s, "recover", (int(n), int(g)))
            t += cfg.fault_every_s
        self.pending: list[Workload] = []
        self.running: dict[str, Running] = {}
        self.finish_at: dict[str, float] = {}  # the truth: when each running job will end (the clock's, the oracle's)
        self.attained: dict[str, float] = {}  # GPU-seconds of kept work, per job back in the queue
        self.queue = QueueState(self.pending, self.running, self.finish_at, self.ledger, attained=self.attained)
        knobs = dict(pass_budget=cfg.pass_budget, preemption_tries_per_pass=cfg.preemption_tries_per_pass,
                     preempt_grace_s=cfg.preempt_grace_s, reclaim_after_s=cfg.reclaim_after_s,
                     peak_util=cfg.peak_util, defer_max_s=cfg.defer_max_s)
        self.queue_policy = QueuePolicy(**knobs, demand_aware=stream is not None and stream.uses("demand"),
                                        order=cfg.order or "fair", aging_gpus=cfg.aging_gpus) if full \
            else QueuePolicy.kube(**knobs)
        self.stats = PassStats(deferred=res.deferred, latencies_s=res.latencies_s)

    # -- the clock

    def push(self, t: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, payload))
        self.seq += 1

    def run(self, progress: Callable[[float], None] | None = None) -> DynamicResult:
        handlers = {"arrive": self.on_arrive, "finish": self.on_finish, "fault": self.on_fault,
                    "stream": self.on_stream, "recover": self.on_recover, "rebalance": self.on_rebalance}
        res, cfg = self.res, self.cfg
        total_events = len(self.events)
        handled = 0
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            handled += 1
            outcome = handlers[kind](now, payload)
            if outcome is None:  # nothing happened (a finish superseded since, a rebalance of others' policies)
                continue
            if outcome and self.pending:
                self.schedule_pass(now)
            res.end_s = now
            if not outcome:  # an arrival: it was tried alone, nothing else changed
                continue
            if cfg.check_invariants:
                self.check_invariants()
            if progress and handled % 2000 == 0:
                progress(handled / max(total_events, 1))
        res.preemptions, res.reclaims = self.stats.preemptions, self.stats.reclaims
        res.preemptions_avoided, res.backfilled = self.stats.preemptions_avoided, self.stats.backfilled
        return res

    def schedule_pass(self, now: float, only: list[Workload] | None = None) -> None:
        # The core reads each running job's expected end: the truth only for the oracle ceiling, else what
        # its runtime estimate says given how long it has run (infinite without one).
        self.queue.finish_at = self.finish_at if self.oracle else PredictedEnds(self.running, now)
        run_pass(self.scheduler, self.cluster, self.queue, self.queue_policy, self, self.stats, now, only)

    def check_invariants(self) -> None:
        self.cluster.check_invariants()
        if self.full:
            for t_name, tenant in self.ledger.tenants.items():
                own = sum(r.workload.gpu_milli_total for r in self.running.values()
                          if r.workload.tenant == t_name and not r.borrowed)
                assert own <= tenant.quota_gpu_milli, f"{t_name} runs {own} milli of its own over its quota"

    # -- what the core may know

    def estimate(self, w: Workload) -> None:
        """What the core may know of ``w``'s runtime, as it (re)enters the queue."""
        job = self.res.jobs[w.id]
        if self.forecasting:
            p = self.runtime.predict_one(job_keys(w))
            w.runtime = RuntimeEstimate(p.mu, p.sigma, p.z90, "forecast")
            if job.predicted is None:
                job.predicted = (w.runtime.p50(), w.runtime.p90())
        elif self.oracle:
            # The wall seconds it has run, plus its remaining work at the reference speed.
            w.runtime = RuntimeEstimate.exact(job.run_s + max(job.duration_s - job.banked_s, 0.0))

    # -- a job's progress

    def speed(self, w: Workload, node: int) -> float:
        """Work per wall second on this node's GPU model, relative to the reference model."""
        job = w.labels.get("gavel_class")
        if self.table is None or not job:
            return 1.0
        if job not in self.ref_speed:
            self.ref_speed[job] = self.table.throughput(job, REFERENCE_MODEL)
        here = self.table.throughput(job, str(self.cluster.models[node]))
        return here / self.ref_speed[job] if here and self.ref_speed[job] else 1.0

    def run_speed(self, w: Workload, alloc: Allocation) -> float:
        slow = any((alloc.node, g) in self.capped for g in alloc.gpus)
        base = self.speed(w, alloc.node) * (self.cfg.capped_speed if slow else 1.0)
        return base * self.stream.factor(w.id) if self.stream is not None else base

    def account(self, r: Running, now: float) -> float:
        res = self.res
        ran = max(0.0, now - r.started_s)
        req = r.workload.gpu_milli_total / 1000 * ran
        res.requested_gpu_s += req
        res.allocated_gpu_s += sum(r.allocation.milli) / 1000 * ran
        res.served_by_tenant[r.workload.tenant] = res.served_by_tenant.get(r.workload.tenant, 0.0) + req * 1000
        return ran

    def bank(self, r: Running, now: float) -> JobStats:
        """Bank the work done since ``r`` last started, at the speed it ran."""
        job = self.res.jobs[r.workload.id]
        job.banked_s += max(0.0, now - r.started_s) * job.speed
        job.run_s += max(0.0, now - r.started_s)
        return job

    def stop(self, r: Running, now: float, keep_progress: bool, checkpoint_now: bool = False) -> None:
        wid = r.workload.id
        self.cluster.release(wid)
        self.ledger.charge(r.workload, -1)
        del self.running[wid]
        ran = self.account(r, now)
        job = self.res.jobs[wid]
        gpus = gpu_weight(r.workload)
        if keep_progress:
            kept = ran if r.checkpoint_every_s is None or checkpoint_now else ran - ran % r.checkpoint_every_s
            job.banked_s += kept * job.speed
            job.run_s += kept
            job.lost_gpu_s += (ran - kept) * gpus
        else:
            job.lost_gpu_s += (job.run_s + ran) * gpus
            job.banked_s = 0.0
            job.run_s = 0.0
        job.speed = 1.0
        job.epoch += 1
        self.attained[wid] = job.run_s * gpus
        self.pending.append(r.workload)
        self.estimate(r.workload)
        if self.stream is not None:
            self.stream.stopped(wid)

    def begin(self, w: Workload, alloc: Allocation, now: float) -> None:
        job = self.res.jobs[w.id]
        borrowed = self.full and not self.ledger.within_quota(w)
        self.ledger.charge(w, 1)
        self.running[w.id] = Running(w, alloc, now, job.banked_s,
                                     self.cfg.checkpoint_every_s if (w.checkpointable and self.full) else None,
                                     borrowed, ran_s=job.run_s)
        if job.first_start_s is None:
            job.first_start_s = now
        if self.stream is not None:
            self.stream.started(w, now)
        job.speed = self.run_speed(w, alloc)
        self.schedule_finish(job, now)

    def schedule_finish(self, job: JobStats, now: float) -> None:
        wid = job.workload.id
        self.finish_at[wid] = now + max(1.0, (job.duration_s - job.banked_s) / job.speed)
        self.push(self.finish_at[wid], "finish", (wid, job.epoch))

    def respeed(self, r: Running, now: float, new_speed: float) -> None:
        """Bank the progress made at the old speed, then continue at ``new_speed``."""
        job = self.bank(r, now)
        self.account(r, now)
        r.started_s = now
        r.done_s, r.ran_s = job.banked_s, job.run_s
        job.speed = new_speed
        job.epoch += 1
        self.schedule_finish(job, now)

    def recharge(self, r: Running, milli: int, mem: int, now: float) -> None:
        """The forecast part: charge a shared job its forecast compute and memory instead of its request."""
        cluster = self.cluster
        a = r.allocation
        n, g = a.node, a.gpus[0]
        milli = min(milli, a.milli[0] + int(cluster.gpu_free[n, g]))  # growing back only into what is free
        if cluster.gpu_mem_cap[n, g]:
            mem = min(mem, (a.gpu_memory_mib or [0])[0] + int(cluster.gpu_mem_free[n, g]))
        self.account(r, now)
        job = self.bank(r, now)
        r.started_s, r.done_s, r.ran_s = now, job.banked_s, job.run_s
        r.allocation = Allocation(a.workload_id, n, [g], [milli], a.cpu_milli, a.memory_mib, [mem], a.sharing)
        cluster.resize(r.allocation)

    # -- the pass's hooks (core.cycle.PassHooks)

    def evict(self, victim: Running, preemptor: Workload, now: float) -> None:
        self.stop(victim, now, keep_progress=self.full)

    def start(self, w: Workload, decision, now: float) -> bool:
        self.pending.remove(w)
        self.begin(w, decision.allocation, now)
        return True

    def blocked(self, w: Workload, decision, now: float) -> None:
        pass

    # -- events: each returns True when the queue should be passed over afterwards, False when not (an arrival
    # tries itself alone), None when nothing changed at all

    def on_arrive(self, now: float, w: Workload) -> bool | None:
        self.pending.append(w)
        self.estimate(w)
        self.schedule_pass(now, only=[w])
        return False

    def on_finish(self, now: float, payload: tuple[str, int]) -> bool | None:
        wid, epoch = payload
        job = self.res.jobs[wid]
        if wid not in self.running or epoch != job.epoch:
            return None
        r = self.running.pop(wid)
        self.cluster.release(wid)
        self.ledger.charge(r.workload, -1)
        self.account(r, now)
        job.finish_s = now
        job.run_s += max(0.0, now - r.started_s)
        if self.forecasting:
            self.runtime.learn_one(job_keys(r.workload), max(job.run_s, 1.0))
        if self.stream is not None:
            self.stream.stopped(wid)
        return True

    def on_fault(self, now: float, gpu: tuple[int, int]) -> bool:
        n, g = gpu
        self.cluster.set_band(n, g, HealthBand.CRITICAL)
        for r in [r for r in self.running.values() if r.allocation.node == n and g in r.allocation.gpus]:
            self.stop(r, now, keep_progress=self.full, checkpoint_now=self.full)
            if self.full:
                self.res.migrations += 1
            else:
                self.res.killed_by_faults += 1
        return True

    def on_recover(self, now: float, gpu: tuple[int, int]) -> bool:
        self.cluster.set_band(*gpu, HealthBand.HEALTHY)
        return True

    def on_stream(self, now: float, _payload: None) -> bool:
        stream, running = self.stream, self.running
        tick = stream.tick(now, self.cluster, running, self.pending)
        for wid in tick.kill:
            if wid in running:
                self.stop(running[wid], now, keep_progress=self.full)
        for wid, (milli, mem) in tick.recharge.items():
            if wid in running:
                self.recharge(running[wid], milli, mem, now)
        self.queue.demand = stream.outlook() if self.full else None
        self.respeed_all(now, relative=0.02)
        return True

    def respeed_all(self, now: float, relative: float = 0.0, absolute: float = 0.0) -> None:
        """Re-speed the running jobs whose speed moved by more than ``relative`` of it (or ``absolute``)."""
        for r in self.running.values():
            want = self.run_speed(r.workload, r.allocation)
            speed = self.res.jobs[r.workload.id].speed
            if abs(want - speed) > (relative * speed if relative else absolute):
                self.respeed(r, now, want)

    def on_rebalance(self, now: float, _payload: None) -> bool | None:
        self.throttle(now)
        if not self.full:
            return None
        self.consolidate(now)
        return True

    def throttle(self, now: float) -> None:
        """Power: which GPUs run capped until the next rebalance, and the jobs on them re-speeded."""
        cfg, cluster, stream = self.cfg, self.cluster, self.stream
        node_budget = self.budget
        if stream is not None and stream.power is not None and stream.limit is not None:
            # What the GPUs draw at the usage their jobs replay, not at their requests, against the boards
            # of the same physical model (its boards differ from BOARD_POWER_W: the agent has no P100 or A10).
            power = stream.power
            node_budget = cfg.power_budget * stream.limit.sum(axis=1)
        else:
            share = (cluster.gpu_cap - cluster.gpu_free) / 1000.0
            power = np.where(cluster.gpu_exists, self.idle + (self.board - self.idle) * share, 0.0)
        over = power.sum(axis=1) > node_budget + 1e-6
        if self.full and (stream is None or stream.uses("thermal")):
            prio = np.full(cluster.gpu_free.shape, -1)
            for r in self.running.values():
                for g in r.allocation.gpus:
                    prio[r.allocation.node, g] = max(prio[r.allocation.node, g], r.workload.priority)
            now_capped = {(a.node, a.gpu) for a in
                          throttle_decisions(power, cluster.temp, cluster.gpu_exists, node_budget, prio)}
        else:
            # No scheduler-level throttling (other policies, or gpuaware without the stream's power readings:
            # the live throttler reads them from gpu.state.v1): the node's own power capping caps every GPU alike.
            now_capped = {(int(n_), int(g_)) for n_ in np.flatnonzero(over)
                          for g_ in np.flatnonzero(cluster.gpu_exists[n_])}
        self.res.over_budget_node_s += float(over.sum()) * cfg.rebalance_every_s
        self.res.throttles += len(now_capped - self.capped)
        self.capped = now_capped
        self.respeed_all(now, absolute=1e-9)

    def consolidate(self, now: float) -> None:
        """Move preemptible work to pack GPUs (checkpoint, then start where the plan says)."""
        cluster, running = self.cluster, self.running
        movable = {wid for wid, r in running.items() if r.workload.preemptible}
        for m in consolidation_moves(cluster, movable=movable):
            r = running[m.workload_id]
            mem = (r.allocation.gpu_memory_mib or [0])[0]
            if mem and cluster.gpu_mem_cap[m.to_node, m.to_gpu] and cluster.gpu_mem_free[m.to_node, m.to_gpu] < mem:
                continue  # the move plans compute only; the stream model's jobs also hold GPU memory
            self.stop(r, now, keep_progress=True, checkpoint_now=True)
            self.pending.remove(r.workload)
            a = r.allocation
            moved = Allocation(a.workload_id, m.to_node, [m.to_gpu], a.milli, a.cpu_milli, a.memory_mib,
                               a.gpu_memory_mib, a.sharing)
            try:
                cluster.allocate(moved)
            except ValueError:  # the plan counted on a move skipped above: stay
                cluster.allocate(a)
                self.begin(r.workload, a, now)
                continue
            self.res.jobs[m.workload_id].banked_s -= self.cfg.migration_overhead_s * self.speed(r.workload, m.to_node)
            self.begin(r.workload, moved, now)
            self.res.consolidations += 1


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
