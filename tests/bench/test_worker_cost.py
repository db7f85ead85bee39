"""The worker-cost harness drives the processor as a worker does: every sample the fleet sends is applied, states come
out of takes and heartbeats, and the timers run."""

from __future__ import annotations

from gpuaware.bench.fleet_load import TICKS_PER_S, Fleet, build_template
from gpuaware.bench.worker_cost import T0_MS, Worker


def test_the_harness_applies_what_the_fleet_sends_and_publishes_states() -> None:
    template = build_template(nodes=2, loop_s=60, warmup_s=5)
    worker = Worker(Fleet(template, gpus=32, prefix="wc"))
    for tick in range(90 * TICKS_PER_S):
        worker.tick(tick, T0_MS + tick * 100)
    proc = worker.processor
    assert worker.samples > 100
    assert proc.stats.samples + proc.stats.duplicates == worker.samples  # nothing dropped on the way
    assert len(proc.trackers) == 32 and proc.node_published  # every GPU met, rollups made
    assert worker.states > 0 and worker.heartbeat_states <= worker.states
    assert worker.process_s > 0 and worker.timers_s > 0 and worker.split["rollup"] > 0
