# Deleting a claim of a Delete class removes its data on its node; with Retain the data stays
# (and the PV, Released) until an admin removes the PV and the volume (the scenario does, last).
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"

k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: e2e-retain}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
YAML
defer 'k delete storageclass e2e-retain --ignore-not-found >/dev/null'

data_path() { echo "/var/lib/kubelet/volumes/stickyvol.csi.io/volumes/$1"; }
on_node() { cluster exec "$1" test -e "$(data_path "$2")"; }
not_on_node() { ! on_node "$@"; }

claim gone 1Gi
claim kept 1Gi e2e-retain
pod user-gone gone "" "echo x > /data/x && sleep 100000"
pod user-kept kept "" "echo x > /data/x && sleep 100000"
wait_pod_running user-gone
wait_pod_running user-kept
gone_pv=$(pv_of gone) kept_pv=$(pv_of kept)
# The retained PV and its data are the scenario's to remove, as an admin removes them after a
# Retain: the PV, then the volume with `stickyvol volume delete` on its node (left there, it
# would be orphaned to lost+found, an orphan record for the suite's later scenarios).
remove_kept() {
    k delete pv "$kept_pv" --ignore-not-found --wait=true --timeout=60s >/dev/null || return 1
    k -n "$DRIVER_NS" exec "$(driver_pod "$kept_node")" -c stickyvol -- \
        stickyvol volume delete "$kept_id" >/dev/null
}
gone_id=$(k get pv "$gone_pv" -o jsonpath='{.spec.csi.volumeHandle}')
kept_id=$(k get pv "$kept_pv" -o jsonpath='{.spec.csi.volumeHandle}')
gone_node=$(pv_node "$gone_pv") kept_node=$(pv_node "$kept_pv")
defer remove_kept
on_node "$gone_node" "$gone_id" || fail "no data directory for $gone_id on $gone_node"
on_node "$kept_node" "$kept_id" || fail "no data directory for $kept_id on $kept_node"

step "delete both claims"
kn delete pod user-gone user-kept --wait=true >/dev/null
kn delete pvc gone kept --wait=true >/dev/null
k wait --for=delete "pv/$gone_pv" --timeout=120s >/dev/null || fail "the Delete PV stayed"
until_true 60 "the deleted volume's data leaves $gone_node" not_on_node "$gone_node" "$gone_id"
until_ok 60 "the Retain PV becomes Released" \
    '[[ $(k get pv "$kept_pv" -o jsonpath="{.status.phase}") == Released ]]'
on_node "$kept_node" "$kept_id" || fail "the retained volume's data is gone"
