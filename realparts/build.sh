#!/usr/bin/env bash
# Fetch the real systems' artifacts into a cache outside the repository, once.
#
#   realparts/build.sh            # idempotent; a second run only verifies the cache
#
# Cache: ${GPUAWARE_REALPARTS_CACHE:-$HOME/.cache/gpuaware/realparts}
#   kafka-<version>/libs/*.jar    the broker's classpath (Maven dependency:copy-dependencies)
#   kafka-<version>/VERSION       the Kafka version
#   kafka-<version>/MANIFEST.sha256  "# inputs <sha256 of versions.env + pom.xml>" then sha256sum lines
#
# Downloads happen only here, through Maven (and its ~/.m2); nothing downloads at run time.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache="${GPUAWARE_REALPARTS_CACHE:-$HOME/.cache/gpuaware/realparts}"
mkdir -p "$cache"

log() { printf 'realparts: %s\n' "$*" >&2; }

need() {
    command -v "$1" >/dev/null 2>&1 || { log "$1 not found: $2"; exit 1; }
}

build_kafka() {
    local dest="$cache/kafka-$KAFKA_VERSION"
    local manifest="$dest/MANIFEST.sha256"
    local pom="$here/kafka/pom.xml"
    # The inputs that decide the jar set; a change to either means a rebuild.
    local inputs
    inputs="$(cat "$here/versions.env" "$pom" | sha256sum | cut -d' ' -f1)"

    if [[ -f "$manifest" && -f "$dest/VERSION" ]] \
        && [[ "$(head -n1 "$manifest")" == "# inputs $inputs" ]] \
        && [[ "$(ls "$dest/libs" | wc -l)" == "$(grep -vc '^#' "$manifest")" ]] \
        && (cd "$dest/libs" && grep -v '^#' "$manifest" | sha256sum --quiet -c - 2>/dev/null); then
        log "kafka $KAFKA_VERSION: cache matches its manifest ($dest)"
        return 0
    fi

    need mvn "install Maven (Debian: apt-get install maven)"
    need java "install a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless)"
    log "kafka $KAFKA_VERSION: resolving jars with Maven into $dest"
    # Build next to the destination and swap it in, so an interrupted run leaves no half cache.
    # (global, not local: the EXIT trap runs after this function's locals are gone)
    tmp="$cache/.kafka-$KAFKA_VERSION.tmp.$$"
    rm -rf "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/libs"
    # Debian's Maven 3.8 prints colour resets even in batch mode; strip them (pipefail keeps mvn's status).
    mvn -q -B -f "$pom" \
        -Dkafka.version="$KAFKA_VERSION" \
        -Dkafka.scala.version="$KAFKA_SCALA_VERSION" \
        -Dkafka.log4j.version="$KAFKA_LOG4J_VERSION" \
        -Dmaven.dependency.plugin.version="$MAVEN_DEPENDENCY_PLUGIN_VERSION" \
        dependency:copy-dependencies -DoutputDirectory="$tmp/libs" 2>&1 \
        | sed -e 's/\x1b\[[0-9;]*m//g' >&2
    printf '%s\n' "$KAFKA_VERSION" >"$tmp/VERSION"
    {
        printf '# inputs %s\n' "$inputs"
        (cd "$tmp/libs" && sha256sum -- *.jar)
    } >"$tmp/MANIFEST.sha256"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    trap - EXIT
    log "kafka $KAFKA_VERSION: $(grep -vc '^#' "$dest/MANIFEST.sha256") jars in $dest/libs"
}

build_kafka
