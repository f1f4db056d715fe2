# What an operator reaches in the driver's pod: `stickyvol volumes` (through kubectl exec) lists
# the node's volumes with their claims' names, through the admin socket, while the CSI socket
# (which every sidecar shares) does not serve the admin API; the metrics endpoint and the
# livenessprobe's health check answer.
# e2e-lane: volumes
source "$(dirname "$0")/../lib/scenario.sh"

claim listed 1Gi
pod lister listed
wait_pod_running lister
node=$(pod_node lister)
handle=$(k get pv "$(pv_of listed)" -o jsonpath='{.spec.csi.volumeHandle}')
driver=$(ready_driver_pod "$node")

step "stickyvol volumes in the driver's pod on $node"
table=$(k -n "$DRIVER_NS" exec "$driver" -c stickyvol -- stickyvol volumes)
echo "$table" >&2
row=$(grep "^$handle " <<<"$table") || fail "volume $handle is not listed"
[[ $row == *"$NS/listed"* ]] || fail "the row of $handle does not name the claim $NS/listed: $row"

step "the CSI socket, which every sidecar shares, does not serve the admin API"
if refused=$(k -n "$DRIVER_NS" exec "$driver" -c stickyvol -- \
    stickyvol volumes --admin-socket /csi/csi.sock 2>&1); then
    fail "stickyvol volumes was answered on the CSI socket: $refused"
fi
[[ $refused == *"does not serve the admin API"* ]] || fail "on the CSI socket: $refused"

step "metrics and health through the apiserver's pod proxy"
metrics=$(k get --raw "/api/v1/namespaces/$DRIVER_NS/pods/$driver:8080/proxy/metrics") ||
    fail "the metrics endpoint did not answer"
grep -q '^stickyvol_' <<<"$metrics" || fail "no stickyvol_ metric in the metrics"
expect_eq "$(k get --raw "/api/v1/namespaces/$DRIVER_NS/pods/$driver:9898/proxy/healthz")" ok \
    "the livenessprobe's answer"
