# A block claim (volumeMode: Block) is a raw device in the pod: written with dd and read back,
# also by a second pod after the first is gone.
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"
export BLOCK=1

claim raw 64Mi stickyvol Block
pod writer raw "" "sleep 100000"
wait_pod_running writer
node=$(pod_node writer)
expect_eq "$(pv_node "$(pv_of raw)")" "$node" "the block PV's node"

step "write 4 MiB of a known pattern at 1 MiB into the device, read it back"
pexec writer sh -c 'dd if=/dev/urandom of=/tmp/pattern bs=1M count=4 2>/dev/null && dd if=/tmp/pattern of=/dev/xvda bs=1M seek=1 conv=fsync 2>/dev/null && md5sum < /tmp/pattern' >"/tmp/$NS.sum"
written=$(cut -d' ' -f1 "/tmp/$NS.sum")
rm -f "/tmp/$NS.sum"
read_back=$(pexec writer sh -c 'dd if=/dev/xvda bs=1M skip=1 count=4 2>/dev/null | md5sum' | cut -d' ' -f1)
expect_eq "$read_back" "$written" "the pattern read back in the same pod"
size=$(pexec writer blockdev --getsize64 /dev/xvda)
expect_eq "$size" $((64 << 20)) "the device's size"

step "a second pod reads the same bytes"
kn delete pod writer --wait=true >/dev/null
pod reader raw "" "sleep 100000"
wait_pod_running reader
expect_eq "$(pod_node reader)" "$node" "the reader's node"
read_back=$(pexec reader sh -c 'dd if=/dev/xvda bs=1M skip=1 count=4 2>/dev/null | md5sum' | cut -d' ' -f1)
expect_eq "$read_back" "$written" "the pattern read back in a new pod"
