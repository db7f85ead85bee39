//go:build tools

// Package tools pins the etcd server that realparts/build-kube.sh builds.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
