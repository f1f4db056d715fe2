#!/usr/bin/env bash
# Installs stickyvol on the cluster the way a user would, with the pool "nvme" that only node 1
# has (see node-init.sh), and waits until the driver runs on every node:
#   install.sh [kustomize]   as README tells: `kubectl apply -k` of deploy/examples/pool-on-some-nodes
#                            (deploy/kubernetes plus that pool) with the component group-snapshots,
#                            then deploy/kubernetes/snapshots;
#   install.sh helm          `helm upgrade --install` of charts/stickyvol with that optional pool
#                            (the chart makes the VolumeSnapshotClass itself), into a namespace
#                            of a user's choosing, stickyvol-system, made by --create-namespace.
# A cluster installed the other way is uninstalled first (once no volume of ours is left).
# Both put in the cluster's snapshot prerequisites (the CRDs and snapshot-controller, which a
# CSI driver does not ship). The images were imported into each node under the names deploy/
# uses, except the sidecars the Go module proxy does not serve, whose stand-ins (versions.sh,
# E2E_STANDIN_IMAGES) replace them as README tells users to change an image: an overlay's
# `images:`, or the chart's values.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$E2E_DIR/lib/pki.sh"
source "$E2E_DIR/lib/controlplane.sh"
export KUBECONFIG=$PKI/admin.kubeconfig
k() { "$K8S_BIN/kubectl" "$@"; }

how=${1:-kustomize}
# Where the helm install goes (a kustomize install goes to deploy/'s namespace, stickyvol).
HELM_NAMESPACE=stickyvol-system
installed_file=$E2E_STATE/installed-with
overlay=$E2E_STATE/deploy-overlay

kustomize_overlay() {
    mkdir -p "$overlay"
    {
        echo "apiVersion: kustomize.config.k8s.io/v1beta1"
        echo "kind: Kustomization"
        echo "resources: [$(realpath --relative-to="$overlay" "$REPO_DIR/deploy/examples/pool-on-some-nodes")]"
        echo "components: [$(realpath --relative-to="$overlay" "$REPO_DIR/deploy/components/group-snapshots")]"
        echo "images:"
        for mapping in "${E2E_STANDIN_IMAGES[@]}"; do
            new=${mapping#*=}
            echo "- {name: ${mapping%%=*}, newName: ${new%:*}, newTag: ${new##*:}}"
        done
    } >"$overlay/kustomization.yaml"
}

# The chart's values key for sidecar image $1 (a deploy/ image name without its tag).
chart_sidecar_key() {
    case ${1##*/} in
        csi-node-driver-registrar) echo nodeDriverRegistrar ;;
        livenessprobe) echo livenessProbe ;;
        *) die "no chart value for the image $1" ;;
    esac
}

helm_install() {
    local helm sets=() mapping
    helm=$("$REPO_DIR/tests/chart/helm")
    for mapping in "${E2E_STANDIN_IMAGES[@]}"; do
        sets+=(--set "sidecars.$(chart_sidecar_key "${mapping%%=*}").image=${mapping#*=}")
    done
    "$helm" upgrade --install stickyvol "$REPO_DIR/charts/stickyvol" \
        --namespace "$HELM_NAMESPACE" --create-namespace \
        --set 'optionalPools[0].name=nvme,optionalPools[0].path=/mnt/disks/nvme/stickyvol,optionalPools[0].hostPath=/mnt/disks' \
        --set snapshots.groupSnapshots=true "${sets[@]}" >/dev/null
}

# Removes an installation made the other way, after the volumes of ours are gone (their
# deletion needs the driver).
uninstall_other() {
    local was
    was=$(cat "$installed_file" 2>/dev/null || echo none)
    [[ $was == none || $was == "$how" ]] && return 0
    log "stickyvol was installed with $was: waiting for its volumes to go, then uninstalling it"
    local deadline=$((SECONDS + 300))
    while k get pv -o jsonpath='{range .items[*]}{.spec.csi.driver}{"\n"}{end}' | grep -qx stickyvol.csi.io; do
        ((SECONDS < deadline)) || die "volumes of stickyvol.csi.io still exist after 300 s: $(k get pv --no-headers)"
        sleep 2
    done
    case $was in
        kustomize)
            k delete -k "$REPO_DIR/deploy/kubernetes/snapshots" --ignore-not-found --wait >/dev/null
            k delete -k "$overlay" --ignore-not-found --wait --timeout=300s >/dev/null ;;
        helm)
            "$("$REPO_DIR/tests/chart/helm")" uninstall stickyvol --namespace "$HELM_NAMESPACE" --wait --timeout 300s >/dev/null
            k delete namespace "$HELM_NAMESPACE" --ignore-not-found --wait --timeout=300s >/dev/null ;;
    esac
    rm -f "$installed_file"
}

# rolled_out NAMESPACE KIND/NAME: waits up to 300 s for the rollout. One that does not finish
# fails the install after printing what the cluster shows (nodes, pods, recent events, the
# not-ready pods' descriptions and logs), so a red run names its cause.
rolled_out() {
    local ns=$1 what=$2 pod
    k -n "$ns" rollout status "$what" --timeout=300s >/dev/null && return 0
    log "$what in $ns not rolled out after 300 s; what the cluster shows:"
    {
        k get nodes -o wide
        k get pods -A -o wide
        k get events -A --sort-by=.lastTimestamp | tail -40
        for pod in $(k -n "$ns" get pods --no-headers | awk '{split($2, n, "/"); if (n[1] != n[2]) print $1}'); do
            k -n "$ns" describe pod "$pod" | tail -40
            k -n "$ns" logs "$pod" --all-containers --prefix --tail=40
        done
    } >&2 2>&1 || true
    die "$what in $ns did not roll out in 300 s"
}

uninstall_other
k apply -f "$E2E_CACHE/snapshot-crds-$SNAPSHOT_CLIENT_VERSION/" >/dev/null
k wait --for=condition=Established crd --all --timeout=60s >/dev/null
k apply -f "$E2E_DIR/manifests/snapshot-controller.yaml" >/dev/null
case $how in
    kustomize)
        kustomize_overlay
        k apply -k "$overlay" >/dev/null
        k apply -k "$REPO_DIR/deploy/kubernetes/snapshots" >/dev/null ;;
    helm) helm_install ;;
    *) die "install.sh: kustomize or helm, not $how" ;;
esac
echo "$how" >"$installed_file"
driver_ns=stickyvol
[[ $how == helm ]] && driver_ns=$HELM_NAMESPACE
rolled_out "$driver_ns" daemonset/stickyvol-node
rolled_out "$driver_ns" statefulset/stickyvol-controller
rolled_out kube-system deployment/snapshot-controller
log "stickyvol installed with $how and running on every node"
