# What every scenario sources: a namespace of its own (removed at exit, pass or fail, with the
# volumes of its claims), kubectl, waits and assertions. Scenarios talk to the cluster only through
# kubectl, except where they play the node's owner (a reboot, a kubelet restart).
# shellcheck shell=bash
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source "$E2E_DIR/lib/pki.sh"
source "$E2E_DIR/lib/controlplane.sh"

SCENARIO=$(basename "$0" .sh)
NS=e2e-${SCENARIO//_/-}
KUBECONFIG=$PKI/admin.kubeconfig
export KUBECONFIG
# E2E_KUBECTL and E2E_CLUSTER stand in for kubectl and tests/e2e/cluster in the runner's own test
# (tests/e2e/selftest), which runs scenarios against no cluster.
KUBECTL=${E2E_KUBECTL:-$K8S_BIN/kubectl}
DRIVER_NS=stickyvol

k() { "$KUBECTL" "$@"; }
kn() { "$KUBECTL" -n "$NS" "$@"; }
cluster() { "${E2E_CLUSTER:-$E2E_DIR/cluster}" "$@"; }

fail() { log "FAIL: $*"; exit 1; }
skip() { log "SKIP: $*"; exit 77; }
step() { log "-- $*"; }
expect_eq() { [[ $1 == "$2" ]] || fail "$3: expected '$2', got '$1'"; }

# defer CMD...: CMD (with its arguments, run through eval) is part of the scenario's cleanup.
# The cleanup runs at exit, pass or fail: deferred commands last-registered first, each in a
# subshell with `set -e` (a `fail` or `exit` in one ends only that one), then the namespace goes.
# A deferred command that fails makes the scenario fail. Scenarios never set an EXIT trap of
# their own: the exit status is finish_scenario's alone (a trap that runs a command before it
# loses the status, and a failing scenario was once reported as passed that way).
DEFERRED=()
defer() { DEFERRED+=("$*"); }

# Everything the scenario made goes, and with it the volumes (Delete policy), before the next.
finish_scenario() {
    local rc=$? i status
    set +e
    if ((rc != 0 && rc != 77)); then
        log "state at failure (exit $rc):"
        kn get pods,pvc -o wide >&2
        kn get events --sort-by=.lastTimestamp 2>/dev/null | tail -20 >&2
    fi
    for ((i = ${#DEFERRED[@]} - 1; i >= 0; i--)); do
        (set -e; eval "${DEFERRED[i]}")
        status=$?
        if ((status != 0)); then
            log "FAIL: cleanup step '${DEFERRED[i]}' failed (exit $status)"
            ((rc == 0 || rc == 77)) && rc=1
        fi
    done
    if ! k delete namespace "$NS" --wait=true --timeout=180s >/dev/null 2>&1; then
        log "FAIL: namespace $NS was not removed within 180 s"
        ((rc == 0 || rc == 77)) && rc=1
    fi
    # Released volumes of this scenario's claims (Retain ones are the scenario's to remove).
    local pv
    for pv in $(k get pv -o jsonpath="{range .items[?(@.spec.claimRef.namespace=='$NS')]}{.metadata.name}{'\n'}{end}"); do
        if ! k wait --for=delete "pv/$pv" --timeout=120s >/dev/null 2>&1; then
            log "FAIL: the volume $pv of a deleted claim is still there after 120 s"
            ((rc == 0 || rc == 77)) && rc=1
        fi
    done
    exit "$rc"
}
trap finish_scenario EXIT
# The runner's timeout sends SIGTERM: the cleanup then sees a failure, not the status of the
# command that was interrupted.
trap 'log "FAIL: terminated (a time limit of the run)"; exit 143' TERM INT
k delete namespace "$NS" --wait=true --timeout=180s >/dev/null 2>&1 || true
k create namespace "$NS" >/dev/null

apply() { kn apply -f - >/dev/null; }

# wait_limit SECONDS: SECONDS, or E2E_WAIT_CAP if that is less. Every wait of the library
# takes its time from here: the runner's own test (tests/e2e/selftest) caps them at a second,
# so that a scenario against no cluster fails by its own `fail`, not by the runner's time limit.
wait_limit() { echo $(($1 < ${E2E_WAIT_CAP:-$1} ? $1 : ${E2E_WAIT_CAP:-$1})); }

# until_true TIMEOUT WHAT CMD...: CMD until it succeeds, or fail after TIMEOUT seconds.
until_true() {
    local timeout
    timeout=$(wait_limit "$1")
    local what=$2
    shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${timeout}s: $what"
        sleep 1
    done
}
# until_ok TIMEOUT WHAT 'SHELL CODE': the same for code evaluated anew at every try (write
# it in single quotes, so that its $(...) and variables are expanded then, not once).
until_ok() {
    local timeout=$1 what=$2 code=$3
    until_true "$timeout" "$what" eval "$code"
}

wait_pod_running() {
    kn wait --for=condition=Ready "pod/$1" --timeout="${2:-120}s" >/dev/null ||
        fail "pod $1 did not become Ready: $(kn get pod "$1" -o jsonpath='{.status}')"
}
wait_pvc_bound() {
    kn wait --for=jsonpath='{.status.phase}'=Bound "pvc/$1" --timeout="${2:-120}s" >/dev/null ||
        fail "claim $1 not Bound: $(kn describe pvc "$1" | tail -5)"
}
pv_of() { kn get pvc "$1" -o jsonpath='{.spec.volumeName}'; }
pod_node() { kn get pod "$1" -o jsonpath='{.spec.nodeName}'; }
# The node a PV is pinned to, from its node affinity.
pv_node() {
    k get pv "$1" -o jsonpath='{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}'
}
pexec() {
    local pod=$1
    shift
    kn exec "$pod" -- "$@"
}
# as_node_plugin NODE KUBECTL-ARGS...: kubectl with the token kubelet gave the driver's pod on
# NODE, alone (the admin's client certificate would authenticate first); its output on stdout
# and stderr. The token is never logged.
as_node_plugin() {
    local node=$1 token server
    shift
    token=$(k -n "$DRIVER_NS" exec "$(driver_pod "$node")" -c stickyvol -- \
        cat /var/run/secrets/kubernetes.io/serviceaccount/token) || return 1
    server=$(k config view --minify -o jsonpath='{.clusters[0].cluster.server}')
    "$KUBECTL" --kubeconfig=/dev/null --server="$server" --certificate-authority="$PKI/ca.crt" \
        --token="$token" "$@" 2>&1
}
# refused_to NODE WHY WHAT KUBECTL-ARGS...: fails unless the node plugin on NODE is refused
# WHAT, with WHY in the refusal.
refused_to() {
    local node=$1 why=$2 what=$3 out
    shift 3
    if out=$(as_node_plugin "$node" "$@"); then
        fail "the node plugin on $node could $what"
    fi
    grep -qF -- "$why" <<<"$out" || fail "the node plugin on $node was refused $what, but not for '$why': $out"
}

# The driver's DaemonSet pod on NODE, not one being deleted: the DaemonSet makes the replacement
# while the old pod still terminates. Empty while there is none.
driver_pod() {
    k -n "$DRIVER_NS" get pods -l app.kubernetes.io/component=node \
        --field-selector "spec.nodeName=$1" \
        -o go-template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}}{{"\n"}}{{end}}{{end}}' |
        head -1
}
# ready_driver_pod NODE [TIMEOUT]: the driver's pod on NODE once it serves (Ready, its init
# containers done), waiting for it up to TIMEOUT seconds (default 240). What a scenario reads of a
# driver pod (its logs, stickyvol in it, its metrics) must come from a pod in this state: a pod
# the DaemonSet is replacing, or one whose node has just rebooted, has a doctor log of an earlier
# run or none yet.
ready_driver_pod() {
    local node=$1 limit pod
    limit=$(wait_limit "${2:-240}")
    local deadline=$((SECONDS + limit))
    while :; do
        pod=$(driver_pod "$node" 2>/dev/null || true)
        if [[ -n $pod ]] && driver_pod_serves "$pod"; then
            echo "$pod"
            return 0
        fi
        ((SECONDS < deadline)) || fail "no driver pod serving on $node after ${limit}s: ${pod:-none}"
        sleep 1
    done
}
driver_pod_serves() {
    k -n "$DRIVER_NS" get pod "$1" -o json 2>/dev/null | python3 -c '
import json, sys
pod = json.load(sys.stdin)
status = pod.get("status", {})
ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
inits_done = all(s.get("state", {}).get("terminated", {}).get("exitCode") == 0
                 for s in status.get("initContainerStatuses", []))
running = all(s.get("ready") and "running" in s.get("state", {})
              for s in status.get("containerStatuses", []))
sys.exit(0 if ready and inits_done and running and status.get("containerStatuses") else 1)
'
}
# capacity_of CLASS NODE: the capacity NODE's CSIStorageCapacity for CLASS says (as written,
# e.g. 3978Mi), empty while there is none.
capacity_of() {
    k -n "$DRIVER_NS" get csistoragecapacities -o json | python3 -c '
import json, sys
cls, node = sys.argv[1], sys.argv[2]
for c in json.load(sys.stdin)["items"]:
    terms = c.get("nodeTopology", {}).get("matchLabels", {})
    if c["storageClassName"] == cls and node in terms.values():
        print(c.get("capacity", "0"))
' "$1" "$2"
}
# to_bytes QUANTITY: a Kubernetes quantity (4Gi, 3978Mi, 12k, 1000) in bytes.
to_bytes() { python3 -c '
import sys
units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9}
v = sys.argv[1]
for u, m in units.items():
    if v.endswith(u):
        print(int(float(v[: -len(u)]) * m)); break
else:
    print(int(v))
' "$1"; }
other_node() {
    local n
    for n in "${E2E_NODES[@]}"; do [[ $n == "$1" ]] || { echo "$n"; return; }; done
}

# release_kept_pvs: this namespace's PVs set to reclaim policy Delete (a move cut by a failure
# keeps them with Retain), so that they go with the namespace like the others. For `defer`.
release_kept_pvs() {
    local pv
    for pv in $(k get pv -o jsonpath="{range .items[?(@.spec.claimRef.namespace=='$NS')]}{.metadata.name} {end}"); do
        k patch pv "$pv" -p '{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}' >/dev/null 2>&1 || true
    done
}
# watch_pv_phases: every phase every PV takes from now on, recorded until
# expect_never_available (a watch: no change is missed between two looks).
watch_pv_phases() {
    PV_PHASES=$E2E_STATE/results/$NS-pv-phases
    "$KUBECTL" get pv --watch --no-headers \
        -o 'custom-columns=NAME:.metadata.name,PHASE:.status.phase,NS:.spec.claimRef.namespace' \
        >"$PV_PHASES" 2>&1 &
    PV_WATCHER=$!
    defer "kill $PV_WATCHER 2>/dev/null || true"
}
# expect_never_available PV...: since watch_pv_phases, none of PV... was Available free for any
# claim to take with its data (no claimRef); pre-bound to a claim of this namespace by name, as a
# move leaves it for a moment, is not free.
expect_never_available() {
    local ours=" $* " available
    kill "$PV_WATCHER" 2>/dev/null || true
    available=$(awk -v ns="$NS" -v ours="$ours" \
        '$2 == "Available" && $3 != ns && index(ours, " " $1 " ")' "$PV_PHASES")
    [[ -z $available ]] || fail "PVs holding data were Available: $available"
    grep -q Released "$PV_PHASES" || fail "the watch of PV phases saw no change: $(head -3 "$PV_PHASES")"
}

# claim NAME SIZE [CLASS] [MODE] [ACCESS]: a claim of the default stickyvol class.
claim() {
    apply <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1}
spec:
  storageClassName: ${3:-stickyvol}
  accessModes: [${5:-ReadWriteOnce}]
  volumeMode: ${4:-Filesystem}
  resources: {requests: {storage: $2}}
YAML
}

# provisioning_failure CLAIM: the message of CLAIM's ProvisioningFailed Event ("" if none yet).
provisioning_failure() {
    kn get events --field-selector "involvedObject.name=$1,reason=ProvisioningFailed" \
        -o jsonpath='{.items[0].message}' 2>/dev/null
}

# snapshot NAME CLAIM: a VolumeSnapshot of CLAIM (class stickyvol), waited for until ready.
snapshot() {
    apply <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: $1}
spec:
  volumeSnapshotClassName: stickyvol
  source: {persistentVolumeClaimName: $2}
YAML
    kn wait --for=jsonpath='{.status.readyToUse}'=true "volumesnapshot/$1" --timeout=180s >/dev/null ||
        fail "snapshot $1 not ready: $(kn get volumesnapshot "$1" -o jsonpath='{.status}')"
}

# pod NAME CLAIM [NODE] [COMMAND]: a pod with CLAIM mounted at /data (or, for a block claim, at
# /dev/xvda when BLOCK=1), on NODE if given.
pod() {
    local name=$1 claim=$2 node=${3:-} cmd=${4:-"sleep 100000"}
    local placement="" attach
    [[ -n $node ]] && placement="nodeSelector: {kubernetes.io/hostname: $node}"
    if [[ ${BLOCK:-0} == 1 ]]; then
        attach="volumeDevices: [{name: data, devicePath: /dev/xvda}]"
    else
        attach="volumeMounts: [{name: data, mountPath: /data}]"
    fi
    apply <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  $placement
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: $TEST_IMAGE
    command: [sh, -c, "$cmd"]
    $attach
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: $claim}
YAML
}
