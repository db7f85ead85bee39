"""Stream workers as child processes: the environment that carries their Kafka settings."""

from __future__ import annotations

import pytest

from gpuaware.config import load_config
from gpuaware.local.stream_workers import StreamWorkerProcess, worker_env
from gpuaware.plumbing.kafka_settings import KafkaSettings


def test_worker_env_carries_sasl_and_tls_settings_to_the_child():
    settings = KafkaSettings(
        bootstrap_servers="kafka-0:9093,kafka-1:9093", security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512", sasl_username="gpuaware-stream", sasl_password="s3cret",
        ssl_cafile="/etc/kafka/ca.crt", ssl_certfile="/etc/kafka/user.crt", ssl_keyfile="/etc/kafka/user.key",
        ssl_check_hostname=False, session_timeout_ms=6000,
    )
    env = worker_env(settings, app_id="w-1")
    assert env["GPUAWARE_KAFKA__SASL_PASSWORD"] == "s3cret"
    assert env["GPUAWARE_STREAM__APP_ID"] == "w-1"
    child = load_config(None, environ=env)
    assert child.kafka == settings
    assert child.kafka.sasl_password.get_secret_value() == "s3cret"


def test_worker_env_of_a_plaintext_broker_sets_no_sasl():
    env = worker_env(KafkaSettings(bootstrap_servers="127.0.0.1:1234", embedded_broker_compat=True))
    assert not [name for name in env if "SASL" in name or name.endswith("FILE")]
    assert load_config(None, environ=env).kafka.embedded_broker_compat is True


def test_a_worker_child_is_started_with_node_identity_said_explicitly(tmp_path):
    """The stream requires node tokens by default; a child started without an apiserver must say ``off`` itself."""
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:1234")
    with pytest.raises(TypeError, match="node_identity"):
        StreamWorkerProcess(kafka, "w", tmp_path, "w-0")  # type: ignore[call-arg]
    worker = StreamWorkerProcess(kafka, "w", tmp_path, "w-0", node_identity="off")
    assert load_config(None, environ=worker.env).stream.node_identity == "off"
    assert load_config(None, environ=worker_env(kafka)).stream.node_identity == "required"
