"""Who may call the extender: TLS, kube-scheduler's client certificate (mTLS), a bearer token.

kube-scheduler's ``extenders[].tlsConfig`` (``Extender.TLSConfig``: ``certFile``/``keyFile``/``caFile``
or their ``*Data`` forms, ``serverName``, ``insecure``) can present a client certificate and verify
ours; it has no bearer token. So kube-scheduler authenticates with mTLS: with
``extender_client_ca_file`` set, a client certificate is verified against that CA during the
handshake (one that does not verify fails it), and a verb is answered only to a caller that
presented one. Other callers (a debugging tool, another scheduler) may instead send
``Authorization: Bearer <token>`` when ``extender_token_file`` is set; the token is compared in
constant time. ``/healthz`` and ``/readyz`` need neither: the kubelet's probes present nothing.
With neither configured the verbs are open (the local stack, tests).
"""

from __future__ import annotations

import hmac
import ssl
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gpuaware.scheduler.settings import SchedulerSettings


def server_context(settings: SchedulerSettings) -> ssl.SSLContext | None:
    """The extender's TLS server context, or None for plain HTTP (no certificate configured)."""
    if not settings.extender_tls_cert_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(settings.extender_tls_cert_file, settings.extender_tls_key_file)
    if settings.extender_client_ca_file:
        ctx.load_verify_locations(cafile=settings.extender_client_ca_file)
        # Optional at the handshake, so that probes and token callers connect; required per verb below.
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


@dataclass(frozen=True)
class Access:
    client_certs: bool = False  # a client certificate verified against the client CA admits the caller
    token: bytes | None = None  # so does this bearer token

    @classmethod
    def from_settings(cls, settings: SchedulerSettings) -> Access:
        token = Path(settings.extender_token_file).read_text().strip().encode() if settings.extender_token_file \
            else None
        return cls(bool(settings.extender_client_ca_file), token)

    @property
    def open(self) -> bool:
        return not self.client_certs and self.token is None

    def refusal(self, request: web.Request) -> str | None:
        """Why the caller may not use a verb, or None when it may."""
        if self.open:
            return None
        transport = request.transport
        if self.client_certs and transport is not None:
            sslobj = transport.get_extra_info("ssl_object")
            if sslobj is not None and sslobj.getpeercert():  # non-empty only once verified against the CA
                return None
        header = request.headers.get("Authorization", "")
        if self.token is not None and header[:7].lower() == "bearer ":
            if hmac.compare_digest(header[7:].strip().encode(), self.token):
                return None
            return "bearer token not accepted"
        wanted = [w for w, on in (("a client certificate signed by the extender's client CA", self.client_certs),
                                  ("Authorization: Bearer <token>", self.token is not None)) if on]
        return "authentication required: " + " or ".join(wanted)
