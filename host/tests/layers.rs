//! The walls between the policy runtime and what is built on it
//! (docs/architecture.md): the runtime crate knows nothing of a
//! Kubernetes client, HTTP, metrics registries, registries of policies or
//! the operator; and of the operator's policy code, only the authors'
//! tools' own callers (the CLI) use the tools.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ is in the workspace")
        .to_path_buf()
}

/// Every package the runtime crate builds on (normal dependencies, all
/// the way down), by name.
fn runtime_dependencies() -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root())
        .args([
            "tree",
            "--locked",
            "-p",
            "nmo-policy-runtime",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_policy_runtime_builds_on_no_client_server_registry_or_operator() {
    let deps = runtime_dependencies();
    assert!(
        deps.iter().any(|d| d == "wasmtime"),
        "the tree was read: {deps:?}"
    );
    let forbidden = [
        "kube",
        "kube-client",
        "kube-runtime",
        "hyper",
        "reqwest",
        "prometheus",
        "oci-client",
        "rustls",
        "nmo",
        "nmo-sim",
    ];
    let found: Vec<&String> = deps
        .iter()
        .filter(|d| forbidden.contains(&d.as_str()))
        .collect();
    assert!(
        found.is_empty(),
        "the policy runtime must not depend on {found:?}"
    );
}

/// The Rust files under `dir`, with their text.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("source folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source file");
                out.push((path, text));
            }
        }
    }
    out
}

#[test]
fn only_the_cli_uses_the_authors_tools() {
    let src = root().join("host/src");
    let allowed = [
        "policy/harness.rs",
        "policy/scaffold.rs",
        "policy/error.rs",
        "policy/mod.rs",
    ];
    let mut offenders = Vec::new();
    for (path, text) in sources(&src) {
        let rel = path.strip_prefix(&src).expect("under src");
        let rel_text = rel.to_string_lossy();
        if allowed.contains(&rel_text.as_ref()) || rel.starts_with("cmd") {
            continue;
        }
        for word in ["harness::", "scaffold::", "ToolError"] {
            if text.contains(word) {
                offenders.push(format!("{rel_text} uses {word}"));
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}
