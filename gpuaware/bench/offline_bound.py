"""An offline lower bound on the unallocated share of GPU capacity, per openb pod trace.

    python -m gpuaware.bench.offline_bound        # JSON: trace -> {"100": %, "130": %}

No policy, online or not, can allocate more than the maximum flow from the arrived GPU demand (each
pod class to the GPU models it may use: ``gpu_spec``, or every model) into the models' capacity. By
max-flow/min-cut that flow is the minimum over model sets M of cap(M) + the demand of classes not
confined to M. The demand is the trace's mix scaled to the arrived load. CPU, memory and
integrality (a pod on one node, a fraction on one GPU) are relaxed, so the bound is weak: 0.00 on
every openb trace at 100% and 130% arrived, i.e. the model constraints alone strand nothing.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
from collections import Counter

from gpuaware.plumbing.traces import traces_dir


def bound(nodes_csv: str, pods_csv: str, loads: tuple[int, ...] = (100, 130)) -> dict[str, float]:
    cap: Counter = Counter()
    with open(nodes_csv, newline="") as f:
        for r in csv.DictReader(f):
            if int(r["gpu"]):
                cap[r["model"]] += 1000 * int(r["gpu"])
    models, total_cap = sorted(cap), sum(cap.values())
    demand: Counter = Counter()
    with open(pods_csv, newline="") as f:
        for r in csv.DictReader(f):
            gpus = int(r["num_gpu"])
            milli = gpus * (int(r["gpu_milli"]) if gpus == 1 else 1000)
            if milli:
                allowed = frozenset(m for m in (r.get("gpu_spec") or "").split("|") if m) or frozenset(models)
                demand[allowed] += milli
    out = {}
    for load in loads:
        scale = load / 100 * total_cap / sum(demand.values())
        flow = min(sum(cap[m] for m in subset) + sum(d * scale for a, d in demand.items() if not a <= set(subset))
                   for k in range(len(models) + 1) for subset in itertools.combinations(models, k))
        out[str(load)] = round(100 * (1 - min(flow, load / 100 * total_cap) / total_cap), 2)
    return out


def main() -> None:
    openb = traces_dir() / "alibaba-openb"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default=str(openb / "openb_node_list_gpu_node.csv"))
    a = ap.parse_args()
    print(json.dumps({p.stem.removeprefix("openb_pod_list_"): bound(a.nodes, str(p))
                      for p in sorted(openb.glob("openb_pod_list_*.csv"))}, indent=2))


if __name__ == "__main__":
    main()
