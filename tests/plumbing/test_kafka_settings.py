from __future__ import annotations

import ssl

import faust
import pytest
from pydantic import ValidationError

from gpuaware.plumbing.kafka_settings import KafkaSettings


def test_plaintext_defaults_are_safe_for_real_kafka():
    s = KafkaSettings(bootstrap_servers="kafka-0:9092,kafka-1:9092")
    kw = s.producer_kwargs()
    assert kw["acks"] == "all" and kw["enable_idempotence"] is True and kw["compression_type"] == "zstd"
    assert "ssl_context" not in kw and "sasl_mechanism" not in kw
    assert s.consumer_kwargs("g")["enable_auto_commit"] is False
    assert s.faust_settings()["broker"] == "kafka://kafka-0:9092;kafka://kafka-1:9092"


def test_embedded_broker_compat_turns_idempotence_off():
    assert KafkaSettings(embedded_broker_compat=True).producer_kwargs()["enable_idempotence"] is False


def test_scram_over_tls_reaches_aiokafka_and_faust_alike():
    s = KafkaSettings(bootstrap_servers="kafka:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                      sasl_username="gpuaware-agent", sasl_password="s3cret")
    kw = s.common_kwargs()
    assert kw["security_protocol"] == "SASL_SSL"
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kw["sasl_plain_username"], kw["sasl_plain_password"]) == ("gpuaware-agent", "s3cret")
    assert isinstance(kw["ssl_context"], ssl.SSLContext)
    creds = s.faust_settings()["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.mechanism.value == "SCRAM-SHA-512" and creds.protocol.value == "SASL_SSL"
    assert "s3cret" not in repr(s)


def test_tls_only_gives_faust_ssl_credentials():
    creds = KafkaSettings(security_protocol="SSL").faust_settings()["broker_credentials"]
    assert isinstance(creds, faust.SSLCredentials)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"security_protocol": "SASL_SSL"}, "sasl_mechanism: required"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}, "both are required"),
        ({"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"}, "does not use SASL"),
        ({"bootstrap_servers": "kafka"}, "'kafka' is not host:port"),
        ({"bootstrap_servers": " , "}, "at least one host:port"),
        ({"ssl_certfile": "/c.pem"}, "give both"),
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"compression": "brotli"}, "compression"),
        ({"bootstrap": "x:1"}, "bootstrap"),
        ({"fetch_max_wait_ms": 1500, "request_timeout_ms": 1000}, "fetch_max_wait_ms: 1500 must be below"),
    ],
)
def test_bad_settings_are_rejected_with_the_field(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        KafkaSettings(**kwargs)
