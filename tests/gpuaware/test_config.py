from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuaware.config import NON_CONFIG_ENV, ConfigError, env_overrides, load_config
from tests.support import REPO


def test_defaults_without_any_source():
    cfg = load_config(None, environ={})
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.broker.storage == "memory"


def test_flags_beat_env_beat_file(tmp_path):
    path = tmp_path / "gpuaware.yaml"
    path.write_text("kafka:\n  bootstrap_servers: file:9092\n  client_id: from-file\nlog:\n  level: debug\n")
    env = {"GPUAWARE_KAFKA__BOOTSTRAP_SERVERS": "env:9092", "GPUAWARE_LOG__FORMAT": "json", "HOME": "/root"}
    cfg = load_config(path, environ=env, overrides={"kafka.bootstrap_servers": "flag:9092", "log.level": None})
    assert cfg.kafka.bootstrap_servers == "flag:9092"
    assert cfg.kafka.client_id == "from-file"
    assert cfg.log.level == "debug" and cfg.log.format == "json"
    cfg = load_config(path, environ=env)
    assert cfg.kafka.bootstrap_servers == "env:9092"


def test_env_values_are_typed():
    env = {"GPUAWARE_BROKER__PORT": "19092", "GPUAWARE_KAFKA__EMBEDDED_BROKER_COMPAT": "true"}
    cfg = load_config(None, environ=env)
    assert cfg.broker.port == 19092 and cfg.kafka.embedded_broker_compat is True


def test_config_file_from_env(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cluster: prod-eu\n")
    assert load_config(None, environ={"GPUAWARE_CONFIG": str(path)}).cluster == "prod-eu"


@pytest.mark.parametrize(
    ("yaml_text", "env", "field", "source"),
    [
        ("broker:\n  port: 70000\n", {}, "broker.port", "file"),
        ("broker:\n  storage: disk\n", {}, "broker.storage", "file"),
        ("kafka:\n  bootstrap_server: x:1\n", {}, "kafka.bootstrap_server", "file"),
        ("", {"GPUAWARE_BROKER__PORT": "ninety"}, "broker.port", "env GPUAWARE_BROKER__PORT"),
        ("", {"GPUAWARE_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"}, "kafka.sasl_mechanism",
         "env GPUAWARE_KAFKA__SECURITY_PROTOCOL"),
        ("", {"GPUAWARE_NOPE": "1"}, "nope", "env GPUAWARE_NOPE"),
    ],
)
def test_bad_values_name_the_field_the_reason_and_the_source(tmp_path, yaml_text, env, field, source):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=env)
    (problem,) = info.value.problems
    assert problem[0] == field
    assert problem[1]
    assert problem[2].startswith(source)
    assert field in str(info.value)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("kafka: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, environ={})
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(bad, environ={})


def test_non_config_variables_are_not_read_as_config(tmp_path):
    env = {name: str(tmp_path) for name in NON_CONFIG_ENV} | {"GPUAWARE_TEST_BROKER": "apache"}
    env["GPUAWARE_CONFIG"] = str(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_text("cluster: from-file\n")
    assert env_overrides(env) == {}
    assert load_config(None, environ=env).cluster == "from-file"


def test_a_gpuaware_child_starts_with_the_test_and_cache_variables_set(tmp_path):
    env = {**os.environ, "GPUAWARE_TEST_BROKER": "apache", "GPUAWARE_TRACES_DIR": str(tmp_path),
           "GPUAWARE_REALPARTS_CACHE": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "gpuaware", "config"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cluster"] == "local"
