"""DRA in `gpuaware up` on the real control plane: the simulated nodes' GPUs as ResourceSlices, and pods whose GPUs
are ResourceClaims that gpuaware allocates.

The agents publish their node's GPUs as the agent does with ``agent.resource_slices`` (the same code,
``gpuaware.agent.resource_slices``: NVIDIA-shaped devices of driver ``gpu.nvidia.com``, each slice owned by its
Node); the cluster has the shipped DeviceClasses (``RealCluster``); the scheduler watches slices, claims and
classes (``dra``), so the GPU slots of a node are its published devices. Beside the openb pods that ask for
``nvidia.com/gpu``, one pod per tenant names a ResourceClaim of one whole GPU (``DEMO_CLAIMS``); they run
until `up` ends, and ``kubectl get resourceclaims -A`` shows each allocated on a node's device and reserved
for its pod. The embedded fake API server gets none of this (it checks none of what the apiserver checks of
DRA objects).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from gpuaware.agent.core import AgentCore
from gpuaware.agent.resource_slices import publish_until_done
from gpuaware.contract import dra
from gpuaware.local.kube_cluster import RealCluster

REQUEST = "gpu"
DEMO_NAME = "dra-demo"
PUBLISH_RETRY_S = 1.0  # the control plane is local: a failed write is tried again soon


def demo_objects(namespaces: Sequence[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Per namespace: (a ResourceClaim of one whole GPU of class ``gpu.nvidia.com``, the pod naming it)."""
    out = []
    for ns in namespaces:
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": DEMO_NAME, "namespace": ns},
                 "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": {
                     "deviceClassName": dra.DEVICE_CLASS_GPU, "allocationMode": "ExactCount", "count": 1}}]}}}
        pod = {"metadata": {"name": DEMO_NAME, "namespace": ns, "annotations": {}, "labels": {}},
               "spec": {"schedulerName": "gpuaware",
                        "containers": [{"name": "main", "image": "registry.example.com/job:1.0",
                                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                      "claims": [{"name": REQUEST}]}}],
                        "resourceClaims": [{"name": REQUEST, "resourceClaimName": DEMO_NAME}]}}
        out.append((claim, pod))
    return out


@contextlib.asynccontextmanager
async def published(cluster: RealCluster, cores: Sequence[AgentCore]) -> AsyncIterator[None]:
    """The agents' GPUs published as ResourceSlices in the background (retried until written) for the block."""
    from kubernetes import config

    from gpuaware.plumbing.kube.resource_slices import SlicePublisher

    client = config.new_client_from_config(str(cluster.kubeconfig))
    publisher = SlicePublisher(client)
    stop = asyncio.Event()
    task = asyncio.create_task(publish_until_done(publisher, cores, stop, PUBLISH_RETRY_S))
    try:
        yield
    finally:
        stop.set()
        await task
        client.close()


def create_demo(cluster: RealCluster, namespaces: Sequence[str]) -> None:
    for claim, pod in demo_objects(namespaces):
        cluster.cp.apply(claim)
        cluster.create("pods", pod)


def summary(cluster: RealCluster) -> dict[str, Any]:
    """What the apiserver holds of DRA: the published slices and devices, the demo claims, those allocated and
    reserved for their pod, and the demo pods bound."""
    def items(kind: str) -> list[dict[str, Any]]:
        return json.loads(cluster.cp.kubectl("get", kind, "-A", "-o", "json").stdout)["items"]

    slices = items("resourceslices")
    claims = [c for c in items("resourceclaims") if c["metadata"]["name"] == DEMO_NAME]
    pods = [p for p in items("pods") if p["metadata"]["name"] == DEMO_NAME]
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")
                 and (c["status"].get("reservedFor") or [])]
    return {"resource_slices": len(slices), "devices": sum(len(s["spec"].get("devices") or []) for s in slices),
            "claims": len(claims), "claims_allocated": len(allocated),
            "claim_pods_bound": sum(1 for p in pods if p["spec"].get("nodeName"))}
