# Capacity: each node's provisioner publishes a CSIStorageCapacity per class with what its pool
# can promise, and the scheduler uses it: a claim only the bigger node can hold lands there, one
# that no node can hold stays Pending, saying why. The nodes' pools are filesystems of different
# sizes (tests/e2e/lib/node-init.sh).
source "$(dirname "$0")/../lib/scenario.sh"

step "one CSIStorageCapacity per node for the class"
declare -A bytes
for node in "${E2E_NODES[@]}"; do
    until_ok 120 "a CSIStorageCapacity for $node" '[[ -n $(capacity_of stickyvol "$node") ]]'
    bytes[$node]=$(to_bytes "$(capacity_of stickyvol "$node")")
    log "$node: ${bytes[$node]} bytes"
    # What the node's pool reports (its filesystem, less what its volumes may still write).
    pool_free=$(cluster exec "$node" df -B1 --output=avail /var/lib/kubelet/volumes/stickyvol.csi.io | tail -1)
    ((bytes[$node] > 0 && bytes[$node] <= pool_free)) ||
        fail "$node's capacity ${bytes[$node]} is not within its pool's free space $pool_free"
done
big=${E2E_NODES[0]} small=${E2E_NODES[1]}
((bytes[$big] > bytes[$small])) || fail "expected $big to report more than $small"

step "a claim only $big can hold"
size=$(( (bytes[$small] + bytes[$big]) / 2 >> 20 ))Mi
claim roomy "$size"
pod roomy-user roomy
wait_pod_running roomy-user 180
expect_eq "$(pod_node roomy-user)" "$big" "the node of a claim of $size"

step "a claim no node can hold"
claim huge $(( (bytes[$big] >> 30) + 100 ))Gi
pod huge-user huge
sleep 15
expect_eq "$(kn get pod huge-user -o jsonpath='{.status.phase}')" Pending "the pod of a claim too big for every node"
events=$(kn get events --field-selector involvedObject.name=huge-user -o jsonpath='{.items[*].message}')
[[ $events == *"did not have enough free storage"* ]] ||
    fail "no scheduling event says there is not enough storage: $events"
