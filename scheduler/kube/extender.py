"""The scheduler extender: kube-scheduler keeps scheduling and asks gpuaware about GPUs.

kube-scheduler POSTs its extender arguments as JSON (k8s.io/kube-scheduler/extender/v1, Go field
names). With ``nodeCacheCapable: true`` (shipped) they carry only ``NodeNames`` and gpuaware reads
the nodes from its own informer cache; with ``false`` they carry every ``Node`` (``Nodes``) and the
answer echoes the kept ones. What each verb answers (docs/scheduler.md, "Extender"):

- ``/filter`` → 200 ``ExtenderFilterResult``: ``NodeNames`` (or ``Nodes``) that pass, the others in
  ``FailedNodes`` with the core's reason (resolvable: health and capacity change, preemption may
  help); a pod whose gpuaware request cannot be scheduled as written fails every node in
  ``FailedAndUnresolvableNodes`` with the reason (it stays Pending, Unschedulable, with that message;
  an ``Error`` would be skipped by an ``ignorable`` kube-scheduler extender and the pod bound anyway).
- ``/prioritize`` → 200 ``HostPriorityList``, 0-10 (an invalid gpuaware request scores 0 everywhere).
- ``/preempt`` → 200 ``ExtenderPreemptionResult``: the nodes where evicting the proposed victims
  really makes room on healthy GPUs. The type has no ``Error``: a 200 always means "these candidates".
- Any verb: 400 ``{"Error"}`` for a body that is not what kube-scheduler sends (extender_args),
  401 unauthenticated (extender_access), 413 over ``extender_max_body_mib``, 500 ``{"Error"}`` when
  gpuaware itself fails. kube-scheduler's ``HTTPExtender.send()`` turns every non-200 into an error,
  and an ``ignorable`` extender's errors are skipped (logged), so a failure never reads as an answer.

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
import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from aiohttp import web

from scheduler.core.framework import Scheduler
from scheduler.core.preemption import fits_on_node
from scheduler.kube import dra_claims, objects
from scheduler.kube.cache import ClusterCache
from scheduler.kube.extender_access import Access
from scheduler.kube.extender_args import OFFLOAD_BYTES, BadRequest, parse
from scheduler.kube.objects import PodSpecError
from scheduler.metrics import SchedulerStats
from scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
VERBS = ("filter", "prioritize", "preempt")
MIB = 1024 * 1024


class Extender:
    def __init__(self, cache: ClusterCache, core: Callable[[], Scheduler], ready: Callable[[], bool], *,
                 stats: SchedulerStats | None = None, access: Access | None = None, max_body_bytes: int = 8 * MIB):
        self.cache, self.core, self.ready = cache, core, ready
        self.access = access or Access()
        self.max_body_bytes = max_body_bytes
        self.requests: Counter = stats.extender_requests if stats is not None else Counter()  # (verb, status)

    @classmethod
    def from_settings(cls, cache: ClusterCache, core: Callable[[], Scheduler], ready: Callable[[], bool],
                      settings: SchedulerSettings, stats: SchedulerStats | None = None) -> Extender:
        return cls(cache, core, ready, stats=stats, access=Access.from_settings(settings),
                   max_body_bytes=int(settings.extender_max_body_mib * MIB))

    # ------------------------------------------------------------------ pure handlers (JSON in, JSON out)
    def _rank(self, pod: dict[str, Any]) -> tuple[np.ndarray, list[str]]:
        """Every node's score for the pod (-inf: it cannot go there) and why nodes failed; raises PodSpecError."""
        mask = self.cache.node_mask if len(self.cache.node_mask) else None
        return self.core().rank(self.cache.cluster, self.cache.parse(pod).workload, mask)

    @staticmethod
    def _names(args: dict[str, Any]) -> list[str]:
        if args.get("NodeNames") is not None:
            return list(args["NodeNames"])
        return [n["metadata"]["name"] for n in ((args.get("Nodes") or {}).get("items") or [])]

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        names = self._names(args)
        result: dict[str, Any] = {"Nodes": args.get("Nodes"), "NodeNames": args.get("NodeNames"),
                                  "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        if dra_claims.has_claims(pod):
            return self._filter_claim_pod(names, result)
        if not objects.is_gpuaware(pod):
            return result
        try:
            scores, reasons = self._rank(pod)
        except PodSpecError as exc:
            # Unresolvable on every node, not an Error: kube-scheduler skips an ignorable extender's
            # Error (the pod would be bound as if gpuaware had no say) and otherwise reports only an
            # opaque scheduling error; this way the pod stays Pending as Unschedulable with our reason
            # in its PodScheduled condition, and no preemption is tried for it.
            why = f"gpuaware: invalid gpuaware request: {exc}"
            result["FailedAndUnresolvableNodes"] = dict.fromkeys(names, why)
            if args.get("NodeNames") is not None:
                result["NodeNames"] = []
            else:
                result["Nodes"] = {**(args.get("Nodes") or {}), "items": []}
            return result
        c = self.cache.cluster
        why = "; ".join(reasons) or "does not fit"
        keep = []
        for name in names:
            i = c.index.get(name)
            if i is None:
                result["FailedNodes"][name] = "gpuaware: node unknown (not yet seen by the scheduler's cache)"
            elif not np.isfinite(scores[i]):
                # Health and capacity can change, so the failure is resolvable (kube may preempt for it).
                result["FailedNodes"][name] = f"gpuaware: {why}"
            else:
                keep.append(name)
        if args.get("NodeNames") is not None:
            result["NodeNames"] = keep
        else:
            nodes = args.get("Nodes") or {}
            kept = set(keep)
            result["Nodes"] = {**nodes, "items": [n for n in nodes.get("items") or [] if n["metadata"]["name"] in kept]}
        return result

    def _filter_claim_pod(self, names: list[str], result: dict[str, Any]) -> dict[str, Any]:
        """Health only: a node whose GPUs are all critical (or that gpuaware keeps free of new work) fails."""
        c = self.cache.cluster
        keep = []
        for name in names:
            i = c.index.get(name)
            if i is not None and c.gpu_count[i] and (c.band[i, : c.gpu_count[i]] >= 2).all():
                result["FailedNodes"][name] = "gpuaware: every GPU of the node is critical"
            elif i is not None and len(self.cache.node_mask) and not self.cache.node_mask[i]:
                result["FailedNodes"][name] = "gpuaware: node takes no new work (cordoned or not ready)"
            else:
                keep.append(name)
        if result.get("NodeNames") is not None:
            result["NodeNames"] = keep
        else:
            nodes = result.get("Nodes") or {}
            kept = set(keep)
            result["Nodes"] = {**nodes, "items": [n for n in nodes.get("items") or [] if n["metadata"]["name"] in kept]}
        return result

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        names = self._names(args)
        if dra_claims.has_claims(pod) or not objects.is_gpuaware(pod):
            return [{"Host": n, "Score": 0} for n in names]
        try:
            scores, _ = self._rank(pod)
        except PodSpecError:
            return [{"Host": n, "Score": 0} for n in names]
        c = self.cache.cluster
        known = [scores[c.index[n]] for n in names if n in c.index and np.isfinite(scores[c.index[n]])]
        lo, hi = (min(known), max(known)) if known else (0.0, 0.0)
        out = []
        for n in names:
            i = c.index.get(n)
            s = scores[i] if i is not None else -np.inf
            score = 0 if not np.isfinite(s) else MAX_EXTENDER_PRIORITY if hi == lo else \
                round((s - lo) / (hi - lo) * MAX_EXTENDER_PRIORITY)
            out.append({"Host": n, "Score": int(score)})
        return out

    def preempt(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        meta = args.get("NodeNameToMetaVictims") or {}
        if not meta and args.get("NodeNameToVictims"):
            meta = {n: {"Pods": [{"UID": p["metadata"]["uid"]} for p in (v.get("Pods") or [])],
                        "NumPDBViolations": v.get("NumPDBViolations", 0)}
                    for n, v in args["NodeNameToVictims"].items()}
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
            free[~c.gpu_exists[i] | (c.band[i] >= 2)] = -1  # freed capacity on a critical GPU is no room
            if w.models and str(c.models[i]) not in w.models:
                continue
            if fits_on_node(free, cpu, mem, w):
                keep[node] = victims
        return {"NodeNameToMetaVictims": keep}

    # ------------------------------------------------------------------ HTTP
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.add_routes([web.post(f"/{verb}", self._serve) for verb in VERBS]
                       + [web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)])
        return app

    async def _serve(self, request: web.Request) -> web.Response:
        verb = request.path.strip("/")
        status, payload, large = await self._answer(verb, request)
        self.requests[(verb, status)] += 1
        if status != 200:
            # kube-scheduler logs the status code only; the reason is in our log.
            log.log(logging.ERROR if status >= 500 else logging.WARNING, "extender /%s: %d %s", verb, status,
                    payload["Error"])
        if large:  # the answer echoes a large NodeList (nodeCacheCapable: false)
            text = await asyncio.get_running_loop().run_in_executor(None, json.dumps, payload)
        else:
            text = json.dumps(payload)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        response = web.Response(text=text, status=status, content_type="application/json", headers=headers)
        if status in (401, 413):
            # The body stays unread: answer, then close at once rather than linger reading what we refused.
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
        return response

    async def _answer(self, verb: str, request: web.Request) -> tuple[int, Any, bool]:
        """(HTTP status, JSON answer, whether the body was large enough to serialise the answer off the loop)."""
        refusal = self.access.refusal(request)
        if refusal is not None:
            return 401, {"Error": refusal}, False
        too_large = 413, {"Error": f"request body over {self.max_body_bytes} bytes (scheduler.extender_max_body_mib;"
                                   " nodeCacheCapable: true keeps requests small)"}, False
        if (request.content_length or 0) > self.max_body_bytes:
            return too_large  # before reading a byte of it
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return too_large
        large = len(body) > OFFLOAD_BYTES
        try:
            if large:  # a NodeList of hundreds of nodes: not on the loop
                args = await asyncio.get_running_loop().run_in_executor(None, parse, body)
            else:
                args = parse(body)
        except BadRequest as exc:
            return 400, {"Error": f"bad {verb} request: {exc}"}, large
        try:
            return 200, getattr(self, verb)(args), large
        except Exception as exc:
            log.exception("extender /%s failed", verb)
            return 500, {"Error": f"gpuaware extender: {type(exc).__name__}: {exc}"}, large

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        return web.Response(text="ready") if self.ready() else web.Response(text="catching up", status=503)
