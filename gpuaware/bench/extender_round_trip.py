"""Where a pod's time goes in extender mode: each extender request timed in the extender's process during
``gpuaware bench scheduler``'s extender mode, printed as JSON.

    python -m gpuaware.bench.extender_round_trip [--burst 600] [--rate 200] [--seconds 3] [--budget raised]

Per verb (/filter, /prioritize, /bind): handler time, from the request read to the answer made (not its
write). Of /filter: the nodes named in it, the core's ranking of them (with ``extender_one_node``, its scheduling
cycle over them, which reserves the pick) and the wait for earlier pods' /bind (``_settle``; not with
``extender_one_node``). Of /bind: the Binding write split into waiting for an API thread, the call on that
thread (the API server's answer and the Python client), and getting back onto the event loop; the API
threads' CPU per Binding. Of the pace: milliseconds from one /filter to the next (kube-scheduler's
scheduling cycle is one pod at a time), the event loop's lag (a task sleeping 1 ms records how late it
wakes), and the extender process's CPU per second of the mode. The bench's own figures for the mode come
with them, and the load average. ``--profile FILE`` writes a cProfile of the event loop's thread over the mode
(its CPU time: the handlers, the informers' hand-off, the core); the profiler's own cost then adds to the CPU
figures and handler times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpuaware.bench import kube_bench
from gpuaware.cli.common import OPENB
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.extender.server import Extender


class Timings:
    """What :func:`timed` records: (verb, seconds) per request, and the parts named in the module's doc."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, float, float]] = []  # (verb, arrived, answered) on time.monotonic()
        self.settle: list[float] = []
        self.rank: list[float] = []
        self.asked: list[int] = []  # nodes named in each gpuaware pod's /filter
        self.binds: list[tuple[float, float, float, float]] = []  # (asked, on a thread, done there, back on the loop)
        self.lag: list[float] = []
        self.cpu: dict[str, Any] = {}


@contextlib.contextmanager
def timed(t: Timings) -> Iterator[None]:
    """Extender and ApiCalls with timing wrappers around the methods named in the module's doc, for the block."""
    serve, settle, rank, one, call = (Extender._serve, Extender._settle, Extender._rank, Extender._filter_one,
                                      ApiCalls.call)

    async def _serve(self, request):
        t0 = time.monotonic()
        try:
            return await serve(self, request)
        finally:
            t.requests.append((request.path.strip("/"), t0, time.monotonic()))

    async def _settle(self, key):
        t0 = time.monotonic()
        try:
            return await settle(self, key)
        finally:
            t.settle.append(time.monotonic() - t0)

    def _rank(self, pod, idx):
        t.asked.append(len(idx))
        t0 = time.perf_counter()
        try:
            return rank(self, pod, idx)
        finally:
            t.rank.append(time.perf_counter() - t0)

    def _filter_one(self, pod, args, names, idx, result):
        t.asked.append(len(idx))
        t0 = time.perf_counter()
        try:
            return one(self, pod, args, names, idx, result)
        finally:
            t.rank.append(time.perf_counter() - t0)

    async def _call(self, fn, *args, pool=None):
        if getattr(fn, "__name__", "") != "bind":
            return await call(self, fn, *args, pool=pool)
        asked, ran = time.monotonic(), {}

        def on_thread(*a):
            ran["start"] = time.monotonic()
            try:
                return fn(*a)
            finally:
                ran["end"] = time.monotonic()
        try:
            return await call(self, on_thread, *args, pool=pool)
        finally:
            if "end" in ran:
                t.binds.append((asked, ran["start"], ran["end"], time.monotonic()))

    Extender._serve, Extender._settle, Extender._rank, Extender._filter_one, ApiCalls.call = \
        _serve, _settle, _rank, _filter_one, _call
    try:
        yield
    finally:
        Extender._serve, Extender._settle, Extender._rank, Extender._filter_one, ApiCalls.call = \
            serve, settle, rank, one, call


@contextlib.contextmanager
def profiled(path: Path | None) -> Iterator[None]:
    """A cProfile of this thread's CPU time over the block, written to ``path`` (nothing when None). CPU time, not
    wall time: on a loaded box a wall-clock profile charges the waits for a core to whatever ran when the thread
    was descheduled."""
    if path is None:
        yield
        return
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each named group of this process's threads (a pool's threads as one)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for th in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{th.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = th.name.rsplit("_", 1)[0] if th.name[-1:].isdigit() else th.name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def summary(t: Timings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for verb in ("filter", "prioritize", "bind"):
        d = [b - a for v, a, b in t.requests if v == verb]
        out[verb] = {"requests": len(d), "handler_ms_p50": _ms(d, 50), "handler_ms_p90": _ms(d, 90)}
    out["filter"].update(nodes_asked_p50=float(np.median(t.asked)) if t.asked else None,
                         rank_ms_p50=_ms(t.rank, 50), rank_ms_p90=_ms(t.rank, 90),
                         wait_for_binds_ms_p50=_ms(t.settle, 50), wait_for_binds_s_total=round(sum(t.settle), 2))
    for part, (i, j) in {"queue_for_api_thread": (0, 1), "api_call_on_thread": (1, 2),
                         "back_on_loop": (2, 3)}.items():
        d = [b[j] - b[i] for b in t.binds]
        out["bind"][f"{part}_ms_p50"], out["bind"][f"{part}_ms_p90"] = _ms(d, 50), _ms(d, 90)
    filters = sorted(a for v, a, _ in t.requests if v == "filter")
    out["ms_between_filters_p50"] = _ms(list(np.diff(filters)), 50) if len(filters) > 1 else None
    out["loop_lag_ms"] = {"p50": _ms(t.lag, 50), "p99": _ms(t.lag, 99), "max": _ms(t.lag, 100)}
    if t.cpu:
        threads = t.cpu["threads"]
        out["process_cpu_s_per_s"] = round(t.cpu["process_s"] / t.cpu["wall_s"], 3)
        out["api_thread_cpu_ms_per_bind"] = round(1000 * threads.get("kube-api", 0.0) / len(t.binds), 2) \
            if t.binds else None
        out["thread_cpu_s"] = {k: round(v, 2) for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v >= 0.01}
    return out


def run(burst: int, rate: float, seconds: float, budget: str, profile: Path | None = None) -> dict[str, Any]:
    t = Timings()
    scheduler = kube_bench._scheduler

    async def probe() -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(0.001)
            t.lag.append(time.monotonic() - t0 - 0.001)

    @contextlib.asynccontextmanager
    async def measured(mode: str, *args: Any, **kw: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(probe())
        before, threads_before = os.times(), _thread_cpu_s()
        try:
            async with scheduler(mode, *args, **kw):
                with profiled(profile):
                    yield
                after, threads = os.times(), _thread_cpu_s()
                t.cpu = {"process_s": after.user + after.system - before.user - before.system,
                         "wall_s": after.elapsed - before.elapsed,
                         "threads": {k: v - threads_before.get(k, 0.0) for k, v in threads.items()}}
        finally:
            task.cancel()

    kube_bench._scheduler = measured
    try:
        with timed(t):
            res = kube_bench.run_kube_bench(f"{OPENB}/openb_node_list_gpu_node.csv",
                                            f"{OPENB}/openb_pod_list_default.csv", burst, rate, seconds,
                                            modes=("extender",), budgets=(budget,))
    finally:
        kube_bench._scheduler = scheduler
    figures = res["runs"][budget]["modes"]["extender"]
    return {"burst_pods": burst, "rate_pods_per_s": rate, "seconds": seconds, "budget": budget,
            "load_1min_at_end": round(os.getloadavg()[0], 2), **summary(t),
            "bench": {k: figures[k] for k in ("pods_per_s", "p50_create_to_bind_s", "p99_create_to_bind_s",
                                               "pending")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=600)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--budget", choices=("raised", "default"), default="raised")
    parser.add_argument("--profile", type=Path, default=None, help="Write a cProfile of the event loop's thread here.")
    args = parser.parse_args()
    print(json.dumps(run(args.burst, args.rate, args.seconds, args.budget, args.profile), indent=2))


if __name__ == "__main__":
    main()
