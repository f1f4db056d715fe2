# Skips: exit 77 is a skip, not a failure.
source "$(dirname "$0")/../../lib/scenario.sh"
defer 'log "cleanup of skips ran"'
skip "on purpose"
