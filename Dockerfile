# syntax=docker/dockerfile:1
# Multi-stage build: the operator (with its embedded default policy) and the
# policies, into a minimal non-root runtime image.
#   docker build -t nmo:latest .
# The crate registry and the build directory are BuildKit cache mounts: a
# rebuild after a source change recompiles the workspace, not its
# dependencies.
FROM rust:1.95-bookworm AS build
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
# The build script compiles every policy crate to wasm32-wasip2 first.
# Without the `demo` feature: the image does not link the simulated cluster.
# Stripped, without debug line tables: a smaller image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    CARGO_PROFILE_RELEASE_STRIP=true CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo build --release --locked -p nmo --no-default-features \
 && mkdir -p /out/policies \
 && cp target/release/nmo /out/nmo \
 && for p in default never_force stateful_last opt_out give_up; do \
      cp target/policies/wasm32-wasip2/policy/nmo_policy_$p.wasm /out/policies/$(echo $p | tr _ -).wasm; \
    done

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/nmo /nmo
# The built policies, for reference and for `nmo policy test` in the image;
# the operator reads its policies from the mounted ConfigMap at
# /etc/nmo/policies (deploy/policies), or uses the embedded default.
COPY --from=build /out/policies /usr/share/nmo/policies
USER 65532:65532
ENTRYPOINT ["/nmo"]
