#!/usr/bin/env bash
# Installs stickyvol the way README tells a user to: `kubectl apply -k deploy/kubernetes`, then
# the cluster's snapshot prerequisites (the CRDs and snapshot-controller, which a CSI driver does
# not ship) and deploy/kubernetes/snapshots. The images were imported into each node under the
# names deploy/ uses, so nothing in deploy/ is changed. Waits until the driver runs on every node.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$E2E_DIR/lib/pki.sh"
source "$E2E_DIR/lib/controlplane.sh"
export KUBECONFIG=$PKI/admin.kubeconfig
k() { "$K8S_BIN/kubectl" "$@"; }

k apply -k "$REPO_DIR/deploy/kubernetes" >/dev/null
k apply -f "$E2E_CACHE/snapshot-crds-$SNAPSHOT_CLIENT_VERSION/" >/dev/null
k wait --for=condition=Established crd --all --timeout=60s >/dev/null
k apply -f "$E2E_DIR/manifests/snapshot-controller.yaml" >/dev/null
k apply -k "$REPO_DIR/deploy/kubernetes/snapshots" >/dev/null
k -n stickyvol rollout status daemonset/stickyvol-node --timeout=300s >/dev/null
k -n stickyvol rollout status statefulset/stickyvol-controller --timeout=300s >/dev/null
k -n kube-system rollout status deployment/snapshot-controller --timeout=300s >/dev/null
log "stickyvol installed and running on every node"
