#!/usr/bin/env bash
# Build the real Kubernetes control-plane parts pinned in realparts/versions.env from the Go module
# proxy: kube-apiserver, kube-scheduler, kubectl (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3)
# and kwok (sigs.k8s.io/kwok). Modules are verified against the committed go.sum files in
# realparts/kube/{,etcd/,kwok/}.
#
#   realparts/build-kube.sh            build (or check) into $CACHE/kube-<KUBERNETES_VERSION>/bin
#   realparts/build-kube.sh --bin-dir  only print that bin directory
#   realparts/build-kube.sh --force    rebuild even when the checksums match
#
# CACHE is ${GPUAWARE_REALPARTS_CACHE:-$HOME/.cache/gpuaware/realparts}; the Go build and module
# caches live under it too (go-build/, go-mod/) so that CI can keep the whole directory.
# Idempotent: when the inputs (versions, go.mod/go.sum, go version, flags) are unchanged and every
# binary still matches SHA256SUMS, it does nothing. Build parallelism: GPUAWARE_REALPARTS_BUILD_JOBS
# (default: the number of CPUs); run it under `nice` on a shared machine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
: "${KUBERNETES_VERSION:?}" "${ETCD_VERSION:?}" "${KWOK_VERSION:?}"

cache="${GPUAWARE_REALPARTS_CACHE:-$HOME/.cache/gpuaware/realparts}"
dest="$cache/kube-${KUBERNETES_VERSION}"
bin="$dest/bin"
force=0
case "${1:-}" in
  --bin-dir) echo "$bin"; exit 0 ;;
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--bin-dir|--force]" >&2; exit 2 ;;
esac

command -v go >/dev/null || { echo "build-kube.sh: needs Go (go.mod asks for $(grep -m1 '^go ' "$here/kube/go.mod"))" >&2; exit 1; }
export GOTOOLCHAIN=local
need_go="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/kube/go.mod")"
have_go="$(go env GOVERSION)"; have_go="${have_go#go}"
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -1)" != "$need_go" ]; then
  echo "build-kube.sh: Go $have_go is older than the $need_go that k8s.io/kubernetes@${KUBERNETES_VERSION} needs" >&2
  exit 1
fi

jobs="${GPUAWARE_REALPARTS_BUILD_JOBS:-$(nproc)}"
export GOCACHE="$cache/go-build" GOMODCACHE="$cache/go-mod"
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false" CGO_ENABLED=0

minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
# buildDate: the release's commit time as the module proxy reports it (deterministic).
kube_ldflags() {
  local date="$1" ld="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=${KUBERNETES_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
    ld+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=${date}"
  done
  echo "$ld"
}

mkdir -p "$cache"
exec 9>"$cache/.build-kube.lock"
if command -v flock >/dev/null; then flock 9; fi  # one build at a time per cache

# Everything the outputs depend on (this script included), so that a change of any of them rebuilds.
stamp="$(
  {
    echo "go=$have_go cgo=$CGO_ENABLED flags=$GOFLAGS"
    cat "$here/versions.env" "$here/kube/go.mod" "$here/kube/go.sum" "$here/kube/etcd/go.mod" \
      "$here/kube/etcd/go.sum" "$here/kube/kwok/go.mod" "$here/kube/kwok/go.sum"
    cat "${BASH_SOURCE[0]}"
  } | sha256sum | cut -d' ' -f1
)"
parts=(bin/kube-apiserver bin/kube-scheduler bin/kubectl bin/etcd bin/kwok share/kwok-stages.yaml)

if [ "$force" = 0 ] && [ -f "$dest/SHA256SUMS" ] && [ "$(cat "$dest/INPUTS" 2>/dev/null)" = "$stamp" ] &&
  (cd "$dest" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1); then
  echo "kube parts up to date in $bin (checksums match)"
  exit 0
fi

rm -f "$dest/SHA256SUMS" "$dest/INPUTS"
mkdir -p "$bin"
t0=$SECONDS
echo "downloading modules into $GOMODCACHE"
for dir in "$here/kube" "$here/kube/etcd" "$here/kube/kwok"; do
  (cd "$dir" && go mod download && go mod verify >/dev/null)
done
t_dl=$((SECONDS - t0))

kube_date="$(cd "$here/kube" && go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)"
echo "building kube-apiserver kube-scheduler kubectl ${KUBERNETES_VERSION} (-p $jobs)"
(cd "$here/kube" && go build -p "$jobs" -ldflags "$(kube_ldflags "$kube_date")" -o "$bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
echo "building etcd ${ETCD_VERSION}"
(cd "$here/kube/etcd" && go build -p "$jobs" -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
echo "building kwok ${KWOK_VERSION}"
(cd "$here/kube/kwok" && go build -p "$jobs" -ldflags "-s -w" -o "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok)
# kwok run on its own (not through kwokctl) has no built-in Stages and exits with "no stages found";
# kwokctl passes it the default ones. Take the same defaults (node-fast initialize, heartbeat with
# lease, pod-fast ready/complete/delete) from the pinned kwok module.
kwok_dir="$(cd "$here/kube/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
mkdir -p "$dest/share"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  echo "---"; cat "$kwok_dir/kustomize/stage/$f"
done > "$dest/share/kwok-stages.yaml"
t_all=$((SECONDS - t0))

got="$("$bin/kube-apiserver" --version)"
[ "$got" = "Kubernetes ${KUBERNETES_VERSION}" ] || { echo "kube-apiserver --version says '$got'" >&2; exit 1; }
(cd "$dest" && sha256sum "${parts[@]}") > "$dest/SHA256SUMS.tmp"
mv "$dest/SHA256SUMS.tmp" "$dest/SHA256SUMS"
echo "$stamp" > "$dest/INPUTS"
echo "built ${parts[*]} into $dest in ${t_all}s (module download + verify ${t_dl}s)"
