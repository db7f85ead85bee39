"""Fault drills across processes: the scheduler process SIGKILLed mid-stream and restarted, on the real
kube-apiserver, as the shipped gpuaware-scheduler ServiceAccount."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.local.processes import free_port
from tests.support import REPO


def _scheduler(kubeconfig: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuaware", "--log-level", "info", "scheduler",
                             "--no-state-feed", "--metrics-port", "0", "--extender-port", str(free_port())],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), cwd=REPO,
                            env={**os.environ, "KUBECONFIG": str(kubeconfig)})


def _wait_for_line(log: Path, text: str, proc: subprocess.Popen, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if text in log.read_text():
            return
        time.sleep(0.1)


def test_scheduler_killed_mid_stream_restarts_binds_every_pod_once_and_never_shares_a_gpu(tmp_path, kube):
    account = kube.accounts["gpuaware-scheduler"]

    def bound() -> int:
        return sum(1 for p in kube.objects("pods") if p["spec"].get("nodeName"))

    for n in range(8):  # 64 GPUs for the 50 the pods ask for
        kube.create("nodes", make_node(f"n{n}", gpus=8))
    stop = threading.Event()
    created: list[str] = []

    def arrivals() -> None:  # 60 pods, 50 ms apart, whatever the scheduler is doing
        for i in range(60):
            if stop.is_set():
                return
            ann = {"gpuaware.io/gpu-milli": "500"} if i % 3 == 0 else {}
            kube.create("pods", make_pod(f"p{i:02d}", gpus=0 if ann else 1, annotations=ann))
            created.append(f"p{i:02d}")
            time.sleep(0.05)

    feeder = threading.Thread(target=arrivals)
    first = _scheduler(account, tmp_path / "first.log")
    try:
        feeder.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and bound() < 15:
            time.sleep(0.1)  # each look is a list of every pod
        assert bound() >= 15, (tmp_path / "first.log").read_text()[-2000:]
        first.send_signal(signal.SIGKILL)  # no clean shutdown: in-flight binds are lost mid-way
        first.wait(10)
        killed_at = bound()
        second = _scheduler(account, tmp_path / "second.log")
        try:
            feeder.join(10)
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and bound() < len(created):
                time.sleep(0.05)
        finally:
            # A SIGTERM before the restarted process has installed its handler would kill it (-15), not stop it:
            # once it says ready it is inside the handler's scope.
            _wait_for_line(tmp_path / "second.log", "state caught up: ready", second)
            second.send_signal(signal.SIGTERM)
            assert second.wait(20) == 0
    finally:
        stop.set()
        if first.poll() is None:
            first.kill()
    pods = kube.objects("pods")
    assert len(pods) == 60 and all(p["spec"].get("nodeName") for p in pods), (killed_at, bound())
    assert killed_at < 60  # the kill really happened mid-stream
    # The API refuses a second binding; what a bad restart would do is hand out a GPU twice.
    used: Counter = Counter()
    for p in pods:
        for g in json.loads(p["metadata"]["annotations"]["gpuaware.io/gpus"]):
            used[(p["spec"]["nodeName"], g["index"])] += g["milli"]
    assert max(used.values()) <= 1000, used.most_common(3)
    assert sum(used.values()) == 40 * 1000 + 20 * 500
