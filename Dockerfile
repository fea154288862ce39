# syntax=docker/dockerfile:1
#
# The consulbind controller image: the same binary that `cargo build --release -p consulbind`
# makes, on a minimal non-root runtime (distroless: no shell, no package manager).
#
#   docker build -t consulbind:dev .
#
# The build context is the workspace root (see .dockerignore). Any BuildKit builder works
# (docker buildx, podman, buildah, kaniko); the cache mounts only speed up rebuilds.

FROM rust:1-bookworm AS build
WORKDIR /src
# The whole workspace: cargo needs every member's manifest and targets, xtask included.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release -p consulbind --locked \
 && install -D -m 0755 target/release/consulbind /out/consulbind

# glibc and libgcc, CA certificates, and the nonroot user (65532); pure-Rust TLS, so no OpenSSL.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/consulbind /consulbind
USER 65532:65532
# /metrics, /livez, /readyz and /debug/watches (CONSULBIND_ADMIN_ADDR).
EXPOSE 8080
ENTRYPOINT ["/consulbind"]
