# The stickyvol image: one static-ish binary (needs only glibc) on debian:bookworm-slim.
#
#   docker build -t ghcr.io/stickyvol/stickyvol:0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#
# REVISION names the commit: `stickyvol --version` and the metric stickyvol_build_info say it, and
# so does the label org.opencontainers.image.revision. The build context has no .git
# (.dockerignore), so without the argument they say "unknown". VERSION is the release (Cargo.toml's
# version; tests/deploy_manifests.rs checks the default), SOURCE the repository it is built from.
#
# Reproducible inputs: base images pinned by tag (pin by digest in your registry mirror if you
# need bit-for-bit rebuilds), dependencies exactly as in Cargo.lock (--locked), protobuf compiled
# in pure Rust by build.rs (no protoc), no network access at run time. The runtime image needs
# no util-linux: mounts and loop devices are made with system calls. It carries e2fsprogs and
# xfsprogs: image volumes (a StorageClass with csi.storage.k8s.io/fstype) are made with
# mkfs.ext4 / mkfs.xfs and grown with resize2fs / xfs_growfs; and cryptsetup-bin: encrypted
# image volumes (encryption: luks2) are LUKS2 devices made and opened with cryptsetup.

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/stickyvol/stickyvol

FROM rust:1.95-slim-bookworm AS build
ARG REVISION
WORKDIR /src
COPY . .
RUN STICKYVOL_REVISION="$REVISION" cargo build --release --locked --bin stickyvol \
    && install -D -m 0755 target/release/stickyvol /out/stickyvol

FROM debian:bookworm-slim
ARG VERSION
ARG REVISION
ARG SOURCE
LABEL org.opencontainers.image.title="stickyvol" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.source="$SOURCE" \
      org.opencontainers.image.description="Sticky, node-local, emptyDir-style persistent volumes for Kubernetes (CSI driver)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends e2fsprogs xfsprogs cryptsetup-bin \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/stickyvol /usr/local/bin/stickyvol
# The node plugin runs as root (privileged); the controller overrides the user in its pod spec.
ENTRYPOINT ["/usr/local/bin/stickyvol"]
CMD ["--help"]
