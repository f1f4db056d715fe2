# The Prometheus server the cluster suite's monitoring scenario runs: built from the module
# tests/monitoring pins (as promtool is, github.com/prometheus/prometheus), with only the
# Kubernetes service discovery (build tags remove_all_sd,enable_kubernetes_sd) and without the web
# UI's assets (the HTTP API is all the scenario reads), into an image of that one static binary.
# Sourced by tests/e2e/build (build_prometheus) and the cluster scripts (prometheus_archive).
#
#   $E2E_CACHE/prometheus-VERSION-KEY/prometheus     KEY: hash of go.mod, go.sum and this file
#   $E2E_CACHE/images-prometheus-VERSION-KEY/image.tar
# shellcheck shell=bash

PROMETHEUS_MODULE_DIR=$REPO_DIR/tests/monitoring

prometheus_version() {
    sed -n 's#^\s*github.com/prometheus/prometheus \(v[^ ]*\).*#\1#p' "$PROMETHEUS_MODULE_DIR/go.mod"
}
prometheus_key() {
    cat "$PROMETHEUS_MODULE_DIR/go.mod" "$PROMETHEUS_MODULE_DIR/go.sum" "$E2E_DIR/lib/build-prometheus.sh" |
        sha256sum | cut -c1-12
}
# The image's name: the pinned version, in our own namespace (no registry serves it here).
prometheus_image_name() { echo "stickyvol-e2e/prometheus:$(prometheus_version)"; }
prometheus_archive() {
    echo "$E2E_CACHE/images-prometheus-$(prometheus_version)-$(prometheus_key)/image.tar"
}

build_prometheus() {
    local version key bin
    version=$(prometheus_version)
    [[ -n $version ]] || die "no github.com/prometheus/prometheus in $PROMETHEUS_MODULE_DIR/go.mod"
    key=$(prometheus_key)
    bin="$E2E_CACHE/prometheus-$version-$key"
    if [[ ! -d $bin ]]; then
        log "building Prometheus $version (cold: minutes on 2 cores)"
        rm -rf "$bin.partial" && mkdir -p "$bin.partial"
        (cd "$PROMETHEUS_MODULE_DIR" && GOFLAGS= GOWORK=off go build -mod=readonly -buildvcs=false -trimpath \
            -tags remove_all_sd,enable_kubernetes_sd \
            -ldflags "-s -w -X github.com/prometheus/common/version.Version=${version#v}" \
            -o "$bin.partial/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
        mv -T "$bin.partial" "$bin"
        prune_except "$bin" "$E2E_CACHE"/prometheus-v*
    fi
    PROMETHEUS_BIN=$bin/prometheus scratch_image "images-prometheus-$version-$key" fill_prometheus \
        "$(prometheus_image_name)" \
        '{"User":"65534:65534","Entrypoint":["/prometheus"],"WorkingDir":"/tmp"}'
    prune_except "$E2E_CACHE/images-prometheus-$version-$key" "$E2E_CACHE"/images-prometheus-*
}
fill_prometheus() {
    minimal_etc "$1"
    install -m 0755 "$PROMETHEUS_BIN" "$1/prometheus"
}
