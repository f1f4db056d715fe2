#!/usr/bin/env bash
# The pod-start benchmark: brings the cluster up and stickyvol in (as `tests/e2e/run` does),
# then, for each batch size N (default 20 and 100), starts N pods at once, each with a claim of
# the WaitForFirstConsumer class stickyvol (the claims applied just before), and the same pods
# with emptyDir (the baseline), and
# reports start and deletion times (lib/pod_start.py). Other drivers installed in the cluster
# are measured too when E2E_POD_START_CLASSES names their StorageClasses (peers are built and
# installed outside the repository). Ends with
# "pod start p50: stickyvol X ms, emptyDir Y ms, ratio Z" for the last N. A benchmark: it
# fails only when a pod does not start or go.
#
#   tests/e2e/run pod-start [N...]        E2E_POD_START_ROUNDS=R: R interleaved rounds per N
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$E2E_DIR/lib/pki.sh"
source "$E2E_DIR/lib/controlplane.sh"

counts=("$@")
[[ ${#counts[@]} -gt 0 ]] || counts=(20 100)
"$E2E_DIR/cluster" up >/dev/null
"$E2E_DIR/lib/install.sh" kustomize
# shellcheck disable=SC2086
KUBECONFIG=$PKI/admin.kubeconfig python3 "$E2E_DIR/lib/pod_start.py" "$K8S_BIN/kubectl" \
    pod-start "$PAUSE_IMAGE" "$(IFS=,; echo "${counts[*]}")" emptyDir stickyvol \
    ${E2E_POD_START_CLASSES:-}
