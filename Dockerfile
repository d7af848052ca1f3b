# syntax=docker/dockerfile:1
# Multi-stage build: the operator (with its embedded default policy) and the
# policies, into a minimal non-root runtime image.
#   docker build -t nmo:latest .
# The crate registry and the build directory are BuildKit cache mounts: a
# rebuild after a source change recompiles the workspace, not its
# dependencies.
#
# Two build arguments let a machine without these registries build the same
# file (deploy/image/build.sh does, with buildah):
#   RUNTIME   the runtime base: distroless cc (glibc, libgcc, CA
#             certificates, the nonroot user), or one assembled from the
#             same Debian packages;
#   BINARIES  where /out comes from: the `build` stage below, or an image
#             holding what deploy/image/stage.sh staged from a cargo build.
ARG RUNTIME=gcr.io/distroless/cc-debian12:nonroot
ARG BINARIES=build

FROM rust:1.95-bookworm AS build
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
# The build script compiles every policy crate to wasm32-wasip2 first.
# Without the `demo` feature: the image does not link the simulated cluster.
# The `image` profile: release, stripped, without line tables.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile image --locked -p nmo --no-default-features \
 && deploy/image/stage.sh target /out

FROM ${BINARIES} AS binaries

FROM ${RUNTIME}
COPY --from=binaries /out/nmo /nmo
# /manager -> nmo: the Go operator's Deployments (its OLM bundle's) run
# /manager; with this image swapped in, they run nmo.
COPY --from=binaries /out/links/ /
# Every shipped policy (the default and each example), for reference, for
# `nmo policy test` in the image and for `nmo policy add`; the operator
# reads its policies from the mounted ConfigMap at /etc/nmo/policies
# (deploy/policies), or uses the embedded default.
COPY --from=binaries /out/policies /usr/share/nmo/policies
USER 65532:65532
ENTRYPOINT ["/nmo"]
