#!/usr/bin/env bash
# Build a minimal OpenTelemetry Collector (realparts/otelcol: the OTLP receiver, the OTLP/HTTP and
# debug exporters) from the Go module proxy at the release pinned in versions.env (OTELCOL_VERSION,
# with OTELCOL_STABLE_VERSION for the 1.x modules). Modules are verified against the committed
# realparts/otelcol/go.sum.
#
#   realparts/build-otelcol.sh            build (or check) into $CACHE/otelcol-<OTELCOL_VERSION>/bin
#   realparts/build-otelcol.sh --bin-dir  only print that bin directory
#   realparts/build-otelcol.sh --force    rebuild even when the checksums match
#
# CACHE is ${GPUAWARE_REALPARTS_CACHE:-$HOME/.cache/gpuaware/realparts}; the Go caches are shared
# with build-kube.sh (go-build/, go-mod/). Idempotent: when the inputs are unchanged and the binary
# matches SHA256SUMS, it does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
: "${OTELCOL_VERSION:?}" "${OTELCOL_STABLE_VERSION:?}"

cache="${GPUAWARE_REALPARTS_CACHE:-$HOME/.cache/gpuaware/realparts}"
dest="$cache/otelcol-${OTELCOL_VERSION}"
bin="$dest/bin"
force=0
case "${1:-}" in
  --bin-dir) echo "$bin"; exit 0 ;;
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--bin-dir|--force]" >&2; exit 2 ;;
esac

mod="$here/otelcol"
# go.mod must name the pinned release; a change of the pin means regenerating it (README).
grep -q "go.opentelemetry.io/collector/otelcol ${OTELCOL_VERSION}\$" "$mod/go.mod" ||
  { echo "build-otelcol.sh: $mod/go.mod does not require otelcol ${OTELCOL_VERSION}" >&2; exit 1; }
grep -q "go.opentelemetry.io/collector/receiver ${OTELCOL_STABLE_VERSION}\$" "$mod/go.mod" ||
  { echo "build-otelcol.sh: $mod/go.mod does not require receiver ${OTELCOL_STABLE_VERSION}" >&2; exit 1; }

if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
command -v go >/dev/null || { echo "build-otelcol.sh: needs Go ($(grep -m1 '^go ' "$mod/go.mod"))" >&2; exit 1; }
export GOTOOLCHAIN=local
need_go="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$mod/go.mod")"
have_go="$(go env GOVERSION)"; have_go="${have_go#go}"
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -1)" != "$need_go" ]; then
  echo "build-otelcol.sh: Go $have_go is older than the $need_go that the collector ${OTELCOL_VERSION} needs" >&2
  exit 1
fi

jobs="${GPUAWARE_REALPARTS_BUILD_JOBS:-$(nproc)}"
export GOCACHE="$cache/go-build" GOMODCACHE="$cache/go-mod"
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false" CGO_ENABLED=0
ldflags="-s -w -X main.version=${OTELCOL_VERSION}"

mkdir -p "$cache"
exec 9>"$cache/.build-otelcol.lock"
if command -v flock >/dev/null; then flock 9; fi  # one build at a time per cache

stamp="$(
  {
    echo "go=$have_go cgo=$CGO_ENABLED flags=$GOFLAGS ldflags=$ldflags"
    cat "$here/versions.env" "$mod/go.mod" "$mod/go.sum" "$mod/main.go" "${BASH_SOURCE[0]}"
  } | sha256sum | cut -d' ' -f1
)"
if [ "$force" = 0 ] && [ -f "$dest/SHA256SUMS" ] && [ "$(cat "$dest/INPUTS" 2>/dev/null)" = "$stamp" ] &&
  (cd "$dest" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1); then
  echo "otelcol up to date in $bin (checksums match)"
  exit 0
fi

rm -f "$dest/SHA256SUMS" "$dest/INPUTS"
mkdir -p "$bin"
t0=$SECONDS
echo "downloading modules into $GOMODCACHE"
(cd "$mod" && go mod download && go mod verify >/dev/null)
t_dl=$((SECONDS - t0))
echo "building otelcol ${OTELCOL_VERSION} (-p $jobs)"
(cd "$mod" && go build -p "$jobs" -ldflags "$ldflags" -o "$bin/otelcol" .)
t_all=$((SECONDS - t0))

got="$("$bin/otelcol" --version)"
[ "$got" = "otelcol-gpuaware version ${OTELCOL_VERSION}" ] || { echo "otelcol --version says '$got'" >&2; exit 1; }
(cd "$dest" && sha256sum bin/otelcol) > "$dest/SHA256SUMS.tmp"
mv "$dest/SHA256SUMS.tmp" "$dest/SHA256SUMS"
echo "$stamp" > "$dest/INPUTS"
echo "built otelcol into $dest in ${t_all}s (module download + verify ${t_dl}s)"
