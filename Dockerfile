# syntax=docker/dockerfile:1
#
# One image per muster service, chosen by a build argument:
#
#   docker build --build-arg SERVICE=execution -t muster-execution:0.1.0 .
#   (SERVICE is one of execution, roster, validator, notifier)
#
# The four images share every layer but the last: the builder compiles all four
# binaries in one cached step and the final stage copies only the chosen one,
# so building the other three afterwards costs a few seconds each.
#
# Stages:
#   planner  derives a skeleton of the workspace (manifests, Cargo.lock, a stub
#            per target: docker/cargo-skeleton.sh); it reruns on every source
#            change, but its output changes only when the manifests do.
#   builder  builds the skeleton (all dependencies: the slow, cached layer),
#            then the real sources.
#   final    distroless/cc (glibc, libgcc, CA certificates; no shell, no
#            package manager, no build tools), numeric non-root user.
#
# The builder and the final stage must share a Debian release (bookworm and
# debian12), since the binaries link against the builder's glibc. The Rust
# version must match rust-toolchain.toml; .ci/check-deploy checks it.

FROM rust:1.95.0-slim-bookworm AS planner
WORKDIR /src
COPY . .
RUN sh docker/cargo-skeleton.sh /src /skeleton

FROM rust:1.95.0-slim-bookworm AS builder
WORKDIR /build
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0
# Dependencies only: cached until a manifest or Cargo.lock changes.
COPY --from=planner /skeleton/ ./
RUN cargo build --release --locked \
        -p muster-execution -p muster-roster -p muster-validator -p muster-notifier
# The real sources. COPY keeps the build context's modification times, which
# are older than the stubs' build: touch every file so cargo rebuilds muster's
# own crates instead of keeping the stubs.
COPY . .
RUN find . -path ./target -prune -o -type f -exec touch {} + \
    && cargo build --release --locked \
        -p muster-execution -p muster-roster -p muster-validator -p muster-notifier

ARG SERVICE
RUN case "${SERVICE}" in \
        execution | roster | validator | notifier) ;; \
        *) echo "build with --build-arg SERVICE=execution|roster|validator|notifier (got '${SERVICE}')" >&2; exit 1 ;; \
    esac \
    && mkdir -p /out/data \
    && cp "target/release/muster-${SERVICE}" /out/muster-service

FROM gcr.io/distroless/cc-debian12:nonroot
ARG SERVICE
LABEL org.opencontainers.image.title="muster-${SERVICE}" \
      org.opencontainers.image.description="muster's ${SERVICE} service (gRPC)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/muster-service /usr/local/bin/muster-service
# The working directory is writable by the service user, so the image runs as
# is with the embedded SQLite default (sqlite://muster-data/<service>.db).
# Kubernetes mounts volumes instead and keeps the root filesystem read-only.
COPY --from=builder --chown=65532:65532 /out/data /var/lib/muster
WORKDIR /var/lib/muster
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/muster-service"]
