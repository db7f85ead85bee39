"""The extender path's own ceiling for ``gpuaware bench scheduler``: kube-scheduler with an extender that decides
nothing.

The same KubeSchedulerConfiguration as the ``extender`` mode (``nodeCacheCapable``, ``bindVerb``), the same
aiohttp server and API client, but /filter keeps the first node kube-scheduler names (one node: kube-scheduler
binds without a scoring round, as with ``extender_one_node``) and /bind writes the Binding on an API thread, the
pod's UID as precondition, and nothing else: no cache, no core, no Event. What kube-scheduler reaches with it is
the most pods/s this machine gives kube-scheduler through one Python extender hop per pod, so the ``extender``
mode is read against it as ``gpuaware`` is read against ``ceiling``.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from aiohttp import web
from kubernetes.client.exceptions import ApiException

from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, KubeApi


class CeilingExtender:
    """/filter: the first node named; /bind: the Binding; /prioritize and /preempt: kube-scheduler's own."""

    def __init__(self, api: KubeApi, workers: int):
        self.api = api
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ceiling-extender-bind")
        self.bound = 0
        self.failed = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 << 20)
        app.add_routes([web.post("/filter", self._filter), web.post("/prioritize", self._prioritize),
                        web.post("/preempt", self._preempt), web.post("/bind", self._bind)])
        return app

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _json(payload: Any) -> web.Response:
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def _filter(self, request: web.Request) -> web.Response:
        names = orjson.loads(await request.read()).get("NodeNames") or []
        return self._json({"NodeNames": names[:1], "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                           "Error": ""})

    async def _prioritize(self, request: web.Request) -> web.Response:
        names = orjson.loads(await request.read()).get("NodeNames") or []
        return self._json([{"Host": n, "Score": 0} for n in names])

    async def _preempt(self, request: web.Request) -> web.Response:
        args = orjson.loads(await request.read())
        return self._json({"NodeNameToMetaVictims": args.get("NodeNameToMetaVictims") or {}})

    async def _bind(self, request: web.Request) -> web.Response:
        args: dict[str, Any] = orjson.loads(await request.read())
        call = (args["PodNamespace"], args["PodName"], args["Node"], None, args.get("PodUID") or None)
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self.api.bind, *call)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            self.failed += 1
            return self._json({"Error": f"bind failed: {exc}"})
        self.bound += 1
        return self._json({"Error": ""})
