"""Topic names and their broker-side configuration: the one place both are written down.

The local broker, the Kubernetes manifests (Strimzi ``KafkaTopic``) and every producer and
consumer read this table, so a topic's partition count or cleanup policy cannot drift
between them.

Compacted topics (the state topics, the control topic, the stream's table changelog) keep the
newest record per key, and a reader that starts rebuilds its picture by reading them from the
beginning, so how much it reads is set by how well they are compacted. Kafka's defaults do badly
here: the active segment is never compacted, and it rolls only after ``segment.ms`` (7 days) or
``segment.bytes`` (1 GiB), so a restarting scheduler would read up to a week of every update to
every GPU (one day on 1,000 GPUs at 10 s is 8.6M records; docs/reliability.md). Every compacted
topic therefore gets ``COMPACTION`` unless its row says otherwise:

- ``segment.ms`` 1 h: the uncompacted tail is at most an hour of updates;
- ``segment.bytes`` 64 MiB where the volume is (``gpu.state.v1``, the changelog), so a burst or
  a larger cluster rolls by size before the hour is up;
- ``min.cleanable.dirty.ratio`` 0.1: a log of a few thousand keys and millions of updates is
  cleaned as soon as a segment rolls, not once the dirty part is half the log;
- ``min.compaction.lag.ms`` 1 min: a reader a little behind still sees every transition (a
  health band turning critical and back) rather than only the newest;
- ``delete.retention.ms`` 1 day: a tombstone outlives any catch-up by far, so a reader that
  started before compaction still sees the deletion.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DLQ_SUFFIX = ".dlq"

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
MIB = 1024 * 1024

COMPACTION: dict[str, str] = {
    "segment.ms": str(HOUR_MS),
    "min.cleanable.dirty.ratio": "0.1",
    "min.compaction.lag.ms": str(MINUTE_MS),
    "delete.retention.ms": str(DAY_MS),
}
HIGH_VOLUME_STATE = {"segment.bytes": str(64 * MIB)}  # one record per GPU every few seconds


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    cleanup_policy: str  # "delete" or "compact"
    retention_ms: int | None
    key: str
    doc: str
    extra_configs: dict[str, str] = field(default_factory=dict)

    def configs(self) -> dict[str, str]:
        """Kafka topic configs (the ``configs`` of CreateTopics / ``spec.config`` of a KafkaTopic)."""
        out = {"cleanup.policy": self.cleanup_policy}
        if self.cleanup_policy == "compact":
            out.update(COMPACTION)
        if self.retention_ms is not None:
            out["retention.ms"] = str(self.retention_ms)
        out.update(self.extra_configs)
        return out


TELEMETRY = "gpu.telemetry.v1"
EVENTS = "gpu.events.v1"
GPU_STATE = "gpu.state.v1"
NODE_STATE = "node.state.v1"
CLUSTER_FORECAST = "cluster.forecast.v1"
DECISIONS = "scheduler.decisions.v1"
CONTROL = "agent.control.v1"
JOB_RUNTIME = "job.runtime.v1"
JOB_COMPLETIONS = "job.completions.v1"

CONTRACT_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(TELEMETRY, 8, "delete", 6 * HOUR_MS, "node name", "batches of compact per-GPU samples"),
    TopicSpec(EVENTS, 4, "delete", 7 * DAY_MS, "GPU UUID", "discrete edge events"),
    TopicSpec(GPU_STATE, 8, "compact", None, "GPU UUID", "derived per-GPU state", HIGH_VOLUME_STATE),
    TopicSpec(NODE_STATE, 4, "compact", None, "node name", "node rollup and topology"),
    TopicSpec(CLUSTER_FORECAST, 1, "compact", None, "cluster", "demand forecast per GPU model"),
    TopicSpec(DECISIONS, 4, "delete", 30 * DAY_MS, "workload id", "scheduler decisions with reasons"),
    TopicSpec(CONTROL, 1, "compact", None, "node name or * (a GPU's power cap: node/GPU UUID)",
              "sampling policy and power-cap commands"),
    # One partition each: one stream worker owns the learning, so each key has a single writer
    # (docs/forecasting.md#job-runtimes).
    TopicSpec(JOB_COMPLETIONS, 1, "delete", 7 * DAY_MS, "workload id",
              "jobs that ended successfully: runtime and signature"),
    TopicSpec(JOB_RUNTIME, 1, "compact", None, "signature key (owner:, tenant:, shape:, *, declared:) or #z90",
              "job runtime statistics per signature key"),
)


def dlq_name(topic: str) -> str:
    return topic + DLQ_SUFFIX


def dlq_spec(spec: TopicSpec) -> TopicSpec:
    # One partition is enough: a DLQ is read by people and replay tools, not by a hot path.
    return TopicSpec(dlq_name(spec.name), 1, "delete", 14 * DAY_MS, spec.key, f"undecodable records of {spec.name}")


ALL_TOPICS: tuple[TopicSpec, ...] = CONTRACT_TOPICS + tuple(dlq_spec(t) for t in CONTRACT_TOPICS)

BY_NAME: dict[str, TopicSpec] = {t.name: t for t in ALL_TOPICS}


def spec(name: str) -> TopicSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a topic of the gpuaware contract; known: {sorted(BY_NAME)}") from None
