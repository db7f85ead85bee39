"""Workload fingerprints: the simulator's workload kinds told apart; an unknown workload starts conservative."""

from __future__ import annotations

from gpuaware.stream import fingerprint as fp
from tests.support import KINDS_SCENARIO, replay_scenario

EXPECTED = {
    "training-compute": fp.TRAINING_COMPUTE, "training-memory": fp.TRAINING_MEMORY,
    "inference-bursty": fp.INFERENCE_BURSTY, "idle-holding": fp.IDLE_HOLDING,
}


def test_fingerprints_separate_the_simulators_workload_kinds() -> None:
    proc, kind_of = replay_scenario(KINDS_SCENARIO, 600)
    assert len(proc.trackers) == 8
    for t in proc.trackers.values():
        cls, confidence = t.fingerprint.predict_one()
        assert cls == EXPECTED[kind_of[t.uuid]], (kind_of[t.uuid], cls, t.fingerprint.features())
        assert confidence > 0.5


def test_an_unknown_workload_starts_conservative_and_converges() -> None:
    f = fp.WorkloadFingerprint()
    seen = []
    for i in range(60):
        f.learn_one(i * 1000, 95.0, 25.0, 50_000, 80_000, 600.0)
        seen.append(f.predict_one())
    assert seen[0] == (fp.UNKNOWN, 0.0)
    assert seen[5][0] == fp.UNKNOWN
    assert seen[-1][0] == fp.TRAINING_COMPUTE
    confidences = [c for _, c in seen[fp.WorkloadFingerprint().min_samples:]]
    assert confidences == sorted(confidences) and confidences[-1] > 0.6


def test_the_snapshot_is_what_asdict_gives_for_every_field() -> None:
    """``to_dict`` is written out field by field: a field added to the fingerprint must be added there too."""
    import dataclasses

    learned = fp.WorkloadFingerprint()
    for i in range(30):
        learned.learn_one(1_000 * i, 90.0, 70.0, 30_000.0 + i, 81_920.0, 400.0)
    assert learned.to_dict() == dataclasses.asdict(learned)
    assert list(learned.to_dict()) == [f.name for f in dataclasses.fields(learned)]
    assert fp.WorkloadFingerprint.from_dict(learned.to_dict()) == learned
