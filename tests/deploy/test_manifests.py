"""deploy/: the generated manifests match the code; every overlay renders with kubectl kustomize,
validates against the Kubernetes and CRD schemas, and passes gpuaware's deployment policy."""

from __future__ import annotations

import shutil

import pytest
import yaml

from gpuaware.contract import topics
from gpuaware.deploy import checks as mc
from gpuaware.deploy import manifests
from gpuaware.deploy.crds import CrdsMissing, third_party_crd_files
from tests.support import OVERLAYS, REPO, crds_and_examples, need, overlay_with

if shutil.which("kubectl") is None:
    pytest.skip("kubectl not installed (Debian package kubectl; .ci/run installs it)", allow_module_level=True)


def by_kind(docs: list[mc.Doc], kind: str) -> list[mc.Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[mc.Doc], kind: str, name: str) -> mc.Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_generated_manifests_match_the_code():
    assert manifests.main(["--check"]) == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_against_kubernetes_and_crd_schemas(rendered, overlay):
    need(third_party_crd_files, CrdsMissing)  # the real Strimzi and Prometheus Operator CRDs
    assert mc.schema_problems(rendered[overlay]) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_passes_the_deployment_policy(rendered, overlay):
    assert mc.policy_problems(rendered[overlay]) == []


def test_every_object_is_namespaced_in_gpuaware_or_cluster_scoped(rendered):
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    # Cluster-scoped too, but kustomize's built-in schema predates them and stamps the namespace on;
    # the apiserver drops it (tests/deploy/test_rbac.py checks that on a real one).
    stamped = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for docs in rendered.values():
        for doc in docs:
            expected = None if doc["kind"] in cluster_scoped else "gpuaware"
            assert doc["metadata"].get("namespace") == expected or doc["kind"] in stamped, mc.ident(doc)


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
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]  # patch: admission policy
    token = next(v for v in pod["volumes"] if v["name"] == "node-token")["projected"]["sources"][0]
    assert token["serviceAccountToken"]["audience"] == "gpuaware-stream"
    assert mounts["/var/run/secrets/gpuaware"]["readOnly"] is True
    # The stream's one API permission: TokenReviews of those node tokens.
    stream_pod = one(docs, "Deployment", "gpuaware-stream")["spec"]["template"]["spec"]
    assert stream_pod["automountServiceAccountToken"] is True
    assert one(docs, "ClusterRole", "gpuaware-stream")["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]
    assert not [b for b in by_kind(docs, "RoleBinding") if any(s["name"] == "gpuaware-stream" for s in b["subjects"])]


def test_power_caps_are_set_by_a_capper_container_and_the_agent_keeps_no_privilege(rendered):
    """NVML sets power limits only for CAP_SYS_ADMIN: the capper has that one capability and nothing that
    reaches beyond the node (no Kafka secret, no API token, no port); the agent keeps none and asks it on a
    socket in a memory emptyDir the two share."""
    pod = one(rendered["production"], "DaemonSet", "gpuaware-agent")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"agent", "power-capper"}
    agent, capper = containers["agent"], containers["power-capper"]
    assert agent["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert "runAsUser" not in agent["securityContext"]
    ctx = capper["securityContext"]
    assert ctx["runAsUser"] == 0 and ctx["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
    assert not ctx.get("privileged")
    assert capper["command"] == ["python", "-m", "gpuaware.agent.power_capper"]
    args = capper["args"]
    assert args[args.index("--allow-uid") + 1] == str(pod["securityContext"]["runAsUser"])
    sock = args[args.index("--socket") + 1]
    assert {e["name"]: e.get("value") for e in agent["env"]}["GPUAWARE_AGENT__POWER_CAPPER_SOCKET"] == sock
    assert "ports" not in capper and "envFrom" not in capper
    assert not [e for e in capper["env"] if "valueFrom" in e or "KAFKA" in e["name"]]
    mounts = {m["mountPath"]: m["name"] for m in capper["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts == {"/run/gpuaware/power": "power-socket",
                      "/var/run/secrets/kubernetes.io/serviceaccount": "no-api-token"}
    assert "emptyDir" in volumes["no-api-token"] and volumes["power-socket"]["emptyDir"]["medium"] == "Memory"
    assert {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}["/run/gpuaware/power"] == "power-socket"


def test_the_agent_pod_uids_component_grants_pod_reads_and_turns_them_on(rendered, tmp_path):
    """Opt-in (docs/security.md): the component adds a ClusterRole of its own and the env that turns
    agent.pod_uids on; without it nothing reads pods and the agent's own grant is the same."""
    docs = mc.render(overlay_with(tmp_path / "mine", "agent-pod-uids"))
    assert mc.policy_problems(docs) == []
    assert one(docs, "ClusterRole", "gpuaware-agent-read-pods")["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = one(docs, "ClusterRoleBinding", "gpuaware-agent-read-pods")
    assert binding["roleRef"]["name"] == "gpuaware-agent-read-pods"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuaware-agent", "namespace": "gpuaware"}]
    assert one(docs, "ClusterRole", "gpuaware-agent") == one(rendered["production"], "ClusterRole", "gpuaware-agent")
    env = {e["name"]: e for e in one(docs, "DaemonSet", "gpuaware-agent")["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["GPUAWARE_AGENT__POD_UIDS"]["value"] == "true"
    assert "GPUAWARE_CONFIG" in env  # merged into the container's env, not replacing it
    from gpuaware.config import load_config

    assert load_config(environ={"GPUAWARE_AGENT__POD_UIDS": "true"}).agent.pod_uids is True
    for overlay, shipped in rendered.items():  # no shipped overlay reads pods from the agent
        assert not [d for d in shipped if d["metadata"]["name"] == "gpuaware-agent-read-pods"], overlay
    need(third_party_crd_files, CrdsMissing)  # the real Strimzi and Prometheus Operator CRDs
    assert mc.schema_problems(docs) == []


def test_the_shipped_config_requires_node_identity_and_gives_the_agent_its_token():
    from gpuaware.config import GpuawareConfig

    text = yaml.safe_load((REPO / "deploy" / "base" / "config.yaml").read_text().split("---")[0])
    body = yaml.safe_load(text["data"]["gpuaware.yaml"])
    body["kafka"].update(sasl_username="u", sasl_password="p")  # from each component's env and Secret
    cfg = GpuawareConfig.model_validate(body)
    assert cfg.stream.node_identity == "required"
    assert cfg.agent.node_token_path == "/var/run/secrets/gpuaware/node-token"


def test_scheduler_rbac_and_extender_config(rendered):
    docs = rendered["production"]
    granted = {(g, r, v) for rule in one(docs, "ClusterRole", "gpuaware-scheduler")["rules"]
               for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    for wanted in [("", "pods/binding", "create"), ("", "pods/eviction", "create"), ("", "pods", "watch"),
                   ("", "events", "create"), ("gpuaware.io", "gpuqueues/status", "patch")]:
        assert wanted in granted
    assert ("", "pods", "delete") not in granted  # evictions only, so PDBs are honoured
    # RBAC cannot limit a patch to one annotation; these admission policies do (tests/deploy/test_rbac.py).
    policies = {d["metadata"]["name"] for d in by_kind(docs, "ValidatingAdmissionPolicyBinding")
                if d["spec"]["validationActions"] == ["Deny"]}
    assert policies == {"gpuaware-scheduler-pod-writes", "gpuaware-scheduler-node-writes",
                        "gpuaware-scheduler-node-status-writes", "gpuaware-agent-node-writes"}
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
    source = yaml.safe_load((REPO / "gpuaware" / "dashboards" / "prometheus" / "rules.yml").read_text())
    assert rule["spec"]["groups"] == source["groups"]
    dashboards = by_kind(docs, "ConfigMap")
    names = {key for d in dashboards if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
             for key in d["data"]}
    assert names == {p.name for p in (REPO / "gpuaware" / "dashboards" / "grafana").glob("*.json")}


def test_examples_validate_against_gpuaware_crds(rendered):
    crds, examples = crds_and_examples(rendered)
    assert {e["kind"] for e in examples} == {"GPUQueue", "GPUWorkload"}
    assert mc.schema_problems(crds + examples) == []
