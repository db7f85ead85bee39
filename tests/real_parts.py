"""Which real parts this test session runs against: one header line, and under ``CI=true`` a missing
part ends the run before any test (a suite that silently skips its real-systems tests proves nothing).

The parts are built by ``realparts/build-all.sh`` (Kafka and Strimzi's CRDs from Maven Central;
Kubernetes, etcd, kwok and the Prometheus Operator's CRDs from the Go module proxy) and by Debian's
``prometheus`` package (``promtool``, ``prometheus``).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gpuaware.deploy import crds
from gpuaware.local import apache_kafka, kube_control_plane, realparts


def _first_line(*argv: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else ""


def _word_after(line: str, marker: str) -> str:
    words = line.replace(",", " ").split()
    return words[words.index(marker) + 1] if marker in words else (words[-1] if words else "")


def survey() -> tuple[dict[str, str], dict[str, str]]:
    """(part -> version, part -> why it is missing)."""
    found: dict[str, str] = {}
    missing: dict[str, str] = {}
    reason = apache_kafka.available()
    if reason:
        missing["kafka"] = reason
    else:
        found["kafka"] = f"apache-{apache_kafka.pinned_version()}"
    try:
        bins = kube_control_plane.find_binaries()
    except kube_control_plane.BinariesMissing as exc:
        for part in ("kube-apiserver", "kube-scheduler", "etcd", "kwok", "kubectl"):
            missing[part] = str(exc)
    else:
        found["kube-apiserver"] = _word_after(_first_line(str(bins["kube-apiserver"]), "--version"), "Kubernetes")
        found["kube-scheduler"] = _word_after(_first_line(str(bins["kube-scheduler"]), "--version"), "Kubernetes")
        found["etcd"] = _word_after(_first_line(str(bins["etcd"]), "--version"), "Version:")
        found["kwok"] = realparts.pinned_versions().get("KWOK_VERSION", "?")
        found["kubectl"] = found["kube-apiserver"]
    try:
        crds.third_party_crd_files()
    except crds.CrdsMissing as exc:
        missing["crds"] = str(exc)
    else:
        pins = realparts.pinned_versions()
        found["strimzi-crds"] = pins.get("STRIMZI_VERSION", "?")
        found["prometheus-operator-crds"] = pins.get("PROMETHEUS_OPERATOR_VERSION", "?")
    for tool in ("promtool", "prometheus"):
        path = shutil.which(tool)
        if path is None:
            missing[tool] = f"{tool} not installed (Debian package prometheus)"
        else:
            found[tool] = _word_after(_first_line(path, "--version"), "version")
    return found, missing


_SURVEY: tuple[dict[str, str], dict[str, str]] | None = None


def _cached_survey() -> tuple[dict[str, str], dict[str, str]]:
    global _SURVEY
    if _SURVEY is None:
        _SURVEY = survey()
    return _SURVEY


def pytest_configure(config: pytest.Config) -> None:
    # The pinned kubectl before Debian's older one: kustomize and server dry-runs need the server's version.
    try:
        bin_dir = kube_control_plane.find_binaries()["kubectl"].parent
    except kube_control_plane.BinariesMissing:
        return
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def pytest_report_header(config: pytest.Config) -> str:
    found, missing = _cached_survey()
    parts = [f"{k}={v}" for k, v in found.items()] + [f"{k}=MISSING" for k in missing]
    return "real parts: " + " ".join(parts)


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI", "").lower() != "true":
        return
    _, missing = _cached_survey()
    if missing:
        lines = "\n".join(f"  {k}: {why}" for k, why in missing.items())
        pytest.exit(f"CI=true and real parts are missing (run realparts/build-all.sh, apt-get install prometheus):\n"
                    f"{lines}", returncode=1)
