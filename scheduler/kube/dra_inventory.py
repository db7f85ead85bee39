"""The GPUs that ResourceSlices publish, and which of them ResourceClaims hold (resource.k8s.io/v1).

Slices of NVIDIA's driver (``gpu.nvidia.com``) describe each node's GPUs as devices named
``gpu-<minor>`` (attribute ``type: gpu``) and its MIG partitions as ``gpu-<minor>-mig-...``
(``type: mig``, ``parentUUID``). A node's whole-GPU devices, in the order of their minor numbers,
are the node's GPU slots in the core's model (``slot``); a MIG device lives on its parent's slot.
Only the newest generation of a pool counts (a driver replaces a pool by bumping it).

The claims' ``status.allocation`` is the source of truth for which devices are taken: the cache
charges every allocated claim (``ClusterCache``), so a restarted scheduler hands out no device twice.
Devices with a ``NoSchedule`` or ``NoExecute`` taint take no new claims.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from scheduler.kube.dra_cel import DeviceFacts
from scheduler.kube.objects import PodSpecError, quantity, short_model

log = logging.getLogger(__name__)

NVIDIA_DRIVER = "gpu.nvidia.com"
# Where an NVLink island of a node's GPUs is published (NVIDIA's driver publishes none for the GPUs of one
# node; gpuaware's publisher does, under its own domain).
ISLAND_ATTRIBUTE = "gpu.gpuaware.io/nvlinkIsland"
MIG_SLICE_MILLI = 143  # one of seven compute slices (scheduler.core.cluster.MIG_SLICE_MILLI)
_MIG_PROFILE = re.compile(r"^(\d+)g\.")
_MINOR = re.compile(r"(\d+)")


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str
    facts: DeviceFacts
    kind: str  # "gpu", "mig", or another type (not a GPU slot: claims for it are left to kube-scheduler)
    uuid: str
    parent_uuid: str
    tainted: bool  # NoSchedule/NoExecute: no new allocation

    @property
    def ref(self) -> tuple[str, str, str]:
        return self.driver, self.pool, self.name

    @property
    def milli(self) -> int:
        """The compute a device takes of its GPU slot: all of it, or the MIG profile's slices."""
        if self.kind != "mig":
            return 1000
        m = _MIG_PROFILE.match(str(self.facts.attributes.get(f"{self.driver}/profile", "")))
        return min(1000, int(m.group(1)) * MIG_SLICE_MILLI) if m else 1000

    @property
    def memory_mib(self) -> int:
        return int(self.facts.capacity.get(f"{self.driver}/memory", 0) // 2**20)

    @property
    def product(self) -> str:
        return str(self.facts.attributes.get(f"{self.driver}/productName", ""))


class SliceError(PodSpecError):
    """A ResourceSlice gpuaware cannot read; its devices are left out (named, with the field)."""


def _value(attr: Any, where: str) -> Any:
    if not isinstance(attr, dict) or len(attr) != 1:
        raise SliceError(f"{where}: must have exactly one of string, int, bool, version")
    kind, value = next(iter(attr.items()))
    if kind not in ("string", "int", "bool", "version"):
        raise SliceError(f"{where}: unknown value type {kind!r}")
    return value


def devices_of(obj: dict[str, Any]) -> tuple[str, str, int, list[Device]]:
    """(node, pool, generation, devices) of a ResourceSlice; ``SliceError`` naming the field otherwise."""
    name = (obj.get("metadata") or {}).get("name", "?")
    spec = obj.get("spec") or {}
    driver, node = spec.get("driver"), spec.get("nodeName")
    pool = spec.get("pool") or {}
    if not isinstance(driver, str) or not driver:
        raise SliceError(f"ResourceSlice {name}: spec.driver is missing")
    if not isinstance(pool.get("name"), str):
        raise SliceError(f"ResourceSlice {name}: spec.pool.name is missing")
    if not isinstance(node, str) or not node:
        return "", pool["name"], 0, []  # not node-local (allNodes / nodeSelector): no GPU slot of a node
    out = []
    for i, dev in enumerate(spec.get("devices") or []):
        where = f"ResourceSlice {name}: spec.devices[{i}]"
        if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
            raise SliceError(f"{where}.name is missing")
        attrs = {}
        for key, attr in (dev.get("attributes") or {}).items():
            attrs[key if "/" in key else f"{driver}/{key}"] = _value(attr, f"{where}.attributes[{key}]")
        caps = {}
        for key, cap in (dev.get("capacity") or {}).items():
            raw = (cap or {}).get("value") if isinstance(cap, dict) else None
            caps[key if "/" in key else f"{driver}/{key}"] = quantity(raw, f"{where}.capacity[{key}].value")
        taints = dev.get("taints") or []
        tainted = any(isinstance(t, dict) and t.get("effect") in ("NoSchedule", "NoExecute") for t in taints)
        kind = str(attrs.get(f"{driver}/type", "gpu" if driver == NVIDIA_DRIVER else ""))
        out.append(Device(driver, pool["name"], dev["name"], node, DeviceFacts(driver, attrs, caps), kind,
                          str(attrs.get(f"{driver}/uuid", "")), str(attrs.get(f"{driver}/parentUUID", "")),
                          tainted))
    return node, pool["name"], int(pool.get("generation") or 0), out


def _minor_order(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in _MINOR.split(name))


@dataclass
class NodeGpus:
    """One node's GPUs as slices publish them."""

    gpus: list[Device]  # whole GPUs, slot order
    migs: list[Device]
    slot_of: dict[tuple[str, str, str], int] = field(default_factory=dict)  # device ref -> slot

    @property
    def model(self) -> str:
        return short_model(self.gpus[0].product) if self.gpus else "none"

    @property
    def memory_mib(self) -> int:
        return self.gpus[0].memory_mib if self.gpus else 0

    def islands(self) -> list[int] | None:
        values = [g.facts.attributes.get(ISLAND_ATTRIBUTE) for g in self.gpus]
        if all(v is None for v in values):
            return None
        ids: dict[Any, int] = {}
        return [ids.setdefault(v, len(ids)) for v in values]

    def mig_mode(self) -> list[bool] | None:
        parents = {m.parent_uuid for m in self.migs}
        return [g.uuid in parents for g in self.gpus] if parents else None


def node_gpus(devices: list[Device]) -> NodeGpus:
    gpus = sorted((d for d in devices if d.kind == "gpu"), key=lambda d: _minor_order(d.name))
    by_uuid = {g.uuid: i for i, g in enumerate(gpus) if g.uuid}
    migs = [d for d in devices if d.kind == "mig" and d.parent_uuid in by_uuid]
    ng = NodeGpus(gpus, migs)
    ng.slot_of = {g.ref: i for i, g in enumerate(gpus)} | {m.ref: by_uuid[m.parent_uuid] for m in migs}
    return ng


class DraInventory:
    """Slices by name; the devices of each node, rebuilt for a node when one of its slices changes."""

    def __init__(self) -> None:
        self.slices: dict[str, tuple[str, str, int, list[Device]]] = {}
        self.nodes: dict[str, NodeGpus] = {}
        self.devices: dict[tuple[str, str, str], Device] = {}

    def sync(self, items: list[dict[str, Any]]) -> set[str]:
        """All slices anew; the nodes whose GPUs may have changed."""
        before = set(self.nodes)
        self.slices.clear()
        for obj in items:
            self._read(obj)
        touched = {v[0] for v in self.slices.values()} | before
        for node in touched:
            self._rebuild(node)
        return touched

    def event(self, kind: str, obj: dict[str, Any]) -> set[str]:
        name = obj["metadata"]["name"]
        old = self.slices.pop(name, None)
        if kind != "DELETED":
            self._read(obj)
        touched = {v[0] for v in (old, self.slices.get(name)) if v is not None and v[0]}
        for node in touched:
            self._rebuild(node)
        return touched

    def _read(self, obj: dict[str, Any]) -> None:
        try:
            self.slices[obj["metadata"]["name"]] = devices_of(obj)
        except PodSpecError as exc:
            log.error("%s; its devices are left out", exc)

    def _rebuild(self, node: str) -> None:
        mine = [s for s in self.slices.values() if s[0] == node]
        newest: dict[str, int] = {}
        for _, pool, gen, _ in mine:
            newest[pool] = max(newest.get(pool, gen), gen)
        for ref in [r for r, d in self.devices.items() if d.node == node]:
            del self.devices[ref]
        devices = [d for _, pool, gen, devs in mine if gen == newest[pool] for d in devs]
        for d in devices:
            self.devices[d.ref] = d
        ng = node_gpus(devices)
        if ng.gpus:
            self.nodes[node] = ng
        else:
            self.nodes.pop(node, None)
