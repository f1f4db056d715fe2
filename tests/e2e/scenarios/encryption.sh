# An encrypted StorageClass (encryption: luks2, its key in a node-stage Secret), used as a user
# would. Where the nodes have no dm-crypt (these machines' kernel has no device mapper), the
# claim's provisioning says so in a sentence and nothing is made; a node that has it serves the
# claim, its filesystem inside a LUKS2 device the driver formatted at the first stage.
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"

CLASS=$NS
defer 'k delete storageclass "$CLASS" --ignore-not-found >/dev/null'
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Secret
metadata: {name: encryption-key, namespace: $NS}
stringData: {key: "$(head -c 48 /dev/urandom | base64 -w0)"}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $CLASS}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
parameters:
  csi.storage.k8s.io/fstype: ext4
  encryption: luks2
  csi.storage.k8s.io/node-stage-secret-name: encryption-key
  csi.storage.k8s.io/node-stage-secret-namespace: $NS
YAML

node=$(k get nodes -o jsonpath='{.items[0].metadata.name}')
plugin=$(ready_driver_pod "$node")
if k -n "$DRIVER_NS" exec "$plugin" -c stickyvol -- test -e /dev/mapper/control; then
    step "$node has a device mapper: an encrypted claim is served, formatted at its first stage"
    claim secret 64Mi "$CLASS"
    pod user secret "$node" "echo sealed > /data/marker && sync && sleep 100000"
    wait_pod_running user 180
    expect_eq "$(pexec user cat /data/marker)" sealed "what the pod reads back"
    k -n "$DRIVER_NS" logs "$plugin" -c stickyvol | grep -q "formatted an encrypted image volume" ||
        fail "the driver on $node did not log the format of the encrypted volume"
    exit 0
fi

step "$node has no device mapper: the claim's provisioning says why, and nothing is made"
claim secret 64Mi "$CLASS"
pod user secret "$node"
until_ok 120 "a ProvisioningFailed event about the encryption" \
    '[[ $(provisioning_failure secret) == *"to be encrypted"* ]]'
said=$(provisioning_failure secret)
log "the claim's event: $said"
[[ $said == *"device mapper"* && $said == *"stickyvol doctor"* ]] ||
    fail "the refusal does not say why nor where to look: $said"
expect_eq "$(kn get pvc secret -o jsonpath='{.status.phase}')" Pending "the claim's phase"
expect_eq "$(kn get pod user -o jsonpath='{.status.phase}')" Pending "the pod's phase"
step "the node's doctor says it cannot encrypt"
doctor=$(k -n "$DRIVER_NS" logs "$plugin" -c doctor 2>&1 | grep "encrypted volumes" || true)
log "the doctor: $doctor"
[[ $doctor == *"cannot be made here"* ]] || fail "the doctor on $node does not report it: $doctor"
