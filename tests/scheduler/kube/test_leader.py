"""Leader election against an in-memory Lease API that fails, hangs and conflicts on demand (faults a real
apiserver cannot be made to show on cue), and on the real kube-apiserver as the shipped gpuaware-scheduler
ServiceAccount (its Role: get/update on its own Lease, create).

Timings are fast (lease 0.6 s, renew deadline 0.4 s, retry 0.1 s) and every wait is on a
condition with a deadline. Clocks are injected: skewed wall clocks (what goes into renewTime) and
monotonic clocks with unrelated offsets, or a clock a test moves by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from gpuaware.local.fake_apiserver import make_node
from gpuaware.scheduler.kube.leader import LeaderElector, LeadershipLost
from gpuaware.scheduler.main import serve
from gpuaware.scheduler.settings import SchedulerSettings
from tests.support import wait_for as _wait_for

NS, NAME = "gpuaware", "gpuaware-scheduler"
LEASE, DEADLINE, RETRY = 0.6, 0.4, 0.1


class LeaseStore:
    """The API server's side: one Lease, a resourceVersion bumped by every write."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lease: dict[str, Any] | None = None
        self.rv = 0
        self.writes: list[str] = []  # holderIdentity of every successful write, in order


class FakeLeaseApi:
    """One replica's view of the store (the calls of ``KubeApi`` the elector uses), with its own faults.

    ``fail(kind)``: every call raises (``api``: 500, ``protocol``: urllib3 ProtocolError, ``oserror``),
    or hangs until ``heal`` (``hang``), or every write gets 409 Conflict (``conflict``).
    """

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.fault: str | None = None
        self.calls = 0
        self._unhang = threading.Event()

    def fail(self, kind: str) -> None:
        if kind == "hang":
            self._unhang = threading.Event()
        self.fault = kind

    def heal(self) -> None:
        self.fault = None
        self._unhang.set()  # hung calls return (with an error nobody waits for any more)

    def _enter(self, write: bool) -> None:
        self.calls += 1
        fault = self.fault
        if fault == "hang":
            self._unhang.wait()
            raise OSError("connection reset")
        if fault == "api":
            raise ApiException(status=500, reason="Internal Server Error")
        if fault == "protocol":
            raise urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))
        if fault == "oserror":
            raise OSError(113, "No route to host")
        if fault == "conflict" and write:
            raise ApiException(status=409, reason="Conflict")

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._enter(write=False)
        with self.store.lock:
            return copy.deepcopy(self.store.lease)

    def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._enter(write=True)
        with self.store.lock:
            if self.store.lease is not None:
                raise ApiException(status=409, reason="AlreadyExists")
            return self._write(body)

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._enter(write=True)
        with self.store.lock:
            current = self.store.lease
            if current is None:
                raise ApiException(status=404, reason="NotFound")
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict")
            return self._write(body)

    def _write(self, body: dict[str, Any]) -> dict[str, Any]:
        self.store.rv += 1
        lease = copy.deepcopy(body)
        lease["metadata"] = {**lease["metadata"], "resourceVersion": str(self.store.rv)}
        self.store.lease = lease
        self.store.writes.append(lease["spec"].get("holderIdentity") or "")
        return copy.deepcopy(lease)


class Clock:
    """A monotonic clock with its own origin that a test can move forward."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.monotonic() + self.offset


class Log:
    """The callbacks of every elector, in the order they ran."""

    def __init__(self) -> None:
        self.entries: list[tuple[float, str, str]] = []

    def callbacks(self, ident: str) -> dict[str, Callable[[], None]]:
        return {"on_started_leading": lambda: self.entries.append((time.monotonic(), ident, "started")),
                "on_stopped_leading": lambda: self.entries.append((time.monotonic(), ident, "stopped"))}

    def times(self, ident: str, what: str) -> list[float]:
        return [t for t, i, w in self.entries if i == ident and w == what]

    def never_overlapping(self) -> bool:
        leading: set[str] = set()
        for _, ident, what in self.entries:
            if what == "started":
                if leading:
                    return False
                leading.add(ident)
            else:
                leading.discard(ident)
        return True


def make(api: Any, ident: str, log: Log | None = None, **kw: Any) -> LeaderElector:
    callbacks = log.callbacks(ident) if log is not None else {}
    return LeaderElector(api, NS, NAME, ident, lease_duration_s=LEASE, renew_deadline_s=DEADLINE,
                         retry_period_s=RETRY, **callbacks, **kw)


async def wait_for(cond, timeout: float = 5.0, what: str = "condition") -> None:
    await _wait_for(cond, timeout, what, poll_s=0.005)  # the elector's timings are tens of ms


@contextlib.asynccontextmanager
async def running(*electors: LeaderElector, apis: tuple[FakeLeaseApi, ...] = ()) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(e.run(stop)) for e in electors]
    try:
        yield stop
        for task in tasks:
            assert not task.done(), f"an elector's task ended: {task}"
    finally:
        stop.set()
        for api in apis:
            api.heal()  # no thread stays blocked in a hung call
        await asyncio.wait_for(asyncio.gather(*tasks), 5)


# --------------------------------------------------------------------------- (a) errors do not kill it
@pytest.mark.parametrize("fault", ["protocol", "oserror", "api", "hang", "conflict"])
async def test_failing_renewals_lose_leadership_within_the_deadline_and_the_elector_survives(fault):
    api, log = FakeLeaseApi(LeaseStore()), Log()
    elector = make(api, "a", log)
    async with running(elector, apis=(api,)):
        await wait_for(elector.leading.is_set, what="leading")
        api.fail(fault)
        failing_since = time.monotonic()
        await wait_for(lambda: not elector.leading.is_set(), timeout=DEADLINE + RETRY + 1.0, what="step down")
        assert not elector.is_leader()
        assert log.times("a", "stopped") and log.times("a", "stopped")[0] - failing_since <= DEADLINE + 0.3
        assert sum(elector.errors.values()) >= 1, elector.errors
        calls = api.calls
        await wait_for(lambda: api.calls > calls or fault == "hang", what="retries while failing")
        await wait_for(lambda: time.monotonic() - failing_since > LEASE, what="the lease to lapse")
        api.heal()
        await wait_for(elector.leading.is_set, timeout=LEASE * 4 + 2, what="leading again")
        assert elector.is_leader() and log.times("a", "started")[-1] > log.times("a", "stopped")[0]


# --------------------------------------------------------------------------- (b) skewed clocks
async def test_two_replicas_with_skewed_clocks_never_lead_at_once():
    store, log = LeaseStore(), Log()
    api_a, api_b = FakeLeaseApi(store), FakeLeaseApi(store)
    # Wall clocks a lease apart either way (renewTime is written with them); monotonic clocks unrelated.
    a = make(api_a, "a", log, clock=Clock(+1e4), wall_clock=lambda: time.time() + LEASE)
    b = make(api_b, "b", log, clock=Clock(-1e4), wall_clock=lambda: time.time() - LEASE)
    samples = both = 0

    async def sample(stop: asyncio.Event) -> None:
        nonlocal samples, both
        while not stop.is_set():
            samples += 1
            both += (a.is_leader() and b.is_leader()) or (a.leading.is_set() and b.leading.is_set())
            await asyncio.sleep(0.002)

    async with running(a, b, apis=(api_a, api_b)):
        done = asyncio.Event()
        sampler = asyncio.create_task(sample(done))
        for round_, fault in enumerate(["oserror", "hang", "api", "protocol"]):
            await wait_for(lambda: a.leading.is_set() or b.leading.is_set(), timeout=5, what=f"a leader ({round_})")
            leader, api = (a, api_a) if a.leading.is_set() else (b, api_b)
            other = b if leader is a else a
            api.fail(fault)  # the leader is cut off; the other must wait for the lease to lapse
            await wait_for(other.leading.is_set, timeout=5, what=f"takeover ({round_})")
            api.heal()
        await wait_for(lambda: samples > 500, what="samples")
        done.set()
        await sampler
    assert both == 0, f"{both} of {samples} samples saw two leaders"
    assert log.never_overlapping(), log.entries
    assert len(log.times("a", "started")) + len(log.times("b", "started")) >= 5


# --------------------------------------------------------------------------- (c) partition
@pytest.mark.parametrize("fault", ["hang", "oserror"])
async def test_a_partitioned_leader_steps_down_before_the_other_acquires(fault):
    store, log = LeaseStore(), Log()
    api_a, api_b = FakeLeaseApi(store), FakeLeaseApi(store)
    a = make(api_a, "a", log)
    b = make(api_b, "b", log)
    async with running(a, apis=(api_a, api_b)):
        await wait_for(a.leading.is_set, what="a leads")
        async with running(b, apis=(api_b,)):
            await wait_for(lambda: b.holder == "a", what="b sees a")
            api_a.fail(fault)
            await wait_for(b.leading.is_set, timeout=5, what="b takes over")
            assert not a.is_leader() and not a.leading.is_set()
            (a_stopped,), (b_started,) = log.times("a", "stopped"), log.times("b", "started")
            assert a_stopped < b_started, log.entries
            assert store.writes[-1] == "b"


# --------------------------------------------------------------------------- (d) loss is seen at once
async def test_is_leader_turns_false_at_the_deadline_before_the_loop_notices_and_on_stopped_leading_runs():
    api, log, clock = FakeLeaseApi(LeaseStore()), Log(), Clock()
    elector = make(api, "a", log, clock=clock)
    async with running(elector, apis=(api,)):
        await wait_for(elector.is_leader, what="leading")
        api.fail("hang")
        clock.offset += DEADLINE  # the deadline passes with no renewal; the loop has not run since
        assert not elector.is_leader() and elector.leading.is_set()
        await wait_for(lambda: log.times("a", "stopped"), timeout=DEADLINE + 1, what="on_stopped_leading")
        assert not elector.leading.is_set() and not elector.is_leader() and elector.lost


async def test_another_holder_seen_during_renewal_means_stepping_down_at_once():
    store, log = LeaseStore(), Log()
    api = FakeLeaseApi(store)
    elector = make(api, "a", log, clock=Clock())
    async with running(elector, apis=(api,)):
        await wait_for(elector.leading.is_set, what="leading")
        with store.lock:  # an operator (or a replica that judged the lease expired) took it
            store.lease["spec"]["holderIdentity"] = "intruder"
            store.rv += 1
            store.lease["metadata"]["resourceVersion"] = str(store.rv)
        await wait_for(lambda: not elector.leading.is_set(), timeout=RETRY * 3, what="step down")
        assert log.times("a", "stopped") and elector.lost


async def test_release_on_cancel_hands_the_lease_over_without_waiting_for_it_to_lapse():
    store, log = LeaseStore(), Log()
    api_a, api_b = FakeLeaseApi(store), FakeLeaseApi(store)
    a = make(api_a, "a", log, release_on_cancel=True)
    frozen = Clock()
    b = make(api_b, "b", log, clock=lambda: frozen.offset)  # b's time stands still: the lease never lapses for b
    stop_a = asyncio.Event()
    task_a = asyncio.create_task(a.run(stop_a))
    await wait_for(a.leading.is_set, what="a leads")
    async with running(b, apis=(api_b,)):
        await wait_for(lambda: b.holder == "a", what="b sees a")
        stop_a.set()
        await asyncio.wait_for(task_a, 5)
        assert log.times("a", "stopped") and not a.lost
        assert store.lease["spec"]["holderIdentity"] == ""
        await wait_for(b.leading.is_set, what="b takes the released lease")
        assert store.lease["spec"]["leaseTransitions"] == 1


# --------------------------------------------------------------------------- (e) settings
@pytest.mark.parametrize(("kw", "field"), [
    ({"lease_duration_s": 0.4, "renew_deadline_s": 0.4}, "renew_deadline_s"),
    ({"renew_deadline_s": 0.4, "retry_period_s": 0.34}, "retry_period_s"),
    ({"retry_period_s": 0}, "retry_period_s"),
    ({"lease_duration_s": -1}, "lease_duration_s"),
])
def test_timings_follow_client_gos_rule_and_errors_name_the_field(kw, field):
    args = {"lease_duration_s": LEASE, "renew_deadline_s": DEADLINE, "retry_period_s": RETRY, **kw}
    with pytest.raises(ValueError, match=f"^{field}: "):
        LeaderElector(FakeLeaseApi(LeaseStore()), NS, NAME, "a", **args)


def test_scheduler_settings_check_the_same_rule():
    SchedulerSettings(lease_duration_s=15, renew_deadline_s=10, renew_every_s=2)
    with pytest.raises(ValueError, match=r"renew_deadline_s: 15\.0 must be below lease_duration_s"):
        SchedulerSettings(lease_duration_s=15, renew_deadline_s=15)
    with pytest.raises(ValueError, match=r"renew_every_s: 9\.0 must be below renew_deadline_s"):
        SchedulerSettings(renew_deadline_s=10, renew_every_s=9)


# --------------------------------------------------------------------------- the process
async def test_the_scheduler_process_exits_when_it_loses_the_lease(kube, monkeypatch):
    # As the scheduler runs in its pod: the ServiceAccount's credentials, the API from its kubeconfig.
    monkeypatch.setenv("KUBECONFIG", str(kube.accounts["gpuaware-scheduler"]))
    settings = SchedulerSettings(leader_elect=True, extender_port=0, pass_interval_s=0.02,
                                 lease_duration_s=2, renew_deadline_s=1.5, renew_every_s=0.2)
    kube.create("nodes", make_node("n0", gpus=2))
    api = kube.api()
    stop = asyncio.Event()

    async def take_the_lease() -> None:
        await wait_for(lambda: (api.read_lease(NS, NAME) or {}).get("spec", {}).get("holderIdentity"),
                       timeout=10, what="the scheduler to lead")
        lease = api.read_lease(NS, NAME)
        lease["spec"]["holderIdentity"] = "another-replica"
        api.replace_lease(NS, NAME, lease)

    thief = asyncio.create_task(take_the_lease())
    with pytest.raises(LeadershipLost, match="leaderelection lost"):
        await asyncio.wait_for(serve(None, settings, "127.0.0.1", 0, stop), 20)
    await thief
    assert stop.is_set()


async def test_only_one_replica_leads_and_another_takes_over_when_it_stops_renewing(kube):
    api = kube.api()
    a = LeaderElector(api, "gpuaware", "gpuaware-scheduler", "a", lease_duration_s=2, renew_deadline_s=1.5,
                      retry_period_s=0.3)
    b = LeaderElector(api, "gpuaware", "gpuaware-scheduler", "b", lease_duration_s=2, renew_deadline_s=1.5,
                      retry_period_s=0.3)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    ta, tb = asyncio.create_task(a.run(stop_a)), asyncio.create_task(b.run(stop_b))
    leaders = []
    for _ in range(20):
        await asyncio.sleep(0.1)
        leaders.append((a.leading.is_set(), b.leading.is_set()))
    assert all(not (x and y) for x, y in leaders) and any(x or y for x, y in leaders)
    first, second = (a, b) if a.leading.is_set() else (b, a)
    (stop_a if first is a else stop_b).set()
    await (ta if first is a else tb)
    await wait_for(lambda: second.leading.is_set(), timeout=6, what="takeover")
    lease = api.read_lease("gpuaware", "gpuaware-scheduler")
    assert lease["spec"]["holderIdentity"] == second.identity and lease["spec"]["leaseTransitions"] == 1
    (stop_b if second is b else stop_a).set()
    await (tb if second is b else ta)
