"""The power capper (the agent pod's one privileged piece) against a fake NVML at the pynvml boundary,
spoken to over its real unix socket by the agent's client: caps inside a board's limits are set and read
back; anything else is refused with the field and the reason, and the capper answers the next request."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading

import pytest

from gpuaware.agent import power_capper as pc
from gpuaware.agent.collectors import nvml as nvml_module
from gpuaware.agent.collectors.capper_client import CapperClient
from tests.agent.collectors.test_nvml import FakeNvml, pynvml

FULL, PARTIAL = "GPU-fake-0", "GPU-fake-1"  # GPU 1 of the fake has no power management


@pytest.fixture
def fake(monkeypatch):
    nvml = FakeNvml()
    nvml.install(monkeypatch)
    return nvml


@pytest.fixture
def capper(fake, monkeypatch):
    """The capper serving on a socket in a fresh directory (short: unix socket paths are limited)."""
    monkeypatch.setattr(pc, "TIMEOUT_S", 0.2)
    where = tempfile.mkdtemp(prefix="capper-", dir="/tmp")
    path = os.path.join(where, "capper.sock")
    peer = {"uid": os.getuid()}
    server = pc.make_server(path, pc.Nvml(), allow_uid=os.getuid(), peer=lambda sock: peer["uid"])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path, peer
    server.shutdown()
    server.server_close()
    thread.join()
    shutil.rmtree(where)


def ask(path: str, raw: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(raw)
        return json.loads(s.makefile("rb").readline())


def test_a_cap_inside_the_boards_limits_is_set_and_read_back(fake, capper):
    path, _ = capper
    assert CapperClient(path).set_limit(FULL, 450) == 450.0
    assert fake.gpus[0].power_limit_mw == 450_000
    assert CapperClient(path).set_limit(FULL, 0) == 700.0  # 0: the board's default again
    assert fake.gpus[0].power_limit_mw == 700_000


def test_the_real_peer_credentials_are_read_from_the_socket():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert pc.peer_uid(a) == os.getuid()


@pytest.mark.parametrize(("raw", "field", "reason"), [
    (b'{"gpu": "GPU-fake-0", "watts": 450, "pad": "' + b"x" * 300 + b'"}\n', "request", "longer than 256 bytes"),
    (b"cap it please\n", "request", "not JSON"),
    (b"\xff\xfe{}\n", "request", "not JSON"),
    (b"[" * 120 + b"]" * 120 + b"\n", "request", "a JSON object is needed, not list"),
    (b'{"gpu": "GPU-fake-0", "watts": 450, "uid": 0}\n', "uid", "unknown field"),
    (b'{"watts": 450}\n', "gpu", "a GPU UUID string is needed"),
    (b'{"gpu": "GPU-of-another-node", "watts": 450}\n', "gpu", "is not a GPU of this node"),
    (b'{"gpu": "GPU-fake-1", "watts": 100}\n', "gpu", "is not a GPU of this node"),  # no power management
    (b'{"gpu": "GPU-fake-0", "watts": "450"}\n', "watts", "a finite number of watts is needed"),
    (b'{"gpu": "GPU-fake-0", "watts": true}\n', "watts", "a finite number of watts is needed"),
    (b'{"gpu": "GPU-fake-0", "watts": NaN}\n', "watts", "a finite number of watts is needed"),
    (b'{"gpu": "GPU-fake-0", "watts": 1e999}\n', "watts", "a finite number of watts is needed"),
    (b'{"gpu": "GPU-fake-0", "watts": 150}\n', "watts", "150 W is outside GPU-fake-0's limits [200, 700] W"),
    (b'{"gpu": "GPU-fake-0", "watts": 701}\n', "watts", "outside"),
    (b'{"gpu": "GPU-fake-0", "watts": -5}\n', "watts", "outside"),
])
def test_bad_requests_are_refused_with_field_and_reason_and_the_capper_goes_on(fake, capper, raw, field, reason):
    path, _ = capper
    answer = ask(path, raw)
    assert answer["ok"] is False and answer["field"] == field and reason in answer["reason"], answer
    assert fake.gpus[0].power_limit_mw == 700_000  # nothing set
    assert CapperClient(path).set_limit(FULL, 300) == 300.0  # and the next request is served


def test_nvmls_refusal_is_an_answer_not_a_crash(fake, capper):
    path, _ = capper
    fake.gpus[0].fail_next["nvmlDeviceSetPowerManagementLimit"] = pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(RuntimeError, match="power capper refused 450 W on GPU-fake-0: watts: NVML refused"):
        CapperClient(path).set_limit(FULL, 450)
    assert CapperClient(path).set_limit(FULL, 450) == 450.0


def test_only_the_agents_user_may_ask(fake, capper):
    path, peer = capper
    peer["uid"] = 4242
    with pytest.raises(RuntimeError, match="peer: uid 4242 may not set power limits"):
        CapperClient(path).set_limit(FULL, 450)
    assert fake.gpus[0].power_limit_mw == 700_000


def test_a_client_that_stalls_or_leaves_mid_request_does_not_stop_the_capper(fake, capper):
    path, _ = capper
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stalled:
        stalled.connect(path)
        stalled.sendall(b'{"gpu": "GPU-fa')  # no newline, then nothing: dropped after the timeout
        assert CapperClient(path).set_limit(FULL, 250) == 250.0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
        gone.connect(path)
    assert CapperClient(path).set_limit(FULL, 260) == 260.0


def test_an_unreachable_capper_is_a_rejected_cap(tmp_path):
    with pytest.raises(RuntimeError, match="unreachable"):
        CapperClient(str(tmp_path / "none.sock")).set_limit(FULL, 450)


def test_the_nvml_collector_asks_the_capper_when_it_has_one(fake, capper, monkeypatch):
    """The shipped agent (no capability) sets no limit through NVML itself: every cap and lift goes to the
    capper, and its refusal is the RuntimeError the runtime logs as a rejected cap (no acknowledgement)."""
    path, _ = capper

    def no_privilege(h, mw):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    collector = nvml_module.NvmlCollector("node-a", capper=CapperClient(path))
    try:
        direct = pynvml.nvmlDeviceSetPowerManagementLimit
        monkeypatch.setattr(nvml_module.pynvml, "nvmlDeviceSetPowerManagementLimit", no_privilege)
        monkeypatch.setattr(pc.pynvml, "nvmlDeviceSetPowerManagementLimit", direct)  # the capper's privilege
        collector.set_power_limit(0, 450)
        assert fake.gpus[0].power_limit_mw == 450_000
        collector.reset_power_limit(0)
        assert fake.gpus[0].power_limit_mw == 700_000
        with pytest.raises(RuntimeError, match="outside"):
            collector.set_power_limit(0, 100)
    finally:
        collector.close()


def test_caps_from_the_control_topic_go_through_the_capper_and_only_accepted_ones_are_acknowledged(
        fake, capper, tmp_path):
    """The acknowledgement path is unchanged: the runtime records (for ``gpuaware.io/power-caps-applied``)
    the caps the capper set, never one it refused, and forgets a lifted one."""
    from gpuaware.agent.runtime import AgentRuntime
    from gpuaware.agent.sampling import SamplingPolicy
    from gpuaware.contract.events import AgentControl, ControlKind
    from gpuaware.plumbing.kafka_settings import KafkaSettings

    path, _ = capper
    collector = nvml_module.NvmlCollector("node-a", capper=CapperClient(path))
    try:
        rt = AgentRuntime([collector], KafkaSettings(), SamplingPolicy(), tmp_path / "spool")
        core = rt.cores[0]

        def cap(watts: int) -> None:
            rt.handle_control(AgentControl(f"cap-{watts}", 1, "node-a", ControlKind.POWER_CAP, gpu_uuid=FULL,
                                           power_cap_w=watts))

        cap(450)
        assert core.applied_caps == {0: 450} and fake.gpus[0].power_limit_mw == 450_000
        cap(100)  # below the board's minimum: the capper refuses, the runtime logs it, nothing is recorded
        assert core.applied_caps == {0: 450} and fake.gpus[0].power_limit_mw == 450_000
        cap(0)  # lifted
        assert core.applied_caps == {} and fake.gpus[0].power_limit_mw == 700_000
    finally:
        collector.close()
