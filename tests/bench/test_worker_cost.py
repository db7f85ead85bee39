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


def test_the_table_counts_what_the_worker_writes_by_kind_of_key() -> None:
    """The node entries, the minute histories and the owners are told apart, each write with its bytes, as the
    processor stores them (the harness's ``Table`` is the processor's table itself)."""
    template = build_template(nodes=2, loop_s=60, warmup_s=5)
    worker = Worker(Fleet(template, gpus=16, prefix="wc"))
    for tick in range(150 * TICKS_PER_S):  # past two minute boundaries: histories are written
        worker.tick(tick, T0_MS + tick * 100)
    table = worker.table
    assert worker.processor.snapshots is table
    assert set(table.writes) == {"node", "hist", "owner"} and table.writes["owner"] == 16  # once per GPU met
    for kind in table.writes:
        held = [v for k, v in table.items() if k.startswith(kind + ":")]
        # every key held was written, and the writes' bytes count each rewrite too
        assert table.writes[kind] >= len(held) > 0 and table.bytes[kind] >= sum(map(len, held))
    assert table.writes["node"] > 20 * 2  # two nodes, their entries rewritten with each of their batches (every 5 s)
