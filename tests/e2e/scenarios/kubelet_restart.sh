# kubelet restarts under running pods: the pods and their volumes stay, and the node keeps
# publishing and unpublishing afterwards.
source "$(dirname "$0")/../lib/scenario.sh"

claim a 1Gi
pod a-user a "" "echo a > /data/f && sleep 100000"
wait_pod_running a-user
node=$(pod_node a-user)
started=$(kn get pod a-user -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')

step "restart kubelet on $node"
cluster restart-kubelet "$node"
sleep 5
k wait --for=condition=Ready "node/$node" --timeout=120s >/dev/null || fail "$node not Ready again"
# The new kubelet knows the pod once it has synced ("pod does not exist" until then).
until_ok 60 "kubectl exec reaches a-user through the new kubelet" 'pexec a-user true'
expect_eq "$(pexec a-user cat /data/f)" a "the running pod's data"
expect_eq "$(kn get pod a-user -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')" \
    "$started" "the pod's container was not restarted"

step "publish and unpublish after the restart"
claim b 1Gi
pod b-user b "$node" "echo b > /data/f && sleep 100000"
wait_pod_running b-user
expect_eq "$(pexec b-user cat /data/f)" b "the new pod's data"
kn delete pod a-user b-user --wait=true --timeout=60s >/dev/null || fail "pods did not go (unpublish)"
