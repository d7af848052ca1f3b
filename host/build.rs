//! Hands the folder of the built policies (the policy runtime's build script
//! builds every crate under `policies/` for `wasm32-wasip2`) to this crate's
//! code, tests and benchmarks as `NMO_POLICY_WASM_DIR`.

fn main() {
    let dir = std::env::var("DEP_NMO_POLICIES_DIR")
        .expect("nmo-policy-runtime's build script names the policies' folder");
    println!("cargo:rerun-if-env-changed=DEP_NMO_POLICIES_DIR");
    println!("cargo:rustc-env=NMO_POLICY_WASM_DIR={dir}");
}
