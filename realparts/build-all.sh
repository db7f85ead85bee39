#!/usr/bin/env bash
# Build every real part the tests and benchmarks run against, into the cache outside the repository:
# Apache Kafka (Maven Central), the Kubernetes control plane, etcd and kwok (Go module proxy), and the
# Strimzi and Prometheus Operator CRDs the server dry-runs need (Maven Central, Go module proxy), and a
# minimal OpenTelemetry Collector (Go module proxy).
# Idempotent: with the cache in place it only verifies checksums (seconds). Cold: ~1 min + ~10 min + ~2-9 min (the collector) on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/build.sh"
"$here/build-kube.sh"
"$here/build-crds.sh"
"$here/build-otelcol.sh"
