"""``--ablation durations``: job order and runtime knowledge, on the dynamic experiment's jobs and seeds.

Every variant runs ``gpuaware``'s full stack; they differ in the queue order within a priority and in what
the core knows of runtimes (``DynamicConfig.durations``):

- ``fifo``: arrival order, runtimes unknown (a live scheduler without forecasts: no backfill by end time,
  no waiting for room that frees up);
- ``las``: least attained GPU service first, runtimes unknown (needs no forecast: the baseline a forecaster
  must beat);
- ``predicted``: least predicted remaining GPU service first, with backfill, reservations, patient
  preemption and victim choice by the online runtime forecaster's estimates (``stream/runtime.py``, learned
  from the cluster's past, then in completion order from the run's own jobs: nothing it predicts has been
  seen); ``predicted_cold`` the same without the past;
- ``features_oracle``: ``predicted`` with the past read ahead: the forecaster first learns every pod of the
  trace, the run's own jobs included (``runtime_history`` ``all``), so each job's signature (openb names only
  its request) carries the mean of its own runtime's draws: the best a forecaster keyed on those features could
  know, a ceiling no live scheduler has;
- ``oracle``: the same with every runtime known exactly: a ceiling no live scheduler has, reported beside.

``fair`` (DRF within a priority, runtimes unknown) is the shipped default, reported for reference.

Figures per variant (``variants.<name>``): mean and p99 JCT, mean wait per priority, the median slowdown
(JCT / runtime) of the longest 10% of jobs, preemptions, GPU-hours of work lost to preemptions and kills,
Jain's index over tenants, and violations (jobs that never finished: starved). Top level: ``wait_share``
(fifo's mean wait over its mean JCT: how contended the run is), ``forecast_quality`` (the predicted
variant's arrival-time forecasts against the runtimes the jobs then ran: Spearman's rank correlation of
the p50, mean absolute error of log runtime, share that ended within their p90) and
``oracle_gain_captured.jct`` = (fifo - predicted) / (fifo - oracle); ``forecast_quality_features`` and
``features_gain_captured.jct`` = (fifo - features_oracle) / (fifo - oracle) the same for the features ceiling.
Each ``*_vs_*`` comparison also gives the mean JCT's gain seed by seed with a 95% interval (``jct_mean_paired``,
``jct_mean_ci95``): every variant runs the same jobs on a seed, so the pairs take the seed's noise out.
``--variants`` runs some of the variants: the report has the comparisons they allow.

``predicted`` starts from the cluster's past (``DynamicConfig.runtime_history``: the trace's pods the run does
not draw); ``predicted_cold`` from nothing, as on a cluster's first day.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gpuaware.scheduler.core.queue import jain_index
from gpuaware.scheduler.core.workload import PriorityLevel
from gpuaware.scheduler.forecast_quality import spearman
from gpuaware.scheduler.sim.dynamic import run_dynamic
from gpuaware.scheduler.sim.jobs import DynamicConfig, DynamicResult, RuntimeModel

VARIANTS: dict[str, dict] = {
    "fifo": {"durations": "unknown", "order": "fifo"},
    "las": {"durations": "unknown", "order": "las"},
    "predicted": {"durations": "forecast", "order": "predicted"},
    "predicted_cold": {"durations": "forecast", "order": "predicted", "runtime_history": "none"},
    "features_oracle": {"durations": "forecast", "order": "predicted", "runtime_history": "all"},
    "oracle": {"durations": "oracle", "order": "predicted"},
    "fair": {"durations": "unknown", "order": "fair"},
}
# The stream ablation's cluster: 1% of the nodes, 1,000 jobs at the dynamic experiment's offered load (1.2):
# fifo's queue wait is about 60% of its mean JCT there, contended as the literature's gains need (>= 20%), and
# every variant x 20 seeds runs in minutes on 2 cores. The forecaster starts from the trace's other pods
# (``predicted_cold``: from nothing) and learns from the run's own completions as they end.
DURATIONS_CONFIG = DynamicConfig(jobs=1000, node_fraction=0.01)


def forecast_quality(results: list[DynamicResult]) -> dict:
    pairs = [(j.predicted, j.run_s) for r in results for j in r.jobs.values()
             if j.predicted is not None and j.finish_s is not None and j.run_s > 0]
    if not pairs:
        return {"spearman": None, "mae_log": None, "p90_coverage": None, "jobs": 0}
    p50 = [p[0] for p, _ in pairs]
    actual = [a for _, a in pairs]
    return {"spearman": round(spearman(p50, actual) or 0.0, 3),
            "mae_log": round(float(np.mean([abs(math.log(p / a)) for p, a in zip(p50, actual, strict=True)])), 3),
            "p90_coverage": round(float(np.mean([a <= p[1] for p, a in pairs])), 3), "jobs": len(pairs)}


def figures(results: list[DynamicResult]) -> dict:
    done = [j for r in results for j in r.jobs.values() if j.finish_s is not None]
    jct = np.array([j.finish_s - j.workload.submit_s for j in done])
    waits = {level.label: [j.first_start_s - j.workload.submit_s for j in done if j.workload.priority == level]
             for level in reversed(PriorityLevel)}
    # The longest 10% of jobs by runtime (the truth, for reporting only): how much slower they ended.
    longest = sorted(done, key=lambda j: j.duration_s)[-max(1, len(done) // 10):]
    slowdown = [(j.finish_s - j.workload.submit_s) / max(j.duration_s, 1.0) for j in longest]
    jain = []
    for r in results:
        per_tenant = {}
        for j in r.jobs.values():
            if j.finish_s is not None:
                per_tenant.setdefault(j.workload.tenant, []).append(
                    j.duration_s / max(j.finish_s - j.workload.submit_s, j.duration_s))
        jain.append(jain_index([float(np.mean(v)) for _, v in sorted(per_tenant.items())]) or 1.0)
    return {
        "jct_mean_s": round(float(jct.mean()), 1),
        "jct_p99_s": round(float(np.percentile(jct, 99)), 1),
        "wait_mean_s": {k: round(float(np.mean(v)), 1) if v else None for k, v in waits.items()},
        "wait_mean_all_s": round(float(np.mean([w for v in waits.values() for w in v])), 1),
        "slowdown_longest10_p50": round(float(np.median(slowdown)), 3),
        "preemptions": sum(r.preemptions for r in results),
        "preemptions_avoided": sum(r.preemptions_avoided for r in results),
        "lost_gpu_h": round(sum(j.lost_gpu_s for r in results for j in r.jobs.values()) / 3600, 1),
        "jain": round(float(np.mean(jain)), 4),
        "violations": sum(1 for r in results for j in r.jobs.values() if j.finish_s is None),
        "backfilled": sum(r.backfilled for r in results),
    }


def _one(nodes, pods, cfg: DynamicConfig, variant: str, seed: int,
         make_runtime: Callable[[], RuntimeModel]) -> DynamicResult:
    run_cfg = dataclasses.replace(cfg, **VARIANTS[variant])
    return run_dynamic(nodes, pods, "gpuaware", seed, run_cfg,
                       runtime=make_runtime() if run_cfg.durations == "forecast" else None)


def run_durations(nodes, pods, seeds: list[int], make_runtime: Callable[[], RuntimeModel],
                  cfg: DynamicConfig | None = None, progress: Callable[[str, float], None] | None = None,
                  workers: int = 1, variants: list[str] | None = None) -> dict:
    """``variants`` (default every one) on every seed (in ``workers`` processes when > 1: the same figures)."""
    cfg = cfg or DURATIONS_CONFIG
    names = list(VARIANTS) if variants is None else [n for n in VARIANTS if n in variants]
    unknown = sorted(set(variants or ()) - set(VARIANTS))
    if unknown or not names:
        raise ValueError(f"unknown durations variant(s) {', '.join(unknown) or 'none given'}; "
                         f"known: {', '.join(VARIANTS)}")
    tasks = [(name, seed) for name in names for seed in seeds]
    results: dict[tuple[str, int], DynamicResult] = {}
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            futures = {t: pool.submit(_one, nodes, pods, cfg, t[0], t[1], make_runtime) for t in tasks}
            for (name, seed), fut in futures.items():
                results[(name, seed)] = fut.result()
                if progress:
                    progress(f"{name} seed {seed}", 1.0)
    else:
        for name, seed in tasks:
            results[(name, seed)] = _one(nodes, pods, cfg, name, seed, make_runtime)
            if progress:
                progress(f"{name} seed {seed}", 1.0)
    return durations_report({name: [results[(name, s)] for s in seeds] for name in names}, seeds, cfg)


# Each comparison, made when both of its variants ran: (key, new, base).
COMPARISONS = (("predicted_vs_fifo", "predicted", "fifo"), ("predicted_vs_las", "predicted", "las"),
               ("predicted_vs_cold", "predicted", "predicted_cold"), ("oracle_vs_fifo", "oracle", "fifo"),
               ("features_oracle_vs_fifo", "features_oracle", "fifo"),
               ("predicted_vs_features_oracle", "predicted", "features_oracle"))


def durations_report(per: dict[str, list[DynamicResult]], seeds: list[int], cfg: DynamicConfig) -> dict:
    """The report of the variants in ``per`` (name -> its run on each of ``seeds``): the figures and comparisons
    those variants allow."""
    out = {name: figures(rs) for name, rs in per.items()}
    report = {"experiment": "dynamic", "ablation": "durations", "policy": "gpuaware", "seeds": seeds,
              "config": {k: v for k, v in cfg.__dict__.items() if k not in ("durations", "order", "runtime_history")}}
    if "fifo" in out:
        report["wait_share"] = round(out["fifo"]["wait_mean_all_s"] / out["fifo"]["jct_mean_s"], 3)
    report["variants"] = out
    for key, name in (("forecast_quality", "predicted"), ("forecast_quality_cold", "predicted_cold"),
                      ("forecast_quality_features", "features_oracle")):
        if name in per:
            report[key] = forecast_quality(per[name])
    for key, name in (("oracle_gain_captured", "predicted"), ("features_gain_captured", "features_oracle")):
        if {"fifo", name, "oracle"} <= set(out):
            fifo, oracle = out["fifo"]["jct_mean_s"], out["oracle"]["jct_mean_s"]
            captured = (fifo - out[name]["jct_mean_s"]) / (fifo - oracle) if fifo != oracle else None
            report[key] = {"jct": None if captured is None else round(captured, 3)}
    for key, new, base in COMPARISONS:
        if new in out and base in out:
            report[key] = _gain(out[new], out[base]) | _paired(per[new], per[base])
    return report


def _paired(new: list[DynamicResult], base: list[DynamicResult]) -> dict:
    """The mean JCT's relative gain seed by seed, over the jobs that finished in both runs of the seed (the same
    jobs: a variant that starves some is not credited for their absence), its mean and a 95% interval (t): the
    gain beats the noise when the interval excludes 0."""
    gains = [1 - _jct(n, b) / _jct(b, n) for n, b in zip(new, base, strict=True)]
    if len(gains) < 2:
        return {"jct_mean_paired": round(gains[0], 4) if gains else None, "jct_mean_ci95": None}
    m, half = float(np.mean(gains)), _T95.get(len(gains) - 1, 1.96) * float(np.std(gains, ddof=1)) / len(gains) ** 0.5
    return {"jct_mean_paired": round(m, 4), "jct_mean_ci95": [round(m - half, 4), round(m + half, 4)]}


def _jct(r: DynamicResult, other: DynamicResult) -> float:
    """``r``'s mean JCT over the jobs that finished in both ``r`` and ``other``."""
    both = [j for wid, j in r.jobs.items()
            if j.finish_s is not None and other.jobs.get(wid) is not None and other.jobs[wid].finish_s is not None]
    return float(np.mean([j.finish_s - j.workload.submit_s for j in both]))


# Student's t, two-sided 95%, by degrees of freedom (up to 29; 1.96 beyond).
_T95 = dict(enumerate((12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
                       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060,
                       2.056, 2.052, 2.048, 2.045), start=1))


def _gain(new: dict, base: dict) -> dict:
    """1 - new/base for the times; new/base for preemptions and slowdown of the longest."""
    return {"jct_mean": round(1 - new["jct_mean_s"] / base["jct_mean_s"], 4),
            "wait_mean": round(1 - new["wait_mean_all_s"] / base["wait_mean_all_s"], 4)
            if base["wait_mean_all_s"] else None,
            "preemptions_ratio": round(new["preemptions"] / base["preemptions"], 3) if base["preemptions"] else None,
            "slowdown_longest10_ratio": round(new["slowdown_longest10_p50"] / base["slowdown_longest10_p50"], 3)}
