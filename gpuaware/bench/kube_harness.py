"""What ``gpuaware.bench.kube_bench`` and ``gpuaware.bench.kube_dra_bench`` share: the API budget table, the control
plane with the kwok nodes, and the pod driver in its own processes.

The driver: one process (spawned) watches the bench namespace and stamps each pod's first
``spec.nodeName`` on ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the box);
``CREATORS`` further processes POST the pre-serialised pods, each over its own pool of keep-alive
connections, each pod at its due time (``start + i / rate``), stamping the creation just before the
POST. Spreading the POSTs over processes keeps the driver from being the bottleneck of a rate phase
(one process with a thread pool reached 33-87 pods/s on the 2-core box: GIL and pacing in one
thread); what it did reach is reported as ``driver_pods_per_s``, so a p99 is never read as at a rate
the driver did not make.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import numpy as np
import urllib3
import yaml

from gpuaware.local.kube_control_plane import KubeControlPlane

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "base" / "crds"
NAMESPACE = "bench"
DEFAULT_QPS = (50.0, 100)  # kube-scheduler's clientConnection defaults (qps, burst)
IDLE_S = 30.0  # no binding for this long: the phase's pods that can be placed are placed
CREATORS = 3  # creator processes of the driver
CREATOR_THREADS = 8  # POSTs in flight per creator process

Pods = list[tuple[str, int, bytes]]  # (name, GPU milli requested, JSON body)


def api_budget(qps: float) -> dict[str, Any]:
    """The ``api_budget`` table of both benches' JSON: ``raised`` gives every component ``qps`` / ``2 * qps``."""
    return {
        "default": {"kube_scheduler": {"qps": DEFAULT_QPS[0], "burst": DEFAULT_QPS[1]},
                    "gpuaware": "no client-side limit (Python client), bind_workers 64"},
        "raised": {"all": {"qps": qps, "burst": int(2 * qps)}},
        "apiserver": "max-requests-inflight 400, max-mutating-requests-inflight 200 (defaults)",
    }


def raised_qps(qps: float) -> tuple[float, int]:
    return qps, int(2 * qps)


@contextlib.contextmanager
def bench_control_plane(objects: Sequence[dict[str, Any]], apply_files: Sequence[Path] = (),
                        create_timeout_s: float = 600) -> Iterator[KubeControlPlane]:
    """etcd, kube-apiserver and kwok with gpuaware's CRDs, the bench namespace, ``objects`` (the kwok
    nodes and whatever goes with them) created in one request, then ``apply_files`` applied."""
    with KubeControlPlane(kwok=True) as cp:
        for crd in ("gpuqueues", "gpuworkloads"):  # gpuaware's informers list GPUQueues
            cp.kubectl("apply", "-f", str(CRDS / f"gpuaware.io_{crd}.yaml"))
            cp.kubectl("wait", "--for=condition=Established", f"crd/{crd}.gpuaware.io", "--timeout=60s")
        cp.create_namespace(NAMESPACE)
        cp.kubectl("create", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                                              "items": list(objects)}),
                   timeout_s=create_timeout_s)
        for path in apply_files:
            cp.kubectl("apply", "-f", str(path))
        yield cp


# -- the driver -------------------------------------------------------------------------------------

def _pool(server: str, ca: str, cert: str, key: str, size: int) -> urllib3.PoolManager:
    return urllib3.PoolManager(maxsize=size, block=True, cert_reqs="CERT_REQUIRED", ca_certs=ca,
                               cert_file=cert, key_file=key, retries=False, timeout=30.0)


def _post_all(http: urllib3.PoolManager, url: str, items: list[tuple[str, bytes, float]],
              threads: int) -> tuple[dict[str, float], float, list[str]]:
    """POST ``(name, body, due)`` pods in order, each at its due time, ``threads`` at a time:
    (created: name -> stamp just before its POST, when the last POST was answered, errors)."""
    todo: queue.Queue = queue.Queue()
    for item in items:
        todo.put(item)
    created: dict[str, float] = {}
    errors: list[str] = []
    answered: list[float] = [0.0]

    def work() -> None:
        while True:
            try:
                name, body, due = todo.get_nowait()
            except queue.Empty:
                return
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            created[name] = time.monotonic()
            resp = http.request("POST", url, body=body, headers={"Content-Type": "application/json"})
            if resp.status != 201:
                errors.append(f"{name}: {resp.status} {resp.data[:200]!r}")
            answered.append(time.monotonic())

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return created, max(answered), errors


def _creator_process(conn, server: str, ca: str, cert: str, key: str) -> None:
    """Answers each list of ``(name, body, due)`` with ``_post_all``'s figures; ``None`` ends it."""
    http = _pool(server, ca, cert, key, CREATOR_THREADS)
    url = f"{server}/api/v1/namespaces/{NAMESPACE}/pods"
    conn.send("ready")
    while (items := conn.recv()) is not None:
        conn.send(_post_all(http, url, items, CREATOR_THREADS))


class Driver:
    """Creates pods (through the creator processes) and watches them bind; runs in its own process."""

    def __init__(self, server: str, ca: str, cert: str, key: str, threads: int = 8):
        self.server = server
        self.http = _pool(server, ca, cert, key, threads + 2)
        self.pool = ThreadPoolExecutor(threads)
        self.bound: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        base = f"{server}/api/v1/namespaces/{NAMESPACE}/pods"
        self.pods_url = base
        ctx = mp.get_context("spawn")
        self.creators = []
        for i in range(CREATORS):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_creator_process, name=f"bench-creator-{i}", daemon=True,
                            args=(child, server, ca, cert, key))
            p.start()
            self.creators.append((p, parent))
        for _, c in self.creators:
            c.recv()
        rv = json.loads(self.http.request("GET", base + "?limit=1").data)["metadata"]["resourceVersion"]
        threading.Thread(target=self._watch, args=(rv,), daemon=True).start()

    def close(self) -> None:
        for p, c in self.creators:
            c.send(None)
            p.join(timeout=5)
            if p.is_alive():
                p.kill()

    def _watch(self, rv: str) -> None:
        while True:
            resp = self.http.request("GET", f"{self.pods_url}?watch=1&resourceVersion={rv}&timeoutSeconds=3600",
                                     preload_content=False, timeout=urllib3.Timeout(connect=10, read=None))
            buf = b""
            for chunk in resp.stream(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                now = time.monotonic()
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = ""
                        continue
                    rv = obj["metadata"]["resourceVersion"]
                    node = obj.get("spec", {}).get("nodeName")
                    name = obj["metadata"]["name"]
                    if node and name not in self.bound:
                        with self._lock:
                            self.bound[name] = now
                            self.nodes[name] = node

    def create(self, pods: Pods, rate: float) -> dict[str, Any]:
        """Every pod created, pod ``i`` at ``start + i / rate`` (all at once when ``rate`` is 0):
        {"created": name -> stamp, "create_s", "driver_pods_per_s": pods / (last POST answered - start),
        "errors"}."""
        start = time.monotonic() + 0.2  # every creator has its share before the first is due
        shares: list[list[tuple[str, bytes, float]]] = [[] for _ in self.creators]
        for i, (name, _, body) in enumerate(pods):
            shares[i % len(shares)].append((name, body, start + (i / rate if rate else 0.0)))
        for (_, c), share in zip(self.creators, shares, strict=True):
            c.send(share)
        created: dict[str, float] = {}
        errors: list[str] = []
        last = start
        for _, c in self.creators:
            got, done, errs = c.recv()
            created.update(got)
            errors += errs
            last = max(last, done)
        self.errors += errors
        span = last - start
        return {"created": created, "create_s": span, "errors": errors[:5],
                "driver_pods_per_s": round(len(pods) / span, 1) if span > 0 else None}

    def phase(self, pods: Pods, rate: float, timeout_s: float) -> dict[str, Any]:
        made = self.create(pods, rate)
        return {**made, **self.wait([n for n, _, _ in pods], timeout_s)}

    def wait(self, names: list[str], timeout_s: float, idle_s: float = IDLE_S) -> dict[str, Any]:
        """{"bound": name -> when bound or None} once all are bound, once ``idle_s`` passed without a binding
        after the first (the trace has pods no node fits: waiting for them would only add minutes), or after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            times = [self.bound[n] for n in names if n in self.bound]
            if len(times) == len(names) or (times and time.monotonic() - max(times) > idle_s):
                break
            time.sleep(0.05)
        return {"bound": {n: self.bound.get(n) for n in names}}

    def _delete(self, name: str) -> None:
        resp = self.http.request("DELETE", f"{self.pods_url}/{name}?gracePeriodSeconds=0")
        if resp.status not in (200, 404):
            self.errors.append(f"delete {name}: {resp.status} {resp.data[:200]!r}")

    def delete_all(self, timeout_s: float = 600.0) -> None:
        # deletecollection removes one pod at a time on the server (minutes for thousands on 2 cores);
        # one DELETE per pod over the pool runs them side by side.
        items = json.loads(self.http.request("GET", self.pods_url).data)["items"]
        list(self.pool.map(self._delete, [p["metadata"]["name"] for p in items]))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not json.loads(self.http.request("GET", self.pods_url + "?limit=1").data)["items"]:
                return
            time.sleep(0.2)
        raise RuntimeError(f"pods of namespace {NAMESPACE} not deleted after {timeout_s:.0f}s")


def _driver_process(conn, server: str, ca: str, cert: str, key: str, factory: type[Driver] = Driver) -> None:
    driver = factory(server, ca, cert, key)
    conn.send("ready")
    try:
        while True:
            cmd = conn.recv()
            if cmd[0] == "stop":
                return
            if cmd[0] == "delete":
                driver.delete_all()
                conn.send("deleted")
            elif cmd[0] == "wait":
                conn.send(driver.wait(cmd[1], cmd[2]))
            elif cmd[0] == "call":  # a method of ``factory``'s (the DRA bench's claims)
                conn.send(getattr(driver, cmd[1])(*cmd[2:]))
            else:
                _, pods, rate, timeout_s = cmd
                conn.send(driver.phase(pods, rate, timeout_s) if timeout_s else driver.create(pods, rate))
    finally:
        driver.close()


@contextlib.contextmanager
def driver_process(cp: KubeControlPlane, factory: type[Driver] = Driver) -> Iterator[Any]:
    """The driver's process (and its creators) for the block; yields the pipe its commands go down."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    cert, key = cp.admin_cert
    # Not a daemon: daemons may not have children (the creators); the block's end stops it.
    proc = ctx.Process(target=_driver_process, name="bench-driver",
                       args=(child, cp.server, str(cp.ca_file), str(cert), str(key), factory))
    proc.start()
    try:
        parent.recv()
        yield parent
    finally:
        parent.send(("stop",))
        proc.join(timeout=15)
        if proc.is_alive():
            proc.kill()
            proc.join()


# -- the figures ------------------------------------------------------------------------------------

async def backlog_then_steady(ask: Callable[[tuple], Awaitable[Any]], scheduler: AbstractAsyncContextManager,
                              burst_pods: list, steady_pods: list, rate: float, seconds: float, wait_s: float,
                              progress: Callable[[str], None], label: str) -> dict[str, Any]:
    """The burst as a backlog created before ``scheduler`` starts (its drain measures scheduling and binding, not
    how fast this box creates pods), then ``steady_pods`` at ``rate``; ``timing_figures`` of both and the
    driver's ``create_errors``."""
    progress(f"{label}: backlog of {len(burst_pods)} pods")
    b = await ask(("create", burst_pods, 0.0, 0.0))
    started = time.monotonic()
    async with scheduler:
        b = {**b, **await ask(("wait", [n for n, _, _ in burst_pods], wait_s))}
        progress(f"{label}: {rate:.0f} pods/s for {seconds:.0f}s")
        s = await ask(("create", steady_pods, rate, 60.0))
    return {**timing_figures(b, s, started), "create_errors": b["errors"] + s["errors"]}


def p(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def timing_figures(backlog: dict[str, Any], steady: dict[str, Any], started: float) -> dict[str, Any]:
    """``pods_per_s``: backlog pods bound / (last binding - ``started``, when the scheduler under test
    was started: the backlog existed before it); p50/p99 creation to binding of the steady phase with
    the rate the driver reached (``driver_pods_per_s``) next to them; which pods are bound (``done``)."""
    burst_bound = [t for t in backlog["bound"].values() if t is not None]
    created, bound = steady["created"], steady["bound"]
    steady_done = [k for k in created if bound.get(k) is not None]
    lat = [bound[k] - created[k] for k in steady_done]
    span = max(burst_bound) - started if burst_bound else None
    drain = max(burst_bound) - min(burst_bound) if len(burst_bound) > 1 else None
    return {
        "pods_per_s": round(len(burst_bound) / span, 1) if span else None,
        "p99_create_to_bind_s": p(lat, 99),
        "driver_pods_per_s": steady["driver_pods_per_s"],
        "p50_create_to_bind_s": p(lat, 50),
        "start_to_last_bind_s": round(span, 2) if span else None,
        "first_to_last_bind_pods_per_s": round(len(burst_bound) / drain, 1) if drain else None,
        "done": [n for n, t in backlog["bound"].items() if t is not None] + steady_done,
    }
