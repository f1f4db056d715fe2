# Shared settings of the cluster suite's scripts.
# shellcheck shell=bash

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO_DIR=$(cd "$E2E_DIR/../.." && pwd)
# Built binaries and images, keyed by version, kept across runs and clones.
E2E_CACHE=${STICKYVOL_E2E_CACHE:-/var/cache/stickyvol-e2e}
# The running cluster: certificates, kubeconfig, node roots, logs. Removed by `cluster down`.
E2E_STATE=${STICKYVOL_E2E_STATE:-/var/tmp/stickyvol-e2e}

# shellcheck source=versions.sh
source "$E2E_DIR/lib/versions.sh"

log() { printf '%s [e2e] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
