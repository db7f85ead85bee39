#!/usr/bin/env bash
# Put the third-party CustomResourceDefinitions gpuaware's manifests use into the realparts cache, at
# the versions pinned in realparts/versions.env, so that gpuaware/deploy/checks.py validates against the real
# schemas and tests/deploy/test_server_dry_run.py installs them in a real kube-apiserver.
#
#   realparts/build-crds.sh            fetch/generate (or only verify) into $CACHE/crds/
#   realparts/build-crds.sh --dir      print the two CRD directories, one a line
#   realparts/build-crds.sh --force    redo even when the checksums match
#
# Strimzi (kafka.strimzi.io): no artifact on a registry we can reach carries the CRD YAML (the
# io.strimzi:api jar has the model classes only; the YAML ships with GitHub releases and the Helm
# chart). Strimzi generates its CRDs from those classes with its own io.strimzi:crd-generator, so
# this script does the same: both jars from Maven Central, sha256-pinned in versions.env, run with
# the arguments of the generate-crd-co-install-v1 execution in the api module's pom.xml (which is
# inside the jar). The api classes are Java 21 bytecode, so it needs a Java >= 21.
#
# Prometheus Operator (monitoring.coreos.com): the Go module
# github.com/prometheus-operator/prometheus-operator carries example/prometheus-operator-crd/*.yaml;
# `go mod download` fetches its zip from the Go module proxy, checks it against the checksum
# database, and this script checks the h1: hash pinned in versions.env as well.
#
# Cache: ${GPUAWARE_REALPARTS_CACHE:-$HOME/.cache/gpuaware/realparts}/crds/
#   strimzi-<version>/*.yaml                  one CustomResourceDefinition a file
#   prometheus-operator-<version>/*.yaml
#   each with INPUTS (hash of the pins and this script) and SHA256SUMS; a run whose INPUTS match and
#   whose files match SHA256SUMS does nothing. Nothing is fetched at test time; the CRDs are never
#   committed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
: "${STRIMZI_VERSION:?}" "${STRIMZI_API_SHA256:?}" "${STRIMZI_CRD_GENERATOR_SHA256:?}"
: "${PROMETHEUS_OPERATOR_VERSION:?}" "${PROMETHEUS_OPERATOR_MODULE_SUM:?}" "${MAVEN_DEPENDENCY_PLUGIN_VERSION:?}"

cache="${GPUAWARE_REALPARTS_CACHE:-$HOME/.cache/gpuaware/realparts}"
strimzi_dir="$cache/crds/strimzi-${STRIMZI_VERSION}"
promop_dir="$cache/crds/prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}"
force=0
case "${1:-}" in
  --dir) printf '%s\n%s\n' "$strimzi_dir" "$promop_dir"; exit 0 ;;
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--dir|--force]" >&2; exit 2 ;;
esac

log() { printf 'build-crds: %s\n' "$*" >&2; }
mkdir -p "$cache/crds"
exec 9>"$cache/.build-crds.lock"
if command -v flock >/dev/null; then flock 9; fi

# Everything a directory's content depends on: the pins (versions.env), the pom and this script.
stamp="$(cat "$here/versions.env" "$here/strimzi/pom.xml" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"

up_to_date() {  # dir
  [ "$force" = 0 ] && [ -f "$1/SHA256SUMS" ] && [ "$(cat "$1/INPUTS" 2>/dev/null)" = "$stamp" ] &&
    (cd "$1" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1) &&
    [ "$(find "$1" -name '*.yaml' | wc -l)" = "$(wc -l <"$1/SHA256SUMS")" ]
}

seal() {  # tmp dir -> dest dir: checksums, then swap in so that an interrupted run leaves no half cache
  (cd "$1" && sha256sum -- *.yaml >SHA256SUMS)
  printf '%s\n' "$stamp" >"$1/INPUTS"
  rm -rf "$2"
  mv "$1" "$2"
}

java21() {  # a java whose version is >= 21: $JAVA_HOME, then PATH, then the JDKs under /usr/lib/jvm
  local candidate major
  for candidate in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
    [ -x "$candidate" ] || continue
    major="$("$candidate" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java\.specification\.version = //p')"
    if [ -n "$major" ] && [ "${major%%.*}" -ge 21 ]; then echo "$candidate"; return 0; fi
  done
  return 1
}

build_strimzi() {
  if up_to_date "$strimzi_dir"; then log "strimzi $STRIMZI_VERSION: up to date in $strimzi_dir"; return 0; fi
  command -v mvn >/dev/null || { log "needs Maven (Debian: apt-get install maven)"; exit 1; }
  local java
  java="$(java21)" || { log "needs a Java >= 21 (io.strimzi:api $STRIMZI_VERSION is Java 21 bytecode)"; exit 1; }
  tmp="$cache/crds/.strimzi.tmp.$$"
  rm -rf "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/libs" "$tmp/out"
  log "strimzi $STRIMZI_VERSION: io.strimzi:api and io.strimzi:crd-generator from Maven Central"
  mvn -q -B --strict-checksums -f "$here/strimzi/pom.xml" \
    -Dstrimzi.version="$STRIMZI_VERSION" -Dmaven.dependency.plugin.version="$MAVEN_DEPENDENCY_PLUGIN_VERSION" \
    dependency:copy-dependencies -DoutputDirectory="$tmp/libs" 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g' >&2
  echo "$STRIMZI_API_SHA256  $tmp/libs/api-$STRIMZI_VERSION.jar" | sha256sum --quiet -c -
  echo "$STRIMZI_CRD_GENERATOR_SHA256  $tmp/libs/crd-generator-$STRIMZI_VERSION.jar" | sha256sum --quiet -c -
  local m=io.strimzi.api.kafka.model
  log "strimzi $STRIMZI_VERSION: generating the CRDs with $java"
  "$java" -cp "$tmp/libs/*" io.strimzi.crdgenerator.CrdGenerator \
    --label app:strimzi --label strimzi.io/crd-install:true --target-kube 1.16+ \
    --crd-api-version v1 --api-versions v1 --storage-version v1 --yaml \
    "$m.kafka.Kafka=$tmp/out/040-Crd-kafka.yaml" \
    "$m.connect.KafkaConnect=$tmp/out/041-Crd-kafkaconnect.yaml" \
    "$m.podset.StrimziPodSet=$tmp/out/042-Crd-strimzipodset.yaml" \
    "$m.topic.KafkaTopic=$tmp/out/043-Crd-kafkatopic.yaml" \
    "$m.user.KafkaUser=$tmp/out/044-Crd-kafkauser.yaml" \
    "$m.nodepool.KafkaNodePool=$tmp/out/045-Crd-kafkanodepool.yaml" \
    "$m.bridge.KafkaBridge=$tmp/out/046-Crd-kafkabridge.yaml" \
    "$m.connector.KafkaConnector=$tmp/out/047-Crd-kafkaconnector.yaml" \
    "$m.mirrormaker2.KafkaMirrorMaker2=$tmp/out/048-Crd-kafkamirrormaker2.yaml" \
    "$m.rebalance.KafkaRebalance=$tmp/out/049-Crd-kafkarebalance.yaml" >&2
  rm -rf "$tmp/libs"
  seal "$tmp/out" "$strimzi_dir"
  rm -rf "$tmp"
  trap - EXIT
  log "strimzi $STRIMZI_VERSION: $(wc -l <"$strimzi_dir/SHA256SUMS") CRDs in $strimzi_dir"
}

build_prometheus_operator() {
  if up_to_date "$promop_dir"; then log "prometheus-operator $PROMETHEUS_OPERATOR_VERSION: up to date in $promop_dir"; return 0; fi
  command -v go >/dev/null || { log "needs Go (for the Go module proxy)"; exit 1; }
  local module=github.com/prometheus-operator/prometheus-operator info zip sum
  export GOTOOLCHAIN=local GOMODCACHE="$cache/go-mod" GOFLAGS=-mod=mod
  log "prometheus-operator $PROMETHEUS_OPERATOR_VERSION: module zip from the Go module proxy"
  # Outside any module: `go mod download` of an explicit version needs no go.mod.
  info="$(cd "$cache" && GO111MODULE=on go mod download -json "$module@$PROMETHEUS_OPERATOR_VERSION")"
  zip="$(sed -n 's/^[[:space:]]*"Zip": "\(.*\)",$/\1/p' <<<"$info")"
  sum="$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p' <<<"$info")"
  if [ "$sum" != "$PROMETHEUS_OPERATOR_MODULE_SUM" ]; then
    log "module sum $sum != pinned PROMETHEUS_OPERATOR_MODULE_SUM $PROMETHEUS_OPERATOR_MODULE_SUM"; exit 1
  fi
  tmp="$cache/crds/.prometheus-operator.tmp.$$"
  rm -rf "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp"
  local crd
  for crd in podmonitors prometheusrules; do  # the kinds deploy/ uses
    unzip -p "$zip" "$module@$PROMETHEUS_OPERATOR_VERSION/example/prometheus-operator-crd/monitoring.coreos.com_$crd.yaml" \
      >"$tmp/monitoring.coreos.com_$crd.yaml"
  done
  seal "$tmp" "$promop_dir"
  trap - EXIT
  log "prometheus-operator $PROMETHEUS_OPERATOR_VERSION: $(wc -l <"$promop_dir/SHA256SUMS") CRDs in $promop_dir"
}

build_strimzi
build_prometheus_operator
