# Passes its body, but a cleanup step calls `fail`: only that step ends, the scenario fails.
source "$(dirname "$0")/../../lib/scenario.sh"
defer 'log "cleanup registered first ran"'
defer 'fail "a cleanup step fails on purpose"'
