# Monitoring as users run it: a Prometheus server (built from the module tests/monitoring pins)
# scrapes the driver's pods through its Kubernetes service discovery, relabelled as
# deploy/monitoring's PodMonitor does, with deploy/monitoring's rules loaded (their `for:`
# shortened to 10 s: the expressions, labels and annotations are the shipped ones). Node 2's pool
# is filled past 90% (by an emptyDir where it shares kubelet's filesystem) and the scenario
# waits for StickyvolPoolNearlyFull to fire for that node ("measured: ..."), read from
# Prometheus' API; the sidecars' metrics are scraped too (job stickyvol-sidecars); then every
# query of the dashboard is run: each must be accepted, and those about what this cluster has (pools, volumes, calls, journals, the
# drivers) must return data.
source "$(dirname "$0")/../lib/scenario.sh"
source "$E2E_DIR/lib/build-prometheus.sh"

FULL_NODE=${E2E_NODES[1]}
defer 'k -n "$DRIVER_NS" delete role,rolebinding e2e-prometheus --ignore-not-found >/dev/null'

step "Prometheus, scraping the driver's pods"
k -n "$DRIVER_NS" apply -f - >/dev/null <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: e2e-prometheus}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: e2e-prometheus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: e2e-prometheus}
subjects: [{kind: ServiceAccount, name: prometheus, namespace: $NS}]
YAML
kn create serviceaccount prometheus >/dev/null
rules=$(sed -E 's/^([[:space:]]*)for: .*/\1for: 10s/' "$REPO_DIR/deploy/monitoring/stickyvol.rules.yaml")
kn create configmap prometheus \
    --from-literal=stickyvol.rules.yaml="$rules" \
    --from-literal=prometheus.yml="$(cat <<CONFIG
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: [/etc/prometheus/stickyvol.rules.yaml]
scrape_configs:
- job_name: stickyvol
  kubernetes_sd_configs:
  - role: pod
    namespaces: {names: [$DRIVER_NS]}
  relabel_configs:
  - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name], regex: stickyvol, action: keep}
  - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: metrics, action: keep}
  - {source_labels: [__meta_kubernetes_pod_node_name], target_label: node}
  - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_component], target_label: component}
  - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
- job_name: stickyvol-sidecars
  kubernetes_sd_configs:
  - role: pod
    namespaces: {names: [$DRIVER_NS]}
  relabel_configs:
  - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name], regex: stickyvol, action: keep}
  - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: (prov|snap|resizer)-metrics, action: keep}
  - {source_labels: [__meta_kubernetes_pod_node_name], target_label: node}
  - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_component], target_label: component}
  - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
CONFIG
)" >/dev/null
apply <<YAML
apiVersion: v1
kind: Pod
metadata: {name: prometheus}
spec:
  serviceAccountName: prometheus
  nodeSelector: {kubernetes.io/hostname: ${E2E_NODES[0]}}
  terminationGracePeriodSeconds: 1
  containers:
  - name: prometheus
    image: $(prometheus_image_name)
    args: [--config.file=/etc/prometheus/prometheus.yml, --storage.tsdb.path=/data, --web.listen-address=:9090]
    ports: [{containerPort: 9090, name: web}]
    readinessProbe: {httpGet: {path: /-/ready, port: 9090}, periodSeconds: 1}
    volumeMounts: [{name: config, mountPath: /etc/prometheus}, {name: data, mountPath: /data}]
  volumes:
  - {name: config, configMap: {name: prometheus}}
  - {name: data, emptyDir: {}}
YAML
wait_pod_running prometheus 120
# api PATH: Prometheus' HTTP API, through the API server's pod proxy.
api() { k get --raw "/api/v1/namespaces/$NS/pods/prometheus:9090/proxy/api/v1/$1"; }
targets_up() {
    api 'query?query=sum(up%7Bjob%3D%22stickyvol%22%7D)' |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)'
}
drivers=$((${#E2E_NODES[@]} + 1))
until_ok 120 "every driver pod scraped (up == $drivers)" '[[ $(targets_up) == "$drivers" ]]'

step "$FULL_NODE's pool filled past 90%: StickyvolPoolNearlyFull fires"
# Sized from what the pool's filesystem has free now: the fill leaves 7% of it free (the alert
# fires under 10%).
pool=/var/lib/kubelet/volumes/stickyvol.csi.io
read -r total_mib free_mib < <(cluster exec "$FULL_NODE" df -B1M --output=size,avail "$pool" | tail -1)
fill_mib=$((free_mib - total_mib * 7 / 100))
pool_contents() {
    echo "CSIStorageCapacity of $FULL_NODE: $(capacity_of stickyvol "$FULL_NODE"); pool $(cluster exec "$FULL_NODE" df -B1M --output=size,avail "$pool" | tail -1) MiB (size, free)"
    k -n "$DRIVER_NS" exec "$(driver_pod "$FULL_NODE")" -c stickyvol -- stickyvol volumes 2>&1
    k get pv -o wide 2>&1
}
if [[ ${E2E_POOL_FS[1]} == ext4 ]]; then
    # The pool is a directory of the node's kubelet filesystem (versions.sh, E2E_POOL_FS), as
    # most clusters have the default pool: the driver never promises the share kubelet keeps, so
    # no claim takes it past 90%, but what kubelet's own pods write there fills it as well (here
    # an emptyDir), and that is what the alert is for. A small claim keeps a volume of ours there.
    claim fill 64Mi
    apply <<YAML
apiVersion: v1
kind: Pod
metadata: {name: filler}
spec:
  nodeSelector: {kubernetes.io/hostname: $FULL_NODE}
  terminationGracePeriodSeconds: 1
  containers:
  - {name: app, image: $TEST_IMAGE, command: [sh, -c, "sleep 100000"], volumeMounts: [{name: data, mountPath: /data}, {name: scratch, mountPath: /scratch}]}
  volumes:
  - {name: data, persistentVolumeClaim: {claimName: fill}}
  - {name: scratch, emptyDir: {}}
YAML
    fill_file=/scratch/fill
else
    # A pool on a disk of its own: a claim fills it, within the claim's size (no overflow
    # eviction). The scheduler takes the claim only once the node's CSIStorageCapacity says it
    # fits (the provisioner polls every minute).
    claim_mib=$((fill_mib + 32))
    capacity_holds() { (($(to_bytes "$(capacity_of stickyvol "$FULL_NODE")") >= claim_mib << 20)); }
    deadline=$((SECONDS + 150))
    until capacity_holds; do
        ((SECONDS < deadline)) || fail "no capacity of ${claim_mib} MiB on $FULL_NODE after 150 s: $(pool_contents)"
        sleep 2
    done
    claim fill "${claim_mib}Mi"
    pod filler fill "$FULL_NODE"
    fill_file=/data/fill
fi
wait_pod_running filler 120
t0=$(date +%s)
pexec filler dd if=/dev/zero of="$fill_file" bs=1M count="$fill_mib" conv=fsync 2>/dev/null ||
    fail "could not fill the pool with $fill_mib MiB: $(pool_contents)"
firing() {
    api alerts | python3 -c '
import json, sys
for a in json.load(sys.stdin)["data"]["alerts"]:
    l = a["labels"]
    if l.get("alertname") == "StickyvolPoolNearlyFull" and l.get("node") == sys.argv[1] and a["state"] == "firing":
        print(a["annotations"]["summary"]); break
' "$FULL_NODE"
}
until_ok 180 "StickyvolPoolNearlyFull firing for $FULL_NODE" '[[ -n $(firing) ]]'
log "measured: pool filled -> StickyvolPoolNearlyFull firing in $(($(date +%s) - t0)) s (for: 10s, scrape and evaluation every 5 s): $(firing)"

step "the sidecars' metrics scraped, as the PodMonitor does: $FULL_NODE's provisioner made the claim"
# Each node's csi-provisioner and csi-snapshotter, and the controller's csi-resizer.
sidecars=$((${#E2E_NODES[@]} * 2 + 1))
sidecars_up() {
    api 'query?query=sum(up%7Bjob%3D%22stickyvol-sidecars%22%7D)' |
        python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)'
}
until_ok 60 "every sidecar scraped (up == $sidecars)" '[[ $(sidecars_up) == "$sidecars" ]]'
created() {
    api 'query?query=csi_sidecar_operations_seconds_count%7Bjob%3D%22stickyvol-sidecars%22%2Cmethod_name%3D%22%2Fcsi.v1.Controller%2FCreateVolume%22%2Cgrpc_status_code%3D%22OK%22%7D' |
        python3 -c 'import json,sys; print(" ".join(r["metric"]["node"] for r in json.load(sys.stdin)["data"]["result"]))'
}
until_ok 60 "csi-provisioner's CreateVolume counted on $FULL_NODE" '[[ " $(created) " == *" $FULL_NODE "* ]]'
pexec filler rm -f "$fill_file"

step "every query of the dashboard"
python3 - "$REPO_DIR/deploy/monitoring/dashboard.json" >"$E2E_STATE/dashboard-queries" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["panels"]:
    for t in p.get("targets", []):
        e = t["expr"].replace("$node", ".*").replace("$pool", ".*").replace("$__rate_interval", "1m")
        print(p["title"] + "\t" + e)
PY
empty=() required_empty=()
while IFS=$'\t' read -r title expr; do
    answer=$(k get --raw "/api/v1/namespaces/$NS/pods/prometheus:9090/proxy/api/v1/query?query=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$expr")") ||
        fail "the dashboard's query of panel '$title' was refused: $expr"
    n=$(python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["status"]=="success"; print(len(d["data"]["result"]))' <<<"$answer") ||
        fail "the dashboard's query of panel '$title' failed: $answer"
    if ((n == 0)); then
        empty+=("$title")
        # What this cluster certainly has: drivers, pools, volumes, calls, journals.
        case $title in Drivers|Used|Free|Left\ to\ promise|Volumes*|Calls\ by\ method|Journal*|Commits)
            required_empty+=("$title: $expr") ;;
        esac
    fi
done <"$E2E_STATE/dashboard-queries"
log "dashboard: $(wc -l <"$E2E_STATE/dashboard-queries") queries accepted; without data here (nothing of that kind happened on this cluster): ${empty[*]:-none}"
((${#required_empty[@]} == 0)) || fail "queries without data: ${required_empty[*]}"
