# Velero, its AWS plugin and the S3 object store the backup scenarios use, built from their Go
# modules (modules/velero, modules/velero-plugin-for-aws, modules/versitygw) and made into images.
# Sourced by tests/e2e/build (build_velero) and the cluster scripts (velero_image_archives).
#
# Cache layout under $E2E_CACHE (each directory appears whole, renamed from NAME.partial):
#   velero-VERSION/{velero,velero-helper,velero-restore-helper}
#   velero-plugin-for-aws-VERSION/{velero-plugin-for-aws,cp-plugin}
#   versitygw-VERSION/versitygw
#   images-velero-VERSION-RECIPE/image.tar, images-velero-plugin-for-aws-VERSION-RECIPE/image.tar,
#   images-versitygw-VERSION-RECIPE/image.tar    RECIPE: a hash of this file, so that a change in
#                                                how an image is laid out makes it anew
# shellcheck shell=bash

# The version module $2's go.mod requires of module path $1 (our go.mod files pin what is built;
# versions.sh names the same versions, and the build stops if they differ).
module_requires() {
    sed -n "s|^[[:space:]]*\(require[[:space:]]\+\)\{0,1\}$1[[:space:]]\+\(v[^[:space:]]*\).*|\2|p" \
        "$E2E_DIR/modules/$2/go.mod" | head -n1
}
check_module_version() {
    local have
    have=$(module_requires "$1" "$2")
    [[ $have == "$3" ]] || die "modules/$2/go.mod requires $1 $have, versions.sh says $3: make them match"
}

# go_build_main_module OUT MODULEDIR LDFLAGS PACKAGE...: the packages, built as the module in
# tests/e2e/modules/MODULEDIR requires them (its go.sum checked), into directory OUT.
go_build_main_module() {
    local out=$1 dir=$2 ld=$3
    shift 3
    [[ -d $out ]] && return 0
    log "building $(basename "$out") (${*##*/})"
    (cd "$E2E_DIR/modules/$dir" && GOFLAGS="-buildvcs=false -mod=readonly" go_build_into "$out" "$ld" "$@")
}

velero_bin_dir() { echo "$E2E_CACHE/velero-$VELERO_VERSION"; }
velero_plugin_bin_dir() { echo "$E2E_CACHE/velero-plugin-for-aws-$VELERO_AWS_PLUGIN_VERSION"; }
versitygw_bin_dir() { echo "$E2E_CACHE/versitygw-$VERSITYGW_VERSION"; }

build_velero_binaries() {
    check_module_version github.com/vmware-tanzu/velero velero "$VELERO_VERSION"
    check_module_version github.com/vmware-tanzu/velero-plugin-for-aws velero-plugin-for-aws "$VELERO_AWS_PLUGIN_VERSION"
    check_module_version github.com/versity/versitygw versitygw "$VERSITYGW_VERSION"
    # Velero's build stamps its version and the registry of its default images (its Makefile's
    # REGISTRY, "velero"): `velero install` then names velero/velero:VERSION, the image we make.
    local pkg=github.com/vmware-tanzu/velero
    go_build_main_module "$(velero_bin_dir)" velero \
        "-X $pkg/pkg/buildinfo.Version=$VELERO_VERSION -X $pkg/pkg/buildinfo.ImageRegistry=velero -X $pkg/pkg/buildinfo.GitTreeState=clean" \
        "$pkg/cmd/velero" "$pkg/cmd/velero-helper" "$pkg/cmd/velero-restore-helper"
    go_build_main_module "$(velero_plugin_bin_dir)" velero-plugin-for-aws "" \
        github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws \
        github.com/vmware-tanzu/velero-plugin-for-aws/hack/cp-plugin
    go_build_main_module "$(versitygw_bin_dir)" versitygw \
        "-X main.Version=$VERSITYGW_VERSION" github.com/versity/versitygw/cmd/versitygw
}

# The images, laid out as the projects' Dockerfiles lay them out: Velero's binaries at / (its
# pods run /velero, data movers and node-agent included, and restores add an init container
# running /velero-restore-helper); the plugin at /plugins with /bin/cp-plugin as entrypoint,
# which copies it into Velero's plugin directory; versitygw at /usr/local/bin.
velero_recipe_hash() { worktree_hash tests/e2e/lib/build-velero.sh; }
velero_image_keys() {
    local h
    h=$(velero_recipe_hash)
    echo "images-velero-$VELERO_VERSION-$h images-velero-plugin-for-aws-$VELERO_AWS_PLUGIN_VERSION-$h images-versitygw-$VERSITYGW_VERSION-$h"
}
velero_images() {
    local env='"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]' keys key
    read -r -a keys <<<"$(velero_image_keys)"
    # Velero's server runs as the image's user, and kopia writes its configuration under that
    # user's home: Velero's base image has the user cnb (1000) with a home of its own.
    scratch_image "${keys[0]}" fill_velero "$VELERO_IMAGE" \
        "{\"User\":\"1000:1000\",\"Entrypoint\":[\"/velero\"],$env}"
    scratch_image "${keys[1]}" fill_velero_plugin "$VELERO_AWS_PLUGIN_IMAGE" \
        "{\"User\":\"65532:65532\",\"Entrypoint\":[\"cp-plugin\",\"/plugins/velero-plugin-for-aws\",\"/target/velero-plugin-for-aws\"],$env}"
    scratch_image "${keys[2]}" fill_versitygw "$VERSITYGW_IMAGE" \
        "{\"Entrypoint\":[\"/usr/local/bin/versitygw\"],$env}"
    for key in "${keys[@]}"; do
        prune_except "$E2E_CACHE/$key" "$E2E_CACHE/${key%-*}"-*
    done
}
fill_velero() {
    local b
    minimal_etc "$1"
    echo 'cnb:x:1000:1000:cnb:/home/cnb:/sbin/nologin' >>"$1/etc/passwd"
    echo 'cnb:x:1000:' >>"$1/etc/group"
    # oci_archive makes every file root's: the home is writable by all, as /tmp is.
    mkdir -p "$1/home/cnb"
    chmod 1777 "$1/home/cnb"
    for b in velero velero-helper velero-restore-helper; do
        install -m 0755 "$(velero_bin_dir)/$b" "$1/"
    done
}
fill_velero_plugin() {
    minimal_etc "$1"
    install -D -m 0755 "$(velero_plugin_bin_dir)/velero-plugin-for-aws" "$1/plugins/velero-plugin-for-aws"
    install -D -m 0755 "$(velero_plugin_bin_dir)/cp-plugin" "$1/bin/cp-plugin"
}
fill_versitygw() {
    minimal_etc "$1"
    install -D -m 0755 "$(versitygw_bin_dir)/versitygw" "$1/usr/local/bin/versitygw"
}

build_velero() {
    build_velero_binaries
    velero_images
}

# The archives the cluster imports into each node (e2e_image_archives lists them).
velero_image_archives() {
    local key
    for key in $(velero_image_keys); do
        echo "$E2E_CACHE/$key/image.tar"
    done
}
