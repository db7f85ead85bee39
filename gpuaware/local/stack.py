"""`gpuaware up`: the local stack on one machine: broker, simulated nodes with their agents, stream
workers, the scheduler on the simulated nodes as a Kubernetes cluster (``stack_scheduler``), an
optional local Prometheus, and the live view (``view``).

Whatever stops it (the duration, SIGINT to the terminal's process group, SIGTERM to this process),
the parts stop in the reverse order of their start: components, stream workers, the broker last,
and the summary is still returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.live import Live

from gpuaware.agent.collectors.sim import LIMIT_FAULTS, SCENARIO_DIR, Scenario, SimCluster, load_scenario
from gpuaware.agent.cordons import CordonWatcher
from gpuaware.agent.main import serve_metrics
from gpuaware.agent.runtime import AgentRuntime
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.agent.verdict import ACTION_RANK, VERDICT_RANK
from gpuaware.contract import topics
from gpuaware.contract.events import (
    ClusterForecast,
    DecodeError,
    EventKind,
    GpuEvent,
    GpuState,
    HealthAction,
    HealthBand,
    HealthVerdict,
    decode,
)
from gpuaware.local import stack_dra
from gpuaware.local.broker import BrokerSettings, LocalBroker
from gpuaware.local.kube_cluster import RealCluster
from gpuaware.local.processes import finish, free_port, stop_children
from gpuaware.local.prometheus import LocalPrometheus
from gpuaware.local.reset_tool import ResetTool
from gpuaware.local.stack_scheduler import StackScheduler
from gpuaware.local.stream_workers import StreamWorkerProcess
from gpuaware.local.view import StackView, logs_above
from gpuaware.plumbing import traces
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.plumbing.kube.api import KubeApi, connect


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


async def run_stack(broker: LocalBroker, scenario_name: str, duration_s: float | None, live: bool,
                    stop: asyncio.Event, stream_workers: int = 1, prometheus: bool = False,
                    scheduler: bool = True, hurry: asyncio.Event | None = None, kube: str = "embedded") -> dict:
    """Run the stack on ``broker`` until ``duration_s`` or ``stop``; ``hurry`` kills the children instead of
    waiting for them to finish. Parts stop in the reverse order of their start: the broker must outlive them."""
    scenario = load_scenario(scenario_name)
    hurry = hurry or asyncio.Event()
    state = StackState()
    kafka = broker.kafka_settings(session_timeout_ms=2000)
    exits: dict[str, int | None] = {}
    scheduler_summary: dict | None = None
    with tempfile.TemporaryDirectory(prefix="gpuaware-up-") as workdir:
        async with contextlib.AsyncExitStack() as started:
            # The local stack has no apiserver to check node tokens with: any agent may speak for any node here.
            workers = [StreamWorkerProcess(kafka, "gpuaware-stream", Path(workdir), f"stream-{i}", node_identity="off")
                       for i in range(stream_workers)]

            async def stop_workers() -> None:
                exits.update(await stop_children(workers, hurry))

            started.push_async_callback(stop_workers)
            for w in workers:
                w.start()
            sched = StackScheduler(kafka, scenario, seed=scenario.seed, kube=kube) if scheduler else None
            if sched is not None:
                await sched.start()
                if sched.cluster.kubeconfig is not None:
                    _notice(f"Kubernetes: kube-apiserver with kwok nodes; kubectl --kubeconfig "
                            f"{sched.cluster.kubeconfig} get nodes,pods,resourceslices,resourceclaims -A")
                started.push_async_callback(sched.stop)
                sched_stop = asyncio.Event()
                sched_task = asyncio.create_task(sched.run(sched_stop))

                async def stop_scheduling() -> None:
                    nonlocal scheduler_summary
                    sched_stop.set()
                    await sched_task
                    scheduler_summary = sched.summary()

                started.push_async_callback(stop_scheduling)
            # The simulated clock starts at the agents' first read: fault times, the GPUs' crossings and the agents'
            # events are then on one timeline, however long the agents took to start (their Kafka topic check).
            cluster = SimCluster(scenario, start_on_first_read=True)
            runtime = AgentRuntime(cluster.collectors(), kafka, SamplingPolicy(), str(Path(workdir) / "spool"))
            runtime.event_listeners.append(state.on_event)
            if sched is not None:  # the agents honour the scheduler's GPU cordons, as on a cluster
                runtime.cordons = _cordons(runtime, sched)
            if sched is not None and isinstance(sched.cluster, RealCluster):  # and publish their GPUs as devices
                await started.enter_async_context(stack_dra.published(sched.cluster, runtime.cores))
            resets = ResetTool(sched.cluster, cluster) if sched is not None else None
            if resets is not None:  # the cluster's tooling: answers a GPUResetRequired condition with a reset
                resets_stop = asyncio.Event()
                resets_task = asyncio.create_task(resets.run(resets_stop))

                async def stop_resets() -> None:
                    resets_stop.set()
                    await resets_task

                started.push_async_callback(stop_resets)
            prom = None
            if prometheus:
                agent_port = free_port()
                serve_metrics(runtime, "127.0.0.1", agent_port)
                targets = {"gpuaware-agent": [agent_port], "gpuaware-stream": [w.metrics_port for w in workers]}
                if sched is not None:
                    targets["gpuaware-scheduler"] = [sched.serve_metrics()]
                prom = LocalPrometheus(Path(workdir) / "prometheus", targets)
                started.push_async_callback(stop_children, [prom], hurry)
                prom.start()
                state.prometheus = prom
            watching = asyncio.Event()
            watcher = asyncio.create_task(watch_derived(kafka, state, watching))

            async def stop_watching() -> None:
                watching.set()
                await watcher

            started.push_async_callback(stop_watching)
            task = asyncio.create_task(runtime.run(stop, duration_s))
            await _follow(task, runtime, state, StackView(runtime, state, broker.bootstrap, sched) if live else None)
            with contextlib.suppress(TimeoutError):  # the last states of the run, unless told to hurry
                await asyncio.wait_for(hurry.wait(), 2.0)
            if prom is not None:
                state.refresh_alerts()
    faults = _fault_reactions(scenario, cluster, runtime, state, sched, resets)
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
            "demand_forecast": forecast_rows(state.forecast),
        },
        "scheduler": scheduler_summary,
        "kube": kube if scheduler else None,
        "prometheus": {"url": prom.url, "alerts_firing": sorted(state.firing)} if prom is not None else None,
        "components": {"broker": "running", "agents": "running", "stream": "running",
                       "scheduler": "running" if sched is not None else "off (--no-scheduler)"},
    }


def _cordons(runtime: AgentRuntime, sched: StackScheduler) -> CordonWatcher:
    """What tells the agents the scheduler's GPU cordons: the stack's own apiserver, or the real one."""
    if sched.cluster.api_server is not None:
        return CordonWatcher.from_settings(runtime.cores, runtime.stats, sched.cluster.api_server, 2.0)
    return CordonWatcher(runtime.cores, KubeApi(connect(pool_size=2)), runtime.stats, 2.0)  # through KUBECONFIG


async def _follow(task: asyncio.Task, runtime: AgentRuntime, state: StackState, view: StackView | None) -> None:
    """Until the agents' ``task`` ends: the live ``view`` when there is one, the alerts kept fresh, and a notice
    when the first samples are out."""
    if view is not None:
        with Live(refresh_per_second=2, vertical_overflow="crop") as screen, logs_above():
            while not task.done():
                screen.update(view.frame(screen.console), refresh=True)
                await asyncio.sleep(1.0)
                await asyncio.to_thread(state.refresh_alerts)
    announced = False
    while not task.done():
        if state.prometheus is not None:
            await asyncio.to_thread(state.refresh_alerts)
        if not announced and runtime.samples_published:
            # Without the live view this is the one sign a headless run has reached the broker.
            announced = True
            _notice(f"agents publishing: {runtime.samples_published} samples so far")
        await asyncio.sleep(1.0)
    await task


def _fault_reactions(scenario: Scenario, cluster: SimCluster, runtime: AgentRuntime, state: StackState,
                     sched: StackScheduler | None, resets: ResetTool | None) -> list[dict]:
    """Per injected fault: how long the agent, the stream and the scheduler took to react, and what they did."""
    uuid_of = {(n, t.device.index): t.device.uuid for n, core in enumerate(runtime.cores) for t in core.tracks}
    elapsed = time.time() - cluster.epoch
    faults = []
    for f in scenario.faults:
        uuid = uuid_of[(f.node, f.gpu)]
        node = scenario.node_name(f.node)
        # Event times are whole milliseconds: allow that rounding at the fault's onset.
        after = [e for e in state.all_events if e.gpu_uuid == uuid and e.ts_ms / 1000 - cluster.epoch >= f.at_s - 0.002]
        reacted = [max(0.0, e.ts_ms / 1000 - cluster.epoch - f.at_s) for e in after]
        # The stream's reaction: its first gpu.state with a worse health band after the fault.
        moved = [t - cluster.epoch - f.at_s for t, band in state.band_seen.get(uuid, [])
                 if band != HealthBand.HEALTHY.value and t - cluster.epoch >= f.at_s]
        worst = worst_verdict(after)
        # A thermal fault or a leak: its first CRITICAL verdict against when the GPU truly crossed its limit.
        critical = [e.ts_ms / 1000 - cluster.epoch for e in after if e.attributes.get("verdict") == "CRITICAL"]
        crossed = cluster.gpus[f.node][f.gpu].crossed_s
        # A forecast that did not come true and was withdrawn: the grade it settled at (as `gpuaware eval`).
        verdict, action = settled_verdict(after) if f.kind in LIMIT_FAULTS and crossed is None else worst
        lead = (round(min(critical) - crossed, 2) if f.kind in LIMIT_FAULTS and critical and crossed is not None
                and crossed >= f.at_s else None)
        faults.append({"kind": f.kind, "node": node, "gpu": f.gpu, "at_s": f.at_s,
                       "injected": f.at_s <= elapsed, "agent_reaction_s": round(min(reacted), 2) if reacted else None,
                       "stream_reaction_s": round(min(moved), 2) if moved else None,
                       "scheduler_reaction_s": sched.reaction_s(node, f.gpu, cluster.epoch + f.at_s) if sched else None,
                       "verdict": verdict, "action": action, "verdict_worst": worst[0], "action_worst": worst[1],
                       "lead_time_s": lead,
                       "gpu_reset_by_tooling": resets is not None and (node, f.gpu) in resets.resets,
                       **(sched.remediation(node, f.gpu, cluster.epoch + f.at_s) if sched else {})})
    return faults


def forecast_rows(forecast: ClusterForecast | None) -> list[dict]:
    """The newest cluster forecast as JSON rows (its records are slots dataclasses: ``vars`` cannot read them)."""
    return [asdict(d) for d in forecast.models] if forecast else []


def worst_verdict(evs: list) -> tuple[str | None, str | None]:
    """The worst verdict and strongest action the agent's HEALTH_CHANGE events gave (docs/health.md)."""
    verdicts = [HealthVerdict(v) for e in evs if (v := e.attributes.get("verdict")) in HealthVerdict.__members__]
    actions = [HealthAction(a) for e in evs if (a := e.attributes.get("action")) in HealthAction.__members__]
    return (max(verdicts, key=VERDICT_RANK.get).value if verdicts else None,
            max(actions, key=ACTION_RANK.get).value if actions else None)


def settled_verdict(evs: list) -> tuple[str | None, str | None]:
    """The worst verdict and strongest action from when the agent withdrew a CRITICAL forecast (its condition
    ``lowered``) and the GPU's verdict followed; the worst throughout when it withdrew none (docs/health.md)."""
    lowered = [i for i, e in enumerate(evs) if e.attributes.get("condition") == "lowered"]
    if lowered:
        below = [i for i, e in enumerate(evs) if i > lowered[-1] and e.kind is EventKind.HEALTH_CHANGE
                 and e.attributes.get("verdict") not in (None, HealthVerdict.CRITICAL.value)]
        if below:
            return worst_verdict(evs[below[0]:])
    return worst_verdict(evs)


class Interrupts:
    """SIGINT and SIGTERM while the stack runs: the first stops it in order, a second hurries the stop.

    Children run in their own sessions (``processes``), so a terminal's Ctrl-C reaches this process
    alone and the order of the stop is ours: components, stream workers, the broker last.
    """

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._received)

    def _received(self) -> None:
        if not self.stop.is_set():
            self.stop.set()
            _notice("stopping: components, stream workers, then the broker (Ctrl-C again to stop at once)")
        elif not self.hurry.is_set():
            self.hurry.set()
            _notice("stopping at once")


def _notice(message: str) -> None:
    # stderr: above the live view while it is on (Live redirects it), never into --json's stdout.
    print(f"gpuaware up: {message}", file=sys.stderr, flush=True)


def preflight(scenario_name: str) -> None:
    """What the run needs from disk, checked before anything starts; ValueError says what to do."""
    try:
        load_scenario(scenario_name)
    except ValueError as exc:
        known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
        raise ValueError(f"{exc}\n  --scenario takes a YAML file or one of: {known}") from exc
    try:
        traces.traces_dir()
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from exc


async def run_up(broker_settings: BrokerSettings, scenario_name: str, duration_s: float | None, live: bool,
                 stream_workers: int = 1, prometheus: bool = False, scheduler: bool = True,
                 kube: str = "embedded") -> dict:
    """`gpuaware up`: the broker, the stack on it until ``duration_s`` or a signal, the broker stopped last."""
    interrupts = Interrupts()
    interrupts.install()
    preflight(scenario_name)
    broker = LocalBroker(broker_settings)
    # A signal while the broker starts is heard here; the run then stops as soon as it has started.
    await asyncio.to_thread(broker.start)
    try:
        return await run_stack(broker, scenario_name, duration_s, live, interrupts.stop, stream_workers, prometheus,
                               scheduler, interrupts.hurry, kube)
    finally:
        await finish(asyncio.to_thread(broker.stop), interrupts.hurry, broker.kill)
