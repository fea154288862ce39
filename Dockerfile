# syntax=docker/dockerfile:1
#
# The same image as `cargo xtask image`, for those who build with Docker: from scratch, the binary of
# `cargo build --release -p consulbind`, the glibc libraries `ldd` lists, Debian's CA bundle, the
# crates' licences (`cargo xtask notices`), the nonroot user 65532, and the OCI labels. `cargo
# xtask image` (buildah, no daemon) is the build that the end-to-end tests run; this file follows
# xtask/src/env/image.rs but is not run in CI.
#
#   docker build --build-arg REVISION=$(git rev-parse HEAD) -t consulbind:0.1.0 .
#
# The build context is the workspace root (see .dockerignore).

FROM rust:1-bookworm AS build
WORKDIR /src
# The whole workspace: cargo needs every member's manifest and targets, xtask included.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release -p consulbind --locked \
 && install -D -m 0755 target/release/consulbind /rootfs/consulbind \
 && cargo xtask notices /rootfs/usr/share/doc/consulbind/THIRD-PARTY-NOTICES

# The root file system, laid out as xtask/src/env/image.rs does it, from this stage's Debian packages.
RUN set -eu; \
    for lib in $(ldd /rootfs/consulbind | grep -o '/[^ ]*'); do cp -L --parents "$lib" /rootfs; done; \
    cp -L --parents /etc/ssl/certs/ca-certificates.crt /rootfs; \
    for pkg in libc6 libgcc-s1 ca-certificates; do cp -L --parents "/usr/share/doc/$pkg/copyright" /rootfs; done; \
    mkdir -p /rootfs/home/nonroot; mkdir -m 1777 /rootfs/tmp; \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
      > /rootfs/etc/passwd; \
    printf 'root:x:0:\nnonroot:x:65532:\n' > /rootfs/etc/group; \
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' > /rootfs/etc/nsswitch.conf

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
COPY --from=build /rootfs/ /
USER 65532:65532
# /metrics, /livez, /readyz and /debug/watches (CONSULBIND_ADMIN_ADDR).
EXPOSE 8080
WORKDIR /
ENTRYPOINT ["/consulbind"]
LABEL org.opencontainers.image.title="consulbind" \
      org.opencontainers.image.source="https://example.invalid/consulbind" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
