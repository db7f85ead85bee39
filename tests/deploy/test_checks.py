"""gpuaware/deploy/checks.py catches broken manifests and custom resources, naming the problem, and never crashes on any
GPUQueue spec (hypothesis)."""

from __future__ import annotations

import shutil

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuaware.deploy import checks as mc
from gpuaware.deploy.crds import CrdsMissing, third_party_crd_files
from tests.support import FUZZ, REPO, crds_and_examples, json_values, need

if shutil.which("kubectl") is None:
    pytest.skip("kubectl not installed (Debian package kubectl; .ci/run installs it)", allow_module_level=True)


@pytest.mark.parametrize(("kind", "name", "change", "expect"), [
    ("GPUWorkload", "llm-finetune", lambda d: d["spec"].update(pods="four"), "spec.pods: 'four' is not of type"),
    ("GPUWorkload", "llm-finetune", lambda d: d["spec"]["gpu"].update(sharing="vgpu"),
     "spec.gpu.sharing: 'vgpu' is not one of"),
    ("GPUWorkload", "llm-finetune", lambda d: d["spec"].update(gangsize=4), "'gangsize' was unexpected"),
    ("GPUQueue", "vision", lambda d: d["spec"].update(tenant="Vision Team"),
     "spec.tenant: 'Vision Team' does not match"),
    ("GPUQueue", "vision", lambda d: d["spec"].pop("namespaces"), "'namespaces' is a required property"),
])
def test_bad_custom_resources_are_rejected_with_the_field(rendered, kind, name, change, expect):
    crds, examples = crds_and_examples(rendered)
    problems = mc.schema_problems(mc.with_change(crds + examples, kind, name, change))
    assert len(problems) == 1 and expect in problems[0], problems


@pytest.mark.parametrize(("kind", "name", "change", "expect"), [
    ("DaemonSet", "gpuaware-agent", lambda d: d["spec"]["template"]["spec"]["containers"][0]["resources"].pop("limits"),
     "no cpu limits"),
    ("DaemonSet", "gpuaware-agent", lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("livenessProbe"),
     "no livenessProbe"),
    ("Deployment", "gpuaware-stream", lambda d: d["spec"]["template"]["spec"]["securityContext"].pop("runAsNonRoot"),
     "runAsNonRoot is not true"),
    ("Deployment", "gpuaware-stream",
     lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(readOnlyRootFilesystem=False),
     "readOnlyRootFilesystem is not true"),
    ("Deployment", "gpuaware-scheduler",
     lambda d: d["spec"]["template"]["spec"]["containers"][0].update(image="ghcr.io/gpuaware/gpuaware:latest"),
     "is not pinned"),
    ("Deployment", "gpuaware-stream", lambda d: d["spec"].update(replicas=12), "12 replicas > 8 partitions"),
    ("KafkaTopic", "gpu-telemetry-v1", lambda d: d["spec"].update(partitions=4), "4 partitions, contract says 8"),
    ("KafkaUser", "gpuaware-stream",
     lambda d: d["spec"]["authorization"]["acls"].append(
         {"resource": {"type": "topic", "name": "*", "patternType": "literal"}, "operations": ["All"], "host": "*"}),
     "also allowed: ['gpuaware-stream']"),
    ("NetworkPolicy", "metrics-from-monitoring", lambda d: d["spec"]["ingress"][0].pop("from"),
     "metrics port open beyond the monitoring namespace"),
    # The power capper may be root with CAP_SYS_ADMIN, nothing more; no other container may be either.
    ("DaemonSet", "gpuaware-agent",
     lambda d: d["spec"]["template"]["spec"]["containers"][1]["securityContext"]["capabilities"]["add"].append(
         "NET_ADMIN"), "container power-capper: adds capabilities ['NET_ADMIN']"),
    ("DaemonSet", "gpuaware-agent",
     lambda d: d["spec"]["template"]["spec"]["containers"][1]["securityContext"].update(privileged=True),
     "container power-capper: privileged"),
    ("DaemonSet", "gpuaware-agent",
     lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(
         runAsUser=0, capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
     "container agent: runs as UID 0"),
    ("DaemonSet", "gpuaware-agent",
     lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(
         capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
     "container agent: adds capabilities ['SYS_ADMIN']"),
])
def test_policy_checks_catch_broken_manifests(rendered, kind, name, change, expect):
    problems = mc.policy_problems(mc.with_change(rendered["production"], kind, name, change))
    assert any(expect in p for p in problems), problems


def test_unknown_kind_without_a_schema_is_a_problem():
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    (problem,) = mc.schema_problems([doc])
    assert "no schema for example.com/v1 Widget" in problem


@pytest.mark.parametrize("kind", ["Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser"])
def test_a_strimzi_version_the_operator_no_longer_serves_is_a_problem(rendered, kind):
    """Strimzi 1.x serves kafka.strimzi.io/v1 only; the real CRDs (not hand-written ones) say so."""
    need(third_party_crd_files, CrdsMissing)
    docs = rendered["production"]
    name = next(d["metadata"]["name"] for d in docs if d["kind"] == kind)
    old = mc.with_change(docs, kind, name, lambda d: d.update(apiVersion="kafka.strimzi.io/v1beta2"))
    problems = mc.schema_problems(old)
    assert len(problems) == 1 and f"no schema for kafka.strimzi.io/v1beta2 {kind}" in problems[0], problems


def test_strimzi_objects_are_checked_against_the_v1_schema(rendered):
    """A field v1 dropped (Kafka.spec.kafka.replicas, now on the KafkaNodePool) is named."""
    need(third_party_crd_files, CrdsMissing)
    docs = mc.with_change(rendered["production"], "Kafka", "gpuaware-kafka",
                          lambda d: d["spec"]["kafka"].update(replicas=3))
    (problem,) = mc.schema_problems(docs)
    assert "Kafka gpuaware/gpuaware-kafka: spec.kafka: Additional properties" in problem and "'replicas'" in problem


@FUZZ
@given(st.dictionaries(st.sampled_from(["tenant", "namespaces", "weight", "quota", "borrowing", "priorityClasses",
                                        "extra"]), json_values, max_size=5))
def test_gpuqueue_validation_reports_problems_and_never_crashes(spec):
    crd = yaml.safe_load((REPO / "deploy/base/crds/gpuaware.io_gpuqueues.yaml").read_text())
    doc = {"apiVersion": "gpuaware.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": "q"}, "spec": spec}
    problems = mc.schema_problems([crd, doc], versions=("1.37.0",))
    assert all(isinstance(p, str) and p for p in problems)
