//go:build tools

// promtool, which tests/monitoring/run builds from this module (pinned in go.mod, checked by
// go.sum), and the Prometheus server the cluster suite runs (tests/e2e/lib/build-images.sh);
// importing them keeps their dependencies in go.sum.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
