//go:build tools

// The command tests/e2e/build makes; importing it keeps its dependencies in go.sum.
package tools

import _ "go.etcd.io/etcd/server/v3"
