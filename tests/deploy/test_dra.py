"""deploy/components/dra and dra-deviceclasses, and deploy/examples/dra: rendered, checked offline against the
Kubernetes 1.34 and 1.37 schemas and gpuaware's policy, accepted by a real kube-apiserver 1.36 (server dry
run), and the scheduler's DRA grant exact and sufficient: every call the DRA path makes, made as its
ServiceAccount. Real-apiserver parts skipped when the control plane is not built, failed under ``CI=true``."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpuaware.contract import dra
from gpuaware.deploy import checks as mc
from gpuaware.deploy.crds import CrdsMissing, third_party_crd_files
from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
from gpuaware.plumbing.kube.resource_slices import NodeGpu, SlicePublisher
from tests.contract.nvidia_slices import h100_node
from tests.support import RBAC_KINDS, REPO, need, overlay_with

if shutil.which("kubectl") is None:
    pytest.skip("kubectl not installed (Debian package kubectl; .ci/run installs it)", allow_module_level=True)

NS = "gpuaware"
DRA_VERSIONS = ("1.34.0", "1.37.0")  # resource.k8s.io/v1 is served from 1.34 on
EXAMPLE = REPO / "deploy" / "examples" / "dra" / "workload.yaml"
GRANT = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "deviceclasses"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
     "verbs": ["get", "list", "watch", "update", "patch"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["update", "patch"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"], "verbs": ["update", "patch"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
     "verbs": ["list", "watch", "create", "delete"]},
]


def one(docs: list[mc.Doc], kind: str, name: str) -> mc.Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.fixture(scope="module")
def overlay(tmp_path_factory) -> Path:
    return overlay_with(tmp_path_factory.mktemp("dra") / "mine", "dra", "dra-deviceclasses", "agent-resource-slices")


def test_the_components_render_pass_the_policy_and_the_schemas(overlay):
    docs = mc.render(overlay)
    assert mc.policy_problems(docs) == []
    assert one(docs, "ClusterRole", "gpuaware-scheduler-dra")["rules"] == GRANT
    assert one(docs, "ClusterRoleBinding", "gpuaware-scheduler-dra")["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuaware-scheduler", "namespace": NS}]
    classes = {d["metadata"]["name"]: d["spec"]["selectors"][0]["cel"]["expression"]
               for d in docs if d["kind"] == "DeviceClass"}
    assert classes == {
        dra.DEVICE_CLASS_GPU: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        dra.DEVICE_CLASS_MIG: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}
    env = {e["name"]: e for e in one(docs, "Deployment", "gpuaware-scheduler")["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["GPUAWARE_SCHEDULER__DEVICE_TAINTS"]["value"] == "true" and "GPUAWARE_CONFIG" in env
    from gpuaware.config import load_config

    assert load_config(environ={"GPUAWARE_SCHEDULER__DEVICE_TAINTS": "true"}).scheduler.device_taints is True
    agent_env = {e["name"]: e for e in one(docs, "DaemonSet", "gpuaware-agent")["spec"]["template"]["spec"]
                 ["containers"][0]["env"]}
    assert agent_env["GPUAWARE_AGENT__RESOURCE_SLICES"]["value"] == "true" and "GPUAWARE_CONFIG" in agent_env
    assert load_config(environ={"GPUAWARE_AGENT__RESOURCE_SLICES": "true"}).agent.resource_slices is True
    assert one(docs, "ClusterRole", "gpuaware-agent-resource-slices")["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["list", "create", "update", "delete"]}]
    need(third_party_crd_files, CrdsMissing)
    dra_docs = [d for d in docs if d["apiVersion"].startswith("resource.k8s.io/")]
    assert mc.schema_problems(dra_docs + list(yaml.safe_load_all(EXAMPLE.read_text())), DRA_VERSIONS) == []
    assert mc.schema_problems([d for d in docs if d not in dra_docs]) == []


def test_the_example_asks_for_what_the_contract_publishes():
    templates = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "ResourceClaimTemplate"]
    text = json.dumps(templates)
    assert {r["exactly"]["deviceClassName"] for t in templates for r in t["spec"]["spec"]["devices"]["requests"]} == \
        {dra.DEVICE_CLASS_GPU, dra.DEVICE_CLASS_MIG}
    assert dra.ATTR_NVLINK_ISLAND in text and f"capacity['{dra.DRIVER}'].{dra.CAP_MEMORY}" in text


# ----------------------------------------------------------------------------- on a real apiserver
@pytest.fixture(scope="module")
def cp(overlay) -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    crds = need(third_party_crd_files, CrdsMissing)
    with KubeControlPlane(feature_gates={"DRADeviceTaintRules": True},
                          apiserver_args=["--runtime-config=resource.k8s.io/v1beta2=true"]) as plane:
        for path in [*crds, *sorted((REPO / "deploy" / "base" / "crds").glob("*.yaml"))]:
            plane.kubectl("apply", "--server-side", "-f", str(path))
        plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        plane.create_namespace(NS)
        plane.create_namespace("vision-train")
        rendered = plane.kubectl("kustomize", str(overlay)).stdout
        plane.apply(yaml.safe_dump_all([d for d in yaml.safe_load_all(rendered)
                                        if d and (d["kind"] in RBAC_KINDS or d["kind"] == "DeviceClass")]))
        yield plane


def test_the_overlay_with_the_components_and_the_example_are_accepted(cp, overlay):
    for args in (("-k", str(overlay)), ("-f", str(EXAMPLE))):
        proc = cp.kubectl("apply", "--dry-run=server", *args, check=False)
        assert proc.returncode == 0, proc.stderr
        assert "(server dry run)" in proc.stdout


def _resource_rows(cp: KubeControlPlane, kubeconfig: Path) -> set[tuple[str, str]]:
    text = cp.kubectl("auth", "can-i", "--list", kubeconfig=kubeconfig).stdout
    rows = set()
    for line in text.splitlines()[1:]:
        m = re.match(r"^(\S+)\s+\[[^\]]*\]\s+\[[^\]]*\]\s+(\[[^\]]*\])\s*$", line)
        if m and ".resource.k8s.io" in m.group(1):
            rows.add((m.group(1), m.group(2)))
    return rows


def test_the_scheduler_may_exactly_what_the_dra_path_needs(cp):
    rows = _resource_rows(cp, cp.serviceaccount_kubeconfig(NS, "gpuaware-scheduler", create=False))
    assert rows == {
        ("resourceslices.resource.k8s.io", "[get list watch]"),
        ("deviceclasses.resource.k8s.io", "[get list watch]"),
        ("resourceclaims.resource.k8s.io", "[get list watch update patch]"),
        ("resourceclaims.resource.k8s.io/status", "[update patch]"),
        ("resourceclaims.resource.k8s.io/binding", "[update patch]"),
        ("devicetaintrules.resource.k8s.io", "[list watch create delete]"),
    }


def _status(call: Any, *args: Any, **kwargs: Any) -> int:
    try:
        call(*args, **kwargs)
        return 200
    except ApiException as exc:
        return exc.status or 0


def test_every_dra_call_works_as_the_scheduler_and_nothing_more(cp):
    admin = config.new_client_from_config(str(cp.kubeconfig))
    SlicePublisher(admin).publish("rbac-node", [NodeGpu(0, "GPU-r-0", "H100", 80 * 2**30)])
    sa = config.new_client_from_config(str(cp.serviceaccount_kubeconfig(NS, "gpuaware-scheduler", create=False)))
    custom = client.CustomObjectsApi(sa)
    g, v = "resource.k8s.io", "v1"
    assert _status(custom.list_cluster_custom_object, g, v, "resourceslices") == 200
    assert _status(custom.list_cluster_custom_object, g, v, "deviceclasses") == 200
    client.CustomObjectsApi(admin).create_namespaced_custom_object(g, v, "vision-train", "resourceclaims", {
        "apiVersion": f"{g}/{v}", "kind": "ResourceClaim", "metadata": {"name": "c1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS_GPU}}]}}})
    claim = custom.get_namespaced_custom_object(g, v, "vision-train", "resourceclaims", "c1")
    # The allocation as kube-scheduler writes it: the finalizer first, then status.allocation + reservedFor.
    claim["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    claim = custom.replace_namespaced_custom_object(g, v, "vision-train", "resourceclaims", "c1", claim)
    claim["status"] = {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": dra.DRIVER, "pool": "rbac-node",
                                                "device": "gpu-0"}]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": ["rbac-node"]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": "00000000-0000-0000-0000-000000000001"}]}
    stored = custom.replace_namespaced_custom_object_status(g, v, "vision-train", "resourceclaims", "c1", claim)
    assert stored["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    rule = {"apiVersion": f"{g}/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "r1"},
            "spec": {"deviceSelector": {"driver": dra.DRIVER, "pool": "rbac-node", "device": "gpu-0"},
                     "taint": {"key": dra.TAINT_UNHEALTHY, "effect": "NoSchedule"}}}
    assert _status(custom.create_cluster_custom_object, g, "v1beta2", "devicetaintrules", rule) == 200
    assert _status(custom.delete_cluster_custom_object, g, "v1beta2", "devicetaintrules", "r1") == 200
    # Not granted: publishing or deleting slices, deleting claims, DeviceClasses, templates.
    body = SlicePublisher(admin).current("rbac-node")[0]
    body["metadata"] = {"name": "forged"}
    assert _status(custom.create_cluster_custom_object, g, v, "resourceslices", body) == 403
    assert _status(custom.delete_namespaced_custom_object, g, v, "vision-train", "resourceclaims", "c1") == 403
    assert _status(custom.delete_cluster_custom_object, g, v, "deviceclasses", dra.DEVICE_CLASS_GPU) == 403
    assert _status(custom.list_namespaced_custom_object, g, v, "vision-train", "resourceclaimtemplates") == 403


def _token_client(cp: KubeControlPlane, token: str) -> client.ApiClient:
    cfg = yaml.safe_load(cp.kubeconfig.read_text())
    cfg["users"] = [{"name": "bearer", "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = "bearer"
    path = cp.kubeconfig.parent / f"token-{abs(hash(token))}.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return config.new_client_from_config(str(path))


def test_an_agent_publishes_the_slices_of_its_own_node_and_no_others(cp):
    """The admission policy of deploy/components/agent-resource-slices, with the token the kubelet mounts."""
    admin = config.new_client_from_config(str(cp.kubeconfig))
    for node in ("slice-a", "slice-b"):
        cp.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-slice-a", "namespace": NS},
              "spec": {"nodeName": "slice-a", "serviceAccountName": "gpuaware-agent",
                       "containers": [{"name": "main", "image": "registry.invalid/agent:1"}]}})
    token = cp.kubectl("create", "token", "gpuaware-agent", "-n", NS, "--bound-object-kind", "Pod",
                       "--bound-object-name", "agent-slice-a").stdout.strip()
    agent = SlicePublisher(_token_client(cp, token))
    gpus = [NodeGpu(0, "GPU-sa-0", "H100", 80 * 2**30)]
    assert agent.publish("slice-a", gpus).written == 1
    assert agent.publish("slice-a", [NodeGpu(1, "GPU-sa-1", "H100", 80 * 2**30)]).written == 1  # an update
    with pytest.raises(ApiException) as other:
        agent.publish("slice-b", gpus)
    assert "only the ResourceSlices of the node its pod runs on" in json.loads(other.value.body)["message"]
    # NVIDIA's slice on its own node: not the agent's to change.
    nvidia = h100_node("slice-a")
    nvidia["metadata"].pop("generateName")
    SlicePublisher(admin).custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", nvidia)
    with pytest.raises(ApiException) as theirs:
        agent.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices",
                                                  nvidia["metadata"]["name"])
    assert "only gpuaware's gpu.nvidia.com ResourceSlices" in json.loads(theirs.value.body)["message"]
    # Without a node claim (a plain ServiceAccount token) nothing is written.
    plain = SlicePublisher(config.new_client_from_config(
        str(cp.serviceaccount_kubeconfig(NS, "gpuaware-agent", create=False))))
    with pytest.raises(ApiException):
        plain.publish("slice-a", [NodeGpu(2, "GPU-sa-2", "H100", 80 * 2**30)])
