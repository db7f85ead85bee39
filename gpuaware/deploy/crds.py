"""Where the third-party CRDs are: the real Strimzi and Prometheus Operator CustomResourceDefinitions.

``realparts/build-crds.sh`` puts them, at the versions pinned in ``realparts/versions.env``, into the
realparts cache (``$GPUAWARE_REALPARTS_CACHE/crds/``, by default ``~/.cache/gpuaware/realparts``). They
are never committed and never fetched at run time: without the cache, :func:`third_party_crd_files`
raises :class:`CrdsMissing` naming the script.
"""

from __future__ import annotations

from pathlib import Path

from gpuaware.local.realparts import cache_dir, pinned_versions

BUILD_SCRIPT = "realparts/build-crds.sh"


class CrdsMissing(RuntimeError):
    """The pinned third-party CRDs are not in the cache; ``realparts/build-crds.sh`` puts them there."""


def crd_dirs() -> dict[str, Path]:
    """``{"strimzi": dir, "prometheus-operator": dir}`` at the pinned versions (whether present or not)."""
    cache = cache_dir()
    pins = pinned_versions()
    strimzi, promop = pins.get("STRIMZI_VERSION", "unknown"), pins.get("PROMETHEUS_OPERATOR_VERSION", "unknown")
    return {
        "strimzi": cache / "crds" / f"strimzi-{strimzi}",
        "prometheus-operator": cache / "crds" / f"prometheus-operator-{promop}",
    }


def third_party_crd_files() -> list[Path]:
    """Every CRD file of the pinned Strimzi and Prometheus Operator, or :class:`CrdsMissing`.

    A directory counts only when ``build-crds.sh`` finished it (its ``SHA256SUMS`` is written last).
    """
    files: list[Path] = []
    missing: list[str] = []
    for name, where in crd_dirs().items():
        found = sorted(where.glob("*.yaml"))
        if not (where / "SHA256SUMS").is_file() or not found:
            missing.append(f"{name} ({where})")
        files += found
    if missing:
        raise CrdsMissing(f"third-party CRDs not in the cache: {', '.join(missing)}; run `{BUILD_SCRIPT}` "
                          "(fetches the versions pinned in realparts/versions.env)")
    return files
