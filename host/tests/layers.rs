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
    let allowed = ["policy/scaffold.rs", "policy/error.rs", "policy/mod.rs"];
    let mut offenders = Vec::new();
    for (path, text) in sources(&src) {
        let rel = path.strip_prefix(&src).expect("under src");
        let rel_text = rel.to_string_lossy();
        if allowed.contains(&rel_text.as_ref())
            || rel.starts_with("cmd")
            || rel.starts_with("policy/harness")
        {
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

/// The function around byte `at` of `text`: the name of the last `fn`
/// declared before it, and its signature (to the opening brace).
fn enclosing_fn(text: &str, at: usize) -> (String, String) {
    let start = text[..at].rfind("fn ").expect("inside a function");
    let signature = &text[start..start + text[start..].find('{').unwrap_or(0)];
    let name = signature[3..]
        .split(['(', '<'])
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    (name, signature.to_owned())
}

/// One gate for every removal (docs/drain-actions.md): every request that
/// takes a pod off a node (an eviction, a deletion, the lowest deletion
/// cost a surge's hand-over gives the pod its owner then removes) is sent
/// from one of the functions below, each reached only with the pod's
/// budgets' permit (`Removal::budget_permit` / `Budgets::try_permit`, a
/// `Via` saying how the budgets are asked). A new way to remove a pod
/// fails here until it is added with its gate.
#[test]
fn every_pod_removal_passes_the_budgets_gate() {
    // (file, function): how its permit is had.
    let gated: [(&str, &str, &str); 3] = [
        (
            "controller/drain/mod.rs",
            "send_eviction",
            "budget_permit(Via::Eviction",
        ),
        (
            "controller/drain/mod.rs",
            "send_delete",
            "budget_permit(Via::Forced",
        ),
        // The hand-over's last step: called by `lead`, which claims only
        // pods whose surges hold a `Via::HandOver` permit (their own, or
        // one `adopt` took), and by `look` for pods a round claimed so
        // before a restart.
        ("controller/drain/surge/mod.rs", "finish", ""),
    ];
    let src = root().join("host/src");
    // Anywhere: an eviction, the hand-over's deletion cost; in the drain,
    // any deletion (what the operator deletes elsewhere is its own:
    // leases, the maintenances in the CLI).
    let removal_calls = |file: &str| {
        let mut calls = vec![".evict(", "{DELETION_COST: "];
        if file.starts_with("controller/drain/") {
            calls.push(".delete(");
        }
        calls
    };
    let mut found: Vec<(String, String)> = Vec::new();
    for (path, text) in sources(&src) {
        let file = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        for call in removal_calls(&file) {
            for (at, _) in text.match_indices(call) {
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                if text[line_start..at].trim_start().starts_with("//") {
                    continue;
                }
                let (name, _) = enclosing_fn(&text, at);
                found.push((file.clone(), name));
            }
        }
    }
    found.sort();
    found.dedup();
    let mut want: Vec<(String, String)> = gated
        .iter()
        .map(|(f, n, _)| ((*f).to_owned(), (*n).to_owned()))
        .collect();
    want.sort();
    assert_eq!(
        found, want,
        "a pod is removed from a function outside the gate's list"
    );
    for (file, name, gate) in gated.iter().filter(|(_, _, g)| !g.is_empty()) {
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        let start = text.find(&format!("fn {name}")).unwrap();
        let body = &text[start..start + text[start..].find("\n}\n").unwrap()];
        assert!(
            body.contains(gate),
            "{file} {name} takes no permit ({gate})"
        );
    }
    let surge = std::fs::read_to_string(src.join("controller/drain/surge/mod.rs")).unwrap();
    for taker in ["fn look_at", "fn adopt"] {
        let start = surge.find(taker).unwrap();
        let body = &surge[start..start + surge[start..].find("\n}\n").unwrap()];
        assert!(
            body.contains("Via::HandOver"),
            "{taker} hands over without a HandOver permit"
        );
    }
}
