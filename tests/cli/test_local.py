"""`gpuaware broker` as a user runs it: it serves clients, leaves no child behind on Ctrl-C or SIGKILL, and
a taken port is a clear error."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gpuaware.contract import topics
from gpuaware.local.processes import pid_alive
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.support import ENV, GPUAWARE, run


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
