from __future__ import annotations

import pytest

from contract import topics


def test_every_contract_topic_has_a_dlq_and_names_are_unique():
    names = [t.name for t in topics.ALL_TOPICS]
    assert len(names) == len(set(names))
    for t in topics.CONTRACT_TOPICS:
        assert topics.dlq_name(t.name) in names


def test_cleanup_policies_follow_the_design():
    compacted = {t.name for t in topics.CONTRACT_TOPICS if t.cleanup_policy == "compact"}
    assert compacted == {topics.GPU_STATE, topics.NODE_STATE, topics.CLUSTER_FORECAST, topics.CONTROL}
    assert topics.spec(topics.TELEMETRY).configs()["retention.ms"] == str(6 * topics.HOUR_MS)
    assert "retention.ms" not in topics.spec(topics.GPU_STATE).configs()


def test_unknown_topic_is_a_clear_error():
    with pytest.raises(KeyError, match="not a topic of the gpuaware contract"):
        topics.spec("gpu.telemetry.v0")
