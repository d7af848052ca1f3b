//! Builds the policies under `policies/` for `wasm32-wasip2`, so the runtime
//! can embed the default policy and the operator's tests can load the real
//! `.wasm` files (their folder goes to them as `DEP_NMO_POLICIES_DIR`).
//!
//! The policies get their own target directory (`target/policies`), shared by
//! every profile of the host, so a `cargo clippy` after a `cargo test` does
//! not build them again.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// Policy crates built here, by package name.
const POLICIES: &[&str] = &[
    "nmo-policy-default",
    "nmo-policy-hostile",
    "nmo-policy-sleepy-init",
    "nmo-policy-contract-0-3",
    "nmo-policy-never-force",
    "nmo-policy-stateful-last",
    "nmo-policy-opt-out",
    "nmo-policy-give-up",
    "nmo-policy-one-per-zone",
    "nmo-policy-max-unavailable",
    "nmo-policy-window",
    "nmo-policy-no-downtime",
    "nmo-policy-escalate",
    "nmo-policy-rate",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest_dir
        .parent()
        .expect("runtime/ is in the workspace")
        .to_path_buf();
    for watched in [
        "policies",
        "wit",
        "runtime/wit-compat",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    let target_root = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let target_dir = target_root.join("policies");

    ensure_wasm_target();

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--target", "wasm32-wasip2", "--profile", "policy"])
        .arg("--target-dir")
        .arg(&target_dir);
    for p in POLICIES {
        cmd.args(["-p", p]);
    }
    // The outer build's settings are not the policies': clippy's wrapper,
    // host RUSTFLAGS and coverage instrumentation must not leak into wasm.
    for var in [
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_LLVM_COV",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("cannot run cargo to build the policies");
    if !status.success() {
        panic!(
            "building the wasm32-wasip2 policies failed ({status}); is the target installed? \
             `rustup target add wasm32-wasip2`"
        );
    }
    let out = target_dir.join("wasm32-wasip2").join("policy");
    for p in POLICIES {
        let file = out.join(format!("{}.wasm", p.replace('-', "_")));
        assert!(
            file.exists(),
            "policy build did not produce {}",
            file.display()
        );
    }
    println!("cargo:rustc-env=NMO_POLICY_WASM_DIR={}", out.display());
    // For the crates that depend on this one (`links = "nmo_policies"`).
    println!("cargo:dir={}", out.display());
}

/// The policies are built for `wasm32-wasip2`. rustup adds the target named
/// in rust-toolchain.toml only when it installs the toolchain, so a
/// toolchain that was already there (a fresh machine's preinstalled one)
/// lacks it: add it here, through rustup, when it is missing.
fn ensure_wasm_target() {
    const TARGET: &str = "wasm32-wasip2";
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let installed = sysroot
        .as_ref()
        .is_some_and(|root| root.join("lib/rustlib").join(TARGET).exists());
    if installed {
        return;
    }
    println!(
        "cargo:warning=adding the {TARGET} target with rustup (the policies are built for it)"
    );
    let added = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .is_ok_and(|s| s.success());
    if !added {
        panic!(
            "the {TARGET} target is not installed and `rustup target add {TARGET}` did not work; \
             install it and build again"
        );
    }
}
