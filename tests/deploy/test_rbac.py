"""The shipped RBAC on a real kube-apiserver: each component's exact permissions, and every API call
the scheduler and the agent make, made as their ServiceAccounts.

The RBAC objects (ServiceAccounts, roles, bindings, the scheduler's ValidatingAdmissionPolicies) are
taken from the production overlay as ``kubectl kustomize`` renders it, and applied as they ship.
Each ServiceAccount acts through a TokenRequest token. ``kubectl auth can-i --list`` gives its
permission set, which must equal the table below, no more and no less (what every authenticated
user may do, discovery and self-reviews, is measured on a ServiceAccount with no binding and left
out). Skipped when the control plane is not built, failed under ``CI=true``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpuaware.contract import annotations
from gpuaware.contract.identity import NODE_TOKEN_HEADER, TOKEN_AUDIENCE
from gpuaware.local.kube_control_plane import KubeControlPlane
from gpuaware.plumbing.kube.api import KubeApi, now_rfc3339
from tests.real_kube import api_client
from tests.support import REPO, overlay_with, shipped_rbac

NS = "gpuaware"

# (resource, resource names, verbs) per ServiceAccount, as `kubectl auth can-i --list -n gpuaware` prints them.
Row = tuple[str, str, str]
EXPECTED: dict[str, set[Row]] = {
    "gpuaware-agent": {
        ("nodes", "[]", "[get patch]"),  # its own Node: cordons read, cap acknowledgement written (admission policy)
    },
    "gpuaware-scheduler": {
        ("pods", "[]", "[list watch patch]"),  # patch: only the checkpoint-request annotation (admission policy)
        ("pods/binding", "[]", "[create]"),
        ("pods/eviction", "[]", "[create]"),
        ("nodes", "[]", "[get list watch patch]"),  # patch: only the cordoned-GPUs annotation (admission policy)
        ("nodes/status", "[]", "[patch]"),  # only its GPU health conditions (admission policy)
        ("events", "[]", "[create]"),
        ("gpuqueues.gpuaware.io", "[]", "[list watch]"),
        ("gpuqueues.gpuaware.io/status", "[]", "[patch]"),
        ("podgroups.scheduling.k8s.io", "[]", "[list watch]"),  # gangs of the Workload API, where served
        ("podgroups.scheduling.k8s.io/status", "[]", "[patch]"),  # their PodGroupScheduled condition
        ("leases.coordination.k8s.io", "[gpuaware-scheduler]", "[get update]"),
        ("leases.coordination.k8s.io", "[]", "[create]"),  # RBAC cannot restrict a create by name
    },
    "gpuaware-stream": {
        ("tokenreviews.authentication.k8s.io", "[]", "[create]"),  # the agents' node tokens (docs/security.md)
    },
}
_ROW = re.compile(r"^(\S*)\s+(\[[^\]]*\])\s+(\[[^\]]*\])\s+(\[[^\]]*\])\s*$")


def permissions(cp: KubeControlPlane, kubeconfig: Path) -> set[tuple[str, str, str, str]]:
    """(resource, non-resource URLs, resource names, verbs) rows of ``kubectl auth can-i --list``."""
    text = cp.kubectl("auth", "can-i", "--list", "-n", NS, kubeconfig=kubeconfig).stdout
    rows = set()
    for line in text.splitlines()[1:]:
        match = _ROW.match(line)
        assert match, f"unexpected auth can-i line: {line!r}"
        rows.add(match.groups())
    return rows


@pytest.fixture(scope="module")
def everyone(cp) -> set[tuple[str, str, str, str]]:
    """What any authenticated ServiceAccount may do (discovery, self-reviews), from one with no binding."""
    return permissions(cp, cp.serviceaccount_kubeconfig(NS, "gpuaware-test-nobody"))


@pytest.mark.parametrize("account", sorted(EXPECTED))
def test_serviceaccount_has_exactly_the_expected_permissions(cp, everyone, account, capsys):
    granted = permissions(cp, cp.serviceaccount_kubeconfig(NS, account, create=False)) - everyone
    assert all(urls == "[]" for _, urls, _, _ in granted), granted  # no non-resource URL beyond discovery
    table = {(res, names, verbs) for res, _, names, verbs in granted}
    with capsys.disabled():
        print(f"\n{account} (beyond what every authenticated user may do):")
        for res, names, verbs in sorted(table) or [("(nothing)", "", "")]:
            print(f"  {res:<34} {names:<22} {verbs}")
    assert table == EXPECTED[account], (f"missing: {sorted(EXPECTED[account] - table)}; "
                                        f"excess: {sorted(table - EXPECTED[account])}")


# ----------------------------------------------------------------------------- the calls themselves
def _api(kubeconfig: Path) -> KubeApi:
    return KubeApi(api_client(kubeconfig))


def _status(call: Any, *args: Any, **kwargs: Any) -> int:
    """The HTTP status a call is answered with (200 when it returns)."""
    try:
        call(*args, **kwargs)
        return 200
    except ApiException as exc:
        return exc.status or 0


@pytest.fixture(scope="module")
def scheduler_api(cp) -> KubeApi:
    return _api(cp.serviceaccount_kubeconfig(NS, "gpuaware-scheduler", create=False))


def _pod(cp: KubeControlPlane, name: str) -> None:
    cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
              "spec": {"schedulerName": "gpuaware",
                       "containers": [{"name": "main", "image": "registry.invalid/train:1"}]}})


def _node(cp: KubeControlPlane, name: str) -> None:
    cp.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"gpu": "h100"}}})


def _get(cp: KubeControlPlane, *args: str) -> dict[str, Any]:
    return yaml.safe_load(cp.kubectl("get", *args, "-o", "yaml").stdout)


@pytest.fixture(scope="module", autouse=True)
def _policies_enforced(cp) -> None:
    """An admission policy binds once the apiserver's policy informer has it, a moment after it is created: CI saw the
    scheduler's refused image patch go through (200, not 422) in the first test that asserts a refusal. Before any
    test, wait until each shipped policy these tests rely on refuses a write it refuses: dry runs on objects of their
    own, so the probes change nothing (tests/deploy/test_rbac_node_health.py waits likewise for the node status one)."""
    _node(cp, "policy-probe")
    _pod(cp, "policy-probe")
    scheduler = _api(cp.serviceaccount_kubeconfig(NS, "gpuaware-scheduler", create=False))
    agent = _api(cp.serviceaccount_kubeconfig(NS, "gpuaware-agent", create=False))  # no node claim: writes nothing
    label = {"metadata": {"labels": {"probe": "refused"}}}
    probes = {
        "gpuaware-scheduler-pod-writes": lambda: scheduler.core.patch_namespaced_pod("policy-probe", NS, label,
                                                                                     dry_run="All"),
        "gpuaware-scheduler-node-writes": lambda: scheduler.core.patch_node("policy-probe", label, dry_run="All"),
        "gpuaware-agent-node-writes": lambda: agent.core.patch_node("policy-probe", label, dry_run="All"),
    }
    deadline = time.monotonic() + 60
    while True:
        probes = {name: probe for name, probe in probes.items() if _status(probe) != 422}
        if not probes:
            return
        assert time.monotonic() < deadline, f"admission policies not enforced within 60 s: {sorted(probes)}"
        time.sleep(0.2)  # polling interval of a condition with a deadline


def test_the_binding_carries_the_gpu_assignment_annotations_onto_the_pod(cp, scheduler_api):
    """No pod patch is needed for the assignment: the apiserver copies a Binding's annotations to the pod."""
    _node(cp, "bind-node")
    _pod(cp, "bound")
    assigned = {annotations.ANN_GPUS: "0,1"}
    scheduler_api.bind(NS, "bound", "bind-node", assigned)
    pod = _get(cp, "pod", "bound", "-n", NS)
    assert pod["spec"]["nodeName"] == "bind-node"
    assert pod["metadata"]["annotations"].items() >= assigned.items()


def test_the_scheduler_may_write_its_checkpoint_request_and_nothing_else_on_a_pod(cp, scheduler_api):
    _pod(cp, "ckpt")
    asked = now_rfc3339()
    scheduler_api.annotate_pod(NS, "ckpt", {annotations.ANN_CHECKPOINT_REQUEST: asked})
    assert _get(cp, "pod", "ckpt", "-n", NS)["metadata"]["annotations"][annotations.ANN_CHECKPOINT_REQUEST] == asked

    core = scheduler_api.core
    image = {"spec": {"containers": [{"name": "main", "image": "registry.invalid/evil:1"}]}}
    assert _status(core.patch_namespaced_pod, "ckpt", NS, image) == 422  # denied by the admission policy
    assert _status(core.patch_namespaced_pod, "ckpt", NS, {"metadata": {"labels": {"app": "other"}}}) == 422
    assert _status(scheduler_api.annotate_pod, NS, "ckpt", {annotations.ANN_CHECKPOINT_DONE: asked}) == 422
    assert _get(cp, "pod", "ckpt", "-n", NS)["spec"]["containers"][0]["image"] == "registry.invalid/train:1"
    assert _status(core.delete_namespaced_pod, "ckpt", NS) == 403
    # The policy binds the scheduler only: the pod's owner (here the admin) still updates it freely.
    cp.kubectl("annotate", "pod", "ckpt", "-n", NS, f"{annotations.ANN_CHECKPOINT_DONE}={asked}")


def test_the_scheduler_may_write_gpu_cordons_and_power_caps_and_nothing_else_on_a_node(cp, scheduler_api):
    _node(cp, "cordon-node")
    scheduler_api.cordon_gpu("cordon-node", 3)
    scheduler_api.cordon_gpu("cordon-node", 5)
    assert annotations.cordoned_gpus(_get(cp, "node", "cordon-node")) == {3, 5}
    # The power caps in force (docs/security.md): recorded, and removed once lifted.
    scheduler_api.record_power_cap("cordon-node", 1, 300)
    scheduler_api.record_power_cap("cordon-node", 2, 250)
    scheduler_api.record_power_cap("cordon-node", 1, 0)
    assert annotations.power_caps(_get(cp, "node", "cordon-node")) == {2: 250}
    scheduler_api.record_power_cap("cordon-node", 2, 0)
    assert annotations.ANN_POWER_CAPS not in _get(cp, "node", "cordon-node")["metadata"]["annotations"]

    core = scheduler_api.core
    assert _status(core.patch_node, "cordon-node", {"spec": {"unschedulable": True}}) == 422
    assert _status(core.patch_node, "cordon-node", {"spec": {"taints": [
        {"key": "x", "effect": "NoSchedule"}]}}) == 422
    assert _status(core.patch_node, "cordon-node", {"metadata": {"labels": {"gpu": "none"}}}) == 422
    assert _status(core.delete_node, "cordon-node") == 403


def test_the_scheduler_watches_evicts_reports_and_leads_as_its_serviceaccount(cp, scheduler_api):
    core, custom = scheduler_api.core, scheduler_api.custom
    # Informers: list and watch of pods, nodes and GPUQueues (the specs gpuaware.scheduler.kube.live follows).
    core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed")
    core.list_node()
    # Watches are closed, not released: a watch's unread events left on a pooled connection are read as the
    # next call's status line (BadStatusLine('687') in CI).
    core.list_pod_for_all_namespaces(watch=True, timeout_seconds=1, _preload_content=False).close()
    core.list_node(watch=True, timeout_seconds=1, _preload_content=False).close()
    cp.apply(yaml.safe_dump_all(yaml.safe_load_all((REPO / "deploy" / "examples" / "gpuqueue.yaml").read_text())))
    queues = custom.list_cluster_custom_object("gpuaware.io", "v1alpha1", "gpuqueues")
    custom.list_cluster_custom_object("gpuaware.io", "v1alpha1", "gpuqueues", watch=True, timeout_seconds=1,
                                      _preload_content=False).close()
    name = queues["items"][0]["metadata"]["name"]
    scheduler_api.patch_queue_status(name, {"pendingGpus": 0})
    # Evictions (the Eviction API, so PDBs hold) and the Events that explain them.
    _pod(cp, "victim")
    pod = _get(cp, "pod", "victim", "-n", NS)
    scheduler_api.create_event(scheduler_api.event_body(pod, "Preempted", "for a higher-priority gang"))
    scheduler_api.evict(NS, "victim")
    # Leader election on its own Lease only.
    assert scheduler_api.read_lease(NS, "gpuaware-scheduler") is None
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "gpuaware-scheduler", "namespace": NS}, "spec": {"holderIdentity": "a"}}
    created = scheduler_api.create_lease(NS, lease)
    created["spec"]["holderIdentity"] = "b"
    scheduler_api.replace_lease(NS, "gpuaware-scheduler", created)
    assert _status(scheduler_api.coordination.read_namespaced_lease, "other", NS) == 403
    assert _status(core.list_namespaced_secret, NS) == 403


def test_the_agent_reads_a_node_and_writes_only_its_own_nodes_cap_acknowledgement(cp):
    """Item 8 of issue 17 on the Kubernetes side: the agent's writes are keyed on its token's node claim."""
    for node in ("agent-node", "agent-other"):
        _node(cp, node)
    _pod_on(cp, "agent-on-agent-node", "agent-node", "gpuaware-agent")
    bound = _token_kubeconfig(cp, _bound_token(cp, "gpuaware-agent", "agent-on-agent-node", audience=""))
    api = _api(bound)
    assert api.read_node("agent-node")["metadata"]["name"] == "agent-node"
    assert _status(api.core.list_node) == 403
    acked = {annotations.ANN_POWER_CAPS_APPLIED: '{"0":300}'}
    api.annotate_node("agent-node", acked)
    assert annotations.power_caps(_get(cp, "node", "agent-node"), annotations.ANN_POWER_CAPS_APPLIED) == {0: 300}
    assert _status(api.annotate_node, "agent-other", acked) == 422  # another node
    # Which pods hold which GPU (issue 19): its own node only, like the acknowledgement.
    held = {annotations.ANN_GPU_PODS: annotations.gpu_pods_value({1: ["team/other-sched"]})}
    api.annotate_node("agent-node", held)
    assert annotations.gpu_pods(_get(cp, "node", "agent-node")) == {1: {"team/other-sched"}}
    assert _status(api.annotate_node, "agent-other", held) == 422
    assert _status(api.core.patch_node, "agent-node", {"metadata": {"labels": {"x": "y"}}}) == 422
    assert _status(api.annotate_node, "agent-node", {annotations.ANN_CORDONED: ""}) == 422
    assert _status(api.core.patch_node, "agent-node", {"spec": {"unschedulable": True}}) == 422
    # A token without a node claim (not bound to a pod on a node) writes nothing.
    unbound = _api(cp.serviceaccount_kubeconfig(NS, "gpuaware-agent", create=False))
    assert _status(unbound.annotate_node, "agent-node", acked) == 422


def test_the_opt_in_pod_uids_component_lets_the_agent_follow_its_nodes_pods(cp, tmp_path):
    """agent.pod_uids (deploy/components/agent-pod-uids): the base RBAC does not let the agent list
    pods; the component's ClusterRole does, with the informer's spec.nodeName selector, and the agent's
    informer fills the UIDs. The grant is removed again, so the exact-permissions table above holds."""
    from gpuaware.agent.pod_uids import PodUids
    from gpuaware.agent.podresources import PodResourcesWatcher

    _node(cp, "uid-node")
    _pod_on(cp, "uid-pod", "uid-node", "gpuaware-agent")
    uid = _get(cp, "pod", "uid-pod", "-n", NS)["metadata"]["uid"]
    api = _api(cp.serviceaccount_kubeconfig(NS, "gpuaware-agent", create=False))
    selector = "spec.nodeName=uid-node"

    def status() -> int:
        return _status(api.core.list_pod_for_all_namespaces, field_selector=selector)

    def until(cond: Any, what: str) -> None:
        deadline = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)  # polling interval of a condition with a deadline

    assert status() == 403
    rendered = cp.kubectl("kustomize", str(overlay_with(tmp_path / "mine", "agent-pod-uids"))).stdout
    grant = [d for d in yaml.safe_load_all(rendered) if d and d["metadata"]["name"] == "gpuaware-agent-read-pods"]
    assert sorted(d["kind"] for d in grant) == ["ClusterRole", "ClusterRoleBinding"]
    cp.apply(yaml.safe_dump_all(grant))
    try:
        until(lambda: status() == 200, "the component's ClusterRole did not let the agent list pods")
        watcher = PodResourcesWatcher(socket_path="/nonexistent")
        uids = PodUids(watcher).start(api, "uid-node")
        try:
            until(lambda: watcher.uids == {(NS, "uid-pod"): uid}, f"uids: {watcher.uids}")
        finally:
            uids.stop()
    finally:
        cp.kubectl("delete", "clusterrolebinding,clusterrole", "gpuaware-agent-read-pods")
    until(lambda: status() == 403, "the agent still lists pods without the component")


def _bound_token(cp: KubeControlPlane, account: str, pod: str, audience: str = TOKEN_AUDIENCE) -> str:
    """What the kubelet mounts in a pod: a token bound to the pod (and so its node); audience "" for the
    apiserver's own (the agent's API token), else the stream's."""
    return cp.kubectl("create", "token", account, "-n", NS, *(["--audience", audience] if audience else []),
                      "--bound-object-kind", "Pod", "--bound-object-name", pod).stdout.strip()


def _token_kubeconfig(cp: KubeControlPlane, token: str) -> Path:
    """A kubeconfig that authenticates with ``token`` (the admin kubeconfig's cluster, a bearer user)."""
    cfg = yaml.safe_load(cp.kubeconfig.read_text())
    cfg["users"] = [{"name": "bearer", "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = "bearer"
    path = cp.kubeconfig.parent / f"token-{abs(hash(token))}.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _pod_on(cp: KubeControlPlane, name: str, node: str, account: str) -> None:
    cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
              "spec": {"nodeName": node, "serviceAccountName": account,
                       "containers": [{"name": "main", "image": "registry.invalid/agent:1"}]}})


def test_the_stream_accepts_a_record_only_with_a_token_of_an_agent_on_the_node_it_names(cp):
    """Item 8 of issue 17: an agent on node A cannot speak for node B. The stream, as its ServiceAccount,
    asks this apiserver (TokenReview) which node each record's token was issued on."""
    import asyncio

    from gpuaware.stream.identity import IdentityRejected, NodeVerifier, kube_review
    from gpuaware.stream.metrics import StreamStats

    for node in ("ident-a", "ident-b"):
        _node(cp, node)
    _pod_on(cp, "agent-ident-a", "ident-a", "gpuaware-agent")
    _pod_on(cp, "agent-ident-b", "ident-b", "gpuaware-agent")
    _pod_on(cp, "workload-ident-a", "ident-a", "gpuaware-scheduler")  # another ServiceAccount's pod on node A
    token_a = _bound_token(cp, "gpuaware-agent", "agent-ident-a")
    token_b = _bound_token(cp, "gpuaware-agent", "agent-ident-b")
    other_account = _bound_token(cp, "gpuaware-scheduler", "workload-ident-a")
    wrong_audience = _bound_token(cp, "gpuaware-agent", "agent-ident-a", audience="https://kubernetes.default.svc")
    stream_api = _api(cp.serviceaccount_kubeconfig(NS, "gpuaware-stream", create=False))

    def verdicts() -> dict[tuple[str, str], str]:
        verifier = NodeVerifier(kube_review(stream_api), StreamStats())

        async def one(node: str, token: str) -> str:
            try:
                await verifier.check(node, [(NODE_TOKEN_HEADER, token.encode())])
                return "ok"
            except IdentityRejected as exc:
                return str(exc)

        async def main() -> dict[tuple[str, str], str]:
            cases = {("ident-a", "a"): token_a, ("ident-b", "b"): token_b, ("ident-b", "a"): token_a,
                     ("ident-a", "b"): token_b, ("ident-a", "other"): other_account,
                     ("ident-a", "audience"): wrong_audience, ("ident-a", "forged"): token_b[:-4] + "AAAA"}
            return {k: await one(k[0], t) for k, t in cases.items()}

        return asyncio.run(main())

    got = verdicts()
    assert got[("ident-a", "a")] == got[("ident-b", "b")] == "ok"
    assert "issued to a pod on 'ident-a'" in got[("ident-b", "a")]
    assert "issued to a pod on 'ident-b'" in got[("ident-a", "b")]
    assert "gpuaware-scheduler" in got[("ident-a", "other")] and "not an agent" in got[("ident-a", "other")]
    assert "does not accept" in got[("ident-a", "audience")] and "does not accept" in got[("ident-a", "forged")]
    # The token dies with its pod: an agent pod removed from node A leaves no token that still proves A
    # (once the apiserver's own authentication cache, about 10 s, lets go of it).
    cp.kubectl("delete", "pod", "agent-ident-a", "-n", NS, "--grace-period=0", "--force", "--wait=true")
    deadline = time.monotonic() + 60
    while "does not accept" not in verdicts()[("ident-a", "a")]:
        assert time.monotonic() < deadline, "the deleted pod's token is still accepted after 60 s"
        time.sleep(1)  # polling interval of a condition with a deadline


def test_cluster_scoped_policies_lose_the_namespace_kustomize_stamps_on_them(cp):
    """Kustomize's built-in schema predates ValidatingAdmissionPolicy, so it sets metadata.namespace on it;
    the apiserver stores cluster-scoped objects without one."""
    vaps = [d for d in shipped_rbac(cp) if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert len(vaps) == 8
    for doc in vaps:
        stored = _get(cp, doc["kind"].lower(), doc["metadata"]["name"])
        assert "namespace" not in stored["metadata"]
