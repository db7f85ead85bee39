"""``--ablation stream``: ``gpuaware`` on the dynamic experiment with its stream-driven parts, without
each one, and without all of them, on the same seeds, jobs and simulated physics (``stream_model.py``).

The figures per variant (``variants.<name>``): high-priority queue wait mean and p95, mean JCT (all
priorities), busy share of occupied GPU time (compute the jobs really used over the time a GPU held
any), GPU allocation (requested share of capacity, time-averaged), preemptions, and violations
(GPU-ticks with an OOM kill or an SLO miss from compute overcommit). Beside busy share, the most any
placement could have made of it on those runs' job-minutes, without and with the forecast part's memory
margin (``busy_share_bound``, ``busy_share_bound_margin``: ``stream_model.py``), and in the gains the most
the variant could have gained over none with them (``all_vs_without_all.busy_share_bound``).

Beside the variants, two ceilings (``ceilings.<name>``, ``ceilings_vs_without_all.<name>``): every part, with
shared jobs charged what they will really use, read ahead in their series (``StreamConfig.oracle``):
``oracle-overcommit`` the peak over the job's run from its first minute (nothing outgrows its charge),
``oracle-horizon`` the peak over the next forecast horizon, every minute (a perfect forecast; a climb into
room that others took since still OOM-kills). Overcommitting shared GPUs by forecast, the part the issue
expects most of, cannot do better than forecasts that are never wrong; the ceilings say how far that is
from the target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gpuaware.scheduler.core.policy_specs import LIVE_STREAM
from gpuaware.scheduler.core.workload import PriorityLevel
from gpuaware.scheduler.sim.dynamic import run_dynamic
from gpuaware.scheduler.sim.jobs import DynamicConfig, DynamicResult
from gpuaware.scheduler.sim.stream_model import PARTS, StreamModel

# The ablation's cluster: 1% of the nodes and 1,000 jobs at the dynamic experiment's offered load
# (target_load 1.2). Loaded so that queueing matters: 83-90% of it allocated over the run and high
# priority waiting minutes, where the earlier 500 jobs on 2% ran half allocated with near-empty queues
# and no placement could shorten them. Small so that 6 variants x 5 seeds run in minutes on 2 cores.
ABLATION_CONFIG = DynamicConfig(jobs=1000, node_fraction=0.01)

MakeStream = Callable[[frozenset[str]], StreamModel]
CEILINGS = {"oracle-overcommit": "run", "oracle-horizon": "horizon"}  # not variants: see the module's docstring


def variants() -> dict[str, frozenset[str]]:
    """``all``, ``without-<part>`` for each part, ``without-all``, and ``live``: the parts the live scheduler
    runs (``policy_specs.LIVE_STREAM``), so the table shows what the shipped profile does against none."""
    out = {"all": frozenset(PARTS)}
    out.update({f"without-{p}": frozenset(PARTS) - {p} for p in PARTS})
    out["without-all"] = frozenset()
    out["live"] = LIVE_STREAM & frozenset(PARTS)
    return out


def figures(runs: list[tuple[DynamicResult, StreamModel]]) -> dict:
    waits, jcts = [], []
    for r, _ in runs:
        for j in r.jobs.values():
            if j.first_start_s is not None and j.workload.priority == PriorityLevel.HIGH:
                waits.append(j.first_start_s - j.workload.submit_s)
            if j.finish_s is not None:
                jcts.append(j.finish_s - j.workload.submit_s)
    s = [m.summary() for _, m in runs]
    return {
        "wait_high_mean_s": round(float(np.mean(waits)), 1) if waits else None,
        "wait_high_p95_s": round(float(np.percentile(waits, 95)), 1) if waits else None,
        "jct_mean_s": round(float(np.mean(jcts)), 1) if jcts else None,
        "busy_share": round(float(np.mean([x["busy_share"] for x in s])), 4),
        "busy_share_bound": round(float(np.mean([x["busy_share_bound"] for x in s])), 4),
        "busy_share_bound_margin": round(float(np.mean([x["busy_share_bound_margin"] for x in s])), 4),
        "allocated_gpu_pct": round(float(np.mean([x["allocated_gpu_pct"] for x in s])), 2),
        "preemptions": sum(r.preemptions for r, _ in runs),
        "throttles": sum(r.throttles for r, _ in runs),
        "power_over_budget_node_h": round(sum(r.over_budget_node_s for r, _ in runs) / 3600, 2),
        "violations": sum(x["violations"] for x in s),
        "oom_kills": sum(x["oom"] for x in s),
        "slo_misses": sum(x["contention"] for x in s),
        "unfinished": sum(1 for r, _ in runs for j in r.jobs.values() if j.finish_s is None),
    }


def _one(nodes, pods, cfg: DynamicConfig, make_stream: MakeStream, parts: frozenset[str], seed: int,
         oracle: str = "") -> tuple[DynamicResult, StreamModel]:
    model = make_stream(parts)
    if oracle:
        model.cfg = dataclasses.replace(model.cfg, oracle=oracle)
    return run_dynamic(nodes, pods, "gpuaware", seed, cfg, None, model), model


def runs() -> dict[str, tuple[frozenset[str], str]]:
    """What the ablation runs on every seed: the variants, then the ceilings (name -> (parts, oracle))."""
    out = {name: (parts, "") for name, parts in variants().items()}
    out.update({name: (frozenset(PARTS), oracle) for name, oracle in CEILINGS.items()})
    return out


def run_ablation(nodes, pods, seeds: list[int], make_stream: MakeStream, cfg: DynamicConfig | None = None,
                 progress: Callable[[str, float], None] | None = None, workers: int = 1) -> dict:
    """Every variant and ceiling on every seed; with ``workers`` > 1 in that many processes (the figures are the
    same)."""
    cfg = cfg or ABLATION_CONFIG
    tasks = [(name, parts, oracle, seed) for name, (parts, oracle) in runs().items() for seed in seeds]
    results: dict[tuple[str, int], tuple[DynamicResult, StreamModel]] = {}
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            futures = {(name, seed): pool.submit(_one, nodes, pods, cfg, make_stream, parts, seed, oracle)
                       for name, parts, oracle, seed in tasks}
            for (name, seed), fut in futures.items():
                results[(name, seed)] = fut.result()
                if progress:
                    progress(f"{name} seed {seed}", 1.0)
    else:
        for name, parts, oracle, seed in tasks:
            results[(name, seed)] = _one(nodes, pods, cfg, make_stream, parts, seed, oracle)
            if progress:
                progress(f"{name} seed {seed}", 1.0)
    out = {name: figures([results[(name, seed)] for seed in seeds]) for name in runs()}
    ceilings = {name: out.pop(name) for name in CEILINGS}
    return {"experiment": "dynamic", "ablation": "stream", "policy": "gpuaware", "seeds": seeds,
            "config": cfg.__dict__, "variants": out, "live_parts": sorted(variants()["live"]),
            "all_vs_without_all": _gain(out["all"], out["without-all"]),
            "live_vs_without_all": _gain(out["live"], out["without-all"]),
            "ceilings": ceilings,
            "ceilings_vs_without_all": {name: _gain(c, out["without-all"]) for name, c in ceilings.items()}}


def _gain(full: dict, none: dict) -> dict:
    """Lower is better for the times (1 - full/none), higher for busy share and allocation (full/none - 1)."""
    gain = {k: round(1 - full[k] / none[k], 4) if none[k] else None for k in ("jct_mean_s", "wait_high_mean_s",
                                                                              "wait_high_p95_s")}
    for k in ("busy_share", "allocated_gpu_pct"):
        gain[k] = round(full[k] / none[k] - 1, 4) if none[k] else None
    # The busy share gain no placement of the full set's runs could have passed (with the margin kept, and not).
    for k in ("busy_share_bound", "busy_share_bound_margin"):
        gain[k] = round(full[k] / none["busy_share"] - 1, 4) if none["busy_share"] else None
    return gain
