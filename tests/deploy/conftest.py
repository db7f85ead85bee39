"""``cp``: a control plane per module (the RBAC modules' writes and admission policies stay out of the
session's apiserver), with our CRDs and the production overlay's RBAC as they ship. Modules that need
other CRDs or feature gates define their own ``cp``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
from tests.real_kube import prepare
from tests.support import need, shipped_rbac


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    with KubeControlPlane(scheduler=False, kwok=False) as plane:
        prepare(plane, shipped_rbac(plane))
        yield plane
