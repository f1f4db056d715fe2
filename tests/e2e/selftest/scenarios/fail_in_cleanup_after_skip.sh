# Skips, but a cleanup step fails: a failure, not a skip.
source "$(dirname "$0")/../../lib/scenario.sh"
defer false
skip "on purpose"
