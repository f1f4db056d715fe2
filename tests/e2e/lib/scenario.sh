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
KUBECTL=$K8S_BIN/kubectl
DRIVER_NS=stickyvol

k() { "$KUBECTL" "$@"; }
kn() { "$KUBECTL" -n "$NS" "$@"; }
cluster() { "$E2E_DIR/cluster" "$@"; }

fail() { log "FAIL: $*"; exit 1; }
skip() { log "SKIP: $*"; exit 77; }
step() { log "-- $*"; }
expect_eq() { [[ $1 == "$2" ]] || fail "$3: expected '$2', got '$1'"; }

# Everything the scenario made goes, and with it the volumes (Delete policy), before the next.
cleanup_namespace() {
    local rc=$?
    if ((rc != 0 && rc != 77)); then
        log "state at failure:"
        kn get pods,pvc -o wide >&2 || true
        kn get events --sort-by=.lastTimestamp 2>/dev/null | tail -20 >&2 || true
    fi
    k delete namespace "$NS" --wait=true --timeout=180s >/dev/null 2>&1 || true
    # Released volumes of this scenario's claims (Retain ones are the scenario's to remove).
    local pv
    for pv in $(k get pv -o jsonpath="{range .items[?(@.spec.claimRef.namespace=='$NS')]}{.metadata.name}{'\n'}{end}"); do
        k wait --for=delete "pv/$pv" --timeout=120s >/dev/null 2>&1 || true
    done
    exit "$rc"
}
trap cleanup_namespace EXIT
k delete namespace "$NS" --wait=true --timeout=180s >/dev/null 2>&1 || true
k create namespace "$NS" >/dev/null

apply() { kn apply -f - >/dev/null; }

# until_true TIMEOUT WHAT CMD...: CMD until it succeeds, or fail after TIMEOUT seconds.
until_true() {
    local timeout=$1 what=$2
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
# The driver's DaemonSet pod on NODE, not one being deleted: the DaemonSet makes the replacement
# while the old pod still terminates. Empty while there is none.
driver_pod() {
    k -n "$DRIVER_NS" get pods -l app.kubernetes.io/component=node \
        --field-selector "spec.nodeName=$1" \
        -o go-template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}}{{"\n"}}{{end}}{{end}}' |
        head -1
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
