"""The PodGroupScheduled condition a gang's PodGroup gets: what it says, and when it is written (only on a change,
keeping the group's other conditions). On the real apiserver: tests/scheduler/kube/test_podgroups.py."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuaware.scheduler.kube.podgroup_status import CONDITION, wanted, with_condition

NOW = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)


def test_a_gang_is_scheduled_once_min_count_members_are_bound_and_unschedulable_when_refused():
    assert wanted(3, 3, None) == ("True", "Scheduled", "3 members bound (minCount 3)")
    assert wanted(3, 4, "x") == ("True", "Scheduled", "4 members bound (minCount 3)")
    assert wanted(3, 1, "gang g: no room; none of its 3 members placed") == \
        ("False", "Unschedulable", "gang g: no room; none of its 3 members placed")
    assert wanted(3, 0, None) is None  # not tried yet: nothing to say


def test_the_condition_is_written_on_a_change_only_and_keeps_the_other_conditions():
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "",
                  "lastTransitionTime": "2026-12-07T01:00:00Z"}
    refused = ("False", "Unschedulable", "no room")
    first = with_condition({"conditions": [disruption]}, refused, 2, NOW)
    assert first == [disruption, {"type": CONDITION, "status": "False", "reason": "Unschedulable",
                                  "message": "no room", "lastTransitionTime": "2026-12-07T03:00:00Z",
                                  "observedGeneration": 2}]
    assert with_condition({"conditions": first}, refused, 2, NOW) is None
    later = datetime(2026, 12, 7, 3, 5, tzinfo=UTC)
    reworded = with_condition({"conditions": first}, ("False", "Unschedulable", "still no room"), 2, later)
    assert reworded[-1]["lastTransitionTime"] == "2026-12-07T03:00:00Z"  # same status: no transition
    flipped = with_condition({"conditions": first}, ("True", "Scheduled", "3 members bound (minCount 3)"), 2, later)
    assert flipped[-1]["lastTransitionTime"] == "2026-12-07T03:05:00Z" and flipped[-1]["status"] == "True"
    assert [c["type"] for c in flipped] == ["DisruptionTarget", CONDITION]
