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

from deploy.crds import CrdsMissing, third_party_crd_files
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
