#!/usr/bin/env bash
# Runs csi-sanity (from kubernetes-csi/csi-test) against a local `stickyvol serve`, in filesystem
# mode, in block mode and with image volumes (the class key csi.storage.k8s.io/fstype among the
# parameters: $SANITY_IMAGE_FS, default ext4). Needs root (real bind mounts, loop devices, mkfs;
# growing a mounted ext4 also needs CAP_SYS_RESOURCE).
#
#   csi-sanity/run.sh [extra csi-sanity flags...]
#
# The csi-sanity binary is taken from $CSI_SANITY or PATH; stickyvol from $STICKYVOL or
# target/release/stickyvol (built if missing). Exit status: 0 only if every mode passes.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
sanity="${CSI_SANITY:-$(command -v csi-sanity || true)}"
if [[ -z "$sanity" || ! -x "$sanity" ]]; then
    echo "csi-sanity not found: put it on PATH or set CSI_SANITY=/path/to/csi-sanity" >&2
    exit 2
fi
driver="${STICKYVOL:-$here/target/release/stickyvol}"
if [[ ! -x "$driver" ]]; then
    (cd "$here" && cargo build --release --bin stickyvol)
fi

work="$(mktemp -d /var/tmp/stickyvol-sanity.XXXXXX)"
pid=""
cleanup() {
    if [[ -n "$pid" ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    # Anything csi-sanity left published: unmount before removing the tree.
    grep -o " $work[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

run_mode() {
    local mode="$1"
    local kubelet="$work/$mode/kubelet"
    mkdir -p "$kubelet/pods/sanity"
    "$driver" serve --endpoint "unix://$work/$mode/csi.sock" --node-id sanity-node \
        --admin-socket "$work/$mode/admin/admin.sock" \
        --kubelet-dir "$kubelet" --data-dir "$work/$mode/data" >"$work/$mode.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do [[ -S "$work/$mode/csi.sock" ]] && break; sleep 0.05; done
    local status=0 access=$mode extra=()
    if [[ $mode == image ]]; then
        access=mount
        printf 'csi.storage.k8s.io/fstype: %s\n' "${SANITY_IMAGE_FS:-ext4}" >"$work/image-parameters.yaml"
        extra=(--csi.testvolumeparameters "$work/image-parameters.yaml")
    fi
    # The ModifyVolume specs with IO limits where a volume has a device of its own (a directory
    # volume refuses them; with none, csi-sanity's specs pass an empty map).
    if [[ $mode != mount ]]; then
        printf 'writeIOPS: "1000"\nreadBytesPerSecond: 64Mi\n' >"$work/mutable-parameters.yaml"
        extra+=(--csi.testvolumemutableparameters "$work/mutable-parameters.yaml")
    fi
    "$sanity" --csi.endpoint "$work/$mode/csi.sock" \
        --csi.mountdir "$kubelet/pods/sanity/mount" \
        --csi.stagingdir "$kubelet/pods/sanity/staging" \
        --csi.testvolumesize 67108864 \
        --csi.testvolumeaccesstype "$access" \
        "${extra[@]}" "${@:2}" || status=$?
    kill "$pid"; wait "$pid" || true; pid=""
    if [[ $status -ne 0 ]]; then
        echo "csi-sanity failed in $mode mode; driver log: $work/$mode.log" >&2
        cp "$work/$mode.log" "/var/tmp/stickyvol-sanity-$mode.log"
    fi
    return $status
}

mkdir -p "$work"
overall=0
run_mode mount "$@" || overall=1
run_mode block "$@" || overall=1
run_mode image "$@" || overall=1
exit $overall
