"""The agent's output for a simulated cluster on a simulated clock, as fast as it can be computed.

Used where real agents would be too slow to wait for: tests and benchmarks of the stream replay
minutes or hours of fleet telemetry (the same AgentCore and BatchBuilder as the live agent, so
the records are exactly what agents publish).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from gpuaware.agent.collectors.sim import Scenario, SimCluster
from gpuaware.agent.core import AgentCore, BatchBuilder
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract.events import GpuEvent, TelemetryBatch


@dataclass
class Tick:
    second: float
    batches: list[TelemetryBatch] = field(default_factory=list)
    events: list[GpuEvent] = field(default_factory=list)


def simulate(scenario: Scenario, seconds: int, epoch_s: float, flush_every_s: int = 1,
             policy: SamplingPolicy | None = None) -> Iterator[Tick]:
    """Yield, second by second, the batches and events the agents of ``scenario`` would publish.

    Timestamps are ``epoch_s`` + simulated seconds, so a replay can end at "now".
    """
    clock = [epoch_s]
    cluster = SimCluster(scenario, clock=lambda: clock[0], epoch=epoch_s)
    cores = [AgentCore(c, policy or SamplingPolicy(), clock=lambda: clock[0]) for c in cluster.collectors()]
    builders = [BatchBuilder(core.node, core.devices) for core in cores]
    for s in range(seconds):
        clock[0] = epoch_s + s
        tick = Tick(epoch_s + s)
        for core, builder in zip(cores, builders, strict=True):
            out = core.tick(epoch_s + s)
            builder.add(out.samples, out.points)
            tick.events.extend(out.events)
            if (s + 1) % flush_every_s == 0:
                batch = builder.build()
                if batch is not None:
                    tick.batches.append(batch)
        yield tick
