# What the backup scenarios (scenarios/velero_*.sh) share, sourced after scenario.sh: Velero and
# its object store installed once per cluster (velero_install; a later call finds them and only
# checks), the velero CLI, a StatefulSet whose claim holds checksummed data, and waits on
# Velero's backups and restores. See docs/operations/backups.md, "Backups".
# shellcheck shell=bash

VELERO_NS=velero
VELERO_BIN=$E2E_CACHE/velero-$VELERO_VERSION/velero
# The object store: versitygw on the first node's network (manifests/velero-object-store.yaml).
STORE_NS=velero-object-store
STORE_NODE=${E2E_NODES[0]}
STORE_PORT=7070
STORE_URL=http://$E2E_NODE_IP_PREFIX.2:$STORE_PORT
STORE_BUCKET=velero
STORE_ACCESS_KEY=e2e-velero
STORE_SECRET_KEY=e2e-velero-secret
# The data each scenario backs up, in MiB (E2E_VELERO_MIB=1024 measures a gibibyte).
VELERO_MIB=${E2E_VELERO_MIB:-64}

velero() { "$VELERO_BIN" --kubeconfig "$KUBECONFIG" --namespace "$VELERO_NS" "$@"; }

# An S3 request without a body to the store, signed with its root credentials (curl's SigV4; S3
# wants the payload's SHA-256 in a header too, here that of nothing).
store_request() {
    curl -sf --max-time 10 --aws-sigv4 "aws:amz:us-east-1:s3" \
        --user "$STORE_ACCESS_KEY:$STORE_SECRET_KEY" \
        -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" "$@"
}

# store_delete_prefix PREFIX: every object of the bucket whose key starts with PREFIX deleted
# (keys of kopia's and Velero's making: no characters a URL path would need escaped). The list's
# query parameters stay in sorted order, as curl signs them as written.
store_delete_prefix() {
    local keys key
    while :; do
        keys=$(store_request "$STORE_URL/$STORE_BUCKET?list-type=2&prefix=${1//\//%2F}" |
            python3 -c 'import re, sys; print("\n".join(re.findall(r"<Key>([^<]*)</Key>", sys.stdin.read())))')
        [[ -n $keys ]] || return 0
        for key in $keys; do
            store_request -X DELETE "$STORE_URL/$STORE_BUCKET/$key" >/dev/null
        done
    done
}

# The object store runs and has its bucket.
store_install() {
    sed -e "s|@NODE@|$STORE_NODE|g" -e "s|@PORT@|$STORE_PORT|g" -e "s|@IMAGE@|$VERSITYGW_IMAGE|g" \
        "$E2E_DIR/manifests/velero-object-store.yaml" | k apply -f - >/dev/null
    k -n "$STORE_NS" rollout status deployment/versitygw --timeout="$(wait_limit 180)s" >/dev/null ||
        fail "the object store did not start: $(k -n "$STORE_NS" get pods -o wide 2>&1)"
    # A cluster restarted over its old state reports the old pod rolled out while kubelet is
    # still making its sandbox again (seen: 70 s).
    until_ok 180 "the object store answers at $STORE_URL" 'curl -sf --max-time 5 "$STORE_URL/health"'
    if ! store_request -I "$STORE_URL/$STORE_BUCKET" >/dev/null; then
        store_request -X PUT "$STORE_URL/$STORE_BUCKET" >/dev/null ||
            fail "could not make the bucket $STORE_BUCKET at $STORE_URL"
        log "made the bucket $STORE_BUCKET at $STORE_URL"
        # Velero's records of kopia repositories in an earlier, lost bucket (a new store pod
        # starts empty) would point at nothing.
        k -n "$VELERO_NS" delete backuprepositories --all >/dev/null 2>&1 || true
    fi
}

# Whether Velero is installed as velero_install would install it, and serving.
velero_installed() {
    [[ $(k -n "$VELERO_NS" get deployment velero -o jsonpath='{.spec.template.spec.containers[0].image}' 2>/dev/null) == "$VELERO_IMAGE" ]] &&
        [[ $(k -n "$VELERO_NS" get daemonset node-agent -o jsonpath='{.spec.template.spec.containers[0].securityContext.privileged}' 2>/dev/null) == true ]] &&
        [[ $(k -n "$VELERO_NS" get deployment velero -o jsonpath='{.spec.template.spec.nodeSelector.kubernetes\.io/hostname}' 2>/dev/null) == "$STORE_NODE" ]]
}

# Velero as its documentation installs it: the AWS plugin for an S3-compatible store (path-style
# addressing, the store's URL), no volume snapshotter of a cloud (CSI snapshots are Velero's own,
# EnableCSI), and the node agent for the data mover and for file-system backups, privileged as
# block volumes need. The server is held to the store's node: the node-loss scenario stops the
# other one. Velero takes its CSI snapshots with deploy/kubernetes/snapshots' class, the driver's
# default class (it needs no velero.io/csi-volumesnapshot-class label).
velero_install() {
    [[ -x $VELERO_BIN ]] || fail "no $VELERO_BIN: run tests/e2e/build velero"
    store_install
    if ! velero_installed; then
        local start=$SECONDS credentials
        credentials=$(mktemp)
        printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' \
            "$STORE_ACCESS_KEY" "$STORE_SECRET_KEY" >"$credentials"
        velero install \
            --provider aws \
            --plugins "$VELERO_AWS_PLUGIN_IMAGE" \
            --image "$VELERO_IMAGE" \
            --bucket "$STORE_BUCKET" \
            --secret-file "$credentials" \
            --backup-location-config "region=us-east-1,s3ForcePathStyle=true,s3Url=$STORE_URL" \
            --use-volume-snapshots=false \
            --features=EnableCSI \
            --use-node-agent \
            --privileged-node-agent >/dev/null || { rm -f "$credentials"; fail "velero install failed"; }
        rm -f "$credentials"
        k -n "$VELERO_NS" patch deployment velero --type=merge \
            -p "{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"kubernetes.io/hostname\":\"$STORE_NODE\"}}}}}" >/dev/null
        log "velero install: $((SECONDS - start)) s"
    fi
    k -n "$VELERO_NS" rollout status deployment/velero --timeout="$(wait_limit 300)s" >/dev/null ||
        fail "Velero's server did not start: $(k -n "$VELERO_NS" get pods -o wide 2>&1)"
    k -n "$VELERO_NS" rollout status daemonset/node-agent --timeout="$(wait_limit 300)s" >/dev/null ||
        fail "Velero's node agent did not start on every node: $(k -n "$VELERO_NS" get pods -o wide 2>&1)"
    until_ok 120 "the backup storage location Available" \
        '[[ $(k -n "$VELERO_NS" get backupstoragelocation default -o jsonpath="{.status.phase}") == Available ]]'
}

# velero_statefulset MODE SIZE [PREFERRED-NODE]: StatefulSet "db" of one replica, its claim "data"
# of the class stickyvol, mounted at /data (MODE Filesystem) or attached at /dev/xvda (Block).
velero_statefulset() {
    local mode=$1 size=$2 prefer=${3:-} attach affinity=""
    if [[ $mode == Block ]]; then
        attach="volumeDevices: [{name: data, devicePath: /dev/xvda}]"
    else
        attach="volumeMounts: [{name: data, mountPath: /data}]"
    fi
    [[ -n $prefer ]] && affinity="affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$prefer]}]}}]}}"
    apply <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 1
      $affinity
      containers:
      - name: app
        image: $TEST_IMAGE
        command: [sh, -c, "sleep 100000"]
        $attach
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      storageClassName: stickyvol
      accessModes: [ReadWriteOnce]
      volumeMode: $mode
      resources: {requests: {storage: $size}}
YAML
    until_ok 60 "db-0 made" 'kn get pod db-0'
    wait_pod_running db-0 180
}

# The claim's size for VELERO_MIB of data, with room for a filesystem's own.
velero_claim_size() { echo "$((VELERO_MIB + VELERO_MIB / 8 + 64))Mi"; }

# write_data MODE: VELERO_MIB of random data into db-0's volume, and prints its SHA-256.
write_data() {
    if [[ $1 == Block ]]; then
        pexec db-0 sh -c "dd if=/dev/urandom of=/dev/xvda bs=1M count=$VELERO_MIB 2>/dev/null && sync"
    else
        pexec db-0 sh -c "mkdir -p /data/dir && echo small > /data/dir/small &&
            dd if=/dev/urandom of=/data/blob bs=1M count=$VELERO_MIB 2>/dev/null && sync"
    fi
    read_checksum "$1"
}
# read_checksum MODE: the SHA-256 of the data write_data wrote, as db-0 reads it now.
read_checksum() {
    if [[ $1 == Block ]]; then
        pexec db-0 sh -c "dd if=/dev/xvda bs=1M count=$VELERO_MIB 2>/dev/null | sha256sum" | cut -d' ' -f1
    else
        pexec db-0 sh -c 'cat /data/dir/small && sha256sum /data/blob' | tr '\n' ' ' | cut -d' ' -f1,2
    fi
}

# velero_wait KIND NAME TIMEOUT: the backup or restore NAME until Completed; any other end fails
# the scenario with Velero's account of it.
velero_wait() {
    local kind=$1 name=$2 limit phase
    limit=$(wait_limit "$3")
    local deadline=$((SECONDS + limit))
    while :; do
        phase=$(k -n "$VELERO_NS" get "$kind" "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
        case $phase in
            Completed) return 0 ;;
            Failed | PartiallyFailed | FailedValidation | FinalizingPartiallyFailed)
                velero "$kind" describe "$name" --details >&2 || true
                velero "$kind" logs "$name" 2>/dev/null | grep -iE 'error|warn' | tail -20 >&2 || true
                fail "$kind $name ended $phase" ;;
        esac
        if ((SECONDS >= deadline)); then
            velero "$kind" describe "$name" --details >&2 || true
            k -n "$VELERO_NS" get datauploads,datadownloads,podvolumebackups,podvolumerestores,pods,pvc -o wide >&2 || true
            fail "timed out after ${limit}s: $kind $name is ${phase:-not started}"
        fi
        sleep 1
    done
}

# velero_backup NAME FLAG...: a backup of the scenario's namespace, until Completed; the backup
# is deleted (with its data in the store) at exit. Sets TOOK to its seconds.
velero_backup() {
    local name=$1 start
    shift
    # Last, once the backup has gone: Velero's record of the namespace's kopia repository, and
    # the repository itself (deleting a backup deletes its kopia snapshot, but the data stays
    # until kopia's maintenance, hours later: 6.6 GB after a day of runs here).
    defer "k -n $VELERO_NS delete backuprepositories -l velero.io/volume-namespace=$NS >/dev/null; store_delete_prefix kopia/$NS/"
    defer "velero backup delete $name --confirm >/dev/null 2>&1; k -n $VELERO_NS wait --for=delete backup/$name --timeout=$(wait_limit 120)s >/dev/null"
    start=$(date +%s.%N)
    velero backup create "$name" --include-namespaces "$NS" "$@" >/dev/null || fail "velero backup create $name failed"
    velero_wait backup "$name" 600
    TOOK=$(elapsed "$start")
}
# velero_restore NAME BACKUP: a restore from BACKUP, until Completed; deleted at exit (the
# restored objects stay: they go with the namespace). Sets TOOK.
velero_restore() {
    local name=$1 backup=$2 start
    defer "velero restore delete $name --confirm >/dev/null 2>&1; k -n $VELERO_NS wait --for=delete restore/$name --timeout=$(wait_limit 120)s >/dev/null"
    start=$(date +%s.%N)
    velero restore create "$name" --from-backup "$backup" >/dev/null || fail "velero restore create $name failed"
    velero_wait restore "$name" 600
    TOOK=$(elapsed "$start")
}
# data_path_seconds RESOURCE SELECTOR: how long Velero's data movements of that kind
# (datauploads, datadownloads, podvolumebackups, podvolumerestores) took, from their start to
# their completion (whole seconds, as Velero records them), space-separated.
data_path_seconds() {
    k -n "$VELERO_NS" get "$1" -l "$2" -o json | python3 -c '
import json, sys
from datetime import datetime
t = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ")
print(" ".join(str(int((t(i["status"]["completionTimestamp"]) - t(i["status"]["startTimestamp"])).total_seconds()))
               for i in json.load(sys.stdin)["items"] if i.get("status", {}).get("completionTimestamp")))'
}
elapsed() { python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$1"; }

# delete_namespace [VOLUMES-STAY]: the scenario's namespace deleted (the disaster), and, unless
# an argument is given (their node is down), its claims' volumes with it.
delete_namespace() {
    local pvs pv
    pvs=$(k get pv -o jsonpath="{range .items[?(@.spec.claimRef.namespace=='$NS')]}{.metadata.name}{'\n'}{end}")
    k delete namespace "$NS" --wait=true --timeout="$(wait_limit 180)s" >/dev/null || fail "namespace $NS not deleted"
    [[ $# -eq 0 ]] || return 0
    for pv in $pvs; do
        k wait --for=delete "pv/$pv" --timeout="$(wait_limit 120)s" >/dev/null || fail "the volume $pv outlived its claim"
    done
}
