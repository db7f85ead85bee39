"""What the informers saw of DRA: slices (``DraInventory``), ResourceClaims and DeviceClasses.

Which devices are taken is read from the claims (``status.allocation``), never remembered: after a
restart the same claims say the same. ``ClusterCache`` charges them to the GPU slots of the core's
model (through the pods they are reserved for, or as a hold of their own).
"""

from __future__ import annotations

from typing import Any

from gpuaware.scheduler.kube.dra.claims import allocated, allocated_refs, reserved_for
from gpuaware.scheduler.kube.dra.inventory import Device, DraInventory

Ref = tuple[str, str, str]  # (driver, pool, device)


def claim_key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


class _Taken:
    """The devices allocated or in flight, asked one at a time (no copy of thousands of claims per placement)."""

    def __init__(self, state: DraState):
        self.state = state

    def __contains__(self, ref: object) -> bool:
        s = self.state
        return ref in s.taken_by or ref in s.in_flight or bool(s.shares.get(ref)) or bool(s.shares_in_flight.get(ref))


class DraState:
    def __init__(self) -> None:
        self.inventory = DraInventory()
        self.claims: dict[str, dict[str, Any]] = {}
        self.classes: dict[str, dict[str, Any]] = {}
        self.taken_by: dict[Ref, str] = {}  # device -> claim key, from the claims' allocations (whole devices)
        self.in_flight: dict[Ref, str] = {}  # device -> pod key: picked by us, claim status not seen yet
        # Shares of devices that allow multiple allocations: device -> {claim key: bytes of memory consumed}, from
        # the claims' consumedCapacity; and the shares picked by us whose claim status is not seen yet
        # (device -> {pod key: (claim key, bytes)}).
        self.shares: dict[Ref, dict[str, int]] = {}
        self.shares_in_flight: dict[Ref, dict[str, tuple[str, int]]] = {}

    # ------------------------------------------------------------------ claims
    def sync_claims(self, items: list[dict[str, Any]]) -> None:
        self.claims = {claim_key(c): c for c in items}
        self.taken_by, self.shares = {}, {}
        for k, c in self.claims.items():
            self._charge(k, c)

    def _charge(self, key: str, claim: dict[str, Any]) -> None:
        for ref, used in allocated(claim):
            if used:
                self.shares.setdefault(ref, {})[key] = used
                flying = self.shares_in_flight.get(ref, {})
                for pod in [p for p, (c, _) in flying.items() if c == key]:
                    del flying[pod]
            else:
                self.taken_by[ref] = key
                self.in_flight.pop(ref, None)

    def claim_event(self, kind: str, obj: dict[str, Any]) -> str:
        key = claim_key(obj)
        old = self.claims.pop(key, None)
        for ref in allocated_refs(old or {"metadata": obj["metadata"]}):
            if self.taken_by.get(ref) == key:
                del self.taken_by[ref]
            if key in self.shares.get(ref, {}):
                del self.shares[ref][key]
        if kind != "DELETED":
            self.claims[key] = obj
            self._charge(key, obj)
        return key

    def share_fits(self, device: Device, want: int) -> bool:
        """Whether ``want`` bytes of ``device``'s memory are free beside the shares the claims consume and ours
        in flight (a device taken whole has none free)."""
        ref = device.ref
        if ref in self.taken_by or ref in self.in_flight:
            return False
        used = sum(self.shares.get(ref, {}).values()) + sum(b for _, b in self.shares_in_flight.get(ref, {}).values())
        return used + want <= device.memory_bytes

    def fly_share(self, pod: str, claim: str, device: Device, want: int) -> None:
        self.shares_in_flight.setdefault(device.ref, {})[pod] = (claim, want)

    def land(self, pod: str) -> None:
        """A placement of ``pod`` withdrawn: its devices and shares are no longer in flight."""
        for ref in [r for r, k in self.in_flight.items() if k == pod]:
            del self.in_flight[ref]
        for flying in self.shares_in_flight.values():
            flying.pop(pod, None)

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

    def devices_of_claims(self, keys: list[str]) -> list[tuple[Device, int]]:
        """The known devices allocated to these claims, each with the compute it takes of its GPU slot (a share:
        its fraction of the memory); a device of a slice gone is left out."""
        out = []
        for k in keys:
            for ref, used in allocated(self.claims.get(k) or {"metadata": {}}):
                d = self.inventory.devices.get(ref)
                if d is not None:
                    out.append((d, d.share_milli(used) if used else d.milli))
        return out

    def holders(self, key: str) -> list[str]:
        return reserved_for(self.claims[key]) if key in self.claims else []
