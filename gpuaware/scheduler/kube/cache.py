"""The scheduler's picture of the cluster, built from what the informers saw (pure, one thread).

Nodes become the core's ``ClusterState``; every bound, non-terminal pod holds an allocation in it
(the GPUs gpuaware annotated on it, or, for pods another scheduler bound, the first GPUs free on
its node: the device plugin's choice is not visible from the API); pods with ``schedulerName:
gpuaware`` and no node are the queue. Node changes rebuild the arrays (rare); pod changes are
applied incrementally (the hot path).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuaware.contract import annotations
from gpuaware.contract.events import HealthBand
from gpuaware.scheduler.core.cluster import BAND_CODE, Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.queue import Usage
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.kube import objects
from gpuaware.scheduler.kube.cache_view import CacheView
from gpuaware.scheduler.kube.charging import clamp, clamp_gpus
from gpuaware.scheduler.kube.dra import claims as dra_claims
from gpuaware.scheduler.kube.dra.claims import DraAsk
from gpuaware.scheduler.kube.dra.plugin import DraPlugin, hold_id
from gpuaware.scheduler.kube.dra.state import claim_key
from gpuaware.scheduler.kube.objects import PodSpecError, PodWorkload, created_s
from gpuaware.scheduler.kube.podgroups import PodGroups
from gpuaware.scheduler.kube.queues import Tenancy
from gpuaware.scheduler.kube.scheduling_queue import Rejected, SchedulingQueue

log = logging.getLogger(__name__)

TERMINAL = ("Succeeded", "Failed")
CHECKPOINT_LOSS_S = 60.0


def _spec_or_none(node: dict[str, Any]):
    try:
        return objects.node_spec(node)
    except PodSpecError:
        return None


def _asks(claim: dict[str, Any]) -> tuple[Any, ...]:
    """What of a claim its pods' requests depend on."""
    return claim.get("spec"), claim.get("status"), claim["metadata"].get("deletionTimestamp")


@dataclass
class Assumed:
    """A placement of ours whose Binding is in flight, and the node it is on (by name: a rebuilt model
    numbers nodes anew)."""

    running: Running
    node: str


BAND_CRITICAL = BAND_CODE[HealthBand.CRITICAL]
_BAND_OF_CODE = {code: band for band, code in BAND_CODE.items() if band != HealthBand.UNKNOWN}


class ClusterCache:
    """kube-scheduler's cache in this scheduler's terms: the nodes and pods the informers saw, the core's model
    of them (``cluster``) with every pod holding an allocation (``running``, summed per tenant and model in
    ``usage``), and our placements whose Binding is in flight (``assumed``: ``assume``, ``forget``,
    ``finish_binding``). It composes the parts an informer event may touch: the scheduling queue
    (``queue``), the GPUQueues' tenancy (``tenancy``) and the DRA part with the state it owns (``dra``)."""

    def __init__(self, scheduler_name: str = "gpuaware", unqueued: str = "allow"):
        self.scheduler_name = scheduler_name
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # every non-terminal pod we know
        self.tenancy = Tenancy(unqueued)
        self.podgroups = PodGroups()  # gangs from the Workload API (scheduling.k8s.io/v1alpha2), when served
        self.queue = SchedulingQueue()
        self.dra = DraPlugin()
        self.cluster = ClusterState([])
        self.running: dict[str, Running] = {}  # pods holding an allocation (``_run``, ``release``)
        self.usage = Usage()  # what ``running`` holds per tenant and model, kept as it changes
        self.assumed: dict[str, Assumed] = {}
        self.cordoned: dict[str, set[int]] = {}  # node -> GPU indices
        # (node, GPU) the Node watch has shown cordoned; health's chains clear theirs when they cordon, so a
        # cordon gone from a key seen since is one an operator lifted.
        self.cordon_seen: set[tuple[str, int]] = set()
        self.node_mask = np.zeros(0, dtype=bool)  # False: takes nothing new
        # (node index, GPU) made critical by a cordon or a taint -> the band code beneath (the live state's, or
        # the model's own): what it goes back to when the cordon or taint goes, and what the next call starts from.
        self._beneath: dict[tuple[int, int], int] = {}

    def view(self) -> CacheView:
        """The cache as its readers see it (read-only mappings that follow it)."""
        return CacheView(self)

    @property
    def pending(self) -> dict[str, PodWorkload]:
        """Our unbound pods waiting for a pass (the queue's)."""
        return self.queue.pending

    @property
    def rejected(self) -> dict[str, Rejected]:
        """Our unbound pods refused, with the reason (the queue's)."""
        return self.queue.rejected

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
        charges = self.dra.charges
        charges.clear()
        # Ours in flight keep the claims they are writing: a pod sharing one that is bound already is not charged
        # for its devices (the assumed placement below holds them).
        for key, picks in self.dra.picks.items():
            if key in self.assumed:
                charges.own(key, sorted({r.claim for r, _ in picks}))
        for key in sorted(self.pods, key=lambda k: created_s(self.pods[k])):
            if self.pods[key].get("spec", {}).get("nodeName"):
                self._account(self.pods[key])
        for key, a in list(self.assumed.items()):
            node = self.cluster.index.get(a.node)
            try:
                if node is None:
                    raise ValueError("node gone")
                a.running.allocation.node = node
                self.cluster.allocate(a.running.allocation)
                self._run(key, a.running)
            except ValueError:
                del self.assumed[key]  # the bind task will fail or the pod will show up bound
                charges.disown(key)
        for claim in self.dra.state.claims:
            if charges.owner(claim) is None:
                self.dra.hold(claim, self.cluster)
        self.apply_cordons()

    def _node_spec(self, node: dict[str, Any]) -> NodeSpec:
        """The node as its allocatable says, with the GPUs its ResourceSlices publish where it has any."""
        spec = objects.node_spec(node)
        ng = self.dra.state.inventory.nodes.get(spec.name)
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
        self._beneath, self.dra.taint_bands = {}, {}
        tainted = {name: {s for s, d in enumerate(ng.gpus) if d.tainted}
                   for name, ng in self.dra.state.inventory.nodes.items()}
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
                        self.dra.taint_bands[(i, g)] = _BAND_OF_CODE[under]
                if not taint:
                    cordoned.add((i, g))
                want[(i, g)] = BAND_CRITICAL
        for (i, g), code in want.items():
            if int(band[i, g]) != code:
                self.cluster.set_band(i, g, _BAND_OF_CODE[code])

    # ------------------------------------------------------------------ pods
    def sync_pods(self, items: list[dict[str, Any]]) -> None:
        self.pods = {objects.key(p): p for p in items if p.get("status", {}).get("phase") not in TERMINAL}
        self.queue.clear()
        self.rebuild()
        for p in self.pods.values():
            self.queue_if_ours(p)

    def pod_event(self, kind: str, pod: dict[str, Any]) -> str | None:
        """Apply one change; returns the key of a pod that left (deleted or finished), else None."""
        key = objects.key(pod)
        gone = kind == "DELETED" or pod.get("status", {}).get("phase") in TERMINAL
        if gone:
            self.pods.pop(key, None)
            self.queue.pop(key)
            self.dra.forget_ask(key)
            if dra_claims.has_claims(pod):
                self.dra.unuse(key, pod)
            self.finish_binding(key)
            if key in self.running:
                self.release(key)
            for claim in self.dra.charges.disown(key):
                self._hand_over(claim, key)
            return key
        self.pods[key] = pod
        if pod.get("spec", {}).get("nodeName"):
            self.queue.pop(key)
            self.dra.forget_ask(key)
            self.finish_binding(key)  # our binding is confirmed (or someone else bound it)
            running = self.running.get(key)
            if running is None or self.cluster.names[running.allocation.node] != pod["spec"]["nodeName"]:
                if running is not None:
                    self.release(key)
                self._account(pod)
        elif key not in self.assumed and key not in self.running:
            self.queue_if_ours(pod)
        return None

    def queue_if_ours(self, pod: dict[str, Any]) -> None:
        """Queue an unbound pod of this scheduler (a forgotten placement comes back through here too)."""
        key = objects.key(pod)
        spec = pod.get("spec", {})
        if spec.get("nodeName") or spec.get("schedulerName") != self.scheduler_name:
            return
        if pod["metadata"].get("deletionTimestamp") or key in self.queue.pending or key in self.assumed:
            return
        if dra_claims.has_claims(pod):
            self.dra.use(key, pod)
        try:
            self.queue.add(key, self.parse(pod))
        except PodSpecError as exc:
            self.queue.refuse(key, pod, str(exc))

    def refuse(self, key: str, reason: str) -> None:
        """Leave an unbound pod alone with ``reason`` (an Event) until it or its claims change."""
        pod = self.pods.get(key)
        if pod is not None and not pod.get("spec", {}).get("nodeName"):
            self.queue.refuse(key, pod, reason)
        else:
            self.queue.pop(key)

    def tenant_of(self, pod: dict[str, Any]) -> str:
        return self.tenancy.tenant_of(pod)

    def parse(self, pod: dict[str, Any], queued: bool = True) -> PodWorkload:
        """The pod as the core's workload, with its tenant and arrival; raises ``PodSpecError``. ``queued``: for
        the queue, so what its claims ask for (or where they send it) is kept for the pass; else only read."""
        pw = self._base(pod)
        if not dra_claims.has_claims(pod):
            return pw
        return self.dra.read(pod, pw, queued)

    def _base(self, pod: dict[str, Any]) -> PodWorkload:
        pw = objects.workload_of(pod, self.tenant_of(pod), created_s(pod))
        gang = self.podgroups.gang_of(pod, pw.workload.gang)
        if gang is not None:  # a PodGroup's gang: the same all-or-nothing placement as gpuaware.io/gang
            pw = PodWorkload(dataclasses.replace(pw.workload, gang=gang[0]), gang[1])
        return self.tenancy.govern(pw, pod)

    def try_ask(self, key: str, ask: DraAsk) -> Workload:
        """The pending pod asks ``ask`` (one of its ``firstAvailable`` alternatives) from now on: its workload."""
        pw = self.dra.asking(self._base(self.pods[key]), ask)
        self.dra.asks[key] = ask
        self.queue.add(key, pw)
        return pw.workload

    def known_workload(self, pod: dict[str, Any]) -> Workload:
        """The workload the cache parsed when it queued or charged ``pod`` (just now, for a pod it was handed),
        else parsed here: a burst's pods are then parsed once, not twice."""
        key = objects.key(pod)
        pending = self.queue.pending.get(key)
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

    def _claimed_workload(self, pod: dict[str, Any], claims: list[str] | None = None) -> Workload:
        """A bound pod with claims holds the devices its claims (``claims``: these of them) were allocated (none
        yet: none)."""
        try:
            w = self._base(pod).workload
        except PodSpecError:
            w = Workload(objects.key(pod), tenant=self.tenant_of(pod))
        devices = self.dra.claimed_devices(pod, claims)
        return dataclasses.replace(w, num_gpu=len(devices), gpu_milli=devices[0][1] if len(devices) == 1 else 1000)

    def _hand_over(self, claim: str, gone: str) -> None:
        """A claim whose owner left (``gone``): charged to another bound pod it is reserved for, as a rebuild
        would charge it, else a hold (allocated until deallocated: kube-controller-manager's claim controller)."""
        for key in dra_claims.reserved_for(self.dra.state.claims.get(claim) or {"metadata": {}}):
            pod = self.pods.get(key)
            if key != gone and key in self.running and key not in self.assumed and pod is not None \
                    and pod.get("spec", {}).get("nodeName"):
                self.release(key)
                self._account(pod)
                if self.dra.charges.owner(claim) == key:
                    return
        self.dra.hold(claim, self.cluster)

    def _account(self, pod: dict[str, Any]) -> None:
        """Charge a bound pod's resources to its node."""
        key = objects.key(pod)
        node = self.cluster.index.get(pod["spec"]["nodeName"])
        if node is None or key in self.running:
            return
        if dra_claims.has_claims(pod):
            self._account_claims(key, pod, node)
            return
        w = self.workload(pod)
        try:
            alloc = objects.allocation_of(pod, node, w)
        except PodSpecError as exc:
            log.warning("%s: %s; counting its GPUs as the first free ones", key, exc)
            alloc = Allocation(w.id, node, [], [], w.cpu_milli, w.memory_mib)
        if w.num_gpu and not alloc.gpus:
            alloc = self._first_free(alloc, w)
        clamp(self.cluster, alloc)
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

    def _account_claims(self, key: str, pod: dict[str, Any], node: int) -> None:
        """A bound pod with claims: the devices of those no pod charged already is charged for (a claim shared
        with one counts once, in the model and in the quotas)."""
        claims = self.dra.charges.own(key, self.dra.claims_of(pod))
        for claim in claims:
            if hold_id(claim) in self.cluster.allocations:
                self.cluster.release(hold_id(claim))
        w = self._claimed_workload(pod, claims)
        ng = self.dra.state.inventory.nodes.get(pod["spec"]["nodeName"])
        devices = self.dra.claimed_devices(pod, claims) if ng is not None else []
        alloc = Allocation(w.id, node, [ng.slot_of[d.ref] for d, _ in devices] if ng else [],
                           [m for _, m in devices], w.cpu_milli, w.memory_mib,
                           [0] * len(devices), "mig" if any(d.kind == "mig" for d, _ in devices) else "exclusive")
        clamp(self.cluster, alloc)
        clamp_gpus(self.cluster, alloc)
        self.cluster.allocate(alloc)
        self._run(key, Running(w, alloc, started_s=created_s(pod), done_s=0.0, checkpoint_every_s=None))

    def _first_free(self, alloc: Allocation, w: Workload) -> Allocation:
        free = self.cluster.gpu_free[alloc.node]
        milli = w.gpu_milli if w.num_gpu == 1 else 1000
        idx = [int(g) for g in np.flatnonzero(free >= milli)[: w.num_gpu]]
        return Allocation(alloc.workload_id, alloc.node, idx, [milli] * len(idx), alloc.cpu_milli,
                          alloc.memory_mib, [w.gpu_memory_mib] * len(idx), alloc.sharing)

    # ------------------------------------------------------------------ placements in flight
    def assume(self, key: str, running: Running) -> None:
        """A placement of ours whose binding is in flight (already allocated in the model, out of the queue):
        kube-scheduler's AssumePod. ``forget`` undoes it; ``finish_binding`` ends it once the pod shows up
        bound."""
        self.queue.pop(key)
        if key in self.dra.picks:
            self.dra.charges.own(key, sorted({r.claim for r, _ in self.dra.picks[key]}))
        self.assumed[key] = Assumed(running, self.cluster.names[running.allocation.node])
        self._run(key, running)

    def finish_binding(self, key: str) -> None:
        """The pod is bound (or gone): it holds what it holds as a bound pod, no longer as a placement in flight."""
        self.dra.picks.pop(key, None)  # its devices stay in flight until the claims say they are allocated
        self.dra.shared.pop(key, None)
        self.assumed.pop(key, None)

    def forget(self, key: str) -> None:
        """Undo ``assume`` (kube-scheduler's ForgetPod): a placement of ours taken back before its Binding landed
        (refused, failed, gone). Its devices are no longer in flight, its allocation in the model is freed, and a
        claim it was charged for is a hold while the API still says it is allocated (a release write that
        failed, or whose answer is still on its way)."""
        pod = self.pods.get(key)
        if pod is not None and pod.get("spec", {}).get("nodeName"):
            # Bound after all (the Binding's answer was lost, the watch was quicker): it keeps what it holds.
            self.dra.drop_picks(key, key in self.running)
            self.finish_binding(key)
            return
        claims = self.dra.charges.disown(key) if key in self.assumed else []
        self.dra.drop_picks(key, key in self.running)
        self.finish_binding(key)
        self.release(key)
        for claim in claims:
            if claim in self.dra.state.claims:
                self._hand_over(claim, key)

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

    # ------------------------------------------------------------------ DRA objects
    def sync_slices(self, items: list[dict[str, Any]]) -> None:
        self.dra.state.inventory.sync(items)
        self.rebuild()
        self._requeue_claimants(None)

    def slice_event(self, kind: str, obj: dict[str, Any]) -> None:
        if self.dra.state.inventory.event(kind, obj):
            self.rebuild()  # the node's GPU slots changed
            self._requeue_claimants(None)

    def sync_taint_rules(self, items: list[dict[str, Any]]) -> None:
        self.dra.state.inventory.sync_rules(items)
        self.rebuild()  # a tainted GPU is critical in the model
        self._requeue_claimants(None)

    def taint_rule_event(self, kind: str, obj: dict[str, Any]) -> None:
        if self.dra.state.inventory.rule_event(kind, obj):
            self.rebuild()
            self._requeue_claimants(None)

    def sync_claims(self, items: list[dict[str, Any]]) -> None:
        self.dra.state.sync_claims(items)
        self.rebuild()
        self._requeue_claimants(None)

    def claim_event(self, kind: str, obj: dict[str, Any]) -> None:
        """The API's word on a claim: the pod charged for it is charged again, or it becomes a hold."""
        old = self.dra.state.claims.get(claim_key(obj))
        claim = self.dra.state.claim_event(kind, obj)
        if hold_id(claim) in self.cluster.allocations:
            self.cluster.release(hold_id(claim))
        # The pod charged for it is charged again (ours in flight: the assumed placement holds the slots).
        owner = self.dra.charges.owner(claim)
        if owner is not None and owner not in self.assumed:
            pod = self.pods.get(owner)
            if pod is not None and pod.get("spec", {}).get("nodeName"):
                self.release(owner)
                self._account(pod)
            else:  # (defence: a forgotten placement gives its claims up in ``forget``)
                self.dra.charges.disown(owner)
                owner = None
        if owner is None:
            self.dra.hold(claim, self.cluster)
        if kind == "DELETED" or old is None or _asks(old) != _asks(obj):
            # Not on a finalizer put on or taken off (our own write around a claim's allocation): that changes
            # nothing the pods ask for, and a pod refused for good would be asked for again.
            self._requeue_claimants(claim)

    def sync_classes(self, items: list[dict[str, Any]]) -> None:
        self.dra.state.sync_classes(items)
        self._requeue_claimants(None)

    def class_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.dra.state.class_event(kind, obj)
        self._requeue_claimants(None)

    def _requeue_claimants(self, claim: str | None) -> None:
        """Unbound pods with claims read again (``claim``: only those using it): what they ask may have changed."""
        for key in self.dra.claimants(claim, self.queue.waiting()):
            pod = self.pods.get(key)
            if pod is None or not dra_claims.has_claims(pod) or \
                    (key not in self.queue.pending and key not in self.queue.rejected):
                continue
            self.queue.pending.pop(key, None)
            self.dra.forget_ask(key)
            self.queue_if_ours(pod)

    # ------------------------------------------------------------------ PodGroups (the Workload API)
    def sync_pod_groups(self, items: list[dict[str, Any]]) -> None:
        self.podgroups.sync(items)
        self._requeue_members(None)

    def pod_group_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._requeue_members(self.podgroups.event(kind, obj))

    def _requeue_members(self, group: str | None) -> None:
        """Unbound pods naming PodGroup ``group`` (None: any) read again: their gang came, changed or went."""
        for key in list(self.queue.waiting()):
            pod = self.pods.get(key)
            if pod is not None and (named := self.podgroups.names(pod)) is not None and group in (None, named):
                self.queue.pop(key)
                self.dra.forget_ask(key)
                self.queue_if_ours(pod)

    # ------------------------------------------------------------------ GPUQueues
    def sync_queues(self, items: list[dict[str, Any]]) -> None:
        if self.tenancy.sync(items):
            self._retenant()

    def queue_event(self, kind: str, obj: dict[str, Any]) -> None:
        if self.tenancy.event(kind, obj):
            self._retenant()

    def _retenant(self) -> None:
        """Queues may arrive after the pods: every workload's tenant is derived again."""
        for r in self.running.values():
            pod = self.pods.get(r.workload.id)
            if pod is not None:
                self.usage.add(r.workload, self._model_of(r), -1)
                r.workload.tenant = self.tenant_of(pod)
                self.usage.add(r.workload, self._model_of(r))
        for key in list(self.queue.pending):
            del self.queue.pending[key]
            self.queue_if_ours(self.pods[key])

    def node_name(self, index: int) -> str:
        return self.cluster.names[index]
