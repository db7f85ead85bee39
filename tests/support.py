"""Helpers that several test files share; fixtures are in conftest.py.

Import it as ``tests.support`` (pyproject.toml puts the repository root on the path).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import string
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import numpy as np
import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpuaware.agent.collectors.sim import Scenario, SimCluster, load_scenario
from gpuaware.agent.readings import Reading
from gpuaware.agent.replay import simulate
from gpuaware.contract import annotations, topics
from gpuaware.contract.events import GpuInfo, GpuSample, TelemetryBatch, decode
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.plumbing.kube.api import KubeApi
from gpuaware.scheduler.core.cluster import ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Profile, Scheduler
from gpuaware.scheduler.core.plugins.health import HealthFilter
from gpuaware.scheduler.core.plugins.model_affinity import ModelAffinity
from gpuaware.scheduler.kube.live import LiveScheduler
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.stream.processor import StreamProcessor

if TYPE_CHECKING:
    from gpuaware.deploy.checks import Doc
    from gpuaware.local.fake_apiserver import FakeApiServer
    from gpuaware.scheduler.feed import StateView
    from tests.real_kube import Kube

REPO = Path(__file__).resolve().parents[1]
# The real traces sit beside the checkout, in the workspace's shared/ folder.
TRACES = REPO.parent / "shared" / "traces"
OPENB_NODES = TRACES / "alibaba-openb" / "openb_node_list_gpu_node.csv"
OPENB_PODS = TRACES / "alibaba-openb" / "openb_pod_list_default.csv"
GAVEL = TRACES / "gavel" / "simulation_throughputs.json"
RULES = REPO / "gpuaware" / "dashboards" / "prometheus" / "rules.yml"
OVERLAYS = ("dev", "production", "existing-kafka")


T = TypeVar("T")


def missing_part(reason: str) -> NoReturn:
    """Skip for a real part (binaries, jars, CRDs) that is not built here; under ``CI=true`` fail instead,
    so that CI cannot pass by testing nothing."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and a real part is missing: {reason}")
    pytest.skip(reason)


def need(locate: Callable[[], T], missing: type[Exception]) -> T:
    """``locate()``, or :func:`missing_part` with the message of the ``missing`` it raised."""
    try:
        return locate()
    except missing as exc:
        missing_part(str(exc))


RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def shipped_rbac(cp) -> list[dict]:
    """The RBAC objects (ServiceAccounts, roles, bindings, admission policies) of the production overlay
    as ``kubectl kustomize`` renders it, to apply on a ``KubeControlPlane`` as they ship."""
    out = cp.kubectl("kustomize", str(REPO / "deploy" / "overlays" / "production")).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] in RBAC_KINDS]


def overlay_with(directory: Path, *components: str, base: str = "production") -> Path:
    """An overlay of one's own, as docs/deploy.md shows it: a shipped overlay plus opt-in ``components``
    (names under deploy/components), written in ``directory`` (kustomize takes relative paths only)."""
    up = Path(os.path.relpath(REPO / "deploy", directory))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "gpuaware",
        "labels": [{"pairs": {"app.kubernetes.io/part-of": "gpuaware"}}],
        "resources": [str(up / "overlays" / base)],
        "components": [str(up / "components" / c) for c in components]}))
    return directory


TEST_BROKERS = ("apache", "tansu", "testcontainers")


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get("CI", "").lower() == "true"


def chosen_broker(environ: Mapping[str, str] | None = None) -> str:
    """The broker ``kafka_settings`` runs on when ``KAFKA_BOOTSTRAP_SERVERS`` is not set:
    ``GPUAWARE_TEST_BROKER``, else Apache Kafka under ``CI=true`` and Tansu outside it."""
    environ = os.environ if environ is None else environ
    name = environ.get("GPUAWARE_TEST_BROKER") or ("apache" if in_ci(environ) else "tansu")
    if name not in TEST_BROKERS:
        raise ValueError(f"GPUAWARE_TEST_BROKER={name!r}: use one of {', '.join(TEST_BROKERS)}")
    return name


async def consume(settings: KafkaSettings, topic: str, group: str, want: int, timeout_s: float = 20.0):
    """``want`` records of ``topic`` read as member of ``group``, whose offsets are then committed."""
    consumer = AIOKafkaConsumer(topic, **settings.consumer_kwargs(group))
    await consumer.start()
    got = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(got) < want:
                batches = await consumer.getmany(timeout_ms=500, max_records=want - len(got))
                for records in batches.values():
                    got.extend(records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return got


def fleet_batch(node: str, seq: int, ts_ms: int, gpus: int = 2, util: int = 60) -> TelemetryBatch:
    """A batch of ``gpus`` A100 samples from ``node``, sequence ``seq``, stamped ``ts_ms``."""
    return TelemetryBatch(
        node, seq, ts_ms, [GpuInfo(f"GPU-{node}-{i}", i, "NVIDIA A100-SXM4-80GB", 81920) for i in range(gpus)],
        [GpuSample(i, seq, 0, min(100, util + 5 * i + seq % 7), 20, 20_000 + 10 * seq, 2500, 60) for i in range(gpus)],
    )


async def produce(settings: KafkaSettings, records: list[tuple[str, bytes, bytes]],
                   headers: list[tuple[str, bytes]] | None = None) -> None:
    """Send (topic, key, value) records in order and wait until all are acknowledged."""
    producer = AIOKafkaProducer(**settings.producer_kwargs())
    await producer.start()
    try:
        for topic, key, value in records:
            await producer.send(topic, value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


async def watch(settings: KafkaSettings, topic: str, done: Callable[[list], bool], keep: Callable[[object], bool],
                 timeout_s: float = 90.0, raw: bool = False) -> list:
    """Read ``topic`` from the beginning, collecting what ``keep`` accepts, until ``done`` says so."""
    consumer = AIOKafkaConsumer(**settings.consumer_kwargs(None))
    await consumer.start()
    seen: list = []
    try:
        parts = [TopicPartition(topic, p) for p in range(topics.spec(topic).partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=300)).values():
                for m in msgs:
                    item = m if raw else decode(m.value)
                    if keep(item):
                        seen.append(item)
            if done(seen):
                return seen
        raise AssertionError(f"{topic}: condition not met in {timeout_s}s; kept {len(seen)}: {seen[-3:]}")
    finally:
        await consumer.stop()


def prometheus_rules() -> list[dict]:
    """Every alerting and recording rule of gpuaware/dashboards/prometheus/rules.yml."""
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def crds_and_examples(rendered) -> tuple[list[Doc], list[Doc]]:
    """The production overlay's CRDs, and the custom resources under deploy/examples/."""
    crds = [d for d in rendered["production"] if d["kind"] == "CustomResourceDefinition"]
    files = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
    return crds, [d for p in files for d in yaml.safe_load_all(p.read_text())]


def cluster(*gpus_per_node: int, model: str = "V100", cpu: int = 32000) -> ClusterState:
    """Nodes ``n0``, ``n1``, ... with that many GPUs each."""
    return ClusterState([NodeSpec(f"n{i}", cpu, 262144, g, model, 16384) for i, g in enumerate(gpus_per_node)])


class LastValue:
    """A stand-in for the stream's forecaster in the simulator's stream model: the last value as its point
    forecast (``forecast().mean``), +10% as its upper bound (``forecast().upper``)."""

    def __init__(self, horizon: int, upper: float | None):
        self.y = 0.0
        self.mean = self.upper = 0.0

    def learn_one(self, y: float) -> None:
        self.y = y

    def forecast(self) -> LastValue:
        self.mean, self.upper = self.y, self.y * 1.1
        return self


def scheduler_with(*scores, filters=None) -> Scheduler:
    """The score plugins given, weighted 1, behind the model and health filters unless ``filters`` is given."""
    return Scheduler(Profile("t", filters or [ModelAffinity(), HealthFilter()], [(s, 1.0) for s in scores]))


# --------------------------------------------------------------------------- the agent's and the stream's inputs
def sim_cluster(name: str = "baseline", **update):
    """The simulated cluster of scenario ``name`` (fields replaced by ``update``), and the clock it reads."""
    scenario = load_scenario(name).model_copy(update=update)
    clock = [0.0]
    return SimCluster(scenario, clock=lambda: clock[0], epoch=0.0), clock


def reading(ts, util=50.0, temp=60.0, power=300.0, **kw):
    """One healthy GPU reading at ``ts``."""
    return Reading(ts=ts, util_gpu=util, temp_c=temp, power_w=power, fb_used_mib=1000.0, ecc_sbe_volatile=0,
                   ecc_dbe_volatile=0, throttle_reasons=0, **kw)


def telemetry_batch(node: str, seq: int, ts_ms: int, util: int = 50, fb: int = 1000, gpus: int = 1) -> TelemetryBatch:
    """One sample of each of ``gpus`` A100s on ``node``."""
    return TelemetryBatch(
        node, seq, ts_ms, [GpuInfo(f"GPU-{node}-{i}", i, "NVIDIA A100-SXM4-80GB", 81920) for i in range(gpus)],
        [GpuSample(i, seq, 0, util, util // 2, fb, 2500, 60) for i in range(gpus)],
    )


# Eight GPUs, one of each workload kind the simulator plays per model.
KINDS_SCENARIO = {
    "name": "kinds", "seed": 5, "nodes": 2, "gpus_per_node": 4, "models": ["H100", "A100"],
    "workloads": ["training-compute", "training-memory", "inference-bursty", "idle-holding"],
}


def replay_scenario(scenario: dict, seconds: int) -> tuple[StreamProcessor, dict]:
    """``seconds`` of ``scenario``'s agents' records through a processor; returns it and each GPU's workload."""
    sc = Scenario.model_validate(scenario)
    proc = StreamProcessor({})
    now = time.time()
    for tick in simulate(sc, seconds, now - seconds):
        for batch in tick.batches:
            proc.on_telemetry(batch, 0, int(tick.second * 1000))
        for ev in tick.events:
            proc.on_event(ev, 0, int(tick.second * 1000))
    gpus = SimCluster(sc, clock=lambda: 0.0, epoch=0.0).gpus
    return proc, {g.uuid: g.workload for row in gpus for g in row}


# --------------------------------------------------------------------------- fuzzing what comes from outside
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
printable_text = st.text(alphabet=string.printable, max_size=40)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                     printable_text)
json_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                              st.dictionaries(printable_text, inner, max_size=4)),
                           max_leaves=12)


# --------------------------------------------------------------------------- the command line as a user runs it
GPUAWARE = [sys.executable, "-m", "gpuaware"]
# The tests' own GPUAWARE_ settings stay out of the commands they run.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUAWARE_")}


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``gpuaware ARGS`` in a process of its own, its output captured."""
    return subprocess.run([*GPUAWARE, *args], capture_output=True, text=True, timeout=timeout, env=env or ENV)


# --------------------------------------------------------------------------- the live scheduler on the real apiserver
FAST = SchedulerSettings(pass_interval_s=0.02, checkpoint_timeout_s=2.0, eviction_retry_s=0.2,
                         eviction_timeout_s=3.0, extender_port=0)


async def wait_for(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition",
                   poll_s: float = 0.05) -> None:
    """Until ``cond()`` is true, or fail after ``timeout`` naming ``what``: tests wait on conditions, not times."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(poll_s)


@contextlib.asynccontextmanager
async def running(kube: Kube, settings: SchedulerSettings = FAST, view: StateView | None = None,
                  lead: bool = True, **publishers) -> AsyncIterator[LiveScheduler]:
    """A ``LiveScheduler`` on the session's apiserver as the shipped ``gpuaware-scheduler`` ServiceAccount,
    leading unless ``lead`` is false, stopped on the way out."""
    async with live_scheduler(kube.api(), settings, view, lead, **publishers) as live:
        yield live


@contextlib.asynccontextmanager
async def live_scheduler(api: KubeApi, settings: SchedulerSettings = FAST, view: StateView | None = None,
                         lead: bool = True, **publishers) -> AsyncIterator[LiveScheduler]:
    """A ``LiveScheduler`` speaking through ``api``, leading unless ``lead`` is false, stopped on the way out."""
    live = LiveScheduler(api, settings, view, **publishers)
    await live.start()
    if lead:
        live.leading.set()
    stop = asyncio.Event()
    task = asyncio.create_task(live.run(stop))
    try:
        yield live
    finally:
        stop.set()
        await task
        await live.stop()


def pods(kube: Kube | FakeApiServer) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in kube.objects("pods")}


def gpus_of(pod: dict) -> list[dict]:
    return json.loads(pod["metadata"]["annotations"][annotations.ANN_GPUS])


def events(kube: Kube | FakeApiServer, reason: str) -> list[dict]:
    return [e for e in kube.objects("events") if e["reason"] == reason]


def forecast_series(seed: int, n: int = 500) -> list[list[float]]:
    """A noisy level, a memory-like plateau with dips and returns, and a few values repeated (modes with ties)."""
    rng = np.random.default_rng(seed)
    noisy = (50 + 20 * np.sin(np.arange(n) / 40) + rng.normal(0, 8, n)).clip(0, 100)
    plateau = np.full(n, 30e3)
    for start in rng.choice(n - 10, n // 12, replace=False):
        plateau[start:start + rng.integers(1, 6)] = rng.uniform(5e3, 25e3)
    ties = rng.choice([0.0, 10.0, 20.0, 35.5], n).astype(float)
    return [noisy.tolist(), plateau.tolist(), ties.tolist(), [7.0] * 40 + noisy[:200].tolist()]
