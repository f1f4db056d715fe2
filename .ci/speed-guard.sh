#!/usr/bin/env bash
# The speed guard (docs/performance.md, "The guard in CI"): release builds of `stickyvol` and
# `stickyvol-bench`, then `stickyvol-bench guard`: rounds of volume cycles against a driver it
# starts, each call's p50 divided by one fdatasync plus one bind mount and unmount timed on the
# same filesystem in the same round, compared with .ci/bench-baseline.json. Fails when a figure
# is more than 25% behind. Under SCHED_FIFO where chrt exists, so that a stray process on the
# machine does not decide the figures.
#
#   .ci/speed-guard.sh                        compare (what CI runs)
#   .ci/speed-guard.sh --write-baseline WHY   measure and write the baseline instead; WHY must
#                                             then be added as a line of CHANGELOG.md (a test
#                                             checks it)
# Needs root (bind mounts). Uses CARGO_TARGET_DIR like cargo does.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --bin stickyvol --bin stickyvol-bench
bin=${CARGO_TARGET_DIR:-target}/release

# Data, state and kubelet directories on the disk (as a node's), the run directory on a tmpfs
# (as the DaemonSet's /run/stickyvol). No kubelet reserve: it would keep back 10% of a CI
# machine's shared disk, which may be all that is free there.
work=$(mktemp -d /var/tmp/stickyvol-guard.XXXXXX)
run=$(mktemp -d /dev/shm/stickyvol-guard-run.XXXXXX)
cleanup() {
    # Whatever a failed round left mounted goes first: removal must not cross a mount.
    findmnt -rn -o TARGET | grep -F "$work/" | sort -r | xargs -r -n1 umount -l || true
    rm -rf --one-file-system "$work" "$run"
}
trap cleanup EXIT

# Only where the scheduler lets us (a container without CAP_SYS_NICE does not).
realtime=()
if command -v chrt >/dev/null && chrt --fifo 10 true 2>/dev/null; then
    realtime=(chrt --fifo 10)
else
    echo "-- speed guard: SCHED_FIFO not available; measuring at normal priority"
fi
"${realtime[@]}" "$bin/stickyvol-bench" guard \
    --endpoint "unix://$work/csi.sock" --kubelet-dir "$work/kubelet" --floor-dir "$work" \
    --driver-cmd "exec $bin/stickyvol serve --node-id guard --endpoint unix://$work/csi.sock \
--kubelet-dir $work/kubelet --data-dir $work/data --run-dir $run --kubelet-eviction-reserve 0 \
2>>$work/driver.log" \
    --baseline .ci/bench-baseline.json "$@" || {
    status=$?
    echo "-- the driver's log (last 20 lines):"
    tail -20 "$work/driver.log" 2>/dev/null || true
    exit "$status"
}
