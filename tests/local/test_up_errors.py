"""What `gpuaware up` and `gpuaware broker` say when they cannot start: the problem and what to do next,
never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from gpuaware.cli import cli

ROOT = Path(__file__).resolve().parents[2]
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUAWARE_") or k == "GPUAWARE_TRACES_DIR"},
       "PYTHONPATH": str(ROOT)}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuaware", *args], capture_output=True, text=True, timeout=120,
                          env=ENV)


def test_up_on_a_taken_port_says_to_pick_another_or_stop_the_other_one():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("up", "--port", str(port), "--json")
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "--port" in result.stderr and "stop it" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_up_with_an_unknown_scenario_lists_the_known_ones():
    result = run("up", "--port", "0", "--scenario", "no-such-scenario")
    assert result.returncode == 2
    assert "no-such-scenario" in result.stderr and "cannot read" in result.stderr
    assert "--scenario takes a YAML file or one of:" in result.stderr and "demo" in result.stderr
    assert "Traceback" not in result.stderr


def test_up_without_the_traces_says_where_to_put_them_before_starting_anything(monkeypatch):
    from gpuaware.plumbing import traces

    def missing():
        raise FileNotFoundError("traces not found; set GPUAWARE_TRACES_DIR to the folder holding alibaba-gentd26/")

    monkeypatch.setattr(traces, "traces_dir", missing)
    started = []
    monkeypatch.setattr("gpuaware.local.broker.LocalBroker.start", lambda self: started.append(self))
    result = CliRunner().invoke(cli, ["up", "--port", "0", "--json"], env={"GPUAWARE_CONFIG": None})
    assert result.exit_code == 2, result.output
    assert "gpuaware up: traces not found; set GPUAWARE_TRACES_DIR" in result.output
    assert result.exc_info[0] is SystemExit and not started


def test_a_missing_config_file_says_to_pass_one_that_exists(tmp_path):
    result = run("--config", str(tmp_path / "missing.yaml"), "up", "--port", "0")
    assert result.returncode == 2
    assert "missing.yaml" in result.stderr and "pass --config an existing YAML file" in result.stderr
    assert "Traceback" not in result.stderr


def test_broker_with_a_data_dir_it_cannot_create_says_to_pass_a_writable_one(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run("broker", "--port", "0", "--storage", "s3", "--data-dir", str(blocker / "store"))
    assert result.returncode == 1, result.stderr
    assert "cannot create the s3 store's folder" in result.stderr and "pass --data-dir" in result.stderr
    assert "Traceback" not in result.stderr


def test_up_without_the_kubernetes_binaries_runs_embedded_and_says_how_to_get_the_real_control_plane(tmp_path):
    env = {**ENV, "GPUAWARE_KUBE_BIN_DIR": str(tmp_path)}  # nothing built there
    result = subprocess.run([sys.executable, "-m", "gpuaware", "up", "--port", "0", "--scenario", "no-such-scenario"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2  # the scenario: it stops before anything starts
    assert "running on the embedded fake API server" in result.stderr
    assert "realparts/build-kube.sh" in result.stderr and "Traceback" not in result.stderr
