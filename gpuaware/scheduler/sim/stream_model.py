"""What the stream-driven parts of placement need from the dynamic simulator, from real data, no oracle.

- **usage over time**: each GPU job replays one GenTD26 serving pod (by a hash of its id, from a
  hashed offset, one sample a minute): its compute is its share x the pod's duty cycle, its memory its
  share of 16 GiB x the pod's memory curve over its peak;
- **co-location slowdown** from Gavel: two busy jobs on one GPU run at their measured pair speed
  (``ThroughputTable.colocated_speed`` of their ``gavel_class``), scaled by how busy the other one is;
  a GPU whose jobs together want more than all of it runs each at 1000 / demand (time slicing);
- **temperature and power** from the agent's physical model (``physics``: power from utilisation, a
  first-order thermal step), which the CLI passes in; at the slowdown temperature jobs run at 0.7;
- **forecasts** by the real stream forecaster (``forecaster``, passed in by the CLI: ``gpuaware.stream.forecast``),
  one per job and series, fed as the sim runs, errors included; **fingerprints** by the real stream
  fingerprinter; the **cluster demand forecast** by the same forecaster over the demand share.

The scheduler layer may not import ``stream`` or ``agent``: both come in as callables (the protocols
below). ``parts`` says which signals the scheduler may use (the ablation's variants); the physics,
slowdowns and violations are the same in every variant. Each tick (``tick_s``) the model writes the
signals into the cluster arrays the plugins read, optionally (``recharge``, off: it did not pay)
re-charges shared jobs to their forecast (a job is charged the forecast upper bound of its compute and
memory, plus margins, never more than it requested), and reports what ``dynamic.py`` must do: speeds,
OOM kills, re-charges.
Violations: a GPU-tick whose jobs want more memory than it has (the newest shared job is OOM-killed
and restarts) or more compute than it has (an SLO miss: every job on it slows).

**The most any placement could make of busy share on a run** (``busy_share_bound``): busy share is the
compute the jobs use over the GPU time they hold. A GPU held by a whole-GPU job is held whatever the
placement (a whole-GPU request is exclusive), so only GPUs of shared jobs can be held for less, and
memory is what bounds them (compute is 6.5% duty cycles). Each minute the bound keeps the GPUs that hold
a whole-GPU job and counts, for the shared jobs, the fewest GPUs their memory that minute fits in,
fluidly (no bin-packing loss), the cluster's largest cards first: what re-packing every job every minute,
at no cost and knowing its memory, would hold. A placement that holds fewer GPUs OOM-kills. Over that it
puts the compute the jobs used, uncapped. The bound is of that run's job-minutes: another placement
restarts jobs at other times (the series replay from a restarted job's first minute), and so uses
slightly different compute. ``busy_share_bound_margin``: the same with each shared job's memory grown by
``mem_margin`` (never past its request), the safety margin a placement by forecast keeps.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpuaware.scheduler.core.cluster import ClusterState
from gpuaware.scheduler.core.demand import DemandOutlook
from gpuaware.scheduler.core.plugins.colocation import fingerprint_of
from gpuaware.scheduler.core.plugins.power_headroom import SLOWDOWN_C
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload import Workload

JOB_MEMORY_MIB = 16384  # a whole GPU's worth of a job's memory (the smallest common card, V100M16/P100/T4)
PARTS = ("forecast", "fingerprint", "thermal", "demand")


class Forecast(Protocol):
    mean: float
    upper: float


class Forecaster(Protocol):
    def learn_one(self, y: float) -> None: ...

    def forecast(self) -> Forecast: ...


class Fingerprinter(Protocol):
    def learn_one(self, ts_ms: int, util_gpu: float, util_mem: float, fb_used_mib: float, fb_total_mib: float,
                  power_w: float) -> None: ...

    def predict_one(self) -> tuple[str, float]: ...


ForecasterFactory = Callable[[int, float | None], Forecaster]  # (horizon in ticks, upper bound)
Physics = Callable[[str, float, float, float], tuple[float, float, float]]  # (model, util 0-1, temp C, dt s)
# -> (power W, temp C, power limit W)


@dataclass
class StreamConfig:
    parts: frozenset[str] = frozenset(PARTS)
    tick_s: float = 60.0
    horizon_ticks: int = 15  # the forecast horizon: 15 minutes
    warmup_ticks: int = 10  # a job is charged its request until its forecaster has seen this much
    compute_margin: float = 0.10
    mem_margin: float = 0.15
    floor_milli: int = 50
    # Re-charging running shared jobs to their forecast: measured on the loaded ablation cluster it let
    # more work start on borrowed quota, tripled preemptions (reclaims) and cost mean JCT
    # (docs/scheduling.md "The ablation"), so it is off; the forecast part then filters and scores only,
    # as it does live.
    recharge: bool = False
    # Not a part, a ceiling (the ablation's ``ceilings``): shared jobs re-charged to what their series really
    # reaches, read ahead, no margin. ``run``: from the first tick, the peak over the job's run (never outgrows
    # its charge); ``horizon``: every tick, the peak over the forecast horizon (a perfect forecast; a climb
    # into room others took since still OOM-kills). Every part itself forecasts: no oracle.
    oracle: str = ""

    def __post_init__(self) -> None:
        if self.oracle not in ("", "run", "horizon"):
            raise ValueError(f"StreamConfig.oracle: {self.oracle!r} is none of '', 'run', 'horizon'")


@dataclass
class JobTrace:
    util: np.ndarray  # 0-1, one a minute
    mem: np.ndarray  # 0-1 of the job's memory footprint
    offset: int
    fu: Forecaster | None = None
    fm: Forecaster | None = None
    fp: Fingerprinter | None = None
    seen: int = 0
    started_s: float = 0.0
    mem_high: float = 0.0  # the highest memory seen: a footprint rarely shrinks back below what it reached
    peak: tuple[float, float] | None = None  # the oracle's (``StreamConfig.oracle``) read-ahead peaks

    def at(self, minute: int) -> tuple[float, float]:
        i = (self.offset + minute) % len(self.util)
        return float(self.util[i]), float(self.mem[i % len(self.mem)])

    def ahead(self, minute: int, minutes: int) -> tuple[float, float]:
        """The horizon oracle's read-ahead: the peak compute and memory over ``minutes`` from ``minute``."""
        i = (self.offset + minute + np.arange(minutes)) % len(self.util)
        return float(self.util[i].max()), float(self.mem[i % len(self.mem)].max())

    def peaks(self, duration_s: float | None) -> tuple[float, float]:
        """The run oracle's read-ahead: the peak compute and memory over four times the job's trace duration
        from its start. Its wall-clock run is longer than the trace's on slower cards and when slowed by
        sharing: over one trace duration the ceiling OOM-killed (15 times on 4 seeds), over four it did not."""
        if self.peak is None:
            self.peak = self.ahead(0, int(4 * (duration_s or 0.0) // 60) + 1)
        return self.peak


@dataclass
class TickResult:
    speed: dict[str, float] = field(default_factory=dict)  # job -> stream factor (1 = unaffected)
    kill: list[str] = field(default_factory=list)  # OOM-killed jobs
    recharge: dict[str, tuple[int, int]] = field(default_factory=dict)  # job -> (milli, gpu memory MiB)


@dataclass
class StreamFigures:
    busy_gpu_s: float = 0.0
    occupied_gpu_s: float = 0.0
    requested_milli_s: float = 0.0
    capacity_milli_s: float = 0.0
    oom: int = 0
    contention: int = 0
    used_gpu_s: float = 0.0  # compute used, uncapped: the bound's numerator
    packed_gpu_s: float = 0.0  # GPU time held with shared work re-packed each minute (``busy_share_bound``)
    packed_margin_gpu_s: float = 0.0  # the same, shared memory grown by the margin

    def bound(self, held: float) -> float:
        return self.used_gpu_s / max(held, 1e-9)


class StreamModel:
    def __init__(self, series: Sequence[tuple[np.ndarray, np.ndarray]], forecaster: ForecasterFactory,
                 physics: Physics, fingerprinter: Callable[[], Fingerprinter] | None = None,
                 table: ThroughputTable | None = None, cfg: StreamConfig | None = None):
        if not series:
            raise ValueError("the stream model needs usage series (GenTD26)")
        self.series = [(np.clip(np.asarray(u, float) / 100.0, 0, 1), np.asarray(m, float) / max(float(np.max(m)), 1.0))
                       for u, m in series]
        self.forecaster, self.physics, self.fingerprinter, self.table = forecaster, physics, fingerprinter, table
        self.cfg = cfg or StreamConfig()
        self.jobs: dict[str, JobTrace] = {}
        self.true_duration: dict[str, float] = {}  # the run ceiling's read-ahead (prepare)
        self.speed: dict[str, float] = {}
        self.figures = StreamFigures()
        self.demand: Forecaster | None = None
        self.temp: np.ndarray | None = None
        self.power: np.ndarray | None = None  # what each GPU draws (W), from the physical model at its jobs' usage
        self.limit: np.ndarray | None = None  # each GPU's board power (W) in the physical model

    def attach(self, cluster: ClusterState) -> None:
        """GPUs of undisclosed models (openb's G1-G3) get the smallest common card's memory: the jobs hold
        memory here, and placement must see the limit that OOM kills are counted against."""
        unknown = cluster.gpu_exists & (cluster.gpu_mem_cap == 0)
        cluster.gpu_mem_cap[unknown] = JOB_MEMORY_MIB
        cluster.gpu_mem_free[unknown] = JOB_MEMORY_MIB

    def uses(self, part: str) -> bool:
        return part in self.cfg.parts

    def prepare(self, w: Workload, true_duration_s: float | None = None) -> Workload:
        """A shared job's GPU memory request: its share of a whole job's memory. ``true_duration_s``: for the
        ``run`` ceiling's read-ahead only (a ceiling may read the future; nothing else here does)."""
        if true_duration_s is not None:
            self.true_duration[w.id] = true_duration_s
        if w.shares_gpu:
            w.gpu_memory_mib = int(JOB_MEMORY_MIB * w.gpu_milli / 1000)
        return w

    def started(self, w: Workload, now: float) -> None:
        if not w.num_gpu:
            return
        h = zlib.crc32(w.id.encode())
        util, mem = self.series[h % len(self.series)]
        job = JobTrace(util, mem, (h >> 8) % len(util), started_s=now)
        if self.uses("forecast") and not self.cfg.oracle:  # the oracle reads ahead instead
            job.fu = self.forecaster(self.cfg.horizon_ticks, 1.0)
            job.fm = self.forecaster(self.cfg.horizon_ticks, 1.0)
        if self.uses("fingerprint") and self.fingerprinter is not None:
            job.fp = self.fingerprinter()
        self.jobs[w.id] = job

    def stopped(self, wid: str) -> None:
        self.jobs.pop(wid, None)
        self.speed.pop(wid, None)

    def factor(self, wid: str) -> float:
        return self.speed.get(wid, 1.0)

    def outlook(self) -> DemandOutlook | None:
        if self.demand is None or not self.uses("demand"):
            return None
        f = self.demand.forecast()
        return DemandOutlook(float(f.upper), float(f.mean), self.cfg.horizon_ticks * self.cfg.tick_s)

    def tick(self, now: float, cluster: ClusterState, running: dict, pending: list[Workload]) -> TickResult:
        cfg, out, fig = self.cfg, TickResult(), self.figures
        shape = cluster.gpu_exists.shape
        if self.temp is None:
            self.temp = np.full(shape, 30.0)
        compute = np.zeros(shape)
        memory = np.zeros(shape)
        f_util = np.zeros(shape)
        f_mem = np.zeros(shape)
        residents: dict[tuple[int, int], list[tuple[str, float, float]]] = {}
        shared_mem = shared_mem_margin = 0.0  # MiB the shared jobs use this minute (and with the margin)
        classes: dict[str, str] = {}
        for wid, r in running.items():
            w, a = r.workload, r.allocation
            job = self.jobs.get(wid)
            if job is None or not a.gpus:
                continue
            minute = int((now - job.started_s) // 60)
            u, m = job.at(minute)
            share = w.gpu_milli / 1000.0
            job.seen += 1
            hi_u, hi_m = share, share  # until the forecaster has warmed up: the request
            if cfg.oracle:
                peak_u, peak_m = job.peaks(self.true_duration.get(wid, w.duration_s)) if cfg.oracle == "run" else \
                    job.ahead(minute, cfg.horizon_ticks + 1)
                hi_u, hi_m = share * peak_u, share * peak_m
                if w.shares_gpu:
                    self._recharge(out, wid, w, a, np.ceil(1000 * hi_u), JOB_MEMORY_MIB * hi_m)
            elif job.fu is not None and job.fm is not None:
                job.fu.learn_one(u)
                job.fm.learn_one(m)
                job.mem_high = max(job.mem_high, m)
                if job.seen >= cfg.warmup_ticks:
                    hi_u = share * min(1.0, job.fu.forecast().upper)
                    hi_m = share * min(1.0, max(job.fm.forecast().upper, job.mem_high))
                    if w.shares_gpu and cfg.recharge:
                        self._recharge(out, wid, w, a, np.ceil(1000 * hi_u * (1 + cfg.compute_margin)),
                                       JOB_MEMORY_MIB * hi_m * (1 + cfg.mem_margin))
            if job.fp is not None:
                job.fp.learn_one(int(now * 1000), u * 100, u * 100 * _mem_bw(w), m * JOB_MEMORY_MIB * share,
                                 JOB_MEMORY_MIB, 0.0)
                classes[wid] = job.fp.predict_one()[0]
            if w.shares_gpu:
                shared_mem += JOB_MEMORY_MIB * share * m
                shared_mem_margin += JOB_MEMORY_MIB * share * min(1.0, m * (1 + cfg.mem_margin))
            for g in a.gpus:
                key = (a.node, g)
                compute[key] += 1000 * share * u
                memory[key] += JOB_MEMORY_MIB * share * m
                f_util[key] += 100 * hi_u
                f_mem[key] += JOB_MEMORY_MIB * hi_m
                residents.setdefault(key, []).append((wid, u, r.started_s))
        self._physics(cluster, compute, out)
        whole = 0
        for key, res in residents.items():
            n, g = key
            cap = float(cluster.gpu_mem_cap[n, g])
            fig.occupied_gpu_s += cfg.tick_s
            fig.busy_gpu_s += min(1.0, compute[key] / 1000) * cfg.tick_s
            fig.used_gpu_s += compute[key] / 1000 * cfg.tick_s
            whole += not all(running[wid].workload.shares_gpu for wid, _, _ in res)
            if memory[key] > cap and len(res) > 1:
                fig.oom += 1
                out.kill.append(max(res, key=lambda x: x[2])[0])  # the newest tenant is OOM-killed
            slow = 1000.0 / compute[key] if compute[key] > 1000 else 1.0
            if slow < 1.0:
                fig.contention += 1
            heat = 0.7 if self.temp[key] >= SLOWDOWN_C else 1.0
            for wid, u, _ in res:
                inter = 1.0
                mine = running[wid].workload.labels.get("gavel_class")
                for other, u_o, _ in res:
                    theirs = running[other].workload.labels.get("gavel_class")
                    if other != wid and mine and theirs and self.table is not None and u > 0.05:
                        pair = self.table.colocated_speed(mine, theirs, str(cluster.models[n]))
                        inter = min(inter, 1 - (1 - pair) * min(1.0, u_o))
                out.speed[wid] = min(out.speed.get(wid, 1.0), slow * heat * inter)
        caps = np.sort(cluster.gpu_mem_cap[cluster.gpu_exists])[::-1]
        fig.packed_gpu_s += (whole + fewest_gpus(shared_mem, caps)) * cfg.tick_s
        fig.packed_margin_gpu_s += (whole + fewest_gpus(shared_mem_margin, caps)) * cfg.tick_s
        fig.requested_milli_s += sum(r.workload.gpu_milli_total for r in running.values()) * cfg.tick_s
        fig.capacity_milli_s += cluster.total_gpu_milli * cfg.tick_s
        self._signals(cluster, f_util, f_mem, residents, classes)
        if self.uses("demand"):
            if self.demand is None:
                self.demand = self.forecaster(cfg.horizon_ticks, None)
            self.demand.learn_one(cluster.allocated_gpu_milli / max(cluster.total_gpu_milli, 1))
        self.speed = dict(out.speed)
        return out

    def _recharge(self, out: TickResult, wid: str, w: Workload, a, milli: float, mem: float) -> None:
        """Charge a shared job ``milli`` and ``mem`` (never more than it requested) when that moved enough to matter."""
        milli_i = int(min(w.gpu_milli, max(self.cfg.floor_milli, milli)))
        mem_i = int(min(w.gpu_memory_mib, np.ceil(mem)))
        if abs(milli_i - a.milli[0]) >= 20 or abs(mem_i - (a.gpu_memory_mib or [0])[0]) >= 256:
            out.recharge[wid] = (milli_i, mem_i)

    def _physics(self, cluster: ClusterState, compute: np.ndarray, out: TickResult) -> None:
        power = np.zeros(compute.shape)
        limit = np.zeros(compute.shape)
        for n, g in np.argwhere(cluster.gpu_exists):
            p, t, lim = self.physics(str(cluster.models[n]), min(1.0, compute[n, g] / 1000), float(self.temp[n, g]),
                                     self.cfg.tick_s)
            power[n, g], self.temp[n, g], limit[n, g] = p, t, lim
        self.power, self.limit = power, limit
        if self.uses("thermal"):
            cluster.temp[:] = self.temp
            cluster.power[:] = power
            cluster.power_limit[:] = limit

    def _signals(self, cluster: ClusterState, f_util: np.ndarray, f_mem: np.ndarray, residents: dict,
                 classes: dict[str, str]) -> None:
        cluster.live[:] = cluster.gpu_exists
        if self.uses("forecast"):
            cluster.forecast_util[:] = np.minimum(f_util, 100.0)
            cluster.forecast_mem[:] = f_mem
        if self.uses("fingerprint"):
            cluster.fingerprint[:] = ""
            for (n, g), res in residents.items():
                got = [classes.get(wid, "unknown") for wid, _, _ in res]
                busy = [c for c in got if c not in ("idle", "idle-holding-gpu")]
                cluster.fingerprint[n, g] = "idle-holding-gpu" if not busy else \
                    next((c for c in busy if c != "unknown"), "")

    def summary(self) -> dict:
        f = self.figures
        return {"busy_share": f.busy_gpu_s / max(f.occupied_gpu_s, 1e-9),
                "busy_share_bound": f.bound(f.packed_gpu_s), "busy_share_bound_margin": f.bound(f.packed_margin_gpu_s),
                "allocated_gpu_pct": 100 * f.requested_milli_s / max(f.capacity_milli_s, 1e-9),
                "violations": f.oom + f.contention, "oom": f.oom, "contention": f.contention}


def fewest_gpus(mib: float, caps: np.ndarray) -> float:
    """The fewest GPUs (fractions counted) that ``mib`` of memory fits in, filling the largest of ``caps`` first
    (sorted largest first): a lower bound on what any placement of it holds."""
    full = np.cumsum(caps)
    k = int(np.searchsorted(full, mib))  # the first k cards are full, the (k+1)th holds the rest
    if k >= len(caps):
        return float(len(caps)) + (mib - float(full[-1])) / max(float(caps[-1]), 1.0) if len(caps) else 0.0
    rest = mib - (float(full[k - 1]) if k else 0.0)
    return k + rest / max(float(caps[k]), 1.0)


def _mem_bw(w: Workload) -> float:
    """Memory-bandwidth share of busy time the fingerprinter sees, by the job's Gavel class."""
    return 0.9 if fingerprint_of(w.labels.get("gavel_class", "")) == "training-memory-bound" else 0.3
