"""A GPU turning critical: cordon it on its node (annotation) and move its pods off (checkpoint, then evict).

A GPU turns "critical" here when its band is CRITICAL or its graded verdict recommends a remediation
(drain, reset, reboot, service request: docs/health.md). Acts once per turn: a GPU that stays
critical is not cordoned again, one that recovers and turns critical again is; a cordon the API
refused is tried again on the next state update. The safety net is decided here, once for the
cluster (gpuaware.scheduler.core.breaker): a circuit breaker on how many nodes may be newly quarantined in
a window (a held cordon is retried on the next state update), ``remediation_dry_run`` (decisions
recorded, no API call), and the lemon-node ledger.

After the cordon, the rest of the chain (gpuaware.scheduler.core.remediation: drained -> action requested ->
validated -> back in service) advances on every state update of the GPU; what it says on the Node
(conditions and a taint, gpuaware.scheduler.kube.node_conditions) is written when it changes. Each namespace's
pods leave as its GPUQueue's ``evictionMode`` says (checkpoint-then-evict by default).

The GPU's pods are those gpuaware placed on it (its annotation on the pod) and, for pods of other schedulers,
those the node's agent says hold it (the Node's ``gpuaware.io/gpu-pods``, from the kubelet's PodResources):
they are evicted the same way before a reset is requested, and "drained" waits for them too. Where the node has
no such annotation (or a malformed one: logged, ignored), another scheduler's pod is judged by the GPUs the cache
charged it, as before.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Set

from kubernetes.client.exceptions import ApiException

from gpuaware.contract import annotations
from gpuaware.contract.events import DecisionAction, GpuState, HealthAction, HealthBand, HealthVerdict
from gpuaware.plumbing import observability
from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, now_rfc3339
from gpuaware.scheduler.core.breaker import QuarantineBreaker, RemediationLedger
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.remediation import DEFAULT_EVICTION_MODE, Chain, EvictionMode, Next
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube import node_conditions
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.decisions import DecisionSink, Outcome
from gpuaware.scheduler.kube.dra.device_taints import DeviceTaints
from gpuaware.scheduler.kube.evictor import Evictor
from gpuaware.scheduler.kube.tasks import Tasks
from gpuaware.scheduler.metrics import SchedulerStats

log = logging.getLogger(__name__)

REMEDIATE = frozenset({HealthAction.DRAIN, HealthAction.RESET_GPU, HealthAction.REBOOT_NODE,
                       HealthAction.SERVICE_REQUEST})


def needs_remediation(state: GpuState) -> bool:
    return state.health_band == HealthBand.CRITICAL or state.recommended_action in REMEDIATE


class HealthReactions:
    def __init__(self, view: StateView, calls: ApiCalls, cache: ClusterCache, stats: SchedulerStats,
                 sink: DecisionSink, evictor: Evictor, tasks: Tasks, device_taints: DeviceTaints | None = None):
        self.view, self.calls, self.cache, self.stats = view, calls, cache, stats
        self.device_taints = device_taints  # DRA: the GPU's devices tainted while it is critical
        self.sink, self.evictor, self.tasks = sink, evictor, tasks
        self._critical_seen: set[tuple[str, int]] = set()  # (node, GPU index) acted on while it stays critical
        settings = evictor.settings
        self.breaker = QuarantineBreaker(settings.breaker_max_fraction, settings.breaker_window_s)
        self.dry_run = settings.remediation_dry_run
        self.ledger = RemediationLedger()
        self._held: set[tuple[str, int]] = set()
        # (node, GPU) -> unix times of the chain's steps (cordoned, moved, drained, requested, back in service)
        # and whether the breaker held it
        self.timeline: dict[tuple[str, int], dict[str, float | bool]] = {}
        self.chains: dict[tuple[str, int], Chain] = {}  # GPUs out of service, until they return
        self.validate_s = settings.remediation_validate_s
        self.stale_after_s = settings.stale_after_s
        self._written: dict[str, tuple] = {}  # node -> (conditions, taint) last written
        self._spared: set[str] = set()  # pods left running (eviction mode never), told once
        self._moving: dict[tuple[str, int], set[str]] = {}  # (node, GPU) -> pods whose eviction it started
        self._node_drained: set[tuple[str, int]] = set()  # chains whose drain took the whole node (a reboot)
        self._not_ours: set[tuple[str, int]] = set()  # cordons no condition of ours explains (an operator's)
        self._lifted: set[tuple[str, int]] = set()  # returned to service; the cache may still show the cordon
        self._bad_gpu_pods: dict[str, str] = {}  # node -> the malformed gpu-pods value already logged

    def react(self, where: Mapping[str, tuple[int, int]], changed: Set[str] | None = None,
              uuid_at: Callable[[int, int], str | None] | None = None) -> None:
        """After live state was applied: act on each GPU (UUID located by ``where``) that turned critical.

        ``changed`` (with ``uuid_at``, the UUID at a (node index, GPU index)): the GPUs whose state changed since
        the last call; only they and the GPUs already acted on are looked at (the others' answer is the one
        they got last time). None: every GPU."""
        c = self.cache.cluster
        if not self.dry_run:
            self.adopt()
        for gpu_uuid in self._to_look_at(changed, uuid_at):
            state = self.view.gpus[gpu_uuid]
            if gpu_uuid not in where:
                continue
            i, g = where[gpu_uuid]
            key = (c.names[i], g)
            chain = self.chains.get(key)
            if chain is not None and self._released_by_operator(key):
                self.end_by_operator(chain)
                chain = None  # in service again: turning critical acts again
            if chain is not None:
                self.advance(chain, state)
                continue
            if not needs_remediation(state):
                lift = self.device_taints.lift_if_tainted(self.calls, *key) if self.device_taints else None
                if lift is not None:
                    self.tasks.spawn(lift)
                self._critical_seen.discard(key)  # turning critical again (after a repair) acts again
                self._held.discard(key)
            elif key not in self._critical_seen:
                if not self.breaker.allow(c.names[i], time.time(), len(c.names)):
                    if key not in self._held:  # recorded once; tried again on every state update
                        self._held.add(key)
                        self.timeline.setdefault(key, {})["breaker_held"] = True
                        self.stats.decisions[("DEFER", "breaker-held")] += 1
                        self.tasks.spawn(self.sink.record(Outcome(
                            f"{c.names[i]}/gpu{g}", DecisionAction.DEFER, c.names[i],
                            [f"GPU {g} of {c.names[i]} needs remediation; circuit breaker held (more than "
                             f"{self.breaker.max_fraction:.0%} of nodes in {self.breaker.window_s:.0f} s)"]), None))
                    continue
                self._held.discard(key)
                self._critical_seen.add(key)
                gap = self.ledger.record(c.names[i], time.time())
                if gap is not None:
                    self.stats.mtbi.observe(gap)
                if self.ledger.lemon(c.names[i]) and c.names[i] not in self.stats.lemon_nodes:
                    log.warning("node %s is a lemon: %d GPU remediations in 7 days", c.names[i],
                                len(self.ledger.history[c.names[i]]))
                self.stats.lemon_nodes = set(self.ledger.lemons())
                if self.dry_run:
                    self.stats.decisions[("CORDON", "dry-run")] += 1
                    self.tasks.spawn(self.sink.record(Outcome(
                        f"{c.names[i]}/gpu{g}", DecisionAction.CORDON, c.names[i],
                        [f"dry run: GPU {g} of {c.names[i]} would be cordoned and its pods moved"]), None))
                    continue
                self.tasks.spawn(self.cordon_and_migrate(c.names[i], g, gpu_uuid, state))
        self.stats.remediation_gpus = Counter(ch.step.value for ch in self.chains.values())

    def _to_look_at(self, changed: Set[str] | None, uuid_at: Callable[[int, int], str | None] | None) -> Iterable[str]:
        """The GPUs ``react`` must look at, in the view's order (the breaker admits the first ones it sees)."""
        taints = self.device_taints
        if changed is None or uuid_at is None or (taints is not None and taints.served and taints.tainted is None):
            return self.view.gpus  # (a device taint's rules not read yet: the first GPU in service reads them)
        keys = {*self.chains, *self._held, *self._critical_seen,
                *(taints.tainted or () if taints is not None and taints.served else ())}
        index = self.cache.cluster.index
        extra = {u for node, g in keys if (i := index.get(node)) is not None and (u := uuid_at(i, g)) is not None}
        slot = self.view.slot
        return sorted((u for u in changed | extra if u in self.view.gpus), key=slot.__getitem__)

    def adopt(self) -> None:
        """Take over the chains an earlier leader left open: a cordoned GPU its node's GPUUnhealthy condition
        names. Their pods are checked again (drained), and a reset or reboot is asked for again if needed."""
        cordoned = {(n, g) for n, gpus in self.cache.cordoned.items() for g in gpus}
        self._not_ours &= cordoned
        self._lifted &= cordoned  # the watch has not shown our uncordon yet: not a chain to take over
        for node, gpus in self.cache.cordoned.items():
            skip = self._not_ours | self._lifted
            if all((node, g) in self.chains or (node, g) in skip for g in gpus):
                continue
            found, since = node_conditions.open_chains(self.cache.nodes.get(node) or {})
            for g in gpus:
                key = (node, g)
                if key in self.chains or key in skip:
                    continue
                if g not in found:
                    self._not_ours.add(key)  # an operator's cordon: theirs to lift
                    continue
                action, reasons = found[g]
                log.info("taking over the remediation chain of GPU %d of %s (%s)", g, node, action.value)
                self._critical_seen.add(key)
                self.chains[key] = Chain(node, g, action, reasons, since or time.time(), self.validate_s)

    def advance(self, chain: Chain, state: GpuState) -> None:
        """One state update of a GPU in its chain: drained yet? then request, validate, return."""
        now = time.time()
        key = (chain.node, chain.gpu)
        if chain.drained_at is None and self.drained(chain):
            chain.drained(now)
            self.timeline.setdefault(key, {})["drained"] = now
        # A GPU that stopped reporting has not passed anything: its last state, however good, is no validation.
        fresh = now * 1000 - state.sample_ts_ms <= self.stale_after_s * 1000
        verdict = state.verdict if fresh else HealthVerdict.UNKNOWN
        step = chain.observe(verdict, state.recommended_action, list(state.verdict_reasons), now)
        if chain.action == HealthAction.REBOOT_NODE and key not in self._node_drained:
            self._node_drained.add(key)
            self.tasks.spawn(self.migrate_off(chain.node, chain.gpu))  # escalated to a reboot: every GPU's pods
        if step in (Next.REQUEST, Next.ESCALATE) and chain.requested is not None:
            self.timeline.setdefault(key, {}).setdefault("requested", now)
            action = chain.requested.value.lower()
            self.stats.decisions[("CORDON", f"{action.replace('_', '-')}-requested")] += 1
            self.tasks.spawn(self.sink.record(Outcome(
                f"{chain.node}/gpu{chain.gpu}", DecisionAction.CORDON, chain.node,
                [f"GPU {chain.gpu} of {chain.node} drained; {action} requested from the cluster's tooling "
                 f"(node condition {node_conditions.GPU_MAINTENANCE})"]), None))
        elif step == Next.VALIDATED:
            self.tasks.spawn(self.return_to_service(chain))
        if self._node_want(chain.node)[2] != self._written.get(chain.node):
            self.tasks.spawn(self.sync_node(chain.node))

    def _released_by_operator(self, key: tuple[str, int]) -> bool:
        """The chain's cordon was seen on the Node since it was written, and is gone (our own return to service
        ends the chain first)."""
        return key in self.cache.cordon_seen and key[1] not in self.cache.cordoned.get(key[0], ())

    def end_by_operator(self, chain: Chain) -> None:
        """An operator lifted the cordon mid-chain: their call that the GPU is fixed. New pods may land on it at
        once, so the chain ends here (conditions cleared, device taint lifted) rather than holding a GPU that is
        in service, which would leave those pods on it unprotected the next time it turns critical."""
        key = (chain.node, chain.gpu)
        log.info("GPU %d of %s: cordon lifted by an operator; its remediation chain ends", chain.gpu, chain.node)
        self.chains.pop(key, None)
        self.cache.cordon_seen.discard(key)
        self._critical_seen.discard(key)
        self._moving.pop(key, None)
        self._node_drained.discard(key)
        self.stats.decisions[("RESUME", "operator")] += 1
        if self.device_taints is not None:
            lift = self.device_taints.lift_if_tainted(self.calls, *key)
            if lift is not None:
                self.tasks.spawn(lift)
        self.tasks.spawn(self.sync_node(chain.node))

    def drained(self, chain: Chain) -> bool:
        """No pod (ours, or another scheduler's its agent names) holds the GPU (the whole node, for a reboot) or
        is still being evicted from it."""
        holding = self.holders(chain.node, chain.gpu, chain.action == HealthAction.REBOOT_NODE)
        return not holding and not any(map(self.evictor.evicting, self._moving.get((chain.node, chain.gpu), ())))

    async def return_to_service(self, chain: Chain) -> None:
        key = (chain.node, chain.gpu)
        try:
            await self.calls.call(self.calls.api.uncordon_gpu, chain.node, chain.gpu)
        except ApiException as exc:
            self.calls.failed("patch-node", exc)
            chain.returned_at, chain.passing_since = None, None  # validated again, then tried again
            return
        except TRANSPORT_ERRORS as exc:
            self.stats.api_errors[("patch-node", 0)] += 1
            chain.returned_at, chain.passing_since = None, None
            log.warning("could not uncordon GPU %d of %s: %s", chain.gpu, chain.node, exc)
            return
        self.chains.pop(key, None)
        self.cache.cordon_seen.discard(key)
        if self.device_taints is not None:
            lift = self.device_taints.lift_if_tainted(self.calls, *key)
            if lift is not None:
                self.tasks.spawn(lift)
        self._lifted.add(key)
        self._critical_seen.discard(key)  # turning critical again acts again
        self._moving.pop(key, None)
        self._node_drained.discard(key)
        repair_s = chain.repair_s()
        if repair_s is not None:
            self.stats.mttr.observe(repair_s)
        self.timeline.setdefault(key, {})["back_in_service"] = chain.returned_at or time.time()
        self.stats.decisions[("RESUME", "gpu-validated")] += 1
        await self.sink.record(Outcome(f"{chain.node}/gpu{chain.gpu}", DecisionAction.RESUME, chain.node,
                                       [f"GPU {chain.gpu} of {chain.node} read PASS for {chain.validate_s:.0f} s: "
                                        f"back in service"]), None)
        await self.sync_node(chain.node)

    def _node_want(self, node: str) -> tuple[dict, dict | None, tuple]:
        """The node's conditions and taint as its chains are now, and their comparable form."""
        conditions, taint = node_conditions.desired(c for c in self.chains.values() if c.node == node)
        return conditions, taint, (tuple(sorted(conditions.items())), tuple(sorted((taint or {}).items())))

    async def sync_node(self, node: str) -> None:
        """Write the node's conditions and taint when they differ from what was written last."""
        conditions, taint, want = self._node_want(node)
        if self._written.get(node) == want:
            return
        self._written[node] = want
        try:
            await self.calls.call(self.calls.api.set_node_conditions, node,
                                  node_conditions.condition_objects(conditions, self.cache.nodes.get(node),
                                                                    now_rfc3339()))
            await self.calls.call(self.calls.api.set_node_taint, node, node_conditions.TAINT_KEY, taint)
        except ApiException as exc:
            self._written.pop(node, None)  # written again on the next state update
            self.calls.failed("patch-node-status", exc)
        except TRANSPORT_ERRORS as exc:
            self._written.pop(node, None)
            self.stats.api_errors[("patch-node-status", 0)] += 1
            log.warning("could not write the GPU health conditions of %s: %s", node, exc)

    async def cordon_and_migrate(self, node: str, gpu: int, gpu_uuid: str, state: GpuState) -> None:
        # The span continues the trace of the state that turned the GPU critical (agent event -> stream
        # state), so the decisions published inside it carry that trace to scheduler.decisions.v1.
        parent = observability.extract_context(self.view.band_trace.get(gpu_uuid))
        attributes = {"gpuaware.node": node, "gpuaware.gpu.index": gpu, "gpuaware.gpu.uuid": gpu_uuid}
        with observability.tracer(__name__).start_as_current_span("scheduler.cordon_and_migrate", context=parent,
                                                                  attributes=attributes):
            if await self.cordon(node, gpu, state):
                if self.device_taints is not None:
                    await self.device_taints.taint_async(self.calls, node, gpu, "critical")
                await self.migrate_off(node, gpu)
                await self.sync_node(node)

    async def cordon(self, node: str, gpu: int, state: GpuState) -> bool:
        self.cache.cordon_seen.discard((node, gpu))  # an earlier cordon's sighting says nothing of this one
        try:
            await self.calls.call(self.calls.api.cordon_gpu, node, gpu)
            now = time.time()
            self.timeline.setdefault((node, gpu), {})["cordoned"] = now
            action = state.recommended_action if state.recommended_action in REMEDIATE else HealthAction.DRAIN
            self.chains[(node, gpu)] = Chain(node, gpu, action, list(state.verdict_reasons), now, self.validate_s)
            self.stats.decisions[("CORDON", "gpu-critical")] += 1
            await self.sink.record(Outcome(f"{node}/gpu{gpu}", DecisionAction.CORDON, node,
                                           [f"GPU {gpu} of {node} is critical: cordoned"]), None)
            return True
        except ApiException as exc:
            self.calls.failed("patch-node", exc)
            self._critical_seen.discard((node, gpu))  # tried again on the next state update
        except TRANSPORT_ERRORS as exc:
            self.stats.api_errors[("patch-node", 0)] += 1
            self._critical_seen.discard((node, gpu))
            log.warning("could not cordon GPU %d of %s: %s", gpu, node, exc)
        return False

    def eviction_mode(self, pod: dict) -> EvictionMode:
        queue = self.cache.tenancy.queue_of(pod)
        return queue.eviction_mode if queue is not None else DEFAULT_EVICTION_MODE

    def gpu_pods(self, node: str) -> dict[int, set[str]] | None:
        """What the node's agent says holds each GPU; None where it says nothing (or nothing readable)."""
        n = self.cache.nodes.get(node) or {}
        raw = (n.get("metadata", {}).get("annotations") or {}).get(annotations.ANN_GPU_PODS)
        if raw is None:
            return None
        try:
            return annotations.gpu_pods(n)
        except ValueError as exc:
            if self._bad_gpu_pods.get(node) != raw:  # said once per value, not on every state update
                self._bad_gpu_pods[node] = raw
                log.warning("node %s: %s; ignored (other schedulers' pods judged by the GPUs charged to them)",
                            node, exc)
            return None

    def holders(self, node: str, gpu: int, whole_node: bool) -> dict[str, Running | None]:
        """The pods holding ``gpu`` of ``node`` (every GPU for ``whole_node``): key -> what the cache charges it.

        A pod gpuaware placed holds the GPUs its annotation names; another scheduler's pod, the GPUs the
        node's agent names it on, where the agent said (the cache only guessed those)."""
        i = self.cache.cluster.index.get(node)
        named = self.gpu_pods(node)
        on_gpu = set().union(*named.values()) if named and whole_node else (named or {}).get(gpu, set())
        out: dict[str, Running | None] = {}
        for key, r in list(self.cache.running.items()):
            if r.allocation.node != i:
                continue
            pod = self.cache.pods.get(key) or {}
            ours = annotations.ANN_GPUS in (pod.get("metadata", {}).get("annotations") or {})
            if whole_node or (gpu in r.allocation.gpus if ours or named is None else key in on_gpu):
                out[key] = r
        for key in sorted(on_gpu - out.keys()):  # not charged to the node (e.g. no GPU request the cache saw)
            pod = self.cache.pods.get(key)
            if pod is not None and pod.get("spec", {}).get("nodeName") == node:
                out[key] = None
        return out

    async def migrate_off(self, node: str, gpu: int) -> None:
        chain = self.chains.get((node, gpu))
        whole_node = chain is not None and chain.action == HealthAction.REBOOT_NODE  # a reboot takes every GPU
        if whole_node:
            self._node_drained.add((node, gpu))
        for key, r in self.holders(node, gpu, whole_node).items():
            pod = self.cache.pods.get(key)
            if pod is None:
                continue
            mode = self.eviction_mode(pod)
            if mode == EvictionMode.NEVER:
                if key not in self._spared and self.calls.event(
                        pod, "GpuUnhealthy", f"GPU {gpu} of {node} is taken out of service; its GPUQueue's "
                        "evictionMode is never: the pod keeps running, and the GPU's reset or reboot waits for it "
                        "to end", "Warning"):  # dropped (the Events lane is full): said on a later reaction
                    self._spared.add(key)
                    self.stats.decisions[("DEFER", "eviction-mode-never")] += 1
                continue
            if not self.evictor.claim(key):
                continue
            if r is not None:
                self.cache.release(key)
            self._moving.setdefault((node, gpu), set()).add(key)
            checkpoint = mode == EvictionMode.CHECKPOINT_THEN_EVICT
            reason = f"GPU {gpu} of {node} turned critical: {'checkpoint and ' if checkpoint else ''}move"
            self.stats.decisions[("MIGRATE", "gpu-critical")] += 1
            await self.sink.record(Outcome(key, DecisionAction.MIGRATE, node, [reason]),
                                   r.workload if r is not None else None)
            self.tasks.spawn(self.evictor.evict(pod, r, reason, "Migrated", checkpoint=checkpoint))
        # Every pod on the GPU is released from it and its checkpoint-and-evict under way.
        self.timeline.setdefault((node, gpu), {})["moved"] = time.time()
