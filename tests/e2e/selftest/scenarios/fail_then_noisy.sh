# Fails by `fail`, then its cleanup says much more than the summary's tail of the log keeps
# (as the state dumped at a failure does): the reason must still reach the summary.
source "$(dirname "$0")/../../lib/scenario.sh"
defer 'for i in $(seq 40); do log "cleanup line $i"; done'
step "the step that fails"
fail "on purpose, before a noisy cleanup"
