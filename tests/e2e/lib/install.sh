#!/usr/bin/env bash
# Installs stickyvol the way README tells a user to: `kubectl apply -k` of deploy/kubernetes,
# through deploy/examples/pool-on-some-nodes (deploy/kubernetes as it is, plus the pool "nvme"
# that only node 1 has, see node-init.sh), then the cluster's snapshot prerequisites (the CRDs and snapshot-controller, which a CSI driver
# does not ship) and deploy/kubernetes/snapshots. The images were imported into each node under
# the names deploy/ uses, except the sidecars the Go module proxy does not serve, whose stand-ins
# (versions.sh, E2E_STANDIN_IMAGES) are put in with an overlay's `images:`, the way README tells
# users to change an image. Waits until the driver runs on every node.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$E2E_DIR/lib/pki.sh"
source "$E2E_DIR/lib/controlplane.sh"
export KUBECONFIG=$PKI/admin.kubeconfig
k() { "$K8S_BIN/kubectl" "$@"; }

overlay=$E2E_STATE/deploy-overlay
mkdir -p "$overlay"
{
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources: [$(realpath --relative-to="$overlay" "$REPO_DIR/deploy/examples/pool-on-some-nodes")]"
    echo "images:"
    for mapping in "${E2E_STANDIN_IMAGES[@]}"; do
        new=${mapping#*=}
        echo "- {name: ${mapping%%=*}, newName: ${new%:*}, newTag: ${new##*:}}"
    done
} >"$overlay/kustomization.yaml"
k apply -k "$overlay" >/dev/null
k apply -f "$E2E_CACHE/snapshot-crds-$SNAPSHOT_CLIENT_VERSION/" >/dev/null
k wait --for=condition=Established crd --all --timeout=60s >/dev/null
k apply -f "$E2E_DIR/manifests/snapshot-controller.yaml" >/dev/null
k apply -k "$REPO_DIR/deploy/kubernetes/snapshots" >/dev/null
k -n stickyvol rollout status daemonset/stickyvol-node --timeout=300s >/dev/null
k -n stickyvol rollout status statefulset/stickyvol-controller --timeout=300s >/dev/null
k -n kube-system rollout status deployment/snapshot-controller --timeout=300s >/dev/null
log "stickyvol installed and running on every node"
