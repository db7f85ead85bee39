"""A real, local Kubernetes control plane: etcd, kube-apiserver and optionally kube-scheduler and kwok.

The binaries are the ones ``realparts/build-kube.sh`` builds from the Go module proxy at the versions
pinned in ``realparts/versions.env`` (into ``$GPUAWARE_REALPARTS_CACHE/kube-<version>/bin``, by default
``~/.cache/gpuaware/realparts``). Everything listens on 127.0.0.1 on free ports and lives in one
temporary directory: etcd's data, a self-made CA, the apiserver's serving certificate, client
certificates (``system:masters`` for the admin, ``system:kube-scheduler`` for the scheduler), the
service-account signing key pair and the kubeconfig files. The apiserver runs with
``--authorization-mode=Node,RBAC`` and its default admission plugins; ``resource.k8s.io/v1`` (DRA) is
served by default from Kubernetes 1.34 on.

There is no kube-controller-manager: nothing creates the ``default`` ServiceAccount of a namespace,
which the ServiceAccount admission plugin needs before it admits a Pod, so :meth:`create_namespace`
creates it (``start()`` does it for ``default``); nothing lifts the ``node.kubernetes.io/not-ready``
taint from a new Node, so the admission plugin that sets it (TaintNodesByCondition) is disabled;
nothing garbage-collects, and no ResourceClaim is made from a ResourceClaimTemplate.

kwok manages only Nodes annotated ``kwok.x-k8s.io/node=fake`` (:data:`KWOK_NODE_ANNOTATION`): it keeps
them Ready and runs the Pods bound to them.

    with KubeControlPlane(scheduler=True, kwok=True) as cp:
        cp.kubectl("get", "--raw", "/version")
        sa_kubeconfig = cp.serviceaccount_kubeconfig("default", "tester")

Size: one module on purpose (~550 lines): the PKI, the kubeconfigs and the start of etcd,
kube-apiserver, kube-scheduler and kwok form one launcher whose flags name each other's certificates,
ports and files; split, the pieces would pass that layout back and forth.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuaware.local.processes import ChildProcess, free_port
from gpuaware.local.realparts import cache_dir, pinned_versions

log = logging.getLogger(__name__)
PORT_ATTEMPTS = 3

BUILD_SCRIPT = "realparts/build-kube.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kubectl", "kwok")
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
_APISERVER_SANS = (
    "IP:127.0.0.1",
    "IP:10.96.0.1",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


class KubeControlPlaneError(RuntimeError):
    """A part of the control plane failed to start or to answer."""


class BinariesMissing(KubeControlPlaneError):
    """The pinned binaries are not built; ``realparts/build-kube.sh`` builds them."""


def default_bin_dir() -> Path:
    """``$GPUAWARE_KUBE_BIN_DIR``, else where ``realparts/build-kube.sh`` puts the pinned binaries."""
    explicit = os.environ.get("GPUAWARE_KUBE_BIN_DIR")
    if explicit:
        return Path(explicit)
    version = pinned_versions().get("KUBERNETES_VERSION", "unknown")
    return cache_dir() / f"kube-{version}" / "bin"


def find_binaries(bin_dir: Path | str | None = None) -> dict[str, Path]:
    """Paths of every binary (and of ``kwok-stages``, kwok's default Stages), or :class:`BinariesMissing`
    naming what is not there and how to build it."""
    where = Path(bin_dir) if bin_dir else default_bin_dir()
    found = {name: where / name for name in BINARIES}
    missing = [name for name, path in found.items() if not os.access(path, os.X_OK)]
    found["kwok-stages"] = where.parent / "share" / "kwok-stages.yaml"
    if not found["kwok-stages"].is_file():
        missing.append(str(found["kwok-stages"]))
    if missing:
        raise BinariesMissing(
            f"Kubernetes parts not built: {', '.join(missing)} missing in {where}; "
            f"run `{BUILD_SCRIPT}` (builds the versions pinned in realparts/versions.env), "
            "or point GPUAWARE_KUBE_BIN_DIR at a bin directory that has them"
        )
    return found


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise KubeControlPlaneError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


class _Pki:
    """A CA and the certificates signed by it, made with the openssl CLI (ECDSA P-256)."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        if not shutil.which("openssl"):
            raise KubeControlPlaneError("the openssl command is needed to make the control plane's certificates")
        self.ca_cert = root / "ca.crt"
        self.ca_key = root / "ca.key"
        self._cert(
            "ca", "gpuaware-local-ca", None, ca=True,
        )

    def _cert(self, name: str, cn: str, org: str | None, *, ca: bool = False, server: bool = False,
              sans: Sequence[str] = ()) -> tuple[Path, Path]:
        lines = ["[req]", "distinguished_name = dn", "prompt = no", "x509_extensions = ext", "[dn]", f"CN = {cn}"]
        if org:
            lines.append(f"O = {org}")
        lines += ["[ext]", "subjectKeyIdentifier = hash"]
        if ca:
            lines += ["basicConstraints = critical,CA:TRUE", "keyUsage = critical,keyCertSign,cRLSign,digitalSignature"]
        else:
            lines += [
                "authorityKeyIdentifier = keyid",
                "basicConstraints = critical,CA:FALSE",
                "keyUsage = critical,digitalSignature,keyEncipherment",
                f"extendedKeyUsage = {'serverAuth' if server else 'clientAuth'}",
            ]
            if sans:
                lines.append("subjectAltName = " + ",".join(sans))
        conf = self.root / f"{name}.cnf"
        conf.write_text("\n".join(lines) + "\n")
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        args = ["req", "-x509", "-config", conf.name, "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-noenc", "-keyout", key.name, "-out", cert.name, "-days", "3650" if ca else "365"]
        if not ca:
            args += ["-CA", self.ca_cert.name, "-CAkey", self.ca_key.name]
        _openssl(*args, cwd=self.root)
        return cert, key

    def server(self, name: str, cn: str, sans: Sequence[str]) -> tuple[Path, Path]:
        return self._cert(name, cn, None, server=True, sans=sans)

    def client(self, name: str, user: str, group: str | None = None) -> tuple[Path, Path]:
        return self._cert(name, user, group)

    def service_account_keys(self) -> tuple[Path, Path]:
        key, pub = self.root / "sa.key", self.root / "sa.pub"
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key.name, cwd=self.root)
        _openssl("pkey", "-in", key.name, "-pubout", "-out", pub.name, cwd=self.root)
        return key, pub


def _kubeconfig(path: Path, server: str, ca: Path, user: Mapping[str, str], name: str = "gpuaware-local") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": dict(user)}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


class KubeControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler, + kwok) on loopback; a context manager.

    ``scheduler``: start kube-scheduler; ``scheduler_config``: a KubeSchedulerConfiguration (file path or
    dict) for it — its ``clientConnection.kubeconfig`` is set to the scheduler's credentials and
    leader election is off unless the file says otherwise. ``kwok``: start kwok for annotated Nodes.
    ``feature_gates`` go to the apiserver and the scheduler. ``timings`` holds the seconds each part
    took to become ready.
    """

    def __init__(
        self,
        bin_dir: Path | str | None = None,
        *,
        scheduler: bool = False,
        scheduler_config: Path | str | Mapping[str, Any] | None = None,
        kwok: bool = False,
        feature_gates: Mapping[str, bool] | None = None,
        apiserver_args: Sequence[str] = (),
        workdir: Path | str | None = None,
        keep_workdir: bool = False,
        ready_timeout_s: float = 90.0,
        etcd_no_fsync: bool = True,
    ):
        self.bins = find_binaries(bin_dir)
        self._want_scheduler = scheduler or scheduler_config is not None
        self._scheduler_config = scheduler_config
        self._want_kwok = kwok
        self.feature_gates = dict(feature_gates or {})
        self.apiserver_args = list(apiserver_args)
        self._workdir_arg = Path(workdir) if workdir else None
        self.keep_workdir = keep_workdir or os.environ.get("GPUAWARE_KEEP_KUBE_WORKDIR", "") not in ("", "0")
        self.ready_timeout_s = ready_timeout_s
        self.etcd_no_fsync = etcd_no_fsync
        self.workdir: Path | None = None
        self.port: int | None = None
        self.etcd_port: int | None = None
        self.scheduler_port: int | None = None
        self.kwok_port: int | None = None
        self.timings: dict[str, float] = {}
        self._children: dict[str, ChildProcess] = {}
        self._versions: dict[str, str] | None = None
        self._pki: _Pki | None = None
        self._clients: dict[str, tuple[Path, Path]] = {}  # component -> its client certificate and key
        self._kubeconfig: Path | None = None

    # -- what callers use ---------------------------------------------------------------------------

    @property
    def server(self) -> str:
        if self.port is None:
            raise KubeControlPlaneError("the control plane is not started")
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (client certificate in group ``system:masters``)."""
        if self._kubeconfig is None:
            raise KubeControlPlaneError("the control plane is not started")
        return self._kubeconfig

    @property
    def ca_file(self) -> Path:
        assert self._pki is not None, "not started"
        return self._pki.ca_cert

    @property
    def admin_cert(self) -> tuple[Path, Path]:
        """(certificate, key) of the admin client, for clients that take them directly."""
        assert self.workdir is not None, "not started"
        return self.workdir / "pki" / "admin.crt", self.workdir / "pki" / "admin.key"

    def log_path(self, part: str) -> Path:
        assert self.workdir is not None, "not started"
        return self.workdir / "logs" / f"{part}.log"

    def running(self) -> dict[str, bool]:
        return {name: child.running() for name, child in self._children.items()}

    def pids(self) -> dict[str, int | None]:
        return {name: child.pid for name, child in self._children.items()}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None,
                timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this control plane (admin unless ``kubeconfig`` is given)."""
        argv = [str(self.bins["kubectl"]), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout_s, check=False)
        if check and proc.returncode != 0:
            raise KubeControlPlaneError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def apply(self, manifest: str | Mapping[str, Any], *, server_side: bool = False) -> str:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(dict(manifest))
        extra = ["--server-side"] if server_side else []
        return self.kubectl("apply", *extra, "-f", "-", input=text).stdout

    def create_namespace(self, name: str) -> None:
        """The namespace and its ``default`` ServiceAccount (no controller-manager makes it here)."""
        for kind, extra in (("namespace", ()), ("serviceaccount", ("-n", name))):
            proc = self.kubectl("create", kind, *extra, name if kind == "namespace" else "default", check=False)
            if proc.returncode != 0 and "AlreadyExists" not in proc.stderr:
                raise KubeControlPlaneError(f"creating {kind} for namespace {name}: {proc.stderr.strip()}")

    def serviceaccount_kubeconfig(self, namespace: str, name: str, *, path: Path | str | None = None,
                                  duration_s: int = 3600, create: bool = True) -> Path:
        """A kubeconfig that acts as ServiceAccount ``namespace/name`` with a TokenRequest token."""
        if create:
            proc = self.kubectl("create", "serviceaccount", name, "-n", namespace, check=False)
            if proc.returncode != 0 and "AlreadyExists" not in proc.stderr:
                raise KubeControlPlaneError(f"creating serviceaccount {namespace}/{name}: {proc.stderr.strip()}")
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration_s}s").stdout.strip()
        assert self.workdir is not None
        out = Path(path) if path else self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        return _kubeconfig(out, self.server, self.ca_file, {"token": token}, name=f"{namespace}-{name}")

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (physically, as its periodic compaction does)
        and return that revision: a watch from an older resourceVersion that reaches etcd gets 410 Expired."""
        def post(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
            req = urllib.request.Request(f"http://127.0.0.1:{self.etcd_port}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())

        if self.etcd_port is None:
            raise KubeControlPlaneError("the control plane is not started")
        # etcd's JSON gateway: any range answers with the store's current revision in its header.
        revision = int(post("/v3/kv/range", {"key": "Lw=="})["header"]["revision"])  # base64 of "/"
        post("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def versions(self) -> dict[str, str]:
        """Versions the binaries report, e.g. ``{"kube-apiserver": "v1.36.3", "etcd": "3.6.16", ...}``."""
        if self._versions is None:
            def out(name: str, *args: str) -> str:
                proc = subprocess.run([str(self.bins[name]), *args], capture_output=True, text=True, timeout=30,
                                      check=False)
                return (proc.stdout or proc.stderr).strip()

            def word_after(text: str, marker: str) -> str:
                return text.split(marker, 1)[1].split()[0] if marker in text else text

            kubectl = json.loads(out("kubectl", "version", "--client", "-o", "json"))["clientVersion"]["gitVersion"]
            self._versions = {
                "kube-apiserver": word_after(out("kube-apiserver", "--version"), "Kubernetes "),
                "kube-scheduler": word_after(out("kube-scheduler", "--version"), "Kubernetes "),
                "kubectl": kubectl,
                "etcd": word_after(out("etcd", "--version"), "etcd Version: "),
                "kwok": word_after(out("kwok", "--version"), "version "),
            }
        return dict(self._versions)

    # -- lifecycle ----------------------------------------------------------------------------------

    def __enter__(self) -> KubeControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> KubeControlPlane:
        if self._children:
            raise KubeControlPlaneError("already started")
        t0 = time.monotonic()
        self.workdir = self._workdir_arg or Path(tempfile.mkdtemp(prefix="gpuaware-kube-"))
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self._make_pki()
            self.timings["pki"] = time.monotonic() - t0
            self._start_on_free_ports("etcd", self._start_etcd)
            self._start_on_free_ports("kube-apiserver", self._start_apiserver, self._pick_apiserver_port)
            self.create_namespace("default")
            if self._want_scheduler:
                self.start_scheduler(self._scheduler_config)
            if self._want_kwok:
                self.start_kwok()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop every child (newest first: kwok, scheduler, apiserver, etcd) and remove the work dir."""
        for name in reversed(list(self._children)):
            self._children[name].stop(grace_s=10.0)
        self._children.clear()
        if self.workdir is not None and not self.keep_workdir and self._workdir_arg is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- parts ----------------------------------------------------------------------------------------

    def _make_pki(self) -> None:
        assert self.workdir is not None
        pki = self._pki = _Pki(self.workdir / "pki")
        self._serving = pki.server("apiserver", "kube-apiserver", _APISERVER_SANS)
        admin_cert, admin_key = pki.client("admin", "gpuaware-admin", "system:masters")
        sched_cert, sched_key = pki.client("scheduler", "system:kube-scheduler")
        self._sa_keys = pki.service_account_keys()
        # The aggregation layer's front proxy: its own CA and client, as kubeadm sets it up. Without
        # --requestheader-client-ca-file, components that delegate authentication to the apiserver
        # (kube-scheduler) log "missing content for CA bundle ... requestheader-client-ca-file" forever.
        front = _Pki(self.workdir / "pki" / "front-proxy")
        self._front_proxy = (front.ca_cert, *front.client("client", "front-proxy-client"))
        self._clients = {"admin": (admin_cert, admin_key), "scheduler": (sched_cert, sched_key)}
        self._pick_apiserver_port()

    def _pick_apiserver_port(self) -> None:
        """A port for the apiserver and the kubeconfigs that reach it there."""
        assert self.workdir is not None and self._pki is not None
        self.port = free_port()
        (admin_cert, admin_key), (sched_cert, sched_key) = self._clients["admin"], self._clients["scheduler"]
        self._kubeconfig = _kubeconfig(self.workdir / "admin.kubeconfig", self.server, self._pki.ca_cert,
                                       {"client-certificate": str(admin_cert), "client-key": str(admin_key)})
        self._scheduler_kubeconfig = _kubeconfig(
            self.workdir / "scheduler.kubeconfig", self.server, self._pki.ca_cert,
            {"client-certificate": str(sched_cert), "client-key": str(sched_key)})

    def _start_on_free_ports(self, name: str, start: Callable[[], None],
                             new_ports: Callable[[], None] = lambda: None) -> None:
        """``start()`` ``name``, again on new ports (``new_ports()``) when one it was given was taken meanwhile:
        ``free_port`` only finds a port free at that moment, and on a busy machine another process (or one of
        etcd's own connections) can take it before the child binds it. Seen in a test run as the apiserver
        exiting with "bind: address already in use"."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                start()
                return
            except KubeControlPlaneError:
                child = self._children[name]
                if attempt == PORT_ATTEMPTS or "address already in use" not in child.log_tail(40):
                    raise
                log.warning("%s: a port it was given was taken meanwhile; starting it on new ports", name)
                child.stop(grace_s=2.0)
                del self._children[name]
                new_ports()

    def _spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> ChildProcess:
        child = ChildProcess(name, argv, self.log_path(name), env=env)
        self._children[name] = child
        child.start()
        return child

    def _wait(self, name: str, probe: Any, what: str) -> None:
        """Poll ``probe()`` until it returns True; fail early, with the log's tail, if the child exits."""
        child = self._children[name]
        t0 = time.monotonic()
        deadline = t0 + self.ready_timeout_s
        last = ""
        while time.monotonic() < deadline:
            if not child.running():
                raise KubeControlPlaneError(
                    f"{name} exited ({child.proc.returncode if child.proc else '?'}) before {what}; "
                    f"log {child.log_path}:\n{child.log_tail(25)}")
            try:
                if probe():
                    self.timings[name] = time.monotonic() - t0
                    return
            except (OSError, urllib.error.URLError, ssl.SSLError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise KubeControlPlaneError(
            f"{name} not {what} after {self.ready_timeout_s:.0f}s ({last}); "
            f"log {child.log_path}:\n{child.log_tail(25)}")

    def _start_etcd(self) -> None:
        assert self.workdir is not None
        self.etcd_port, peer = free_port(), free_port()
        client, peer_url = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{peer}"
        argv = [
            str(self.bins["etcd"]),
            "--name=gpuaware",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=gpuaware={peer_url}",
            "--log-level=warn",
        ]
        if self.etcd_no_fsync:
            argv.append("--unsafe-no-fsync")
        self._spawn("etcd", argv)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                return json.loads(resp.read()).get("health") == "true"

        self._wait("etcd", healthy, "healthy")

    def _tls_context(self, *, verify: bool = True) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file)) if verify else ssl._create_unverified_context()
        cert, key = self.admin_cert
        ctx.load_cert_chain(str(cert), str(key))
        return ctx

    def _get_ok(self, url: str, ctx: ssl.SSLContext) -> bool:
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=3) as resp:
                return resp.status == 200
        except urllib.error.HTTPError:
            return False

    def _feature_gates_arg(self) -> list[str]:
        if not self.feature_gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))]

    def _start_apiserver(self) -> None:
        assert self.workdir is not None and self._pki is not None
        cert, key = self._serving
        sa_key, sa_pub = self._sa_keys
        argv = [
            str(self.bins["kube-apiserver"]),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={self._pki.ca_cert}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            f"--requestheader-client-ca-file={self._front_proxy[0]}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self._front_proxy[1]}",
            f"--proxy-client-key-file={self._front_proxy[2]}",
            "--authorization-mode=Node,RBAC",
            # That plugin taints every new Node node.kubernetes.io/not-ready:NoSchedule and the node
            # lifecycle controller of kube-controller-manager lifts the taint once the Node is Ready;
            # there is no controller-manager here, so no Node would ever take a Pod.
            "--disable-admission-plugins=TaintNodesByCondition",
            "--allow-privileged=true",
            "--profiling=false",
            *self._feature_gates_arg(),
            *self.apiserver_args,
        ]
        self._spawn("kube-apiserver", argv)
        ctx = self._tls_context()
        self._wait("kube-apiserver", lambda: self._get_ok(f"{self.server}/readyz", ctx), "ready (/readyz)")

    def start_scheduler(self, config: Path | str | Mapping[str, Any] | None = None) -> None:
        """Start kube-scheduler with ``config`` (a KubeSchedulerConfiguration) or a default one."""
        assert self.workdir is not None
        if isinstance(config, Mapping):
            doc: dict[str, Any] = dict(config)
        elif config is not None:
            doc = yaml.safe_load(Path(config).read_text()) or {}
        else:
            doc = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
        # --kubeconfig is ignored when --config is given: the credentials go into the file.
        doc["clientConnection"] = {**(doc.get("clientConnection") or {}),
                                   "kubeconfig": str(self._scheduler_kubeconfig)}
        doc["leaderElection"] = {"leaderElect": False, **(doc.get("leaderElection") or {})}
        path = self.workdir / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.scheduler_port = free_port()
        argv = [
            str(self.bins["kube-scheduler"]),
            f"--config={path}",
            f"--authentication-kubeconfig={self._scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self._scheduler_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.scheduler_port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
            *self._feature_gates_arg(),
        ]
        self._spawn("kube-scheduler", argv)
        ctx = self._tls_context(verify=False)  # its serving certificate is self-signed
        self._wait("kube-scheduler", lambda: self._get_ok(f"https://127.0.0.1:{self.scheduler_port}/readyz", ctx),
                   "ready (/readyz)")

    def stop_scheduler(self) -> None:
        """Stop kube-scheduler (if running), so that another can be started with a different configuration."""
        child = self._children.pop("kube-scheduler", None)
        if child is not None:
            child.stop(grace_s=10.0)
        self.scheduler_port = None

    def start_kwok(self, extra_args: Sequence[str] = ()) -> None:
        """Start kwok, managing only Nodes annotated ``kwok.x-k8s.io/node=fake``."""
        assert self.workdir is not None
        self.kwok_port = free_port()
        key, value = KWOK_NODE_ANNOTATION
        # kwok on its own has no built-in Stages ("no stages found"): give it kwokctl's defaults, which
        # build-kube.sh takes from the pinned kwok module. HOME is the work dir, so that no
        # ~/.kwok/kwok.yaml of the user's is loaded too (kwok always loads it when it exists).
        argv = [
            str(self.bins["kwok"]),
            f"--config={self.bins['kwok-stages']}",
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--manage-nodes-with-label-selector=",
            "--manage-single-node=",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.0.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{self.kwok_port}",
            *extra_args,
        ]
        self._spawn("kwok", argv, env={"HOME": str(self.workdir)})

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.kwok_port}/healthz", timeout=2) as resp:
                return resp.status == 200

        self._wait("kwok", healthy, "healthy (/healthz)")
