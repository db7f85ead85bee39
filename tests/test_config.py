"""Configuration from defaults, file, environment and flags: bad values name the field, the reason and the
source, whatever the input (hypothesis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuaware.config import NON_CONFIG_ENV, ConfigError, env_overrides, load_config
from tests.support import FUZZ, REPO, json_values, printable_text


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


def test_the_traces_folder_and_the_tests_broker_are_not_settings():
    # The missing-traces error tells users to set GPUAWARE_TRACES_DIR: doing so must not make every command
    # refuse its configuration.
    env = {"GPUAWARE_TRACES_DIR": "/data/traces", "GPUAWARE_TEST_BROKER": "testcontainers"}
    assert load_config(None, environ=env) == load_config(None, environ={})
    with pytest.raises(ConfigError, match="traces_dirs"):
        load_config(None, environ={"GPUAWARE_TRACES_DIRS": "/data/traces"})  # a typo still is an error


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


CONFIG_KEYS = ["kafka.bootstrap_servers", "kafka.security_protocol", "kafka.sasl_mechanism", "kafka.linger_ms",
               "kafka.session_timeout_ms", "broker.port", "broker.storage", "log.level", "metrics.port",
               "agent.collector", "agent.sim_nodes", "agent.spool_max_mib", "stream.horizons_min",
               "stream.max_publish_interval_ms", "scheduler.policy", "scheduler.renew_every_s",
               "scheduler.lease_duration_s", "scheduler.bind_workers", "scheduler.node_power_budget_w", "nonsense.key"]


@FUZZ
@given(st.dictionaries(st.sampled_from(CONFIG_KEYS), printable_text, max_size=6))
def test_config_from_environment_loads_or_names_the_field(values):
    env = {"GPUAWARE_" + k.upper().replace(".", "__"): v for k, v in values.items()}
    try:
        load_config(environ=env)
    except ConfigError as exc:
        assert exc.problems and all(path and reason for path, reason, _ in exc.problems)


@FUZZ
@given(st.dictionaries(st.sampled_from(["kafka", "agent", "stream", "scheduler", "log", "broker", "x"]),
                       json_values, max_size=4))
def test_config_file_loads_or_names_the_field(tmp_path_factory, tree):
    path = tmp_path_factory.mktemp("cfg") / "gpuaware.yaml"
    path.write_text(yaml.safe_dump(tree))
    try:
        load_config(path=path, environ={})
    except ConfigError as exc:
        assert exc.problems and all(source.startswith("file") or source for _, _, source in exc.problems)


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
