# In lane a: passes only if the scenario of lane b runs at the same time (each waits for
# the other's mark), and marks its own end for the scenario without a lane.
# e2e-lane: a
source "$(dirname "$0")/../../lib/scenario.sh"
touch "$SELFTEST_LANES/started-a"
for _ in $(seq 100); do
    [[ -e $SELFTEST_LANES/started-b ]] && break
    sleep 0.1
done
[[ -e $SELFTEST_LANES/started-b ]] || fail "lane b's scenario did not run beside lane a's"
sleep 0.5
touch "$SELFTEST_LANES/ended-a"
