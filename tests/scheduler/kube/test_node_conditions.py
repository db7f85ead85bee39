"""What a node's remediation chains say on the Node: NPD-style conditions and the gpuaware taint."""

from __future__ import annotations

from gpuaware.contract.events import HealthAction, HealthVerdict
from gpuaware.scheduler.core.remediation import Chain
from gpuaware.scheduler.kube import node_conditions as nc
from gpuaware.scheduler.kube import objects


def chain(gpu: int, action: HealthAction, drained: bool = False, requested: bool = False) -> Chain:
    c = Chain("n0", gpu, action, [f"reason {gpu}"], cordoned_at=0.0, validate_s=60.0)
    if drained:
        c.drained(1.0)
    if requested:
        c.observe(HealthVerdict.CRITICAL, action, [f"reason {gpu}"], 2.0)
    return c


def test_no_chain_no_problem_no_taint():
    conditions, taint = nc.desired([])
    assert conditions == {nc.GPU_UNHEALTHY: ("False", *nc.HEALTHY), nc.GPU_MAINTENANCE: ("False", *nc.NO_MAINTENANCE)}
    assert taint is None


def test_the_strongest_action_names_the_reason_and_only_requested_gpus_the_hand_off():
    conditions, taint = nc.desired([chain(2, HealthAction.DRAIN, drained=True),
                                    chain(5, HealthAction.RESET_GPU, drained=True, requested=True),
                                    chain(6, HealthAction.RESET_GPU)])
    status, reason, message = conditions[nc.GPU_UNHEALTHY]
    assert (status, reason) == ("True", "GPUResetRecommended")
    assert message == ("GPU 2 validating (drain): reason 2; GPU 5 requested (reset_gpu): reason 5; "
                       "GPU 6 draining (reset_gpu): reason 6")
    assert conditions[nc.GPU_MAINTENANCE] == ("True", "GPUResetRequired", "reset_gpu: GPU 5")
    assert taint == {"key": "gpuaware.io/gpu-unhealthy", "value": "reset_gpu", "effect": "PreferNoSchedule"}


def test_a_reboot_taints_the_node_no_schedule_and_gpuaware_stops_placing_there():
    conditions, taint = nc.desired([chain(0, HealthAction.REBOOT_NODE, drained=True, requested=True)])
    assert conditions[nc.GPU_MAINTENANCE][:2] == ("True", "NodeRebootRequired")
    assert taint is not None and taint["effect"] == "NoSchedule"
    node = {"metadata": {"name": "n0"}, "spec": {"taints": [taint]}, "status": {}}
    assert not objects.schedulable(node)
    node["spec"]["taints"] = [{**taint, "effect": "PreferNoSchedule"}]
    assert objects.schedulable(node)


def test_an_unchanged_status_keeps_its_transition_time():
    node = {"status": {"conditions": [{"type": nc.GPU_UNHEALTHY, "status": "True",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    want = {nc.GPU_UNHEALTHY: ("True", "GPUDrained", "m"), nc.GPU_MAINTENANCE: ("False", *nc.NO_MAINTENANCE)}
    out = {c["type"]: c for c in nc.condition_objects(want, node, "2026-02-02T10:00:00.123Z")}
    assert out[nc.GPU_UNHEALTHY]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert out[nc.GPU_MAINTENANCE]["lastTransitionTime"] == "2026-02-02T10:00:00Z"
    assert out[nc.GPU_UNHEALTHY]["lastHeartbeatTime"] == "2026-02-02T10:00:00Z"


def test_a_new_leader_reads_the_open_chains_back_from_the_condition():
    chains = [chain(2, HealthAction.DRAIN, drained=True), chain(5, HealthAction.RESET_GPU, drained=True,
                                                                requested=True)]
    chains[1].reasons = ["XID 48: double-bit ECC", "XID 63: row remap"]
    want, _ = nc.desired(chains)
    node = {"status": {"conditions": nc.condition_objects(want, None, "2026-02-02T10:00:00.123Z")}}
    found, since = nc.open_chains(node)
    assert found == {2: (HealthAction.DRAIN, ["reason 2"]),
                     5: (HealthAction.RESET_GPU, ["XID 48: double-bit ECC", "XID 63: row remap"])}
    assert since is not None and since > 0
    healthy, _ = nc.desired([])
    assert nc.open_chains({"status": {"conditions": nc.condition_objects(healthy, None, "2026-02-02T10:00:00Z")}}) \
        == ({}, None)


def test_what_the_maintenance_condition_asks_reads_back_as_written():
    conditions, _ = nc.desired([chain(5, HealthAction.RESET_GPU, drained=True, requested=True),
                                chain(7, HealthAction.RESET_GPU, drained=True, requested=True)])
    node = {"status": {"conditions": nc.condition_objects(conditions, None, "2026-01-01T00:00:00Z")}}
    assert nc.requested(node) == (HealthAction.RESET_GPU, [5, 7])
    quiet, _ = nc.desired([])
    assert nc.requested({"status": {"conditions": nc.condition_objects(quiet, None, "2026-01-01T00:00:00Z")}}) is None
