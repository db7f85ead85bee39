"""scheduler.decisions.v1 schema v2: a decision names its stream signals; v1 records still decode."""

from __future__ import annotations

from gpuaware.contract.events import DecisionAction, SchedulerDecision, decode, encode, record_type


def test_signals_round_trip_and_old_records_decode_with_none():
    d = SchedulerDecision("d-1", 5, "ns/pod", DecisionAction.PLACE, node="n0", signals=["forecast", "thermal"],
                          steered_by=["forecast"])
    assert record_type(SchedulerDecision).latest == 2
    assert decode(encode(d)) == d
    old = decode(encode(d, version=1))  # what a scheduler before the stream signals wrote
    assert old.signals == [] and old.steered_by == [] and old.node == "n0"
