# Passes, with a cleanup step that runs.
source "$(dirname "$0")/../../lib/scenario.sh"
defer 'log "cleanup of passes ran"'
step "nothing to do"
