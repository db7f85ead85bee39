"""Topic names and their broker-side configuration: the one place both are written down.

The local broker, the Kubernetes manifests (Strimzi ``KafkaTopic``) and every producer and
consumer read this table, so a topic's partition count or cleanup policy cannot drift
between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DLQ_SUFFIX = ".dlq"

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


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

CONTRACT_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(TELEMETRY, 8, "delete", 6 * HOUR_MS, "node name", "batches of compact per-GPU samples"),
    TopicSpec(EVENTS, 4, "delete", 7 * DAY_MS, "GPU UUID", "discrete edge events"),
    TopicSpec(GPU_STATE, 8, "compact", None, "GPU UUID", "derived per-GPU state",
              {"min.compaction.lag.ms": "60000"}),
    TopicSpec(NODE_STATE, 4, "compact", None, "node name", "node rollup and topology"),
    TopicSpec(CLUSTER_FORECAST, 1, "compact", None, "cluster", "demand forecast per GPU model"),
    TopicSpec(DECISIONS, 4, "delete", 30 * DAY_MS, "workload id", "scheduler decisions with reasons"),
    TopicSpec(CONTROL, 1, "compact", None, "node name or *", "sampling policy and power-cap commands"),
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
