"""What building a pass's tenant ledger costs: ``python -m gpuaware.bench.ledger_cost --nodes 1213 --running 4000``.

A scheduling pass starts from the tenants' usage of what runs. The scheduler keeps that usage summed per
(tenant, GPU model) as pods start and end (``ClusterCache.usage``) and builds the ledger from the sums
(``SchedulingPass.ledger``); this times that against charging every running pod again (what a pass did
before), on the same cache, and checks both ledgers agree. JSON: ``running``, ``ms_from_sums``,
``ms_charging_each`` (the best of ``--repeat`` rounds), ``same``.
"""

from __future__ import annotations

import argparse
import json
import time

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.core.queue import TenantLedger
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.scheduling import SchedulingPass
from gpuaware.scheduler.settings import SchedulerSettings


def charging_each(cache: ClusterCache) -> TenantLedger:
    c = cache.cluster
    ledger = TenantLedger({}, max(c.total_gpu_milli, 1), max(int(c.mem_cap.sum()), 1),
                          gpu_mem_by_model=c.gpu_memory_by_model())
    for r in cache.running.values():
        ledger.charge(r.workload, model=str(c.models[r.allocation.node]))
    return ledger


def best_ms(fn, rounds: int, n: int = 20) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - started) / n * 1000)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1213)
    ap.add_argument("--running", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cache = ClusterCache(scheduler_name="gpuaware")
    cache.sync_nodes([make_node(f"n{i}", gpus=8) for i in range(args.nodes)])
    pods = []
    for i in range(args.running):
        p = make_pod(f"p{i}", namespace=f"team-{i % 7}", gpus=1 + i % 2)
        p["spec"]["nodeName"] = f"n{i % args.nodes}"
        pods.append(p)
    cache.sync_pods(pods)
    passes = SchedulingPass(SchedulerSettings(extender_port=0), cache, None, None, None, None, None, None,  # type: ignore[arg-type]
                            None)  # type: ignore[arg-type]
    a, b = passes.ledger(), charging_each(cache)
    same = (a.gpu_used, a.mem_used, a.model_used, a.model_mem_used) == \
        (b.gpu_used, b.mem_used, b.model_used, b.model_mem_used)
    print(json.dumps({"running": len(cache.running), "ms_from_sums": round(best_ms(passes.ledger, args.repeat), 4),
                      "ms_charging_each": round(best_ms(lambda: charging_each(cache), args.repeat), 3),
                      "same": same}))


if __name__ == "__main__":
    main()
