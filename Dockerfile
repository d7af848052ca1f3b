# Multi-stage build: the operator (with its embedded default policy) and the
# policies, into a minimal non-root runtime image.
#   docker build -t nmo:latest .
FROM rust:1.95-bookworm AS build
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
# The build script compiles every policy crate to wasm32-wasip2 first.
RUN cargo build --release --locked -p nmo \
 && mkdir -p /out/policies \
 && cp target/release/nmo /out/nmo \
 && cp target/policies/wasm32-wasip2/policy/nmo_policy_default.wasm \
       target/policies/wasm32-wasip2/policy/nmo_policy_never_force.wasm /out/policies/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/nmo /nmo
COPY --from=build /out/policies /policies
USER 65532:65532
ENTRYPOINT ["/nmo"]
