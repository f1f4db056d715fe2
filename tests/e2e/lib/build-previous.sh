# The previous release, which the upgrade scenario starts from and rolls back to: the tree of
# commit PREVIOUS_RELEASE (versions.sh) as `git archive` gives it, built with that tree's own
# Dockerfile the way stickyvol_image builds today's (buildah, the same cargo caches), into
#   $E2E_CACHE/images-previous-stickyvol-COMMIT12/{image.tar,name,deploy/}
# with that commit's deploy/ beside it (the manifests the upgrade scenario installs first).
# A clone without that commit (a shallow one) builds nothing and says so: the scenario then
# skips, which is coverage lost.
# shellcheck shell=bash

previous_dir() { echo "$E2E_CACHE/images-previous-stickyvol-${PREVIOUS_RELEASE:0:12}"; }
previous_image_name() { echo "stickyvol-e2e/stickyvol:previous-${PREVIOUS_RELEASE:0:12}"; }

build_previous() {
    local out ctx
    out=$(previous_dir)
    [[ -d $out ]] && return 0
    if ! git -C "$REPO_DIR" cat-file -e "$PREVIOUS_RELEASE^{commit}" 2>/dev/null; then
        log "previous release $PREVIOUS_RELEASE: not in this clone (shallow?); the upgrade scenario will skip"
        return 0
    fi
    base_images
    local name
    name=$(normalize_image_name "$(previous_image_name)")
    log "image $name from commit $PREVIOUS_RELEASE"
    bh rm --all >/dev/null
    local cache="$E2E_CACHE/stickyvol-cargo"
    mkdir -p "$cache/registry" "$cache/target-previous"
    rm -rf "$out.partial" && mkdir -p "$out.partial"
    ctx="$E2E_CACHE/.work/previous-context"
    rm -rf "$ctx" && mkdir -p "$ctx"
    git -C "$REPO_DIR" archive "$PREVIOUS_RELEASE" | tar -x -C "$ctx"
    local ca=/etc/ssl/certs/ca-certificates.crt mounts=()
    [[ -f $ca ]] && mounts+=(-v "$ca:$ca:ro")
    # A target directory of its own: in today's, cargo takes the older tree's files (dated by
    # git archive to their commit) for unchanged and keeps today's generated code (seen).
    bh bud --pull=never --isolation=chroot --network=host --format=oci "${mounts[@]}" \
        -v "$cache/registry:/usr/local/cargo/registry" -v "$cache/target-previous:/src/target" \
        -f "$ctx/Dockerfile" -t "$name" "$ctx" >"$out.partial/build.log" 2>&1 ||
        die "buildah bud of $PREVIOUS_RELEASE failed: $(tail -n 20 "$out.partial/build.log")"
    cp -r "$ctx/deploy" "$out.partial/deploy"
    rm -rf "$ctx"
    bh push --quiet "$name" "docker-archive:$out.partial/image.tar:$name"
    bh rmi "$name" >/dev/null
    echo "$name" >"$out.partial/name"
    mv -T "$out.partial" "$out"
    prune_except "$out" "$E2E_CACHE"/images-previous-stickyvol-*
}

# The archive to import, when it was built.
previous_archive() {
    local a
    a="$(previous_dir)/image.tar"
    [[ -f $a ]] && echo "$a"
    return 0
}
