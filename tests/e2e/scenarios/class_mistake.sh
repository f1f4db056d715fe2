# A StorageClass with a misspelt parameter, used as a new user would: the class gets a Warning
# Event naming the key and what is allowed (the controller's class check), the claim's
# provisioning fails with the same message (capacity is published for the class, so the
# scheduler picks a node and CreateVolume is called), and nothing is made.
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"

CLASS=$NS
defer 'k delete storageclass "$CLASS" --ignore-not-found >/dev/null'
k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $CLASS}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
parameters: {bogusParameter: "x"}
YAML

step "the class gets an Event naming its mistake"
class_event() {
    k -n default get events --field-selector "involvedObject.name=$CLASS,reason=InvalidParameters" \
        -o jsonpath='{.items[0].note}{.items[0].message}' 2>/dev/null
}
until_ok 60 "an InvalidParameters event on the class" '[[ -n $(class_event) ]]'
note=$(class_event)
log "the class's event: $note"
[[ $note == *'"bogusParameter"'* && $note == *onNodeLoss* ]] ||
    fail "the event does not name the key and what is allowed: $note"

step "a claim of it and its pod: the claim's provisioning names the mistake"
claim wrong 64Mi "$CLASS"
pod user wrong
until_ok 120 "a ProvisioningFailed event naming the key" \
    '[[ $(provisioning_failure wrong) == *bogusParameter* ]]'
log "the claim's event: $(provisioning_failure wrong)"
expect_eq "$(kn get pvc wrong -o jsonpath='{.status.phase}')" Pending "the claim's phase"
expect_eq "$(kn get pod user -o jsonpath='{.status.phase}')" Pending "the pod's phase"
