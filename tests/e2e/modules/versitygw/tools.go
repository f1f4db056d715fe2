//go:build tools

// The command tests/e2e/build makes into the object store's image; importing it keeps its
// dependencies in go.sum.
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
