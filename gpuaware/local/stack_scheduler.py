"""The scheduler in `gpuaware up`: the simulated nodes as a Kubernetes cluster, openb pods, tenants.

Production code, local parts: the scheduler is wired as ``gpuaware scheduler`` wires it
(``gpuaware.scheduler.wiring``), reading live GPU state from the broker and publishing its decisions there;
the cluster (``gpuaware.local.kube_cluster``: the real control plane with kwok nodes, or the embedded fake
API server) holds the scenario's nodes (each labelled with its first GPU's
model: the simulator mixes models within a node, a real node does not); ``PodLoad`` plays users and
controllers:

- four tenants (``team-a``..``team-d``, weights 4:3:2:1, quotas proportional) own one namespace
  each through their ``GPUQueue``;
- pods sampled from the openb pod trace (seeded) arrive as a Poisson stream sized to ``load`` of
  the cluster's GPUs; priority from the trace's QoS (LS high, Burstable/Guaranteed medium, BE
  low, checkpointable); run time is the trace's lifetime / ``time_scale``, 20 s to 3 min;
- a pod that ran its time completes: its status turns ``Succeeded`` (its container's start and end, as
  the kubelet writes them) and it is deleted at once, as a Job's ``ttlSecondsAfterFinished: 0`` does; the
  scheduler publishes the completion on ``job.completions.v1`` and scores the runtime estimate it placed the
  pod with (``runtimes()``). A pod that disappears before (evicted: preempted, or moved off a failing GPU)
  is resubmitted, as its Job controller would.

GPU utilisation in ``up`` comes from the replayed GenTD26 traces, not from these pods: the
busy share of allocated GPUs measured here is the pipeline's figure, not the scheduler's merit
(the simulator's dynamic experiment measures that).
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuaware.agent.collectors.sim import MODELS, Scenario
from gpuaware.local import stack_dra
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.local.kube_cluster import LocalCluster, RealCluster, make_cluster
from gpuaware.local.processes import free_port
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.plumbing.traces import traces_dir
from gpuaware.scheduler.core.queue import jain_index
from gpuaware.scheduler.forecast_quality import report
from gpuaware.scheduler.kube.objects import level_of
from gpuaware.scheduler.metrics import PRIORITY_NAMES
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.scheduler.sim.openb import TracePod, load_pods
from gpuaware.scheduler.wiring import build_scheduler

TENANTS = {"team-a": 4.0, "team-b": 3.0, "team-c": 2.0, "team-d": 1.0}
QOS_PRIORITY = {"LS": 200_000, "Guaranteed": 5_000, "Burstable": 5_000, "BE": 0}
# The largest openb GPU node shape (128 CPUs, 768 GiB, 8 GPUs), per GPU. The sampled pods ask ~12 CPUs and
# ~42 GiB per GPU they use (CPU-only pods included); at ``PodLoad.load`` above 1 the GPUs must run out
# first, or most decisions are "insufficient cpu" and the demo shows none of the GPU placement.
UP_VALIDATE_S = 30.0
NODE_CPU_PER_GPU = 16
NODE_MEMORY_GIB_PER_GPU = 96


@dataclass
class Submitted:
    name: str
    namespace: str
    tenant: str
    priority: int
    created: float  # time.monotonic()
    run_s: float
    spec: dict[str, Any]
    bound: float | None = None
    finished: float | None = None
    done: bool = False
    resubmits: int = 0


@dataclass
class PodLoad:
    cluster: LocalCluster
    gpus: int
    seed: int = 0
    load: float = 1.1
    time_scale: float = 120.0
    pods: list[TracePod] = field(default_factory=list)
    submitted: dict[str, Submitted] = field(default_factory=dict)
    completed: int = 0
    resubmitted: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        if not self.pods:
            self.pods = [p for p in load_pods(traces_dir() / "alibaba-openb" / "openb_pod_list_default.csv")
                         if p.workload.num_gpu <= 8]
        sample = [self._shape(self.rng.choice(self.pods))[1] for _ in range(500)]
        mean_gpus = np.mean([g for g, _ in sample])
        mean_run = np.mean([r for _, r in sample])
        self.rate = self.load * self.gpus / max(mean_gpus * mean_run, 1e-6)

    def _shape(self, pod: TracePod) -> tuple[TracePod, tuple[float, float]]:
        w = pod.workload
        lifetime = (pod.deletion_s - pod.creation_s) if pod.deletion_s else 600.0
        run_s = float(np.clip(lifetime / self.time_scale, 20.0, 180.0))
        return pod, (w.num_gpu * (w.gpu_milli / 1000 if w.num_gpu == 1 else 1.0), run_s)

    def submit(self, seq: int) -> Submitted:
        pod, (_, run_s) = self._shape(self.rng.choice(self.pods))
        w = pod.workload
        tenant = sorted(TENANTS)[zlib.crc32(w.id.encode()) % len(TENANTS)]
        frac = w.num_gpu == 1 and w.gpu_milli < 1000
        ann = {"gpuaware.io/duration-s": str(int(run_s))}
        if frac:
            ann["gpuaware.io/gpu-milli"] = str(w.gpu_milli)
        priority = QOS_PRIORITY.get(w.qos, 0)
        if priority == 0:
            ann["gpuaware.io/checkpoint"] = "true"
        spec = make_pod(f"job-{seq:05d}", namespace=tenant, gpus=0 if frac else w.num_gpu,
                        cpu=f"{min(w.cpu_milli, 16000)}m", memory=f"{min(w.memory_mib, 65536)}Mi",
                        annotations=ann, priority=priority)
        return self._create(Submitted(spec["metadata"]["name"], tenant, tenant, priority, time.monotonic(), run_s,
                                      spec))

    def _create(self, s: Submitted) -> Submitted:
        self.cluster.create("pods", s.spec)
        self.submitted[f"{s.namespace}/{s.name}"] = s
        return s

    def tick(self) -> None:
        """Complete pods that ran their time; resubmit pods that vanished before (evicted)."""
        live = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in self.cluster.pods()}
        now = time.monotonic()
        for key, s in list(self.submitted.items()):
            if s.done:
                continue
            bound_at = self.cluster.bound_at(key)
            if bound_at is not None and s.bound is None:
                s.bound = bound_at
            if key not in live:
                s.done = True  # evicted: a controller would create a replacement
                spec = {**s.spec, "metadata": {**s.spec["metadata"], "name": f"{s.name}-r{s.resubmits + 1}"}}
                again = Submitted(spec["metadata"]["name"], s.namespace, s.tenant, s.priority, now, s.run_s, spec,
                                  resubmits=s.resubmits + 1)
                self._create(again)
                self.resubmitted += 1
            elif s.bound is not None and now - s.bound >= s.run_s:
                s.done = True
                s.finished = now
                end = time.time()
                self.cluster.succeed_pod(s.namespace, s.name, end - (now - s.bound), end)
                self.cluster.delete_pod(s.namespace, s.name)
                self.completed += 1

    async def run(self, stop: asyncio.Event) -> None:
        seq = 0
        next_at = time.monotonic()
        last_tick = 0.0
        while not stop.is_set():
            now = time.monotonic()
            while next_at <= now:  # API calls: off the loop (the real apiserver answers over the network)
                await asyncio.to_thread(self.submit, seq)
                seq += 1
                next_at += self.rng.expovariate(self.rate)
            if now - last_tick >= 0.5:
                await asyncio.to_thread(self.tick)
                last_tick = now
            await asyncio.sleep(0.05)

    def jain(self) -> float | None:
        """As the simulator's dynamic experiment: per tenant, the mean share of a completed pod's time in
        the system spent running (1 = never waited); Jain's index over tenants of that."""
        per: dict[str, list[float]] = {}
        for s in self.submitted.values():
            if s.finished is not None:
                per.setdefault(s.tenant, []).append(s.run_s / max(s.finished - s.created, s.run_s))
        return jain_index([float(np.mean(v)) for v in per.values()])

    def waits(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for s in self.submitted.values():
            if s.bound is not None:
                out.setdefault(PRIORITY_NAMES[level_of(s.priority)], []).append(s.bound - s.created)
        return out


def cluster_objects(scenario: Scenario) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = []
    for n in range(scenario.nodes):
        first = MODELS[scenario.models[(n * scenario.gpus_per_node) % len(scenario.models)]]
        nodes.append(make_node(scenario.node_name(n), gpus=scenario.gpus_per_node,
                               product=first.name.replace(" ", "-"), cpu=str(NODE_CPU_PER_GPU * scenario.gpus_per_node),
                               memory=f"{NODE_MEMORY_GIB_PER_GPU * scenario.gpus_per_node}Gi"))
    total = scenario.nodes * scenario.gpus_per_node
    weights = sum(TENANTS.values())
    queues = [{"metadata": {"name": t}, "spec": {"tenant": t, "namespaces": [t], "weight": w,
                                                 "quota": [{"model": "*", "gpus": round(total * w / weights, 1)}]}}
              for t, w in TENANTS.items()]
    return nodes, queues


@dataclass
class StackScheduler:
    """The scheduler side of `up`: the cluster (``kube``: embedded fake API server or the real control plane),
    load, LiveScheduler with its state feed and decision log."""

    kafka: KafkaSettings
    scenario: Scenario
    seed: int = 0
    kube: str = "embedded"
    busy: list[float] = field(default_factory=list)
    jain: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cluster = make_cluster(self.kube)

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await asyncio.to_thread(self.cluster.stop)  # no child of the control plane left behind
            raise

    async def _start(self) -> None:
        await asyncio.to_thread(self.cluster.start, sorted(TENANTS))
        nodes, queues = cluster_objects(self.scenario)
        for n in nodes:
            await asyncio.to_thread(self.cluster.create, "nodes", n)
        for q in queues:
            await asyncio.to_thread(self.cluster.create, "gpuqueues", q, "gpuaware.io", "v1alpha1")
        # One replica, no extender (nothing calls it here).
        # A demo's minutes cannot hold production's 5-minute validation window: 30 s of PASS returns a GPU here.
        # On the real control plane the GPUs are DRA devices too (``gpuaware.local.stack_dra``).
        settings = SchedulerSettings(api_server=self.cluster.api_server, throttle_every_s=10, extender_port=0,
                                     leader_elect=False, remediation_validate_s=UP_VALIDATE_S, dra=self.dra)
        self.runtime = build_scheduler(settings, self.kafka)
        self.live = self.runtime.live
        await self.runtime.start()
        self.load = PodLoad(self.cluster, self.scenario.nodes * self.scenario.gpus_per_node, self.seed)
        if isinstance(self.cluster, RealCluster):
            await asyncio.to_thread(stack_dra.create_demo, self.cluster, sorted(TENANTS))

    @property
    def dra(self) -> bool:
        """Whether the GPUs are DRA devices as well: on the real control plane, which checks DRA objects."""
        return isinstance(self.cluster, RealCluster)

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self.runtime.run(stop), name="scheduler"),
                 asyncio.create_task(self.load.run(stop), name="pod-load"),
                 asyncio.create_task(self._measure(stop), name="scheduler-figures")]
        await asyncio.gather(*tasks)

    async def _measure(self, stop: asyncio.Event) -> None:
        """Once a second: utilisation of the allocated GPUs (live state) and the weighted-share fairness."""
        while not stop.is_set():
            snap = self.live.snapshot
            if snap.allocated_busy_ratio is not None:
                self.busy.append(snap.allocated_busy_ratio)
            if snap.jain is not None:
                self.jain.append(snap.jain)
            await asyncio.sleep(1.0)

    def serve_metrics(self) -> int:
        """The scheduler's /metrics on a free port (for the local Prometheus); returns the port."""
        port = free_port()
        self.runtime.serve_metrics("127.0.0.1", port)
        return port

    async def stop(self) -> None:
        await self.runtime.stop()
        await asyncio.to_thread(self.cluster.stop)

    def reaction_s(self, node: str, gpu: int, injected_unix: float) -> float | None:
        """From a fault's injection to the scheduler's model taking the GPU out of healthy service."""
        gpu_state = self.live.gpu_state
        if gpu_state is None:
            return None
        after = [t - injected_unix for t, n, g, band in gpu_state.band_changes
                 if n == node and g == gpu and band > 0 and t >= injected_unix]
        return round(min(after), 2) if after else None

    def remediation(self, node: str, gpu: int, injected_unix: float) -> dict[str, Any]:
        """The remediation chain for a fault: seconds from injection to the GPU's cordon, to its pods being
        moved off, to its reset/reboot being requested and to its validated return to service (None until
        each happens), and whether the circuit breaker held it (docs/health.md)."""
        health = self.live.health
        steps = health.timeline.get((node, gpu), {}) if health is not None else {}

        def since(step: str) -> float | None:
            t = steps.get(step)
            return round(max(0.0, float(t) - injected_unix), 2) if isinstance(t, float) else None

        return {"time_to_cordon_s": since("cordoned"), "time_workloads_moved_s": since("moved"),
                "time_action_requested_s": since("requested"), "time_back_in_service_s": since("back_in_service"),
                "breaker_held": bool(steps.get("breaker_held", False))}

    def runtimes(self) -> dict[str, Any]:
        """Job runtimes: completions published, the runtime table the feed keeps, and, over the last 500
        completions, the estimate each pod was placed with against its runtime (Spearman of p50 and actual,
        share within p90, mean |log error| by level, the last few jobs)."""
        return report(self.live.stats.forecasts, self.live.stats.runtimes, time.time())

    def summary(self) -> dict[str, Any]:
        count = self.live.stats.by_action()
        waits = self.load.waits()
        return {
            "pods_submitted": len(self.load.submitted), "pods_completed": self.load.completed,
            "pods_resubmitted_after_eviction": self.load.resubmitted,
            "placements": count["PLACE"], "migrations": count["MIGRATE"], "preemptions": count["PREEMPT"],
            "stream_steered_placements": self.live.stats.steered_placements,
            "stream_steered_by_signal": dict(sorted(self.live.stats.steered.items())),
            "throttles": count["THROTTLE"], "cordons": count["CORDON"], "unschedulable": count["UNSCHEDULABLE"],
            "unschedulable_by_reason": {r: n for (a, r), n in sorted(self.live.stats.decisions.items())
                                        if a == "UNSCHEDULABLE"},
            "pending_at_end": len(self.live.cache.pending),
            "queue_wait_mean_s": {p: round(float(np.mean(v)), 2) for p, v in sorted(waits.items())},
            "queue_wait_p95_s": {p: round(float(np.percentile(v, 95)), 2) for p, v in sorted(waits.items())},
            "busy_share_of_allocated": round(float(np.mean(self.busy)), 3) if self.busy else None,
            "jain_fairness": round(j, 4) if (j := self.load.jain()) is not None else None,
            "weighted_share_jain_mean": round(float(np.mean(self.jain)), 4) if self.jain else None,
            "api_errors": {f"{v}:{c}": n for (v, c), n in self.live.stats.api_errors.items()},
            "runtimes": self.runtimes(),
            "dra": stack_dra.summary(self.cluster) if isinstance(self.cluster, RealCluster) else None,
        }
