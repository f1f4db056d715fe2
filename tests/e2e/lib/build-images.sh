# The cluster suite's container images, the sidecar binaries they hold and the snapshot CRDs.
# Sourced by tests/e2e/build (build_debs, build_sidecars, build_crds, build_images) and by the
# cluster scripts (e2e_import_images ADDRESS).
#
# Cache layout under $E2E_CACHE (a directory appears whole, renamed from NAME.partial, so its
# presence means done; a name file in each images-*/base-* holds the image's name):
#   sidecars-NAME-TAG/BINARY                 NAME and TAG as deploy/ names the image
#   sidecars-standins-SRCHASH/{node-driver-registrar,livenessprobe,hello-populator}
#   snapshot-crds-TAG/*.yaml                 csi-snapshotter's TAG
#   images-NAME-TAG/image.tar                sidecars (and snapshot-controller), OCI archives
#   images-standin-NAME-SRCHASH/image.tar
#   images-pause-TAG/image.tar, images-busybox-DEBVERSION/image.tar
#   images-stickyvol-SRCHASH/image.tar       docker-archive from buildah; SRCHASH of git's index
#                                            entries of Cargo.*, build.rs, src, proto, Dockerfile
#   base-debian-bookworm-slim/image.tar, base-rust-RUSTVERSION-slim-bookworm/image.tar
#   buildah/ (its store: the base images), stickyvol-cargo/ (cargo registry and target),
#   debootstrap-debs/ (downloaded .debs)
# shellcheck shell=bash

SIDECAR_REGISTRY=registry.k8s.io/sig-storage

# Image name | Go module | main package dir. The version is the tag deploy/ gives the image
# (snapshot-controller: csi-snapshotter's, they are one module).
SIDECARS=(
    "csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 cmd/csi-provisioner"
    "csi-snapshotter github.com/kubernetes-csi/external-snapshotter/v8 cmd/csi-snapshotter"
    "snapshot-controller github.com/kubernetes-csi/external-snapshotter/v8 cmd/snapshot-controller"
    "csi-resizer github.com/kubernetes-csi/external-resizer/v2 cmd/csi-resizer"
)
# node-driver-registrar and livenessprobe: the Go module proxy serves no version of
# github.com/kubernetes-csi/node-driver-registrar or .../livenessprobe (403 "not available", also
# for their tags' pseudo-versions), so the cluster runs our stand-ins (tests/e2e/standins) under
# names of their own, which E2E_STANDIN_IMAGES (versions.sh) maps deploy/'s names to.
# Image name (after E2E_STANDIN_IMAGES) | package dir in tests/e2e/standins.
STANDINS=(
    "csi-node-driver-registrar node-driver-registrar"
    "livenessprobe livenessprobe"
)

apt_install_missing() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# What the whole suite needs on the host. xfsprogs and e2fsprogs make the nodes' disks (a fresh
# machine has neither mkfs.xfs nor, always, mkfs.ext4: .ci/run installs them before the tests,
# but tests/e2e/matrix run alone stopped at the first node's disk).
build_debs() {
    apt_install_missing containerd runc containernetworking-plugins buildah debootstrap \
        busybox-static iproute2 openssl gcc libc6-dev ca-certificates xfsprogs e2fsprogs
}

# The tag deploy/kubernetes gives image $1; exactly one, or we stop.
deploy_image_tag() {
    local tags
    tags=$(grep -rhoE "$SIDECAR_REGISTRY/$1:[^[:space:]\"']+" "$REPO_DIR/deploy/kubernetes" \
        | sed 's/.*://' | sort -u || true)
    [[ -n $tags && $tags != *$'\n'* ]] ||
        die "deploy/kubernetes names $SIDECAR_REGISTRY/$1 with tags '${tags//$'\n'/ }': want exactly one"
    echo "$tags"
}

sidecar_tag() {
    case $1 in
        snapshot-controller) deploy_image_tag csi-snapshotter ;;
        *) deploy_image_tag "$1" ;;
    esac
}

# The module version that holds tag $2 of sidecar $1.
sidecar_module_version() {
    case $1:$2 in
        # The module proxy lacks v2.2.1, whose only change from v2.2.0 is its go.mod's
        # golang.org/x requirements (see sidecar_extra_requires): v2.2.0 is built with them.
        csi-resizer:v2.2.1) echo v2.2.0 ;;
        *) echo "$2" ;;
    esac
}

# Requirements a tag has beyond the module version we download (see sidecar_module_version).
sidecar_extra_requires() {
    case $1:$2 in
        csi-resizer:v2.2.1)
            echo golang.org/x/crypto@v0.53.0 golang.org/x/net@v0.55.0 golang.org/x/sync@v0.21.0 \
                golang.org/x/sys@v0.46.0 golang.org/x/term@v0.44.0 golang.org/x/text@v0.38.0 ;;
    esac
}

# Directory of module $1@$2 in the module cache, downloaded from the proxy if needed.
go_module_dir() {
    local json dir
    json=$(cd / && GOFLAGS=-mod=mod go mod download -json "$1@$2" 2>&1 || true)
    dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
    [[ -n $dir && -d $dir ]] || die "go mod download $1@$2 failed: $(sed -n 's/^[[:space:]]*"Error": //p' <<<"$json")"
    echo "$dir"
}

# A writable copy of module $1@$2 at $3, buildable as its own main module (module zips leave out
# nested modules: external-snapshotter's ./client replace target is its client/v8 module).
go_module_copy() {
    local mod=$1 ver=$2 dst=$3 src
    src=$(go_module_dir "$mod" "$ver")
    rm -rf "$dst" && mkdir -p "$(dirname "$dst")"
    cp -r "$src" "$dst" && chmod -R u+w "$dst"
    if grep -qE '^replace .*=> \./client$' "$dst/go.mod"; then
        cp -r "$(go_module_dir "${mod%/v*}/client/${mod##*/}" "$ver")" "$dst/client"
        chmod -R u+w "$dst/client"
    fi
}

build_sidecar() {
    local name=$1 mod=$2 pkg=$3 tag modver req work
    tag=$(sidecar_tag "$name")
    local out="$E2E_CACHE/sidecars-$name-$tag"
    [[ -d $out ]] && return 0
    modver=$(sidecar_module_version "$name" "$tag")
    log "building $name $tag ($mod@$modver)"
    work="$E2E_CACHE/.work/src-$name-$tag"
    go_module_copy "$mod" "$modver" "$work"
    local mode=-mod=mod
    [[ -d $work/vendor ]] && mode=-mod=vendor
    (
        cd "$work"
        export GOFLAGS="-buildvcs=false $mode"
        for req in $(sidecar_extra_requires "$name" "$tag"); do
            go mod edit -require="$req"
        done
        go_build_into "$out" "-X main.version=$tag" "./$pkg"
    )
    rm -rf "$work"
}

# Hash of paths $@ of the repo as they are in the work tree (committed or not).
worktree_hash() {
    (
        cd "$REPO_DIR"
        git ls-files -s -- "$@"
        git diff HEAD --binary -- "$@"
        git ls-files -z -o --exclude-standard -- "$@" | xargs -0 -r sha256sum
    ) | sha256sum | cut -c1-16
}

standins_hash() { worktree_hash tests/e2e/standins; }

build_standins() {
    local hash pkgs=() s
    hash=$(standins_hash)
    local out="$E2E_CACHE/sidecars-standins-$hash"
    [[ -d $out ]] && return 0
    log "building the stand-ins (tests/e2e/standins, $hash)"
    for s in "${STANDINS[@]}"; do
        pkgs+=("./${s##* }")
    done
    # And those of the storage tests' images (build-suite.sh).
    for s in "${SUITE_STANDINS[@]}"; do
        read -r _ s _ <<<"$s"
        pkgs+=("./$s")
    done
    (cd "$E2E_DIR/standins" && GOFLAGS="-buildvcs=false -mod=readonly" \
        go_build_into "$out" "-X main.version=standin-$hash" "${pkgs[@]}")
    prune_except "$out" "$E2E_CACHE"/sidecars-standins-*
}

# The image the cluster runs in place of deploy/'s $SIDECAR_REGISTRY/$1 (E2E_STANDIN_IMAGES).
standin_image() {
    local m
    for m in "${E2E_STANDIN_IMAGES[@]}"; do
        [[ ${m%%=*} == "$SIDECAR_REGISTRY/$1" ]] && { echo "${m#*=}"; return 0; }
    done
    die "E2E_STANDIN_IMAGES (versions.sh) maps no image to $SIDECAR_REGISTRY/$1"
}

build_sidecars() {
    local s
    for s in "${SIDECARS[@]}"; do
        # shellcheck disable=SC2086
        build_sidecar $s
    done
    build_standins
}

# The snapshot.storage.k8s.io and groupsnapshot.storage.k8s.io CRDs of the client module at
# csi-snapshotter's version (the cluster's snapshot-controller and csi-snapshotter run with
# CSIVolumeGroupSnapshot, which waits for the group ones).
build_crds() {
    local tag src
    tag=$(sidecar_tag csi-snapshotter)
    [[ ${SNAPSHOT_CLIENT_VERSION:-$tag} == "$tag" ]] ||
        die "versions.sh has SNAPSHOT_CLIENT_VERSION=$SNAPSHOT_CLIENT_VERSION, deploy/ csi-snapshotter $tag"
    local out="$E2E_CACHE/snapshot-crds-$tag"
    [[ -e $out/groupsnapshot.storage.k8s.io_volumegroupsnapshotcontents.yaml ]] && return 0
    rm -rf "$out"
    src=$(go_module_dir github.com/kubernetes-csi/external-snapshotter/client/v8 "$tag")
    rm -rf "$out.partial" && mkdir -p "$out.partial"
    cp "$src"/config/crd/snapshot.storage.k8s.io_*.yaml "$src"/config/crd/groupsnapshot.storage.k8s.io_*.yaml \
        "$out.partial/"
    chmod 0644 "$out.partial"/*.yaml
    mv -T "$out.partial" "$out"
}

# --- Images -----------------------------------------------------------------------------------

# Writes $1, an OCI image archive (`ctr images import` and `buildah pull oci-archive:` read it)
# named $2, of one uncompressed layer holding the tree $3, with $4 as the image config's "config"
# (JSON). Files are owned by root and dated 1970, so the same tree gives the same digests.
oci_archive() {
    local out=$1 name=$2 rootfs=$3 config=$4 d layer_digest layer_size cfg cfg_digest manifest
    d="$out.layout"
    rm -rf "$d" && mkdir -p "$d/blobs/sha256"
    tar -C "$rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$d/layer" .
    layer_digest=$(sha256sum <"$d/layer" | cut -d' ' -f1)
    layer_size=$(stat -c %s "$d/layer")
    mv "$d/layer" "$d/blobs/sha256/$layer_digest"
    cfg=$(printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$config" "$layer_digest")
    cfg_digest=$(printf %s "$cfg" | sha256sum | cut -d' ' -f1)
    printf %s "$cfg" >"$d/blobs/sha256/$cfg_digest"
    manifest=$(printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%d}]}' \
        "$cfg_digest" "${#cfg}" "$layer_digest" "$layer_size")
    local m_digest
    m_digest=$(printf %s "$manifest" | sha256sum | cut -d' ' -f1)
    printf %s "$manifest" >"$d/blobs/sha256/$m_digest"
    # containerd takes the name from io.containerd.image.name (ref.name alone would get a prefix).
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$m_digest" "${#manifest}" "$name" "${name##*:}" >"$d/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$d/oci-layout"
    tar -C "$d" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out" oci-layout index.json blobs
    rm -rf "$d"
}

# Image name $1 as containerd's CRI looks it up (docker.io/ and library/ made explicit): ctr keeps
# an OCI archive's name as written, and kubelet asks for the normalized one.
normalize_image_name() {
    local first=${1%%/*}
    if [[ $1 != */* ]]; then
        echo "docker.io/library/$1"
    elif [[ $first == *.* || $first == *:* || $first == localhost ]]; then
        echo "$1"
    else
        echo "docker.io/$1"
    fi
}

# /etc/passwd, /etc/group and /tmp, as distroless/static has them, in rootfs $1.
minimal_etc() {
    mkdir -p "$1/etc" "$1/tmp"
    chmod 1777 "$1/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$1/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$1/etc/group"
}

# Builds $E2E_CACHE/$1/image.tar unless there: runs "$2" with the rootfs directory to fill, then
# packs it as image $3 with config $4.
scratch_image() {
    local key=$1 fill=$2 name config=$4
    name=$(normalize_image_name "$3")
    local out="$E2E_CACHE/$key"
    [[ -d $out ]] && return 0
    log "image $name"
    rm -rf "$out.partial" && mkdir -p "$out.partial/rootfs"
    "$fill" "$out.partial/rootfs"
    oci_archive "$out.partial/image.tar" "$name" "$out.partial/rootfs" "$config"
    rm -rf "$out.partial/rootfs"
    echo "$name" >"$out.partial/name"
    mv -T "$out.partial" "$out"
}

sidecar_images() {
    local s name tag bin
    for s in "${SIDECARS[@]}"; do
        name=${s%% *}
        tag=$(sidecar_tag "$name")
        bin="$E2E_CACHE/sidecars-$name-$tag/$(basename "${s##* }")"
        [[ -x $bin ]] || die "no $bin: run build sidecars"
        SIDECAR_BIN=$bin scratch_image "images-$name-$tag" fill_sidecar "$SIDECAR_REGISTRY/$name:$tag" \
            "{\"Entrypoint\":[\"/${bin##*/}\"],\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"]}"
    done
}
standin_images() {
    local s name hash bin
    hash=$(standins_hash)
    for s in "${STANDINS[@]}"; do
        name=${s%% *}
        bin="$E2E_CACHE/sidecars-standins-$hash/${s##* }"
        [[ -x $bin ]] || die "no $bin: run build sidecars"
        SIDECAR_BIN=$bin scratch_image "images-standin-$name-$hash" fill_sidecar "$(standin_image "$name")" \
            "{\"Entrypoint\":[\"/${bin##*/}\"],\"Env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"]}"
        prune_except "$E2E_CACHE/images-standin-$name-$hash" "$E2E_CACHE/images-standin-$name"-*
    done
}
fill_sidecar() {
    minimal_etc "$1"
    install -m 0755 "$SIDECAR_BIN" "$1/"
}

# The pause image kubelet's pods start with: build/pause/linux/pause.c of the Kubernetes module,
# static, as its Makefile builds it, under containerd's sandbox_image name (PAUSE_IMAGE).
pause_image() {
    local tag=${PAUSE_IMAGE##*:} src
    src=$(go_module_dir k8s.io/kubernetes "$KUBE_VERSION")
    grep -qE "^TAG \?= $tag\$" "$src/build/pause/Makefile" ||
        die "Kubernetes $KUBE_VERSION's build/pause/Makefile is not at $tag: update PAUSE_IMAGE in versions.sh"
    PAUSE_SRC=$src scratch_image "images-pause-$tag" fill_pause "$PAUSE_IMAGE" \
        '{"User":"65535:65535","Entrypoint":["/pause"]}'
}
fill_pause() {
    gcc -Os -Wall -Werror -static -DVERSION="v${PAUSE_IMAGE##*:}-kubernetes-$KUBE_VERSION" \
        -o "$1/pause" "$PAUSE_SRC/build/pause/linux/pause.c"
    strip "$1/pause"
}

# busybox-static's Debian version, without epoch or '+' (a cache key).
busybox_deb_version() {
    local v
    v=$(dpkg-query -W -f='${Version}' busybox-static)
    v=${v#*:}
    echo "${v//+/-}"
}

# The test pods' image: Debian's static busybox with a link for every applet.
busybox_image() {
    local ver
    ver=$(busybox_deb_version)
    scratch_image "images-busybox-$ver" fill_busybox "$TEST_IMAGE" \
        '{"Cmd":["sh"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}'
}
fill_busybox() {
    local a
    minimal_etc "$1"
    install -D -m 0755 /bin/busybox "$1/bin/busybox"
    for a in $(/bin/busybox --list-full); do
        [[ $a == bin/busybox ]] && continue
        mkdir -p "$1/$(dirname "$a")"
        ln -sf /bin/busybox "$1/$a"
    done
}

# --- stickyvol's image, from our Dockerfile, with buildah ----------------------------------------

# buildah with its own store in the cache (the base images stay loaded between runs).
bh() {
    buildah --root "$E2E_CACHE/buildah/root" --runroot "$E2E_CACHE/buildah/run" \
        --storage-driver overlay "$@"
}

# Removes tree $1, first unmounting whatever a killed debootstrap left mounted inside it.
rm_tree() {
    local m
    [[ -e $1 ]] || return 0
    for m in $(findmnt -rn -o TARGET | grep -F "$1/" | sort -r || true); do
        umount -l "$m"
    done
    rm -rf "$1"
}

# The mirror apt uses here (debootstrap reads the same one).
debian_mirror() {
    local m
    m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*\(http[^[:space:]]*\/debian\)\/\{0,1\}$/\1/p' | head -n1)
    [[ -n $m ]] || m=$(sed -n 's/^deb[[:space:]]\+\(http[^[:space:]]*\/debian\)\/\{0,1\}[[:space:]]\+bookworm[[:space:]].*/\1/p' \
        /etc/apt/sources.list 2>/dev/null | head -n1)
    echo "${m:-http://deb.debian.org/debian}"
}

# Debian bookworm minbase in rootfs $1, plus packages $2 (comma list), without apt's lists or the
# host's resolv.conf and hostname.
debootstrap_into() {
    local root=$1 include=${2:-}
    mkdir -p "$E2E_CACHE/debootstrap-debs"
    debootstrap --variant=minbase ${include:+--include="$include"} \
        --cache-dir="$E2E_CACHE/debootstrap-debs" bookworm "$root" "$(debian_mirror)" >/dev/null
    chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/* "$root"/etc/resolv.conf "$root"/etc/hostname "$root"/dev/*
}

fill_debian_slim() { debootstrap_into "$1"; }

# rust:X-slim-bookworm the way the official image lays it out: the host's toolchain (without its
# docs) in RUSTUP_HOME=/usr/local/rustup, rustup and its proxies in CARGO_HOME=/usr/local/cargo/bin.
fill_rust_slim() {
    local root=$1 tc=$RUST_TOOLCHAIN_DIR name=$RUST_TOOLCHAIN_NAME p
    debootstrap_into "$root" gcc,libc6-dev,ca-certificates
    mkdir -p "$root/usr/local/rustup/toolchains/$name" "$root/usr/local/cargo/bin"
    tar -C "$tc/" --exclude=./share/doc -c . | tar -C "$root/usr/local/rustup/toolchains/$name" -x
    printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$name" \
        >"$root/usr/local/rustup/settings.toml"
    install -m 0755 "$(command -v rustup)" "$root/usr/local/cargo/bin/rustup"
    for p in cargo rustc rustdoc; do
        ln -s rustup "$root/usr/local/cargo/bin/$p"
    done
    chmod -R a+w "$root/usr/local/rustup" "$root/usr/local/cargo"
    # rustup reads /proc/self/exe.
    unshare --mount --pid --fork --mount-proc="$root/proc" chroot "$root" \
        env PATH=/usr/local/cargo/bin:/usr/bin:/bin RUSTUP_HOME=/usr/local/rustup \
        CARGO_HOME=/usr/local/cargo cargo --version >/dev/null
}

# The host toolchain of Rust $1 (e.g. 1.95): sets RUST_TOOLCHAIN_DIR, _NAME and RUST_VERSION.
find_rust_toolchain() {
    local home=${RUSTUP_HOME:-$HOME/.rustup} d v
    for d in "$home/toolchains/$1".*-x86_64-unknown-linux-gnu "$home/toolchains/stable-x86_64-unknown-linux-gnu"; do
        [[ -x $d/bin/rustc ]] || continue
        v=$("$d/bin/rustc" --version | cut -d' ' -f2)
        [[ $v == "$1".* ]] || continue
        RUST_TOOLCHAIN_DIR=$(cd "$d" && pwd -P) RUST_VERSION=$v
        RUST_TOOLCHAIN_NAME=$v-x86_64-unknown-linux-gnu
        return 0
    done
    die "no Rust $1 toolchain under $home/toolchains (the Dockerfile builds FROM rust:$1-...)"
}

# Makes the Dockerfile's FROM images and loads them into buildah's store under their full names.
base_images() {
    local from
    for from in $(sed -n 's/^FROM[[:space:]]\+\([^[:space:]]\+\).*/\1/p' "$REPO_DIR/Dockerfile"); do
        case $from in
            debian:bookworm-slim)
                base_image debian-bookworm-slim "docker.io/library/$from" fill_debian_slim \
                    '{"Cmd":["bash"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}' ;;
            rust:*-slim-bookworm)
                local want=${from#rust:}
                find_rust_toolchain "${want%-slim-bookworm}"
                base_image "rust-$RUST_VERSION-slim-bookworm" "docker.io/library/$from" fill_rust_slim \
                    "{\"Cmd\":[\"bash\"],\"Env\":[\"PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\",\"RUSTUP_HOME=/usr/local/rustup\",\"CARGO_HOME=/usr/local/cargo\",\"RUST_VERSION=$RUST_VERSION\"]}" ;;
            *) die "Dockerfile builds FROM $from: no recipe for it in build-images.sh" ;;
        esac
    done
}

# Base image $2 in $E2E_CACHE/base-$1/image.tar (made by $3 with config $4) and in buildah's store.
base_image() {
    local key=$1 name=$2 fill=$3 config=$4
    local out="$E2E_CACHE/base-$key"
    if [[ ! -d $out ]]; then
        log "base image $name (debootstrap)"
        rm_tree "$out.partial" && mkdir -p "$out.partial/rootfs"
        "$fill" "$out.partial/rootfs"
        oci_archive "$out.partial/image.tar" "$name" "$out.partial/rootfs" "$config"
        rm_tree "$out.partial/rootfs"
        echo "$name" >"$out.partial/name"
        mv -T "$out.partial" "$out"
        bh rmi -f "$name" >/dev/null 2>&1 || true
    fi
    if ! bh inspect --type image "$name" >/dev/null 2>&1; then
        local id
        id=$(bh pull --quiet "oci-archive:$out/image.tar")
        bh tag "$id" "$name"
    fi
}

# The image deploy/kubernetes runs: its kustomization's images: entry for the stickyvol image.
stickyvol_image_name() {
    local k="$REPO_DIR/deploy/kubernetes/kustomization.yaml" name new tag
    name=$(sed -n 's/^[[:space:]]*-[[:space:]]*name:[[:space:]]*\([^[:space:]]*stickyvol\)[[:space:]]*$/\1/p' "$k" | head -n1)
    [[ -n $name ]] || die "no stickyvol entry under images: in $k"
    new=$(sed -n "/name:[[:space:]]*${name//\//\\/}[[:space:]]*\$/,/^[^[:space:]]/s/^[[:space:]]*newName:[[:space:]]*\"\{0,1\}\([^\"[:space:]]*\).*/\1/p" "$k" | head -n1)
    tag=$(sed -n "/name:[[:space:]]*${name//\//\\/}[[:space:]]*\$/,/^[^[:space:]]/s/^[[:space:]]*newTag:[[:space:]]*\"\{0,1\}\([^\"[:space:]]*\).*/\1/p" "$k" | head -n1)
    [[ -n $tag ]] || die "no newTag for $name in $k"
    echo "${new:-$name}:$tag"
}

# Hash of what the Dockerfile's build reads, as git's index has it (see stickyvol_image).
stickyvol_src_hash() {
    git -C "$REPO_DIR" ls-files -s -- Cargo.toml Cargo.lock build.rs link src proto Dockerfile .dockerignore |
        sha256sum | cut -c1-16
}

# Our Dockerfile built as a user would (`docker build .`), with buildah: chroot isolation (no
# runc needed), the host's network and CA certificates for crates.io (these machines reach it
# through a TLS proxy whose CA only the host's bundle has), and cargo's registry and target
# directories kept in the cache between builds. All are build flags, mounts that the image does
# not keep: it is what the Dockerfile makes. The build context is the repository as git's index
# has it (a fresh clone's tree, with staged changes), so edits not yet staged, such as others'
# work in progress in a shared checkout, neither go into the image nor force a rebuild.
stickyvol_image() {
    local name hash
    name=$(stickyvol_image_name)
    hash=$(stickyvol_src_hash)
    local out="$E2E_CACHE/images-stickyvol-$hash"
    [[ -d $out ]] && return 0
    base_images
    log "image $name from the Dockerfile (source $hash)"
    # Working containers a killed build left behind (this store is ours alone).
    bh rm --all >/dev/null
    local cache="$E2E_CACHE/stickyvol-cargo"
    mkdir -p "$cache/registry" "$cache/target"
    rm -rf "$out.partial" && mkdir -p "$out.partial"
    local ctx="$E2E_CACHE/.work/stickyvol-context"
    rm -rf "$ctx" && mkdir -p "$ctx"
    git -C "$REPO_DIR" checkout-index -a --prefix="$ctx/"
    # The commit, for `stickyvol --version`, stickyvol_build_info and the image's revision label
    # (the context has no .git); "-dirty" when the index differs from it in what the build reads.
    local revision
    revision=$(git -C "$REPO_DIR" rev-parse HEAD 2>/dev/null) || revision=unknown
    if [[ $revision != unknown ]] && ! git -C "$REPO_DIR" diff --cached --quiet HEAD -- \
        Cargo.toml Cargo.lock build.rs link src proto Dockerfile .dockerignore; then
        revision+=-dirty
    fi
    local ca=/etc/ssl/certs/ca-certificates.crt mounts=()
    [[ -f $ca ]] && mounts+=(-v "$ca:$ca:ro")
    bh bud --pull=never --isolation=chroot --network=host --format=oci "${mounts[@]}" \
        -v "$cache/registry:/usr/local/cargo/registry" -v "$cache/target:/src/target" \
        --build-arg "REVISION=$revision" \
        -f "$ctx/Dockerfile" -t "$name" "$ctx" >"$out.partial/build.log" 2>&1 ||
        die "buildah bud failed: $(tail -n 20 "$out.partial/build.log")"
    rm -rf "$ctx"
    bh push --quiet "$name" "docker-archive:$out.partial/image.tar:$name"
    bh rmi "$name" >/dev/null
    echo "$name" >"$out.partial/name"
    mv -T "$out.partial" "$out"
    prune_except "$out" "$E2E_CACHE"/images-stickyvol-*
}

# Removes the directories "${@:2}" other than $1: archives of older sources (130 MB each).
prune_except() {
    local keep=$1 d
    shift
    for d in "$@"; do
        [[ $d == "$keep" || ! -d $d ]] || rm -rf "$d"
    done
}

build_images() {
    build_debs
    build_sidecars
    local start=$SECONDS piece
    for piece in sidecar_images standin_images suite_standin_images pause_image busybox_image stickyvol_image; do
        "$piece"
        log "$piece: $((SECONDS - start)) s"
        start=$SECONDS
    done
    local ctl snap
    ctl=$(sed -n 's/^[[:space:]]*image:[[:space:]]*\(.*snapshot-controller:.*\)/\1/p' "$E2E_DIR/manifests/snapshot-controller.yaml")
    snap=$(sidecar_tag csi-snapshotter)
    [[ $ctl == "$SIDECAR_REGISTRY/snapshot-controller:$snap" ]] ||
        die "manifests/snapshot-controller.yaml runs $ctl; deploy/ has csi-snapshotter $snap: make them match"
}

# The archives the cluster needs, newest stickyvol build included.
e2e_image_archives() {
    local s name
    for s in "${SIDECARS[@]}"; do
        name=${s%% *}
        echo "$E2E_CACHE/images-$name-$(sidecar_tag "$name")/image.tar"
    done
    for s in "${STANDINS[@]}"; do
        echo "$E2E_CACHE/images-standin-${s%% *}-$(standins_hash)/image.tar"
    done
    echo "$E2E_CACHE/images-pause-${PAUSE_IMAGE##*:}/image.tar"
    echo "$E2E_CACHE/images-busybox-$(busybox_deb_version)/image.tar"
    echo "$E2E_CACHE/images-stickyvol-$(stickyvol_src_hash)/image.tar"
    prometheus_archive
    previous_archive
    velero_image_archives
    suite_image_archives
}

# Imports every image into the k8s.io namespace of the containerd at address $1. An image is
# labelled with the archive it came from, so an unchanged one is skipped and a rebuilt one (the
# same name from a newer archive, e.g. stickyvol after a source change) replaces the old.
e2e_import_images() {
    local addr=$1 archive name have
    local ctr=(ctr --address "$addr" -n k8s.io)
    for archive in $(e2e_image_archives); do
        [[ -f $archive ]] || die "no $archive: run tests/e2e/build images"
        name=$(cat "$(dirname "$archive")/name")
        have=$("${ctr[@]}" images ls "name==$name" 2>/dev/null | awk 'NR > 1 { print $NF }')
        [[ $have == *"stickyvol.e2e/archive=$(basename "$(dirname "$archive")")"* ]] && continue
        log "importing $name into $addr"
        "${ctr[@]}" images import "$archive" >/dev/null
        "${ctr[@]}" images label "$name" "stickyvol.e2e/archive=$(basename "$(dirname "$archive")")" >/dev/null
    done
}
