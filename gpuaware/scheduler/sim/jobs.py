"""The dynamic experiment's world: its configuration, the jobs drawn from the trace, and the record of each.

``make_jobs`` draws the arrivals (the module docstring of ``dynamic.py`` says how); ``JobStats`` holds what
the simulator knows of a job and the core does not (its true runtime, its speed where it runs).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol

import numpy as np

from gpuaware.contract.runtime import JobFeatures, signature_keys
from gpuaware.plumbing.traces import traces_dir
from gpuaware.scheduler.core.cluster import ClusterState
from gpuaware.scheduler.core.policy_specs import ORDERS
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload import PriorityLevel, Workload

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
    # What the core knows of runtimes: nothing ("unknown", as a live scheduler without forecasts), the online
    # runtime forecaster's estimates ("forecast": run_dynamic's ``runtime``), or the truth ("oracle": a ceiling).
    durations: str = "unknown"
    order: str | None = None  # gpuaware's queue order within a priority (core/queue.py); None: fair (DRF)
    aging_gpus: float = 0.1
    # What the runtime forecaster has learned before the run (``forecast`` only): nothing ("none", a cluster's
    # first day), or the runtimes of the trace's pods this run does not draw ("trace", ``history``): the run's
    # jobs are independent draws from the trace, so the cluster's past is more draws from it. "all": every pod
    # of the trace, the run's own jobs included: it reads ahead, a ceiling (``features_oracle``) no live
    # forecaster has.
    runtime_history: str = "trace"

    def __post_init__(self) -> None:
        if self.durations not in DURATIONS:
            raise ValueError(f"durations: {self.durations!r} is not one of {', '.join(DURATIONS)}")
        if self.runtime_history not in HISTORIES:
            raise ValueError(f"runtime_history: {self.runtime_history!r} is not one of {', '.join(HISTORIES)}")
        if self.order is not None and self.order not in ORDERS:
            raise ValueError(f"order: {self.order!r} is not one of {', '.join(ORDERS)}")


DURATIONS = ("unknown", "forecast", "oracle")
HISTORIES = ("none", "trace", "all")


class RuntimeModel(Protocol):
    """The stream's runtime forecaster (stream/runtime.py), handed in by the caller."""

    def predict_one(self, keys: list[str]) -> Any: ...

    def learn_one(self, keys: list[str], seconds: float) -> None: ...


@dataclass
class JobStats:
    workload: Workload
    duration_s: float  # the truth: the simulator's, never the core's
    banked_s: float = 0.0
    first_start_s: float | None = None
    finish_s: float | None = None
    epoch: int = 0
    run_s: float = 0.0  # wall seconds run whose work was kept: the runtime a live cluster observes at the end
    lost_gpu_s: float = 0.0  # GPU-seconds of work thrown away by preemptions and kills
    predicted: tuple[float, float] | None = None  # (p50, p90) of the runtime, predicted at its arrival
    speed: float = 1.0  # work per wall second where it runs now (1.0 while not running)


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


def _usable(pods) -> list:
    usable = [p for p in pods if p.deletion_s is not None and p.deletion_s > p.creation_s]
    if not usable:
        raise ValueError("the pod trace has no pods with creation and deletion times (needed for lifetimes)")
    return usable


def _lifetime(p, cfg: DynamicConfig) -> float:
    return min(p.deletion_s - p.creation_s, cfg.max_duration_s)


def make_jobs(pods, capacity_milli: int, seed: int, cfg: DynamicConfig) -> list[tuple[float, Workload, float]]:
    usable = _usable(pods)
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(usable), size=cfg.jobs)
    durations = np.array([_lifetime(usable[i], cfg) for i in picks])
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
                     checkpointable=low, submit_s=float(t),
                     deferrable=low and (zlib.crc32(wid.encode()) % 1000) < cfg.deferrable_share * 1000,
                     labels={"gavel_class": classes[zlib.crc32(wid.encode()) % len(classes)]}
                     if classes and p.num_gpu else {})
        jobs.append((float(t), w, float(d)))
    return jobs


def history(pods, seed: int, cfg: DynamicConfig) -> list[tuple[list[str], float]]:
    """The completions a cluster's runtime forecaster learned before the run (``cfg.runtime_history``), as
    (signature keys, runtime), in the order they ended: none; every pod of the trace that ``make_jobs`` does
    not draw for ``seed`` ("trace": none of the run's own jobs); or every pod ("all": the drawn ones too, so
    the run's runtimes are known ahead, per signature; the ``features_oracle`` ceiling only)."""
    if cfg.runtime_history == "none":
        return []
    usable = _usable(pods)
    drawn = set() if cfg.runtime_history == "all" else \
        set(np.random.default_rng(seed).integers(len(usable), size=cfg.jobs).tolist())
    past = sorted((i for i in range(len(usable)) if i not in drawn), key=lambda i: usable[i].deletion_s)
    return [(job_keys(_past_workload(usable[i].workload, seed)), _lifetime(usable[i], cfg)) for i in past]


def _past_workload(p: Workload, seed: int) -> Workload:
    return Workload(p.id, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, models=p.models,
                    tenant=_tenant(p.id, seed), qos=p.qos)


def could_ever_fit(cluster: ClusterState, w: Workload) -> bool:
    ok = (cluster.cpu_cap >= w.cpu_milli) & (cluster.mem_cap >= w.memory_mib) & (cluster.gpu_count >= w.num_gpu)
    if w.models and w.num_gpu:
        ok &= np.isin(cluster.models, list(w.models))
    return bool(ok.any())


def job_keys(w: Workload) -> list[str]:
    """The runtime signature of a simulated job (the openb trace names no owner)."""
    return signature_keys(JobFeatures(w.tenant, w.num_gpu, w.gpu_milli, w.cpu_milli, w.memory_mib, w.qos, w.models))
