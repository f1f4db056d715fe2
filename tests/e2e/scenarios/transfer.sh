# A volume's data copied straight from one node's plugin to the other's (docs/operations/moving.md,
# "Moving a volume to another node"): a claim written on one node, two empty claims on the
# other. Into the first, `stickyvol volume pull` in the target node's driver pod: refused while
# the source's PV does not name the target node in stickyvol.csi.io/move-to, then the same bytes
# arrive over TLS from the source node's plugin, never through the API server. Into the second,
# a pull asked for on its PV (stickyvol.csi.io/pull-to and pull-from, as a move asks), its
# result written back there.
# e2e-lane: growth
source "$(dirname "$0")/../lib/scenario.sh"

claim source 64Mi
pod writer source "" "cd /data && dd if=/dev/urandom of=blob bs=1M count=24 2>/dev/null && mkdir -p tree/deep && echo kept > tree/deep/note && sha256sum blob > sum && sync && sleep 100000"
wait_pod_running writer
node=$(pod_node writer)
other=$(other_node "$node")
claim target 64Mi
claim asked 64Mi
pod holder target "$other"
pod asker asked "$other"
wait_pod_running holder
wait_pod_running asker
until_true 60 "the writer wrote" pexec writer test -s /data/sum
sum=$(pexec writer cat /data/sum)
# An export (and an import) takes an unpublished volume where the pool has no cheap snapshots.
kn delete pod writer holder asker --wait=true --timeout=60s >/dev/null
source_pv=$(pv_of source)
target_id=$(k get pv "$(pv_of target)" -o jsonpath='{.spec.csi.volumeHandle}')
pull() {
    k -n "$DRIVER_NS" exec "$(ready_driver_pod "$other")" -c stickyvol -- \
        stickyvol volume pull "$target_id" --from "$source_pv" 2>&1
}

step "refused while the source's PV does not name $other"
if out=$(pull); then
    fail "pulled without stickyvol.csi.io/move-to: $out"
fi
[[ $out == *"is not to move"* ]] || fail "refused, but not for the annotation: $out"

step "pulled from $node's plugin once the PV names $other"
k annotate pv "$source_pv" "stickyvol.csi.io/move-to=$other" >/dev/null
out=$(pull) || fail "the pull failed: $out"
[[ $out == *"from PV $source_pv on node $node into $target_id, sha256 "* ]] || fail "the pull said: $out"
# The source logs once its stream is closed, which may be just after the target has it all.
until_ok 30 "the source's plugin logged the transfer" \
    'k -n "$DRIVER_NS" logs "$(ready_driver_pod "$node")" -c stickyvol | grep -q "transfer: volume sent"'

step "a pull asked for on the target's PV"
asked_pv=$(pv_of asked)
k annotate pv "$asked_pv" "stickyvol.csi.io/pull-from=$source_pv" >/dev/null
k label pv "$asked_pv" "stickyvol.csi.io/pull-to=$other" >/dev/null
result() { k get pv "$asked_pv" -o jsonpath='{.metadata.annotations.stickyvol\.csi\.io/pull-result}'; }
until_ok 60 "the pull's result on PV $asked_pv" '[[ -n $(result) ]]'
[[ $(result) == *'"sha256":"'* ]] || fail "the pull asked on the PV failed: $(result)"
[[ -z $(k get pv "$asked_pv" -o jsonpath='{.metadata.labels.stickyvol\.csi\.io/pull-to}') ]] ||
    fail "the pull-to label stayed on PV $asked_pv"

step "the data arrived whole, both ways"
pod reader target "$other"
pod reader2 asked "$other"
wait_pod_running reader
wait_pod_running reader2
for p in reader reader2; do
    expect_eq "$(pexec "$p" sh -c 'cd /data && sha256sum blob')" "$sum" "the copy's checksum ($p)"
    expect_eq "$(pexec "$p" cat /data/tree/deep/note)" kept "a file deep in the tree ($p)"
done
