"""The scheduler extender: kube-scheduler keeps scheduling and asks gpuaware about GPUs.

kube-scheduler POSTs its extender arguments as JSON (k8s.io/kube-scheduler/extender/v1, Go field
names): ``/filter`` gets ``ExtenderArgs`` (``Pod``, ``Nodes`` or ``NodeNames``) and answers an
``ExtenderFilterResult`` (``Nodes``/``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``); ``/prioritize`` answers a ``HostPriorityList`` (``[{"Host", "Score"}]``, 0-10);
``/preempt`` gets ``ExtenderPreemptionArgs`` and answers ``ExtenderPreemptionResult`` with the
candidate nodes where evicting the proposed victims would really make room on healthy GPUs.

Pods that ask for no GPU and carry no gpuaware annotation pass through untouched: every node
passes, every score is 0 (backward compatible). Decisions use the same cluster cache and core
as the custom scheduler; nothing is reserved (kube-scheduler binds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from aiohttp import web

from scheduler.core.framework import Scheduler
from scheduler.core.preemption import fits_on_node
from scheduler.kube import objects
from scheduler.kube.cache import ClusterCache
from scheduler.kube.objects import PodSpecError

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10


class Extender:
    def __init__(self, cache: ClusterCache, core: Callable[[], Scheduler], ready: Callable[[], bool]):
        self.cache, self.core, self.ready = cache, core, ready
        self.requests: dict[str, int] = {}

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
        if not objects.is_gpuaware(pod):
            return result
        try:
            scores, reasons = self._rank(pod)
        except PodSpecError as exc:
            result["Error"] = f"invalid gpuaware request: {exc}"
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

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        names = self._names(args)
        if not objects.is_gpuaware(pod):
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
        if not objects.is_gpuaware(pod):
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
        app = web.Application(client_max_size=64 * 1024 * 1024)  # a 5,000-node NodeList is tens of MiB
        app.add_routes([web.post("/filter", self._post(self.filter)), web.post("/prioritize",
                                                                                self._post(self.prioritize)),
                        web.post("/preempt", self._post(self.preempt)), web.get("/healthz", self._healthz),
                        web.get("/readyz", self._readyz)])
        return app

    def _post(self, handler: Callable[[dict[str, Any]], Any]):
        async def serve(request: web.Request) -> web.Response:
            self.requests[request.path] = self.requests.get(request.path, 0) + 1
            try:
                args = await request.json()
            except ValueError:
                return web.json_response({"Error": "request body is not JSON"}, status=400)
            if not isinstance(args, dict):
                return web.json_response({"Error": "request body is not a JSON object"}, status=400)
            try:
                return web.json_response(handler(args))
            except Exception as exc:  # kube-scheduler shows Error; an ignorable extender is then skipped
                log.exception("extender %s failed", request.path)
                return web.json_response({"Error": f"gpuaware extender: {exc}"}, status=200)
        return serve

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        return web.Response(text="ready") if self.ready() else web.Response(text="catching up", status=503)
