"""The scheduler extender: kube-scheduler keeps scheduling and asks gpuaware about GPUs.

kube-scheduler POSTs its extender arguments as JSON (k8s.io/kube-scheduler/extender/v1, Go field
names). With ``nodeCacheCapable: true`` (shipped) they carry only ``NodeNames`` and gpuaware reads
the nodes from its own informer cache; with ``false`` they carry every ``Node`` (``Nodes``) and the
answer echoes the kept ones. What each verb answers (docs/scheduler.md, "Extender"):

- ``/filter`` → 200 ``ExtenderFilterResult``: ``NodeNames`` (or ``Nodes``) that pass, the others in
  ``FailedNodes`` with the core's reason (resolvable: health and capacity change, preemption may
  help); with ``one_node`` (``extender_one_node``, shipped) the core's own cycle runs over the nodes asked
  about and only the node it picks is kept, so kube-scheduler binds it without a scoring round or /prioritize,
  and the pod's GPUs there are reserved at once for its /bind (``Reservation``); a pod whose gpuaware request cannot
  be scheduled as written fails every node in ``FailedAndUnresolvableNodes`` with the reason (it stays
  Pending, Unschedulable, with that message; an ``Error`` would be skipped by an ``ignorable``
  kube-scheduler extender and the pod bound anyway).
- ``/prioritize`` → 200 ``HostPriorityList``, 0-10 (an invalid gpuaware request scores 0 everywhere).
- ``/preempt`` → 200 ``ExtenderPreemptionResult``: the nodes where evicting the proposed victims
  really makes room on healthy GPUs. The type has no ``Error``: a 200 always means "these candidates".
- Any verb: 400 ``{"Error"}`` for a body that is not what kube-scheduler sends (extender_args),
  401 unauthenticated (extender_access), 413 over ``extender_max_body_mib``, 503 ``{"Error"}``
  while not ready (``/readyz`` 503: the cache has not caught up, so any answer would be made on a
  partial view), 500 ``{"Error"}`` when gpuaware itself fails. kube-scheduler's
  ``HTTPExtender.send()`` turns every non-200 into an error, and an ``ignorable`` extender's errors
  are skipped (logged), so a failure never reads as an answer.

Pods that ask for no GPU and carry no gpuaware annotation pass through untouched: every node
passes, every score is 0 (backward compatible).

Pods with ``resourceClaims`` (DRA) are kube-scheduler's to allocate: its DynamicResources plugin picks
the devices and writes the claims, and an extender sees only the pod and node names, never the
devices. gpuaware does not second-guess that choice (docs/dra-scheduling.md, "Extender mode"): /filter
fails only nodes on which every GPU is critical or that are cordoned by gpuaware (per-device health
reaches kube-scheduler as device taints), /prioritize scores 0, and /preempt keeps kube-scheduler's
candidates as they are. Decisions use the same cluster cache and core
as the custom scheduler; nothing is reserved (kube-scheduler binds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress
from typing import Any

import numpy as np
from aiohttp import web
from kubernetes.client.exceptions import ApiException

from gpuaware.contract import annotations
from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS
from gpuaware.scheduler.core.framework import Decision, Scheduler
from gpuaware.scheduler.core.preemption import Running, fits_on_node
from gpuaware.scheduler.kube import objects
from gpuaware.scheduler.kube.cache import BAND_CRITICAL, ClusterCache
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.dra import claims as dra_claims
from gpuaware.scheduler.kube.extender import offload
from gpuaware.scheduler.kube.extender.access import Access
from gpuaware.scheduler.kube.extender.args import OFFLOAD_BYTES, BadRequest, meta_victims, parse
from gpuaware.scheduler.kube.extender.offload import node_name
from gpuaware.scheduler.kube.objects import PodSpecError
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
VERBS = ("filter", "prioritize", "preempt", "bind")
# How long a /filter waits for the /bind of the pod filtered before it (see ``_settle``): kube-scheduler
# sends that bind a few milliseconds after its scheduling cycle; the cap covers a cycle that ended
# without one (a Reserve or Permit plugin failed, the pod was deleted).
BIND_WAIT_S = 2.0
MIB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = int(SchedulerSettings.model_fields["extender_max_body_mib"].default * MIB)
UNKNOWN_NODE = "gpuaware: node unknown (not yet seen by the scheduler's cache)"
LAPSED_KEPT = 4096
LAPSING = web.AppKey("lapsing", asyncio.Task)


@dataclass
class Reservation:
    """What a ``one_node`` /filter reserved for its pod's /bind: the node kept, the pod as filtered, when."""

    node: str
    pod: dict[str, Any]
    at: float  # time.monotonic()


class Extender:
    def __init__(self, cache: ClusterCache, core: Callable[[], Scheduler], ready: Callable[[], bool], *,
                 stats: SchedulerStats | None = None, access: Access | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 calls: ApiCalls | None = None, bind_wait_s: float = BIND_WAIT_S, one_node: bool = False):
        """``calls``: the API client /bind writes Bindings with (without it /bind answers 500). ``one_node``:
        /filter keeps only the node the core picks for a gpuaware pod (``extender_one_node``)."""
        self.cache, self.core, self.ready, self.one_node = cache, core, ready, one_node
        self.access = access or Access()
        self.max_body_bytes = max_body_bytes
        self.requests: Counter = stats.extender_requests if stats is not None else Counter()  # (verb, status)
        self.calls, self.bind_wait_s = calls, bind_wait_s
        # Pods this extender kept nodes for whose /bind has not come yet: key -> (pod as filtered, its bind came).
        self._awaited: dict[str, tuple[dict[str, Any], asyncio.Event]] = {}
        # ``one_node``: pods whose GPUs their /filter reserved (assumed in the cache) until their /bind comes, or
        # ``bind_wait_s`` passes without one (``_lapse``), in the order reserved.
        self._reserved: dict[str, Reservation] = {}
        # Pods whose reservation lapsed, as filtered (the latest LAPSED_KEPT): a /bind that comes after all is decided
        # again for its node from them when the informer has not shown the pod yet.
        self._lapsed: dict[str, dict[str, Any]] = {}
        # The last /filter's ranking (pod UID, scores, reasons, the names it kept and their scores): its
        # /prioritize, next in the same scheduling cycle, scores from it rather than ranking every node again
        # (and, asked about the names it kept, as kube-scheduler does, without looking them up again).
        # kube-scheduler runs a cycle on one snapshot, one pod at a time, so this is the view it filtered on;
        # a /bind (which changes the model) drops it.
        self._ranked: tuple[str, np.ndarray, list[str], list[str], np.ndarray] | None = None

    @classmethod
    def from_settings(cls, cache: ClusterCache, core: Callable[[], Scheduler], ready: Callable[[], bool],
                      settings: SchedulerSettings, stats: SchedulerStats | None = None,
                      calls: ApiCalls | None = None) -> Extender:
        return cls(cache, core, ready, stats=stats, access=Access.from_settings(settings),
                   max_body_bytes=int(settings.extender_max_body_mib * MIB), calls=calls,
                   one_node=settings.extender_one_node)

    # ------------------------------------------------------------------ pure handlers (JSON in, JSON out)
    def _rank(self, pod: dict[str, Any], idx: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Each node's score for the pod (-inf: it cannot go there, or is not among the cache indices ``idx``, the
        nodes asked about) and why the nodes asked about failed; raises PodSpecError.

        Only the nodes asked about are ranked: kube-scheduler sends a share of them (percentageOfNodesToScore,
        about 40% of 1,213 nodes), and scoring the rest was most of a /filter's work."""
        return self.core().rank(self.cache.cluster, self.cache.parse(pod).workload, *self._scope(idx))

    def _scope(self, idx: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """(the cache's node mask, None when it has none; the nodes of cache indices ``idx`` as a mask): what the
        core's ``rank`` and ``schedule`` take as ``node_mask`` and ``among``."""
        among = np.zeros(len(self.cache.cluster), dtype=bool)
        among[idx[idx >= 0]] = True
        return (self.cache.node_mask if len(self.cache.node_mask) else None), among

    def _ranked_scores(self, pod: dict[str, Any], names: list[str]) -> np.ndarray:
        """The score of each of ``names`` (-inf: it cannot go there), from the ranking the pod's /filter just made
        (taken: used once), else from a new one; raises PodSpecError."""
        uid, ranked = pod.get("metadata", {}).get("uid"), self._ranked
        self._ranked = None
        if uid and ranked is not None and ranked[0] == uid:
            if names == ranked[3]:
                return ranked[4]
            # kube-scheduler asks /prioritize about nodes its /filter kept: the others were not ranked (-inf).
            return self._scores_of(self._indices(names), ranked[1])
        idx = self._indices(names)
        return self._scores_of(idx, self._rank(pod, idx)[0])

    def _indices(self, names: list[str]) -> np.ndarray:
        """The cache index of each of ``names``, -1 when unknown."""
        index = self.cache.cluster.index
        try:  # every name known: looked up by the dict's own method, not a Python-level loop
            return np.fromiter(map(index.__getitem__, names), dtype=np.int64, count=len(names))
        except KeyError:
            return np.fromiter((index.get(n, -1) for n in names), dtype=np.int64, count=len(names))

    @staticmethod
    def _scores_of(idx: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """The score of each node of cache indices ``idx`` (-inf where -1: unknown)."""
        out = np.full(len(idx), -np.inf)
        known = idx >= 0
        out[known] = scores[idx[known]]
        return out

    @staticmethod
    def _names(args: dict[str, Any]) -> list[str]:
        if args.get("NodeNames") is not None:
            return list(args["NodeNames"])
        return [node_name(n) for n in ((args.get("Nodes") or {}).get("items") or [])]

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        names = self._names(args)
        result: dict[str, Any] = {"Nodes": args.get("Nodes"), "NodeNames": args.get("NodeNames"),
                                  "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        if dra_claims.has_claims(pod):
            return self._filter_claim_pod(names, result)
        if not objects.is_gpuaware(pod):
            return result
        idx = self._indices(names)
        if self.one_node:
            return self._filter_one(pod, args, names, idx, result)
        try:
            scores, reasons = self._rank(pod, idx)
        except PodSpecError as exc:
            self._ranked = None
            return self._unresolvable(args, names, result, exc)
        node_scores = self._scores_of(idx, scores)
        fits = np.isfinite(node_scores)
        if fits.all():
            keep = names
        else:
            keep = list(compress(names, fits.tolist()))
            why = "gpuaware: " + ("; ".join(reasons) or "does not fit")
            failed = result["FailedNodes"]
            for pos in np.flatnonzero(~fits).tolist():
                # Health and capacity can change, so the failure is resolvable (kube may preempt for it).
                failed[names[pos]] = why if idx[pos] >= 0 else UNKNOWN_NODE
        uid = pod.get("metadata", {}).get("uid")
        self._ranked = (uid, scores, reasons, keep, node_scores[fits]) if uid else None
        return self._kept(args, keep, result)

    @staticmethod
    def _kept(args: dict[str, Any], keep: list[str], result: dict[str, Any]) -> dict[str, Any]:
        """``result`` answering with the nodes ``keep``, as names or as the Node objects asked about."""
        if args.get("NodeNames") is not None:
            result["NodeNames"] = keep
        else:
            nodes = args.get("Nodes") or {}
            kept = set(keep)
            result["Nodes"] = {**nodes, "items": [n for n in nodes.get("items") or [] if node_name(n) in kept]}
        return result

    @classmethod
    def _unresolvable(cls, args: dict[str, Any], names: list[str], result: dict[str, Any],
                      exc: PodSpecError) -> dict[str, Any]:
        # Unresolvable on every node, not an Error: kube-scheduler skips an ignorable extender's
        # Error (the pod would be bound as if gpuaware had no say) and otherwise reports only an
        # opaque scheduling error; this way the pod stays Pending as Unschedulable with our reason
        # in its PodScheduled condition, and no preemption is tried for it.
        result["FailedAndUnresolvableNodes"] = dict.fromkeys(names, f"gpuaware: invalid gpuaware request: {exc}")
        return cls._kept(args, [], result)

    def _filter_one(self, pod: dict[str, Any], args: dict[str, Any], names: list[str], idx: np.ndarray,
                    result: dict[str, Any]) -> dict[str, Any]:
        """``one_node``: the core's own cycle (``schedule``) over the nodes asked about keeps the node it picks, and
        the pod's GPUs there are held for its /bind from now on. kube-scheduler, left one feasible node, binds it
        without a scoring round, a few milliseconds later, while its next pod's cycle has begun: reserved now, that
        pod's /filter sees these GPUs taken without waiting for this /bind (``_settle``), and the /bind writes the
        Binding without deciding again. A /bind that does not come within ``bind_wait_s`` (a later plugin refused
        the node, the pod went) lets the reservation go (``_lapse``)."""
        self._ranked = None
        self._lapse(time.monotonic())
        key = objects.key(pod)
        if key in self._reserved:  # kube-scheduler tries the pod again: what its last /filter reserved goes first
            self._release(key)
        held = self.cache.running.get(key)
        if held is not None:
            # Its Binding is in flight (kube-scheduler gave up waiting for the /bind and tries the pod again) or
            # written: the node it holds is the answer, and deciding again would allocate it twice.
            node = self.cache.cluster.names[held.allocation.node]
            if key in self.cache.assumed:
                self._reserved[key] = Reservation(node, pod, time.monotonic())
            return self._kept(args, [node], result)
        try:
            w = self.cache.parse(pod).workload
        except PodSpecError as exc:
            return self._unresolvable(args, names, result, exc)
        c = self.cache.cluster
        d = self.core().schedule(c, w, *self._scope(idx))  # allocates in the model: the reservation
        if d.allocation is None:
            why = "gpuaware: " + ("; ".join(r.message for r in d.why) or "does not fit")
            result["FailedNodes"] = {n: why if i >= 0 else UNKNOWN_NODE
                                     for n, i in zip(names, idx.tolist(), strict=True)}
            return self._kept(args, [], result)
        self._assume(key, w, d)
        node = c.names[d.allocation.node]
        self._reserved[key] = Reservation(node, pod, time.monotonic())
        return self._kept(args, [node], result)

    def _assume(self, key: str, w: Any, d: Decision) -> None:
        self.cache.assume(key, Running(w, d.allocation, time.time(), 0.0, None))

    def _lapse(self, now: float) -> None:
        """Let go of the reservations whose /bind has not come within ``bind_wait_s``."""
        while self._reserved:
            key, r = next(iter(self._reserved.items()))
            if now - r.at < self.bind_wait_s:
                break  # in the order reserved: the rest are younger
            log.info("extender: no /bind for %s within %.1fs; the GPUs its /filter reserved on %s go back",
                     key, self.bind_wait_s, r.node)
            self._release(key)
            self._lapsed[key] = r.pod
            if len(self._lapsed) > LAPSED_KEPT:
                del self._lapsed[next(iter(self._lapsed))]

    def _release(self, key: str) -> None:
        self._reserved.pop(key, None)
        if key in self.cache.assumed:
            self.cache.forget(key)

    def _filter_claim_pod(self, names: list[str], result: dict[str, Any]) -> dict[str, Any]:
        """Health only: a node whose GPUs are all critical (or that gpuaware keeps free of new work) fails. A GPU
        critical for a device taint alone does not count: kube-scheduler's DynamicResources plugin keeps claims off
        it unless they tolerate the taint (or ask admin access), which the extender cannot see."""
        c = self.cache.cluster
        taint_only = self.cache.dra.taint_bands
        keep = []
        for name in names:
            i = c.index.get(name)
            if i is not None and c.gpu_count[i] and all(c.band[i, g] >= BAND_CRITICAL and (i, g) not in taint_only
                                                        for g in range(int(c.gpu_count[i]))):
                result["FailedNodes"][name] = "gpuaware: every GPU of the node is critical"
            elif i is not None and not self._takes_new_work(i):
                result["FailedNodes"][name] = "gpuaware: node takes no new work (cordoned or not ready)"
            else:
                keep.append(name)
        if result.get("NodeNames") is not None:
            result["NodeNames"] = keep
        else:
            nodes = result.get("Nodes") or {}
            kept = set(keep)
            result["Nodes"] = {**nodes, "items": [n for n in nodes.get("items") or [] if node_name(n) in kept]}
        return result

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        names = self._names(args)
        if dra_claims.has_claims(pod) or not objects.is_gpuaware(pod):
            return [{"Host": n, "Score": 0} for n in names]
        try:
            node_scores = self._ranked_scores(pod, names)
        except PodSpecError:
            return [{"Host": n, "Score": 0} for n in names]
        fits = np.isfinite(node_scores)
        points = np.zeros(len(names), dtype=np.int64)
        if fits.any():
            lo, hi = node_scores[fits].min(), node_scores[fits].max()
            points[fits] = MAX_EXTENDER_PRIORITY if hi == lo else \
                np.round((node_scores[fits] - lo) / (hi - lo) * MAX_EXTENDER_PRIORITY)
        # One pass in numpy, not per node in Python: kube-scheduler sends every feasible node (1,000s).
        return [{"Host": n, "Score": p} for n, p in zip(names, points.tolist(), strict=True)]

    def preempt(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        meta = args.get("NodeNameToMetaVictims") or {}
        if not meta and args.get("NodeNameToVictims"):
            meta = meta_victims(args["NodeNameToVictims"])
        if dra_claims.has_claims(pod) or not objects.is_gpuaware(pod):
            return {"NodeNameToMetaVictims": meta}
        try:
            w = self.cache.parse(pod).workload
        except PodSpecError:
            return {"NodeNameToMetaVictims": {}}
        c = self.cache.cluster
        by_uid = {p["metadata"].get("uid"): k for k, p in self.cache.pods.items()}
        keep = {}
        for node, victims in meta.items():
            i = c.index.get(node)
            if i is None or (len(self.cache.node_mask) and not self.cache.node_mask[i]):
                continue
            free = c.gpu_free[i].copy()
            cpu, mem = int(c.cpu_free[i]), int(c.mem_free[i])
            for v in victims.get("Pods") or []:
                r = self.cache.running.get(by_uid.get(v.get("UID"), ""))
                if r is None:
                    continue
                for g, m in zip(r.allocation.gpus, r.allocation.milli, strict=True):
                    free[g] += m
                cpu += r.allocation.cpu_milli
                mem += r.allocation.memory_mib
            free[~c.gpu_exists[i] | (c.band[i] >= BAND_CRITICAL)] = -1  # freed capacity on a critical GPU is no room
            if w.models and str(c.models[i]) not in w.models:
                continue
            if fits_on_node(free, cpu, mem, w):
                keep[node] = victims
        return {"NodeNameToMetaVictims": keep}

    # ------------------------------------------------------------------ binding (bindVerb)
    async def _settle(self, key: str) -> None:
        """Wait until every other pod this extender kept nodes for has had its /bind.

        kube-scheduler schedules one pod at a time but binds asynchronously, and it does not count
        ``gpuaware.io/gpu-milli``: without this, the next pod's /filter is answered before the last pod's
        GPUs are reserved, both are given the same GPU, and the second /bind finds no room."""
        waiting = [(k, ev) for k, (_, ev) in self._awaited.items() if k != key]
        deadline = time.monotonic() + self.bind_wait_s
        for k, ev in waiting:
            try:
                await asyncio.wait_for(ev.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                log.info("extender: no /bind for %s within %.1fs; its filter answer lapses", k, self.bind_wait_s)
                self._awaited.pop(k, None)

    def _expect_bind(self, args: dict[str, Any], result: dict[str, Any]) -> None:
        pod = args.get("Pod") or {}
        if not objects.is_gpuaware(pod):
            return
        key = objects.key(pod)
        kept = result["NodeNames"] if args.get("NodeNames") is not None else (result["Nodes"] or {}).get("items")
        if kept:
            self._awaited[key] = (pod, asyncio.Event())
        else:
            self._awaited.pop(key, None)

    async def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        """``ExtenderBindingResult``: the pod's GPUs on ``Node`` reserved in the cache, then one Binding
        (UID precondition) that carries them as annotations; ``{"Error"}`` when the node has no room left
        or the API refused. Pods gpuaware has nothing to say about are bound as they are."""
        if self.calls is None:
            raise RuntimeError("this extender has no API client to bind with")
        ns, name, uid, node = args["PodNamespace"], args["PodName"], args["PodUID"] or None, args["Node"]
        key = f"{ns}/{name}"
        self._lapse(time.monotonic())
        r = self._reserved.pop(key, None)
        if r is not None:
            filtered_uid = r.pod.get("metadata", {}).get("uid")
            if uid and filtered_uid and filtered_uid != uid:
                # A /bind from an earlier cycle, for a pod since replaced under the name: the reservation is the
                # current pod's and stays; the Binding's UID precondition would refuse this one anyway.
                self._reserved[key] = r
                return {"Error": f"gpuaware: /bind of {key} UID {uid}, but the pod filtered last is UID "
                                 f"{filtered_uid}"}
            held = self.cache.assumed.get(key)
            if held is not None and held.node == node and self._still_fits(held.running.allocation):
                return await self._write(key, ns, name, uid, node, held.running.allocation)
            # Not what was reserved (another node), or the node or a GPU of it may take no new work since: decided
            # again below, for this node, as it is now.
            return await self._bind(key, ns, name, uid, node, r.pod, lambda: None)
        lapsed = self._lapsed.pop(key, None)
        filtered, came = self._awaited.pop(key, (lapsed, asyncio.Event()))
        try:
            return await self._bind(key, ns, name, uid, node, filtered, came.set)
        finally:
            came.set()

    def _still_fits(self, allocation: Any) -> bool:
        """The node of a reservation still takes new work and none of its GPUs became critical since."""
        i = allocation.node
        return self._takes_new_work(i) and not any(self.cache.cluster.band[i, g] >= BAND_CRITICAL
                                                   for g in allocation.gpus)

    def _takes_new_work(self, i: int) -> bool:
        """Node ``i`` is not cordoned, not NotReady, nor kept free of new work (the cache's node mask)."""
        return not len(self.cache.node_mask) or bool(self.cache.node_mask[i])

    async def _bind(self, key: str, ns: str, name: str, uid: str | None, node: str,
                    filtered: dict[str, Any] | None, reserved: Callable[[], None]) -> dict[str, Any]:
        """``reserved()`` once the model holds the pod's GPUs: the next /filter need not wait for the API."""
        pod = self.cache.pods.get(key)
        if pod is None or (uid and pod["metadata"].get("uid") != uid):
            pod = filtered  # kube-scheduler's watch may be ahead of ours
        if pod is not None and objects.is_gpuaware(pod):
            c = self.cache.cluster
            i = c.index.get(node)
            if i is None:
                return {"Error": f"gpuaware: node {node} unknown (not yet seen by the scheduler's cache)"}
            if key in self.cache.running and key not in self.cache.assumed:
                return {"Error": f"gpuaware: {key} is bound already"}
            if key in self.cache.assumed:  # a retried bind: its earlier reservation goes first
                self.cache.forget(key)
            w = self.cache.parse(pod).workload
            only = np.zeros(len(c), dtype=bool)
            only[i] = True
            if len(self.cache.node_mask):
                only &= self.cache.node_mask
            d = self.core().schedule(c, w, only)  # allocates in the model: the next /filter sees it
            if d.allocation is None:
                why = "; ".join(d.reasons)
                return {"Error": f"gpuaware: {node} has no room left for {key} ({why})"}
            self._assume(key, w, d)
            self._ranked = None  # ranked before this reservation
            reserved()
            return await self._write(key, ns, name, uid, node, d.allocation)
        return await self._write(key, ns, name, uid, node, None)

    async def _write(self, key: str, ns: str, name: str, uid: str | None, node: str,
                     allocation: Any) -> dict[str, Any]:
        """The Binding, carrying ``allocation`` (held in the model as ``key``'s; None: a pod gpuaware has no say
        about) as annotations; the allocation is let go if the API refuses."""
        ann: dict[str, str] = {}
        if allocation is not None:
            ann = {annotations.ANN_GPUS: objects.gpus_annotation(allocation, {}),
                   annotations.ANN_SHARING: objects.sharing_annotation(allocation)}
        try:
            await self.calls.call(self.calls.api.bind, ns, name, node, ann, uid)
        except ApiException as exc:
            code, _, message = self.calls.failed("bind", exc)
            self._withdraw(key, ann)
            return {"Error": f"gpuaware: binding {key} to {node}: {code} {message}"}
        except TRANSPORT_ERRORS as exc:
            self.calls.stats.api_errors[("bind", 0)] += 1
            self._withdraw(key, ann)
            return {"Error": f"gpuaware: binding {key} to {node}: {exc}"}
        except BaseException:  # cancelled, or the API threads shut down: nothing may stay held for it
            self._withdraw(key, ann)
            raise
        return {"Error": ""}

    def _withdraw(self, key: str, ann: dict[str, str]) -> None:
        if ann:
            self.cache.forget(key)

    # ------------------------------------------------------------------ HTTP
    async def _lapsing(self) -> None:
        """While served: reservations lapse on time even when no /filter or /bind comes to let them go."""
        while True:
            await asyncio.sleep(self.bind_wait_s / 2)
            self._lapse(time.monotonic())

    async def _start_lapsing(self, app: web.Application) -> None:
        app[LAPSING] = asyncio.get_running_loop().create_task(self._lapsing())

    async def _stop_lapsing(self, app: web.Application) -> None:
        app[LAPSING].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await app[LAPSING]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        if self.one_node:
            app.on_startup.append(self._start_lapsing)
            app.on_cleanup.append(self._stop_lapsing)
        app.add_routes([web.post(f"/{verb}", self._serve) for verb in VERBS]
                       + [web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)])
        return app

    async def _serve(self, request: web.Request) -> web.Response:
        verb = request.path.strip("/")
        status, payload = await self._answer(verb, request)
        self.requests[(verb, status)] += 1
        if status != 200:
            # kube-scheduler logs the status code only; the reason is in our log.
            log.log(logging.ERROR if status >= 500 else logging.WARNING, "extender /%s: %d %s", verb, status,
                    payload["Error"])
        # orjson: an answer echoing an 8 MiB NodeList (nodeCacheCapable: false) took json ~70 ms holding the GIL;
        # a large body's nodes are echoed as the bytes they came in (offload.RawNode). Other tasks run between
        # making such an answer and writing it, so the two do not add up to one stall. Any other answer is written
        # at once: kube-scheduler waits for /filter inside its one-pod-at-a-time cycle, and whatever else was
        # ready (informer events, /bind completions) would run first, on that wait.
        if isinstance(payload, dict) and payload.get("Nodes"):
            await asyncio.sleep(0)
        body = offload.dumps(payload)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        response = web.Response(body=body, status=status, content_type="application/json", headers=headers)
        if status in (401, 413, 503):
            # The body stays unread: answer, then close at once rather than linger reading what we refused.
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
        return response

    async def _answer(self, verb: str, request: web.Request) -> tuple[int, Any]:
        """(HTTP status, JSON answer)."""
        refusal = self.access.refusal(request)
        if refusal is not None:
            return 401, {"Error": refusal}
        if not self.ready():
            return 503, {"Error": "gpuaware extender not ready: its cluster cache is still catching up"}
        too_large = 413, {"Error": f"request body over {self.max_body_bytes} bytes (scheduler.extender_max_body_mib;"
                                   " nodeCacheCapable: true keeps requests small)"}
        if (request.content_length or 0) > self.max_body_bytes:
            return too_large  # before reading a byte of it
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return too_large
        try:
            if len(body) > OFFLOAD_BYTES:  # a NodeList of hundreds of nodes: parsed in a worker process
                args = await offload.parse_large(body, verb)
            else:
                args = parse(body, verb)
        except BadRequest as exc:
            return 400, {"Error": f"bad {verb} request: {exc}"}
        except Exception as exc:  # the parsing worker process died
            log.exception("extender /%s: parsing the body failed", verb)
            return 500, {"Error": f"gpuaware extender: {type(exc).__name__}: {exc}"}
        try:
            if verb == "bind":
                return 200, await self.bind(args)
            # Without one_node the GPUs are reserved at /bind, and the next /filter waits for the last one's.
            settle = verb == "filter" and not self.one_node
            if settle and objects.is_gpuaware(args["Pod"]):
                await self._settle(objects.key(args["Pod"]))
            answer = getattr(self, verb)(args)
            if settle:
                self._expect_bind(args, answer)
            return 200, answer
        except Exception as exc:
            log.exception("extender /%s failed", verb)
            return 500, {"Error": f"gpuaware extender: {type(exc).__name__}: {exc}"}

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        return web.Response(text="ready") if self.ready() else web.Response(text="catching up", status=503)
