# The driver's pod is deleted while pods use its volumes: their mounts keep working meanwhile,
# and once the DaemonSet has brought it back, new claims on that node work and old ones unpublish.
source "$(dirname "$0")/../lib/scenario.sh"

claim old 1Gi
pod old-user old "" "sleep 100000"
wait_pod_running old-user
node=$(pod_node old-user)
pexec old-user sh -c 'echo before > /data/f'

step "delete the driver's pod on $node"
victim=$(driver_pod "$node")
k -n "$DRIVER_NS" delete pod "$victim" --wait=false >/dev/null
pexec old-user sh -c 'echo during >> /data/f' || fail "writing while the driver restarts failed"
until_ok 120 "a new driver pod on $node" 'new=$(driver_pod "$node") && [[ -n $new && $new != "$victim" ]]'
k -n "$DRIVER_NS" wait --for=condition=Ready "pod/$(driver_pod "$node")" --timeout=180s >/dev/null ||
    fail "the new driver pod did not become Ready"
expect_eq "$(pexec old-user cat /data/f | tr '\n' ' ')" "before during " "the old pod's data"

step "a new claim on $node, and the old pod's unpublish"
claim new 1Gi
pod new-user new "$node" "echo new > /data/f && sleep 100000"
wait_pod_running new-user
expect_eq "$(pexec new-user cat /data/f)" new "the new pod's data"
kn delete pod old-user --wait=true --timeout=60s >/dev/null || fail "the old pod did not go (unpublish)"
