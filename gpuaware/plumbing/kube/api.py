"""The Kubernetes API as the scheduler uses it: the official ``kubernetes`` client, raw JSON.

Responses are read without the client's model deserialisation (``_preload_content=False``): the
scheduler needs a few fields of thousands of objects, and the typed models cost more than the
whole scheduling cycle. ``Informer`` is list + watch for one resource with the contract of
client-go's reflector: resume from the last resourceVersion (bookmarks keep it fresh), re-list on
410 Gone, and hand every change to the caller in order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from gpuaware.contract import annotations

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
# The API server unreachable or the connection broken (as opposed to an answer: ApiException).
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
# Without a timeout a call to a server that stopped answering (a dead connection, a partition)
# blocks its thread for ever; a timed-out call raises one of TRANSPORT_ERRORS.
REQUEST_TIMEOUT_S = 10.0
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
BINDING_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/binding"


def connect(host: str | None = None, pool_size: int = 32) -> client.ApiClient:
    """An API client: ``host`` (tests, benchmarks), else in-cluster config, else the kubeconfig."""
    cfg = client.Configuration()
    if host:
        cfg.host = host
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            # KUBECONFIG as it is now: the client library reads it once, at import.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size  # binds and events run in parallel
    return client.ApiClient(cfg)


def _json(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data or b"{}")


def _done(resp: Any) -> None:
    """Read a response whose body is not needed. With ``_preload_content=False`` urllib3 returns the
    connection to the pool only once the body is read; unread, every call opened a new TLS connection."""
    resp.drain_conn()
    resp.release_conn()


def api_error(exc: ApiException) -> tuple[int, str, str]:
    """(code, reason, message) of a failed call, from the Status body when there is one."""
    try:
        body = json.loads(exc.body or b"{}")
    except ValueError:
        body = {}
    return exc.status or 0, body.get("reason", exc.reason or ""), body.get("message", str(exc))


class PodReplaced(ApiException):
    """A Binding refused because the pod's UID is not the one it carried (409 Conflict, a failed storage
    precondition): the pod was deleted and one of the same name created since it was read. The placement was
    for the old pod; the new one is a new pending pod, to be scheduled on its own."""

    MARK = "Precondition failed: UID in precondition"  # the apiserver's storage.Preconditions.Check

    def __init__(self, exc: ApiException):
        super().__init__(status=exc.status, reason=exc.reason)
        self.body, self.headers = exc.body, exc.headers


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeApi:
    """The calls the scheduler makes; each returns the API's JSON or raises ``ApiException``.

    Each gives up after ``request_timeout_s`` (raising one of ``TRANSPORT_ERRORS``)."""

    def __init__(self, api_client: client.ApiClient, request_timeout_s: float = REQUEST_TIMEOUT_S):
        self.client = api_client
        self._raw = {"_preload_content": False, "_request_timeout": request_timeout_s}  # JSON, not models
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.resource = client.ResourceV1Api(api_client)  # resource.k8s.io/v1 (DRA)

    # Pods
    def bind(self, namespace: str, name: str, node: str, annotations: dict[str, str] | None = None,
             uid: str | None = None) -> None:
        """POST pods/binding; the API server sets ``annotations`` on the pod in the same write as its node.

        ``uid``, the UID of the pod the placement was made for, is a precondition: kube-apiserver binds only
        the pod with that UID and otherwise raises ``PodReplaced`` (a pod recreated under the same name
        would otherwise get the old one's node and GPUs)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations or {}}
        if uid:
            meta["uid"] = uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            # As plain JSON (``_send``): the generated method's model round trip cost more CPU than the rest of a
            # Binding's write, on the threads the extender's /filter shares the GIL with.
            self._send("POST", BINDING_PATH, namespace, name, body)
        except ApiException as exc:
            if uid and exc.status == 409 and PodReplaced.MARK in api_error(exc)[2]:
                raise PodReplaced(exc) from exc
            raise

    def write_claim_status(self, body: dict[str, Any]) -> dict[str, Any]:
        """PUT a ResourceClaim's status subresource; ``body.metadata.resourceVersion`` is the precondition (409
        Conflict when the claim changed since: someone else may have allocated it)."""
        meta = body["metadata"]
        return self._send("PUT", CLAIM_PATH + "/status", meta["namespace"], meta["name"], body)

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return _json(self.resource.read_namespaced_resource_claim(name, namespace, **self._raw))

    def unreserve_claim(self, namespace: str, name: str, claim_uid: str, pod_uid: str) -> dict[str, Any]:
        """Take one pod off a claim's ``status.reservedFor``, whatever else changed on it meanwhile: the strategic
        merge patch kube-scheduler's Unreserve sends (``reservedFor`` merges on ``uid``; the claim's UID is the
        precondition, so a claim recreated under its name is left alone)."""
        patch = {"metadata": {"uid": claim_uid}, "status": {"reservedFor": [{"$patch": "delete", "uid": pod_uid}]}}
        return self._send("PATCH", CLAIM_PATH + "/status", namespace, name, patch, STRATEGIC_MERGE_PATCH)

    def update_claim(self, body: dict[str, Any]) -> dict[str, Any]:
        """PUT a ResourceClaim (its metadata: the delete-protection finalizer); ``body.metadata.resourceVersion``
        is the precondition, as for the status write."""
        meta = body["metadata"]
        return self._send("PUT", CLAIM_PATH, meta["namespace"], meta["name"], body)

    def _send(self, method: str, path: str, namespace: str, name: str, body: dict[str, Any],
              content_type: str = "application/json") -> dict[str, Any]:
        """A write whose body goes out as the dict it is (the transport's ``json.dumps``) and whose answer is read as
        JSON. The generated methods validate a dict body into the client's model (pydantic) and serialise it back
        first: under a burst of claim pods the claim writes took 29 % of the scheduler's samples holding the GIL,
        most of it that round trip (docs/dra-scheduling.md, "Pace")."""
        _, url, headers, _, _ = self.client.param_serialize(
            method, path, path_params={"namespace": namespace, "name": name},
            header_params={"Accept": "application/json", "Content-Type": content_type}, auth_settings=["BearerToken"])
        resp = self.client.call_api(method, url, headers, body, _request_timeout=self._raw["_request_timeout"])
        data = resp.read()  # read whole, so urllib3 hands the connection back to the pool
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return json.loads(data or b"{}")

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> dict[str, Any]:
        return _json(self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}},
                                                    _content_type=MERGE_PATCH, **self._raw))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return _json(self.core.read_namespaced_pod(name, namespace, **self._raw))

    def evict(self, namespace: str, name: str) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        _done(self.core.create_namespaced_pod_eviction(name, namespace, body, **self._raw))

    @staticmethod
    def event_body(obj: dict[str, Any], reason: str, message: str, type_: str = "Normal",
                   component: str = "gpuaware-scheduler") -> dict[str, Any]:
        """A core/v1 Event about ``obj``, stamped now (it may be written later)."""
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        ts = now_rfc3339()
        return {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
            "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
                               "name": meta["name"], "namespace": ns, "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message[:1024], "type": type_,
            "source": {"component": component}, "reportingComponent": component,
            "reportingInstance": component, "firstTimestamp": ts[:19] + "Z", "lastTimestamp": ts[:19] + "Z",
            "eventTime": ts, "action": reason, "count": 1,
        }

    def create_event(self, body: dict[str, Any]) -> None:
        _done(self.core.create_namespaced_event(body["metadata"]["namespace"], body, **self._raw))

    # Nodes
    def read_node(self, name: str) -> dict[str, Any]:
        return _json(self.core.read_node(name, **self._raw))

    def cordon_gpu(self, name: str, gpu: int, attempts: int = 20) -> None:
        """Add ``gpu`` to the node's cordoned-GPU annotation."""
        self._update_node_annotation(name, annotations.ANN_CORDONED,
                                     lambda node: annotations.cordon_value(annotations.cordoned_gpus(node) | {gpu}),
                                     attempts)

    def uncordon_gpu(self, name: str, gpu: int, attempts: int = 20) -> None:
        """Remove ``gpu`` from the node's cordoned-GPU annotation (the annotation goes with the last one)."""
        self._update_node_annotation(
            name, annotations.ANN_CORDONED,
            lambda node: annotations.cordon_value(annotations.cordoned_gpus(node) - {gpu}) or None, attempts)

    def set_node_conditions(self, name: str, conditions: list[dict[str, Any]]) -> None:
        """Set these conditions (by type) in the node's status; the node's other conditions are left alone
        (a strategic merge: ``status.conditions`` merges on ``type``)."""
        self.core.patch_node_status(name, {"status": {"conditions": conditions}},
                                    _content_type=STRATEGIC_MERGE_PATCH, **self._raw)

    def set_node_taint(self, name: str, key: str, taint: dict[str, Any] | None, attempts: int = 20) -> None:
        """Put ``taint`` (None: none) under ``key`` on the node, leaving every other taint as it is."""
        def taints(node: dict[str, Any]) -> dict[str, Any] | None:
            now = (node.get("spec") or {}).get("taints") or []
            kept = [t for t in now if t.get("key") != key]
            new = kept + ([taint] if taint else [])
            return None if new == now else {"spec": {"taints": new or None}}

        self._update_node(name, taints, attempts)

    def record_power_cap(self, name: str, gpu: int, cap_w: int, attempts: int = 20) -> None:
        """Record ``cap_w`` (0: lifted) for ``gpu`` in the node's power-caps annotation."""
        def caps(node: dict[str, Any]) -> str | None:
            now = annotations.power_caps(node)
            if cap_w > 0:
                now[gpu] = cap_w
            else:
                now.pop(gpu, None)
            return annotations.power_caps_value(now)

        self._update_node_annotation(name, annotations.ANN_POWER_CAPS, caps, attempts)

    def annotate_node(self, name: str, values: dict[str, str | None]) -> dict[str, Any]:
        """Merge ``values`` into the node's annotations (None removes one)."""
        return _json(self.core.patch_node(name, {"metadata": {"annotations": values}}, _content_type=MERGE_PATCH,
                                          **self._raw))

    def _update_node_annotation(self, name: str, key: str, value: Callable[[dict[str, Any]], str | None],
                                attempts: int) -> None:
        """Read-modify-write of one annotation, guarded by the node's resourceVersion (409 Conflict -> read
        again), so two writers at once, or an operator editing the annotation, never lose an update."""
        self._update_node(name, lambda node: {"metadata": {"annotations": {key: value(node)}}}, attempts)

    def _update_node(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any] | None],
                     attempts: int) -> None:
        """Read-modify-write of a node: ``change`` gives the merge patch for the node as read (None: nothing
        to change), sent with the resourceVersion read (409 Conflict -> read again)."""
        attempt = 0
        while True:
            attempt += 1
            node = self.read_node(name)
            patch = change(node)
            if patch is None:
                return
            patch.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
            try:
                _done(self.core.patch_node(name, patch, _content_type=MERGE_PATCH, **self._raw))
                return
            except ApiException as exc:
                if exc.status != 409 or attempt >= attempts:
                    raise
                time.sleep(random.uniform(0, 0.01 * attempt))  # writers that collided do not collide again

    # Leases
    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.coordination.read_namespaced_lease(name, namespace, **self._raw))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return _json(self.coordination.create_namespaced_lease(namespace, body, **self._raw))

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _json(self.coordination.replace_namespaced_lease(name, namespace, body, **self._raw))

    # gpuaware.io
    def patch_queue_status(self, name: str, status: dict[str, Any]) -> None:
        _done(self.custom.patch_cluster_custom_object_status("gpuaware.io", "v1alpha1", "gpuqueues", name,
                                                             {"status": status}, _content_type=MERGE_PATCH,
                                                             **self._raw))

    # scheduling.k8s.io (the Workload API's gangs)
    def patch_pod_group_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        _done(self.custom.patch_namespaced_custom_object_status("scheduling.k8s.io", "v1alpha2", namespace,
                                                                "podgroups", name, {"status": status},
                                                                _content_type=MERGE_PATCH, **self._raw))

    # Authentication (the stream, verifying the agents' node tokens)
    def review_token(self, token: str, audience: str) -> dict[str, Any]:
        """The TokenReview's status for ``token`` and ``audience``: authenticated, user (extra), error."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [audience]}}
        return _json(client.AuthenticationV1Api(self.client).create_token_review(body, **self._raw)).get("status", {})


@dataclass(frozen=True)
class WatchSpec:
    """What an informer follows: a list function of the client and its field selector. ``page``: list in pages of
    that many objects (``limit``/``continue``; 0: one list), each object through ``keep`` (what the informer holds
    of it) as its page arrives."""

    name: str
    list_fn: Callable[..., Any]
    field_selector: str | None = None
    list_kwargs: tuple[tuple[str, Any], ...] = ()
    page: int = 0
    keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None


class Informer:
    """List + watch in a thread. ``on_sync(items)`` after every (re-)list, ``on_event(type, obj)`` per change.

    Both callbacks run in the informer's thread, in order; they must hand work off quickly (the
    watch does not read further until they return, which is the back-pressure).

    The server ends each watch after ``watch_timeout_s``; a list, and a connect, gives up after
    ``request_timeout_s``, and a watch that stays silent for that long past its end (a dead
    connection) is dropped and started again.
    """

    def __init__(self, spec: WatchSpec, on_sync: Callable[[list[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None], watch_timeout_s: int = 300,
                 request_timeout_s: float = 60.0):
        self.spec = spec
        self.on_sync = on_sync
        self.on_event = on_event
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.resource_version: str | None = None
        self.relists = 0
        self.pages = 0  # list responses read
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{spec.name}", daemon=True)

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            # Shut the socket down: that wakes the watch thread blocked reading its next line. Closing
            # the response instead waits for the lock that blocked read holds (until the server sends
            # something: a bookmark, about a minute on a real apiserver, or the watch's end).
            sock = getattr(getattr(resp, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def _kwargs(self) -> dict[str, Any]:
        kw = dict(self.spec.list_kwargs)
        if self.spec.field_selector:
            kw["field_selector"] = self.spec.field_selector
        return kw

    def _list(self) -> None:
        items: list[dict[str, Any]] = []
        kw: dict[str, Any] = {"limit": self.spec.page} if self.spec.page > 0 else {}
        version = None
        while True:
            body = _json(self.spec.list_fn(**self._kwargs(), **kw, _preload_content=False,
                                           _request_timeout=self.request_timeout_s))
            version = version or body["metadata"]["resourceVersion"]  # every page is of the first one's version
            page = body.get("items") or []
            items += page if self.spec.keep is None else [self.spec.keep(obj) for obj in page]
            self.pages += 1
            token = body["metadata"].get("continue")
            if not token or not kw:
                break
            kw["_continue"] = token
        self.resource_version = version
        self.relists += 1
        self.on_sync(items)
        self.synced.set()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch()
                backoff = 0.5
            except ApiException as exc:
                code, reason, message = api_error(exc)
                if code == 410:
                    log.info("%s: watch expired (%s), re-listing", self.spec.name, message)
                    self.resource_version = None
                    continue
                log.warning("%s: %s %s: %s; retrying in %.1fs", self.spec.name, code, reason, message, backoff)
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("%s: %s; retrying in %.1fs", self.spec.name, exc, backoff)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def _watch(self) -> None:
        resp = self.spec.list_fn(**self._kwargs(), watch=True, resource_version=self.resource_version,
                                 allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_s,
                                 _preload_content=False, _request_timeout=(
                                     self.request_timeout_s, self.watch_timeout_s + self.request_timeout_s))
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone(obj)
                    raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
                self.resource_version = obj["metadata"]["resourceVersion"]
                if kind != "BOOKMARK":
                    self.on_event(kind, obj)
        except _Gone as gone:
            log.info("%s: %s, re-listing", self.spec.name, gone.message)
            self.resource_version = None
        finally:
            self._resp = None
            resp.release_conn()


class _Gone(Exception):
    def __init__(self, status: dict[str, Any]):
        super().__init__(status.get("message"))
        self.message = status.get("message", "410 Gone")


def wait_synced(informers: list[Informer], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for inf in informers:
        if not inf.synced.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"informer {inf.spec.name} did not list within {timeout_s:.0f}s")
