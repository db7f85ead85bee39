"""The bench's ceiling binder on the real apiserver: it binds only its own pods, by whole-GPU count, each once."""

import time

from gpuaware.bench.kube_ceiling import SCHEDULER_NAME, CeilingBinder, _gpus
from gpuaware.plumbing.kube.api import KubeApi
from tests.real_kube import api_client


def _pod(name: str, scheduler: str, gpus: int = 0, milli: int | None = None) -> dict:
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    ann = {"gpuaware.io/gpu-milli": str(milli)} if milli else {}
    return {"metadata": {"name": name, "annotations": ann},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "registry.invalid/j:1",
                                                                  "resources": res}]}}


def test_a_fraction_counts_a_whole_gpu_and_a_cpu_pod_none():
    assert _gpus(_pod("a", SCHEDULER_NAME, gpus=2)) == 2
    assert _gpus(_pod("b", SCHEDULER_NAME, milli=300)) == 1
    assert _gpus(_pod("c", SCHEDULER_NAME)) == 0


def test_the_ceiling_binds_its_pods_round_robin_within_gpu_counts_and_leaves_the_rest(kube):
    for name in ("c-node-0", "c-node-1"):
        kube.create("nodes", {"metadata": {"name": name}, "status": {
            "allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2"},
            "capacity": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2"},
            "conditions": [{"type": "Ready", "status": "True"}]}})
    kube.create("pods", _pod("before", SCHEDULER_NAME, gpus=1))  # pending before it starts: found by its list
    binder = CeilingBinder(KubeApi(api_client(kube.cp.kubeconfig)), [("c-node-0", 2), ("c-node-1", 2)], workers=4)
    binder.start()
    try:
        for name, gpus, milli in (("whole", 2, None), ("frac", 0, 250), ("too-big", 2, None)):
            kube.create("pods", _pod(name, SCHEDULER_NAME, gpus=gpus, milli=milli))
        kube.create("pods", _pod("other", "default-scheduler", gpus=1))
        deadline = time.monotonic() + 30
        while binder.bound + binder.failed < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        binder.stop()
    nodes = {n: (kube.get("pods", n) or {}).get("spec", {}).get("nodeName") for n in
             ("before", "whole", "frac", "too-big", "other")}
    assert binder.failed == 0 and binder.bound == 3
    assert nodes["before"] and nodes["whole"] and nodes["frac"]
    assert nodes["too-big"] is None  # 4 GPUs by count, 4 taken: nothing fits, it stays pending
    assert nodes["other"] is None  # another scheduler's pod is not touched
    assert binder.free == {"c-node-0": 0, "c-node-1": 0}


def test_the_dra_ceiling_counts_a_pod_whose_claim_is_not_there_as_failed_and_binds_nothing():
    from types import SimpleNamespace

    from gpuaware.bench.kube_ceiling import DraCeilingBinder
    from gpuaware.contract import dra

    lister = SimpleNamespace(list_pod_for_all_namespaces=None, list_resource_claim_for_all_namespaces=None)
    api = SimpleNamespace(core=lister, resource=lister)
    sl = dra.resource_slice("d-node", [dra.gpu_device(0, uuid="GPU-0", product_name="NVIDIA H100",
                                                      memory_bytes=80 * 2**30)])
    binder = DraCeilingBinder(api, [sl], workers=1)  # type: ignore[arg-type]
    try:
        pod = _pod("p", SCHEDULER_NAME)
        pod["metadata"].update(uid="u", namespace="default")
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "missing"}]
        binder._on_event("ADDED", pod)
        assert binder.failed == 1 and binder.bound == 0 and binder.free == {"d-node": 1}
    finally:
        binder._pool.shutdown()
