"""The live view of `gpuaware up`, rendered to text at a given terminal size."""

from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace

import pytest
from rich.console import Console

from gpuaware.agent.collectors.sim import Scenario, SimCluster
from gpuaware.agent.runtime import AgentRuntime
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract.events import (
    ClusterForecast,
    DecisionAction,
    EventKind,
    GpuEvent,
    ModelDemand,
    Severity,
)
from gpuaware.local.stack import StackState
from gpuaware.local.view import StackView
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.core.runtime import RuntimeEstimate
from gpuaware.scheduler.kube.decisions import Outcome
from gpuaware.scheduler.metrics import QueueSnapshot, SchedulerStats


@pytest.fixture
def runtime(tmp_path) -> AgentRuntime:
    scenario = Scenario.model_validate({"name": "view", "seed": 1, "nodes": 2, "gpus_per_node": 4,
                                        "models": ["H100", "T4"], "workloads": ["training-compute"]})
    return AgentRuntime(SimCluster(scenario).collectors(), KafkaSettings(bootstrap_servers="127.0.0.1:1"),
                        SamplingPolicy(), str(tmp_path / "spool"))


def _event(runtime: AgentRuntime, node: int, index: int, n: int = 0) -> GpuEvent:
    core = runtime.cores[node]
    return GpuEvent(event_id=f"e{node}-{index}-{n}", ts_ms=1_700_000_000_000 + n, node=core.node,
                    gpu_uuid=core.tracks[index].device.uuid, kind=EventKind.XID, severity=Severity.CRITICAL,
                    message=f"XID 79 on {node}/{index}")


def _scheduler(decisions: int) -> SimpleNamespace:
    recent = deque(Outcome(f"team-a/job-{i:05d}", DecisionAction.PLACE, "sim-node-000",
                           ["sim-node-000 gpus=[0] by fgd+cpu_for_gpus+model_reservation; 7 candidates"])
                   for i in range(decisions))
    snapshot = QueueSnapshot(pending={("team-a", "high"): 1}, gpus_used={"team-a": 2.0}, gpus_quota={"team-a": 4.0})
    return SimpleNamespace(live=SimpleNamespace(sink=SimpleNamespace(recent=recent), snapshot=snapshot,
                                                cache=SimpleNamespace(running={}), stats=SchedulerStats()))


def _text(renderable, width: int = 160, height: int = 200) -> str:
    console = Console(width=width, height=height, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_events_name_the_gpu_by_node_and_index_not_by_a_uuid_tail_every_simulated_gpu_shares(runtime):
    uuids = [t.device.uuid for c in runtime.cores for t in c.tracks]
    assert len({u[-12:] for u in uuids}) == 1  # why the tail says nothing
    state = StackState()
    for node, index in ((0, 1), (1, 3)):
        state.on_event(_event(runtime, node, index))
    text = _text(StackView(runtime, state, "127.0.0.1:9092").events(8))
    assert uuids[0][-12:] not in text
    rows = [line for line in text.splitlines() if "XID" in line and "│" in line]
    assert [[cell.strip() for cell in row.split("│")[2:4]] for row in rows] == [
        [runtime.cores[1].node, "3"], [runtime.cores[0].node, "1"]]


def test_workload_classes_and_the_demand_forecast_are_separate_tables(runtime):
    state = StackState()
    for i, cls in enumerate(["training-compute-bound", "inference-steady", "inference-steady"]):
        state.gpu_states[f"GPU-{i}"] = SimpleNamespace(workload_class=cls)
    state.forecast = ClusterForecast(cluster="local", ts_ms=0, models=[
        ModelDemand(model="NVIDIA H100 80GB HBM3", horizon_s=300, demand_gpus=3.5, lower=2.0, upper=5.0,
                    capacity_gpus=4),
        ModelDemand(model="Tesla T4", horizon_s=300, demand_gpus=1.0, lower=0.5, upper=2.0, capacity_gpus=4)])
    view = StackView(runtime, state, "127.0.0.1:9092")
    classes, forecast = _text(view.workload_classes()), _text(view.demand_forecast())
    assert "inference-steady" in classes and "│    2 │" in classes and "Tesla T4" not in classes
    assert "Tesla T4" in forecast and "3.5 [2.0, 5.0]" in forecast and "inference" not in forecast
    # One row per class, one per model: no row pairs a class with an unrelated model.
    assert classes.count("│ training-compute-bound │") == 1 and forecast.count("│ Tesla T4 ") == 1


@pytest.mark.parametrize("height", [24, 40, 60])
def test_the_view_fits_the_terminal_so_live_never_leaves_copies_of_its_top(runtime, height):
    state = StackState()
    for n in range(8):
        state.on_event(_event(runtime, n % 2, n % 4, n))
    view = StackView(runtime, state, "127.0.0.1:9092", _scheduler(decisions=6))
    console = Console(width=160, height=height, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(view.frame(console))
    lines = console.export_text().splitlines()
    assert len(lines) <= height
    assert sum("gpuaware up — broker" in line for line in lines) == 1
    assert "samples published" in lines[-2]  # the totals always show, last


def test_a_tall_terminal_shows_every_section(runtime):
    state = StackState()
    state.on_event(_event(runtime, 0, 0))
    text = _text(StackView(runtime, state, "127.0.0.1:9092", _scheduler(decisions=6)).frame(
        Console(width=160, height=200)))
    for title in ("recent events", "stream: GPUs per workload class", "scheduler: queues per tenant",
                  "scheduler: recent decisions", "scheduler: job runtimes, predicted vs actual (none completed yet"):
        assert title in text
    assert "hidden to fit" not in text and text.count("team-a/job-") == 6


def test_a_narrow_terminal_cuts_the_free_text_not_the_names(runtime):
    state = StackState()
    state.on_event(_event(runtime, 1, 3))
    view = StackView(runtime, state, "127.0.0.1:9092", _scheduler(decisions=2))
    console = Console(width=80, height=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(view.frame(console))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if "XID" in line)
    assert runtime.cores[1].node in row and "XID 79 on 1/3" in row  # one line, names whole
    assert sum("│ PLACE  │ team-a/job-0000" in line and "sim-node-000" in line for line in lines) == 2


def test_the_runtimes_table_shows_each_completion_against_the_estimate_it_was_placed_with(runtime):
    sched = _scheduler(decisions=0)
    quality = sched.live.stats.forecasts
    for i, (p50, actual) in enumerate([(60.0, 50.0), (120.0, 150.0), (600.0, 900.0)]):
        quality.placed(f"team-a/job-{i:05d}", RuntimeEstimate(math.log(p50), 0.3, level="tenant"))
        quality.completed(f"team-a/job-{i:05d}", actual)
    quality.published = 3
    text = _text(StackView(runtime, StackState(), "127.0.0.1:9092", sched).runtimes())
    assert "(3 scored, Spearman 1.00, within p90 0.67; 3 published, 0 keys learned)" in text
    row = next(line for line in text.splitlines() if "job-00002" in line)
    assert [c.strip() for c in row.strip("│ ").split("│")] == ["team-a/job-00002", "tenant", "600", "881", "900"]
