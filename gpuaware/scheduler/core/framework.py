"""A scheduling cycle in the shape of the kube-scheduler framework, vectorized over GPUs.

    Filter (node masks, GPU masks) -> candidates -> Score (weighted, normalized)
    -> select -> Reserve (the allocation) -> Bind (the caller's: simulator or Kubernetes)

Extension points are ``typing.Protocol`` classes; a plugin (one per file in ``plugins/``, built by
name from ``registry.py``) implements one or more:

- ``NodeFilterPlugin.filter_nodes(ctx) -> bool[N]``: False where the workload may not go;
- ``GpuFilterPlugin.filter_gpus(ctx) -> bool[N, G]``: False for GPUs it may not use;
- ``ScorePlugin.score(ctx, cand) -> float[C]``: higher is better, normalised to 0-100 per cycle.

Plugins read the cluster through ``ctx.cluster``, a ``ClusterSnapshot``: read-only arrays, no
mutating methods (kube-scheduler's Snapshot). Only the framework's reserve, at the end of
``schedule``, changes the ``ClusterState``; a plugin keeps what it must remember in itself or in
``ctx.cache`` (kube's CycleState).

A filter declares the ``Code`` it reports and the words of its message (``status.py``). A
``Profile`` sorts its plugins into extension points once, when it is built, so a cycle runs a
fixed list of steps and asks no plugin what it implements. Before the filters the framework
checks CPU and memory and the caller's node mask; after them, that enough GPU compute is free.

A score plugin that reads a stream signal (forecast, fingerprint, thermal) has a ``signal`` name and
puts it in ``ctx.signals`` when the signal was there for this cycle (a missing one falls back to a
flat or request-based score). The decision names those signals, and ``steered_by`` those of them
whose scores moved the choice off what the other scores alone would have picked.

Candidates are (node, gpu) pairs for workloads on one GPU, or (node, -1) for CPU-only and
multi-GPU workloads (whose GPUs the framework picks, one NVLink island first). A ``Decision``
carries typed reasons; ``Decision.reasons`` renders them as the lines events and records show.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from gpuaware.scheduler.core.cluster import Allocation, ClusterSnapshot, ClusterState, mig_round
from gpuaware.scheduler.core.status import Code, Reason, render
from gpuaware.scheduler.core.workload import Workload

# Who reports the framework's own checks (kube: NodeResourcesFit and the like).
NODE_RESOURCES = "node-resources"
NODE_MASK = "node-mask"
GPU_FIT = "gpu-fit"
FRAMEWORK = "framework"
TIE_ORDERS = ("random", "node-order")


@dataclass
class Candidates:
    node: np.ndarray
    gpu: np.ndarray  # -1: CPU-only, or several whole GPUs picked at reserve time

    def __len__(self) -> int:
        return len(self.node)


@dataclass
class CycleContext:
    cluster: ClusterSnapshot  # read-only: plugins write nothing of the cluster
    workload: Workload
    cache: dict = field(default_factory=dict)
    signals: set[str] = field(default_factory=set)  # stream signals the plugins read this cycle


@runtime_checkable
class Plugin(Protocol):
    name: str  # the registry name


@runtime_checkable
class NodeFilterPlugin(Protocol):
    name: str
    code: Code  # what a node it rejects is reported as
    reason: str  # the words after the count: "3 gpu model not allowed"

    def filter_nodes(self, ctx: CycleContext) -> np.ndarray: ...


@runtime_checkable
class GpuFilterPlugin(Protocol):
    name: str
    code: Code
    reason: str  # "3 GPUs excluded by gpu health"

    def filter_gpus(self, ctx: CycleContext) -> np.ndarray: ...


@runtime_checkable
class ScorePlugin(Protocol):
    name: str

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray: ...


@dataclass
class Decision:
    workload: Workload
    allocation: Allocation | None
    why: list[Reason]
    score: float | None = None
    latency_s: float = 0.0
    nodes: int = 0  # nodes the cycle looked at: the N of "0/N nodes available"
    signals: list[str] = field(default_factory=list)  # stream signals read (scheduler.decisions.v1 ``signals``)
    steered_by: list[str] = field(default_factory=list)  # of those, the ones that changed the placement

    @property
    def reasons(self) -> list[str]:
        """The reasons as lines of text, as events, decision records and logs have always shown them."""
        return render(self.why, self.nodes)


@dataclass(frozen=True)
class FilterStep:
    plugin: NodeFilterPlugin | GpuFilterPlugin
    on_gpus: bool  # filter_gpus, else filter_nodes


@dataclass(frozen=True)
class Profile:
    """A named set of plugins with score weights (kube-scheduler's profile), sorted into extension
    points here, once: a plugin that implements none of its slot's protocols is a TypeError."""

    name: str
    filters: tuple[Plugin, ...]
    scores: tuple[tuple[ScorePlugin, float], ...]
    whole_gpus_only: bool = False  # round fractional requests up (kube's device plugin without sharing)
    # Ties between the best candidates: "random" (seeded, per decision) or "node-order" (a seeded random order
    # of the nodes fixed for the run, then the lowest GPU index: the FGD artifact's, fgd_artifact.py).
    tie_order: str = "random"
    filter_steps: tuple[FilterStep, ...] = field(init=False, repr=False)
    scored_by: str = field(init=False, repr=False)  # "fgd+cpu_for_gpus": what a placement says decided it

    def __post_init__(self) -> None:
        object.__setattr__(self, "filters", tuple(self.filters))
        object.__setattr__(self, "scores", tuple((p, float(w)) for p, w in self.scores))
        steps = []
        for p in self.filters:
            # The order within a plugin (nodes, then GPUs) is the order its reasons are listed in.
            node, gpu = isinstance(p, NodeFilterPlugin), isinstance(p, GpuFilterPlugin)
            if not (node or gpu):
                raise TypeError(f"profile {self.name!r}: filter {p!r} implements neither NodeFilterPlugin nor "
                                "GpuFilterPlugin (name, code, reason and filter_nodes or filter_gpus)")
            steps += [FilterStep(p, False)] * node + [FilterStep(p, True)] * gpu
        for p, _ in self.scores:
            if not isinstance(p, ScorePlugin):
                raise TypeError(f"profile {self.name!r}: score {p!r} does not implement ScorePlugin (name, score)")
        object.__setattr__(self, "filter_steps", tuple(steps))
        object.__setattr__(self, "scored_by", "+".join(p.name for p, _ in self.scores) or "first fit")


def gpu_fit(ctx: CycleContext) -> np.ndarray:
    c, w = ctx.cluster, ctx.workload
    milli = 1000 if w.num_gpu > 1 else w.gpu_milli
    need = np.where(c.mig, mig_round(milli), milli) if c.has_mig else milli
    ok = c.gpu_exists & (c.gpu_free >= need)
    if w.gpu_memory_mib:
        ok &= (c.gpu_mem_cap == 0) | (c.gpu_mem_free >= w.gpu_memory_mib)
    return ok


def tightest_share(ctx: CycleContext, cand: Candidates) -> Candidates:
    """For a memory share (``Workload.memory_share``): the candidates on GPUs that hold work already and that it
    leaves the least memory free, so that shares fill partly used GPUs before they open fresh ones; all of them
    where no partly used GPU fits (the scores then pick the fresh GPU). The filters have run, and the scores
    (FGD's among them) still choose among what is left.

    Only for memory shares: a GPU's memory left over is stranded for any share larger than it, which FGD's
    weighing of the expected task mix's compute does not see; for compute fractions that weighing packs best
    (docs/dra-scheduling.md, "Pace": the rule applied to the openb simulator's fractional pods)."""
    c, w = ctx.cluster, ctx.workload
    free = c.gpu_free[cand.node, cand.gpu].astype(np.int64)
    partly = free < 1000
    if c.has_mig:
        partly &= ~c.mig[cand.node, cand.gpu]
    if not partly.any():
        return cand
    # The model holds a share as its fraction of the GPU's compute: its memory left is that fraction of its
    # memory (a GPU of unpublished memory counted as large as the largest).
    cap = c.gpu_mem_cap[cand.node, cand.gpu].astype(np.int64)
    cap = np.where(cap > 0, cap, max(int(c.gpu_mem_cap.max(initial=0)), 1))
    left = np.where(partly, (free - w.gpu_milli) * cap, np.iinfo(np.int64).max)
    keep = np.flatnonzero(left == left.min())
    return Candidates(cand.node[keep], cand.gpu[keep])


class Scheduler:
    def __init__(self, profile: Profile, seed: int = 0):
        if profile.tie_order not in TIE_ORDERS:
            raise ValueError(f"profile {profile.name!r}: unknown tie order {profile.tie_order!r}; known: {TIE_ORDERS}")
        self.profile = profile
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self._node_rank: np.ndarray | None = None

    def node_rank(self, nodes: int) -> np.ndarray:
        """Each node's place in the seeded random order that breaks ties under ``tie_order="node-order"``.

        Drawn from its own generator so the decision stream of ``self.rng`` is what it always was."""
        if self._node_rank is None or len(self._node_rank) != nodes:
            perm = np.random.default_rng([self.seed, 23]).permutation(nodes)
            self._node_rank = np.empty(nodes, dtype=np.int64)
            self._node_rank[perm] = np.arange(nodes)
        return self._node_rank

    def break_tie(self, best: np.ndarray, cand: Candidates, cluster: ClusterState) -> int:
        if len(best) == 1:
            return int(best[0])
        if self.profile.tie_order == "random":
            return int(self.rng.choice(best))
        key = self.node_rank(len(cluster))[cand.node[best]] * (cluster.max_gpus + 1) + np.maximum(cand.gpu[best], 0)
        return int(best[np.argmin(key)])

    def effective(self, w: Workload) -> Workload:
        if self.profile.whole_gpus_only and w.shares_gpu:
            return Workload(**{**w.__dict__, "gpu_milli": 1000})
        return w

    def candidates(self, ctx: CycleContext, node_mask: np.ndarray | None = None,
                   among: np.ndarray | None = None) -> tuple[Candidates, list[Reason]]:
        """``among`` (True = asked about): the only nodes considered; the others are neither candidates nor
        counted in the reasons (kube-scheduler asks its extender about a share of the nodes)."""
        c, w = ctx.cluster, ctx.workload
        reasons: list[Reason] = []
        node_ok = (c.cpu_free >= w.cpu_milli) & (c.mem_free >= w.memory_mib)
        if among is not None:
            node_ok &= among
        if node_mask is not None:
            if (node_ok & ~node_mask).any():
                reasons.append(Reason(Code.RESERVED, NODE_MASK,
                                      f"{int((node_ok & ~node_mask).sum())} reserved for higher-priority work"))
            node_ok &= node_mask
        short = ~node_ok if among is None else among & ~node_ok
        if short.any():
            reasons.append(Reason(Code.INSUFFICIENT_CPU_MEMORY, NODE_RESOURCES,
                                  f"{int(short.sum())} insufficient cpu/memory"))
        gpu_ok = gpu_fit(ctx) if w.num_gpu else None
        for step in self.profile.filter_steps:
            p = step.plugin
            if not step.on_gpus:
                m = p.filter_nodes(ctx)
                if (node_ok & ~m).any():
                    reasons.append(Reason(p.code, p.name, f"{int((node_ok & ~m).sum())} {p.reason}"))
                node_ok &= m
            elif gpu_ok is not None:
                m = p.filter_gpus(ctx)
                dropped = gpu_ok & ~m if among is None else gpu_ok & ~m & among[:, None]
                if dropped.any():
                    reasons.append(Reason(p.code, p.name, f"{int(dropped.sum())} GPUs excluded by {p.reason}"))
                gpu_ok &= m
        ctx.cache["gpu_ok"] = gpu_ok
        if w.num_gpu == 0:
            nodes = np.flatnonzero(node_ok)
            return Candidates(nodes, np.full(len(nodes), -1)), reasons
        gpu_ok = gpu_ok & node_ok[:, None]
        if w.num_gpu == 1:
            n, g = np.nonzero(gpu_ok)
            if len(n) == 0 and node_ok.any():
                reasons.append(Reason(Code.INSUFFICIENT_GPU, GPU_FIT, "no GPU with enough free compute/memory"))
            return Candidates(n, g), reasons
        enough = gpu_ok.sum(axis=1) >= w.num_gpu
        if node_ok.any() and not (enough & node_ok).any():
            reasons.append(Reason(Code.INSUFFICIENT_WHOLE_GPUS, GPU_FIT, f"no node with {w.num_gpu} free GPUs"))
        nodes = np.flatnonzero(enough)
        return Candidates(nodes, np.full(len(nodes), -1)), reasons

    def pick_gpus(self, ctx: CycleContext, node: int) -> list[int]:
        """k whole GPUs on one node, from one NVLink island when one has enough."""
        w, c = ctx.workload, ctx.cluster
        free = np.flatnonzero(ctx.cache["gpu_ok"][node])
        groups = c.nvlink[node, free]
        best: list[int] | None = None
        for gid in np.unique(groups):
            members = free[groups == gid]
            if len(members) >= w.num_gpu and (best is None or len(members) < len(best)):
                best = members.tolist()  # the smallest island that fits keeps bigger ones whole
        return (best or free.tolist())[: w.num_gpu]

    def total_score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        """Weighted sum of every score plugin, each normalised to 0-100 over the candidates.

        The part from stream plugins (``signal``) is also kept apart in ``ctx.cache["stream_score"]``."""
        total = np.zeros(len(cand))
        stream = None
        for plugin, weight in self.profile.scores:
            s = np.asarray(plugin.score(ctx, cand), dtype=np.float64)
            lo, hi = s.min(), s.max()
            norm = (s - lo) / (hi - lo) * 100 if hi > lo else np.zeros_like(s)
            total += weight * norm
            if getattr(plugin, "signal", None) and hi > lo:
                stream = weight * norm if stream is None else stream + weight * norm
        ctx.cache["stream_score"] = stream
        return total

    def _steered_by(self, ctx: CycleContext, total: np.ndarray, chosen: int) -> list[str]:
        """The signals read, if without the stream plugins' scores ``chosen`` would not have been among the best."""
        stream = ctx.cache.get("stream_score")
        if stream is None or not ctx.signals:
            return []
        base = total - stream
        return [] if base[chosen] >= base.max() - 1e-9 else sorted(ctx.signals)

    def rank(self, cluster: ClusterState, workload: Workload, node_mask: np.ndarray | None = None,
             among: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
        """Every node's best score for ``workload`` (-inf where it cannot go) and why nodes failed; with ``among``
        only those nodes are scored (the others -inf) and counted in the reasons.

        Nothing is reserved: this is the question kube-scheduler's extender asks (filter, prioritize).
        """
        w = self.effective(workload)
        ctx = CycleContext(cluster.snapshot(), w)
        cand, reasons = self.candidates(ctx, node_mask, among)
        best = np.full(len(cluster), -np.inf)
        if len(cand):
            np.maximum.at(best, cand.node, self.total_score(ctx, cand))
        return best, [r.message for r in reasons]

    def schedule(self, cluster: ClusterState, workload: Workload, node_mask: np.ndarray | None = None,
                 among: np.ndarray | None = None) -> Decision:
        """One scheduling cycle; ``node_mask`` (False = off limits) carries reservations; ``among`` (True = asked
        about), as for ``rank``: only those nodes are considered and counted in the reasons."""
        started = time.perf_counter()
        w = self.effective(workload)
        ctx = CycleContext(cluster.snapshot(), w)
        cand, reasons = self.candidates(ctx, node_mask, among)
        if len(cand) == 0:
            why = reasons or [Reason(Code.NO_FEASIBLE_NODE, FRAMEWORK, "no feasible node")]
            return Decision(workload, None, why, latency_s=time.perf_counter() - started, nodes=len(cluster))
        considered = len(cand)
        if w.memory_share and w.num_gpu == 1:
            cand = tightest_share(ctx, cand)
        total = self.total_score(ctx, cand)
        best = np.flatnonzero(total >= total.max() - 1e-9)
        i = self.break_tie(best, cand, cluster)
        node, gpu = int(cand.node[i]), int(cand.gpu[i])
        if w.num_gpu == 0:
            gpus, milli = [], []
        elif w.num_gpu == 1:
            on_mig = bool(cluster.mig[node, gpu])
            gpus, milli = [gpu], [mig_round(w.gpu_milli) if on_mig else w.gpu_milli]
        else:
            gpus = self.pick_gpus(ctx, node)
            milli = [1000] * len(gpus)
        if w.num_gpu == 1 and cluster.mig[node, gpus[0]]:
            sharing = "mig"
        elif w.shares_gpu:
            sharing = "mps" if w.labels.get("sharing") == "mps" else "shared"  # shared = time-slicing
        else:
            sharing = "exclusive"
        alloc = Allocation(workload.id, node, gpus, milli, w.cpu_milli, w.memory_mib,
                           [w.gpu_memory_mib] * len(gpus), sharing)
        cluster.allocate(alloc)
        why = [Reason(Code.SCHEDULED, FRAMEWORK, f"{cluster.names[node]} gpus={gpus} by {self.profile.scored_by}"),
               Reason(Code.SCHEDULED, FRAMEWORK, f"{considered} candidates")]
        return Decision(workload, alloc, why, float(total[i]), time.perf_counter() - started, len(cluster),
                        sorted(ctx.signals), self._steered_by(ctx, total, i))
