//go:build tools

// promtool, which tests/monitoring/run builds from this module (pinned in go.mod, checked by
// go.sum); importing it keeps its dependencies in go.sum.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
