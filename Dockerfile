# syntax=docker/dockerfile:1
#
# The anarchon image: the sidecar binary on a distroless base.
#
#   docker build -t anarchon .
#   docker run --rm -p 50051:50051 -p 9464:9464 anarchon            # serve, SQLite in /data
#   docker run --rm anarchon peers --server HOST:50051              # any subcommand
#
# The runtime stage has no shell and no package manager: the binary is the
# entrypoint, `serve` the default command. It runs as uid/gid 65532.
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.

# The builder matches the runtime's Debian release (bookworm: glibc 2.36), so
# the dynamically linked binary finds the same libc, libm and libgcc_s there.
# Moving to trixie? Move the runtime with it (cc-debian13).
ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS builder
WORKDIR /src
# jemalloc (the sidecar's allocator) builds with make: bookworm's, pinned
# (moving DEBIAN_RELEASE? move MAKE_VERSION with it: `apt-cache policy make`).
ARG MAKE_VERSION=4.3-4.1
RUN apt-get update \
 && apt-get install -y --no-install-recommends "make=${MAKE_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
# Protos are compiled by build.rs with protox (pure Rust): no protoc needed.
# The C parts (bundled SQLite, ring, aws-lc) build with the image's gcc.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY migrations ./migrations
COPY benches ./benches
COPY src ./src
# Debug info is stripped (symbols stay, so panics still name functions).
ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin anarchon \
 && install -D -m 0755 target/release/anarchon /out/usr/local/bin/anarchon \
 && install -d -m 0700 -o 65532 -g 65532 /out/data

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="anarchon" \
      org.opencontainers.image.description="A gRPC sidecar that tells a fleet who owns a piece of work and who is alive" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/usr/local/bin/anarchon /usr/local/bin/anarchon
COPY --from=builder --chown=65532:65532 /out/data /data
# In a container the listeners must not be loopback-only: peers dial the gRPC
# port from other pods. Precedence is defaults < TOML < environment < flags,
# so these beat `listen`, `admin_listen` and `data_dir` in a TOML file; change
# them with flags or the container's own environment (the Helm chart does).
ENV ANARCHON_LISTEN=0.0.0.0:50051 \
    ANARCHON_ADMIN_LISTEN=0.0.0.0:9464 \
    ANARCHON_DATA_DIR=/data
USER 65532:65532
WORKDIR /data
# gRPC (applications, peers, grpc.health.v1) and admin HTTP (/healthz,
# /readyz, /metrics, /api/v1/mesh/state).
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/anarchon"]
CMD ["serve"]
