"""A critical GPU's DRA devices tainted, so no new ResourceClaim gets them; the taint lifted when it returns.

The taint is a ``DeviceTaintRule`` (``resource.k8s.io/v1beta2``) per device, not ``spec.devices[].taints``
on the slice: the slice belongs to its publisher (NVIDIA's driver on a real node), which rewrites it
whole and would drop a taint written by anyone else. kube-scheduler and gpuaware's allocator both keep
new claims off a device with a ``NoSchedule`` taint; pods already on it are moved by the health chain
(checkpoint, then evict: ``gpuaware.scheduler.kube.quarantine``), not by a ``NoExecute`` eviction. Every device of
the GPU is tainted: the whole GPU and its MIG partitions (same minor, or same ``gpu.gpuaware.io/index``).

Kubernetes 1.36 serves DeviceTaintRule only with the ``DRADeviceTaintRules`` feature gate (beta, off
by default) and ``--runtime-config=resource.k8s.io/v1beta2=true`` on the apiserver (docs/dra.md); where
it is not served, tainting is switched off after one warning and the node-level cordon still holds.

Rules are found again by label (``app.kubernetes.io/managed-by=gpuaware``) and annotations naming the
node and GPU, so a restarted scheduler lifts the taints a previous one set.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Coroutine
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuaware.contract import dra
from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS
from gpuaware.scheduler.kube.calls import ApiCalls

log = logging.getLogger(__name__)

GROUP, RULES_VERSION, RULES = "resource.k8s.io", "v1beta2", "devicetaintrules"
SLICES_VERSION, SLICES = "v1", "resourceslices"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpuaware")
ANN_NODE = "gpuaware.io/node"
ANN_GPU = "gpuaware.io/gpu"
REQUEST_TIMEOUT_S = 10.0


def rule_name(driver: str, pool: str, device: str) -> str:
    digest = hashlib.sha256(f"{driver}/{pool}/{device}".encode()).hexdigest()[:12]
    return f"gpuaware-{device}-{digest}"


def gpu_devices(slices: list[dict[str, Any]], gpu: int) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of GPU ``gpu`` in a node's slices: devices whose ``gpu.gpuaware.io/index`` is
    ``gpu``, or (NVIDIA's slices have no index) whose minor is. A slice that does not parse is skipped."""
    views = []
    for obj in slices:
        try:
            views.append(dra.parse_slice(obj))
        except dra.SliceInvalid as exc:
            log.warning("ResourceSlice %s skipped: %s", obj.get("metadata", {}).get("name"), exc)
    out = []
    for (driver, pool), devices in dra.pool_devices(views).items():
        for d in devices:
            if (d.index if d.index is not None else d.minor) == gpu:
                out.append((driver, pool, d.name))
    return out


class DeviceTaints:
    """Taints and lifts through the API; ``taint``/``lift`` block (run them on ``ApiCalls``' threads)."""

    def __init__(self, api_client: client.ApiClient, driver: str = dra.DRIVER,
                 request_timeout_s: float = REQUEST_TIMEOUT_S):
        self.custom = client.CustomObjectsApi(api_client)
        self.driver = driver
        self._raw = {"_preload_content": False, "_request_timeout": request_timeout_s}
        self.served = True  # False once the apiserver answered that it serves no DeviceTaintRule
        self.tainted: set[tuple[str, int]] | None = None  # (node, GPU) with rules; None: not read yet
        self._loading = False  # the first read of the rules under way

    def _rules(self) -> list[dict[str, Any]]:
        resp = self.custom.list_cluster_custom_object(GROUP, RULES_VERSION, RULES,
                                                      label_selector=f"{MANAGED_BY[0]}={MANAGED_BY[1]}", **self._raw)
        return json.loads(resp.data).get("items") or []

    def load(self) -> set[tuple[str, int]]:
        """(node, GPU) pairs that have gpuaware's rules now."""
        found = set()
        for rule in self._rules():
            ann = rule["metadata"].get("annotations") or {}
            if ANN_NODE in ann and str(ann.get(ANN_GPU, "")).isdigit():
                found.add((ann[ANN_NODE], int(ann[ANN_GPU])))
        self.tainted = found
        return found

    def taint(self, node: str, gpu: int, reason: str) -> int:
        """One NoSchedule rule per device of the GPU; how many were created (an existing one is kept)."""
        resp = self.custom.list_cluster_custom_object(GROUP, SLICES_VERSION, SLICES,
                                                      field_selector=f"spec.nodeName={node},spec.driver={self.driver}",
                                                      **self._raw)
        created = 0
        for driver, pool, device in gpu_devices(json.loads(resp.data).get("items") or [], gpu):
            body = {
                "apiVersion": f"{GROUP}/{RULES_VERSION}", "kind": "DeviceTaintRule",
                "metadata": {"name": rule_name(driver, pool, device), "labels": dict([MANAGED_BY]),
                             "annotations": {ANN_NODE: node, ANN_GPU: str(gpu)}},
                "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": device},
                         "taint": dra.device_taint(dra.TAINT_UNHEALTHY, reason[:63], "NoSchedule")},
            }
            try:
                self.custom.create_cluster_custom_object(GROUP, RULES_VERSION, RULES, body, **self._raw)
                created += 1
            except ApiException as exc:
                if exc.status != 409:  # already tainted: what was wanted
                    raise
        if self.tainted is not None:
            self.tainted.add((node, gpu))
        return created

    def lift(self, node: str, gpu: int) -> int:
        """Delete gpuaware's rules of the GPU; how many there were."""
        lifted = 0
        for rule in self._rules():
            ann = rule["metadata"].get("annotations") or {}
            if ann.get(ANN_NODE) == node and ann.get(ANN_GPU) == str(gpu):
                try:
                    self.custom.delete_cluster_custom_object(GROUP, RULES_VERSION, RULES, rule["metadata"]["name"],
                                                             **self._raw)
                    lifted += 1
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        if self.tainted is not None:
            self.tainted.discard((node, gpu))
        return lifted

    # From the scheduler's event loop: failures logged and counted, never raised into the health chain.
    async def taint_async(self, calls: ApiCalls, node: str, gpu: int, reason: str) -> None:
        await self._guarded(calls, "create-devicetaintrule", self.taint, node, gpu, reason)

    def lift_if_tainted(self, calls: ApiCalls, node: str, gpu: int) -> Coroutine[Any, Any, None] | None:
        """For a GPU in service: the lift to run when it may hold gpuaware's taint, else None (no call).

        Until the rules have been read once (after a start) the first GPU in service reads them; the others
        get None meanwhile and are asked again on the next state update, when the answer is known."""
        if not self.served:
            return None
        if self.tainted is None:
            if self._loading:
                return None
            self._loading = True
            return self._load_then_lift(calls, node, gpu)
        return self._lift(calls, node, gpu) if (node, gpu) in self.tainted else None

    async def _load_then_lift(self, calls: ApiCalls, node: str, gpu: int) -> None:
        try:
            await self._guarded(calls, "list-devicetaintrules", self.load)
        finally:
            self._loading = False
        if self.tainted is not None and (node, gpu) in self.tainted:
            await self._lift(calls, node, gpu)

    async def _lift(self, calls: ApiCalls, node: str, gpu: int) -> None:
        await self._guarded(calls, "delete-devicetaintrule", self.lift, node, gpu)

    async def _guarded(self, calls: ApiCalls, verb: str, fn: Any, *args: Any) -> None:
        if not self.served:
            return
        try:
            await calls.call(fn, *args)
        except ApiException as exc:
            code, _, message = calls.failed(verb, exc)
            if code == 404:  # the API not served (a missing object's 404 is caught where it can happen)
                self.served = False
                log.warning("the apiserver serves no %s/%s DeviceTaintRule (%s): GPU health is not written as "
                            "device taints; enable the DRADeviceTaintRules feature gate and runtime-config "
                            "resource.k8s.io/v1beta2=true (docs/dra.md)", GROUP, RULES_VERSION, message)
        except TRANSPORT_ERRORS as exc:
            calls.stats.api_errors[(verb, 0)] += 1
            log.warning("%s for %s failed: %s", verb, args[:2], exc)
