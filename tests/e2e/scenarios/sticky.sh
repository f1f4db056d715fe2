# A WaitForFirstConsumer claim is provisioned on its first pod's node, stays there, and its data
# outlives the pod: a second pod lands on the same node although the other one is emptier.
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"

step "claim and a first pod"
claim data 1Gi
pod first data "" "echo sticky > /data/hello && sleep 100000"
wait_pod_running first
wait_pvc_bound data
node=$(pod_node first)
pv=$(pv_of data)
expect_eq "$(pv_node "$pv")" "$node" "the PV's node affinity names the first pod's node"
expect_eq "$(k get pv "$pv" -o jsonpath='{.spec.csi.driver}')" stickyvol.csi.io "the PV's driver"
expect_eq "$(pexec first cat /data/hello)" sticky "what the first pod wrote"

step "the first pod goes; the node it used gets busier than the other"
kn delete pod first --wait=true >/dev/null
for i in 1 2 3; do
    apply <<YAML
apiVersion: v1
kind: Pod
metadata: {name: filler-$i}
spec:
  nodeSelector: {kubernetes.io/hostname: $node}
  terminationGracePeriodSeconds: 1
  containers:
  - {name: app, image: $TEST_IMAGE, command: [sleep, "100000"], resources: {requests: {cpu: 100m, memory: 64Mi}}}
YAML
done

step "a second pod with no placement of its own lands where the data is"
pod second data
wait_pod_running second
expect_eq "$(pod_node second)" "$node" "the second pod's node"
expect_eq "$(pexec second cat /data/hello)" sticky "the data after the first pod went"
