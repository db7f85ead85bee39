"""The demo claims of `gpuaware up` (gpuaware/local/stack_dra.py); `up` itself on the real control plane:
tests/system/test_up.py."""

from __future__ import annotations

from gpuaware.contract import dra
from gpuaware.local.stack_dra import DEMO_NAME, demo_objects
from gpuaware.scheduler.kube.dra import claims as dra_claims


def test_each_namespace_gets_a_claim_of_one_whole_gpu_and_a_pod_of_gpuaware_naming_it():
    objects = demo_objects(["team-a", "team-b"])
    assert [(c["metadata"]["namespace"], p["metadata"]["namespace"]) for c, p in objects] == \
        [("team-a", "team-a"), ("team-b", "team-b")]
    for claim, pod in objects:
        (request,) = claim["spec"]["devices"]["requests"]
        assert request["exactly"] == {"deviceClassName": dra.DEVICE_CLASS_GPU, "allocationMode": "ExactCount",
                                      "count": 1}
        assert pod["spec"]["schedulerName"] == "gpuaware"
        assert dra_claims.claim_names(pod) == [f"{pod['metadata']['namespace']}/{DEMO_NAME}"]
