"""`gpuaware bench` as a user runs it: the agent benchmark prints its figures as JSON."""

from __future__ import annotations

import json

import pytest

from tests.support import run


@pytest.mark.broker
def test_bench_agent_prints_the_figures_as_json():
    result = run("bench", "agent", "--seconds", "3", "--gpus", "2", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("cpu_percent_of_core", "rss_mib", "bytes_per_gpu_sample", "dcgm_text_bytes_per_gpu"):
        assert figures[key] > 0, key
    assert figures["gpus"] == 2 and figures["spool_dropped"] == 0


@pytest.mark.broker
def test_bench_agent_on_the_nvml_collector_reads_this_machines_gpus_or_says_why_not():
    import pynvml

    try:
        pynvml.nvmlInit()
        gpus = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        gpus = 0
    result = run("bench", "agent", "--collector", "nvml", "--seconds", "2", "--json", timeout=120)
    if gpus:
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["gpus"] == gpus
    else:  # CI: no driver; one line naming the cause, not a traceback
        assert result.returncode == 1 and "NVML is not available on this machine" in result.stderr
        assert "Traceback" not in result.stderr


def test_bench_pipeline_on_apache_kafka_joins_groups_with_a_session_it_accepts():
    # The 2 s session the embedded broker's benches use made every worker's group join fail
    # (InvalidSessionTimeoutError) on Apache Kafka, whose minimum is 6 s.
    from gpuaware.cli.bench import APACHE_MIN_SESSION_TIMEOUT_MS, apache_client_settings
    from gpuaware.plumbing.kafka_settings import KafkaSettings

    class Broker:
        def kafka_settings(self, **overrides):
            return KafkaSettings(bootstrap_servers="127.0.0.1:9092", **overrides)

    assert apache_client_settings(Broker()).session_timeout_ms >= APACHE_MIN_SESSION_TIMEOUT_MS


def test_bench_scheduler_rejects_unknown_modes_and_budgets_before_starting_anything():
    result = run("bench", "scheduler", "--modes", "kube_scheduler,volcano", timeout=60)
    assert result.returncode == 2 and "kube_scheduler,extender,gpuaware" in result.stderr
    result = run("bench", "scheduler", "--budgets", "huge", timeout=60)
    assert result.returncode == 2 and "default, raised or both" in result.stderr
    # A mode's pods are named after it: a second turn of it in one run met the first one's (negative pods/s).
    result = run("bench", "scheduler", "--dra", "--modes", "ceiling_dra,gpuaware_dra,ceiling_dra", timeout=60)
    assert result.returncode == 2 and "each mode once" in result.stderr
    result = run("bench", "scheduler", "--dra", "--dra-fraction", "memory", "--modes", "ceiling_dra", timeout=60)
    assert result.returncode == 2 and "ceiling_dra hands out whole devices" in result.stderr


def test_the_real_bench_writes_the_same_trace_pods_for_each_mode_as_that_mode_needs_them():
    from gpuaware.bench.kube_bench import bench_pods, kwok_nodes
    from tests.support import OPENB_NODES, OPENB_PODS

    if not OPENB_PODS.is_file():
        pytest.skip("the openb traces are not in ../shared/traces")
    nodes = kwok_nodes(OPENB_NODES)
    assert len(nodes) == 1213 and all(n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake" for n in nodes)
    by_mode = {m: bench_pods(OPENB_PODS, 300, 7, "p", m) for m in ("kube_scheduler", "extender", "gpuaware")}
    assert [(n, milli) for n, milli, _ in by_mode["kube_scheduler"]] == [(n, m) for n, m, _ in by_mode["gpuaware"]]
    pods = {m: [json.loads(body) for _, _, body in p] for m, p in by_mode.items()}
    fractional = [i for i, p in enumerate(pods["gpuaware"]) if "gpuaware.io/gpu-milli" in p["metadata"]["annotations"]]
    assert fractional, "the sample has fractional pods"
    for i in fractional:  # kube-scheduler alone can only give a whole GPU; the others ask for the fraction
        limits = pods["kube_scheduler"][i]["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/gpu": "1"} and not pods["kube_scheduler"][i]["metadata"]["annotations"]
        assert "limits" not in pods["extender"][i]["spec"]["containers"][0]["resources"]
    assert {p["spec"]["schedulerName"] for p in pods["gpuaware"]} == {"gpuaware"}
    assert {p["spec"]["schedulerName"] for p in pods["extender"]} == {"default-scheduler"}


def test_bench_scheduler_dra_names_its_own_modes_and_scale_knob_before_starting_anything():
    result = run("bench", "scheduler", "--dra", "--modes", "extender", timeout=60)
    assert result.returncode == 2 and "kube_scheduler_dra,gpuaware_dra,ceiling_dra" in result.stderr
    result = run("bench", "scheduler", "--kube", "fake", "--node-count", "5", timeout=60)
    assert result.returncode == 2 and "only on the real control plane" in result.stderr
    result = run("bench", "scheduler", "--kube", "fake", "--dra", timeout=60)
    assert result.returncode == 2 and "--dra needs the real control plane" in result.stderr
