"""`gpuaware agent` and `gpuaware scheduler` as a user runs them: the agent on simulated GPUs stops cleanly,
and a bad policy or setting is refused at start, naming the field."""

from __future__ import annotations

import pytest

from gpuaware.local.stream_workers import worker_env
from tests.support import ENV, run


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
