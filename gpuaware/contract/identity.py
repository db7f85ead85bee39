"""How a record proves which node it comes from (docs/security.md).

Every agent shares one Kafka principal (Kafka cannot tell a consumer who produced a record), so the
proof travels with the record: the agent attaches its pod's projected ServiceAccount token, issued
by the kube-apiserver for ``TOKEN_AUDIENCE`` to a pod bound to its node, in the ``NODE_TOKEN_HEADER``
header. The stream asks the apiserver (TokenReview) which node the token was issued on, the
``NODE_NAME_EXTRA`` of the answer, and dead-letters a record whose ``node`` is another.
"""

from __future__ import annotations

NODE_TOKEN_HEADER = "gpuaware-node-token"
TOKEN_AUDIENCE = "gpuaware-stream"
# The node a bound token's pod runs on, as TokenReview reports it in status.user.extra.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# Where the agent's pod mounts the projected token (deploy/base/agent/daemonset.yaml).
DEFAULT_TOKEN_PATH = "/var/run/secrets/gpuaware/node-token"


def node_token(headers: list[tuple[str, bytes]]) -> str | None:
    """The node token of a record's headers (the last one, if repeated), or None."""
    found = None
    for key, value in headers:
        if key == NODE_TOKEN_HEADER:
            found = value
    if found is None:
        return None
    try:
        return found.decode("ascii") if isinstance(found, bytes | bytearray) else str(found)
    except UnicodeDecodeError:
        return ""
