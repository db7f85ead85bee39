"""The PodGroupScheduled condition a gang's PodGroup gets: what it says, and when it is written (only on a change,
keeping the group's other conditions). On the real apiserver: tests/scheduler/kube/test_podgroups.py."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuaware.scheduler.kube.podgroup_status import CONDITION, wanted, with_condition

NOW = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)


def test_a_gang_is_scheduled_once_min_count_members_are_bound_and_unschedulable_when_refused():
    assert wanted(3, 3, None) == ("True", "Scheduled", "3 bound (minCount 3)")
    assert wanted(3, 4, "x") == ("True", "Scheduled", "4 bound (minCount 3)")
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
    flipped = with_condition({"conditions": first}, ("True", "Scheduled", "3 bound (minCount 3)"), 2, later)
    assert flipped[-1]["lastTransitionTime"] == "2026-12-07T03:05:00Z" and flipped[-1]["status"] == "True"
    assert [c["type"] for c in flipped] == ["DisruptionTarget", CONDITION]


def test_a_group_made_again_under_its_name_gets_its_condition_and_gone_groups_are_forgotten():
    """The writer remembers what it wrote per group *object* (uid): a Job run again makes a new PodGroup of the
    same name, which must get its condition even when it says the same as the old one's."""
    from types import SimpleNamespace

    from gpuaware.local.fake_apiserver import make_pod
    from gpuaware.scheduler.kube.podgroup_status import PodGroupStatusWriter
    from gpuaware.scheduler.kube.podgroups import PodGroups

    def group(uid: str) -> dict:
        return {"metadata": {"name": "train", "namespace": "default", "uid": uid, "generation": 1},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}

    pods = {}
    for i in range(2):
        pod = make_pod(f"w{i}", gpus=1)
        pod["spec"].update(schedulerName="gpuaware", schedulingGroup={"podGroupName": "train"})
        pods[f"default/w{i}"] = pod
    groups = PodGroups()
    groups.sync([group("u1")])
    view = SimpleNamespace(podgroups=groups, pods=pods, scheduler_name="gpuaware", running=dict.fromkeys(pods),
                           assumed={}, pending={})
    writer = PodGroupStatusWriter(calls=None, cache=view, stats=None, refusal=lambda key: None)
    first = writer.conditions(NOW)
    assert first["default/train"][-1]["status"] == "True"
    assert writer.conditions(NOW) == {}  # written: not again before the watch shows it
    groups.event("DELETED", group("u1"))
    groups.event("ADDED", group("u2"))
    assert writer.conditions(NOW)["default/train"][-1]["message"] == "2 bound (minCount 2)"
    groups.event("DELETED", group("u2"))
    writer.conditions(NOW)
    assert writer.sent == {}
