# Fails by running past the runner's time limit; its cleanup still runs.
source "$(dirname "$0")/../../lib/scenario.sh"
defer 'log "cleanup of fail_timeout ran"'
sleep 600
