"""The test session's broker choice (tests/support.py, used by the ``kafka_settings`` fixture)."""

from __future__ import annotations

import os

import pytest

from tests.support import chosen_broker


def test_ci_runs_the_broker_tests_on_apache_kafka_unless_told_otherwise():
    assert chosen_broker({"CI": "true"}) == "apache"
    assert chosen_broker({}) == "tansu"
    assert chosen_broker({"CI": "true", "GPUAWARE_TEST_BROKER": "tansu"}) == "tansu"
    assert chosen_broker({"GPUAWARE_TEST_BROKER": "apache"}) == "apache"
    with pytest.raises(ValueError, match="GPUAWARE_TEST_BROKER='kafka'"):
        chosen_broker({"GPUAWARE_TEST_BROKER": "kafka"})


@pytest.mark.broker
def test_on_apache_kafka_the_session_uses_the_production_client_settings(kafka_settings):
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or chosen_broker() != "apache":
        pytest.skip("the session broker is not the Apache Kafka one")
    assert kafka_settings.embedded_broker_compat is False
    producer = kafka_settings.producer_kwargs()
    assert producer["enable_idempotence"] is True and producer["acks"] == "all"
    assert kafka_settings.security_protocol == "SASL_PLAINTEXT" and kafka_settings.sasl_mechanism == "SCRAM-SHA-512"
