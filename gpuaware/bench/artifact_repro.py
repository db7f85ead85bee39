"""Our policies beside the FGD artifact's published medians (ATC'23, ``hkust-adsl/kubernetes-scheduler-simulator``).

    python -m gpuaware.bench.artifact_repro --published analysis_allo_discrete.csv --policy fgd-artifact --seeds 0-4 \\
        --cache /tmp/artifact-repro > repro.json
    python -m gpuaware.bench.artifact_repro --table repro.json        # the markdown table of docs/scheduling.md

``--published`` is the artifact's ``experiments/analysis/expected_results/analysis_allo_discrete.csv``
(allocation % per arrived load %, one row per trace, policy and seed). Every (trace, policy, protocol,
seed) run is cached as JSON under ``--cache``, so an interrupted batch resumes. Prints JSON: per trace
and policy, our figure (``--protocol``, default artifact: medians) and the published median of the
unallocated share at each arrived load, and the gap (ours minus published).
"""

from __future__ import annotations

import argparse
import csv
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import median

import numpy as np

from gpuaware.plumbing.traces import traces_dir
from gpuaware.scheduler.sim.experiments import parse_seeds
from gpuaware.scheduler.sim.fragmentation import LOAD_POINTS, run_fragmentation
from gpuaware.scheduler.sim.openb import load_nodes, load_pods

# Our policy -> the artifact's (generate_run_scripts.py: AllMethodList).
ARTIFACT_NAME = {"random": "01-Random", "dotprod": "02-DotProd", "clustering": "03-GpuClustering",
                 "packing": "04-GpuPacking", "bestfit": "05-BestFit", "fgd": "06-FGD", "fgd-artifact": "06-FGD"}


def published(path: str) -> dict[tuple[str, str], dict[str, float]]:
    """(trace, artifact policy) -> load -> median over seeds of 100 - allocation."""
    rows: dict[tuple[str, str], list[dict]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.setdefault((r["workload"], r["sc_policy"]), []).append(r)
    return {k: {str(x): round(100 - median(float(r[str(x)]) for r in rs), 2) for x in LOAD_POINTS}
            for k, rs in rows.items()}


def one(job: tuple[str, str, str, str, int, str]) -> dict:
    nodes_csv, pods_csv, policy, protocol, seed, cache = job
    out = Path(cache) / f"{Path(pods_csv).stem}-{policy}-{protocol}-{seed}.json"
    if out.exists():
        return json.loads(out.read_text())
    run = run_fragmentation(load_nodes(nodes_csv), load_pods(pods_csv), policy, seed, protocol=protocol)
    figure = run.unallocated_binned if protocol == "artifact" else run.unallocated_at
    lat = np.asarray(run.latencies_s)
    got = {"trace": Path(pods_csv).stem, "policy": policy, "protocol": protocol, "seed": seed,
           "unallocated_pct": {str(x): round(figure(x), 2) for x in LOAD_POINTS},
           "decisions_per_s": round(float(len(lat) / lat.sum()), 1),
           "p99_decision_ms": round(float(np.percentile(lat, 99) * 1000), 3)}
    out.write_text(json.dumps(got))
    return got


def table(report: dict) -> str:
    lines = ["| pod trace | policy | " + " | ".join(f"{x}%: ours / published (gap)" for x in LOAD_POINTS) + " |",
             "| --- | --- |" + " ---: |" * len(LOAD_POINTS)]
    for trace, policies in report["traces"].items():
        for policy, r in policies.items():
            cells = [f"{r['ours'][str(x)]:.2f} / {r['published'][str(x)]:.2f} ({r['gap'][str(x)]:+.2f})"
                     if r.get("published") else f"{r['ours'][str(x)]:.2f} / - " for x in LOAD_POINTS]
            lines.append(f"| {trace.removeprefix('openb_pod_list_')} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    openb = traces_dir() / "alibaba-openb"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--published", help="the artifact's analysis_allo_discrete.csv")
    ap.add_argument("--nodes", default=str(openb / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", action="append", help="pod traces (default: every openb trace)")
    ap.add_argument("--policy", action="append", help="policies (default: fgd-artifact)")
    ap.add_argument("--protocol", default="artifact", choices=("artifact", "sample"))
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", default="/tmp/artifact-repro")
    ap.add_argument("--table", help="print the markdown table of a report this script printed")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(Path(a.table).read_text())))
        return
    pods = a.pods or sorted(str(p) for p in openb.glob("openb_pod_list_*.csv"))
    policies, seeds = a.policy or ["fgd-artifact"], parse_seeds(a.seeds)
    Path(a.cache).mkdir(parents=True, exist_ok=True)
    jobs = [(a.nodes, p, pol, a.protocol, s, a.cache) for pol in policies for p in pods for s in seeds]
    with ProcessPoolExecutor(a.workers) as pool:
        runs = list(pool.map(one, jobs))
    pub = published(a.published) if a.published else {}
    out: dict = {"protocol": a.protocol, "seeds": seeds, "statistic": "median" if a.protocol == "artifact" else "mean",
                 "traces": {}}
    for p in pods:
        trace = Path(p).stem
        for pol in policies:
            mine = [r for r in runs if r["trace"] == trace and r["policy"] == pol]
            agg = median if a.protocol == "artifact" else (lambda v: float(np.mean(v)))
            per_load = {str(x): [r["unallocated_pct"][str(x)] for r in mine] for x in LOAD_POINTS}
            ours = {k: round(agg(v), 2) for k, v in per_load.items()}
            spread = {k: round(float(np.std(v)), 2) for k, v in per_load.items()}
            ref = pub.get((trace, ARTIFACT_NAME.get(pol, "")))
            entry = {"ours": ours, "std": spread, "published": ref,
                     "gap": {k: round(ours[k] - ref[k], 2) for k in ours} if ref else None,
                     "decisions_per_s": round(float(np.mean([r["decisions_per_s"] for r in mine])), 1),
                     "p99_decision_ms": round(float(np.max([r["p99_decision_ms"] for r in mine])), 3)}
            out["traces"].setdefault(trace, {})[pol] = entry
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
