//go:build tools

// The commands tests/e2e/build makes into the plugin's image, as its Dockerfile does; importing
// them keeps their dependencies in go.sum.
package tools

import (
	_ "github.com/vmware-tanzu/velero-plugin-for-aws/hack/cp-plugin"
	_ "github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws"
)
