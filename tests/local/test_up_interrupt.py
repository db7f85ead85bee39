"""`gpuaware up` stopped as a user stops it: Ctrl-C in a terminal (tmux), SIGTERM to the process.

Ctrl-C signals the terminal's whole foreground process group; the stack must still stop in
order (components, stream workers, broker last), print its summary and exit 0, leaving no
process behind and printing no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuaware.local.processes import pid_alive

ROOT = Path(__file__).resolve().parents[2]
# The run's own settings only: no GPUAWARE_* from the caller but where the traces are.
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUAWARE_") or k == "GPUAWARE_TRACES_DIR"},
       "PYTHONPATH": str(ROOT)}
SCENARIO = ("name: quick\nseed: 9\nnodes: 2\ngpus_per_node: 4\nmodels: [H100]\nfaults:\n"
            "  - {kind: xid, node: 0, gpu: 1, at_s: 2, xid: 79}\n")

pytestmark = pytest.mark.broker

WRAPPER = """
import os, signal, subprocess, sys
signal.signal(signal.SIGINT, lambda *_: None)  # a Python handler: the child starts with the default again
child = subprocess.Popen(sys.argv[2:])
open(sys.argv[1] + ".pid", "w").write(str(child.pid))
code = child.wait()
open(sys.argv[1] + ".tmp", "w").write(str(code))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"""


def _wait(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def _assert_all_gone(pids: set[int]) -> None:
    # The parent stops and reaps its children before it exits: they are gone by now, give or take the
    # kernel's bookkeeping.
    _wait(lambda: not any(pid_alive(p) for p in pids), 5,
          f"the run's processes to be gone: {[(p, _comm(p)) for p in pids if pid_alive(p)]}")


@pytest.fixture
def tmux(tmp_path: Path):
    if shutil.which("tmux") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("tmux is missing under CI (.ci/run installs it)")
        pytest.skip("tmux is not installed (apt-get install tmux)")
    sock = f"gpuaware-test-{uuid.uuid4().hex[:8]}"

    def tmux_cmd(*args: str) -> str:
        return subprocess.run(["tmux", "-L", sock, "-f", "/dev/null", *args], check=True, capture_output=True,
                              text=True, timeout=30).stdout

    yield tmux_cmd
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=30)


@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_in_a_terminal_stops_in_order_prints_the_summary_and_exits_0(tmux, tmp_path, presses):
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(SCENARIO)
    passed = ("PATH", "HOME", "LANG", "PYTHONPATH", "GPUAWARE_TRACES_DIR")
    status = tmp_path / "status"
    # The pane runs a wrapper that shares the terminal's foreground process group with gpuaware (so Ctrl-C
    # signals both), outlives it and writes down its pid and exit status: tmux sometimes leaves an exited
    # pane process unreaped, and then never shows its status.
    argv = ["env", *(f"{k}={v}" for k, v in ENV.items() if k in passed), "TERM=xterm-256color",
            sys.executable, "-c", WRAPPER, str(status),
            sys.executable, "-m", "gpuaware", "up", "--port", "0", "--kube", "embedded", "--scenario", str(scenario)]
    tmux("set-option", "-g", "remain-on-exit", "on", ";", "set-option", "-g", "history-limit", "20000", ";",
         "new-session", "-d", "-s", "up", "-x", "160", "-y", "50", *argv)

    def pane() -> str:
        return tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "up")

    def dead() -> bool:
        return status.exists()

    parent = int(_wait(lambda: Path(f"{status}.pid").exists() and Path(f"{status}.pid").read_text(), 60,
                       "gpuaware up to start"))

    def running_a_while() -> bool:
        assert not dead(), f"gpuaware up exited early:\n{pane()}"
        text = pane()
        # The live view's title counts the seconds; a few in, every component is up and talking.
        return "gpuaware up — broker" in text and any(f"— {s}s" in text for s in range(5, 100))

    _wait(running_a_while, 120, "the live view")
    children = _descendants(parent)
    assert any("tansu" in _comm(p) for p in children), [_comm(p) for p in children]
    assert any(" stream " in _comm(p) for p in children), [_comm(p) for p in children]

    tmux("send-keys", "-t", "up", "C-c")
    if presses == 2:  # again while it stops: faster, still no traceback
        _wait(lambda: "Ctrl-C again" in pane(), 30, "the stopping notice")
        tmux("send-keys", "-t", "up", "C-c")
    _wait(dead, 90, "gpuaware up to exit after Ctrl-C")
    out = pane()
    assert status.read_text() == "0", out
    assert "stopped after" in out, out
    assert "Traceback" not in out and "CancelledError" not in out, out
    # The broker stopped last: no client lost its connection on the way out.
    assert "Unable connect" not in out and "aiokafka" not in out, out
    _assert_all_gone(children)


def test_sigterm_to_the_parent_alone_stops_everything_and_prints_the_summary(tmp_path):
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(SCENARIO)
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:  # files: a full pipe would block the run
        proc = subprocess.Popen([sys.executable, "-m", "gpuaware", "up", "--port", "0", "--json", "--kube", "embedded",
                                 "--scenario", str(scenario)], stdout=out, stderr=err, env=ENV, start_new_session=True)
    try:
        def running_a_while() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"gpuaware up exited early ({proc.returncode}):\n{err_path.read_text()}")
            names = [_comm(p) for p in _descendants(proc.pid)]
            # The broker and a stream worker are up, and the agents have published (a busy box may take a while).
            return (any("tansu" in n for n in names) and any(" stream " in n for n in names)
                    and "agents publishing" in err_path.read_text())

        _wait(running_a_while, 120, "the stack's children")
        children = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()  # its children die with it (PR_SET_PDEATHSIG)
            proc.wait(10)
    err = err_path.read_text()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Unable connect" not in err, err
    summary = json.loads(out_path.read_text())
    assert summary["samples"] > 0
    assert summary["stream"]["worker_exit_codes"] == {"stream-0": 0}
    _assert_all_gone(children)
