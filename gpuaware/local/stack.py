"""`gpuaware up`: the local stack on one machine: broker, simulated nodes with their agents, stream
workers, the scheduler on the simulated nodes as a Kubernetes cluster (``stack_scheduler``), an
optional local Prometheus, and the live view.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Group
from rich.live import Live
from rich.table import Table

from agent.collectors.sim import SimCluster, load_scenario
from agent.cordons import CordonWatcher
from agent.main import serve_metrics
from agent.runtime import AgentRuntime
from agent.sampling import SamplingPolicy
from contract import topics
from contract.events import ClusterForecast, DecodeError, GpuEvent, GpuState, HealthBand, decode
from gpuaware.local.broker import BrokerSettings, LocalBroker
from gpuaware.local.processes import free_port
from gpuaware.local.prometheus import LocalPrometheus, available
from gpuaware.local.stack_scheduler import StackScheduler
from gpuaware.local.stream_workers import StreamWorkerProcess
from plumbing.kafka_settings import KafkaSettings
from plumbing.signals import stop_on_signals


@dataclass
class StackState:
    started: float = field(default_factory=time.monotonic)
    events: deque[GpuEvent] = field(default_factory=lambda: deque(maxlen=8))
    kinds: Counter[str] = field(default_factory=Counter)
    first_event: dict[str, float] = field(default_factory=dict)  # gpu uuid -> first event time (unix s)
    all_events: list[GpuEvent] = field(default_factory=list)

    gpu_states: dict[str, GpuState] = field(default_factory=dict)
    state_records: Counter[str] = field(default_factory=Counter)
    forecast: ClusterForecast | None = None
    band_seen: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # uuid -> (arrival, band)
    prometheus: LocalPrometheus | None = None
    firing: dict[str, float] = field(default_factory=dict)  # alert name -> first seen firing (unix s)

    def refresh_alerts(self) -> None:
        if self.prometheus is None:
            return
        try:
            alerts = self.prometheus.alerts()
        except (OSError, ValueError, KeyError):
            return  # not up yet
        for a in alerts:
            if a.get("state") == "firing":
                self.firing.setdefault(a["labels"]["alertname"], time.time())

    def on_event(self, ev: GpuEvent) -> None:
        self.events.append(ev)
        self.kinds[ev.kind.value] += 1
        self.all_events.append(ev)

    def on_derived(self, topic: str, value: bytes) -> None:
        try:
            record = decode(value)
        except DecodeError:
            return
        self.state_records[topic] += 1
        if isinstance(record, GpuState):
            before = self.gpu_states.get(record.gpu_uuid)
            if before is None or before.health_band != record.health_band:
                self.band_seen.setdefault(record.gpu_uuid, []).append((time.time(), record.health_band.value))
            self.gpu_states[record.gpu_uuid] = record
        elif isinstance(record, ClusterForecast):
            self.forecast = record


async def watch_derived(kafka: KafkaSettings, state: StackState, stop: asyncio.Event) -> None:
    """Follow what the stream publishes (gpu/node state, cluster forecast) for the view and the summary."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topics.GPU_STATE, topics.NODE_STATE, topics.CLUSTER_FORECAST,
                                **kafka.consumer_kwargs(None))
    await consumer.start()
    try:
        while not stop.is_set():
            for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                for m in msgs:
                    state.on_derived(tp.topic, m.value)
    finally:
        await consumer.stop()


def _scheduler_tables(sched: StackScheduler) -> list[Table]:
    live = sched.live
    tenants = Table(title="scheduler: queues per tenant")
    for col in ("tenant", "pending (high/medium/low)", "running pods", "GPUs used", "quota"):
        tenants.add_column(col, justify="left" if col == "tenant" else "right")
    snap = live.snapshot
    running = Counter(r.workload.tenant for r in live.cache.running.values())
    for t in sorted(set(snap.gpus_quota) | set(snap.gpus_used)):
        pend = "/".join(str(snap.pending.get((t, p), 0)) for p in ("high", "medium", "low"))
        tenants.add_row(t, pend, str(running.get(t, 0)), f"{snap.gpus_used.get(t, 0.0):.1f}",
                        f"{snap.gpus_quota.get(t, 0.0):.0f}")
    decisions = Table(title="scheduler: recent decisions")
    for col in ("action", "pod / GPU", "node", "why"):
        decisions.add_column(col)
    for o in list(live.sink.recent)[-6:][::-1]:
        decisions.add_row(o.action.value, o.key[-28:], o.node or "", "; ".join(o.reasons)[:70])
    return [tenants, decisions]


def _view(runtime: AgentRuntime, state: StackState, bootstrap: str, sched: StackScheduler | None = None) -> Group:
    by_model: dict[str, Counter[str]] = {}
    util: dict[str, list[float]] = {}
    for core in runtime.cores:
        for t in core.tracks:
            c = by_model.setdefault(t.device.model, Counter())
            c["gpus"] += 1
            c["lost" if t.lost else t.health.band.value.lower()] += 1
            if t.last_watch is not None and t.last_watch.util_gpu is not None and not t.lost:
                util.setdefault(t.device.model, []).append(t.last_watch.util_gpu)
    fleet = Table(title=f"gpuaware up — broker {bootstrap} — {time.monotonic() - state.started:.0f}s")
    for col in ("GPU model", "GPUs", "healthy", "degraded", "critical", "lost", "mean util %"):
        fleet.add_column(col, justify="right" if col != "GPU model" else "left")
    for model, c in sorted(by_model.items()):
        u = util.get(model, [])
        fleet.add_row(model, str(c["gpus"]), str(c["healthy"]), f"[yellow]{c['degraded']}", f"[red]{c['critical']}",
                      str(c["lost"]), f"{sum(u) / len(u):.1f}" if u else "-")
    recent = Table(title="recent events")
    for col in ("time", "node", "GPU", "kind", "message"):
        recent.add_column(col)
    for ev in reversed(state.events):
        recent.add_row(time.strftime("%H:%M:%S", time.localtime(ev.ts_ms / 1000)), ev.node, ev.gpu_uuid[-12:],
                       ev.kind.value, ev.message[:70])
    classes = Counter(s.workload_class or "unknown" for s in state.gpu_states.values())
    derived = Table(title="stream: workload classes and demand forecast (GPUs busy)")
    derived.add_column("workload class")
    derived.add_column("GPUs", justify="right")
    derived.add_column("GPU model")
    derived.add_column("now+5 min [80% interval]", justify="right")
    derived.add_column("capacity", justify="right")
    demand = [d for d in (state.forecast.models if state.forecast else []) if d.horizon_s == 300]
    for i in range(max(len(classes), len(demand))):
        cls = sorted(classes.items())[i] if i < len(classes) else ("", "")
        d = demand[i] if i < len(demand) else None
        derived.add_row(cls[0], str(cls[1]), d.model if d else "",
                        f"{d.demand_gpus:.1f} [{d.lower:.1f}, {d.upper:.1f}]" if d else "",
                        f"{d.capacity_gpus:.0f}" if d else "")
    alerts = ", ".join(sorted(state.firing)) or ("none" if state.prometheus else "no Prometheus")
    placed = sched.live.stats.by_action()["PLACE"] if sched else 0
    totals = (f"samples published {runtime.samples_published}   events {runtime.events_published}   "
              f"spooled {runtime.spool.depth}   gpu states {state.state_records[topics.GPU_STATE]}   "
              + (f"pods placed {placed}" if sched else "scheduler off") + f"\nalerts firing: {alerts}")
    return Group(fleet, recent, derived, *(_scheduler_tables(sched) if sched else []), totals)


async def run_stack(broker: LocalBroker, scenario_name: str, duration_s: float | None, live: bool,
                    stop: asyncio.Event, stream_workers: int = 1, prometheus: bool = False,
                    scheduler: bool = True) -> dict:
    scenario = load_scenario(scenario_name)
    state = StackState()
    kafka = broker.kafka_settings(session_timeout_ms=2000)
    with tempfile.TemporaryDirectory(prefix="gpuaware-up-") as workdir:
        workers = [StreamWorkerProcess(kafka, "gpuaware-stream", Path(workdir), f"stream-{i}")
                   for i in range(stream_workers)]
        for w in workers:
            w.start()
        sched = StackScheduler(kafka, scenario, seed=scenario.seed) if scheduler else None
        sched_stop = asyncio.Event()
        sched_task = None
        if sched is not None:
            await sched.start()
            sched_task = asyncio.create_task(sched.run(sched_stop))
        cluster = SimCluster(scenario)  # the simulated clock starts now: fault times count from here
        runtime = AgentRuntime(cluster.collectors(), kafka, SamplingPolicy(), str(Path(workdir) / "spool"))
        runtime.event_listeners.append(state.on_event)
        if sched is not None:  # the agents honour the scheduler's GPU cordons, as on a cluster
            runtime.cordons = CordonWatcher.from_settings(runtime.cores, runtime.stats, sched.fake.url, 2.0)
        prom = None
        if prometheus:
            agent_port = free_port()
            serve_metrics(runtime, "127.0.0.1", agent_port)
            targets = {"gpuaware-agent": [agent_port], "gpuaware-stream": [w.metrics_port for w in workers]}
            if sched is not None:
                targets["gpuaware-scheduler"] = [sched.serve_metrics()]
            prom = LocalPrometheus(Path(workdir) / "prometheus", targets)
            prom.start()
            state.prometheus = prom
        watching = asyncio.Event()
        watcher = asyncio.create_task(watch_derived(kafka, state, watching))
        task = asyncio.create_task(runtime.run(stop, duration_s))
        try:
            if live:
                with Live(_view(runtime, state, broker.bootstrap, sched), refresh_per_second=2) as screen:
                    while not task.done():
                        await asyncio.sleep(1.0)
                        await asyncio.to_thread(state.refresh_alerts)
                        screen.update(_view(runtime, state, broker.bootstrap, sched))
            while not task.done():
                if prom is not None:
                    await asyncio.to_thread(state.refresh_alerts)
                await asyncio.sleep(1.0)
            await task
            await asyncio.sleep(2.0)  # the last states of the run
            if prom is not None:
                state.refresh_alerts()
        finally:
            sched_stop.set()
            if sched_task is not None:
                await sched_task
            scheduler_summary = sched.summary() if sched is not None else None
            if sched is not None:
                await sched.stop()
            watching.set()
            await watcher
            if prom is not None:
                prom.stop()
            exits = {w.name: w.stop() for w in workers}
    uuid_of = {(n, t.device.index): t.device.uuid for n, core in enumerate(runtime.cores) for t in core.tracks}
    elapsed = time.time() - cluster.epoch
    faults = []
    for f in scenario.faults:
        uuid = uuid_of[(f.node, f.gpu)]
        # Event times are whole milliseconds: allow that rounding at the fault's onset.
        reacted = [max(0.0, e.ts_ms / 1000 - cluster.epoch - f.at_s) for e in state.all_events
                   if e.gpu_uuid == uuid and e.ts_ms / 1000 - cluster.epoch >= f.at_s - 0.002]
        # The stream's reaction: its first gpu.state with a worse health band after the fault.
        moved = [t - cluster.epoch - f.at_s for t, band in state.band_seen.get(uuid, [])
                 if band != HealthBand.HEALTHY.value and t - cluster.epoch >= f.at_s]
        faults.append({"kind": f.kind, "node": scenario.node_name(f.node), "gpu": f.gpu, "at_s": f.at_s,
                       "injected": f.at_s <= elapsed, "agent_reaction_s": round(min(reacted), 2) if reacted else None,
                       "stream_reaction_s": round(min(moved), 2) if moved else None,
                       "scheduler_reaction_s": sched.reaction_s(scenario.node_name(f.node), f.gpu,
                                                                cluster.epoch + f.at_s) if sched else None})
    bands = Counter(("lost" if t.lost else t.health.band.value.lower()) for c in runtime.cores for t in c.tracks)
    return {
        "bootstrap": broker.bootstrap,
        "storage": broker.settings.storage,
        "topics": sorted(t.name for t in topics.ALL_TOPICS),
        "nodes": len(runtime.cores),
        "gpus": sum(len(c.tracks) for c in runtime.cores),
        "duration_s": round(time.monotonic() - state.started, 3),
        "samples": runtime.samples_published,
        "watch_reads": sum(c.watch_reads for c in runtime.cores),
        "events": runtime.events_published,
        "events_by_kind": dict(state.kinds),
        "anomalies": state.kinds.get("ANOMALY", 0),
        "health_bands": {b: bands.get(b, 0) for b in (HealthBand.HEALTHY.value.lower(), "degraded", "critical",
                                                       "lost")},
        "spool_dropped": runtime.spool.dropped,
        "agent_cordoned_gpus": sum(t.cordoned for c in runtime.cores for t in c.tracks),
        "faults": faults,
        "stream": {
            "workers": stream_workers,
            "worker_exit_codes": exits,
            "records": dict(state.state_records),
            "gpus_with_state": len(state.gpu_states),
            "workload_classes": dict(Counter(s.workload_class or "unknown" for s in state.gpu_states.values())),
            "demand_forecast": [vars(d) for d in state.forecast.models] if state.forecast else [],
        },
        "scheduler": scheduler_summary,
        "prometheus": {"url": prom.url, "alerts_firing": sorted(state.firing)} if prom is not None else None,
        "components": {"broker": "running", "agents": "running", "stream": "running",
                       "scheduler": "running" if sched is not None else "off (--no-scheduler)"},
    }


def run_up(settings: BrokerSettings, scenario_name: str, duration_s: float | None, live: bool,
           stream_workers: int = 1, prometheus: bool | None = None, scheduler: bool = True) -> dict:
    """`gpuaware up`: a broker and the stack on it until ``duration_s`` passes or SIGINT/SIGTERM arrives.

    ``prometheus`` None runs one when the binary is installed. Raises BrokerError when the broker
    cannot start, ValueError for a run that cannot be done as asked.
    """
    broker = LocalBroker(settings).start()

    async def main() -> dict:
        stop = stop_on_signals()
        if prometheus and not available():
            raise ValueError("--prometheus: no prometheus binary on PATH (Debian package prometheus)")
        return await run_stack(broker, scenario_name, duration_s, live=live, stop=stop, stream_workers=stream_workers,
                               prometheus=available() if prometheus is None else prometheus, scheduler=scheduler)

    try:
        return asyncio.run(main())
    finally:
        broker.stop()
