"""Whether a component has a Kubernetes API to reach, decided without importing the client library."""

from __future__ import annotations

import os


def api_configured(api_server: str | None) -> bool:
    """True when :func:`gpuaware.plumbing.kube.api.connect` has an API to talk to: an explicit URL, the in-cluster
    config (running in a pod), or a kubeconfig named by ``KUBECONFIG`` (an agent run beside a cluster)."""
    return bool(api_server or os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("KUBECONFIG"))
