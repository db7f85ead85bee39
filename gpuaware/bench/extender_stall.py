"""The longest event-loop stall of the extender while it takes an 8 MiB /filter body, printed as JSON.

    python -m gpuaware.bench.extender_stall [--mib 8] [--requests 5]

A probe task on the extender's loop sleeps 1 ms at a time and records how late it wakes; a client
process (so that its own work holds no GIL of the extender's) posts a ``nodeCacheCapable: false``
body of ``--mib`` MiB (whole Nodes, ~9 KB each) to /filter. Three cases: the default body cap (the
body is refused with 413 before it is read), the cap raised above the body (parsed in the worker
process, ``extender.offload``), and, for reference, ``orjson.loads`` and ``json.loads`` of the same
body on a worker thread (what holding the GIL for the whole document costs the loop). Each case
reports the worst stall over ``--requests`` requests (after one warm-up request).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gpuaware.bench.extender_bench import cluster
from gpuaware.local.fake_apiserver import make_pod
from gpuaware.local.processes import free_port
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from gpuaware.scheduler.kube.extender import offload
from gpuaware.scheduler.kube.extender.server import DEFAULT_MAX_BODY_BYTES, Extender

PROBE_S = 0.001


def body_of(mib: float) -> tuple[Any, bytes]:
    per_node = 9_700  # a Node with 50 images, as JSON
    cache, nodes = cluster(int(mib * 2**20 / per_node) + 1, 50)
    pod = make_pod("new", gpus=1, scheduler="default-scheduler")
    return cache, json.dumps({"Pod": pod, "Nodes": {"items": nodes}, "NodeNames": None}).encode()


def client(port: int, body_file: str) -> Callable[[], tuple[int, float]]:
    """A client process, started now (forking this one is no part of the measurement) and ready to POST the
    file's bytes to /filter; calling the result makes it send and returns (status, seconds)."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuaware.bench.extender_stall", "--post", str(port), body_file],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

    def go() -> tuple[int, float]:
        out, _ = proc.communicate("go\n", timeout=120)
        status, seconds = out.split()
        return int(status), float(seconds)

    return go


def _post_here(port: int, body_file: str) -> None:
    body = Path(body_file).read_bytes()
    print("ready", flush=True)
    sys.stdin.readline()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/filter", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        status = resp.status
    except (BrokenPipeError, ConnectionResetError):  # a 413 closes the connection while the body is still sent
        status = 413
    finally:
        conn.close()
    print(status, time.perf_counter() - t0)


async def stalls_during(make_work: Callable[[], Callable[[], Any]], requests: int) -> dict:
    """``requests + 1`` times: ``make_work()``, then its result (blocking) run on a thread; the loop's worst
    lateness while it runs."""
    loop = asyncio.get_running_loop()
    worst: list[float] = []
    results = []
    for i in range(requests + 1):
        work = make_work()
        done = threading.Event()
        late = 0.0

        def run(done: threading.Event = done, work: Callable[[], Any] = work) -> None:
            try:
                results.append(work())
            finally:
                done.set()

        thread = threading.Thread(target=run)
        thread.start()
        while not done.is_set():
            t0 = loop.time()
            await asyncio.sleep(PROBE_S)
            late = max(late, loop.time() - t0 - PROBE_S)
        thread.join()
        if i:  # the first warms up (the worker process starts)
            worst.append(late)
    return {"stall_ms_max": round(max(worst) * 1000, 1), "stall_ms_median": round(statistics.median(worst) * 1000, 1),
            "results": results[1:]}


async def serve_and_measure(cache, body: bytes, max_body: int, requests: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(body)
        f.flush()
        return await _serve_and_measure(cache, f.name, len(body), max_body, requests)


async def _serve_and_measure(cache, body_file: str, size: int, max_body: int, requests: int) -> dict:
    core = Scheduler(profile("gpuaware", WorkloadMix(), 0))
    ext = Extender(cache, lambda: core, lambda: True, max_body_bytes=max_body)
    runner = web.AppRunner(ext.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        out = await stalls_during(lambda: client(port, body_file), requests)
    finally:
        await runner.cleanup()
    results = out.pop("results")
    return {**out, "max_body_bytes": max_body, "status": sorted({status for status, _ in results}),
            "latency_ms_median": round(statistics.median(s for _, s in results) * 1000, 1)}


async def parse_on_thread(loads: Callable[[bytes], Any], body: bytes, requests: int) -> dict:
    loop = asyncio.get_running_loop()

    async def one() -> None:
        await loop.run_in_executor(None, loads, body)

    out = await stalls_during(lambda: lambda: asyncio.run_coroutine_threadsafe(one(), loop).result(), requests)
    out.pop("results")
    return out


async def measure(mib: float, requests: int) -> dict:
    cache, body = body_of(mib)
    out: dict = {"body_bytes": len(body), "requests": requests, "probe_ms": PROBE_S * 1000}
    try:
        out["default_cap"] = await serve_and_measure(cache, body, DEFAULT_MAX_BODY_BYTES, requests)
        out["cap_raised"] = await serve_and_measure(cache, body, len(body) + 1, requests)
    finally:
        offload.shutdown()
    out["reference_orjson_on_a_thread"] = await parse_on_thread(orjson.loads, body, requests)
    out["reference_json_on_a_thread"] = await parse_on_thread(json.loads, body, requests)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=8.0)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--post", nargs=2, metavar=("PORT", "FILE"), help=argparse.SUPPRESS)  # the client process
    args = parser.parse_args()
    if args.post:
        _post_here(int(args.post[0]), args.post[1])
        return
    print(json.dumps(asyncio.run(measure(args.mib, args.requests)), indent=2))


if __name__ == "__main__":
    main()
