"""A real Apache Kafka 4.x for tests and the local stack: one KRaft node, SCRAM and ACLs, on loopback.

The broker runs as it does in production, unlike the embedded Tansu broker: ``kafka.Kafka`` in
combined mode (``process.roles=broker,controller``), clients authenticated with SASL/SCRAM-SHA-512,
every request checked by the ``StandardAuthorizer`` with ``super.users=User:admin`` only. So a
component with the wrong ACLs fails here as it would on the Strimzi cluster.

The jars come from the cache ``realparts/build.sh`` fills through Maven; nothing is downloaded
here. Java 17+ must be on PATH (or in ``JAVA_HOME``).

    with ApacheKafka() as kafka:
        probe = kafka.create_user("probe", "probe-secret")
        kafka.apply_acls("User:probe", [{"resource": {"type": "topic", "name": "t1"}, "operations": ["Write"]}])
        settings = kafka.kafka_settings(probe)

Size: one module on purpose (~530 lines): the broker's properties, its storage formatting with SCRAM
credentials, the process and the admin tools (users, ACLs) are one launcher's steps, each depending on
the listener and credential layout the others set up.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import ipaddress
import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gpuaware.local.processes import ChildProcess, free_port, port_in_use, tail, wait_port_closed
from gpuaware.local.realparts import VERSIONS_ENV, cache_dir, pinned_versions
from gpuaware.plumbing import kafka_admin
from gpuaware.plumbing.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 4096
# Bounded heap for the broker: enough for tests and the local stack, and a hard limit on one
# machine shared with everything else. The short-lived admin tools get less.
BROKER_JVM = ("-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true")
# The client JIT only: on 2 shared cores it halved the broker's start (19 s -> 9-11 s, load ~9),
# since C2's compiler threads compete with startup; peak throughput is lower, so benchmarks pass
# full_jit=True.
C1_ONLY = "-XX:TieredStopAtLevel=1"
TOOL_JVM = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")
# Printable ASCII without spaces: the password goes through a Java properties file (backslashes
# escaped) and aiokafka's SCRAM, where other characters would need more care than tests warrant.
_PASSWORD = re.compile(r"[!-~]{1,256}")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


class ApacheKafkaError(RuntimeError):
    """Apache Kafka could not be found, started or administered; the message says why and what to do."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)


# ----------------------------------------------------------------------------- locating the parts


def pinned_version(key: str = "KAFKA_VERSION") -> str:
    """A pin from realparts/versions.env, or ApacheKafkaError naming the file."""
    version = pinned_versions().get(key)
    if not version:
        raise ApacheKafkaError(f"{key} is not pinned in {VERSIONS_ENV}; run from a source checkout")
    return version


def kafka_libs(version: str | None = None) -> Path:
    """The directory of the broker's jars; a clear error naming realparts/build.sh when absent."""
    version = version or pinned_version()
    home = cache_dir() / f"kafka-{version}"
    libs = home / "libs"
    stamp = home / "VERSION"
    if not stamp.is_file() or stamp.read_text().strip() != version or not any(libs.glob("kafka_*.jar")):
        raise ApacheKafkaError(
            f"Apache Kafka {version} is not in the cache ({home}): run realparts/build.sh once "
            f"(it fetches the pinned jars with Maven; set GPUAWARE_REALPARTS_CACHE to use another cache)"
        )
    return libs


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise ApacheKafkaError("java not found: Apache Kafka 4.x needs Java 17+ (Debian: openjdk-17-jre-headless)")
    return java


def available() -> str | None:
    """None when an Apache Kafka can be started here, else the reason it cannot."""
    try:
        kafka_libs()
        java_binary()
    except ApacheKafkaError as exc:
        return str(exc)
    return None


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion whether or not this thread already has a running loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _cluster_id() -> str:
    # Kafka's Uuid.toString: URL-safe base64 without padding; it never hands out one starting
    # with "-" (it would read as a command-line flag), so neither do we.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _jaas_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _write_private(path: Path, text: str) -> None:
    """Files holding passwords: readable by this user only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<!-- The broker's log in files of its data dir; authorizer decisions apart, as Kafka's own config does. -->
<Configuration status="warn">
  <Appenders>
    <File name="server" fileName="{logs}/server.log">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
    <File name="authorizer" fileName="{logs}/kafka-authorizer.log">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="server"/></Root>
    <Logger name="kafka.authorizer.logger" level="INFO" additivity="false"><AppenderRef ref="authorizer"/></Logger>
    <Logger name="org.apache.kafka.controller" level="INFO"/>
    <Logger name="kafka.log.LogCleaner" level="INFO"/>
  </Loggers>
</Configuration>
"""

_TOOLS_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders><Console name="stderr" target="SYSTEM_ERR"><PatternLayout pattern="%p %m%n"/></Console></Appenders>
  <Loggers><Root level="WARN"><AppenderRef ref="stderr"/></Root></Loggers>
</Configuration>
"""


# ----------------------------------------------------------------------------- the broker


class ApacheKafka:
    """Start with ``start()`` (or ``with ApacheKafka() as kafka:``); ``bootstrap`` is host:port.

    ``data_dir`` None: a temporary directory, removed by ``stop()``. A given ``data_dir`` is kept
    and reused by the next start (formatted once; the admin password is kept in it, mode 0600).
    ``config`` adds or overrides server.properties entries; ``full_jit`` trades a slower start
    for peak throughput (benchmarks).
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        controller_port: int = 0,
        version: str | None = None,
        ready_timeout_s: float = 120.0,
        config: Mapping[str, str] | None = None,
        full_jit: bool = False,
    ):
        if not ipaddress.ip_address(host).is_loopback:
            raise ApacheKafkaError(f"host {host!r}: only loopback addresses are allowed")
        self.host = host
        self.kafka_version = version or pinned_version()
        self.ready_timeout_s = ready_timeout_s
        self.extra_config = dict(config or {})
        self.full_jit = full_jit
        self._want_port, self._want_controller_port = port, controller_port
        self.port = 0
        self.controller_port = 0
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self.child: ChildProcess | None = None
        self.startup_s: float | None = None  # process start to first authenticated Metadata answer
        self._admin: Credentials | None = None

    # ------------------------------------------------------------------ what callers read

    @property
    def version(self) -> str:
        return f"apache-{self.kafka_version}"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise ApacheKafkaError("not started")
        return self._data_dir

    @property
    def admin_credentials(self) -> Credentials:
        if self._admin is None:
            raise ApacheKafkaError("not started")
        return self._admin

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "server.log"

    def kafka_settings(self, credentials: Credentials | None = None, **overrides: Any) -> KafkaSettings:
        """Client settings for this broker, as ``credentials`` (the admin by default)."""
        who = credentials or self.admin_credentials
        return KafkaSettings(**{
            "bootstrap_servers": self.bootstrap,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": MECHANISM,
            "sasl_username": who.username,
            "sasl_password": who.password,
            **overrides,
        })

    def running(self) -> bool:
        return self.child is not None and self.child.running()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ApacheKafka:
        libs = kafka_libs(self.kafka_version)
        java = java_binary()
        if self._data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="gpuaware-kafka-")
            self._data_dir = Path(self._tmp.name)
        data = self.data_dir
        (data / "logs").mkdir(parents=True, exist_ok=True)
        self.port = self._want_port or free_port(self.host)
        self.controller_port = self._want_controller_port or free_port(self.host)
        for p in (self.port, self.controller_port):
            if port_in_use(self.host, p):
                raise ApacheKafkaError(f"port {p} on {self.host} is already in use; pass 0 to pick a free one")
        self._admin = self._admin_password(data)
        (data / "log4j2.xml").write_text(_LOG4J2.format(logs=data / "logs"))
        (data / "tools-log4j2.xml").write_text(_TOOLS_LOG4J2)
        _write_private(data / "server.properties", self._server_properties(data))
        _write_private(data / "admin-client.properties", self._client_properties(self._admin))
        try:
            if not (data / "kraft" / "meta.properties").exists():
                self._format(data)
            jit = () if self.full_jit else (C1_ONLY,)
            argv = [java, *BROKER_JVM, *jit, f"-Dlog4j2.configurationFile={data / 'log4j2.xml'}",
                    f"-Dkafka.logs.dir={data / 'logs'}", "-cp", f"{libs}/*", "kafka.Kafka",
                    str(data / "server.properties")]
            # ChildProcess: PR_SET_PDEATHSIG from a long-lived spawner thread, so the JVM dies with us
            # even if we are SIGKILLed; stdout/stderr (JVM errors before log4j starts) go to a file.
            self.child = ChildProcess("kafka", argv, data / "logs" / "stdout.log")
            started = time.monotonic()
            self.child.start()
            self._wait_ready()
            self.startup_s = time.monotonic() - started
        except BaseException:
            self.stop()
            raise
        log.info("apache kafka ready", extra={"bootstrap": self.bootstrap, "pid": self.pid,
                                               "version": self.version, "startup_s": round(self.startup_s, 2)})
        return self

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after ``grace_s``; no process is left behind."""
        if self.child is not None:
            self.child.stop(grace_s=grace_s)
            wait_port_closed(self.host, self.port, 10)
            self.child = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._data_dir = None

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ administration

    def create_user(self, name: str, password: str, timeout_s: float = 30.0) -> Credentials:
        """Add (or reset) a SCRAM-SHA-512 user; returns once the user can log in.

        aiokafka 0.14 has no AlterUserScramCredentials, so Kafka's own ConfigCommand does it, with
        the password in a 0600 file rather than on its command line.
        """
        if not _NAME.fullmatch(name):
            raise ValueError(f"user name {name!r}: use letters, digits, '.', '_' or '-'")
        if not _PASSWORD.fullmatch(password):
            raise ValueError("password: 1-256 printable ASCII characters, no spaces")
        scram_file = self.data_dir / f"scram-{name}.properties"
        # In a file ConfigCommand takes the value without the brackets --add-config wants (with
        # them it answers "Invalid credential property SCRAM_SHA_512=..."); everything after
        # "password=" is the password.
        escaped = password.replace("\\", "\\\\")
        _write_private(scram_file, f"{MECHANISM}=iterations={SCRAM_ITERATIONS},password={escaped}\n")
        try:
            self._tool("kafka.admin.ConfigCommand", "--bootstrap-server", self.bootstrap,
                       "--command-config", str(self.data_dir / "admin-client.properties"),
                       "--alter", "--entity-type", "users", "--entity-name", name,
                       "--add-config-file", str(scram_file))
        finally:
            scram_file.unlink(missing_ok=True)
        credentials = Credentials(name, password)
        # The controller has committed the credential; the broker applies it from the metadata log
        # a moment later. Wait for that, so a client started next does not fail to authenticate.
        try:
            _run_sync(kafka_admin.wait_ready(self.kafka_settings(credentials), timeout_s=timeout_s))
        except TimeoutError as exc:
            raise ApacheKafkaError(f"user {name} cannot log in {timeout_s:.0f}s after it was created: {exc}") from exc
        return credentials

    def apply_acls(self, principal: str, acls: Iterable[Mapping[str, Any]]) -> None:
        """Add ACLs for ``principal`` ("User:probe" or "probe").

        Each entry is in the form of a Strimzi KafkaUser's ``spec.authorization.acls``, so the
        generated deploy/ users can be applied as they are::

            {"resource": {"type": "topic", "name": "t1", "patternType": "literal"},
             "operations": ["Write", "Describe"], "host": "*", "type": "allow"}

        resource.type: topic, group, cluster or transactionalId; patternType: literal (default) or
        prefix. aiokafka 0.14's admin client has no create_acls, so Kafka's AclCommand adds them, one
        run per distinct (resource type, pattern, operations, host, allow/deny).
        """
        if ":" not in principal:
            principal = f"User:{principal}"
        flags = {"topic": "--topic", "group": "--group", "transactionalid": "--transactional-id"}
        patterns = {"literal": "literal", "prefix": "prefixed", "prefixed": "prefixed"}
        batches: dict[tuple[str, str, tuple[str, ...], str, str], list[str]] = defaultdict(list)
        for acl in acls:
            resource = acl["resource"]
            kind = str(resource["type"]).lower()
            ops = acl.get("operations") or [acl["operation"]]
            pattern = patterns[str(resource.get("patternType", "literal")).lower()]
            permission = str(acl.get("type", "allow")).lower()
            if kind not in (*flags, "cluster") or permission not in ("allow", "deny"):
                raise ValueError(f"unsupported ACL {dict(acl)!r}")
            key = (kind, pattern, tuple(sorted(ops)), str(acl.get("host", "*")), permission)
            batches[key].append("kafka-cluster" if kind == "cluster" else str(resource["name"]))
        for (kind, pattern, ops, host, permission), names in batches.items():
            args = ["--bootstrap-server", self.bootstrap,
                    "--command-config", str(self.data_dir / "admin-client.properties"),
                    "--add", "--force", f"--{permission}-principal", principal, f"--{permission}-host", host]
            if kind == "cluster":
                args.append("--cluster")
            else:
                args += ["--resource-pattern-type", pattern]
                for name in names:
                    args += [flags[kind], name]
            for op in ops:
                args += ["--operation", op]
            self._tool("org.apache.kafka.tools.AclCommand", *args)

    # ------------------------------------------------------------------ internals

    def _admin_password(self, data: Path) -> Credentials:
        """The admin's password: new for a new data dir, the stored one when the dir is reused."""
        stored = data / "admin-password"
        if not stored.exists():
            _write_private(stored, secrets.token_urlsafe(24))
        return Credentials(ADMIN, stored.read_text().strip())

    def _server_properties(self, data: Path) -> str:
        admin_pw = _jaas_string(self.admin_credentials.password)
        props = {
            # One node that is both the KRaft controller and the broker. A static voter set
            # (rather than 4.x's dynamic quorum) keeps no endpoint in the metadata log, so a
            # reused data dir may come back on other ports.
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"CLIENT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"CLIENT://{self.host}:{self.port}",
            "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
            "inter.broker.listener.name": "CLIENT",
            "controller.listener.names": "CONTROLLER",
            # Clients and the broker's own inter-broker client: SCRAM-SHA-512. SCRAM credentials
            # live in the metadata log, which the controller listener must serve before anything
            # is readable, so KRaft cannot use SCRAM there (KAFKA-15513): the broker reaches its
            # controller with SASL/PLAIN as the same admin principal, the password in this
            # (0600) file. Without it the broker would be User:ANONYMOUS, and the authorizer would
            # refuse its registration unless ANONYMOUS were a super user.
            "sasl.enabled.mechanisms": MECHANISM,
            "listener.name.client.sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "listener.name.client.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{ADMIN}" password="{admin_pw}";',
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config":
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{ADMIN}" password="{admin_pw}" user_{ADMIN}="{admin_pw}";',
            # Authorization as on the Strimzi cluster: nothing without an ACL, admin alone is super.
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{ADMIN}",
            "allow.everyone.if.no.acl.found": "false",
            "auto.create.topics.enable": "false",
            "log.dirs": str(data / "kraft"),
            # A single replica of everything, internal topics included.
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Compaction that tests can watch: the cleaner looks for work every 200 ms (15 s by
            # default); a small dedupe buffer fits the bounded heap (128 MiB by default).
            "log.cleaner.enable": "true",
            "log.cleaner.backoff.ms": "200",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "log.segment.delete.delay.ms": "1000",
            **self.extra_config,
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    @staticmethod
    def _client_properties(who: Credentials) -> str:
        return (
            "security.protocol=SASL_PLAINTEXT\n"
            f"sasl.mechanism={MECHANISM}\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{who.username}" password="{_jaas_string(who.password)}";\n'
        )

    def _format(self, data: Path) -> None:
        """Format the log dir, with the admin's SCRAM credential in the first metadata records.

        The credential is passed salted (not the password), so no command line shows it.
        """
        salt = secrets.token_bytes(16)
        salted = hashlib.pbkdf2_hmac("sha512", self.admin_credentials.password.encode(), salt, SCRAM_ITERATIONS)
        scram = (f"{MECHANISM}=[name={ADMIN},iterations={SCRAM_ITERATIONS},"
                 f'salt="{base64.b64encode(salt).decode()}",saltedpassword="{base64.b64encode(salted).decode()}"]')
        self._tool("kafka.tools.StorageTool", "format", "--config", str(data / "server.properties"),
                   "--cluster-id", _cluster_id(), "--add-scram", scram)

    def _tool(self, main_class: str, *args: str, timeout_s: float = 120.0) -> str:
        """Run one of Kafka's command-line tools (a short JVM on the same classpath)."""
        argv = [java_binary(), *TOOL_JVM, f"-Dlog4j2.configurationFile={self.data_dir / 'tools-log4j2.xml'}",
                "-cp", f"{kafka_libs(self.kafka_version)}/*", main_class, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise ApacheKafkaError(f"{main_class} did not finish within {timeout_s:.0f}s") from exc
        if done.returncode != 0:
            raise ApacheKafkaError(f"{main_class} {args[:1]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout

    def _wait_ready(self) -> None:
        assert self.child is not None
        deadline = time.monotonic() + self.ready_timeout_s
        settings = self.kafka_settings()
        # Poll the process and an authenticated Metadata answer together, so a crash is reported at once.
        while time.monotonic() < deadline:
            if not self.child.running():
                raise ApacheKafkaError(
                    f"kafka exited with code {self.child.proc.returncode if self.child.proc else '?'} at start:\n"
                    f"{self.child.log_tail()}\n{self._server_log_tail()}"
                )
            if not port_in_use(self.host, self.port):
                time.sleep(0.1)  # not listening yet
                continue
            try:
                _run_sync(kafka_admin.wait_ready(settings, timeout_s=2.0))
                return
            except TimeoutError:
                continue
        raise ApacheKafkaError(
            f"kafka on {self.bootstrap} gave no authenticated Metadata answer within {self.ready_timeout_s:.0f}s:\n"
            f"{self._server_log_tail()}"
        )

    def _server_log_tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)
