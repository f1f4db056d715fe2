# What the node-loss scenarios share (sourced after scenario.sh): a StorageClass with an
# onNodeLoss policy, a one-replica StatefulSet whose claim is made on the second node, and an
# exit that gives the cluster its second node back, whatever happened.
# shellcheck shell=bash

LOST=${E2E_NODES[1]}
LIVE=${E2E_NODES[0]}
CLASS=$NS
OUT_OF_SERVICE=node.kubernetes.io/out-of-service

# lost_disk: the image of the disk that holds $LOST's stickyvol data directory (lib/node.sh makes
# it), and the data directory's path inside that filesystem (versions.sh, E2E_POOL_FS).
lost_disk() {
    local root=$E2E_STATE/nodes/$LOST
    case ${E2E_POOL_FS[1]} in
        ext4) echo "$root/kubelet.img volumes/stickyvol.csi.io" ;;
        *) echo "$root/pool.img ." ;;
    esac
}

# At exit, pass or fail (deferred, so run before the namespace goes: its volumes' deletions need
# the second node's provisioner): the second node comes back, started and untainted. A node that
# does not come back fails the scenario, whose cleanup would otherwise leave volumes behind.
give_node_back() {
    local back=0
    bring_back || { log "$LOST not Ready again after the scenario"; back=1; }
    k taint node "$LOST" "$OUT_OF_SERVICE-" >/dev/null 2>&1 || true
    return "$back"
}
ready() {
    [[ $(k get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
# bring_back: starts the second node and waits until it is Ready. A kubelet whose Node was
# deleted registers it again only some time after it starts (a minute here), and if that is after
# its CSINode setup gave up, it stays NotReady ("failed to initialize CSINode") until restarted:
# restarted once then, as a person would (not before a minute: the message also shows while
# kubelet still retries). A node not Ready in time is described: its conditions and kubelet's
# last words.
bring_back() {
    cluster start "$LOST" >/dev/null || return 1
    local limit started=$SECONDS restarted=0 why
    limit=$(wait_limit 360)
    until ready "$LOST"; do
        if ((SECONDS - started >= limit)); then
            log "$LOST not Ready $limit s after it started: $(node_story "$LOST")"
            return 1
        fi
        why=$(k get node "$LOST" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}' 2>/dev/null)
        if ((!restarted && SECONDS - started >= 60)) && [[ $why == *CSINode* ]]; then
            log "$LOST: kubelet gave up on its CSINode ($why); restarting it"
            cluster restart-kubelet "$LOST"
            restarted=1
        fi
        sleep 1
    done
}
# node_story NODE: what the API server says of NODE, and the end of its kubelet's log.
node_story() {
    k get node "$1" -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}: {.message}){"\n"}{end}' 2>&1 ||
        true
    echo "kubelet's last lines:"
    tail -n 15 "$E2E_STATE/nodes/$1/logs/kubelet.log" 2>&1 || true
}
defer 'k delete storageclass "$CLASS" --ignore-not-found >/dev/null'
defer give_node_back

# class POLICY: the scenario's StorageClass (named after its namespace).
class() {
    k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $CLASS}
provisioner: stickyvol.csi.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
parameters: {onNodeLoss: $1}
YAML
}

# statefulset [NAME [COMMAND]]: StatefulSet NAME ("db") of one replica that prefers the second
# node, its claim "data" mounted at /data. db's pod writes /data/written and records what /data
# held when it started in /tmp/found-at-start.
statefulset() {
    local name=${1:-db}
    local default='ls -A /data >/tmp/found-at-start; echo $(hostname) > /data/written; sleep 100000'
    local command=${2:-$default}
    apply <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: $name}
spec:
  serviceName: $name
  replicas: 1
  selector: {matchLabels: {app: $name}}
  template:
    metadata: {labels: {app: $name}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference:
              matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$LOST]}]
      containers:
      - name: app
        image: $TEST_IMAGE
        command: [sh, -c, "$command"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      storageClassName: $CLASS
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 64Mi}}
YAML
}

# The StatefulSet's first pod on the second node, with its data written; sets PV and HANDLE.
# A preference is all the scheduler weighs, so the second node must be able to take the claim
# first: its driver serving and its capacity for the class published (after the previous
# scenario brought the node back, neither is there at once; seen once in CI, db-0 on the first).
start_on_lost_node() {
    ready_driver_pod "$LOST" 300 >/dev/null
    until_ok 120 "$LOST's capacity for $CLASS published" \
        '[[ -n $(capacity_of "$CLASS" "$LOST") && $(capacity_of "$CLASS" "$LOST") != 0 ]]'
    statefulset
    until_ok 60 "db-0 made" 'kn get pod db-0'
    wait_pod_running db-0 180
    expect_eq "$(pod_node db-0)" "$LOST" "db-0's node (it prefers $LOST)"
    PV=$(pv_of data-db-0)
    HANDLE=$(k get pv "$PV" -o jsonpath='{.spec.csi.volumeHandle}')
    expect_eq "$(pv_node "$PV")" "$LOST" "the claim's node"
    until_ok 30 "db-0 wrote its data" '[[ $(pexec db-0 cat /data/written) == db-0 ]]'
}

# now: seconds since the epoch, with fractions.
now() { date +%s.%N; }
# since T: seconds since T, one decimal.
since() { python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$1"; }

# running_on NODE: db-0 is Ready on NODE (a new pod: the old one may still be listed on the
# lost node).
running_on() {
    [[ $(pod_node db-0 2>/dev/null) == "$1" ]] &&
        [[ $(kn get pod db-0 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
wait_running_on() { until_true "$2" "db-0 Ready on $1" running_on "$1"; }

# The released pod's volume is another, empty, on the live node.
expect_new_empty_volume() {
    local pv
    pv=$(pv_of data-db-0)
    [[ -n $pv && $pv != "$PV" ]] || fail "the claim is still bound to the old PV $PV"
    expect_eq "$(pv_node "$pv")" "$LIVE" "the new claim's node"
    until_ok 30 "db-0 looked at its volume" 'pexec db-0 test -e /data/written'
    expect_eq "$(pexec db-0 cat /tmp/found-at-start)" "" "what the new volume held when db-0 started"
}

# stop_lost_node: the second node's power cord, and the wait until the cluster sees it NotReady.
not_ready() { ! ready "$1"; }
stop_lost_node() {
    cluster stop "$LOST"
    until_true 180 "$LOST NotReady" not_ready "$LOST"
}
