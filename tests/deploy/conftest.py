"""``cp``: a control plane per module (the RBAC modules' writes and admission policies stay out of the
session's apiserver), with our CRDs and the production overlay's RBAC as they ship. Modules that need
other CRDs or feature gates define their own ``cp``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
from tests.support import REPO, need, shipped_rbac

NS = "gpuaware"


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    with KubeControlPlane(scheduler=False, kwok=False) as plane:
        plane.create_namespace(NS)
        for path in sorted((REPO / "deploy" / "base" / "crds").glob("*.yaml")):
            plane.kubectl("apply", "-f", str(path))
        plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        plane.apply(yaml.safe_dump_all(shipped_rbac(plane)))
        yield plane
