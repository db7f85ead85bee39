"""The runtime forecaster on Kafka: what the learner publishes per completion rebuilds it exactly."""

from __future__ import annotations

import math

import pytest

from gpuaware.contract.events import JobCompletion, JobRuntime, decode
from gpuaware.stream.processor import InvalidRecord
from gpuaware.stream.runtime import RuntimeForecaster
from gpuaware.stream.runtime_topic import META, RuntimeLearner


def _completion(i: int, owner: str = "train", declared: float | None = None) -> JobCompletion:
    keys = [f"owner:t/{owner}", f"tenant:t|{owner}-shape", f"shape:{owner}-shape", "*"]
    return JobCompletion(f"t/p{i}", 1_000 * i, "t", 100.0 + 37.0 * (i % 5), keys, declared,
                         ["declared:t/" + owner, "declared:t"] if declared else [])


def _compacted(log: list[tuple[bytes, bytes | None]]) -> list[tuple[str, JobRuntime | None]]:
    """What a compacted topic keeps: the newest record per key, in the order of their offsets."""
    newest = {key: (offset, value) for offset, (key, value) in enumerate(log)}
    kept = sorted(newest.items(), key=lambda kv: kv[1][0])
    return [(k.decode(), None if v is None else decode(v, JobRuntime)) for k, (_, v) in kept]


@pytest.mark.parametrize("max_keys", [100_000, 5])
def test_the_published_records_rebuild_the_forecaster_exactly_even_after_evictions(max_keys):
    learner = RuntimeLearner(RuntimeForecaster(max_keys=max_keys))
    log: list[tuple[bytes, bytes | None]] = []
    for i in range(40):
        log += learner.learn(_completion(i, owner=f"o{i % 7}", declared=120.0 if i % 3 == 0 else None), i)
    if max_keys == 5:
        assert any(v is None for _, v in log)  # evicted keys are tombstoned
    again = RuntimeLearner(RuntimeForecaster(max_keys=max_keys))
    again.restore(_compacted(log))
    assert again.forecaster.state() == learner.forecaster.state()
    assert list(again.forecaster.state()) == list(learner.forecaster.state())  # the LRU order too
    assert again.through == 39


def test_a_completion_delivered_again_after_a_restart_is_not_learned_twice():
    learner = RuntimeLearner()
    log = [r for i in range(3) for r in learner.learn(_completion(i), i)]
    again = RuntimeLearner()
    again.restore(_compacted(log))
    assert again.learn(_completion(2), 2) == []  # redelivered: its offset was not committed before the restart
    assert again.forecaster.state() == learner.forecaster.state()
    assert again.learn(_completion(3), 3)


def test_each_completion_publishes_its_keys_then_z90_with_the_offset_learned_through():
    learner = RuntimeLearner()
    out = learner.learn(_completion(1, declared=50.0), 17)
    keys = [k.decode() for k, _ in out]
    assert keys == [*_completion(1).signature, "declared:t/train", "declared:t", META]
    meta = decode(out[-1][1], JobRuntime)
    assert meta.through == 17 and meta.n == 1
    declared = decode(out[-2][1], JobRuntime)
    assert declared.n == 1 and math.isclose(declared.mean, math.log(137.0 / 50.0))


def test_a_completion_without_a_runtime_or_signature_is_invalid():
    with pytest.raises(InvalidRecord):
        RuntimeLearner().learn(JobCompletion("t/p", 1, "t", 0.0, ["*"]), 0)
    with pytest.raises(InvalidRecord):
        RuntimeLearner().learn(JobCompletion("t/p", 1, "t", 10.0, []), 0)
