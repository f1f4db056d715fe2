# Without a lane: passes only if both lanes' scenarios had ended before it started.
source "$(dirname "$0")/../../lib/scenario.sh"
[[ -e $SELFTEST_LANES/ended-a && -e $SELFTEST_LANES/ended-b ]] ||
    fail "a scenario without a lane started while lanes still ran"
