"""Offline checks of rendered Kubernetes manifests: schemas and gpuaware's deployment policy.

    python -m gpuaware.deploy.checks deploy/overlays/production [...]   # exit 1 on any problem

Three layers, each returning a list of human-readable problems (empty = fine):
- ``schema_problems``: built-in kinds against the Kubernetes OpenAPI schemas (kubernetes-validate,
  strict: unknown fields are errors), custom resources against their CRD's ``openAPIV3Schema``
  (the rendered CRDs, and the real Strimzi and Prometheus Operator CRDs that
  ``realparts/build-crds.sh`` puts in the realparts cache: ``gpuaware.deploy.crds``), closed the way
  ``kubectl --validate=strict`` is;
- ``policy_problems``: requests, limits, probes, non-root, read-only root filesystem, pinned
  images, no privilege, PDBs, topics equal to the topic contract, who may write agent.control.v1.
"""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from gpuaware.contract import topics
from gpuaware.deploy.crds import CrdsMissing, third_party_crd_files

REPO = Path(__file__).resolve().parents[2]
# The oldest Kubernetes minor gpuaware supports and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")

Doc = dict[str, Any]
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
# Where a container may keep a writable root filesystem: none today; add "kind/name/container" with a reason.
WRITABLE_ROOT_ALLOWED: set[str] = set()
# The one container that may run as root, and the capabilities it may add ("kind/name/container"): NVML
# sets power limits only for CAP_SYS_ADMIN, so the agent pod's power capper holds that and nothing else
# (gpuaware/agent/power_capper.py, docs/security.md). Every other container stays non-root with none.
ROOT_ALLOWED: dict[str, frozenset[str]] = {"DaemonSet/gpuaware-agent/power-capper": frozenset({"SYS_ADMIN"})}
CONTROL_WRITERS = {"gpuaware-scheduler", "gpuaware-admin"}


def render(overlay: str | Path) -> list[Doc]:
    """``kubectl kustomize`` an overlay into its objects."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl not found: install Debian's kubectl package (`.ci/run` does)")
    out = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay} failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def ident(doc: Doc) -> str:
    meta = doc.get("metadata") or {}
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{doc.get('kind')} {ns}{meta.get('name')}"


# --------------------------------------------------------------------------- schemas
def _group_version(doc: Doc) -> tuple[str, str]:
    api = str(doc.get("apiVersion", ""))
    group, _, version = api.rpartition("/")
    return group, version


def third_party_crds() -> tuple[list[Doc], str]:
    """The cached third-party CRDs, and why there are none when the cache lacks them ("" otherwise)."""
    try:
        files = third_party_crd_files()
    except CrdsMissing as exc:
        return [], str(exc)
    return list(_parsed_crds(tuple((str(p), p.stat().st_mtime_ns) for p in files))), ""


@functools.lru_cache(maxsize=4)
def _parsed_crds(files: tuple[tuple[str, int], ...]) -> tuple[Doc, ...]:
    # Strimzi's CRDs are megabytes of YAML: parsed once per process (keyed by path and mtime), not per check.
    docs = [d for path, _ in files for d in yaml.safe_load_all(Path(path).read_text())]
    return tuple(d for d in docs if d and d.get("kind") == "CustomResourceDefinition")


def crd_schemas(docs: Iterable[Doc], extra_crds: Iterable[Doc] = ()) -> dict[tuple[str, str, str], Doc]:
    """(group, version, kind) -> openAPIV3Schema of every served version, from the rendered CRDs and ``extra_crds``."""
    found: list[Doc] = [d for d in docs if d.get("kind") == "CustomResourceDefinition"] + list(extra_crds)
    out: dict[tuple[str, str, str], Doc] = {}
    for crd in found:
        spec = crd["spec"]
        for version in spec["versions"]:
            if version.get("served", True):
                out[(spec["group"], version["name"], spec["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return out


def closed(schema: Any) -> Any:
    """An openAPIV3Schema as JSON Schema that rejects unknown fields, like strict field validation.

    Objects with ``properties`` get ``additionalProperties: false`` unless they preserve unknown
    fields or already say what extra properties may be; ``x-kubernetes-int-or-string`` becomes
    an integer-or-string type.
    """
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string"):
        out.setdefault("type", ["integer", "string"])
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _errors(validator: jsonschema.protocols.Validator, doc: Doc) -> Iterator[str]:
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in err.absolute_path) or "<root>"
        yield f"{path}: {err.message}"


def schema_problems(docs: list[Doc], versions: Iterable[str] = KUBERNETES_VERSIONS) -> list[str]:
    extra, why_none = third_party_crds()
    crds = crd_schemas(docs, extra)
    validators: dict[tuple[str, str, str], jsonschema.Draft4Validator] = {}  # compiled only for kinds present
    problems: list[str] = []
    for doc in docs:
        group, version = _group_version(doc)
        key = (group, version, str(doc.get("kind")))
        if key in crds:
            if key not in validators:
                validators[key] = jsonschema.Draft4Validator(closed(crds[key]))
            problems += [f"{ident(doc)}: {e}" for e in _errors(validators[key], doc)]
            continue
        for kube_version in versions:
            try:
                kubernetes_validate.validate(doc, kube_version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{ident(doc)}: no schema for {doc.get('apiVersion')} {doc.get('kind')} "
                                f"(not a Kubernetes {kube_version} kind, and no CRD serves it in the manifests or "
                                f"the cached third-party CRDs{': ' + why_none if why_none else ''})")
                break
            except kubernetes_validate.ValidationError as e:
                where = ".".join(str(p) for p in e.absolute_path) or "<root>"
                problems.append(f"{ident(doc)} (Kubernetes {kube_version}): {where}: {e.message}")
    return problems


# --------------------------------------------------------------------------- policy
def _pod_spec(doc: Doc) -> Doc | None:
    if doc.get("kind") not in WORKLOAD_KINDS:
        return None
    return doc["spec"]["template"].get("spec", {})


def _container_problems(doc: Doc, pod: Doc, container: Doc, init: bool) -> Iterator[str]:
    where = f"{ident(doc)} container {container.get('name')}"
    resources = container.get("resources") or {}
    for kind in ("requests", "limits"):
        for res in ("cpu", "memory"):
            if res not in (resources.get(kind) or {}):
                yield f"{where}: no {res} {kind}"
    if not init:
        for probe in ("livenessProbe", "readinessProbe"):
            if probe not in container:
                yield f"{where}: no {probe}"
    image = str(container.get("image", ""))
    name_part = image.rsplit("/", 1)[-1]
    if "@sha256:" not in image and (":" not in name_part or name_part.endswith(":latest")):
        yield f"{where}: image {image!r} is not pinned to a version tag or digest"
    pod_ctx = pod.get("securityContext") or {}
    ctx = container.get("securityContext") or {}
    key = f"{doc['kind']}/{doc['metadata']['name']}/{container.get('name')}"
    may_add = ROOT_ALLOWED.get(key)
    if may_add is None:
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            yield f"{where}: runAsNonRoot is not true"
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            yield f"{where}: runs as UID 0"
    if ctx.get("privileged"):
        yield f"{where}: privileged"
    if ctx.get("allowPrivilegeEscalation") is not False:
        yield f"{where}: allowPrivilegeEscalation is not false"
    if "ALL" not in ((ctx.get("capabilities") or {}).get("drop") or []):
        yield f"{where}: capabilities do not drop ALL"
    added = set((ctx.get("capabilities") or {}).get("add") or [])
    if added - (may_add or frozenset()):
        yield f"{where}: adds capabilities {sorted(added - (may_add or frozenset()))}"
    if ctx.get("readOnlyRootFilesystem") is not True and key not in WRITABLE_ROOT_ALLOWED:
        yield f"{where}: readOnlyRootFilesystem is not true"


def workload_problems(docs: list[Doc]) -> list[str]:
    problems: list[str] = []
    for doc in docs:
        pod = _pod_spec(doc)
        if pod is None:
            continue
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(field):
                problems.append(f"{ident(doc)}: {field} is on")
        if ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{ident(doc)}: pod seccompProfile is not RuntimeDefault")
        for container in pod.get("containers", []):
            problems += _container_problems(doc, pod, container, init=False)
        for container in pod.get("initContainers", []):
            problems += _container_problems(doc, pod, container, init=True)
    return problems


def _by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d.get("kind") == kind]


def disruption_problems(docs: list[Doc]) -> list[str]:
    """Every multi-replica Deployment has a PodDisruptionBudget selecting it, and the stream fits its partitions."""
    problems = []
    pdb_selectors = [d["spec"]["selector"].get("matchLabels", {}) for d in _by_kind(docs, "PodDisruptionBudget")]
    for dep in _by_kind(docs, "Deployment"):
        labels = dep["spec"]["template"]["metadata"].get("labels", {})
        if dep["spec"].get("replicas", 1) > 1 and not any(
                sel and all(labels.get(k) == v for k, v in sel.items()) for sel in pdb_selectors):
            problems.append(f"{ident(dep)}: {dep['spec']['replicas']} replicas and no PodDisruptionBudget")
        if dep["metadata"]["name"] == "gpuaware-stream":
            partitions = topics.spec(topics.TELEMETRY).partitions
            if dep["spec"].get("replicas", 1) > partitions:
                problems.append(f"{ident(dep)}: {dep['spec']['replicas']} replicas > {partitions} partitions "
                                f"of {topics.TELEMETRY}: the extra workers would idle")
    return problems


def topic_problems(docs: list[Doc]) -> list[str]:
    """KafkaTopics, when present, equal the topic contract (names, partitions, cleanup policy, retention)."""
    kafka_topics = _by_kind(docs, "KafkaTopic")
    if not kafka_topics:
        return []
    problems = []
    rendered = {t["spec"].get("topicName", t["metadata"]["name"]): t["spec"] for t in kafka_topics}
    contract = {t.name: t for t in topics.ALL_TOPICS}
    if set(rendered) != set(contract):
        problems.append("KafkaTopics differ from gpuaware.contract.topics: "
                        f"missing {sorted(set(contract) - set(rendered))}, "
                        f"extra {sorted(set(rendered) - set(contract))}")
    for name in set(rendered) & set(contract):
        spec, want = rendered[name], contract[name]
        if spec.get("partitions") != want.partitions:
            problems.append(f"KafkaTopic {name}: {spec.get('partitions')} partitions, contract says {want.partitions}")
        config = {k: str(v) for k, v in (spec.get("config") or {}).items()}
        for key, value in want.configs().items():
            if config.get(key) != value:
                problems.append(f"KafkaTopic {name}: {key}={config.get(key)}, contract says {value}")
    return problems


def control_writers(docs: list[Doc]) -> set[str]:
    """KafkaUsers allowed to write agent.control.v1 (a literal grant, a matching prefix or '*')."""
    writers = set()
    for user in _by_kind(docs, "KafkaUser"):
        for acl in ((user["spec"].get("authorization") or {}).get("acls") or []):
            res = acl["resource"]
            if res["type"] != "topic" or acl.get("type", "allow") != "allow":
                continue
            ops = set(acl.get("operations") or [acl.get("operation")])
            name, pattern = res.get("name", ""), res.get("patternType", "literal")
            matches = (name == "*" or (pattern == "literal" and name == topics.CONTROL)
                       or (pattern == "prefix" and topics.CONTROL.startswith(name)))
            if matches and ops & {"Write", "All"}:
                writers.add(user["metadata"]["name"])
    return writers


def access_problems(docs: list[Doc]) -> list[str]:
    problems = []
    if _by_kind(docs, "KafkaUser"):
        extra = control_writers(docs) - CONTROL_WRITERS
        if extra:
            problems.append(f"only {sorted(CONTROL_WRITERS)} may write {topics.CONTROL}; also allowed: {sorted(extra)}")
    metrics_policies = [p for p in _by_kind(docs, "NetworkPolicy")
                        if any(port.get("port") == 9400 for rule in p["spec"].get("ingress", [])
                               for port in rule.get("ports", []))]
    for policy in metrics_policies:
        for rule in policy["spec"].get("ingress", []):
            sources = rule.get("from") or []
            if not sources or any("namespaceSelector" not in s for s in sources):
                problems.append(f"{ident(policy)}: metrics port open beyond the monitoring namespace")
    if not any(p["spec"].get("podSelector") == {} and not p["spec"].get("ingress")
               for p in _by_kind(docs, "NetworkPolicy")):
        problems.append("no default-deny ingress NetworkPolicy")
    return problems


def policy_problems(docs: list[Doc]) -> list[str]:
    return workload_problems(docs) + disruption_problems(docs) + topic_problems(docs) + access_problems(docs)


def check(overlay: str | Path) -> list[str]:
    docs = render(overlay)
    return schema_problems(docs) + policy_problems(docs)


def with_change(docs: list[Doc], kind: str, name: str, change: Any) -> list[Doc]:
    """A deep copy of ``docs`` with ``change(doc)`` applied to one object (for tests and what-ifs)."""
    out = copy.deepcopy(docs)
    for doc in out:
        if doc.get("kind") == kind and doc["metadata"]["name"] == name:
            change(doc)
            return out
    raise KeyError(f"no {kind} {name}")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    failed = False
    for overlay in argv:
        problems = check(overlay)
        print(f"{overlay}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
        for p in problems:
            print(f"  {p}")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
