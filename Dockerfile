# syntax=docker/dockerfile:1
# One image for every leasehold component: the task definition picks the
# subcommand (deploy/task-definitions/*.json, `command`). See deploy/README.md.
#
#   docker build -t leasehold:$(git rev-parse --short HEAD) .
#
# Build stage: exactly the toolchain rust-toolchain.toml names (1.95.0; with a
# bare 1.95 tag a later 1.95.x image would make rustup download 1.95.0 again in
# the build), on the same Debian release as the runtime so the binary's glibc
# matches. The context is what .dockerignore lets through;
# scripts/check_build_context.py checks that it holds every compile-time input.
ARG RUST_VERSION=1.95.0
FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target directory between builds (BuildKit).
# --locked: build exactly Cargo.lock. aws-lc-sys builds with the image's gcc
# (its cc builder), so no cmake or clang is needed.
# The release profile keeps line tables (debug = "line-tables-only", about 160 MB
# of a 199 MB binary); --strip-debug drops them and keeps the symbol table, so a
# panic backtrace still names functions: 36 MB instead of 199 MB, which matters
# because every Fargate task pulls the image on start (the broker pool's cold start).
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p leasehold \
 && objcopy --strip-debug target/release/leasehold /usr/local/bin/leasehold

# Runtime: debian:bookworm-slim rather than distroless because the sidecar's ECS
# health check runs inside the container and needs a tool that can make an HTTP
# request: bash's /dev/tcp does it with nothing installed (distroless has no shell;
# the binary has no health subcommand). ca-certificates: the AWS SDK verifies TLS
# against the system roots (rustls-native-certs); the upstream WebSocket client
# carries its own roots.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 leasehold \
 && useradd --system --uid 10001 --gid leasehold --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin leasehold
COPY --from=build /usr/local/bin/leasehold /usr/local/bin/leasehold
# Numeric, so anything that checks for a non-root user can tell without /etc/passwd.
USER 10001:10001
# 9464: sidecar /metrics, /healthz, /status (SIDECAR_LISTEN); 8080: dashboard
# (DASHBOARD_LISTEN, set explicitly). 9465 (TELEMETRY_ADDR) stays on loopback.
EXPOSE 9464 8080
ENTRYPOINT ["leasehold"]
CMD ["--help"]
