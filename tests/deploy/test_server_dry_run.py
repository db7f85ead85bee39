"""Every overlay is accepted by a real kube-apiserver: ``kubectl apply --dry-run=server -k``.

The control plane is the one ``realparts/build-kube.sh`` builds; the third-party CRDs (Strimzi, the
Prometheus Operator) are the ones ``realparts/build-crds.sh`` puts in the cache, installed as an
operator's chart would, with gpuaware's own CRDs. Server-side dry run goes through the apiserver's
decoding, defaulting, structural-schema and CEL validation and admission, without storing anything.
Skipped when a part is missing, failed under ``CI=true``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuaware.deploy.crds import CrdsMissing, third_party_crd_files
from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
from tests.support import OVERLAYS, REPO, need

NAMESPACE = "gpuaware"


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    crds = need(third_party_crd_files, CrdsMissing)
    with KubeControlPlane(scheduler=False, kwok=False) as plane:
        # Server-side: Strimzi's Kafka CRD (~330 kB) is over the 256 kB last-applied annotation limit.
        for path in [*crds, *sorted((REPO / "deploy" / "base" / "crds").glob("*.yaml"))]:
            plane.kubectl("apply", "--server-side", "-f", str(path))
        plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        plane.create_namespace(NAMESPACE)
        yield plane


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_is_accepted_by_a_real_apiserver(cp, overlay):
    proc = cp.kubectl("apply", "--dry-run=server", "-k", str(REPO / "deploy" / "overlays" / overlay), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "(server dry run)" in proc.stdout


def test_a_v1beta2_strimzi_object_is_refused(cp):
    """The check has teeth: Strimzi 1.x serves kafka.strimzi.io/v1 only."""
    topic = ("apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaTopic\nmetadata: {name: t, namespace: gpuaware}\n"
             "spec: {partitions: 1}\n")
    proc = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=topic, check=False)
    assert proc.returncode != 0
    assert "no matches for kind \"KafkaTopic\" in version \"kafka.strimzi.io/v1beta2\"" in proc.stderr


def _queue(quota: str, borrowing: str = "{enabled: true}") -> str:
    return ("apiVersion: gpuaware.io/v1alpha1\nkind: GPUQueue\nmetadata: {name: q}\n"
            f"spec: {{tenant: t, namespaces: [ns], quota: {quota}, borrowing: {borrowing}}}\n")


def test_a_gpuqueue_with_gpu_memory_caps_per_model_is_accepted(cp):
    proc = cp.kubectl("apply", "--dry-run=server", "-f", "-", check=False, input=_queue(
        "[{model: H100, gpus: 4, memoryGiB: 200}, {model: '*', gpus: 0, memoryGiB: 0}]", "{limitGpus: 2}"))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("quota", "borrowing", "field", "reason"), [
    ("[{model: H100, gpus: 4, memoryGiB: 0}]", "{enabled: true}", "spec.quota[0].memoryGiB",
     "memoryGiB 0 would refuse every pod the quota's gpus grant"),
    ("[{model: H100, gpus: 4, memoryGiB: -1}]", "{enabled: true}", "spec.quota[0].memoryGiB",
     "should be greater than or equal to 0"),
    ("[{model: H100, gpus: 4, memoryGiB: lots}]", "{enabled: true}", "spec.quota[0].memoryGiB",
     "must be of type number"),
    ("[{model: H100, gpus: 4}]", "{enabled: false, limitGpus: 2}", "spec.borrowing.limitGpus",
     "limitGpus bounds borrowing, which enabled: false turns off"),
])
def test_bad_gpuqueue_quotas_are_refused_with_the_field_and_reason(cp, quota, borrowing, field, reason):
    proc = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=_queue(quota, borrowing), check=False)
    assert proc.returncode != 0
    assert field in proc.stderr and reason in proc.stderr, proc.stderr
