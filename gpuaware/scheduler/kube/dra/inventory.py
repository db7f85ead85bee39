"""The GPUs that ResourceSlices publish, and which of them ResourceClaims hold (resource.k8s.io/v1).

Slices of NVIDIA's driver (``gpu.nvidia.com``) describe each node's GPUs as devices named
``gpu-<minor>`` (attribute ``type: gpu``) and its MIG partitions as ``gpu-<minor>-mig-...``
(``type: mig``, ``parentUUID``). A node's whole-GPU devices, in the order of their minor numbers,
are the node's GPU slots in the core's model (``slot``); a MIG device lives on its parent's slot.
Only the newest generation of a pool counts (a driver replaces a pool by bumping it).

The claims' ``status.allocation`` is the source of truth for which devices are taken: the cache
charges every allocated claim (``ClusterCache``), so a restarted scheduler hands out no device twice.
Devices with a ``NoSchedule`` or ``NoExecute`` taint take no new claims: a taint in the slice, or one a
DeviceTaintRule (``resource.k8s.io/v1beta2``, where served) puts on the device.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpuaware.contract import dra
from gpuaware.scheduler.kube.dra.cel import DeviceFacts
from gpuaware.scheduler.kube.objects import short_model

T = TypeVar("T")
log = logging.getLogger(__name__)

MIG_SLICE_MILLI = 143  # one of seven compute slices (gpuaware.scheduler.core.cluster.MIG_SLICE_MILLI)
_MIG_PROFILE = re.compile(r"^(\d+)g\.")
_MINOR = re.compile(r"(\d+)")


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str
    facts: DeviceFacts  # qualified attribute and capacity names, as selectors read them
    kind: str  # "gpu", "mig", or another type (not a GPU slot: claims for it are left to kube-scheduler)
    uuid: str
    parent_uuid: str
    profile: str = ""
    consumes: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()  # (counter set, ((counter, amount), ...))
    shareable: bool = False  # allowMultipleAllocations: claims may take memory shares of it
    # The NoSchedule/NoExecute taints behind ``tainted`` (the slice's and DeviceTaintRules'): a request
    # tolerating all of them may have the device. A pool being republished (``incomplete``) tolerates nothing.
    taints: tuple[dra.Taint, ...] = ()
    incomplete: bool = False

    @property
    def tainted(self) -> bool:
        """No new allocation (a NoSchedule/NoExecute taint, or its pool being republished) but by toleration."""
        return self.incomplete or bool(self.taints)

    def tolerated_by(self, tolerations: tuple[dra.Toleration, ...]) -> bool:
        """A request with ``tolerations`` may have this device as far as taints go."""
        return not self.tainted or (not self.incomplete and bool(tolerations)
                                    and dra.tolerated(tolerations, self.taints))

    @property
    def memory_bytes(self) -> int:
        return int(self.facts.capacity.get(f"{self.driver}/{dra.CAP_MEMORY}", 0))

    def share_milli(self, used_bytes: int) -> int:
        """The compute a memory share takes of the GPU slot in the core's model: its fraction of the memory,
        rounded up (so the model never holds less than the claims do)."""
        mem = self.memory_bytes
        return 1000 if mem <= 0 else min(1000, max(1, -(-used_bytes * 1000 // mem)))

    @property
    def ref(self) -> tuple[str, str, str]:
        return self.driver, self.pool, self.name

    @property
    def milli(self) -> int:
        """The compute a device takes of its GPU slot: all of it, or the MIG profile's slices."""
        if self.kind != "mig":
            return 1000
        m = _MIG_PROFILE.match(self.profile)
        return min(1000, int(m.group(1)) * MIG_SLICE_MILLI) if m else 1000

    @property
    def memory_mib(self) -> int:
        return int(self.facts.capacity.get(f"{self.driver}/{dra.CAP_MEMORY}", 0) // 2**20)

    @property
    def product(self) -> str:
        return str(self.facts.attributes.get(f"{self.driver}/{dra.ATTR_PRODUCT_NAME}", ""))


def _qualified(values: Mapping[str, Any], driver: str) -> dict[str, Any]:
    return {k if "/" in k else f"{driver}/{k}": v for k, v in values.items()}


def _ruled(rule: dra.TaintRuleView, driver: str, pool: str, name: str) -> bool:
    return all(want is None or want == have for want, have in ((rule.driver, driver), (rule.pool, pool),
                                                                (rule.device, name)))


def device_of(driver: str, pool: str, node: str, d: dra.DeviceView, incomplete: bool = False,
              rules: Mapping[str, dra.TaintRuleView] | None = None) -> Device:
    facts = DeviceFacts(driver, _qualified(d.attributes, driver),
                        {k: float(v) for k, v in _qualified(d.capacity, driver).items()})
    consumes = tuple((cs, tuple(sorted(counters.items()))) for cs, counters in sorted(d.consumes_counters.items()))
    taints = tuple(t for t in (*d.taints, *(r.taint for r in (rules or {}).values() if _ruled(r, driver, pool, d.name)))
                   if t.effect in ("NoSchedule", "NoExecute"))
    return Device(driver, pool, d.name, node, facts, d.type, d.uuid or "", d.parent_uuid or "",
                  d.profile or "", consumes, d.shareable, taints, incomplete)


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
        values = [g.facts.attributes.get(dra.ATTR_NVLINK_ISLAND) for g in self.gpus]
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
    """Slices by name; the devices of each node (and the pools' shared counters), rebuilt for a node when one of
    its slices changes."""

    def __init__(self) -> None:
        self.slices: dict[str, dra.SliceView] = {}
        self.nodes: dict[str, NodeGpus] = {}
        self.devices: dict[tuple[str, str, str], Device] = {}
        self.counters: dict[tuple[str, str, str], dict[str, int]] = {}  # (driver, pool, counter set) -> amounts
        self.rules: dict[str, dra.TaintRuleView] = {}  # DeviceTaintRules by name
        self._by_node: dict[str, set[str]] = {}  # node -> its slices' names (a node is rebuilt alone)
        self._node_keys: dict[str, tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]] = {}
        # What a set of requests matches over all devices (gpuaware.scheduler.kube.dra.claims), until the devices
        # change:
        # pods of one shape repeat it, and a cluster has thousands of devices.
        self.matches: dict[Any, Any] = {}

    def sync(self, items: list[dict[str, Any]]) -> set[str]:
        """All slices anew; the nodes whose GPUs may have changed."""
        before = set(self.nodes) | set(self._node_keys)
        self.slices.clear()
        self._by_node.clear()
        for obj in items:
            self._read(obj)
        touched = {v.node for v in self.slices.values() if v.node} | before
        for node in touched:
            self._rebuild(node)
        return touched

    def event(self, kind: str, obj: dict[str, Any]) -> set[str]:
        name = (obj.get("metadata") or {}).get("name", "")
        old = self.slices.pop(name, None)
        if old is not None and old.node:
            self._by_node.get(old.node, set()).discard(name)
        if kind != "DELETED":
            self._read(obj)
        touched = {v.node for v in (old, self.slices.get(name)) if v is not None and v.node}
        for node in touched:
            self._rebuild(node)
        return touched

    def sync_rules(self, items: list[dict[str, Any]]) -> set[str]:
        """All DeviceTaintRules anew; the nodes rebuilt (all: a rule may name any device)."""
        self.rules = {}
        for obj in items:
            self._read_rule(obj)
        return self._rebuild_all()

    def rule_event(self, kind: str, obj: dict[str, Any]) -> set[str]:
        self.rules.pop((obj.get("metadata") or {}).get("name", ""), None)
        if kind != "DELETED":
            self._read_rule(obj)
        return self._rebuild_all()

    def _read_rule(self, obj: dict[str, Any]) -> None:
        if (rule := _parsed("DeviceTaintRule", dra.parse_taint_rule, obj)) is not None:
            self.rules[rule.name] = rule

    def _rebuild_all(self) -> set[str]:
        nodes = set(self._by_node)
        for node in nodes:
            self._rebuild(node)
        return nodes

    def _read(self, obj: dict[str, Any]) -> None:
        if (view := _parsed("ResourceSlice", dra.parse_slice, obj)) is None:
            return
        self.slices[view.name] = view
        if view.node:
            self._by_node.setdefault(view.node, set()).add(view.name)

    def _rebuild(self, node: str) -> None:
        self.matches.clear()
        mine = [self.slices[n] for n in sorted(self._by_node.get(node, ()))]
        refs, sets = self._node_keys.pop(node, ([], []))
        for ref in refs:
            self.devices.pop(ref, None)
        for key in sets:
            self.counters.pop(key, None)
        # A pool being republished (fewer slices of its newest generation than it announces) keeps its devices
        # in the model but hands none out, as kube-scheduler's allocator does.
        partial = dra.incomplete_pools(mine)
        devices = [device_of(driver, pool, node, d, (driver, pool) in partial, self.rules)
                   for (driver, pool), views in dra.pool_devices(mine).items() for d in views]
        newest: dict[tuple[str, str], int] = {}
        for s in mine:
            newest[(s.driver, s.pool)] = max(newest.get((s.driver, s.pool), s.generation), s.generation)
        sets = []
        for s in mine:
            if s.generation == newest[(s.driver, s.pool)]:
                for cs, amounts in s.shared_counters.items():
                    self.counters[(s.driver, s.pool, cs)] = dict(amounts)
                    sets.append((s.driver, s.pool, cs))
        for d in devices:
            self.devices[d.ref] = d
        self._node_keys[node] = ([d.ref for d in devices], sets)
        ng = node_gpus(devices)
        if ng.gpus:
            self.nodes[node] = ng
        else:
            self.nodes.pop(node, None)

    def fits_counters(self, device: Device, taken: Container[tuple[str, str, str]]) -> bool:
        """Whether ``device`` still fits its pool's shared counters beside the devices ``taken`` (partitionable
        devices: a GPU and its MIG partitions, or two overlapping partitions, exclude each other)."""
        for cs, wants in device.consumes:
            total = self.counters.get((device.driver, device.pool, cs))
            if total is None:
                continue  # the counters' slice is not seen (yet): the slot's compute still guards the GPU
            used: dict[str, int] = {}
            ng = self.nodes.get(device.node)
            for other in (ng.gpus + ng.migs) if ng is not None else ():
                if other.ref not in taken or (other.driver, other.pool) != (device.driver, device.pool):
                    continue
                for ocs, amounts in other.consumes:
                    if ocs == cs:
                        for c, a in amounts:
                            used[c] = used.get(c, 0) + a
            if any(used.get(c, 0) + a > total.get(c, 0) for c, a in wants):
                return False
        return True


def _parsed(kind: str, parse: Callable[[dict[str, Any]], T], obj: dict[str, Any]) -> T | None:
    """``parse(obj)``, or None with the object's name and the reason logged: one bad object never blinds the rest."""
    try:
        return parse(obj)
    except dra.SliceInvalid as exc:
        name = (obj.get("metadata") or {}).get("name", "?") if isinstance(obj, dict) else "?"
        log.error("%s %s is left out: %s", kind, name, exc)
        return None
