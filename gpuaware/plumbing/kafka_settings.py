"""Kafka client settings in one place, for aiokafka producers/consumers and the Faust app alike.

Real clusters (Strimzi) need TLS and SASL/SCRAM; the embedded Tansu broker needs a small
compatibility layer (``embedded_broker_compat``), see docs/broker.md:

- Tansu 0.6.0 answers InitProducerId with an error, so the idempotent producer is switched off
  (acks=all stays on);
- ListOffsets(latest) is wrong there, so end offsets are read from a Fetch's high watermark
  (``stream.offsets``).

Both are off for real Kafka.
"""

from __future__ import annotations

import ssl
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]


class KafkaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: str = Field("127.0.0.1:9092", description="comma-separated host:port list")
    client_id: str = "gpuaware"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    compression: Compression = "zstd"
    linger_ms: int = Field(20, ge=0, le=60_000)
    request_timeout_ms: int = Field(30_000, ge=1_000)
    # Tansu holds a JoinGroup for about half the session timeout, so small values start consumer
    # groups faster there; real Kafka rejects values under group.min.session.timeout.ms (6 s).
    session_timeout_ms: int = Field(10_000, ge=1_000, le=300_000)
    # aiokafka has one fetch in flight per broker, for the partitions with nothing left to take: records arriving
    # for the others wait while the broker holds it, up to this long. The embedded broker also holds a fetch for
    # part of the wait when its own partitions get records (a record reached a consumer up to 0.70 s late at
    # Faust's 1500 ms, 0.23 s at aiokafka's 500, 0.05 s at 100). Shorter: an idle consumer's fetches come oftener.
    fetch_max_wait_ms: int = Field(100, ge=1, le=1_500, description="how long the broker may hold a consumer's "
                                   "fetch waiting for records (the stream workers' and the scheduler's feed among "
                                   "them; the agents' idle control consumer asks 500)")
    embedded_broker_compat: bool = Field(
        False, description="work around the embedded Tansu broker's defects; off for real Kafka"
    )

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        servers = [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]
        if not servers:
            raise ValueError("bootstrap_servers: at least one host:port is required")
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"bootstrap_servers: {server!r} is not host:port")
        uses_sasl = self.security_protocol.startswith("SASL")
        if uses_sasl:
            if self.sasl_mechanism is None:
                raise ValueError(f"sasl_mechanism: required with security_protocol={self.security_protocol}")
            if not self.sasl_username or self.sasl_password is None:
                raise ValueError("sasl_username/sasl_password: both are required with SASL")
        elif self.sasl_mechanism or self.sasl_username:
            raise ValueError(
                f"sasl_mechanism: SASL settings given but security_protocol={self.security_protocol} does not use SASL"
            )
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("ssl_certfile/ssl_keyfile: give both for mutual TLS, or neither")
        if self.fetch_max_wait_ms >= self.request_timeout_ms:
            raise ValueError(f"fetch_max_wait_ms: {self.fetch_max_wait_ms} must be below request_timeout_ms "
                             f"({self.request_timeout_ms}), or every fetch the broker holds times out")
        return self

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.uses_tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ssl_cafile)
        ctx.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return ctx

    # ----------------------------------------------------------------- aiokafka

    def common_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
        }
        if self.uses_tls:
            kw["ssl_context"] = self.ssl_context()
        if self.security_protocol.startswith("SASL"):
            kw["sasl_mechanism"] = self.sasl_mechanism
            kw["sasl_plain_username"] = self.sasl_username
            kw["sasl_plain_password"] = self.sasl_password.get_secret_value() if self.sasl_password else None
        return kw

    def producer_kwargs(self) -> dict[str, Any]:
        return {
            **self.common_kwargs(),
            "acks": "all",
            "enable_idempotence": not self.embedded_broker_compat,
            "compression_type": None if self.compression == "none" else self.compression,
            "linger_ms": self.linger_ms,
        }

    def consumer_kwargs(self, group_id: str | None, *, from_beginning: bool = True,
                        fetch_max_wait_ms: int | None = None) -> dict[str, Any]:
        """``fetch_max_wait_ms``: this consumer's own wait instead of the setting's."""
        return {
            **self.common_kwargs(),
            "group_id": group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest" if from_beginning else "latest",
            "isolation_level": "read_uncommitted",
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": max(100, self.session_timeout_ms // 3),
            "fetch_max_wait_ms": self.fetch_max_wait_ms if fetch_max_wait_ms is None else fetch_max_wait_ms,
        }

    def admin_kwargs(self) -> dict[str, Any]:
        kw = self.common_kwargs()
        kw.pop("request_timeout_ms")
        return kw

    # ----------------------------------------------------------------- Faust

    def faust_settings(self) -> dict[str, Any]:
        """Keyword arguments for ``faust.App(...)`` (Faust is imported only here, lazily)."""
        import faust

        credentials: Any = None
        ctx = self.ssl_context()
        if self.security_protocol.startswith("SASL"):
            credentials = faust.SASLCredentials(
                username=self.sasl_username,
                password=self.sasl_password.get_secret_value() if self.sasl_password else None,
                ssl_context=ctx,
                mechanism=self.sasl_mechanism,
            )
        elif ctx is not None:
            credentials = faust.SSLCredentials(ctx)
        servers = ";".join(f"kafka://{s.strip()}" for s in self.bootstrap_servers.split(",") if s.strip())
        return {
            "broker": servers,
            "broker_credentials": credentials,
            "broker_client_id": self.client_id,
            "producer_acks": -1,
            "producer_compression_type": None if self.compression == "none" else self.compression,
            "producer_linger": self.linger_ms / 1000,
            # A stream worker's take puts ~200 GPU states into each partition at 50,000 GPUs
            # (gpuaware.stream.publisher):
            # in Faust's 16 KiB batches each partition waited for ~6 produce round trips in turn. Well below the
            # broker's 1 MiB per batch (message.max.bytes), compressed or not.
            "producer_max_batch_size": 256 * 1024,
            "producer_request_timeout": self.request_timeout_ms / 1000,
            # Faust's defaults (60 s) make a group join take ~30 s on Tansu; use ours.
            "broker_session_timeout": self.session_timeout_ms / 1000,
            "broker_heartbeat_interval": max(0.1, self.session_timeout_ms / 3000),
            "broker_rebalance_timeout": self.session_timeout_ms / 1000,
        }
