//go:build tools

// The commands tests/e2e/build makes into Velero's image (the three its Dockerfile builds, less
// restic); importing them keeps their dependencies in go.sum.
package tools

import (
	_ "github.com/vmware-tanzu/velero/cmd/velero"
	_ "github.com/vmware-tanzu/velero/cmd/velero-helper"
	_ "github.com/vmware-tanzu/velero/cmd/velero-restore-helper"
)
