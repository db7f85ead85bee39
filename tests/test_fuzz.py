"""Property-based fuzzing of every decoder and config loader that takes outside input: each either
returns its result or raises its one documented error naming the problem, never anything else.

(The wire decoders of contract.events are fuzzed in test_events.py.)"""

from __future__ import annotations

import json
import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.collectors.sim import load_scenario
from agent.sampling import PolicyError, parse_policy
from contract import annotations as ann
from deploy import checks as manifest_checks
from gpuaware.config import ConfigError, load_config
from gpuaware.local.fake_apiserver import make_node, make_pod
from scheduler.kube import objects
from scheduler.kube.cache import ClusterCache

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
text = st.text(alphabet=string.printable, max_size=40)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True), text)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(text, inner, max_size=4)), max_leaves=12)

CONFIG_KEYS = ["kafka.bootstrap_servers", "kafka.security_protocol", "kafka.sasl_mechanism", "kafka.linger_ms",
               "kafka.session_timeout_ms", "broker.port", "broker.storage", "log.level", "metrics.port",
               "agent.collector", "agent.sim_nodes", "agent.spool_max_mib", "stream.horizons_min",
               "stream.max_publish_interval_ms", "scheduler.policy", "scheduler.renew_every_s",
               "scheduler.lease_duration_s", "scheduler.bind_workers", "scheduler.node_power_budget_w", "nonsense.key"]


@FUZZ
@given(st.dictionaries(st.sampled_from(CONFIG_KEYS), text, max_size=6))
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


@FUZZ
@given(st.one_of(text, st.builds(yaml.safe_dump, st.dictionaries(
    st.sampled_from(["floor_s", "ceiling_s", "backoff", "flush_s", "deadbands", "nodes", "other"]), json_values,
    max_size=4))))
def test_sampling_policy_parses_or_raises_policy_error(source):
    try:
        parse_policy(source, "fuzz")
    except PolicyError as exc:
        assert str(exc)


@FUZZ
@given(st.dictionaries(st.sampled_from(["name", "nodes", "gpus_per_node", "models", "faults", "workloads",
                                        "seed", "duration_s"]), json_values, max_size=5))
def test_scenario_loads_or_raises_value_error(tmp_path_factory, tree):
    path = tmp_path_factory.mktemp("scn") / "s.yaml"
    path.write_text(yaml.safe_dump(tree))
    try:
        load_scenario(path)
    except ValueError as exc:
        assert str(path) in str(exc)


ANNOTATION_KEYS = ["gpu-milli", "gpu-memory-mib", "sharing", "gpu-models", "min-gpu-memory-gib",
                   "min-memory-bandwidth-gbs", "tensor-cores", "interconnect", "qos", "preemptible", "checkpoint",
                   "deferrable", "gang", "gang-size", "duration-s", "gpus"]
quantities = st.one_of(text, st.from_regex(r"\A[0-9]{1,4}(m|Mi|Gi|k)?\Z"), st.integers(-5, 20).map(str),
                       st.from_regex(r"\A[0-9]{1,3}e[0-9]{1,3}\Z"))


@FUZZ
@given(st.dictionaries(st.sampled_from(ANNOTATION_KEYS), text, max_size=5), quantities, quantities, quantities,
       st.integers(-10**6, 10**9))
def test_pod_requests_decode_or_raise_pod_spec_error(annotations, gpus, cpu, memory, priority):
    pod = make_pod("p", annotations={ann.PREFIX + k: v for k, v in annotations.items()}, priority=priority)
    container = pod["spec"]["containers"][0]
    container["resources"] = {"limits": {ann.GPU_RESOURCE: gpus}, "requests": {"cpu": cpu, "memory": memory}}
    try:
        pw = objects.workload_of(pod, "t", 0.0)
    except objects.PodSpecError as exc:
        assert str(exc)
        return
    w = pw.workload
    assert w.num_gpu >= 0 and 0 < w.gpu_milli <= 1000 and pw.gang_size >= 1


@FUZZ
@given(text, quantities, quantities, quantities,
       st.dictionaries(st.sampled_from([ann.ANN_CORDONED, "x"]), text))
def test_nodes_decode_or_raise_pod_spec_error(product, gpus, cpu, memory, annotations):
    node = make_node("n", product=product)
    node["status"]["allocatable"] = {"cpu": cpu, "memory": memory, ann.GPU_RESOURCE: gpus}
    node["metadata"]["annotations"] = annotations
    try:
        spec = objects.node_spec(node)
    except objects.PodSpecError as exc:
        assert str(exc)
        return
    assert spec.gpus >= 0 and spec.cpu_milli >= 0 and spec.memory_mib >= 0
    assert all(g >= 0 for g in ann.cordoned_gpus(node))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
                          st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.sampled_from(["n0", "n1", "gone"])),
                          st.one_of(text, st.builds(json.dumps, json_values))), max_size=12))
def test_the_cache_survives_any_sequence_of_pod_events_and_keeps_its_invariants(events):
    cache = ClusterCache()
    cache.sync_nodes([make_node("n0", gpus=2), make_node("n1", gpus=2)])
    for kind, name, node, gpus_annotation in events:
        pod = make_pod(name, annotations={ann.ANN_GPUS: gpus_annotation})
        if node:
            pod["spec"]["nodeName"] = node
        cache.pod_event(kind, pod)
        cache.cluster.check_invariants()
    assert set(cache.cluster.allocations) == set(cache.running)


@FUZZ
@given(st.dictionaries(st.sampled_from(["tenant", "namespaces", "weight", "quota", "borrowing", "priorityClasses",
                                        "extra"]), json_values, max_size=5))
def test_gpuqueue_validation_reports_problems_and_never_crashes(spec):
    from pathlib import Path

    crd = yaml.safe_load((Path(__file__).resolve().parent.parent / "deploy/base/crds/gpuaware.io_gpuqueues.yaml")
                         .read_text())
    doc = {"apiVersion": "gpuaware.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": "q"}, "spec": spec}
    problems = manifest_checks.schema_problems([crd, doc], versions=("1.37.0",))
    assert all(isinstance(p, str) and p for p in problems)
