"""The scheduler's picture of the cluster, built from what the informers saw (pure, one thread).

Nodes become the core's ``ClusterState``; every bound, non-terminal pod holds an allocation in it
(the GPUs gpuaware annotated on it, or, for pods another scheduler bound, the first GPUs free on
its node: the device plugin's choice is not visible from the API); pods with ``schedulerName:
gpuaware`` and no node are the queue. Node changes rebuild the arrays (rare); pod changes are
applied incrementally (the hot path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from gpuaware.contract import annotations
from gpuaware.contract.events import HealthBand
from gpuaware.scheduler.core.cluster import BAND_CODE, Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.queue import Usage
from gpuaware.scheduler.core.remediation import DEFAULT_EVICTION_MODE, EvictionMode, eviction_mode
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.kube import objects, queues
from gpuaware.scheduler.kube.dra import claims as dra_claims
from gpuaware.scheduler.kube.dra.claims import DeviceRequest, DraAsk
from gpuaware.scheduler.kube.dra.inventory import Device
from gpuaware.scheduler.kube.dra.state import DraState, claim_key
from gpuaware.scheduler.kube.objects import PodSpecError, PodWorkload

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
TERMINAL = ("Succeeded", "Failed")
CHECKPOINT_LOSS_S = 60.0


def created_s(obj: dict[str, Any]) -> float:
    ts = obj["metadata"].get("creationTimestamp")
    if not ts:
        return 0.0
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _spec_or_none(node: dict[str, Any]):
    try:
        return objects.node_spec(node)
    except PodSpecError:
        return None


def _asks(claim: dict[str, Any]) -> tuple[Any, ...]:
    """What of a claim its pods' requests depend on."""
    return claim.get("spec"), claim.get("status"), claim["metadata"].get("deletionTimestamp")


class QueueSpecError(ValueError):
    """A GPUQueue the scheduler cannot read."""


@dataclass(frozen=True)
class Queue:
    """What the scheduler reads of a GPUQueue."""

    name: str
    tenant: str
    namespaces: tuple[str, ...]
    weight: float
    quota_gpus: float  # the sum over models
    borrow: bool
    generation: int
    created: float
    quota_by_model: tuple[tuple[str, float], ...] = ()  # (model or "*", GPUs)
    borrow_limit_gpus: float | None = None
    priority_classes: tuple[str, ...] = ()  # empty: any
    memory_by_model: tuple[tuple[str, float], ...] = ()  # (model or "*", GiB of GPU memory at most)
    eviction_mode: EvictionMode = DEFAULT_EVICTION_MODE  # its pods on a GPU taken out of service for its health

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Queue:
        """The queue, or ``QueueSpecError`` naming it: the apiserver validates the schema, but an informer
        must not die on an object stored before a schema change (or by a server without one)."""
        try:
            return cls._of(obj)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            name = (obj.get("metadata") or {}).get("name", "?") if isinstance(obj, dict) else "?"
            raise QueueSpecError(f"GPUQueue {name!r} is ignored: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _of(cls, obj: dict[str, Any]) -> Queue:
        spec = obj.get("spec") or {}
        for field_name in ("namespaces", "priorityClasses"):
            values = spec.get(field_name) or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"spec.{field_name} must be a list of names")
        if not isinstance(spec.get("tenant", DEFAULT_TENANT), str):
            raise ValueError("spec.tenant must be a name")
        borrowing = spec.get("borrowing") or {}
        by_model: dict[str, float] = {}
        memory: dict[str, float] = {}
        for i, e in enumerate(spec.get("quota") or []):
            model = str(e.get("model") or "*")
            by_model[model] = by_model.get(model, 0.0) + _amount(e.get("gpus", 0), f"spec.quota[{i}].gpus")
            if e.get("memoryGiB") is not None:
                gib = _amount(e["memoryGiB"], f"spec.quota[{i}].memoryGiB")
                if gib == 0 and by_model[model] > 0:  # the CRD's rule, for objects stored before it
                    raise ValueError(f"spec.quota[{i}].memoryGiB: 0 would refuse every pod the quota's gpus grant")
                memory[model] = memory.get(model, 0.0) + gib
        limit = borrowing.get("limitGpus")
        return cls(obj["metadata"]["name"], spec.get("tenant", DEFAULT_TENANT), tuple(spec.get("namespaces") or ()),
                   float(spec.get("weight", 1)), sum(by_model.values()), bool(borrowing.get("enabled", True)),
                   int(obj["metadata"].get("generation", 1)), created_s(obj), tuple(sorted(by_model.items())),
                   None if limit is None else _amount(limit, "spec.borrowing.limitGpus"),
                   tuple(spec.get("priorityClasses") or ()), tuple(sorted(memory.items())),
                   eviction_mode(spec.get("evictionMode"), "spec.evictionMode"))


def _amount(value: Any, field: str) -> float:
    """A non-negative finite number (GPUs, GiB); else ``ValueError`` naming the field and the reason."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{field}: {value!r} is not a non-negative number")
    return float(value)


def _queue_or_none(obj: dict[str, Any]) -> Queue | None:
    try:
        return Queue.of(obj)
    except QueueSpecError as exc:
        log.error("%s", exc)
        return None


@dataclass
class Rejected:
    pod: dict[str, Any]
    reason: str


BAND_CRITICAL = BAND_CODE[HealthBand.CRITICAL]
_BAND_OF_CODE = {code: band for band, code in BAND_CODE.items() if band != HealthBand.UNKNOWN}


@dataclass
class ClusterCache:
    scheduler_name: str = "gpuaware"
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # every non-terminal pod we know
    tenants_by_namespace: dict[str, str] = field(default_factory=dict)
    queue_by_namespace: dict[str, Queue] = field(default_factory=dict)
    unqueued: str = "allow"  # scheduler.unqueued: what namespaces in no queue get (gpuaware.scheduler.kube.queues)
    queues: dict[str, Queue] = field(default_factory=dict)
    cluster: ClusterState = field(default_factory=lambda: ClusterState([]))
    running: dict[str, Running] = field(default_factory=dict)  # pods holding an allocation (``_run``, ``release``)
    usage: Usage = field(default_factory=Usage)  # what ``running`` holds per tenant and model, kept as it changes
    pending: dict[str, PodWorkload] = field(default_factory=dict)  # our unbound pods
    rejected: dict[str, Rejected] = field(default_factory=dict)  # our pods whose annotations are wrong
    reservations: dict[str, Running] = field(default_factory=dict)  # placed by us, binding in flight
    cordoned: dict[str, set[int]] = field(default_factory=dict)  # node -> GPU indices
    # (node, GPU) the Node watch has shown cordoned; health's chains clear theirs when they cordon, so a cordon
    # gone from a key seen since is one an operator lifted.
    cordon_seen: set[tuple[str, int]] = field(default_factory=set)
    _reserved_node: dict[str, str] = field(default_factory=dict)
    node_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # False: takes nothing new
    # DRA (gpuaware.scheduler.kube.dra): slices, claims and classes; what pending pods' claims ask for; the claims each
    # pod holding an allocation is charged for (a claim allocated with no such pod is a hold of its own). A claim
    # shared by several pods is charged once, to its owner (the first pod charged for it).
    dra: DraState = field(default_factory=DraState)
    dra_asks: dict[str, DraAsk] = field(default_factory=dict)
    dra_picks: dict[str, list[tuple[DeviceRequest, Device]]] = field(default_factory=dict)  # binding in flight
    pod_claims: dict[str, list[str]] = field(default_factory=dict)  # pod -> the claims it owns
    claim_owner: dict[str, str] = field(default_factory=dict)  # claim -> the pod charged for its devices
    claim_users: dict[str, set[str]] = field(default_factory=dict)  # claim -> unbound pods of ours naming it
    dra_resume: dict[str, tuple[str, list[tuple[DeviceRequest, Device]]]] = field(default_factory=dict)
    # Pods whose claims are all allocated already (shared): the node they go to, while pending; the claims
    # their UID joins (``reservedFor``) while their binding is in flight.
    dra_joins: dict[str, str] = field(default_factory=dict)
    dra_shared: dict[str, list[str]] = field(default_factory=dict)
    # (node index, GPU) critical only because its device is tainted -> the band it has otherwise, lent to the
    # cycle of a pod whose claims tolerate the taint (``tolerated``).
    taint_bands: dict[tuple[int, int], HealthBand] = field(default_factory=dict)
    # (node index, GPU) made critical by a cordon or a taint -> the band code beneath (the live state's, or the
    # model's own): what it goes back to when the cordon or taint goes, and what the next call starts from.
    _beneath: dict[tuple[int, int], int] = field(default_factory=dict)

    # ------------------------------------------------------------------ nodes
    def sync_nodes(self, items: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in items}
        self.cordoned = {name: gpus for name, n in self.nodes.items() if (gpus := annotations.cordoned_gpus(n))}
        self.cordon_seen.update((name, g) for name, gpus in self.cordoned.items() for g in gpus)
        self.rebuild()

    def node_event(self, kind: str, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        old = self.nodes.get(name)
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self.cordoned.pop(name, None)
            self.rebuild()
            return
        self.nodes[name] = node
        gpus = annotations.cordoned_gpus(node)
        if gpus:
            self.cordoned[name] = gpus
            self.cordon_seen.update((name, g) for g in gpus)
        else:
            self.cordoned.pop(name, None)
        if old is None or _spec_or_none(old) != _spec_or_none(node) or \
                objects.schedulable(old) != objects.schedulable(node):
            self.rebuild()
        elif annotations.cordoned_gpus(old) != annotations.cordoned_gpus(node):
            self.apply_cordons()

    def rebuild(self) -> None:
        """Arrays from the nodes, then every bound pod's allocation again."""
        specs = []
        for name, n in sorted(self.nodes.items()):
            try:
                specs.append(self._node_spec(n))
            except PodSpecError as exc:  # the API validates quantities; this is defence, not a path
                log.warning("node %s left out: %s", name, exc)
        self.cluster = ClusterState(specs)
        self._beneath = {}  # fresh bands: nothing imposed on them yet
        # Nothing new lands on a cordoned or NotReady node; what runs there stays accounted.
        self.node_mask = np.array([objects.schedulable(self.nodes[name]) for name in self.cluster.names], dtype=bool)
        self.running.clear()
        self.usage = Usage(self.cluster.gpu_memory_by_model())
        self.pod_claims.clear()
        self.claim_owner.clear()
        # Ours in flight keep the claims they are writing: a pod sharing one that is bound already is not charged
        # for its devices (the reservation below holds them).
        for key, picks in self.dra_picks.items():
            if key in self.reservations:
                self._own(key, sorted({r.claim for r, _ in picks}))
        for key in sorted(self.pods, key=lambda k: created_s(self.pods[k])):
            if self.pods[key].get("spec", {}).get("nodeName"):
                self._account(self.pods[key])
        for key, r in list(self.reservations.items()):
            node = self.cluster.index.get(self._reserved_node.get(key, ""))
            try:
                if node is None:
                    raise ValueError("node gone")
                r.allocation.node = node
                self.cluster.allocate(r.allocation)
                self._run(key, r)
            except ValueError:
                del self.reservations[key]  # the bind task will fail or the pod will show up bound
                self._disown(key)
        for claim in self.dra.claims:
            if claim not in self.claim_owner:
                self._hold(claim)
        self.apply_cordons()

    def _node_spec(self, node: dict[str, Any]) -> NodeSpec:
        """The node as its allocatable says, with the GPUs its ResourceSlices publish where it has any."""
        spec = objects.node_spec(node)
        ng = self.dra.inventory.nodes.get(spec.name)
        if ng is None:
            return spec
        return NodeSpec(spec.name, spec.cpu_milli, spec.memory_mib, len(ng.gpus), ng.model, ng.memory_mib,
                        ng.islands(), ng.mig_mode())

    def apply_cordons(self, fresh: np.ndarray | None = None) -> None:
        """Cordoned GPUs are critical in the model, whatever their live state says; so are GPUs whose device a
        taint keeps new claims off, except in the cycle of a pod whose claims tolerate it (``tolerated``). A GPU
        gpuaware cordoned stays critical whatever a claim tolerates: its health chain is emptying it.

        ``fresh``: where the live state has just written the band (those are what lies beneath now); elsewhere
        the band beneath is the one kept from the last call, so a GPU whose cordon or taint is gone gets it back
        and a call after another finds every tainted GPU again."""
        band = self.cluster.band
        old = self._beneath

        def beneath(i: int, g: int) -> int:
            if (i, g) in old and (fresh is None or not fresh[i, g]):
                return old[(i, g)]
            return int(band[i, g])

        want = {at: beneath(*at) for at in old if at[0] < band.shape[0] and at[1] < band.shape[1]}
        self._beneath, self.taint_bands = {}, {}
        tainted = {name: {s for s, d in enumerate(ng.gpus) if d.tainted}
                   for name, ng in self.dra.inventory.nodes.items()}
        cordoned: set[tuple[int, int]] = set()
        marks = [*((False, c) for c in self.cordoned.items()), *((True, t) for t in tainted.items())]
        for taint, (name, gpus) in marks:  # cordons first: a cordoned GPU is not lent to a tolerating claim
            i = self.cluster.index.get(name)
            for g in gpus:
                if i is None or g >= self.cluster.max_gpus or (i, g) in cordoned:
                    continue
                under = beneath(i, g)
                if under != BAND_CRITICAL:
                    self._beneath[(i, g)] = under
                    if taint:
                        self.taint_bands[(i, g)] = _BAND_OF_CODE[under]
                if not taint:
                    cordoned.add((i, g))
                want[(i, g)] = BAND_CRITICAL
        for (i, g), code in want.items():
            if int(band[i, g]) != code:
                self.cluster.set_band(i, g, _BAND_OF_CODE[code])

    @contextlib.contextmanager
    def tolerated(self, ask: DraAsk | None) -> Iterator[None]:
        """While the core places one pod: the GPUs whose devices are critical only for a taint its claims
        tolerate at the band they would have untainted (the core's health Filter reads the band); critical
        again after. Devices are still picked by each request's own tolerations (``DeviceRequest.matches``)."""
        lent = []
        if ask is not None and ask.tolerating:
            for (i, g), band in self.taint_bands.items():
                ng = self.dra.inventory.nodes.get(self.cluster.names[i])
                if ng is not None and g < len(ng.gpus) and ask.tolerates(ng.gpus[g]):
                    self.cluster.set_band(i, g, band)
                    lent.append((i, g))
        try:
            yield
        finally:
            for i, g in lent:
                self.cluster.set_band(i, g, HealthBand.CRITICAL)

    # ------------------------------------------------------------------ pods
    def sync_pods(self, items: list[dict[str, Any]]) -> None:
        self.pods = {objects.key(p): p for p in items if p.get("status", {}).get("phase") not in TERMINAL}
        self.pending.clear()
        self.rejected.clear()
        self.rebuild()
        for p in self.pods.values():
            self.queue_if_ours(p)

    def pod_event(self, kind: str, pod: dict[str, Any]) -> str | None:
        """Apply one change; returns the key of a pod that left (deleted or finished), else None."""
        key = objects.key(pod)
        gone = kind == "DELETED" or pod.get("status", {}).get("phase") in TERMINAL
        if gone:
            self.pods.pop(key, None)
            self.pending.pop(key, None)
            self.rejected.pop(key, None)
            self._forget_ask(key)
            for claim in self._claims_of(pod) if dra_claims.has_claims(pod) else ():
                self.claim_users.get(claim, set()).discard(key)
            self.finish_binding(key)
            if key in self.running:
                self.release(key)
            for claim in self._disown(key):
                self._hand_over(claim, key)
            return key
        self.pods[key] = pod
        if pod.get("spec", {}).get("nodeName"):
            self.pending.pop(key, None)
            self._forget_ask(key)
            self.finish_binding(key)  # our binding is confirmed (or someone else bound it)
            running = self.running.get(key)
            if running is None or self.cluster.names[running.allocation.node] != pod["spec"]["nodeName"]:
                if running is not None:
                    self.release(key)
                self._account(pod)
        elif key not in self.reservations and key not in self.running:
            self.queue_if_ours(pod)
        return None

    def queue_if_ours(self, pod: dict[str, Any]) -> None:
        """Queue an unbound pod of this scheduler (a withdrawn placement comes back through here too)."""
        key = objects.key(pod)
        spec = pod.get("spec", {})
        if spec.get("nodeName") or spec.get("schedulerName") != self.scheduler_name:
            return
        if pod["metadata"].get("deletionTimestamp") or key in self.pending or key in self.reservations:
            return
        if dra_claims.has_claims(pod):
            for claim in self._claims_of(pod):
                self.claim_users.setdefault(claim, set()).add(key)
        try:
            self.pending[key] = self.parse(pod)
            self.rejected.pop(key, None)
        except PodSpecError as exc:
            self.rejected[key] = Rejected(pod, str(exc))

    def refuse(self, key: str, reason: str) -> None:
        """Leave an unbound pod alone with ``reason`` (an Event) until it or its claims change."""
        pod = self.pods.get(key)
        self.pending.pop(key, None)
        if pod is not None and not pod.get("spec", {}).get("nodeName"):
            self.rejected[key] = Rejected(pod, reason)

    def tenant_of(self, pod: dict[str, Any]) -> str:
        fallback = queues.UNQUEUED_TENANT if self.unqueued == "best-effort" else DEFAULT_TENANT
        return self.tenants_by_namespace.get(pod["metadata"].get("namespace", ""), fallback)

    def parse(self, pod: dict[str, Any], queued: bool = True) -> PodWorkload:
        """The pod as the core's workload, with its tenant and arrival; raises ``PodSpecError``. ``queued``: for
        the queue, so what its claims ask for (or where they send it) is kept for the pass; else only read."""
        pw = self._base(pod)
        if not dra_claims.has_claims(pod):
            return pw
        if pw.workload.num_gpu:
            raise PodSpecError(f"both {objects.GPU_RESOURCE} and resourceClaims: ask for GPUs one way")
        key = objects.key(pod)
        if queued:
            self._forget_ask(key)
        resume = dra_claims.resumed(pod, self.dra.claims, self.dra.inventory)
        if resume is not None:  # its claims name a node already: it goes there (``resume``)
            if queued:
                self.dra_resume[key] = resume
            devices = [d for _, d in resume[1]]
            one_mig = len(devices) == 1 and devices[0].kind == "mig"
            return dataclasses.replace(pw, workload=dataclasses.replace(
                pw.workload, num_gpu=len(devices), gpu_milli=devices[0].milli if one_mig else 1000))
        shared = dra_claims.shared_node(pod, self.dra.claims)
        if shared is not None:  # its claims are in use already: it goes where they are, with no device of its own
            if pw.workload.gang:
                raise dra_claims.UnsupportedClaim(f"gang {pw.workload.gang}: a member whose claims are allocated "
                                                  "already (shared) is not placed all-or-nothing with its gang")
            if queued:
                self.dra_joins[key] = shared
            return dataclasses.replace(pw, workload=dataclasses.replace(pw.workload, num_gpu=0))
        ask = dra_claims.ask_of(pod, self.dra.claims, self.dra.classes, self.dra.inventory)
        if queued:
            self.dra_asks[key] = ask
        return self._asking(pw, ask)

    def _base(self, pod: dict[str, Any]) -> PodWorkload:
        pw = objects.workload_of(pod, self.tenant_of(pod), created_s(pod))
        return queues.govern(pw, pod, self.queue_by_namespace.get(pod["metadata"].get("namespace", "")), self.unqueued)

    @staticmethod
    def _asking(pw: PodWorkload, ask: DraAsk) -> PodWorkload:
        models = ask.models if not pw.workload.models else tuple(m for m in ask.models if m in pw.workload.models)
        return dataclasses.replace(pw, workload=dataclasses.replace(
            pw.workload, num_gpu=ask.num_gpu, gpu_milli=ask.gpu_milli, models=models or ("(none)",),
            needs_nvlink=pw.workload.needs_nvlink or ask.needs_island))

    def try_ask(self, key: str, ask: DraAsk) -> Workload:
        """The pending pod asks ``ask`` (one of its ``firstAvailable`` alternatives) from now on: its workload."""
        pw = self._asking(self._base(self.pods[key]), ask)
        self.dra_asks[key] = ask
        self.pending[key] = pw
        return pw.workload

    def _forget_ask(self, key: str) -> None:
        """What the pod's claims asked for, or where they sent it, is read again (or the pod is gone or bound)."""
        self.dra_asks.pop(key, None)
        self.dra_resume.pop(key, None)
        self.dra_joins.pop(key, None)

    def known_workload(self, pod: dict[str, Any]) -> Workload:
        """The workload the cache parsed when it queued or charged ``pod`` (just now, for a pod it was handed),
        else parsed here: a burst's pods are then parsed once, not twice."""
        key = objects.key(pod)
        pending = self.pending.get(key)
        if pending is not None:
            return pending.workload
        running = self.running.get(key)
        return running.workload if running is not None else self.workload(pod)

    def workload(self, pod: dict[str, Any]) -> Workload:
        if dra_claims.has_claims(pod) and pod.get("spec", {}).get("nodeName"):
            return self._claimed_workload(pod)
        try:
            return self.parse(pod, queued=False).workload
        except PodSpecError:
            # A bound pod still holds what it asked for; unreadable gpuaware annotations count as plain GPUs.
            try:
                gpus = objects.gpu_request(pod)
            except PodSpecError:
                gpus = 0
            return Workload(objects.key(pod), num_gpu=gpus, tenant=self.tenant_of(pod))

    def _claims_of(self, pod: dict[str, Any]) -> list[str]:
        try:
            return dra_claims.claim_names(pod)
        except PodSpecError:
            return []

    def _claimed_devices(self, pod: dict[str, Any], claims: list[str] | None = None) -> list[tuple[Device, int]]:
        """The GPUs, MIG partitions and GPU shares its claims (``claims``: these of them) were allocated on its
        node, with the compute each takes of its slot (other devices are no GPU slot)."""
        ng = self.dra.inventory.nodes.get(pod["spec"]["nodeName"])
        return [(d, m) for d, m in self.dra.devices_of_claims(self._claims_of(pod) if claims is None else claims)
                if ng is not None and d.ref in ng.slot_of]

    def _claimed_workload(self, pod: dict[str, Any], claims: list[str] | None = None) -> Workload:
        """A bound pod with claims holds the devices its claims (``claims``: these of them) were allocated (none
        yet: none)."""
        try:
            pw = objects.workload_of(pod, self.tenant_of(pod), created_s(pod))
            w = queues.govern(pw, pod, self.queue_by_namespace.get(pod["metadata"].get("namespace", "")),
                              self.unqueued).workload
        except PodSpecError:
            w = Workload(objects.key(pod), tenant=self.tenant_of(pod))
        devices = self._claimed_devices(pod, claims)
        return dataclasses.replace(w, num_gpu=len(devices), gpu_milli=devices[0][1] if len(devices) == 1 else 1000)

    def _hand_over(self, claim: str, gone: str) -> None:
        """A claim whose owner left (``gone``): charged to another bound pod it is reserved for, as a rebuild
        would charge it, else a hold (allocated until deallocated: kube-controller-manager's claim controller)."""
        for key in dra_claims.reserved_for(self.dra.claims.get(claim) or {"metadata": {}}):
            pod = self.pods.get(key)
            if key != gone and key in self.running and key not in self.reservations and pod is not None \
                    and pod.get("spec", {}).get("nodeName"):
                self.release(key)
                self._account(pod)
                if self.claim_owner.get(claim) == key:
                    return
        self._hold(claim)

    def _own(self, key: str, claims: list[str]) -> list[str]:
        """Of ``claims``, those no other pod is charged for become ``key``'s to be charged for; returns them."""
        self._disown(key)
        mine = [c for c in claims if self.claim_owner.setdefault(c, key) == key]
        self.pod_claims[key] = mine
        return mine

    def _disown(self, key: str) -> list[str]:
        """``key`` is charged for none of its claims any more; returns those it was."""
        claims = self.pod_claims.pop(key, [])
        for c in claims:
            if self.claim_owner.get(c) == key:
                del self.claim_owner[c]
        return claims

    def _hold(self, claim: str) -> None:
        """Charge an allocated claim no pod here is charged for (reserved for a pod gone or not ours to know)."""
        hold = f"claim:{claim}"
        if hold in self.cluster.allocations:
            self.cluster.release(hold)
        devices = self.dra.devices_of_claims([claim])
        if not devices:
            return
        node = self.cluster.index.get(devices[0][0].node)
        ng = self.dra.inventory.nodes.get(devices[0][0].node)
        if node is None or ng is None:
            return
        used: dict[int, int] = {}
        for d, milli in devices:
            if d.ref in ng.slot_of:
                used[ng.slot_of[d.ref]] = used.get(ng.slot_of[d.ref], 0) + milli
        alloc = Allocation(hold, node, list(used), list(used.values()), 0, 0)
        self._clamp_gpus(alloc)
        self.cluster.allocate(alloc)

    def _clamp_gpus(self, alloc: Allocation) -> None:
        """What the API says is allocated is charged as far as the model has room (never negative)."""
        alloc.milli = [min(m, int(self.cluster.gpu_free[alloc.node, g])) for g, m in zip(alloc.gpus, alloc.milli,
                                                                                            strict=True)]

    def _account(self, pod: dict[str, Any]) -> None:
        """Charge a bound pod's resources to its node."""
        key = objects.key(pod)
        node = self.cluster.index.get(pod["spec"]["nodeName"])
        if node is None or key in self.running:
            return
        if dra_claims.has_claims(pod):
            # A claim shared with a pod charged for it already is not charged again (its GPUs count once, in the
            # model and in the quotas).
            claims = self._own(key, self._claims_of(pod))
            for claim in claims:
                if f"claim:{claim}" in self.cluster.allocations:
                    self.cluster.release(f"claim:{claim}")
            w = self._claimed_workload(pod, claims)
            ng = self.dra.inventory.nodes.get(pod["spec"]["nodeName"])
            devices = self._claimed_devices(pod, claims) if ng is not None else []
            alloc = Allocation(w.id, node, [ng.slot_of[d.ref] for d, _ in devices] if ng else [],
                               [m for _, m in devices], w.cpu_milli, w.memory_mib,
                               [0] * len(devices), "mig" if any(d.kind == "mig" for d, _ in devices) else "exclusive")
            self._clamp(alloc)
            self._clamp_gpus(alloc)
            self.cluster.allocate(alloc)
            self._run(key, Running(w, alloc, started_s=created_s(pod), done_s=0.0, checkpoint_every_s=None))
            return
        w = self.workload(pod)
        try:
            alloc = objects.allocation_of(pod, node, w)
        except PodSpecError as exc:
            log.warning("%s: %s; counting its GPUs as the first free ones", key, exc)
            alloc = Allocation(w.id, node, [], [], w.cpu_milli, w.memory_mib)
        if w.num_gpu and not alloc.gpus:
            alloc = self._first_free(alloc, w)
        self._clamp(alloc)
        try:
            self.cluster.allocate(alloc)
        except ValueError as exc:
            # Over-committed by others (or a race we lost): count it, never go negative.
            log.warning("%s on %s does not fit the model (%s); counted as far as it fits",
                        key, pod["spec"]["nodeName"], exc)
            alloc = Allocation(w.id, node, [], [], 0, 0)
            self.cluster.allocate(alloc)
        # A checkpointable pod is asked to checkpoint before it is evicted: it loses about the time
        # that takes (CHECKPOINT_LOSS_S); anything else loses all its work.
        self._run(key, Running(w, alloc, started_s=created_s(pod), done_s=0.0,
                               checkpoint_every_s=CHECKPOINT_LOSS_S if w.checkpointable else None))

    def _first_free(self, alloc: Allocation, w: Workload) -> Allocation:
        free = self.cluster.gpu_free[alloc.node]
        milli = w.gpu_milli if w.num_gpu == 1 else 1000
        idx = [int(g) for g in np.flatnonzero(free >= milli)[: w.num_gpu]]
        return Allocation(alloc.workload_id, alloc.node, idx, [milli] * len(idx), alloc.cpu_milli,
                          alloc.memory_mib, [w.gpu_memory_mib] * len(idx), alloc.sharing)

    def _clamp(self, alloc: Allocation) -> None:
        n = alloc.node
        alloc.cpu_milli = min(alloc.cpu_milli, int(self.cluster.cpu_free[n]))
        alloc.memory_mib = min(alloc.memory_mib, int(self.cluster.mem_free[n]))

    def assume(self, key: str, running: Running) -> None:
        """A placement of ours whose binding is in flight (already allocated in the model): kube-scheduler's
        AssumePod. ``forget`` undoes it; ``finish_binding`` ends it once the pod shows up bound."""
        self.pending.pop(key, None)
        if key in self.dra_picks:
            self._own(key, sorted({r.claim for r, _ in self.dra_picks[key]}))
        self.reservations[key] = running
        self._reserved_node[key] = self.cluster.names[running.allocation.node]
        self._run(key, running)

    def finish_binding(self, key: str) -> None:
        """The pod is bound (or gone): it holds what it holds as a bound pod, no longer as a placement in flight."""
        self.dra_picks.pop(key, None)  # its devices stay in flight until the claims say they are allocated
        self.dra_shared.pop(key, None)
        self.reservations.pop(key, None)
        self._reserved_node.pop(key, None)

    def release(self, key: str) -> None:
        r = self.running.pop(key, None)
        if r is not None:
            self.usage.add(r.workload, self._model_of(r), -1)
        if key in self.cluster.allocations:
            self.cluster.release(key)

    def _run(self, key: str, r: Running) -> None:
        old = self.running.get(key)
        if old is not None:
            self.usage.add(old.workload, self._model_of(old), -1)
        self.running[key] = r
        self.usage.add(r.workload, self._model_of(r))

    def _model_of(self, r: Running) -> str:
        return str(self.cluster.models[r.allocation.node])

    # ------------------------------------------------------------------ DRA
    def sync_slices(self, items: list[dict[str, Any]]) -> None:
        self.dra.inventory.sync(items)
        self.rebuild()
        self._requeue_claimants(None)

    def slice_event(self, kind: str, obj: dict[str, Any]) -> None:
        if self.dra.inventory.event(kind, obj):
            self.rebuild()  # the node's GPU slots changed
            self._requeue_claimants(None)

    def sync_taint_rules(self, items: list[dict[str, Any]]) -> None:
        self.dra.inventory.sync_rules(items)
        self.rebuild()  # a tainted GPU is critical in the model
        self._requeue_claimants(None)

    def taint_rule_event(self, kind: str, obj: dict[str, Any]) -> None:
        if self.dra.inventory.rule_event(kind, obj):
            self.rebuild()
            self._requeue_claimants(None)

    def sync_claims(self, items: list[dict[str, Any]]) -> None:
        self.dra.sync_claims(items)
        self.rebuild()
        self._requeue_claimants(None)

    def claim_event(self, kind: str, obj: dict[str, Any]) -> None:
        """The API's word on a claim: the pod charged for it is charged again, or it becomes a hold."""
        old = self.dra.claims.get(claim_key(obj))
        claim = self.dra.claim_event(kind, obj)
        if f"claim:{claim}" in self.cluster.allocations:
            self.cluster.release(f"claim:{claim}")
        # The pod charged for it is charged again (ours in flight: the reservation holds the slots).
        owner = self.claim_owner.get(claim)
        if owner is not None and owner not in self.reservations:
            pod = self.pods.get(owner)
            if pod is not None and pod.get("spec", {}).get("nodeName"):
                self.release(owner)
                self._account(pod)
            else:  # (defence: a withdrawn placement gives its claims up in ``forget``)
                self._disown(owner)
                owner = None
        if owner is None:
            self._hold(claim)
        if kind == "DELETED" or old is None or _asks(old) != _asks(obj):
            # Not on a finalizer put on or taken off (our own write around a claim's allocation): that changes
            # nothing the pods ask for, and a pod refused for good would be asked for again.
            self._requeue_claimants(claim)

    def sync_classes(self, items: list[dict[str, Any]]) -> None:
        self.dra.sync_classes(items)
        self._requeue_claimants(None)

    def class_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.dra.class_event(kind, obj)
        self._requeue_claimants(None)

    def _requeue_claimants(self, claim: str | None) -> None:
        """Unbound pods with claims read again (``claim``: only those using it): what they ask may have changed."""
        keys = [*self.pending, *self.rejected] if claim is None else list(self.claim_users.get(claim, ()))
        for key in keys:
            pod = self.pods.get(key)
            if pod is None or not dra_claims.has_claims(pod) or (key not in self.pending and key not in self.rejected):
                continue
            self.pending.pop(key, None)
            self._forget_ask(key)
            self.queue_if_ours(pod)

    def pick_devices(self, key: str, alloc: Allocation) -> str | None:
        """Devices for a placement the core made for a pod with claims (in the model already): its GPUs, or
        others of the same node where the claims' constraints want; None when done, else why not (the
        placement is then released)."""
        ask = self.dra_asks.get(key)
        node = self.cluster.names[alloc.node]
        ng = self.dra.inventory.nodes.get(node)
        for claim in ask.claims if ask is not None else ():
            owner = self.claim_owner.get(claim)
            if owner is not None and owner != key:  # placed this pass for another pod that shares it
                self.cluster.release(key)
                return f"its claim {claim} is being allocated for {owner}; it goes where that puts it"
        if ask is None or ng is None:
            self.cluster.release(key)
            return f"node {node} publishes no GPUs in ResourceSlices" if ng is None else "claims not read"
        if ask.kind == "admin":  # devices in use or not, none taken: nothing in flight, no GPU in the model
            got_admin = dra_claims.pick_admin(ask, ng)
            if isinstance(got_admin, str):
                self.cluster.release(key)
                return f"{node}: {got_admin}"
            self.dra_picks[key] = got_admin
            self._own(key, sorted({r.claim for r, _ in got_admin}))
            return None
        free = [s for s in range(len(ng.gpus)) if s in alloc.gpus or
                (self.cluster.gpu_free[alloc.node, s] >= (alloc.milli[0] if alloc.milli else 1000)
                 and self.cluster.band[alloc.node, s] != 2)]
        taken = self.dra.taken()
        if ask.kind == "share":  # the claims' consumed memory decides, not the model's compute
            def fits(d: Device) -> bool:
                return self.dra.share_fits(d, ask.requests[0].share)
        else:
            def fits(d: Device) -> bool:
                return self.dra.inventory.fits_counters(d, taken)
        got = dra_claims.pick(ask, ng, list(alloc.gpus), free, taken, fits)
        if isinstance(got, str):
            self.cluster.release(key)
            return f"{node}: {got}"
        slots, picks = got
        if slots != alloc.gpus:
            self.cluster.release(key)
            alloc.gpus = slots
            alloc.milli = ([d.milli for _, d in picks] if ask.kind == "mig" else [ask.gpu_milli] if ask.kind == "share"
                           else [1000] * len(slots))
            alloc.gpu_memory_mib = [0] * len(slots)
            self.cluster.allocate(alloc)
        self.dra_picks[key] = picks
        self._own(key, sorted({r.claim for r, _ in picks}))  # (a gang's other members are picked before any starts)
        for r, d in picks:
            if r.share:
                self.dra.fly_share(key, r.claim, d, r.share)
            else:
                self.dra.in_flight[d.ref] = key
        return None

    def resume(self, key: str) -> Allocation | None:
        """The allocation of a pod whose claims name its node and devices already (``dra_claims.resumed``): the
        claims' holds become the pod's, and the binder writes the same claims and binds. None while the node is
        gone."""
        node, picks = self.dra_resume[key]
        i, ng, pw = self.cluster.index.get(node), self.dra.inventory.nodes.get(node), self.pending.get(key)
        if i is None or ng is None or pw is None:
            return None  # it waits for that node: placed anywhere else, its claims would not be written
        del self.dra_resume[key]
        for claim in {r.claim for r, _ in picks}:
            if f"claim:{claim}" in self.cluster.allocations:
                self.cluster.release(f"claim:{claim}")
        w = pw.workload
        devices = [(d, d.share_milli(r.share) if r.share else d.milli) for r, d in picks
                   if d.ref in ng.slot_of and not r.admin]
        alloc = Allocation(key, i, [ng.slot_of[d.ref] for d, _ in devices], [m for _, m in devices], w.cpu_milli,
                           w.memory_mib, [0] * len(devices), "mig" if any(d.kind == "mig" for d, _ in devices)
                           else "exclusive")
        self._clamp(alloc)
        self._clamp_gpus(alloc)
        self.cluster.allocate(alloc)
        self.dra_picks[key] = picks
        return alloc

    def claim_wait(self, key: str) -> str | None:
        """Why a pending pod waits: a new claim of it is being allocated for another pod of ours (in flight); it
        stays out of the pass, so that nothing is preempted for it, and joins the claim once it is written
        (``shared_node``). None: it does not."""
        ask = self.dra_asks.get(key)
        for claim in ask.claims if ask is not None else ():
            owner = self.claim_owner.get(claim)
            if owner is not None and owner != key:
                return f"its claim {claim} is being allocated for {owner}; it goes where that puts it"
        return None

    def co_claimants(self) -> set[str]:
        """Pending pods naming a new claim another pending pod names too: one at a time, in arrival order, so
        that the first placed allocates it and the others then wait for it (``claim_wait``); if the first
        cannot go, the next may."""
        out: set[str] = set()
        for key, ask in self.dra_asks.items():
            if key in self.pending and any(
                    sum(1 for u in self.claim_users.get(c, ()) if u in self.pending and u in self.dra_asks) > 1
                    for c in ask.claims):
                out.add(key)
        return out

    def stranded_claims(self, key: str) -> list[dict[str, Any]]:
        """The claims of a pending pod that cannot go where they are allocated, if every one of them is reserved
        for nobody or for this pod alone (kube-scheduler's DRA PostFilter then deallocates them); else none: one
        in use by another pod keeps it waiting for that node."""
        pod = self.pods.get(key)
        if pod is None:
            return []
        uid = pod["metadata"].get("uid")
        claims = [self.dra.claims[c] for c in self._claims_of(pod) if c in self.dra.claims]
        allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
        if any({r.get("uid") for r in c["status"].get("reservedFor") or []} - {uid} for c in allocated):
            return []
        return allocated

    def join(self, key: str) -> tuple[Allocation | None, str]:
        """The allocation of a pod whose claims are all allocated already (``dra_claims.shared_node``): on their
        node, its CPU and memory only (their devices are charged to their owner). (None, why) if it cannot go
        there now; the pod then waits for that node, never placed elsewhere."""
        node, pw = self.dra_joins[key], self.pending[key]
        i, w = self.cluster.index.get(node), pw.workload
        if i is None:
            return None, f"its claims are allocated on {node}, which is not in the cluster"
        if not self.node_mask[i]:
            return None, f"its claims are allocated on {node}, which takes no new pods (cordoned or not ready)"
        cpu, mem = int(self.cluster.cpu_free[i]), int(self.cluster.mem_free[i])
        if cpu < w.cpu_milli or mem < w.memory_mib:
            return None, (f"its claims are allocated on {node}, which has {cpu}m CPU and {mem} MiB free "
                          f"({w.cpu_milli}m and {w.memory_mib} MiB asked)")
        alloc = Allocation(key, i, [], [], w.cpu_milli, w.memory_mib)
        self.cluster.allocate(alloc)
        del self.dra_joins[key]
        self.dra_shared[key] = self._claims_of(self.pods[key])
        return alloc, ""

    def drop_picks(self, key: str) -> None:
        """A placement with claims withdrawn: its devices are no longer in flight."""
        if self.dra_picks.pop(key, None) is not None and key not in self.running:
            self._disown(key)  # picked for a gang that did not go: its claims are no one's again
        self.dra_shared.pop(key, None)
        self.dra.land(key)

    def forget(self, key: str) -> None:
        """Undo ``assume`` (kube-scheduler's ForgetPod): a placement of ours taken back before its Binding landed
        (refused, failed, gone). Its devices are no longer in flight, its allocation in the model is freed, and a
        claim it was charged for is a hold while the API still says it is allocated (a release write that
        failed, or whose answer is still on its way)."""
        pod = self.pods.get(key)
        if pod is not None and pod.get("spec", {}).get("nodeName"):
            # Bound after all (the Binding's answer was lost, the watch was quicker): it keeps what it holds.
            self.drop_picks(key)
            self.finish_binding(key)
            return
        claims = self._disown(key) if key in self.reservations else []
        self.drop_picks(key)
        self.finish_binding(key)
        self.release(key)
        for claim in claims:
            if claim in self.dra.claims:
                self._hand_over(claim, key)

    # ------------------------------------------------------------------ queues
    def sync_queues(self, items: list[dict[str, Any]]) -> None:
        self.queues = {q.name: q for q in filter(None, map(_queue_or_none, items))}
        self._retenant()

    def queue_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.queues.pop(obj["metadata"]["name"], None)
        else:
            q = _queue_or_none(obj)
            if q is None:
                self.queues.pop((obj.get("metadata") or {}).get("name", ""), None)
            else:
                self.queues[q.name] = q
        self._retenant()

    def _retenant(self) -> None:
        mapping: dict[str, str] = {}
        owners: dict[str, Queue] = {}
        for q in sorted(self.queues.values(), key=lambda q: q.created):
            for ns in q.namespaces:
                mapping.setdefault(ns, q.tenant)  # the oldest queue claiming a namespace keeps it
                owners.setdefault(ns, q)
        if mapping == self.tenants_by_namespace and owners == self.queue_by_namespace:
            return
        self.tenants_by_namespace, self.queue_by_namespace = mapping, owners
        # Queues may arrive after the pods: every workload's tenant is derived again.
        for r in self.running.values():
            pod = self.pods.get(r.workload.id)
            if pod is not None:
                self.usage.add(r.workload, self._model_of(r), -1)
                r.workload.tenant = self.tenant_of(pod)
                self.usage.add(r.workload, self._model_of(r))
        for key in list(self.pending):
            del self.pending[key]
            self.queue_if_ours(self.pods[key])

    def node_name(self, index: int) -> str:
        return self.cluster.names[index]
