"""``--ablation durations``: every variant on the same jobs, its figures, and the forecast's quality."""

from __future__ import annotations

from gpuaware.cli.stream_sim import make_runtime
from gpuaware.scheduler.sim.durations import VARIANTS, run_durations
from gpuaware.scheduler.sim.dynamic import run_dynamic
from gpuaware.scheduler.sim.jobs import DynamicConfig, history, make_jobs
from gpuaware.scheduler.sim.openb import load_nodes, load_pods
from tests.support import OPENB_PODS as PODS


def test_every_variant_runs_the_same_jobs_and_the_report_names_the_figures(small_nodes):
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    cfg = DynamicConfig(jobs=300, node_fraction=0.3, target_load=1.5, fault_every_s=1e9)
    report = run_durations(nodes, pods, [0, 1], make_runtime, cfg=cfg)
    assert set(report["variants"]) == set(VARIANTS)
    jobs = {name: v["jct_mean_s"] for name, v in report["variants"].items()}
    assert all(j > 0 for j in jobs.values())
    for v in report["variants"].values():
        assert set(v["wait_mean_s"]) == {"high", "medium", "low"} and v["violations"] == 0
        assert v["slowdown_longest10_p50"] >= 1.0 and 0 < v["jain"] <= 1
    # Only the variants that know runtimes backfill past a reservation or wait for room.
    assert report["variants"]["fifo"]["preemptions_avoided"] == report["variants"]["las"]["preemptions_avoided"] == 0
    q = report["forecast_quality"]
    assert q["jobs"] > 100 and -1 <= q["spearman"] <= 1 and 0 <= q["p90_coverage"] <= 1 and q["mae_log"] > 0
    assert 0 < report["wait_share"] < 1
    assert report["oracle_vs_fifo"]["jct_mean"] > 0  # knowing every runtime shortens the mean JCT here
    assert report["forecast_quality_features"]["jobs"] > 100 and "jct" in report["features_gain_captured"]


def test_a_subset_of_variants_reports_only_the_comparisons_it_allows(small_nodes):
    import pytest

    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    cfg = DynamicConfig(jobs=60, node_fraction=0.3, target_load=1.5, fault_every_s=1e9)
    report = run_durations(nodes, pods, [0, 1], make_runtime, cfg=cfg, variants=["predicted", "fifo", "las"])
    assert list(report["variants"]) == ["fifo", "las", "predicted"]  # in the ablation's order
    assert {"predicted_vs_fifo", "predicted_vs_las", "wait_share", "forecast_quality"} <= set(report)
    assert not {"predicted_vs_cold", "oracle_vs_fifo", "oracle_gain_captured", "forecast_quality_cold",
                "features_gain_captured", "forecast_quality_features"} & set(report)
    with pytest.raises(ValueError, match=r"unknown durations variant.*sjf"):
        run_durations(nodes, pods, [0], make_runtime, cfg=cfg, variants=["sjf"])


def test_the_forecasters_past_holds_none_of_the_runs_own_jobs_and_ends_in_order():
    pods = load_pods(PODS)
    cfg = DynamicConfig(jobs=300)
    drawn = {w.id.rsplit("-", 1)[0] for _, w, _ in make_jobs(pods, 10_000, 3, cfg)}
    past = history(pods, 3, cfg)
    usable = [p for p in pods if p.deletion_s is not None and p.deletion_s > p.creation_s]
    assert len(past) == len(usable) - len(drawn)  # every other pod, once
    by_id = {p.workload.id: p for p in usable}
    seen = [p for p in usable if p.workload.id not in drawn]
    assert [s for _, s in past] == [min(p.deletion_s - p.creation_s, cfg.max_duration_s)
                                    for p in sorted(seen, key=lambda p: p.deletion_s)]
    assert all(keys[-1] == "*" for keys, _ in past) and len(by_id) == len(usable)


def test_a_forecaster_with_the_clusters_past_predicts_from_it_and_a_cold_one_does_not(small_nodes):
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    learned = {}
    for past in ("trace", "none"):
        cfg = DynamicConfig(jobs=50, node_fraction=0.3, fault_every_s=1e9, durations="forecast",
                            order="predicted", runtime_history=past)
        runtime = make_runtime()
        res = run_dynamic(nodes, pods, "gpuaware", 0, cfg, runtime=runtime)
        learned[past] = runtime.learned - sum(1 for j in res.jobs.values() if j.finish_s is not None)
    assert learned == {"trace": len(history(pods, 0, DynamicConfig(jobs=50))), "none": 0}


def test_the_features_ceiling_learns_the_runs_own_runtimes_ahead_and_predicted_does_not(small_nodes):
    import dataclasses

    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    base = DynamicConfig(jobs=50, node_fraction=0.3, fault_every_s=1e9)
    cfgs = {name: dataclasses.replace(base, **VARIANTS[name]) for name in ("predicted", "features_oracle")}
    usable = [p for p in pods if p.deletion_s is not None and p.deletion_s > p.creation_s]
    drawn = {w.id.rsplit("-", 1)[0] for _, w, _ in make_jobs(pods, 10_000, 0, base)}
    drawn_s = [min(p.deletion_s - p.creation_s, base.max_duration_s) for p in usable if p.workload.id in drawn]
    past = {name: sorted(s for _, s in history(pods, 0, cfg)) for name, cfg in cfgs.items()}
    # The ceiling's past is the live past plus the run's own jobs (each drawn pod once): it reads ahead.
    assert past["features_oracle"] == sorted(past["predicted"] + drawn_s) and len(drawn_s) == len(drawn) > 0
    learned_ahead = {}
    for name, cfg in cfgs.items():
        runtime = make_runtime()
        res = run_dynamic(nodes, pods, "gpuaware", 0, cfg, runtime=runtime)
        learned_ahead[name] = runtime.learned - sum(1 for j in res.jobs.values() if j.finish_s is not None)
    assert learned_ahead == {"predicted": len(usable) - len(drawn), "features_oracle": len(usable)}


def test_a_paired_gain_has_an_interval_that_excludes_zero_only_when_every_seed_agrees():
    from gpuaware.scheduler.core.workload import Workload
    from gpuaware.scheduler.sim.durations import _paired
    from gpuaware.scheduler.sim.jobs import DynamicResult, JobStats

    def result(jct: float) -> DynamicResult:
        r = DynamicResult("gpuaware", 0)
        r.jobs["a"] = JobStats(Workload("a"), 10.0, finish_s=jct)
        return r

    steady = _paired([result(80), result(90), result(85)], [result(100)] * 3)
    assert steady["jct_mean_paired"] == 0.15 and steady["jct_mean_ci95"][0] > 0
    mixed = _paired([result(80), result(120), result(100)], [result(100)] * 3)
    assert mixed["jct_mean_ci95"][0] < 0 < mixed["jct_mean_ci95"][1]


def test_a_paired_gain_counts_only_the_jobs_both_runs_finished():
    from gpuaware.scheduler.core.workload import Workload
    from gpuaware.scheduler.sim.durations import _paired
    from gpuaware.scheduler.sim.jobs import DynamicResult, JobStats

    def result(**finish) -> DynamicResult:
        r = DynamicResult("gpuaware", 0)
        for wid, at in finish.items():
            r.jobs[wid] = JobStats(Workload(wid), 10.0, finish_s=at)
        return r

    # The new run starves the long job b: it is not credited for b's absence.
    starving = _paired([result(a=100.0, b=None)] * 2, [result(a=100.0, b=10_000.0)] * 2)
    assert starving["jct_mean_paired"] == 0.0
