# A sharedAccess ReadWriteMany claim used by two pods at once, each seeing the other's writes.
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"

k apply -f "$REPO_DIR/deploy/examples/storageclass-shared.yaml" >/dev/null
claim shared 1Gi stickyvol-shared Filesystem ReadWriteMany
pod one shared "" "echo from-one > /data/one && sleep 100000"
wait_pod_running one
node=$(pod_node one)
pod two shared "" "echo from-two > /data/two && sleep 100000"
wait_pod_running two
expect_eq "$(pod_node two)" "$node" "both pods on the volume's node"
until_true 30 "each pod sees the other's file" pexec one test -s /data/two
expect_eq "$(pexec two cat /data/one)" from-one "pod two reads pod one's file"
expect_eq "$(pexec one cat /data/two)" from-two "pod one reads pod two's file"
