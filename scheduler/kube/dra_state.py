"""What the informers saw of DRA: slices (``DraInventory``), ResourceClaims and DeviceClasses.

Which devices are taken is read from the claims (``status.allocation``), never remembered: after a
restart the same claims say the same. ``ClusterCache`` charges them to the GPU slots of the core's
model (through the pods they are reserved for, or as a hold of their own).
"""

from __future__ import annotations

from typing import Any

from scheduler.kube.dra_claims import allocated_refs, reserved_for
from scheduler.kube.dra_inventory import Device, DraInventory

Ref = tuple[str, str, str]  # (driver, pool, device)


def claim_key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


class _Taken:
    """The devices allocated or in flight, asked one at a time (no copy of thousands of claims per placement)."""

    def __init__(self, state: DraState):
        self.state = state

    def __contains__(self, ref: object) -> bool:
        return ref in self.state.taken_by or ref in self.state.in_flight


class DraState:
    def __init__(self) -> None:
        self.inventory = DraInventory()
        self.claims: dict[str, dict[str, Any]] = {}
        self.classes: dict[str, dict[str, Any]] = {}
        self.taken_by: dict[Ref, str] = {}  # device -> claim key, from the claims' allocations
        self.in_flight: dict[Ref, str] = {}  # device -> pod key: picked by us, claim status not seen yet

    # ------------------------------------------------------------------ claims
    def sync_claims(self, items: list[dict[str, Any]]) -> None:
        self.claims = {claim_key(c): c for c in items}
        self.taken_by = {ref: k for k, c in self.claims.items() for ref in allocated_refs(c)}

    def claim_event(self, kind: str, obj: dict[str, Any]) -> str:
        key = claim_key(obj)
        old = self.claims.pop(key, None)
        for ref in allocated_refs(old or {"metadata": obj["metadata"]}):
            if self.taken_by.get(ref) == key:
                del self.taken_by[ref]
        if kind != "DELETED":
            self.claims[key] = obj
            for ref in allocated_refs(obj):
                self.taken_by[ref] = key
                self.in_flight.pop(ref, None)
        return key

    def sync_classes(self, items: list[dict[str, Any]]) -> None:
        self.classes = {c["metadata"]["name"]: c for c in items}

    def class_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.classes.pop(obj["metadata"]["name"], None)
        else:
            self.classes[obj["metadata"]["name"]] = obj

    # ------------------------------------------------------------------ reading
    def taken(self) -> _Taken:
        return _Taken(self)

    def devices_of_claims(self, keys: list[str]) -> list[Device]:
        """The known devices allocated to these claims (a device of a slice gone is left out)."""
        out = []
        for k in keys:
            for ref in allocated_refs(self.claims.get(k) or {"metadata": {}}):
                d = self.inventory.devices.get(ref)
                if d is not None:
                    out.append(d)
        return out

    def holders(self, key: str) -> list[str]:
        return reserved_for(self.claims[key]) if key in self.claims else []
