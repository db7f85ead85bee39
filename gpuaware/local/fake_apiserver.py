"""A small, faithful fake of the kube-apiserver, for tests and benchmarks (no apiserver can run here).

It speaks the real REST paths, JSON and semantics the scheduler relies on, so the real
``kubernetes`` client drives it unchanged:

- ``/api/v1/...`` and ``/apis/{group}/{version}/...``, cluster-scoped and namespaced, for pods,
  nodes, namespaces, events, leases, PodDisruptionBudgets and gpuaware's GPUQueue/GPUWorkload;
- list (``metadata.resourceVersion``), get, create (409 AlreadyExists), replace (409 Conflict on a
  stale ``metadata.resourceVersion``), merge / strategic-merge patch (maps merged, lists replaced but
  a strategic merge's ``status.conditions``, merged on ``type``; ``null`` deletes), delete; field
  selectors on ``metadata.name``/``metadata.namespace``/``spec.nodeName``/``spec.schedulerName``/
  ``status.phase`` with ``=``, ``==``, ``!=``;
- watch as a chunked stream of JSON lines (``ADDED``/``MODIFIED``/``DELETED``; with a field selector, an object
  that stops matching leaves as ``DELETED`` with its previous state, one that starts matching enters as
  ``ADDED``, as kube-apiserver's watch cache does), ``BOOKMARK`` events
  with ``allowWatchBookmarks``, ``timeoutSeconds``, and ``ERROR`` with a 410 ``Expired`` Status when
  the asked ``resourceVersion`` is older than the retained event window (as after etcd compaction);
- the ``pods/binding`` subresource (409 Conflict when the pod is already assigned to a node, or
  when the Binding's ``metadata.uid``/``resourceVersion`` preconditions do not match the pod; the
  Binding's annotations are set on the pod with its node, as kube-apiserver does) and
  ``pods/eviction`` (policy/v1; 429 TooManyRequests when a matching PodDisruptionBudget allows no
  disruption, else the pod is deleted), and ``/status`` subresources.

Errors are ``Status`` objects with the real reasons and codes.

Size: one module on purpose (~560 lines): the object store, its watch fan-out and the HTTP routes are
one stand-in whose semantics (resourceVersion, 409/410, Binding and Eviction rules) must stay consistent;
it is a test double, kept out of the component packages.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Resource:
    group: str  # "" = core
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = [
    Resource("", "v1", "pods", "Pod", True),
    Resource("", "v1", "nodes", "Node", False),
    Resource("", "v1", "namespaces", "Namespace", False),
    Resource("", "v1", "events", "Event", True),
    Resource("events.k8s.io", "v1", "events", "Event", True),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    Resource("gpuaware.io", "v1alpha1", "gpuqueues", "GPUQueue", False),
    Resource("gpuaware.io", "v1alpha1", "gpuworkloads", "GPUWorkload", True),
    Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False),
    Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True),
    Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False),
]
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "details": self.details, "code": self.code}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (also used for strategic merge: lists are replaced, which is what a
    strategic merge does for lists without a patch strategy, such as annotations' values)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _field(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _selector_matches(obj: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if _field(obj, k.strip()) == v.strip():
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if _field(obj, k.strip()) != v.strip():
                return False
    return True


def _selected(rv: int, kind: str, obj: dict[str, Any], prev: dict[str, Any] | None,
              selector: str | None) -> dict[str, Any] | None:
    """A change as a watch with ``selector`` sees it, as kube-apiserver's: an object that stops matching leaves as
    ``DELETED`` with its previous state (at the event's resourceVersion), one that starts matching enters as
    ``ADDED``; None when it matched neither before nor after."""
    now_in = _selector_matches(obj, selector)
    was_in = kind == "MODIFIED" and prev is not None and _selector_matches(prev, selector)
    if kind == "MODIFIED" and now_in != was_in:
        if now_in:
            return {"type": "ADDED", "object": obj}
        assert prev is not None
        return {"type": "DELETED", "object": {**prev, "metadata": {**prev["metadata"], "resourceVersion": str(rv)}}}
    return {"type": kind, "object": obj} if now_in else None


def _labels_match(labels: dict[str, str], selector: dict[str, Any]) -> bool:
    if all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        for expr in selector.get("matchExpressions") or []:
            value, op, values = labels.get(expr["key"]), expr["operator"], expr.get("values") or []
            if (op == "In" and value not in values) or (op == "NotIn" and value in values) or \
                    (op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
                return False
        return True
    return False


class Store:
    """Objects plus the event log watches read from; one lock, one resourceVersion counter."""

    def __init__(self, window: int = 50_000):
        self.objects: dict[tuple[Resource, str, str], dict[str, Any]] = {}
        self.rv = 1
        self.window = window
        self.log: list[tuple] = []  # (rv, resource, kind, object, previous object), in resourceVersion order
        self.cond = threading.RLock()  # writes come from the server's loop and from test code
        self.on_change: Any = None  # called (under the lock) after every event, to wake watches
        self.requests: dict[str, int] = {}
        self.bound_at: dict[str, float] = {}  # pod key -> time.monotonic() of its binding (for benchmarks)

    # -------------------------------------------------------------- writes (hold the lock)
    # A committed object is never changed in place: every write builds a new dict (sharing untouched
    # subtrees), so the event log and readers hold references instead of copies.
    def _emit(self, res: Resource, kind: str, obj: dict[str, Any], prev: dict[str, Any] | None = None) -> None:
        self.log.append((self.rv, res, kind, obj, prev))
        if len(self.log) > 2 * self.window:  # compaction: keep the newest ``window`` events
            del self.log[: len(self.log) - self.window]
        if self.on_change is not None:
            self.on_change()

    def _commit(self, res: Resource, ns: str, name: str, new: dict[str, Any], kind: str = "MODIFIED"):
        new["metadata"] = dict(new["metadata"])
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        prev = self.objects.get((res, ns, name))
        self.objects[(res, ns, name)] = new
        self._emit(res, kind, new, prev)
        return new

    def create(self, res: Resource, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.cond:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            name = meta.get("name")
            if not name:
                raise ApiError(422, "Invalid", f"{res.kind} \"\" is invalid: metadata.name: Required value")
            if (res, ns, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{res.plural} "{name}" already exists',
                               {"name": name, "kind": res.plural})
            if res.namespaced:
                meta["namespace"] = ns
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            if res.kind == "Pod":
                obj.setdefault("status", {}).setdefault("phase", "Pending")
                obj.setdefault("spec", {}).setdefault("schedulerName", "default-scheduler")
            return self._commit(res, ns, name, obj, "ADDED")

    def get(self, res: Resource, ns: str, name: str) -> dict[str, Any]:
        with self.cond:
            return self._get(res, ns, name)

    def _get(self, res: Resource, ns: str, name: str) -> dict[str, Any]:
        try:
            return self.objects[(res, ns, name)]
        except KeyError:
            raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found',
                           {"name": name, "kind": res.plural}) from None

    def _check_version(self, res: Resource, name: str, old: dict[str, Any], body: dict[str, Any]) -> None:
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.plural} "{name}": the object '
                           "has been modified; please apply your changes to the latest version and try again",
                           {"name": name, "kind": res.plural})

    def replace(self, res: Resource, ns: str, name: str, obj: dict[str, Any], status_only: bool = False):
        with self.cond:
            old = self._get(res, ns, name)
            self._check_version(res, name, old, obj)
            if status_only:
                new = {**old, "status": copy.deepcopy(obj.get("status"))}
            else:
                new = copy.deepcopy(obj)
                new["metadata"] = {**(new.get("metadata") or {}),
                                   **{k: old["metadata"][k] for k in ("uid", "creationTimestamp", "namespace")
                                      if k in old["metadata"]}}
                new["apiVersion"], new["kind"] = res.api_version, res.kind
                if new.get("spec") != old.get("spec"):
                    new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            return self._commit(res, ns, name, new)

    def patch(self, res: Resource, ns: str, name: str, patch: dict[str, Any], status_only: bool = False,
              strategic: bool = False):
        with self.cond:
            old = self._get(res, ns, name)
            self._check_version(res, name, old, patch)
            if status_only:
                patch = {"status": patch.get("status")}
            new = merge_patch(old, patch)
            conditions = (patch.get("status") or {}).get("conditions")
            if strategic and isinstance(conditions, list):
                # status.conditions has a patch strategy, merge on type: a condition patched alone leaves the
                # others (the kubelet's Ready) as they are.
                by_type = {c.get("type"): c for c in conditions}
                kept = [by_type.pop(c.get("type"), c) for c in (old.get("status") or {}).get("conditions") or []]
                new["status"]["conditions"] = [*kept, *by_type.values()]
            new["metadata"] = {**new["metadata"], **{k: old["metadata"][k] for k in
                                                     ("uid", "creationTimestamp", "namespace", "name")
                                                     if k in old["metadata"]}}
            return self._commit(res, ns, name, new)

    def delete(self, res: Resource, ns: str, name: str) -> dict[str, Any]:
        with self.cond:
            obj = self._get(res, ns, name)
            del self.objects[(res, ns, name)]
            self.rv += 1
            gone = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
            self._emit(res, "DELETED", gone)
            return gone

    def bind(self, ns: str, name: str, binding: dict[str, Any], run: bool) -> None:
        pods = BY_PATH[("", "v1", "pods")]
        with self.cond:
            pod = self._get(pods, ns, name)
            target = (binding.get("target") or {}).get("name")
            if not target:
                raise ApiError(422, "Invalid", "Binding.target.name: Required value")
            _check_preconditions(ns, name, pod, binding.get("metadata") or {})
            if pod.get("spec", {}).get("nodeName"):
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} '
                               f'is already assigned to node "{pod["spec"]["nodeName"]}"',
                               {"name": name, "kind": "pods/binding"})
            status = dict(pod.get("status") or {})
            status["conditions"] = [*(status.get("conditions") or []),
                                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}]
            if run:  # the kubelet's part, for tests that need running pods
                status["phase"] = "Running"
            # As kube-apiserver does: the Binding's annotations land on the pod together with its node.
            meta = pod["metadata"]
            extra = (binding.get("metadata") or {}).get("annotations") or {}
            if extra:
                meta = {**meta, "annotations": {**(meta.get("annotations") or {}), **extra}}
            self._commit(pods, ns, name, {**pod, "metadata": meta, "spec": {**pod["spec"], "nodeName": target},
                                          "status": status})
            self.bound_at[f"{ns}/{name}"] = time.monotonic()

    def evict(self, ns: str, name: str) -> None:
        pods = BY_PATH[("", "v1", "pods")]
        pdbs = BY_PATH[("policy", "v1", "poddisruptionbudgets")]
        with self.cond:
            pod = self._get(pods, ns, name)
            labels = pod["metadata"].get("labels") or {}
            for (res, pns, _), pdb in list(self.objects.items()):
                if res != pdbs or pns != ns or not _labels_match(labels, pdb["spec"].get("selector") or {}):
                    continue
                covered = [o for (r, ons, _), o in self.objects.items() if r == pods and ons == ns
                           and _labels_match(o["metadata"].get("labels") or {}, pdb["spec"].get("selector") or {})]
                healthy = sum(1 for o in covered if o.get("status", {}).get("phase") == "Running")
                spec = pdb["spec"]
                if "minAvailable" in spec:
                    allowed = healthy - int(spec["minAvailable"])
                else:
                    allowed = int(spec.get("maxUnavailable", 1)) - (len(covered) - healthy)
                if allowed < 1:
                    raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                   "disruption budget.", {"causes": [{
                                       "reason": "DisruptionBudget",
                                       "message": f"The disruption budget {pdb['metadata']['name']} needs "
                                                  f"{spec.get('minAvailable', len(covered) - 1)} healthy pods "
                                                  f"and has {healthy} currently"}]})
            self.delete(pods, ns, name)

    # -------------------------------------------------------------- reads
    def list(self, res: Resource, ns: str | None, selector: str | None) -> tuple[list[dict[str, Any]], int]:
        with self.cond:
            items = [o for (r, ons, _), o in self.objects.items()
                     if r == res and (ns is None or ons == ns) and _selector_matches(o, selector)]
            return items, self.rv

    def events_after(self, rv: int, res: Resource, ns: str | None):
        """Events newer than ``rv`` for ``res`` and the head version; 410 when ``rv`` fell out of the window."""
        with self.cond:
            if self.log and len(self.log) >= self.window and rv < self.log[0][0] - 1 and rv < self.rv:
                raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.log[0][0] - 1})")
            lo, hi = 0, len(self.log)
            while lo < hi:  # the log is in resourceVersion order: find the first newer event
                mid = (lo + hi) // 2
                if self.log[mid][0] <= rv:
                    lo = mid + 1
                else:
                    hi = mid
            return [(erv, kind, obj, prev) for erv, r, kind, obj, prev in self.log[lo:]
                    if r == res and (ns is None or obj["metadata"].get("namespace") == ns)], self.rv


def _check_preconditions(ns: str, name: str, pod: dict[str, Any], binding_meta: dict[str, Any]) -> None:
    """kube-apiserver's BindingREST: the Binding's UID and resourceVersion are storage preconditions on the pod
    (storage.Preconditions.Check), and a failed one is a 409 Conflict on "pods" (InterpretUpdateError)."""
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        want, have = binding_meta.get(field), pod["metadata"].get(field)
        if want and want != have:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": StorageError: invalid '
                           f"object, Code: 4, Key: /registry/pods/{ns}/{name}, ResourceVersion: 0, "
                           f"AdditionalErrorMsg: Precondition failed: {label} in precondition: {want}, {label} in "
                           f"object meta: {have}", {"name": name, "kind": "pods"})


class FakeApiServer:
    """Runs the fake on 127.0.0.1 (aiohttp, its own thread and loop): ``with FakeApiServer() as api: api.url``."""

    def __init__(self, port: int = 0, window: int = 50_000, run_bound_pods: bool = True,
                 bookmark_every_s: float = 1.0):
        self.store = Store(window)
        self.run_bound_pods = run_bound_pods
        self.bookmark_every_s = bookmark_every_s
        self.stopping = False
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._waiters: list[asyncio.Future] = []
        self._wake_pending = False
        self._bound_port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._bound_port}"

    def start(self) -> FakeApiServer:
        self._thread = threading.Thread(target=self._serve, name="fake-apiserver", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake API server did not start")
        return self

    def stop(self) -> None:
        self.stopping = True
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Direct access for test setup, as an admin would have with kubectl.
    def create(self, plural: str, obj: dict[str, Any], group: str = "", version: str = "v1") -> dict[str, Any]:
        res = BY_PATH[(group, version, plural)]
        ns = obj.get("metadata", {}).get("namespace", "default") if res.namespaced else ""
        return copy.deepcopy(self.store.create(res, ns, obj))

    def objects(self, plural: str, group: str = "", version: str = "v1") -> list[dict[str, Any]]:
        return copy.deepcopy(self.store.list(BY_PATH[(group, version, plural)], None, None)[0])

    # -------------------------------------------------------------- the server's loop
    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self._port, backlog=1024)
        loop.run_until_complete(site.start())
        self._bound_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.store.on_change = lambda: self._schedule_wake()
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        self._wake()
        if self._runner is not None:
            await self._runner.cleanup()

    def _schedule_wake(self) -> None:
        # Many writes in a row wake the watches once.
        if not self._wake_pending and self._loop is not None and not self._loop.is_closed():
            self._wake_pending = True
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._wake_pending = False
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    async def _changed(self, timeout: float) -> None:
        assert self._loop is not None
        f = self._loop.create_future()
        self._waiters.append(f)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(f, timeout)

    # -------------------------------------------------------------- requests
    @staticmethod
    def _route(request: web.Request) -> tuple[Resource, str | None, str | None, str | None]:
        parts = [p for p in request.path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        ns = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        if not rest:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        res = BY_PATH.get((group, version, rest[0]))
        if res is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({rest[0]})")
        if ns is not None and not res.namespaced:
            raise ApiError(404, "NotFound", f"{res.plural} is not namespaced")
        return res, ns, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None

    @staticmethod
    async def _body(request: web.Request) -> Any:
        raw = await request.read()
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            raise ApiError(400, "BadRequest", "the request body is not JSON") from None

    @staticmethod
    def _json(code: int, body: Any) -> web.Response:
        return web.Response(status=code, body=json.dumps(body).encode(), content_type="application/json")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        store, method, query = self.store, request.method, request.query
        store.requests[method] = store.requests.get(method, 0) + 1
        try:
            res, ns, name, sub = self._route(request)
            scope = (ns or "") if res.namespaced else ""
            if method == "GET" and name is None:
                if query.get("watch") in ("true", "1"):
                    return await self._watch(request, res, ns)
                items, rv = store.list(res, ns, query.get("fieldSelector"))
                return self._json(200, {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                                        "metadata": {"resourceVersion": str(rv)}, "items": items})
            if method == "GET":
                return self._json(200, store.get(res, scope, name))
            if method == "POST" and name is None:
                return self._json(201, store.create(res, scope, await self._body(request)))
            if method == "POST" and res.kind == "Pod" and sub in ("binding", "eviction"):
                body = await self._body(request)
                if sub == "binding":
                    store.bind(scope, name, body, self.run_bound_pods)
                else:
                    store.evict(scope, name)
                return self._json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                        "code": 201})
            if method == "PUT" and name is not None and sub in (None, "status"):
                return self._json(200, store.replace(res, scope, name, await self._body(request), sub == "status"))
            if method == "PATCH" and name is not None and sub in (None, "status"):
                ctype = request.content_type
                if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                   "accepted media types include: application/merge-patch+json, "
                                   f"application/strategic-merge-patch+json (got {ctype})")
                return self._json(200, store.patch(res, scope, name, await self._body(request), sub == "status",
                                                   ctype == "application/strategic-merge-patch+json"))
            if method == "DELETE" and name is not None:
                return self._json(200, store.delete(res, scope, name))
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")
        except ApiError as e:
            return self._json(e.code, e.status())

    async def _watch(self, request: web.Request, res: Resource, ns: str | None) -> web.StreamResponse:
        query = request.query
        selector = query.get("fieldSelector")
        rv = int(query.get("resourceVersion") or 0)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await resp.write(json.dumps(event).encode() + b"\n")

        try:
            if rv == 0:  # "any": start with the current objects as ADDED, as the real server does
                items, rv = self.store.list(res, ns, selector)
                for obj in items:
                    await send({"type": "ADDED", "object": obj})
            last_sent = time.monotonic()
            while time.monotonic() < deadline and not self.stopping:
                try:
                    events, head = self.store.events_after(rv, res, ns)
                except ApiError as e:
                    await send({"type": "ERROR", "object": e.status()})
                    break
                if events:
                    lines = []
                    for erv, kind, obj, prev in events:
                        rv = erv
                        event = _selected(erv, kind, obj, prev, selector)
                        if event is not None:
                            lines.append(json.dumps(event).encode() + b"\n")
                    if lines:
                        await resp.write(b"".join(lines))
                        last_sent = time.monotonic()
                elif bookmarks and time.monotonic() - last_sent >= self.bookmark_every_s:
                    rv = max(rv, head)
                    await send({"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.api_version,
                                                               "metadata": {"resourceVersion": str(rv)}}})
                    last_sent = time.monotonic()
                else:
                    await self._changed(min(0.5, self.bookmark_every_s))
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp


# --------------------------------------------------------------------------- objects for tests and benchmarks
def make_node(name: str, gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3", cpu: str = "96",
              memory: str = "1Ti", ready: bool = True) -> dict[str, Any]:
    """A GPU node as the kubelet and the GPU Operator's feature discovery describe it."""
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.present": "true",
                                                  "kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"capacity": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "110"},
                       "allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def make_pod(name: str, namespace: str = "default", gpus: int = 1, cpu: str = "1", memory: str = "1Gi",
             annotations: dict[str, str] | None = None, scheduler: str = "gpuaware", priority: int = 0,
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})},
            "spec": {"schedulerName": scheduler, "priority": priority,
                     "containers": [{"name": "main", "image": "registry.example.com/job:1.0",
                                     "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}}]}}
