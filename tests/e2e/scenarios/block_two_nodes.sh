# Block claims in use on both nodes while one node's driver restarts: the other node's devices
# stay attached. Both nodes share one kernel, so each driver sees the other's loop devices, with
# backing paths that look like its own.
source "$(dirname "$0")/../lib/scenario.sh"
export BLOCK=1

claim raw-1 64Mi stickyvol Block
claim raw-2 64Mi stickyvol Block
pod user-1 raw-1 "${E2E_NODES[0]}"
pod user-2 raw-2 "${E2E_NODES[1]}"
wait_pod_running user-1
wait_pod_running user-2
pexec user-1 sh -c 'echo node-one | dd of=/dev/xvda conv=fsync 2>/dev/null'
pexec user-2 sh -c 'echo node-two | dd of=/dev/xvda conv=fsync 2>/dev/null'

for restarted in "${E2E_NODES[@]}"; do
    step "restart the driver on $restarted"
    victim=$(driver_pod "$restarted")
    k -n "$DRIVER_NS" delete pod "$victim" --wait=true >/dev/null
    until_ok 120 "a new driver pod on $restarted" '[[ -n $(driver_pod "$restarted") ]]'
    k -n "$DRIVER_NS" wait --for=condition=Ready "pod/$(driver_pod "$restarted")" --timeout=180s >/dev/null ||
        fail "the driver on $restarted did not come back"
    # The device is read around the page cache: a detached loop device fails here.
    expect_eq "$(pexec user-1 sh -c 'dd if=/dev/xvda bs=4096 count=1 iflag=direct 2>/dev/null | head -c 8')" node-one \
        "user-1's device after the restart on $restarted"
    expect_eq "$(pexec user-2 sh -c 'dd if=/dev/xvda bs=4096 count=1 iflag=direct 2>/dev/null | head -c 8')" node-two \
        "user-2's device after the restart on $restarted"
done
