# Passes its body, but a cleanup step fails: the scenario fails, and the other steps still run.
source "$(dirname "$0")/../../lib/scenario.sh"
defer 'log "cleanup registered first ran"'
defer false
step "nothing to do"
