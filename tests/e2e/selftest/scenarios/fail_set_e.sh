# Fails by a command that fails under set -e.
source "$(dirname "$0")/../../lib/scenario.sh"
defer 'k delete storageclass selftest --ignore-not-found >/dev/null'
false
log "not reached"
