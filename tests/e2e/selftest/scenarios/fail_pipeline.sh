# Fails by a pipeline whose first command fails (pipefail), as `k logs ... | grep -q` would.
source "$(dirname "$0")/../../lib/scenario.sh"
k -n stickyvol logs some-pod -c doctor | grep -q "anything" || true
k -n stickyvol logs some-pod -c doctor | cat >/dev/null
log "not reached"
