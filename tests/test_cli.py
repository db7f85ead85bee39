"""The command line as a user runs it: real processes, real signals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from contract import topics
from gpuaware.local.processes import pid_alive
from gpuaware.local.stream_workers import worker_env
from plumbing.kafka_settings import KafkaSettings

GPUAWARE = [sys.executable, "-m", "gpuaware"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUAWARE_")}


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUAWARE, *args], capture_output=True, text=True, timeout=timeout, env=env or ENV)


def start_broker(*args: str) -> tuple[subprocess.Popen[str], str, int]:
    proc = subprocess.Popen([*GPUAWARE, "broker", "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    line = proc.stdout.readline()
    assert line.startswith("READY "), (line, proc.stderr.read() if proc.poll() is not None else "")
    fields = dict(part.split("=", 1) for part in line.split()[1:])
    return proc, fields["bootstrap"], int(fields["pid"])


async def _produce_and_consume(bootstrap: str) -> list[bytes]:
    settings = KafkaSettings(bootstrap_servers=bootstrap, embedded_broker_compat=True, session_timeout_ms=2000)
    producer = AIOKafkaProducer(**settings.producer_kwargs())
    await producer.start()
    try:
        await producer.send_and_wait(topics.EVENTS, b"hello", key=b"GPU-1")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topics.EVENTS, **settings.consumer_kwargs("cli-test"))
    await consumer.start()
    try:
        async with asyncio.timeout(20):
            return [(await consumer.getone()).value]
    finally:
        await consumer.stop()


def _wait_gone(pid: int, timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.broker
def test_broker_serves_clients_and_ctrl_c_leaves_nothing_behind():
    proc, bootstrap, tansu_pid = start_broker()
    try:
        assert pid_alive(tansu_pid)
        assert asyncio.run(_produce_and_consume(bootstrap)) == [b"hello"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait_gone(tansu_pid), "tansu outlived gpuaware broker"


@pytest.mark.broker
def test_the_broker_child_dies_even_when_gpuaware_is_killed_hard():
    proc, _, tansu_pid = start_broker()
    proc.kill()
    proc.wait(10)
    assert _wait_gone(tansu_pid), "tansu outlived a SIGKILLed gpuaware broker"


@pytest.mark.broker
def test_a_taken_port_makes_broker_exit_with_a_clear_message():
    proc, bootstrap, _ = start_broker()
    try:
        port = bootstrap.rsplit(":", 1)[1]
        second = run("broker", "--port", port, timeout=30)
        assert second.returncode == 1
        assert f"port {port} on 127.0.0.1 is already in use" in second.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


@pytest.mark.broker
def test_up_runs_the_simulated_cluster_and_every_fault_gets_a_reaction(tmp_path):
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(
        "name: quick\nseed: 9\nnodes: 2\ngpus_per_node: 4\nmodels: [H100]\nfaults:\n"
        "  - {kind: xid, node: 0, gpu: 1, at_s: 2, xid: 79}\n"
        "  - {kind: ecc_dbe, node: 1, gpu: 3, at_s: 3}\n"
        "  - {kind: dead, node: 1, gpu: 0, at_s: 3}\n")
    result = run("up", "--port", "0", "--duration", "10", "--json", "--scenario", str(scenario))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["topics"] == sorted(t.name for t in topics.ALL_TOPICS)
    assert summary["nodes"] == 2 and summary["gpus"] == 8 and summary["samples"] > 0
    assert summary["watch_reads"] >= 8 * 5
    assert [f["injected"] for f in summary["faults"]] == [True, True, True]
    assert all(f["agent_reaction_s"] is not None and f["agent_reaction_s"] <= 3 for f in summary["faults"])
    assert summary["health_bands"]["lost"] == 1 and summary["health_bands"]["critical"] >= 1
    # The stream worker ran beside the agents, published state, and stopped cleanly.
    stream = summary["stream"]
    assert stream["worker_exit_codes"] == {"stream-0": 0}
    assert stream["records"].get("gpu.state.v1", 0) > 0 and stream["gpus_with_state"] >= 7
    dbe = summary["faults"][1]
    assert dbe["stream_reaction_s"] is not None
    # The scheduler placed openb pods on the simulated nodes and took the failing GPUs out of service.
    assert summary["components"]["scheduler"] == "running"
    sched = summary["scheduler"]
    assert sched["placements"] > 0 and sched["pods_submitted"] >= sched["placements"] - sched["migrations"]
    assert all(f["scheduler_reaction_s"] is not None for f in summary["faults"]), summary["faults"]
    assert sched["cordons"] >= 1
    from gpuaware.local.prometheus import available

    if available():  # the local Prometheus evaluated the rules on the agent's metrics: the lost GPU pages
        assert "GpuLost" in summary["prometheus"]["alerts_firing"], summary["prometheus"]
    else:
        assert summary["prometheus"] is None


def test_bad_config_names_the_field_and_exits_2(tmp_path):
    cfg = tmp_path / "gpuaware.yaml"
    cfg.write_text("broker:\n  storage: floppy\n")
    result = run("--config", str(cfg), "broker")
    assert result.returncode == 2
    assert "broker.storage" in result.stderr and f"file {cfg}" in result.stderr
    result = run("config", env={**ENV, "GPUAWARE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"})
    assert result.returncode == 2 and "kafka.sasl_mechanism" in result.stderr


def test_config_shows_the_merged_configuration_without_secrets():
    env = {**ENV, "GPUAWARE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL", "GPUAWARE_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
           "GPUAWARE_KAFKA__SASL_USERNAME": "agent", "GPUAWARE_KAFKA__SASL_PASSWORD": "hunter2"}
    result = run("--bootstrap-servers", "kafka:9093", "config", env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["kafka"]["bootstrap_servers"] == "kafka:9093"
    assert shown["kafka"]["sasl_username"] == "agent"
    assert "hunter2" not in result.stdout


@pytest.mark.parametrize("command", ["agent", "stream", "scheduler", "simulate", "eval", "bench", "broker", "up",
                                     "config"])
def test_every_subcommand_has_help(command):
    result = run(command, "--help")
    assert result.returncode == 0 and "Usage: gpuaware" in result.stdout


def test_scheduler_process_binds_pods_serves_metrics_and_stops_on_sigterm():
    import signal
    import socket
    import time
    import urllib.request

    from gpuaware.local.fake_apiserver import FakeApiServer, make_node, make_pod

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    metrics, extender = free_port(), free_port()
    with FakeApiServer() as fake:
        fake.create("nodes", make_node("n0", gpus=4))
        for i in range(3):
            fake.create("pods", make_pod(f"p{i}", gpus=1))
        proc = subprocess.Popen([*GPUAWARE, "scheduler", "--api-server", fake.url, "--no-state-feed",
                                 "--metrics-port", str(metrics), "--extender-port", str(extender)],
                                env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(p["spec"].get("nodeName") for p in fake.objects("pods")):
                time.sleep(0.1)
            assert all(p["spec"].get("nodeName") == "n0" for p in fake.objects("pods"))
            ready = urllib.request.urlopen(f"http://127.0.0.1:{extender}/readyz", timeout=5)
            assert ready.status == 200
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
            assert 'gpuaware_scheduler_decisions_total{action="PLACE",reason="fits"} 3.0' in text
            assert "gpuaware_scheduler_leader 1.0" in text
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err


@pytest.mark.parametrize(("env", "message"), [
    ({"GPUAWARE_SCHEDULER__POLICY": "fastest"}, "scheduler.policy: 'fastest' is not one of"),
    ({"GPUAWARE_SCHEDULER__RENEW_EVERY_S": "20"}, "scheduler.renew_every_s: 20.0 must be below renew_deadline_s"),
])
def test_scheduler_rejects_bad_config_with_the_field(env, message):
    result = run("scheduler", env={**ENV, **env})
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.broker
def test_agent_runs_on_simulated_gpus_and_stops_cleanly(kafka_settings, tmp_path):
    env = {**ENV, **worker_env(kafka_settings)}  # the session broker's settings, SASL included
    result = run("agent", "--collector", "sim", "--scenario", "xid",
                 "--spool-dir", str(tmp_path / "spool"), "--metrics-port", "0", "--duration", "4", env=env)
    assert result.returncode == 0, result.stderr
    assert "agent stopped" in result.stderr and "0 records spooled, 0 dropped" in result.stderr


def test_agent_rejects_a_bad_policy_at_start(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("floor_s: 0\n")
    result = run("agent", "--collector", "sim", "--policy", str(policy), "--spool-dir", str(tmp_path))
    assert result.returncode == 2
    assert "floor_s" in result.stderr


def test_eval_sampling_prints_the_figures_as_json():
    result = run("eval", "sampling", "--scenario", "ecc", "--scenario", "stuck-dead", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("sample_reduction", "util_mae_pct_points", "faults_injected", "faults_detected",
                "detection_delay_p95_s", "false_alarms"):
        assert key in figures
    assert figures["faults_injected"] == 4 and figures["scenarios"] == ["ecc", "stuck-dead"]


@pytest.mark.broker
def test_bench_agent_prints_the_figures_as_json():
    result = run("bench", "agent", "--seconds", "3", "--gpus", "2", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("cpu_percent_of_core", "rss_mib", "bytes_per_gpu_sample", "dcgm_text_bytes_per_gpu"):
        assert figures[key] > 0, key
    assert figures["gpus"] == 2 and figures["spool_dropped"] == 0
