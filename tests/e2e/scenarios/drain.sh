# Draining a node with its data (docs/operations.md, "Draining a node"): a 3-replica StatefulSet
# whose claims are all on the second node (the first cordoned while they are made); that node
# cordoned and its pods evicted (`kubectl drain`): they wait, Pending, their volumes pinning them
# there. `stickyvol cluster drain --dry-run` says each claim goes to the first node and changes
# nothing; `stickyvol cluster drain` moves the three (two at a time), and the three pods run on
# the first node with their data. No lane: it cordons nodes.
source "$(dirname "$0")/../lib/scenario.sh"

from=${E2E_NODES[1]}
to=${E2E_NODES[0]}
defer "k uncordon $from $to >/dev/null 2>&1"
# Released to Delete if a move is cut (kept with Retain), so they go with the namespace.
defer 'for pv in $(k get pv -o jsonpath="{range .items[?(@.spec.claimRef.namespace==\"$NS\")]}{.metadata.name} {end}"); do k patch pv "$pv" -p "{\"spec\":{\"persistentVolumeReclaimPolicy\":\"Delete\"}}" >/dev/null; done'

step "a StatefulSet of 3 with its claims on $from ($to cordoned meanwhile)"
k cordon "$to" >/dev/null
apply <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 3
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: $TEST_IMAGE
        command: [sh, -c, "[ -f /data/sum ] || { dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null && sha256sum /data/blob > /data/sum && sync; }; sleep 100000"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {storageClassName: stickyvol, accessModes: [ReadWriteOnce], resources: {requests: {storage: 32Mi}}}
YAML
defer "kn delete statefulset web --ignore-not-found --wait=true --timeout=60s >/dev/null"
declare -A sum
for i in 0 1 2; do
    until_ok 60 "pod web-$i" 'kn get pod web-$i >/dev/null 2>&1'
    wait_pod_running "web-$i" 180
    expect_eq "$(pod_node "web-$i")" "$from" "web-$i's node"
    until_true 60 "web-$i wrote its data" pexec "web-$i" test -s /data/sum
    sum[$i]=$(pexec "web-$i" cat /data/sum)
done
k uncordon "$to" >/dev/null

step "$from cordoned and drained: the pods wait"
k drain "$from" --pod-selector=app=web --timeout=120s >/dev/null 2>&1 ||
    fail "kubectl drain $from failed"
for i in 0 1 2; do
    until_ok 60 "web-$i waits, Pending" \
        '[[ $(kn get pod web-$i -o jsonpath="{.status.phase}/{.spec.nodeName}" 2>/dev/null) == Pending/ ]]'
done

drain() { k -n "$DRIVER_NS" exec stickyvol-controller-0 -c stickyvol -- stickyvol cluster drain "$@" 2>&1; }

step "--dry-run: each claim to $to, nothing asked"
out=$(drain "$from" --dry-run) || fail "the dry run failed: $out"
for i in 0 1 2; do
    grep -q "^$NS/data-web-$i (PV .*waited for by web-$i): to node $to$" <<<"$out" ||
        fail "the dry run did not send data-web-$i to $to: $out"
done
[[ -z $(kn get pvc -l stickyvol.csi.io/move-requested -o name) ]] || fail "the dry run asked for moves"

step "drained: the three claims moved, the pods run on $to with their data"
started=$SECONDS
out=$(drain "$from" --parallel 2) || fail "the drain failed: $out"
log "measured: three 32 MiB claims of a drained node moved in $((SECONDS - started)) s"
[[ $(grep -c "moved: claim $NS/data-web-" <<<"$out") == 3 ]] || fail "not three moves ended: $out"
for i in 0 1 2; do
    wait_pod_running "web-$i" 180
    expect_eq "$(pod_node "web-$i")" "$to" "web-$i's node"
    expect_eq "$(pexec "web-$i" cat /data/sum)" "${sum[$i]}" "web-$i's data (its checksum file)"
    pexec "web-$i" sha256sum -c /data/sum >/dev/null || fail "web-$i's data does not match its checksum"
done
