"""The dynamic simulator's stream model: replayed usage, Gavel co-location slowdown, the physical model,
forecasts from an injected forecaster, OOM and SLO violations, and the ablation's figures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.policy_specs import LIVE_STREAM
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.sim.ablation import run_ablation, variants
from gpuaware.scheduler.sim.jobs import DynamicConfig
from gpuaware.scheduler.sim.openb import load_nodes, load_pods
from gpuaware.scheduler.sim.stream_model import JOB_MEMORY_MIB, StreamConfig, StreamModel, fewest_gpus
from tests.support import OPENB_PODS, LastValue, cluster


def physics(model, util, temp, dt):
    return 100 + 200 * util, 30 + 50 * util, 300.0


GAVEL = {"v100": {"('ResNet-50 (batch size 64)', 1)": {"null": 10.0, "('ResNet-50 (batch size 64)', 1)": [5.0, 5.0]}}}


def _model(util, mem, parts=("forecast", "thermal"), table=None, recharge=True):
    series = [(np.full(100, util, dtype=float), np.full(100, mem, dtype=float))]
    return StreamModel(series, LastValue, physics, None, table,
                       StreamConfig(parts=frozenset(parts), warmup_ticks=2, recharge=recharge))


def _run(model, c, jobs, ticks=1):
    running = {}
    for i, (milli, cls, *charged) in enumerate(jobs):
        w = model.prepare(Workload(f"j{i}", 0, 0, 1, milli, labels={"gavel_class": cls} if cls else {}))
        a = Allocation(w.id, 0, [0], [charged[0] if charged else milli], 0, 0, [w.gpu_memory_mib], "shared")
        c.allocate(a)
        running[w.id] = Running(w, a, float(i), 0.0, None)
        model.started(w, float(i))
    for k in range(ticks):
        out = model.tick(60.0 * (k + 1), c, running, [])
    return out, running


def test_usage_replays_the_series_and_the_physical_model_feeds_the_thermal_signal():
    model, c = _model(20.0, 1.0), cluster(2)
    model.attach(c)
    out, _ = _run(model, c, [(500, None)])
    assert out.speed == {"j0": 1.0} and not out.kill
    assert model.figures.busy_gpu_s == 60.0 * 0.5 * 0.2 and model.figures.occupied_gpu_s == 60.0
    assert c.live.all() and c.temp[0, 0] == 30 + 50 * 0.1 and c.power_limit[0, 0] == 300.0
    assert c.forecast_util[0, 0] == 50.0  # not warmed up: the request


def test_without_the_thermal_part_the_scheduler_sees_no_temperature():
    model, c = _model(20.0, 1.0, parts=("forecast",)), cluster(2)
    _run(model, c, [(500, None)])
    assert (c.temp == 0).all()


def test_after_warm_up_a_shared_job_is_charged_its_forecast_not_its_request():
    model, c = _model(20.0, 1.0), cluster(2)
    out, _ = _run(model, c, [(500, None)], ticks=3)
    milli, mem = out.recharge["j0"]
    assert milli == int(np.ceil(1000 * 0.5 * 0.22 * 1.1)) and mem == JOB_MEMORY_MIB // 2
    assert c.forecast_util[0, 0] == 50.0 * 0.22


def test_re_charging_is_off_by_default_the_forecast_is_still_written():
    # It did not pay in the ablation (docs/scheduling.md): the forecast part filters and scores only.
    assert StreamConfig().recharge is False
    model, c = _model(20.0, 1.0, recharge=False), cluster(2)
    out, _ = _run(model, c, [(500, None)], ticks=3)
    assert out.recharge == {} and c.forecast_util[0, 0] == 50.0 * 0.22


def test_the_oracle_charges_a_shared_job_the_peak_its_run_will_reach_from_its_first_tick():
    # The ceiling of overcommitting by forecast: no warm-up, no margin, the peak read ahead over the job's run
    # (four times its trace duration), not past it.
    series = [(np.r_[np.full(50, 20.0), np.full(50, 90.0)], np.r_[np.full(50, 0.4), np.full(50, 0.8)])]
    model = StreamModel(series, LastValue, physics, None, None, StreamConfig(parts=frozenset(), oracle="run"))
    c = cluster(2)
    w = model.prepare(Workload("j0", 0, 0, 1, 500, duration_s=600.0))  # 10 minutes: 42 read ahead
    a = Allocation(w.id, 0, [0], [500], 0, 0, [w.gpu_memory_mib], "shared")
    c.allocate(a)
    model.started(w, 0.0)
    model.jobs["j0"].offset = 0
    out = model.tick(60.0, c, {"j0": Running(w, a, 0.0, 0.0, None)}, [])
    assert out.recharge["j0"] == (int(1000 * 0.5 * 0.2), int(np.ceil(JOB_MEMORY_MIB * 0.5 * 0.4)))  # not 0.9 and 0.8


def test_the_horizon_oracle_charges_the_peak_of_the_next_horizon_every_tick():
    series = [(np.r_[np.full(50, 20.0), np.full(50, 90.0)], np.r_[np.full(50, 0.4), np.full(50, 0.8)])]
    cfg = StreamConfig(parts=frozenset(), oracle="horizon", horizon_ticks=15)
    model = StreamModel(series, LastValue, physics, None, None, cfg)
    c = cluster(2)
    w = model.prepare(Workload("j0", 0, 0, 1, 500, duration_s=600.0))
    a = Allocation(w.id, 0, [0], [500], 0, 0, [w.gpu_memory_mib], "shared")
    c.allocate(a)
    model.started(w, 0.0)
    model.jobs["j0"].offset = 0
    running = {"j0": Running(w, a, 0.0, 0.0, None)}
    assert model.tick(60.0, c, running, []).recharge["j0"] == (100, int(np.ceil(JOB_MEMORY_MIB * 0.5 * 0.4)))
    model.jobs["j0"].offset = 33  # minute 1 of the job: it reads minutes 34-49 ahead, all in the first half
    assert model.tick(60.0, c, running, []).recharge["j0"] == (100, int(np.ceil(JOB_MEMORY_MIB * 0.5 * 0.4)))
    model.jobs["j0"].offset = 34  # minutes 35-50: the last of them is the second half's 90% and 0.8
    assert model.tick(60.0, c, running, []).recharge["j0"] == (450, int(np.ceil(JOB_MEMORY_MIB * 0.5 * 0.8)))


def test_the_demand_outlook_carries_the_forecast_point_and_upper_end():
    model, c = _model(20.0, 1.0, parts=("demand",)), cluster(2)
    _run(model, c, [(500, None)])  # a quarter of the cluster allocated
    out = model.outlook()
    assert out.mean_share == 0.25 and out.upper_share == 0.25 * 1.1 and out.horizon_s == 15 * 60.0


def test_an_unknown_oracle_is_refused_with_the_field():
    with pytest.raises(ValueError, match=r"StreamConfig\.oracle"):
        StreamModel([(np.ones(3), np.ones(3))], LastValue, physics, cfg=StreamConfig(oracle="yes"))


def test_without_the_forecast_part_nothing_is_recharged():
    model, c = _model(20.0, 1.0, parts=()), cluster(2)
    out, _ = _run(model, c, [(500, None)], ticks=3)
    assert out.recharge == {} and (c.forecast_util == 0).all()


def test_memory_over_the_gpu_oom_kills_the_newest_tenant_and_compute_over_it_slows_everyone():
    model, c = _model(100.0, 1.0), cluster(2)
    c.gpu_mem_cap[:] = c.gpu_mem_free[:] = JOB_MEMORY_MIB * 2  # room to overcommit in the allocation
    out, _ = _run(model, c, [(600, None, 400), (600, None, 400)])  # charged 400 each (their forecast)
    assert model.figures.oom == 0 and model.figures.contention == 1
    assert out.speed["j0"] == out.speed["j1"] == 1000 / 1200
    model, c = _model(10.0, 1.0), cluster(2)
    c.gpu_mem_cap[:] = JOB_MEMORY_MIB  # the allocation below says 2 x 0.6 fits; the memory the jobs use does not
    c.gpu_mem_free[:] = JOB_MEMORY_MIB * 2
    out, _ = _run(model, c, [(600, None, 400), (600, None, 400)])
    assert out.kill == ["j1"] and model.summary()["violations"] == 1


def test_co_located_busy_jobs_slow_each_other_by_the_gavel_pair():
    table = ThroughputTable.from_gavel(json.loads(json.dumps(GAVEL)))
    model, c = _model(100.0, 0.1, table=table), cluster(2)
    out, _ = _run(model, c, [(500, "ResNet-50 (batch size 64)"), (500, "ResNet-50 (batch size 64)")])
    assert out.speed == {"j0": 0.5, "j1": 0.5}


def _place(model, c, jobs, ticks):
    """Each (GPU, milli) a job alone on that GPU of node 0, ticked ``ticks`` minutes."""
    running = {}
    for i, (g, milli) in enumerate(jobs):
        w = model.prepare(Workload(f"j{i}", 0, 0, 1, milli))
        a = Allocation(w.id, 0, [g], [milli], 0, 0, [w.gpu_memory_mib], "shared" if w.shares_gpu else "exclusive")
        c.allocate(a)
        running[w.id] = Running(w, a, 0.0, 0.0, None)
        model.started(w, 0.0)
        model.jobs[w.id].offset = 0  # minute k reads sample k of the series
    for k in range(ticks):
        model.tick(60.0 * (k + 1), c, running, [])


def test_the_busy_share_bound_re_packs_the_shared_jobs_memory_each_minute_and_keeps_whole_gpus():
    # Minute 1: memory at a quarter of the series' peak, minute 2 at half.
    series = [(np.full(10, 20.0), np.array([1.0, 1.0, 2.0] + [4.0] * 7))]
    model = StreamModel(series, LastValue, physics, cfg=StreamConfig(parts=frozenset(), mem_margin=0.2))
    c = cluster(3)
    model.attach(c)
    _place(model, c, [(0, 500), (1, 500), (2, 1000)], ticks=2)
    f = model.figures
    assert f.occupied_gpu_s == 2 * 3 * 60.0
    # Two half-GPU jobs (8 GiB each of a 16 GiB card) use 2 x 2 GiB, then 2 x 4 GiB: a quarter, then half a
    # GPU; the whole-GPU job's GPU is held either way.
    assert f.packed_gpu_s == (1 + 0.25) * 60.0 + (1 + 0.5) * 60.0
    assert f.packed_margin_gpu_s == pytest.approx((1 + 0.25 * 1.2) * 60.0 + (1 + 0.5 * 1.2) * 60.0)
    s = model.summary()
    assert f.used_gpu_s == f.busy_gpu_s == 2 * 60.0 * 0.2 * (0.5 + 0.5 + 1.0)
    assert s["busy_share_bound"] == f.used_gpu_s / f.packed_gpu_s > s["busy_share_bound_margin"] > s["busy_share"]


def test_the_busy_share_bound_of_whole_gpu_work_is_its_busy_share():
    series = [(np.full(10, 20.0), np.full(10, 1.0))]
    model = StreamModel(series, LastValue, physics, cfg=StreamConfig(parts=frozenset()))
    c = cluster(2)
    model.attach(c)
    _place(model, c, [(0, 1000), (1, 1000)], ticks=2)
    s = model.summary()
    assert s["busy_share_bound"] == s["busy_share_bound_margin"] == s["busy_share"] == 0.2


def test_the_bound_fills_the_largest_cards_first():
    caps = np.array([32768, 16384, 16384])
    assert fewest_gpus(0.0, caps) == 0.0
    assert fewest_gpus(16384.0, caps) == 0.5
    assert fewest_gpus(32768.0 + 8192, caps) == 1.5
    assert fewest_gpus(65536.0 + 16384, caps) == 4.0  # past every card: more than the cluster has


def test_the_ablation_reports_every_variant_with_the_issue_keys(small_nodes):
    nodes, pods = load_nodes(small_nodes), load_pods(OPENB_PODS)
    series = [(np.linspace(0, 40, 60), np.linspace(0.5, 1.0, 60))]

    def make(parts):
        return StreamModel(series, LastValue, physics, None, None, StreamConfig(parts=parts))

    cfg = DynamicConfig(jobs=60, node_fraction=0.3, check_invariants=True)
    report = run_ablation(nodes, pods, [0], make, cfg)
    assert set(report["variants"]) == set(variants()) == {"all", "without-forecast", "without-fingerprint",
                                                          "without-thermal", "without-demand", "without-all", "live"}
    assert report["live_parts"] == sorted(LIVE_STREAM) and set(report["live_vs_without_all"]) == set(
        report["all_vs_without_all"])
    for v in report["variants"].values():
        assert {"wait_high_mean_s", "wait_high_p95_s", "jct_mean_s", "busy_share", "allocated_gpu_pct", "preemptions",
                "violations"} <= set(v)
        # With jobs charged their requests (no re-charging), no GPU holds more memory than it has: the bound holds.
        assert 0 < v["busy_share"] <= v["busy_share_bound_margin"] <= v["busy_share_bound"] and v["unfinished"] == 0
    assert set(report["ceilings"]) == set(report["ceilings_vs_without_all"]) == {"oracle-overcommit", "oracle-horizon"}
    assert set(report["ceilings_vs_without_all"]["oracle-horizon"]) == set(report["all_vs_without_all"])
    assert report["ceilings"]["oracle-overcommit"]["violations"] == 0  # it reads ahead: nothing outgrows its charge
    assert report["all_vs_without_all"]["busy_share_bound"] == round(
        report["variants"]["all"]["busy_share_bound"] / report["variants"]["without-all"]["busy_share"] - 1, 4)
