"""Publishing a node's GPUs as ResourceSlices (``resource.k8s.io/v1``), shaped as NVIDIA's DRA driver shapes them.

For nodes no NVIDIA DRA driver runs on: kwok nodes of the local stack and the bench, and, behind
``agent.resource_slices`` (off by default), the agent's own node. On a real GPU node NVIDIA's driver is
the publisher (its kubelet plugin also prepares the devices for the containers, which gpuaware does not);
gpuaware reads its slices (:func:`gpuaware.contract.dra.parse_slice`) and never writes them.

One pool per node (named after it). Its devices go in slices of at most 128 devices (64 when a device has
taints or consumes counters); the counter sets of GPUs with MIG partitions go in slices of their own, 8 a
slice (the apiserver refuses counters and devices in one slice, and more than 8 counter sets). Publishing
is idempotent: what is there already is compared with what should be, and nothing is written when they
match; otherwise the pool's generation goes up by one, every slice is written at the new generation and
the ones left over are deleted (readers take only a pool's newest generation into account, so a reader
in between sees the old pool or the new one, never a mix). Only slices labelled as gpuaware's are
touched, never another publisher's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuaware.contract import dra

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceslices"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpuaware")
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class NodeGpu:
    """One GPU of a node as the publisher needs it. ``minor`` (the device name's number) defaults to
    ``index``; ``partitions`` are its MIG placements, published as partitionable devices."""

    index: int
    uuid: str
    model: str
    memory_bytes: int
    minor: int | None = None
    nvlink_island: int | None = None
    architecture: str = ""
    cuda_compute_capability: str = "0.0"
    driver_version: str = "0.0"
    cuda_driver_version: str = "0.0"
    pci_bus_id: str | None = None
    partitions: tuple[dra.MigPartition, ...] = ()
    taints: tuple[dict[str, Any], ...] = field(default=())
    shareable: bool = False  # published with allowMultipleAllocations: claims take memory shares of it

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"index: {self.index} is negative")
        if not self.uuid:
            raise ValueError("uuid: required")
        if self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes: {self.memory_bytes} is not positive")

    @property
    def device_minor(self) -> int:
        return self.index if self.minor is None else self.minor


def node_devices(gpus: Sequence[NodeGpu]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(devices, shared counter sets) of a node's GPUs."""
    devices: list[dict[str, Any]] = []
    counters: list[dict[str, Any]] = []
    for g in sorted(gpus, key=lambda g: g.device_minor):
        common = {"product_name": g.model, "architecture": g.architecture,
                  "cuda_compute_capability": g.cuda_compute_capability, "driver_version": g.driver_version,
                  "cuda_driver_version": g.cuda_driver_version, "pci_bus_id": g.pci_bus_id,
                  "nvlink_island": g.nvlink_island, "index": g.index, "taints": g.taints}
        devices.append(dra.gpu_device(g.device_minor, uuid=g.uuid, memory_bytes=g.memory_bytes,
                                      partitions=g.partitions, shareable=g.shareable, **common))
        if g.partitions:
            counters.append(dra.gpu_counter_set(g.device_minor, g.memory_bytes, g.partitions))
            devices.extend(dra.mig_device(g.device_minor, p, parent_uuid=g.uuid, **common) for p in g.partitions)
    return devices, counters


def node_slices(node: str, gpus: Sequence[NodeGpu], generation: int, driver: str = dra.DRIVER,
                node_uid: str | None = None) -> list[dict[str, Any]]:
    """The slices of ``node``'s pool at ``generation`` (pure; what :meth:`SlicePublisher.publish` writes). With
    ``node_uid`` each is owned by the Node (as the kubelet plugins of DRA drivers, NVIDIA's included, publish
    them): the garbage collector deletes them with the node."""
    devices, counters = node_devices(gpus)
    per = dra.MAX_DEVICES_PER_SLICE
    if any(d.get("taints") or d.get("consumesCounters") for d in devices):
        per = dra.MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS
    chunks = [devices[i:i + per] for i in range(0, len(devices), per)]
    sets = dra.MAX_COUNTER_SETS_PER_SLICE
    counter_chunks = [counters[i:i + sets] for i in range(0, len(counters), sets)]
    count = len(chunks) + len(counter_chunks)
    labels = dict([MANAGED_BY])
    out = [dra.resource_slice(node, chunk, driver=driver, generation=generation, slice_count=count,
                              name=dra.slice_name(node, "gpus" if k == 0 else f"gpus-{k}"), labels=labels)
           for k, chunk in enumerate(chunks)]
    out += [dra.resource_slice(node, shared_counters=chunk, driver=driver, generation=generation, slice_count=count,
                               name=dra.slice_name(node, "counters" if k == 0 else f"counters-{k}"), labels=labels)
            for k, chunk in enumerate(counter_chunks)]
    if node_uid:
        for body in out:
            body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                                    "controller": True}]
    return out


@dataclass
class PublishResult:
    generation: int
    written: int = 0
    deleted: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.written or self.deleted)


def _content(obj: dict[str, Any]) -> str:
    """What a slice says, without what the apiserver adds (timeAdded on taints) or the generation."""
    spec = json.loads(json.dumps(obj.get("spec", {})))
    spec.get("pool", {}).pop("generation", None)
    for dev in spec.get("devices") or []:
        for taint in dev.get("taints") or []:
            taint.pop("timeAdded", None)
    owners = [o.get("uid") for o in obj["metadata"].get("ownerReferences") or []]
    return json.dumps({"name": obj["metadata"]["name"], "owners": owners, "spec": spec}, sort_keys=True)


class SlicePublisher:
    """Writes gpuaware's ResourceSlices of nodes through the API (each call returns once written)."""

    def __init__(self, api_client: client.ApiClient, driver: str = dra.DRIVER,
                 request_timeout_s: float = REQUEST_TIMEOUT_S):
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.driver = driver
        self._raw = {"_preload_content": False, "_request_timeout": request_timeout_s}

    def current(self, node: str) -> list[dict[str, Any]]:
        """gpuaware's slices of ``node`` for this driver, as stored."""
        resp = self.custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, field_selector=f"spec.nodeName={node},spec.driver={self.driver}",
            label_selector=f"{MANAGED_BY[0]}={MANAGED_BY[1]}", **self._raw)
        return json.loads(resp.data).get("items") or []

    def publish(self, node: str, gpus: Sequence[NodeGpu]) -> PublishResult:
        """Make ``node``'s pool hold ``gpus`` (none: the pool is withdrawn)."""
        existing = {s["metadata"]["name"]: s for s in self.current(node)}
        generation = max((s["spec"]["pool"].get("generation", 0) for s in existing.values()), default=0)
        if not gpus:
            return PublishResult(generation, deleted=self._delete(existing.values()))
        uid = self._node_uid(node)
        wanted = node_slices(node, gpus, generation, self.driver, uid)
        if existing and sorted(map(_content, wanted)) == sorted(map(_content, existing.values())) and all(
                s["spec"]["pool"].get("generation") == generation for s in existing.values()):
            return PublishResult(generation)
        generation += 1
        result = PublishResult(generation)
        for body in node_slices(node, gpus, generation, self.driver, uid):
            name = body["metadata"]["name"]
            old = existing.pop(name, None)
            if old is None:
                self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body, **self._raw)
            else:
                body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                self.custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, name, body, **self._raw)
            result.written += 1
        result.deleted = self._delete(existing.values())
        return result

    def _node_uid(self, node: str) -> str | None:
        """The Node's UID, to own its slices; None when there is no such Node (yet): the slices are then
        published without an owner (a garbage collector would delete a slice owned by a Node it cannot find)."""
        try:
            resp = self.core.read_node(node, **self._raw)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(resp.data)["metadata"]["uid"]

    def withdraw(self, node: str) -> int:
        """Delete gpuaware's slices of ``node``; how many there were."""
        return self.publish(node, ()).deleted

    def _delete(self, slices: Any) -> int:
        n = 0
        for s in list(slices):
            try:
                self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, s["metadata"]["name"], **self._raw)
                n += 1
            except ApiException as exc:
                if exc.status != 404:  # already gone: what was wanted
                    raise
        return n
