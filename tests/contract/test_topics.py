from __future__ import annotations

import pytest

from gpuaware.contract import topics


def test_every_contract_topic_has_a_dlq_and_names_are_unique():
    names = [t.name for t in topics.ALL_TOPICS]
    assert len(names) == len(set(names))
    for t in topics.CONTRACT_TOPICS:
        assert topics.dlq_name(t.name) in names


def test_cleanup_policies_follow_the_design():
    compacted = {t.name for t in topics.CONTRACT_TOPICS if t.cleanup_policy == "compact"}
    assert compacted == {topics.GPU_STATE, topics.NODE_STATE, topics.CLUSTER_FORECAST, topics.CONTROL,
                         topics.JOB_RUNTIME}
    # A key's runtime statistics have a single writer: the owner of the completions' one partition.
    assert topics.spec(topics.JOB_COMPLETIONS).partitions == topics.spec(topics.JOB_RUNTIME).partitions == 1
    assert topics.spec(topics.TELEMETRY).configs()["retention.ms"] == str(6 * topics.HOUR_MS)
    assert "retention.ms" not in topics.spec(topics.GPU_STATE).configs()


def test_unknown_topic_is_a_clear_error():
    with pytest.raises(KeyError, match="not a topic of the gpuaware contract"):
        topics.spec("gpu.telemetry.v0")


COMPACTION_KEYS = ("segment.ms", "min.cleanable.dirty.ratio", "delete.retention.ms", "min.compaction.lag.ms")


def _compacted() -> list[topics.TopicSpec]:
    from gpuaware.stream.app import internal_topics
    from gpuaware.stream.settings import StreamSettings

    return [t for t in (*topics.ALL_TOPICS, *internal_topics(StreamSettings())) if t.cleanup_policy == "compact"]


def test_every_compacted_topic_rolls_its_active_segment_soon_enough_to_be_compacted():
    """The active segment is never compacted, and Kafka's default segment.ms is 7 days: without these,
    a restarting reader reads a week of every update to every key."""
    compacted = _compacted()
    assert {t.name for t in compacted} >= {topics.GPU_STATE, topics.NODE_STATE, topics.CLUSTER_FORECAST,
                                           topics.CONTROL, "gpuaware-stream-gpus-changelog"}
    for t in compacted:
        c = t.configs()
        assert all(k in c for k in COMPACTION_KEYS), (t.name, c)
        assert int(c["segment.ms"]) <= topics.HOUR_MS, t.name
        assert 0 < float(c["min.cleanable.dirty.ratio"]) <= 0.5, t.name
        # Tombstones outlive any catch-up; records stay uncompacted long enough for a live reader to see them.
        assert int(c["delete.retention.ms"]) >= topics.HOUR_MS, t.name
        assert 0 < int(c["min.compaction.lag.ms"]) < int(c["segment.ms"]), t.name
    # Where the volume is (one record per GPU every few seconds), a segment also rolls by size.
    for name in (topics.GPU_STATE, "gpuaware-stream-gpus-changelog"):
        spec = next(t for t in compacted if t.name == name)
        assert int(spec.configs()["segment.bytes"]) <= 128 * 1024 * 1024, name


def test_delete_topics_carry_no_compaction_settings():
    for t in topics.ALL_TOPICS:
        if t.cleanup_policy == "delete":
            assert not set(COMPACTION_KEYS) & set(t.configs()), t.name
