#!/usr/bin/env bash
# Kubernetes' external storage tests against stickyvol, as csi-driver-host-path's CI runs them:
# storage.test (lib/build-suite.sh) with -storage.testdriver=kubernetes-suite/test-driver.yaml,
# focus External.Storage; first the tests that may run in parallel (ginkgo -p), leaving out
# Serial, Disruptive, SELinux and alpha features, then the Serial ones one at a time. stickyvol
# is installed with helm (charts/stickyvol, snapshots.groupSnapshots on), the one run of the
# suite that does so.
#
# Then the group snapshot tests (`groups`), with a driver file made from test-driver.yaml that
# claims group snapshots and provisions image volumes: their StatefulSet's pods write their
# claims while the group is cut, and stickyvol holds the writers of image volumes only (a group
# of directory volumes in use is refused: docs/operations/snapshots.md, "Group snapshots"). Their
# claims are 1Mi (their suite's own size range, not the driver's); an ext4 image is 16 MiB, and
# its snapshots state the 1Mi asked, so that the tests' 1Mi restores are made.
# Ends with "N passed, N failed, N skipped" (tests the suite skipped itself, each for a reason
# it logs: a capability test-driver.yaml does not claim, a test pattern that does not apply);
# the reasons, counted, are in $E2E_STATE/results/kubernetes-suite/skips.txt.
#
#   tests/e2e/run kubernetes-suite [parallel|serial|groups]...   (default: all three)
#   E2E_SUITE_FOCUS=REGEX tests/e2e/run kubernetes-suite serial   only the tests whose names
#       match REGEX as well (between "External Storage" and "[Serial]"), e.g.
#       E2E_SUITE_FOCUS='any volume data source'
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$E2E_DIR/lib/pki.sh"
source "$E2E_DIR/lib/controlplane.sh"
for part in "$E2E_DIR"/lib/build-*.sh; do source "$part"; done

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(parallel serial groups)

"$E2E_DIR/build" suite
"$E2E_DIR/cluster" up >/dev/null
"$E2E_DIR/lib/install.sh" helm

suite=$(suite_dir)
results=$E2E_STATE/results/kubernetes-suite
mkdir -p "$results"
focus='External.Storage'
[[ -z ${E2E_SUITE_FOCUS:-} ]] || focus="$focus.*($E2E_SUITE_FOCUS)"
# Alpha feature gates are off in this cluster (as in a user's); the SELinux tests need an
# SELinux-enabled kernel, which these machines are not.
# Pre-provisioned snapshots: with distributed snapshotting (deploy/), a node's csi-snapshotter
# takes only the VolumeSnapshotContents labelled snapshot.storage.kubernetes.io/managed-by=NODE;
# snapshot-controller labels those it makes, one made by hand must carry the label itself
# (docs/operations/troubleshooting.md), and the tests' do not: nobody would ever make them ready.
# The same goes for the members of a pre-provisioned group (contents snapshot-controller makes
# from the handles, without the label).
common_skip='\[Disruptive\]|\[Feature:SELinux\]|\[Alpha\]|\[Feature:OffByDefault\]|\[Testpattern: Pre-provisioned Snapshot|\[Testpattern: Pre-provisioned VolumeGroupSnapshot'
groups='VolumeGroupSnapshottable'

# The driver file of the groups part: test-driver.yaml claiming group snapshots, with the class
# of image volumes (kubernetes-suite/storageclass-image.yaml, on node 1) and the
# VolumeGroupSnapshotClass stickyvol's controller keeps for node 1.
groups_driver() {
    python3 - "$E2E_DIR/kubernetes-suite/test-driver.yaml" "$results/test-driver-groups.yaml" <<'PY'
import sys
import yaml

driver = yaml.safe_load(open(sys.argv[1]))
driver["StorageClass"]["FromFile"] = "tests/e2e/kubernetes-suite/storageclass-image.yaml"
driver["GroupSnapshotClass"] = {"FromExistingClassName": "stickyvol-stickyvol-e2e-1"}
driver["DriverInfo"]["Capabilities"]["groupSnapshot"] = True
yaml.safe_dump(driver, open(sys.argv[2], "w"), sort_keys=False)
PY
    echo "$results/test-driver-groups.yaml"
}

run_part() {
    local part=$1 flags=() driver=$E2E_DIR/kubernetes-suite/test-driver.yaml
    case $part in
        parallel) flags=(-p --procs="${E2E_SUITE_PROCS:-4}" --skip="\[Serial\]|$groups|$common_skip" --focus="$focus") ;;
        serial) flags=(--focus="$focus.*\[Serial\]" --skip="$groups|$common_skip") ;;
        groups)
            flags=(-p --procs=2 --focus="$focus.*$groups" --skip="$common_skip")
            driver=$(groups_driver) ;;
        *) die "kubernetes-suite: parallel, serial or groups, not $part" ;;
    esac
    log "kubernetes-suite: the $part tests"
    # Only this part's earlier results go: a serial run after a parallel one keeps the other's.
    rm -rf "$results/$part" "$results/$part".{json,log}
    local rc=0
    (cd "$results" && "$suite/ginkgo" "${flags[@]}" --timeout=80m --no-color \
        --json-report="$part.json" --output-dir="$results" "$suite/storage.test" -- \
        -kubeconfig="$PKI/admin.kubeconfig" -kubectl-path="$K8S_BIN/kubectl" -repo-root="$REPO_DIR" \
        -storage.testdriver="$driver" \
        -report-dir="$results/$part" >"$results/$part.log" 2>&1) || rc=$?
    log "kubernetes-suite: $part done (ginkgo exit $rc), log $results/$part.log"
}
for part in "${parts[@]}"; do run_part "$part"; done

python3 "$E2E_DIR/kubernetes-suite/count.py" "$results" "${parts[@]}"
