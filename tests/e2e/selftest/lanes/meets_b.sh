# In lane b: passes only if the scenario of lane a runs at the same time (each waits for
# the other's mark), and marks its own end for the scenario without a lane.
# e2e-lane: b
source "$(dirname "$0")/../../lib/scenario.sh"
touch "$SELFTEST_LANES/started-b"
for _ in $(seq 100); do
    [[ -e $SELFTEST_LANES/started-a ]] && break
    sleep 0.1
done
[[ -e $SELFTEST_LANES/started-a ]] || fail "lane a's scenario did not run beside lane b's"
sleep 0.5
touch "$SELFTEST_LANES/ended-b"
