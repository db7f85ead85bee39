"""deploy/: every overlay renders with kubectl kustomize, validates against the Kubernetes and CRD
schemas, and passes gpuaware's deployment policy; the checks themselves catch broken manifests."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from contract import topics
from deploy import checks as mc
from deploy import manifests

REPO = Path(__file__).resolve().parent.parent
OVERLAYS = ("dev", "production", "existing-kafka")

if shutil.which("kubectl") is None:
    pytest.skip("kubectl not installed (Debian package kubectl; .ci/run installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[mc.Doc]]:
    return {name: mc.render(REPO / "deploy" / "overlays" / name) for name in OVERLAYS}


def by_kind(docs: list[mc.Doc], kind: str) -> list[mc.Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[mc.Doc], kind: str, name: str) -> mc.Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_generated_manifests_match_the_code():
    assert manifests.main(["--check"]) == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_against_kubernetes_and_crd_schemas(rendered, overlay):
    assert mc.schema_problems(rendered[overlay]) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_passes_the_deployment_policy(rendered, overlay):
    assert mc.policy_problems(rendered[overlay]) == []


def test_every_object_is_namespaced_in_gpuaware_or_cluster_scoped(rendered):
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for docs in rendered.values():
        for doc in docs:
            expected = None if doc["kind"] in cluster_scoped else "gpuaware"
            assert doc["metadata"].get("namespace") == expected, mc.ident(doc)


def test_kafka_topics_equal_the_topic_contract(rendered):
    for overlay in ("dev", "production"):
        names = {t["spec"]["topicName"] for t in by_kind(rendered[overlay], "KafkaTopic")}
        assert names == {t.name for t in topics.ALL_TOPICS}
    prod = {t["spec"]["topicName"]: t["spec"] for t in by_kind(rendered["production"], "KafkaTopic")}
    assert prod[topics.GPU_STATE]["config"]["cleanup.policy"] == "compact"
    assert prod[topics.TELEMETRY]["partitions"] == 8
    assert {s["replicas"] for s in prod.values()} == {3}
    assert {t["spec"]["replicas"] for t in by_kind(rendered["dev"], "KafkaTopic")} == {1}


def test_overlays_size_kafka_and_replicas(rendered):
    dev, prod = rendered["dev"], rendered["production"]
    assert one(dev, "KafkaNodePool", "brokers")["spec"]["replicas"] == 1
    assert one(prod, "KafkaNodePool", "brokers")["spec"]["replicas"] == 3
    assert "rack" not in one(dev, "Kafka", "gpuaware-kafka")["spec"]["kafka"]
    assert one(prod, "Kafka", "gpuaware-kafka")["spec"]["kafka"]["rack"]["topologyKey"] == "topology.kubernetes.io/zone"
    assert one(dev, "Deployment", "gpuaware-stream")["spec"]["replicas"] == 1
    assert one(prod, "Deployment", "gpuaware-stream")["spec"]["replicas"] == 4
    assert one(prod, "Deployment", "gpuaware-scheduler")["spec"]["replicas"] == 2
    existing = rendered["existing-kafka"]
    assert not [d for d in existing if d["apiVersion"].startswith("kafka.strimzi.io/")]
    config = yaml.safe_load(one(existing, "ConfigMap", "gpuaware-config")["data"]["gpuaware.yaml"])
    assert "gpuaware-kafka-kafka-bootstrap" not in config["kafka"]["bootstrap_servers"]


def test_component_config_is_accepted_by_gpuaware(rendered, tmp_path):
    """The config file each overlay ships loads through gpuaware's own validation."""
    from gpuaware.config import load_config

    for overlay, docs in rendered.items():
        text = one(docs, "ConfigMap", "gpuaware-config")["data"]["gpuaware.yaml"]
        path = tmp_path / f"config-{overlay}.yaml"
        path.write_text(text)
        env = {"GPUAWARE_KAFKA__SASL_USERNAME": "gpuaware-agent", "GPUAWARE_KAFKA__SASL_PASSWORD": "x"}
        config = load_config(path=path, environ=env)
        assert config.kafka.security_protocol == "SASL_SSL", overlay


def test_agent_runs_only_on_gpu_nodes_with_least_privilege(rendered):
    docs = rendered["production"]
    pod = one(docs, "DaemonSet", "gpuaware-agent")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["runtimeClassName"] == "nvidia"
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    rules = one(docs, "ClusterRole", "gpuaware-agent")["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    stream_pod = one(docs, "Deployment", "gpuaware-stream")["spec"]["template"]["spec"]
    assert stream_pod["automountServiceAccountToken"] is False
    assert not [b for b in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding")
                if any(s["name"] == "gpuaware-stream" for s in b["subjects"])]


def test_scheduler_rbac_and_extender_config(rendered):
    docs = rendered["production"]
    granted = {(g, r, v) for rule in one(docs, "ClusterRole", "gpuaware-scheduler")["rules"]
               for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    for need in [("", "pods/binding", "create"), ("", "pods/eviction", "create"), ("", "pods", "watch"),
                 ("", "events", "create"), ("policy", "poddisruptionbudgets", "list"),
                 ("gpuaware.io", "gpuqueues/status", "patch")]:
        assert need in granted
    assert ("", "pods", "delete") not in granted  # evictions only, so PDBs are honoured
    lease_rules = one(docs, "Role", "gpuaware-scheduler-leader-election")["rules"]
    assert lease_rules[0]["resources"] == ["leases"]
    snippet = yaml.safe_load(one(docs, "ConfigMap", "gpuaware-kube-scheduler-extender")["data"]
                             ["kube-scheduler-config.yaml"])
    extender = snippet["extenders"][0]
    service = one(docs, "Service", "gpuaware-scheduler-extender")
    assert extender["urlPrefix"] == f"https://{service['metadata']['name']}.gpuaware.svc:{service['spec']['ports'][0]['port']}/"
    assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")


def test_monitoring_objects_come_from_dashboards(rendered):
    docs = rendered["production"]
    rule = one(docs, "PrometheusRule", "gpuaware")
    source = yaml.safe_load((REPO / "dashboards" / "prometheus" / "rules.yml").read_text())
    assert rule["spec"]["groups"] == source["groups"]
    dashboards = by_kind(docs, "ConfigMap")
    names = {key for d in dashboards if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
             for key in d["data"]}
    assert names == {p.name for p in (REPO / "dashboards" / "grafana").glob("*.json")}


def crds_and_examples(rendered) -> tuple[list[mc.Doc], list[mc.Doc]]:
    crds = [d for d in rendered["production"] if d["kind"] == "CustomResourceDefinition"]
    files = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
    return crds, [d for p in files for d in yaml.safe_load_all(p.read_text())]


def test_examples_validate_against_gpuaware_crds(rendered):
    crds, examples = crds_and_examples(rendered)
    assert {e["kind"] for e in examples} == {"GPUQueue", "GPUWorkload"}
    assert mc.schema_problems(crds + examples) == []


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
])
def test_policy_checks_catch_broken_manifests(rendered, kind, name, change, expect):
    problems = mc.policy_problems(mc.with_change(rendered["production"], kind, name, change))
    assert any(expect in p for p in problems), problems


def test_unknown_kind_without_a_schema_is_a_problem():
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    (problem,) = mc.schema_problems([doc])
    assert "no schema for example.com/v1 Widget" in problem


def test_dockerfile_is_multistage_non_root_and_pinned():
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base)
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user and user[-1].split(":")[0].isdigit() and user[-1].split(":")[0] != "0"
    assert "[test" not in text and "-e " not in text  # runtime deps only, a real install
    assert re.search(r'^ENTRYPOINT \["gpuaware"\]$', text, re.M)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"tests", ".git", ".venv"} <= set(ignored)
