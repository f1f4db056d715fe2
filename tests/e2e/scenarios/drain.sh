# Draining a node with its data (docs/operations/moving.md, "Draining a node"): a 3-replica StatefulSet
# whose claims are all on the second node (the first cordoned while they are made); that node
# cordoned and its pods evicted (`kubectl drain`): they wait, Pending, their volumes pinning them
# there. `stickyvol cluster drain --dry-run` says each claim goes to the first node and changes
# nothing; `stickyvol cluster drain` moves the three (two at a time): once a copy is asked for,
# the controller (and the drain command in it) and both node plugins are killed, and the drain
# run again finishes the moves; the three pods run on the first node with their data, and no PV
# of theirs was Available at any moment. No lane: it cordons nodes and kills the controller.
source "$(dirname "$0")/../lib/scenario.sh"

from=${E2E_NODES[1]}
to=${E2E_NODES[0]}
defer "k uncordon $from $to >/dev/null 2>&1"
defer release_kept_pvs

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
        command: [sh, -c, "[ -f /data/sum ] || { dd if=/dev/urandom of=/data/blob bs=1M count=64 2>/dev/null && sha256sum /data/blob > /data/sum && sync; }; sleep 100000"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {storageClassName: stickyvol, accessModes: [ReadWriteOnce], resources: {requests: {storage: 96Mi}}}
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

step "drained, with the controller and both node plugins killed mid-move"
watch_pv_phases
first=$E2E_STATE/results/$NS-drain-first
started=$SECONDS
drain "$from" --parallel 2 >"$first" &
# Killed once a copy is asked for (a PV labelled for its node's pull), polled closely: copies of
# 64 MiB take a second or two.
deadline=$((SECONDS + 90))
until [[ -n $(k get pv -l stickyvol.csi.io/pull-to -o name 2>/dev/null) ]]; do
    ((SECONDS < deadline)) || fail "no copy was asked for within 90 s: $(cat "$first")"
    sleep 0.2
done
k -n "$DRIVER_NS" delete pod stickyvol-controller-0 "$(driver_pod "$to")" "$(driver_pod "$from")" \
    --wait=false >/dev/null
wait $! 2>/dev/null || true
log "the first drain, cut: $(tail -n 2 "$first" | tr '\n' ' ')"
k -n "$DRIVER_NS" rollout status statefulset/stickyvol-controller --timeout=180s >/dev/null ||
    fail "the controller did not come back"
for node in "$to" "$from"; do
    until_ok 180 "$node's node plugin back" '[[ -n $(ready_driver_pod "$node") ]]'
done
out=$(timeout 300 "$KUBECTL" -n "$DRIVER_NS" exec stickyvol-controller-0 -c stickyvol -- \
    stickyvol cluster drain "$from" --parallel 2 2>&1) || fail "the drain run again failed: $out"
log "the drain run again ended: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
log "measured: three 96 MiB claims (64 MiB of data each) of a drained node moved in $((SECONDS - started)) s (three kills and the restarts included)"
for i in 0 1 2; do
    wait_pod_running "web-$i" 180
    expect_eq "$(pod_node "web-$i")" "$to" "web-$i's node"
    expect_eq "$(pexec "web-$i" cat /data/sum)" "${sum[$i]}" "web-$i's data (its checksum file)"
    pexec "web-$i" sha256sum -c /data/sum >/dev/null || fail "web-$i's data does not match its checksum"
done
expect_never_available $(for i in 0 1 2; do pv_of "data-web-$i"; done)
[[ -z $(k get pv -l stickyvol.csi.io/moving -o name) ]] || fail "a move was left under way"
