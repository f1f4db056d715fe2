# What meets_a.sh and meets_b.sh do, for lane ME beside lane OTHER: pass only if the other
# lane's scenario runs at the same time (each waits for the other's mark), and mark the end for
# the scenario without a lane.
# shellcheck shell=bash
source "$(dirname "$0")/../../lib/scenario.sh"
touch "$SELFTEST_LANES/started-$ME"
for _ in $(seq 100); do
    [[ -e $SELFTEST_LANES/started-$OTHER ]] && break
    sleep 0.1
done
[[ -e $SELFTEST_LANES/started-$OTHER ]] || fail "lane $OTHER's scenario did not run beside lane $ME's"
sleep 0.5
touch "$SELFTEST_LANES/ended-$ME"
