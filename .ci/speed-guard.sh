#!/usr/bin/env bash
# The speed guard (docs/performance.md, "The guard in CI"): release builds of the reference
# commit that .ci/bench-baseline.json names and of this tree, then `stickyvol-bench guard`:
# rounds of volume cycles against each build in turn, each figure (a call's p50, a cycle's time,
# the peak RSS) this tree's over the reference's of the same round. Fails when a figure is more
# than 25% behind. Both builds run on the same machine in the same minutes, so a slower machine
# moves both alike. Under SCHED_FIFO where chrt exists, so that a stray process on the machine
# does not decide the figures.
#
#   .ci/speed-guard.sh                        compare (what CI runs)
#   .ci/speed-guard.sh --write-baseline WHY   make HEAD the reference instead (a committed tree,
#                                             nothing measured); WHY must then be added as a line
#                                             of CHANGELOG.md (a test checks it)
# Needs root (bind mounts) and the reference commit in this clone's history. Uses
# CARGO_TARGET_DIR like cargo does.
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=.ci/bench-baseline.json

if [[ ${1-} == --write-baseline ]]; then
    why=${2:?--write-baseline needs the reason, a sentence}
    if [[ $why == *[\"\\]* ]]; then
        echo "speed guard: the reason may not contain \" or \\" >&2
        exit 2
    fi
    if ! git diff --quiet HEAD; then
        echo "speed guard: commit first: the reference is a commit, HEAD, and this tree differs" >&2
        exit 2
    fi
    printf '{\n  "why": "%s",\n  "reference": "%s"\n}\n' "$why" "$(git rev-parse HEAD)" >"$baseline"
    echo "speed guard: $(git rev-parse --short HEAD) is the reference; add this line to CHANGELOG.md:"
    echo "  $why"
    exit 0
fi

reference=$(sed -n 's/^ *"reference": *"\([0-9a-f]\{40\}\)",\{0,1\}$/\1/p' "$baseline")
if [[ -z $reference ]]; then
    echo "speed guard: $baseline names no reference commit (40 hex digits)" >&2
    exit 2
fi
if ! git cat-file -e "$reference^{commit}" 2>/dev/null; then
    # A shallow clone lacks it; ask the remote for that one commit.
    git fetch --quiet --depth=1 origin "$reference" 2>/dev/null || true
fi
if ! git cat-file -e "$reference^{commit}" 2>/dev/null; then
    echo "speed guard: the reference commit $reference is not in this clone's history" >&2
    exit 2
fi

# What the driver is built from (src/bench is the measuring tool). When none of it differs from
# the reference's, the two builds would be the same binary but for the commit id it prints:
# nothing to compare, and about 13 minutes of CI saved. SPEED_GUARD_ALWAYS=1 compares anyway.
driver_sources=(Cargo.toml Cargo.lock build.rs proto link/hot-functions.txt .cargo src
    ':(exclude)src/bench')
if [[ ${SPEED_GUARD_ALWAYS-} != 1 ]] && git diff --quiet "$reference" -- "${driver_sources[@]}" &&
    [[ -z $(git ls-files --others --exclude-standard -- "${driver_sources[@]}") ]]; then
    echo "-- speed guard: the driver's sources are the reference's ($reference): nothing to compare"
    exit 0
fi

target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
bin=$target/release
work=$(mktemp -d /var/tmp/stickyvol-guard.XXXXXX)
run=$(mktemp -d /dev/shm/stickyvol-guard-run.XXXXXX)
cleanup() {
    # Whatever a failed round left mounted goes first: removal must not cross a mount.
    findmnt -rn -o TARGET | grep -F "$work/" | sort -r | xargs -r -n1 umount -l || true
    rm -rf --one-file-system "$work" "$run"
}
trap cleanup EXIT

# The two builds of the driver's crate run side by side: each is mostly one single-threaded
# fat-LTO link (about 4 of its 5 minutes here), so on 2 cores two at once take little longer
# than one. They cannot share a target directory (cargo locks it), so this tree's dependencies
# and library are built first and the reference gets a copy of them (2 GB, seconds): its own
# build then finds the dependencies fresh wherever the two Cargo.lock files agree.
source=$work/reference-source
reference_target=$work/reference-target
mkdir -p "$source" "$reference_target"
git archive "$reference" | tar -x -C "$source"
echo "-- speed guard: building the dependencies and this tree's library"
cargo build --release --locked --lib
cp -a "$target/release" "$reference_target/"
echo "-- speed guard: building the reference, $reference, beside this tree"
(cd "$source" && STICKYVOL_REVISION=$reference CARGO_TARGET_DIR=$reference_target \
    cargo build --release --locked --bin stickyvol) >"$work/reference-build.log" 2>&1 &
reference_build=$!
cargo build --release --locked --bin stickyvol --bin stickyvol-bench || {
    status=$?
    wait "$reference_build" || true
    exit "$status"
}
if ! wait "$reference_build"; then
    echo "speed guard: building the reference failed:" >&2
    tail -30 "$work/reference-build.log" >&2
    exit 1
fi
tail -1 "$work/reference-build.log"
cp "$reference_target/release/stickyvol" "$work/stickyvol-reference"
# Both binaries run from copies made alike: the page cache holds a file the linker wrote in
# other pieces than one cp wrote, and the driver's resident code follows (measured: the same
# code 2.2 MiB apart, and its calls up to 20% apart, when only one was copied).
cp "$bin/stickyvol" "$work/stickyvol-candidate"

# The functions link/hot-functions.txt names go first in the code (build.rs); names a build no
# longer has are code a cycle runs scattered again, which the peak RSS pays for. A list that lost
# most of its names (a version bump renames every function of the crate) fails here, with the
# fix, rather than as a memory figure.
hot_functions_in() {
    local list=$1/link/hot-functions.txt named found
    [[ -f $list ]] || { echo "0 0"; return; }
    named=$(sort -u "$list" | wc -l)
    found=$(nm --defined-only "$2" | awk '{print $3}' | sort -u | comm -12 - <(sort -u "$list") | wc -l)
    echo "$found $named"
}
read -r found named < <(hot_functions_in "$source" "$work/stickyvol-reference")
echo "-- speed guard: the reference has $found of the $named functions its list names"
read -r found named < <(hot_functions_in . "$work/stickyvol-candidate")
echo "-- speed guard: this build has $found of the $named functions link/hot-functions.txt names"
if ((found * 10 < named * 8)); then
    echo "speed guard: link/hot-functions.txt is stale (under 80% of its names are in this build): run link/refresh as root and commit the list" >&2
    exit 1
fi

# Data, state and kubelet directories on the disk (as a node's), the run directory on a tmpfs
# (as the DaemonSet's /run/stickyvol). No kubelet reserve: it would keep back 10% of a CI
# machine's shared disk, which may be all that is free there. Each build keeps its own state
# (the reference may predate a change of its format); the socket and kubelet's are shared.
serve() {
    mkdir -p "$run/$2"
    echo "exec $1 serve --node-id guard --endpoint unix://$work/csi.sock \
--kubelet-dir $work/kubelet --data-dir $work/data-$2 --run-dir $run/$2 \
--kubelet-eviction-reserve 0 2>>$work/driver.log"
}

# Only where the scheduler lets us (a container without CAP_SYS_NICE does not).
realtime=()
if command -v chrt >/dev/null && chrt --fifo 10 true 2>/dev/null; then
    realtime=(chrt --fifo 10)
else
    echo "-- speed guard: SCHED_FIFO not available; measuring at normal priority"
fi
"${realtime[@]}" "$bin/stickyvol-bench" guard \
    --endpoint "unix://$work/csi.sock" --kubelet-dir "$work/kubelet" --floor-dir "$work" \
    --reference-cmd "$(serve "$work/stickyvol-reference" reference)" \
    --driver-cmd "$(serve "$work/stickyvol-candidate" candidate)" \
    "$@" || {
    status=$?
    echo "-- the drivers' log (last 20 lines):"
    tail -20 "$work/driver.log" 2>/dev/null || true
    # A few percent of the list's names lost cost megabytes (docs/performance.md, "When the list
    # goes stale"): say so beside a failure, whatever figure it names.
    if ((found < named)); then
        echo "-- speed guard: this build lacks $((named - found)) of the $named functions link/hot-functions.txt names; if the peak RSS is behind, run link/refresh as root and commit the list"
    fi
    exit "$status"
}
