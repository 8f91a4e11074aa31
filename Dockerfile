# syntax=docker/dockerfile:1
#
# One image per muster process, chosen by a build argument:
#
#   docker build --build-arg SERVICE=execution -t muster-execution:0.1.0 .
#   (SERVICE is one of execution, roster, validator, notifier, console)
#
# execution, roster, validator and notifier are the gRPC services; console is
# the web console (web pages over HTTP/1.1 on port 50080, a client of the
# execution service, the roster and the validator). The images share every
# layer but the last: the builder compiles all five binaries in one cached
# step and the final stage copies only the chosen one, so building the other
# four afterwards costs a few seconds each.
#
# Stages:
#   planner  derives a skeleton of the workspace (manifests, Cargo.lock, a stub
#            per target: docker/cargo-skeleton.sh); it reruns on every source
#            change, but its output changes only when the manifests do.
#   builder  builds the skeleton (all dependencies: the slow, cached layer),
#            then the real sources (with the files crates embed, such as the
#            console's assets/, which the stubs do not need).
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
        -p muster-execution -p muster-roster -p muster-validator -p muster-notifier \
        -p muster-console
# The real sources. COPY keeps the build context's modification times, which
# are older than the stubs' build: touch every file so cargo rebuilds muster's
# own crates instead of keeping the stubs.
COPY . .
RUN find . -path ./target -prune -o -type f -exec touch {} + \
    && cargo build --release --locked \
        -p muster-execution -p muster-roster -p muster-validator -p muster-notifier \
        -p muster-console

ARG SERVICE
RUN case "${SERVICE}" in \
        execution | roster | validator | notifier | console) ;; \
        *) echo "build with --build-arg SERVICE=execution|roster|validator|notifier|console (got '${SERVICE}')" >&2; exit 1 ;; \
    esac \
    && mkdir -p /out/data \
    && cp "target/release/muster-${SERVICE}" /out/muster-service

FROM gcr.io/distroless/cc-debian12:nonroot
ARG SERVICE
# The description says what the image serves: "muster's roster service
# (gRPC)", or for the console "muster's console: web pages over the cluster
# (HTTP)". GRPC_SERVICE is SERVICE without a leading "console", so it is empty
# for the console alone, and ${SERVICE/console/...} rewrites only the
# console's name (${VAR#prefix} and ${VAR/pattern/replacement} need dockerfile
# syntax 1.7 or later, which the syntax line at the top selects).
ARG GRPC_SERVICE=${SERVICE#console}
LABEL org.opencontainers.image.title="muster-${SERVICE}" \
      org.opencontainers.image.description="muster's ${SERVICE/console/console: web pages over the cluster (HTTP)}${GRPC_SERVICE:+ service (gRPC)}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/muster-service /usr/local/bin/muster-service
# The working directory is writable by the service user, so the image runs as
# is with the embedded SQLite default (sqlite://muster-data/<service>.db).
# Kubernetes mounts volumes instead and keeps the root filesystem read-only.
# (The console writes nothing: it keeps its sessions in sealed cookies.)
COPY --from=builder --chown=65532:65532 /out/data /var/lib/muster
WORKDIR /var/lib/muster
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/muster-service"]
