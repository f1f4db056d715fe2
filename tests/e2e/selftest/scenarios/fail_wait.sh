# Fails by a wait of the library that runs out of time.
source "$(dirname "$0")/../../lib/scenario.sh"
until_true 2 "something that never happens" false
log "not reached"
