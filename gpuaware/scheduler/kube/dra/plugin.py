"""The DRA part of the live scheduler, and the state it owns (kube-scheduler keeps its DRA state inside its
DynamicResources plugin, not in its cache).

What the informers saw of slices, claims and classes is ``DraState``; beside it, per pod of ours: what its
claims ask for (``asks``), the devices picked for its placement in flight (``picks``), the node and devices
its claims name already (``resumes``, after a restart), the node its claims are in use on (``joins``) and
the claims it joins once placed (``shared``); which unbound pods name each claim (``users``); and which pod
each allocated claim's devices are charged to (``ClaimCharges``: the map and its inverse, kept together).
The core's model (``ClusterState``) is the cache's; the methods that change it are handed it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from gpuaware.contract.events import HealthBand
from gpuaware.scheduler.core.cluster import Allocation, ClusterState
from gpuaware.scheduler.kube import objects
from gpuaware.scheduler.kube.charging import clamp, clamp_gpus
from gpuaware.scheduler.kube.dra import claims as dra_claims
from gpuaware.scheduler.kube.dra.claims import DeviceRequest, DraAsk
from gpuaware.scheduler.kube.dra.inventory import Device
from gpuaware.scheduler.kube.dra.state import DraState
from gpuaware.scheduler.kube.objects import PodSpecError, PodWorkload

Picks = list[tuple[DeviceRequest, Device]]


def hold_id(claim: str) -> str:
    """The model's allocation id of an allocated claim charged to no pod."""
    return f"claim:{claim}"


class ClaimCharges:
    """Which pod each claim's devices are charged to, and the claims each pod is charged for. A claim shared by
    several pods is charged once, to its owner (the first pod charged for it); a claim allocated with no owner
    is a hold of its own. Both directions change together, here only."""

    def __init__(self) -> None:
        self._owner: dict[str, str] = {}  # claim -> pod
        self._claims: dict[str, list[str]] = {}  # pod -> claims

    def owner(self, claim: str) -> str | None:
        return self._owner.get(claim)

    def own(self, key: str, claims: Iterable[str]) -> list[str]:
        """Of ``claims``, those no other pod is charged for become ``key``'s; returns them."""
        self.disown(key)
        mine = [c for c in claims if self._owner.setdefault(c, key) == key]
        self._claims[key] = mine
        return mine

    def disown(self, key: str) -> list[str]:
        """``key`` is charged for none of its claims any more; returns those it was."""
        claims = self._claims.pop(key, [])
        for c in claims:
            if self._owner.get(c) == key:
                del self._owner[c]
        return claims

    def clear(self) -> None:
        self._owner.clear()
        self._claims.clear()

    @property
    def by_claim(self) -> Mapping[str, str]:
        return MappingProxyType(self._owner)

    @property
    def by_pod(self) -> Mapping[str, list[str]]:
        return MappingProxyType(self._claims)


class DraPlugin:
    def __init__(self) -> None:
        self.state = DraState()
        self.asks: dict[str, DraAsk] = {}
        self.picks: dict[str, Picks] = {}  # binding in flight
        self.resumes: dict[str, tuple[str, Picks]] = {}
        # Pods whose claims are all allocated already (shared): the node they go to, while pending; the claims
        # their UID joins (``reservedFor``) while their binding is in flight.
        self.joins: dict[str, str] = {}
        self.shared: dict[str, list[str]] = {}
        self.users: dict[str, set[str]] = {}  # claim -> unbound pods of ours naming it
        self.charges = ClaimCharges()
        # (node index, GPU) critical only because its device is tainted -> the band it has otherwise, lent to the
        # cycle of a pod whose claims tolerate the taint (``tolerated``); written by the cache's cordons.
        self.taint_bands: dict[tuple[int, int], HealthBand] = {}

    @property
    def claim_owner(self) -> Mapping[str, str]:
        return self.charges.by_claim

    @property
    def pod_claims(self) -> Mapping[str, list[str]]:
        return self.charges.by_pod

    # ------------------------------------------------------------------ reading pods
    @staticmethod
    def claims_of(pod: dict[str, Any]) -> list[str]:
        try:
            return dra_claims.claim_names(pod)
        except PodSpecError:
            return []

    def read(self, pod: dict[str, Any], pw: PodWorkload, queued: bool) -> PodWorkload:
        """A pod with claims as the core's workload (``pw``: as its spec and queue say); raises ``PodSpecError``.
        ``queued``: for the queue, so what its claims ask for (or where they send it) is kept for the pass."""
        if pw.workload.num_gpu:
            raise PodSpecError(f"both {objects.GPU_RESOURCE} and resourceClaims: ask for GPUs one way")
        key = objects.key(pod)
        if queued:
            self.forget_ask(key)
        resume = dra_claims.resumed(pod, self.state.claims, self.state.inventory)
        if resume is not None:  # its claims name a node already: it goes there (``resume``)
            if queued:
                self.resumes[key] = resume
            devices = [d for _, d in resume[1]]
            one_mig = len(devices) == 1 and devices[0].kind == "mig"
            return dataclasses.replace(pw, workload=dataclasses.replace(
                pw.workload, num_gpu=len(devices), gpu_milli=devices[0].milli if one_mig else 1000))
        shared = dra_claims.shared_node(pod, self.state.claims)
        if shared is not None:  # its claims are in use already: it goes where they are, with no device of its own
            if pw.workload.gang:
                raise dra_claims.UnsupportedClaim(f"gang {pw.workload.gang}: a member whose claims are allocated "
                                                  "already (shared) is not placed all-or-nothing with its gang")
            if queued:
                self.joins[key] = shared
            return dataclasses.replace(pw, workload=dataclasses.replace(pw.workload, num_gpu=0))
        ask = dra_claims.ask_of(pod, self.state.claims, self.state.classes, self.state.inventory)
        if queued:
            self.asks[key] = ask
        return self.asking(pw, ask)

    @staticmethod
    def asking(pw: PodWorkload, ask: DraAsk) -> PodWorkload:
        models = ask.models if not pw.workload.models else tuple(m for m in ask.models if m in pw.workload.models)
        return dataclasses.replace(pw, workload=dataclasses.replace(
            pw.workload, num_gpu=ask.num_gpu, gpu_milli=ask.gpu_milli, models=models or ("(none)",),
            needs_nvlink=pw.workload.needs_nvlink or ask.needs_island, memory_share=ask.kind == "share"))

    def forget_ask(self, key: str) -> None:
        """What the pod's claims asked for, or where they sent it, is read again (or the pod is gone or bound)."""
        self.asks.pop(key, None)
        self.resumes.pop(key, None)
        self.joins.pop(key, None)

    def use(self, key: str, pod: dict[str, Any]) -> None:
        """An unbound pod of ours entering the queue: it names its claims."""
        for claim in self.claims_of(pod):
            self.users.setdefault(claim, set()).add(key)

    def unuse(self, key: str, pod: dict[str, Any]) -> None:
        for claim in self.claims_of(pod):
            self.users.get(claim, set()).discard(key)

    def claimants(self, claim: str | None, waiting: Iterable[str]) -> list[str]:
        """The unbound pods to read again when ``claim`` (None: any claim, slice, rule or class) changed."""
        return list(waiting) if claim is None else list(self.users.get(claim, ()))

    def claimed_devices(self, pod: dict[str, Any], claims: list[str] | None = None) -> list[tuple[Device, int]]:
        """The GPUs, MIG partitions and GPU shares a bound pod's claims (``claims``: these of them) were allocated
        on its node, with the compute each takes of its slot (other devices are no GPU slot)."""
        ng = self.state.inventory.nodes.get(pod["spec"]["nodeName"])
        return [(d, m) for d, m in self.state.devices_of_claims(self.claims_of(pod) if claims is None else claims)
                if ng is not None and d.ref in ng.slot_of]

    # ------------------------------------------------------------------ the pass
    def claim_wait(self, key: str) -> str | None:
        """Why a pending pod waits: a new claim of it is being allocated for another pod of ours (in flight); it
        stays out of the pass, so that nothing is preempted for it, and joins the claim once it is written
        (``shared_node``). None: it does not."""
        ask = self.asks.get(key)
        for claim in ask.claims if ask is not None else ():
            owner = self.charges.owner(claim)
            if owner is not None and owner != key:
                return f"its claim {claim} is being allocated for {owner}; it goes where that puts it"
        return None

    def co_claimants(self, pending: Mapping[str, Any]) -> set[str]:
        """Pending pods naming a new claim another pending pod names too: one at a time, in arrival order, so
        that the first placed allocates it and the others then wait for it (``claim_wait``); if the first
        cannot go, the next may."""
        out: set[str] = set()
        for key, ask in self.asks.items():
            if key in pending and any(
                    sum(1 for u in self.users.get(c, ()) if u in pending and u in self.asks) > 1
                    for c in ask.claims):
                out.add(key)
        return out

    def stranded_claims(self, pod: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The claims of a pending pod that cannot go where they are allocated, if every one of them is reserved
        for nobody or for this pod alone (kube-scheduler's DRA PostFilter then deallocates them); else none: one
        in use by another pod keeps it waiting for that node."""
        if pod is None:
            return []
        uid = pod["metadata"].get("uid")
        claims = [self.state.claims[c] for c in self.claims_of(pod) if c in self.state.claims]
        allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
        if any({r.get("uid") for r in c["status"].get("reservedFor") or []} - {uid} for c in allocated):
            return []
        return allocated

    @contextlib.contextmanager
    def tolerated(self, ask: DraAsk | None, cluster: ClusterState) -> Iterator[None]:
        """While the core places one pod: the GPUs whose devices are critical only for a taint its claims
        tolerate at the band they would have untainted (the core's health Filter reads the band); critical
        again after. Devices are still picked by each request's own tolerations (``DeviceRequest.matches``)."""
        lent = []
        if ask is not None and ask.tolerating:
            for (i, g), band in self.taint_bands.items():
                ng = self.state.inventory.nodes.get(cluster.names[i])
                if ng is not None and g < len(ng.gpus) and ask.tolerates(ng.gpus[g]):
                    cluster.set_band(i, g, band)
                    lent.append((i, g))
        try:
            yield
        finally:
            for i, g in lent:
                cluster.set_band(i, g, HealthBand.CRITICAL)

    def pick_devices(self, key: str, alloc: Allocation, cluster: ClusterState) -> str | None:
        """Devices for a placement the core made for a pod with claims (in the model already): its GPUs, or
        others of the same node where the claims' constraints want; None when done, else why not (the
        placement is then released)."""
        ask = self.asks.get(key)
        node = cluster.names[alloc.node]
        ng = self.state.inventory.nodes.get(node)
        if (why := self.claim_wait(key)) is not None:  # placed this pass for another pod that shares it
            cluster.release(key)
            return why
        if ask is None or ng is None:
            cluster.release(key)
            return f"node {node} publishes no GPUs in ResourceSlices" if ng is None else "claims not read"
        if ask.kind == "admin":  # devices in use or not, none taken: nothing in flight, no GPU in the model
            got_admin = dra_claims.pick_admin(ask, ng)
            if isinstance(got_admin, str):
                cluster.release(key)
                return f"{node}: {got_admin}"
            self.picks[key] = got_admin
            self.charges.own(key, sorted({r.claim for r, _ in got_admin}))
            return None
        free = [s for s in range(len(ng.gpus)) if s in alloc.gpus or
                (cluster.gpu_free[alloc.node, s] >= (alloc.milli[0] if alloc.milli else 1000)
                 and cluster.band[alloc.node, s] != 2)]
        taken = self.state.taken()
        if ask.kind == "share":  # the claims' consumed memory decides, not the model's compute
            def fits(d: Device) -> bool:
                return self.state.share_fits(d, ask.requests[0].share)
        else:
            def fits(d: Device) -> bool:
                return self.state.inventory.fits_counters(d, taken)
        got = dra_claims.pick(ask, ng, list(alloc.gpus), free, taken, fits)
        if isinstance(got, str):
            cluster.release(key)
            return f"{node}: {got}"
        slots, picks = got
        if slots != alloc.gpus:
            cluster.release(key)
            alloc.gpus = slots
            alloc.milli = ([d.milli for _, d in picks] if ask.kind == "mig" else [ask.gpu_milli] if ask.kind == "share"
                           else [1000] * len(slots))
            alloc.gpu_memory_mib = [0] * len(slots)
            cluster.allocate(alloc)
        self.picks[key] = picks
        self.charges.own(key, sorted({r.claim for r, _ in picks}))  # (a gang's other members: picked before any)
        for r, d in picks:
            if r.share:
                self.state.fly_share(key, r.claim, d, r.share)
            else:
                self.state.in_flight[d.ref] = key
        return None

    def drop_picks(self, key: str, charged: bool) -> None:
        """A placement with claims withdrawn: its devices are no longer in flight. ``charged``: the pod holds an
        allocation still (bound after all), so it keeps the claims it is charged for."""
        if self.picks.pop(key, None) is not None and not charged:
            self.charges.disown(key)  # picked for a gang that did not go: its claims are no one's again
        self.shared.pop(key, None)
        self.state.land(key)

    def resume(self, key: str, pw: PodWorkload | None, cluster: ClusterState) -> Allocation | None:
        """The allocation of a pod whose claims name its node and devices already (``dra_claims.resumed``): the
        claims' holds become the pod's, and the binder writes the same claims and binds. None while the node is
        gone."""
        node, picks = self.resumes[key]
        i, ng = cluster.index.get(node), self.state.inventory.nodes.get(node)
        if i is None or ng is None or pw is None:
            return None  # it waits for that node: placed anywhere else, its claims would not be written
        del self.resumes[key]
        for claim in {r.claim for r, _ in picks}:
            if hold_id(claim) in cluster.allocations:
                cluster.release(hold_id(claim))
        w = pw.workload
        devices = [(d, d.share_milli(r.share) if r.share else d.milli) for r, d in picks
                   if d.ref in ng.slot_of and not r.admin]
        alloc = Allocation(key, i, [ng.slot_of[d.ref] for d, _ in devices], [m for _, m in devices], w.cpu_milli,
                           w.memory_mib, [0] * len(devices), "mig" if any(d.kind == "mig" for d, _ in devices)
                           else "exclusive")
        clamp(cluster, alloc)
        clamp_gpus(cluster, alloc)
        cluster.allocate(alloc)
        self.picks[key] = picks
        return alloc

    def join(self, key: str, pw: PodWorkload, pod: dict[str, Any], cluster: ClusterState,
             node_mask: np.ndarray) -> tuple[Allocation | None, str]:
        """The allocation of a pod whose claims are all allocated already (``dra_claims.shared_node``): on their
        node, its CPU and memory only (their devices are charged to their owner). (None, why) if it cannot go
        there now; the pod then waits for that node, never placed elsewhere."""
        node = self.joins[key]
        i, w = cluster.index.get(node), pw.workload
        if i is None:
            return None, f"its claims are allocated on {node}, which is not in the cluster"
        if not node_mask[i]:
            return None, f"its claims are allocated on {node}, which takes no new pods (cordoned or not ready)"
        cpu, mem = int(cluster.cpu_free[i]), int(cluster.mem_free[i])
        if cpu < w.cpu_milli or mem < w.memory_mib:
            return None, (f"its claims are allocated on {node}, which has {cpu}m CPU and {mem} MiB free "
                          f"({w.cpu_milli}m and {w.memory_mib} MiB asked)")
        alloc = Allocation(key, i, [], [], w.cpu_milli, w.memory_mib)
        cluster.allocate(alloc)
        del self.joins[key]
        self.shared[key] = self.claims_of(pod)
        return alloc, ""

    # ------------------------------------------------------------------ holds
    def hold(self, claim: str, cluster: ClusterState) -> None:
        """Charge an allocated claim no pod here is charged for (reserved for a pod gone or not ours to know)."""
        if hold_id(claim) in cluster.allocations:
            cluster.release(hold_id(claim))
        devices = self.state.devices_of_claims([claim])
        if not devices:
            return
        node = cluster.index.get(devices[0][0].node)
        ng = self.state.inventory.nodes.get(devices[0][0].node)
        if node is None or ng is None:
            return
        used: dict[int, int] = {}
        for d, milli in devices:
            if d.ref in ng.slot_of:
                used[ng.slot_of[d.ref]] = used.get(ng.slot_of[d.ref], 0) + milli
        alloc = Allocation(hold_id(claim), node, list(used), list(used.values()), 0, 0)
        clamp_gpus(cluster, alloc)
        cluster.allocate(alloc)
