"""What each part of the gpuaware placement policy is worth: the FGD fragmentation experiment with one part
left out at a time, on the same seeds as ``gpuaware simulate``.

    python -m gpuaware.bench.gpuaware_ablation --pods ../shared/traces/alibaba-openb/openb_pod_list_gpuspec25.csv
    --seeds 0-4

Prints JSON: per variant, ``unallocated_pct`` at 100% and 130% arrived load (mean over seeds, as the
simulator reports it) and ``paired_gain_vs_fgd`` (FGD minus the variant, per seed, mean and standard
deviation: positive is better than FGD). Runs the variants in parallel processes (``--workers``).
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gpuaware.plumbing.traces import traces_dir
from gpuaware.scheduler.core.framework import Profile
from gpuaware.scheduler.core.plugins.cpu_for_gpus import CpuForGpus
from gpuaware.scheduler.core.plugins.model_reservation import ModelReservation
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from gpuaware.scheduler.sim.experiments import parse_seeds
from gpuaware.scheduler.sim.fragmentation import run_fragmentation
from gpuaware.scheduler.sim.openb import load_nodes, load_pods

PARTS = ("cpu for gpus", "model reservation")
VARIANTS = ("fgd", "gpuaware", *(f"gpuaware without {p}" for p in PARTS))


def variant_profile(variant: str, mix: WorkloadMix, seed: int) -> Profile:
    if variant in ("fgd", "gpuaware"):
        return profile(variant, mix, seed)
    gpuaware = profile("gpuaware", mix, seed)
    left_out = variant.removeprefix("gpuaware without ")
    scores = []
    for plugin, weight in gpuaware.scores:
        if (left_out, type(plugin)) not in (("cpu for gpus", CpuForGpus), ("model reservation", ModelReservation)):
            scores.append((plugin, weight))
    return Profile(variant, gpuaware.filters, scores)


def one(args: tuple[str, str, str, int]) -> tuple[str, int, float, float]:
    nodes_csv, pods_csv, variant, seed = args
    run = run_fragmentation(load_nodes(nodes_csv), load_pods(pods_csv), variant, seed,
                            make_profile=variant_profile)
    return variant, seed, run.unallocated_at(100), run.unallocated_at(130)


def main() -> None:
    openb = traces_dir() / "alibaba-openb"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default=str(openb / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", default=str(openb / "openb_pod_list_default.csv"))
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    seeds = parse_seeds(a.seeds)
    jobs = [(a.nodes, a.pods, v, s) for v in VARIANTS for s in seeds]
    with ProcessPoolExecutor(a.workers) as pool:
        got = {(v, s): (u100, u130) for v, s, u100, u130 in pool.map(one, jobs)}
    out = {"pods": a.pods, "seeds": seeds, "variants": {}}
    for v in VARIANTS:
        mine = np.array([got[(v, s)] for s in seeds])
        gain = np.array([got[("fgd", s)] for s in seeds]) - mine
        out["variants"][v] = {
            "unallocated_pct": {"100": round(float(mine[:, 0].mean()), 2), "130": round(float(mine[:, 1].mean()), 2)},
            "paired_gain_vs_fgd": {load: {"mean": round(float(gain[:, i].mean()), 2),
                                          "std": round(float(gain[:, i].std()), 2)}
                                   for i, load in enumerate(("100", "130"))},
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
