"""What every command shares: configuration merged from file, env and flags; a bad value names the field and
exits 2; `gpuaware config` shows the result without secrets."""

from __future__ import annotations

import json

from tests.support import ENV, run


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
