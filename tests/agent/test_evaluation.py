"""Scenario evaluation on simulated GPUs: each fault is detected in time, healthy GPUs raise no alarm."""

from __future__ import annotations

import pytest

from gpuaware.agent.collectors.sim import load_scenario, scenario_library
from gpuaware.agent.evaluation import EXPECTED, SLOW, run_scenario


@pytest.mark.timeout(900)  # the library holds hour-long scenarios of 16 GPUs (inference-boxes, hot-room)
@pytest.mark.parametrize("path", [p for p in scenario_library() if load_scenario(p).faults], ids=lambda p: p.stem)
def test_each_fault_raises_its_event_and_drops_health(path):
    result = run_scenario(path)
    assert result.faults
    scenario = load_scenario(path)
    for f, fault in zip(result.faults, scenario.faults, strict=True):
        assert f.verdict_ok, f
        if f.quiet:  # below every rule's threshold (an idle board's fan): no alarm is the right answer
            continue
        assert f.detected, f"{f.kind} on {f.node}/{f.gpu} raised none of {EXPECTED[f.kind]}"
        if fault.kind in SLOW:  # a leak or a drift is judged by its lead, not by seconds after onset
            assert f.lead_time_s is None or f.crossed_s - f.at_s < 120 or f.lead_time_s <= -120, f
            assert f.health_min_after < f.health_before or f.expected[0] == "INFO", f
            continue
        # A failing fan (a slow drift, caught against the GPU's line and its peers) takes longer, a
        # telemetry collapse needs 3 bad reads of 5, a clock or power outlier 5 reads in a row.
        bound = 15.0 if fault.kind == "thermal_runaway" and fault.rise_c_per_s < 0.9 else (
            5.0 if fault.kind in ("telemetry_collapse", "clock_degraded", "power_skew") else 3.0)
        assert f.delay_s is not None and f.delay_s <= bound, f
        assert f.health_min_after < f.health_before, f
        assert f.verdict_ok, f
    assert result.false_alarms == 0
    assert result.false_remediations == 0


def test_healthy_gpus_raise_no_alarms_and_sampling_backs_off():
    result = run_scenario(next(p for p in scenario_library() if p.stem == "baseline"))
    assert result.false_alarms == 0
    assert result.samples_fixed / result.samples_adaptive >= 5
    assert result.abs_err_sum / result.abs_err_n <= 2.0


def test_a_drift_to_slowdown_is_graded_critical_with_its_lead_time_and_the_figures_say_so(tmp_path):
    out = _evaluate_one(tmp_path, "drift-lead", 8, "H200", ["{kind: thermal_drift, node: 0, gpu: 2, at_s: 600, "
                                                          "drift_c_per_s: 0.05}"], seed=7, workload="training-compute")
    (fault,) = out["faults"]
    assert (fault["verdict"], fault["action"]) == ("CRITICAL", "DRAIN") == tuple(fault["expected"])
    assert fault["lead_time_s"] is not None and fault["lead_time_s"] <= -120  # flagged before slowdown
    assert out["false_alarms_per_gpu_day"] == 0 and out["false_remediations"] == 0
    assert out["flagged_120s_before"] == out["predictive_faults"] == out["lead_120s_possible"] == 1


def test_a_growing_heat_source_is_critical_a_minute_after_it_shows_and_a_fan_that_stops_is_not(tmp_path):
    # A 0.2 °C/s drift from ~64 °C reaches slowdown ~156 s after it starts; a fan spinning down over 30 s
    # (the same rising settle point while it lasts) settles below slowdown.
    faults = ["{kind: thermal_drift, node: 0, gpu: 4, at_s: 900, drift_c_per_s: 0.2}",
              "{kind: fan_failure, node: 0, gpu: 2, at_s: 900, fan_factor: 1.3}"]
    out = _evaluate_one(tmp_path, "growth", 8, "H200", faults, seed=201, workload="training-compute")
    drift, fan = out["faults"]
    assert (drift["verdict"], drift["action"]) == ("CRITICAL", "DRAIN") == tuple(drift["expected"])
    assert drift["crossed_after_s"] >= 120 and drift["lead_time_s"] <= -80  # -61 s with 115 s of growth required
    assert (fan["verdict"], fan["action"]) == ("WARNING", "DRAIN") == tuple(fan["expected"])
    assert out["lead_120s_possible"] == out["predictive_faults"] == 1
    assert out["false_alarms"] == 0 and out["false_remediations"] == 0


def test_a_fan_spinning_down_over_a_minute_is_judged_at_the_grade_it_settles_at_and_its_worst_is_reported(tmp_path):
    # field/hopper-blackwell's B200 fan: 1.6x over a minute under training, settling below slowdown. While it spins
    # down its settle point rises as a drift's does (CRITICAL: a forecast); once it settles, the forecast is
    # withdrawn and the GPU is WARNING / drain, what it is. The drain stands throughout.
    out = _evaluate_one(tmp_path, "spin-down", 4, "B200", ["{kind: fan_failure, node: 0, gpu: 0, at_s: 900, "
                                                          "fan_factor: 1.6, ramp_s: 60}"],
                        seed=502, workload="training-compute")
    (fan,) = out["faults"]
    assert (fan["verdict"], fan["action"]) == ("WARNING", "DRAIN") == tuple(fan["expected"])
    assert (fan["verdict_worst"], fan["action_worst"]) == ("CRITICAL", "DRAIN") and fan["lead_time_s"] is None
    assert out["verdict_accuracy"] == 1.0 and out["verdict_accuracy_worst"] == 0.0 and out["verdicts_lowered"] == 1
    assert out["false_alarms"] == 0 and out["false_remediations"] == 0


def test_memory_wearing_out_is_critical_minutes_before_the_remap_limit():
    from gpuaware.agent.evaluation import SCENARIO_DIR, evaluate

    out = evaluate([SCENARIO_DIR / "hard" / "wear.yaml"])
    assert out["faults_detected"] == out["faults_injected"] == 3 and out["verdict_accuracy"] == 1.0
    assert all(f["lead_time_s"] <= -120 for f in out["faults"])  # rows remapped and pages retired alike
    assert out["false_alarms"] == 0 and out["false_remediations"] == 0


def _evaluate_one(tmp_path, name: str, gpus: int, model: str, faults: list[str], seed: int = 9,
                  workload: str = "idle-holding") -> dict:
    """``evaluate`` of a 1,500 s scenario of one node running ``workload``, with these faults."""
    from gpuaware.agent.evaluation import evaluate

    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nseed: {seed}\nduration_s: 1500\nnodes: 1\ngpus_per_node: {gpus}\n"
                    f"models: [{model}]\nworkloads: [{workload}]\nfaults:\n" + "".join(f"  - {f}\n" for f in faults))
    return evaluate([path])


def test_a_leak_graded_critical_in_the_runs_last_minutes_is_judged_by_whether_it_ran_out_after_the_run(tmp_path):
    # 10 MiB/s onto an idle holder's 40 % of an L4 from 300 s: exhausted (95 %) ~1550 s, 50 s after the run
    # ends. Flagged CRITICAL minutes before; the run's truth alone called that a false remediation.
    out = _evaluate_one(tmp_path, "late-leak", 2, "L4", ["{kind: memory_leak, node: 0, gpu: 1, at_s: 300, "
                                                         "leak_mib_per_s: 10}"])
    (fault,) = out["faults"]
    assert (fault["verdict"], fault["action"]) == ("CRITICAL", "DRAIN") == tuple(fault["expected"])
    assert fault["crossed_after_s"] > 1500 - 300 and fault["lead_time_s"] <= -120
    assert out["false_remediations"] == 0 and out["verdict_accuracy"] == 1.0


def test_a_fault_whose_effect_stays_below_every_threshold_is_expected_silent_not_missed(tmp_path):
    # A fan failing on an idle L40S (35 W: +2 °C, 50 °C from slowdown) and a 1 MiB/s leak hours from
    # exhaustion: no rule acts on either (docs/health.md, "Severity"); an alarm on them would be the defect.
    out = _evaluate_one(tmp_path, "quiet", 3, "L40S",
                         ["{kind: fan_failure, node: 0, gpu: 1, at_s: 600, fan_factor: 1.5}",
                          "{kind: memory_leak, node: 0, gpu: 2, at_s: 300, leak_mib_per_s: 1}"])
    assert out["faults_below_threshold"] == 2 and out["faults_injected"] == 0
    assert all(f["below_threshold"] and tuple(f["expected"]) == ("PASS", "NONE") for f in out["faults"])
    assert out["verdict_accuracy"] == 1.0 and out["false_alarms"] == 0 and out["false_remediations"] == 0
