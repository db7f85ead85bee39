"""`gpuaware up`: the local stack on one machine: broker, simulated nodes with their agents, live view.

The stream workers and the scheduler join here as their issues land; until then the summary says so.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from rich.console import Group
from rich.live import Live
from rich.table import Table

from agent.collectors.sim import SimCluster, load_scenario
from agent.runtime import AgentRuntime
from agent.sampling import SamplingPolicy
from gpuaware.localbroker import LocalBroker
from stream import topics
from stream.events import GpuEvent, HealthBand


@dataclass
class StackState:
    started: float = field(default_factory=time.monotonic)
    events: deque[GpuEvent] = field(default_factory=lambda: deque(maxlen=8))
    kinds: Counter[str] = field(default_factory=Counter)
    first_event: dict[str, float] = field(default_factory=dict)  # gpu uuid -> first event time (unix s)
    all_events: list[GpuEvent] = field(default_factory=list)

    def on_event(self, ev: GpuEvent) -> None:
        self.events.append(ev)
        self.kinds[ev.kind.value] += 1
        self.all_events.append(ev)


def _view(runtime: AgentRuntime, state: StackState, bootstrap: str) -> Group:
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
    totals = (f"samples published {runtime.samples_published}   events {runtime.events_published}   "
              f"spooled {runtime.spool.depth}   stream workers: not built yet   scheduler: not built yet")
    return Group(fleet, recent, totals)


async def run_stack(broker: LocalBroker, scenario_name: str, duration_s: float | None, live: bool,
                    stop: asyncio.Event) -> dict:
    scenario = load_scenario(scenario_name)
    cluster = SimCluster(scenario)
    state = StackState()
    with tempfile.TemporaryDirectory(prefix="gpuaware-spool-") as spool:
        runtime = AgentRuntime(cluster.collectors(), broker.kafka_settings(), SamplingPolicy(), spool)
        runtime.event_listeners.append(state.on_event)
        task = asyncio.create_task(runtime.run(stop, duration_s))
        if live:
            with Live(_view(runtime, state, broker.bootstrap), refresh_per_second=2) as screen:
                while not task.done():
                    await asyncio.sleep(1.0)
                    screen.update(_view(runtime, state, broker.bootstrap))
        await task
    uuid_of = {(n, t.device.index): t.device.uuid for n, core in enumerate(runtime.cores) for t in core.tracks}
    elapsed = time.time() - cluster.epoch
    faults = []
    for f in scenario.faults:
        uuid = uuid_of[(f.node, f.gpu)]
        # Event times are whole milliseconds: allow that rounding at the fault's onset.
        reacted = [max(0.0, e.ts_ms / 1000 - cluster.epoch - f.at_s) for e in state.all_events
                   if e.gpu_uuid == uuid and e.ts_ms / 1000 - cluster.epoch >= f.at_s - 0.002]
        faults.append({"kind": f.kind, "node": scenario.node_name(f.node), "gpu": f.gpu, "at_s": f.at_s,
                       "injected": f.at_s <= elapsed, "agent_reaction_s": round(min(reacted), 2) if reacted else None})
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
        "faults": faults,
        "components": {"broker": "running", "agents": "running",
                       "stream": "not built yet (issue 4)", "scheduler": "not built yet (issue 6)"},
    }
