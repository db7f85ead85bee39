"""The runtime forecaster on Kafka: what the learner publishes per completion rebuilds it exactly."""

from __future__ import annotations

import math

import pytest

from gpuaware.contract.events import JobCompletion, JobRuntime, decode
from gpuaware.stream.processor import InvalidRecord
from gpuaware.stream.runtime import RuntimeForecaster
from gpuaware.stream.runtime_topic import META, SEEN, RuntimeLearner


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
    assert keys == [*_completion(1).signature, "declared:t/train", "declared:t", "#seen:t/p1@1000", META]
    assert {decode(v, JobRuntime).through for _, v in out} == {17}  # on every record
    meta = decode(out[-1][1], JobRuntime)
    assert meta.n == 1
    declared = decode(out[-3][1], JobRuntime)
    assert declared.n == 1 and math.isclose(declared.mean, math.log(137.0 / 50.0))


def test_a_completion_without_a_runtime_or_signature_is_invalid():
    with pytest.raises(InvalidRecord):
        RuntimeLearner().learn(JobCompletion("t/p", 1, "t", 0.0, ["*"]), 0)
    with pytest.raises(InvalidRecord):
        RuntimeLearner().learn(JobCompletion("t/p", 1, "t", 10.0, []), 0)


@pytest.mark.parametrize("bad", [
    {"runtime_s": math.inf}, {"runtime_s": math.nan}, {"runtime_s": -5.0},
    {"declared_s": math.inf}, {"declared_s": math.nan}, {"declared_s": 0.0}, {"declared_s": -1.0},
    {"signature": ["owner:t/x", ""]}, {"declared_keys": [""]}, {"ts_ms": -1},
])
def test_an_invalid_completion_is_dead_lettered_and_changes_nothing(bad):
    learner = RuntimeLearner()
    learner.learn(_completion(0, declared=100.0), 0)
    before = learner.forecaster.state()
    c = _completion(1, declared=100.0)
    for field, value in bad.items():
        setattr(c, field, value)
    with pytest.raises(InvalidRecord):
        learner.learn(c, 1)
    assert learner.forecaster.state() == before and learner.through == 0 and len(learner.seen) == 1


def test_a_completion_published_twice_is_learned_once_even_by_a_restarted_learner():
    learner = RuntimeLearner()
    log = [r for i in range(3) for r in learner.learn(_completion(i), i)]
    assert learner.learn(_completion(1), 7) == []  # the same job and end again, at a later offset
    again = RuntimeLearner()
    again.restore(_compacted(log))
    assert again.learn(_completion(2), 9) == [] and again.learn(_completion(0), 10) == []
    assert again.forecaster.state() == learner.forecaster.state()
    other = _completion(2)
    other.ts_ms += 1  # a pod of the same name that ended at another time: a completion of its own
    assert again.learn(other, 11)
    assert again.forecaster.learned == 4


def test_the_window_of_completions_remembered_is_bounded_and_restored_in_order():
    learner = RuntimeLearner(remember=3)
    log = [r for i in range(6) for r in learner.learn(_completion(i), i)]
    assert list(learner.seen) == ["t/p3@3000", "t/p4@4000", "t/p5@5000"]
    again = RuntimeLearner(remember=3)
    again.restore(_compacted(log))
    assert again.seen == learner.seen
    assert [k for k, v in _compacted(log) if k.startswith(SEEN) and v is not None] == [SEEN + k for k in learner.seen]


@pytest.mark.parametrize("published", range(1, 8))
def test_a_worker_stopped_part_way_through_a_completions_records_is_followed_by_one_that_learns_the_rest(published):
    """The first ``published`` records of the last completion reached the topic, not its ``#z90``."""
    whole = RuntimeLearner()
    log = [r for i in range(4) for r in whole.learn(_completion(i, declared=90.0), i)]
    last = whole.learn(_completion(4, declared=90.0), 4)
    assert len(last) == 8
    again = RuntimeLearner()
    again.restore(_compacted(log + last[:published]))
    assert again.through == 3
    rest = again.learn(_completion(4, declared=90.0), 4)
    mine, theirs = again.forecaster.state(), whole.forecaster.state()
    assert {k: v[0] for k, v in mine.items()} == {k: v[0] for k, v in theirs.items()}  # each key learned it once
    assert {k: v for k, v in mine.items() if k != META} == {k: v for k, v in theirs.items() if k != META}
    assert [k for k, _ in rest] == [k for k, _ in last[published:]]
