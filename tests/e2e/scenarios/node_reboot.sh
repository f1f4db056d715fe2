# A node "reboots": every process on it stops at once, its /run is emptied and its mounts and
# loop devices are gone; when it is back, its pods run again with their data (a filesystem and a
# block volume).
source "$(dirname "$0")/../lib/scenario.sh"

claim fs 1Gi
BLOCK=1 claim raw 64Mi stickyvol Block
pod fs-user fs "" "sleep 100000"
wait_pod_running fs-user
node=$(pod_node fs-user)
BLOCK=1 pod raw-user raw "$node"
wait_pod_running raw-user
pexec fs-user sh -c 'echo survives > /data/f && sync'
pexec raw-user sh -c 'echo survives-too | dd of=/dev/xvda conv=fsync 2>/dev/null'

restarts() { kn get pod "$1" -o jsonpath='{.status.containerStatuses[0].restartCount}'; }

step "reboot $node"
cluster reboot "$node"
k wait --for=condition=Ready "node/$node" --timeout=180s >/dev/null || fail "$node not Ready after the reboot"
# The pods stay bound to the node: its kubelet starts their containers again.
until_ok 240 "fs-user runs again" '(( $(restarts fs-user) >= 1 ))'
wait_pod_running fs-user 240
until_ok 240 "raw-user runs again" '(( $(restarts raw-user) >= 1 ))'
wait_pod_running raw-user 240
expect_eq "$(pexec fs-user cat /data/f)" survives "the filesystem volume's data"
expect_eq "$(pexec raw-user sh -c 'dd if=/dev/xvda bs=12 count=1 2>/dev/null')" survives-too "the block volume's data"
