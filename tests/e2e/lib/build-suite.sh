# Kubernetes' external storage tests (tests/e2e/run kubernetes-suite): the test binary, ginkgo
# and agnhost from the k8s.io/kubernetes module, and the test images they need. Sourced by
# tests/e2e/build (build_suite) and by lib/kubernetes-suite.sh.
#
# Cache layout under $E2E_CACHE:
#   suite-KUBEVERSION-SRCHASH/{storage.test,ginkgo,agnhost,images}   SRCHASH of modules/kubernetes;
#                                            images: the test images' names, one per line
#   images-suite-BASE-NAME-TAG/image.tar     each test image (NAME without its registry; BASE
#                                            busybox or debian, see suite_images)
#   images-suite-standin-NAME-TAG-SRCHASH/image.tar   our stand-ins (SUITE_STANDINS), SRCHASH of
#                                            tests/e2e/standins as for the sidecars' stand-ins
# shellcheck shell=bash

suite_dir() { echo "$E2E_CACHE/suite-$KUBE_VERSION-$(worktree_hash tests/e2e/modules/kubernetes)"; }

# The images the storage tests run, of those `storage.test --list-images` names: busybox (most
# pods), agnhost (subPath, volume content), nginx (the exec test, a shell script) and
# glibc-dns-testing (the pods of the concurrent-access tests, shell loops; jessie-dnsutils in
# Kubernetes 1.35 and before). pause is the cluster's sandbox image already. The others are for
# tests outside the storage suite.
SUITE_IMAGES_RE='^registry\.k8s\.io/e2e-test-images/(busybox|agnhost|nginx|glibc-dns-testing|jessie-dnsutils):'

# Images the tests' own manifests name, which --list-images does not: "should provision storage
# with any volume data source" deploys a volume populator from
# test/e2e/testing-manifests/storage-csi/any-volume-datasource. The Go module proxy serves no
# version of its module (github.com/kubernetes-csi/lib-volume-populator), so the image is a
# stand-in of ours (tests/e2e/standins), made under the name the manifest gives, which the test
# applies as it is. The same manifests run volume-data-source-validator with imagePullPolicy
# Always: no image made here could start (kubelet pulls first, and cannot reach the registry), and
# the test does not wait for it or read what it does (events on claims whose data source no
# VolumePopulator registers), so there is none.
# Image | package dir in tests/e2e/standins | the manifest (in k8s.io/kubernetes) that names it.
SUITE_STANDINS=(
    "registry.k8s.io/sig-storage/hello-populator:v1.0.1 hello-populator test/e2e/testing-manifests/storage-csi/any-volume-datasource/hello-populator-deploy.yaml"
)

build_suite() {
    local out
    out=$(suite_dir)
    if [[ ! -d $out ]]; then
        log "building Kubernetes $KUBE_VERSION's storage tests, ginkgo and agnhost (cold: about 15 minutes on 2 cores)"
        rm -rf "$out.partial" && mkdir -p "$out.partial"
        (
            cd "$E2E_DIR/modules/kubernetes"
            export GOFLAGS="${GOFLAGS:-} -modfile=$KUBE_MODFILE"
            go test -c -vet=off -trimpath -ldflags "-s -w" -o "$out.partial/storage.test" ./storagesuite
            go build -trimpath -ldflags "-s -w" -o "$out.partial/" \
                github.com/onsi/ginkgo/v2/ginkgo k8s.io/kubernetes/test/images/agnhost
        )
        mv -T "$out.partial" "$out"
        prune_except "$out" "$E2E_CACHE/suite-$KUBE_VERSION"-*
    fi
    # Listed again each time (a second): the list follows SUITE_IMAGES_RE, not the cache.
    "$out/storage.test" --list-images | grep -E "$SUITE_IMAGES_RE" >"$out/images"
    suite_images "$out"
    suite_standin_images
}

# One image per name in $1/images, made here: the upstream images come from registries these
# machines cannot reach. Each holds what the tests run in it:
#   busybox, nginx      Debian's static busybox (build-images.sh): sh, dd, ls, ...
#   agnhost             the same, plus agnhost at /agnhost, its entrypoint, as its Dockerfile has it
#   glibc-dns-testing   Debian bookworm minbase: GNU coreutils, whose dd has oflag=nocache
#   (jessie-dnsutils)   (busybox's has not; the concurrent-access tests write with it)
suite_images() {
    local dir=$1 name key env='"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]'
    while read -r name; do
        key=$(suite_image_key "$name")
        case $name in
            */agnhost:*)
                AGNHOST_BIN=$dir/agnhost scratch_image "$key" fill_agnhost "$name" "{\"Entrypoint\":[\"/agnhost\"],$env}" ;;
            */glibc-dns-testing:* | */jessie-dnsutils:*)
                scratch_image "$key" fill_debian_slim "$name" "{\"Cmd\":[\"bash\"],$env}" ;;
            *)
                scratch_image "$key" fill_busybox "$name" "{\"Cmd\":[\"sh\"],$env}" ;;
        esac
    done <"$dir/images"
}
# Our stand-ins' images (SUITE_STANDINS), from the binaries build_standins makes. build_images
# makes them too, so that a cluster brought up after the suite's build (which imports them,
# suite_image_archives) finds them whatever was built first.
suite_standin_images() {
    local s name pkg manifest src bin
    src=$(go_module_dir k8s.io/kubernetes "$KUBE_VERSION")
    build_standins
    for s in "${SUITE_STANDINS[@]}"; do
        read -r name pkg manifest <<<"$s"
        grep -qE "^[[:space:]]*image:[[:space:]]*$name[[:space:]]*\$" "$src/$manifest" ||
            die "Kubernetes $KUBE_VERSION's $manifest does not run $name: update SUITE_STANDINS in build-suite.sh"
        bin="$E2E_CACHE/sidecars-standins-$(standins_hash)/$pkg"
        [[ -x $bin ]] || die "no $bin: run build sidecars"
        SIDECAR_BIN=$bin scratch_image "$(suite_standin_key "$name")" fill_sidecar "$name" \
            "{\"Entrypoint\":[\"/$pkg\"],\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"]}"
        prune_except "$E2E_CACHE/$(suite_standin_key "$name")" "$E2E_CACHE/$(suite_standin_key "$name" "")"-*
    done
}
# The cache key of stand-in image $1; with a second argument, that instead of the source's hash.
suite_standin_key() {
    local key="images-suite-standin-${1##*/}-${2-$(standins_hash)}"
    key=${key//:/-}
    echo "${key%-}"
}

# The cache key of test image $1: its name and what it is made of.
suite_image_key() {
    local base=busybox key
    [[ $1 == */glibc-dns-testing:* || $1 == */jessie-dnsutils:* ]] && base=debian
    key="images-suite-$base-${1##*/}"
    echo "${key//:/-}"
}
fill_agnhost() {
    fill_busybox "$1"
    install -m 0755 "$AGNHOST_BIN" "$1/agnhost"
}

# The test images' archives, when the suite is built (e2e_image_archives lists them too, so a
# cluster brought up after the build has them).
suite_image_archives() {
    local dir name
    dir=$(suite_dir)
    [[ -f $dir/images ]] || return 0
    while read -r name; do
        echo "$E2E_CACHE/$(suite_image_key "$name")/image.tar"
    done <"$dir/images"
    local s
    for s in "${SUITE_STANDINS[@]}"; do
        echo "$E2E_CACHE/$(suite_standin_key "${s%% *}")/image.tar"
    done
}
