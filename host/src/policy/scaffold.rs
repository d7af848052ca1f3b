//! `nmo policy new NAME`: a policy crate that builds without this
//! repository. It carries its own copy of the SDK and the WIT package (the
//! ones this `nmo` was built with, so what it builds is what this `nmo`
//! loads), a policy to start from (the Go operator's rules, with a native
//! unit test), a scenario file and a README with the commands.

use std::path::{Path, PathBuf};

use super::error::ToolError as Error;
type Result<T, E = Error> = std::result::Result<T, E>;

/// The SDK's sources, as this `nmo` was built with them: its `lib.rs`,
/// and every other file of its `src/` (a test holds the list to the
/// folder).
const SDK_LIB: &str = include_str!("../../../policies/sdk/src/lib.rs");
const SDK_MODULES: [(&str, &str); 7] = [
    (
        "alloc.rs",
        include_str!("../../../policies/sdk/src/alloc.rs"),
    ),
    (
        "claims.rs",
        include_str!("../../../policies/sdk/src/claims.rs"),
    ),
    (
        "defaults.rs",
        include_str!("../../../policies/sdk/src/defaults.rs"),
    ),
    (
        "facts.rs",
        include_str!("../../../policies/sdk/src/facts.rs"),
    ),
    (
        "plans.rs",
        include_str!("../../../policies/sdk/src/plans.rs"),
    ),
    (
        "settings.rs",
        include_str!("../../../policies/sdk/src/settings.rs"),
    ),
    (
        "testing.rs",
        include_str!("../../../policies/sdk/src/testing.rs"),
    ),
];
const WIT: &str = include_str!("../../../wit/node-maintenance.wit");
/// The WIT path the SDK uses inside this repository, and in a new crate.
const REPO_WIT_PATH: &str = "path: \"../../wit\"";
const CRATE_WIT_PATH: &str = "path: \"wit\"";
/// The bindings generator the SDK is built with (the workspace's version).
pub(crate) const WIT_BINDGEN: &str = r#"wit-bindgen = { version = "0.61", default-features = false, features = ["macros", "realloc"] }"#;
/// The Rust version the SDK needs (the workspace's `rust-version`).
pub(crate) const RUST_VERSION: &str = "1.95";

/// Whether `name` can name a policy: it becomes the crate's name, the
/// `.wasm` file's stem and the policy's name in the cluster (a ConfigMap
/// key, the `nodemaintenance.medik8s.io/policy` annotation's value).
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name != "builtin";
    if ok {
        Ok(())
    } else {
        Err(Error::Scaffold(format!(
            "{name:?} cannot name a policy: use lowercase letters, digits and '-', starting with a letter, at most 63 characters (and not `builtin`)"
        )))
    }
}

/// The policy crate's Cargo.toml.
fn cargo_toml(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
rust-version = "{RUST_VERSION}"

[lib]
crate-type = ["cdylib"]

[dependencies]
nmo-policy-sdk = {{ path = "nmo-policy-sdk" }}

[profile.release]
opt-level = "s"
panic = "abort"
lto = true
strip = true

# A workspace of its own: the crate builds wherever it is put.
[workspace]
"#
    )
}

/// The SDK copy's Cargo.toml.
fn sdk_toml() -> String {
    format!(
        r#"[package]
name = "nmo-policy-sdk"
description = "Write nmo drain policies in Rust (the copy `nmo policy new` wrote, matching that nmo)"
version = "{version}"
edition = "2024"
rust-version = "{RUST_VERSION}"
license = "Apache-2.0"

[features]
default = ["bump-allocator"]
bump-allocator = []

[dependencies]
{WIT_BINDGEN}
"#,
        version = env!("CARGO_PKG_VERSION"),
    )
}

/// The policy's source: the default's decisions, and a surge for a
/// single-replica Deployment's pod.
fn lib_rs(name: &str, type_name: &str) -> String {
    format!(
        r#"//! The `{name}` drain policy.
//!
//! It starts as the Go Node Maintenance Operator's rules (the SDK's
//! `defaults`) plus one: the pod of a single-replica Deployment is surged
//! (a Ready replacement first) instead of evicted, so the application
//! never goes down for the drain. Change what you need. Every type is
//! documented in `nmo-policy-sdk/wit/node-maintenance.wit`.

use nmo_policy_sdk::*;

struct {type_name};

/// What to do with one pod: evict, delete, skip or block, or (contract
/// 0.3) `PodAction::surge()` (a Ready replacement first),
/// `PodAction::notify(..)` (ask the application first) or
/// `PodAction::wait(..)` (let it complete); `pod.history()` says how long
/// the drain has wanted it gone, `pod.workload()` (contract 0.4) which
/// Deployment or StatefulSet runs it, with its replicas and rollout bounds.
fn action(pod: &Pod) -> PodAction {{
    let default = defaults::pod_action(pod);
    // Surges need a ReplicaSet (a Deployment's) to raise. Reading
    // `workload()` makes the operator read the pods' workloads for each
    // plan: drop this rule for exactly the Go operator's drain.
    let evicted = matches!(default, PodAction::Evict(_));
    if evicted && pod.controller_kind() == Some("ReplicaSet") && pod.is_single_replica() {{
        return PodAction::surge();
    }}
    default
}}

impl Policy for {type_name} {{
    fn plan_drain(_maintenance: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {{
        defaults::plan(&pods, action)
    }}

    fn on_failure(maintenance: Maintenance, failure: Failure) -> Verdict {{
        defaults::on_failure(&maintenance, &failure)
    }}

    /// May the maintenance start now? `fleet` has every node and the other
    /// maintenances; answer `Admission::wait(..)` to hold it back.
    fn admit(maintenance: Maintenance, node: Node, fleet: Fleet) -> Admission {{
        defaults::admit(&maintenance, &node, &fleet)
    }}
}}

export_policy!({type_name});

#[cfg(test)]
mod tests {{
    use super::*;
    use nmo_policy_sdk::testing::pod;

    #[test]
    fn daemonset_pods_stay_and_the_rest_leave() {{
        let web = pod("default", "web-1").owned_by("ReplicaSet", "web-5d4f");
        let agent = pod("kube-system", "agent-x").owned_by("DaemonSet", "agent");
        assert!(matches!(action(&web), PodAction::Evict(_)));
        assert!(matches!(action(&agent), PodAction::Skip(_)));
    }}

    #[test]
    fn a_single_replica_deployment_surges() {{
        let solo = pod("default", "cart-1").in_deployment("cart", 1);
        let wide = pod("default", "web-1").in_deployment("web", 3);
        assert!(matches!(action(&solo), PodAction::Surge(_)));
        assert!(matches!(action(&wide), PodAction::Evict(_)));
    }}
}}
"#
    )
}

/// The policy's README.
fn readme(name: &str, file_stem: &str) -> String {
    format!(
        r#"# {name}

An nmo drain policy. Needs Rust {RUST_VERSION} or newer and its WebAssembly
target (once per machine: `rustup target add wasm32-wasip2`).

```sh
cargo test                                        # the native unit tests
cargo build --release --target wasm32-wasip2      # the policy
nmo policy test target/wasm32-wasip2/release/{file_stem}.wasm scenarios/
```

Cargo names the file after the crate with `-` turned into `_`
(`{file_stem}.wasm`). In the cluster a policy is named by its key in the
policies ConfigMap without `.wasm`: add it as `{name}.wasm`:

```sh
nmo policy add target/wasm32-wasip2/release/{file_stem}.wasm --name {name}
```

checks it as the operator will (`nmo policy check`), then adds (or
replaces) its one key in the operator's policies ConfigMap
(`--policy-configmap NAMESPACE/NAME`; default: the one `deploy/` installs),
keeping every other policy and `policies.yaml`; the operator reloads it
within seconds. (Not `kubectl create configmap … | kubectl apply`: that
replaces the whole ConfigMap, and the other policies go with it.) Then
choose it in `policies.yaml`, or for one maintenance
with the annotation `nodemaintenance.medik8s.io/policy: {name}`.

Settings: give the policy a `settings` map in `policies.yaml`
(`settings: {{{name}: {{timeout: 30m}}}}`), read it with
`Settings::current()`, and check it in `validate_settings` (the default
refuses any setting). Scenarios can set it too (`settings: {{...}}`), and
can describe a fleet (`fleet:`) to test `admit`.

`nmo-policy-sdk/` is the SDK and WIT package of the `nmo` that wrote this
crate (contract {contract}); a newer `nmo policy new` writes the matching
ones.
"#,
        contract = nmo_policy_runtime::CONTRACT_VERSION,
    )
}

/// The scenarios the policy starts with.
const SCENARIO: &str = r#"# Scenarios for `nmo policy test`: a maintenance, a node and pods as
# `kubectl get pods -o yaml` prints them (or `podsFrom: pods.yaml`, the
# saved output as is), and what the policy must answer. One per document.
name: a ReplicaSet pod is evicted, a DaemonSet pod stays
pods:
  - metadata:
      name: web-1
      ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d4f, uid: r1, controller: true}]
    spec: {containers: [{name: web, image: nginx}]}
  - metadata:
      name: agent-x
      namespace: kube-system
      ownerReferences: [{apiVersion: apps/v1, kind: DaemonSet, name: agent, uid: d1, controller: true}]
    spec: {containers: [{name: agent, image: agent}]}
expect:
  decisions:
    default/web-1: evict
    kube-system/agent-x: skip
---
name: the pod of a single-replica Deployment surges
pods:
  - metadata:
      name: cart-6c8-a
      ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: cart-6c8, uid: r2, controller: true}]
    spec: {containers: [{name: cart, image: cart}]}
workloads:     # what the operator reads for `pod.workload()`, as kubectl prints it
  - kind: ReplicaSet
    metadata:
      name: cart-6c8
      ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: cart, uid: d2, controller: true}]
  - {kind: Deployment, metadata: {name: cart}, spec: {replicas: 1}}
expect:
  decisions:
    default/cart-6c8-a: surge
---
name: an incomplete drain is tried again after 5 s
failure:
  drainIncomplete: {pending: [default/web-1], timedOut: true, message: "drain did not complete"}
expect:
  verdict: {retryAfterMs: 5000}
"#;

/// The files of a new policy crate, by path relative to its directory.
pub fn files(name: &str) -> Result<Vec<(PathBuf, String)>> {
    check_name(name)?;
    let file_stem = name.replace('-', "_");
    let sdk_lib = SDK_LIB.replace(REPO_WIT_PATH, CRATE_WIT_PATH);
    if sdk_lib == SDK_LIB {
        return Err(Error::Scaffold(
            "the embedded SDK no longer names its WIT path; rebuild nmo".into(),
        ));
    }
    let type_name: String = name
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    let mut files: Vec<(PathBuf, String)> = vec![
        ("Cargo.toml".into(), cargo_toml(name)),
        (".gitignore".into(), "/target\n".into()),
        ("README.md".into(), readme(name, &file_stem)),
        ("src/lib.rs".into(), lib_rs(name, &type_name)),
        ("scenarios/basic.yaml".into(), SCENARIO.into()),
        ("nmo-policy-sdk/Cargo.toml".into(), sdk_toml()),
        ("nmo-policy-sdk/src/lib.rs".into(), sdk_lib),
        ("nmo-policy-sdk/wit/node-maintenance.wit".into(), WIT.into()),
    ];
    for (file, text) in SDK_MODULES {
        files.push((Path::new("nmo-policy-sdk/src").join(file), text.into()));
    }
    Ok(files)
}

/// Writes a new policy crate `name` under `parent`; refuses to touch a
/// directory that exists.
pub fn create(parent: &Path, name: &str) -> Result<PathBuf> {
    let files = files(name)?;
    let dir = parent.join(name);
    if dir.exists() {
        return Err(Error::Scaffold(format!(
            "{} already exists; nothing was written",
            dir.display()
        )));
    }
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(p) = path.parent() {
            std::fs::create_dir_all(p)
                .map_err(|e| Error::Scaffold(format!("cannot create {}: {e}", p.display())))?;
        }
        std::fs::write(&path, text)
            .map_err(|e| Error::Scaffold(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new crate carries every file of the SDK's `src/`.
    #[test]
    fn the_crate_carries_every_sdk_source() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/sdk/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f != "lib.rs")
            .collect();
        on_disk.sort();
        let carried: Vec<&str> = SDK_MODULES.iter().map(|(f, _)| *f).collect();
        assert_eq!(on_disk, carried, "update SDK_MODULES");
    }

    #[test]
    fn names_that_cannot_name_a_policy_are_refused() {
        for bad in [
            "",
            "Gentle",
            "-x",
            "x-",
            "a_b",
            "a.b",
            "1abc",
            "builtin",
            &"a".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["gentle", "one-per-zone", "p2"] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn the_crate_matches_the_workspace_it_came_from() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        assert!(
            workspace.contains(WIT_BINDGEN),
            "wit-bindgen changed: update WIT_BINDGEN"
        );
        assert!(
            workspace.contains(&format!("rust-version = \"{RUST_VERSION}\"")),
            "rust-version changed: update RUST_VERSION"
        );
        let files = files("my-policy").unwrap();
        let lib = &files
            .iter()
            .find(|(p, _)| p.ends_with("nmo-policy-sdk/src/lib.rs"))
            .unwrap()
            .1;
        assert!(lib.contains(CRATE_WIT_PATH));
        let readme = &files
            .iter()
            .find(|(p, _)| p.ends_with("README.md"))
            .unwrap()
            .1;
        assert!(readme.contains("target/wasm32-wasip2/release/my_policy.wasm"));
        assert!(readme.contains(
            "nmo policy add target/wasm32-wasip2/release/my_policy.wasm --name my-policy"
        ));
    }

    #[test]
    fn an_existing_directory_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("taken")).unwrap();
        std::fs::write(dir.path().join("taken/keep.txt"), "mine").unwrap();
        let err = create(dir.path(), "taken").unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("taken/keep.txt")).unwrap(),
            "mine"
        );
        let made = create(dir.path(), "fresh").unwrap();
        assert!(
            made.join("nmo-policy-sdk/wit/node-maintenance.wit")
                .exists()
        );
    }
}
