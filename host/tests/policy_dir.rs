//! The policy directory: policies.yaml, a kubelet-style ConfigMap mount,
//! hot reload that keeps the last good set, the compiled-artifact cache,
//! and which policy a running maintenance uses across a reload.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use kube::api::DeleteParams;
use nmo::crd::MaintenancePhase;
use nmo::policy::set::Snapshot;
use nmo::policy::{EngineConfig, PolicyCache, PolicyEngine, PolicySet, PolicyStore, Reload};
use serde_json::json;

/// An engine whose decisions and stores' reloads are counted.
fn engine() -> PolicyEngine {
    PolicyEngine::observed(EngineConfig::default(), metrics().policy.observer()).unwrap()
}

/// Writes `files` as a kubelet writes a ConfigMap volume: a fresh
/// timestamped directory, `..data` swapped to it atomically, and a
/// top-level link per key.
fn configmap_update(dir: &Path, version: u32, files: &[(&str, Vec<u8>)]) {
    std::fs::create_dir_all(dir).unwrap();
    let ts = format!("..2026_11_29_00_00_{version:02}.{}", 100 + version);
    std::fs::create_dir(dir.join(&ts)).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(&ts).join(name), bytes).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    // Links for the keys; old keys' links are removed.
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !files.iter().any(|(f, _)| *f == name) {
            std::fs::remove_file(dir.join(&name)).unwrap();
        }
    }
    for (name, _) in files {
        let link = dir.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), link).unwrap();
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const RULES: &str = r#"
default: never-force
rules:
  - nodeSelector: {matchLabels: {workload: databases}}
    policy: stateful-last
  - nodeSelector: "tier in (batch, ml)"
    policy: builtin
"#;

#[test]
fn policies_yaml_picks_by_annotation_then_rule_then_default() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("never-force.wasm"),
        built_policy("never_force"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("stateful-last.wasm"),
        built_policy("stateful_last"),
    )
    .unwrap();
    std::fs::write(dir.path().join("policies.yaml"), RULES).unwrap();
    std::fs::write(dir.path().join("README.md"), "ignored").unwrap();
    let set = PolicySet::load(&engine(), &Snapshot::read(dir.path()).unwrap(), None).unwrap();
    assert_eq!(set.names(), ["builtin", "never-force", "stateful-last"]);

    let pick = |annotation: Option<&str>, node: Option<&[(&str, &str)]>| {
        let node = node.map(labels);
        let s = set.select(annotation, node.as_ref()).unwrap();
        (s.name, s.why)
    };
    assert_eq!(
        pick(None, Some(&[("workload", "databases")])),
        (
            "stateful-last".into(),
            r#"rule nodeSelector {"matchLabels":{"workload":"databases"}}"#.into()
        )
    );
    assert_eq!(
        pick(None, Some(&[("tier", "ml")])).0,
        "builtin",
        "string selectors work"
    );
    assert_eq!(
        pick(None, Some(&[("tier", "web")])),
        ("never-force".into(), "default".into())
    );
    assert_eq!(pick(None, None).0, "never-force", "no node: the default");
    assert_eq!(
        pick(Some("builtin"), Some(&[("workload", "databases")])),
        (
            "builtin".into(),
            "annotation nodemaintenance.medik8s.io/policy".into()
        ),
        "the annotation beats the rules"
    );
    // `default` names the embedded default, as it is called outside a set
    // (the demo, a single policy's status).
    assert!(set.contains("default"));
    assert_eq!(pick(Some("default"), None).0, "builtin");
    let err = set.select(Some("gpu-careful"), None).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"policy "gpu-careful" is not loaded (loaded: builtin, never-force, stateful-last)"#
    );
    assert_eq!(err.category(), "not_found");

    // Without policies.yaml: default.wasm if there is one, else builtin.
    std::fs::remove_file(dir.path().join("policies.yaml")).unwrap();
    let set = PolicySet::load(&engine(), &Snapshot::read(dir.path()).unwrap(), None).unwrap();
    assert_eq!(set.default_name(), "builtin");
    std::fs::write(dir.path().join("default.wasm"), built_policy("give_up")).unwrap();
    let set = PolicySet::load(&engine(), &Snapshot::read(dir.path()).unwrap(), None).unwrap();
    assert_eq!(set.default_name(), "default");
}

#[test]
fn bad_policy_directories_are_refused_with_a_reason() {
    let engine = engine();
    type Files<'a> = &'a [(&'a str, &'a [u8])];
    let cases: &[(&str, Files, &str)] = &[
        (
            "a rule naming a missing policy",
            &[("policies.yaml", b"rules: [{nodeSelector: {matchLabels: {a: b}}, policy: nope}]")],
            r#"policies.yaml: rule 1 names policy "nope", which is not in the directory (policies: builtin)"#,
        ),
        (
            "a default naming a missing policy",
            &[("policies.yaml", b"default: gone")],
            r#"default names policy "gone""#,
        ),
        (
            "an unknown field",
            &[("policies.yaml", b"defualt: builtin")],
            "unknown field `defualt`",
        ),
        (
            "an empty selector",
            &[("policies.yaml", b"rules: [{nodeSelector: {}, policy: builtin}]")],
            "an empty nodeSelector would match every node",
        ),
        (
            "a bad selector",
            &[("policies.yaml", b"rules: [{nodeSelector: {matchExpressions: [{key: a, operator: Near}]}, policy: builtin}]")],
            "unknown selector operator",
        ),
        (
            "a file that is not WebAssembly",
            &[("broken.wasm", b"<html>not found</html>")],
            "policy broken: cannot load: not a WebAssembly file",
        ),
        (
            "the reserved name",
            &[("builtin.wasm", b"\0asm\x0d\0\x01\0")],
            "the name \"builtin\" is reserved",
        ),
        (
            "settings for a policy that is not there",
            &[("policies.yaml", b"settings: {give-up: {timeout: 5m}}")],
            r#"policies.yaml: settings names policy "give-up", which is not in the directory"#,
        ),
        (
            "a setting that is a list",
            &[("policies.yaml", b"settings: {builtin: {nodes: [a, b]}}")],
            "settings of builtin: nodes must be a string, number or boolean, not a list",
        ),
        (
            "settings the policy refuses",
            &[("policies.yaml", b"settings: {builtin: {timeout: 5m}}")],
            r#"policy builtin refused its settings: unknown setting "timeout": this policy takes no settings"#,
        ),
    ];
    for (what, files, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in *files {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let err = PolicySet::load(&engine, &Snapshot::read(dir.path()).unwrap(), None)
            .expect_err(what)
            .to_string();
        assert!(err.contains(want), "{what}: {err}");
    }
}

fn reloads(store: &PolicyStore, result: ReloadResult) -> u64 {
    store.metrics().expect("a counted store").reloads(result)
}

fn reload_ok(store: &PolicyStore) -> i64 {
    store.metrics().expect("a counted store").reload_ok()
}

#[test]
fn a_configmap_update_is_reloaded_and_a_bad_one_keeps_the_last_good_set() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("policies");
    configmap_update(
        &dir,
        1,
        &[("never-force.wasm", built_policy("never_force"))],
    );
    let store = PolicyStore::from_dir(engine(), &dir, None).unwrap();
    assert_eq!(store.current().names(), ["builtin", "never-force"]);
    assert_eq!(store.reload(), Reload::Unchanged);

    // Version 2: a policies.yaml and another policy.
    configmap_update(
        &dir,
        2,
        &[
            ("never-force.wasm", built_policy("never_force")),
            ("opt-out.wasm", built_policy("opt_out")),
            ("policies.yaml", b"default: opt-out\n".to_vec()),
        ],
    );
    assert_eq!(store.reload(), Reload::Reloaded);
    assert_eq!(store.current().default_name(), "opt-out");
    let good = store.current().fingerprint().to_owned();

    // Version 3 is broken: the set stays version 2's, and says why.
    // The store counts in its own registry: exact counts.
    assert_eq!(reloads(&store, ReloadResult::Success), 1);
    assert_eq!(reloads(&store, ReloadResult::Failure), 0);
    configmap_update(
        &dir,
        3,
        &[
            ("opt-out.wasm", b"garbage".to_vec()),
            ("policies.yaml", b"default: opt-out\n".to_vec()),
        ],
    );
    let Reload::Rejected(why) = store.reload() else {
        panic!("a broken set must be rejected")
    };
    assert!(
        why.contains("policy opt-out: cannot load: not a WebAssembly file"),
        "{why}"
    );
    assert_eq!(store.current().fingerprint(), good);
    assert_eq!(
        store.current().names(),
        ["builtin", "never-force", "opt-out"]
    );
    assert_eq!(reloads(&store, ReloadResult::Failure), 1);
    assert_eq!(reload_ok(&store), 0);
    let ready = store.readiness();
    assert!(
        ready.contains("new content was rejected, the last good set stays in use: policy opt-out"),
        "{ready}"
    );
    // The same broken content is not retried (nor logged again).
    assert_eq!(store.reload(), Reload::Unchanged);
    assert_eq!(reloads(&store, ReloadResult::Failure), 1);

    // Version 4 fixes it.
    configmap_update(&dir, 4, &[("give-up.wasm", built_policy("give_up"))]);
    assert_eq!(store.reload(), Reload::Reloaded);
    assert_eq!(store.current().names(), ["builtin", "give-up"]);
    assert_eq!(store.rejected(), None);
    assert!(!store.readiness().contains("rejected"));
    assert_eq!(reloads(&store, ReloadResult::Success), 2);
    assert_eq!(reload_ok(&store), 1);
}

/// Makes a change (`change`) until `seen` holds, again every 2 s, for at
/// most 30 s; `never` says what did not happen.
async fn changed_until(change: impl Fn(), seen: impl Fn() -> bool, never: &str) {
    let started = Instant::now();
    loop {
        change();
        let made = Instant::now();
        while made.elapsed() < Duration::from_secs(2) {
            if seen() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{never}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_directory_is_picked_up_without_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("policies");
    configmap_update(
        &dir,
        1,
        &[("never-force.wasm", built_policy("never_force"))],
    );
    let store = PolicyStore::from_dir(engine(), &dir, None).unwrap();
    // A poll interval far beyond the test: only the inotify event can
    // trigger this reload.
    let watcher = tokio::spawn(
        store
            .clone()
            .watch(Duration::from_millis(100), Duration::from_secs(3600)),
    );
    // The watch may not be registered yet when the first change comes (a
    // busy machine): the change is made again, as a ConfigMap's next
    // update would, until it is seen; only inotify can see it.
    let version = std::sync::atomic::AtomicU32::new(2);
    changed_until(
        || {
            configmap_update(
                &dir,
                version.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                &[("stateful-last.wasm", built_policy("stateful_last"))],
            )
        },
        || store.current().names() == ["builtin", "stateful-last"],
        &format!("never reloaded: {}", store.readiness()),
    )
    .await;
    // A plain directory works too.
    let plain = root.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let store2 = PolicyStore::from_dir(engine(), &plain, None).unwrap();
    assert_eq!(store2.current().names(), ["builtin"]);
    let watcher2 = tokio::spawn(
        store2
            .clone()
            .watch(Duration::from_millis(100), Duration::from_secs(3600)),
    );
    changed_until(
        || std::fs::write(plain.join("never-force.wasm"), built_policy("never_force")).unwrap(),
        || store2.current().contains("never-force"),
        "plain directory never reloaded",
    )
    .await;
    watcher.abort();
    watcher2.abort();
}

#[test]
fn no_policy_directory_means_the_embedded_default() {
    let root = tempfile::tempdir().unwrap();
    let store = PolicyStore::from_dir(engine(), &root.path().join("absent"), None).unwrap();
    assert_eq!(store.current().names(), ["builtin"]);
    assert_eq!(store.current().default_name(), "builtin");
}

fn artifacts(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    v.sort();
    v
}

#[test]
fn compiled_policies_are_cached_after_their_self_check_and_a_damaged_artifact_is_rebuilt() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    let cache = PolicyCache::open(&dir).unwrap();
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700,
        "the cache directory is created private"
    );
    let engine = engine();
    let wasm = built_policy("never_force");
    let p1 = engine
        .load_cached("never-force", &wasm, Some(&cache))
        .unwrap();
    assert!(
        artifacts(&dir).is_empty(),
        "nothing is cached before the policy passed its self-check"
    );
    nmo::policy::selfcheck::run(&p1).unwrap();
    p1.cache_in(&cache);
    let files = artifacts(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        name,
        format!("{}-{}.cwasm", engine.compat_hash(), p1.digest())
    );
    let written = std::fs::metadata(&files[0]).unwrap().modified().unwrap();

    // A restart (a new engine, same settings) uses the artifact as is.
    let engine2 = PolicyEngine::new(EngineConfig::default()).unwrap();
    assert_eq!(engine2.compat_hash(), engine.compat_hash());
    let p2 = engine2
        .load_cached("never-force", &wasm, Some(&cache))
        .unwrap();
    assert!(p2.from_cache());
    p2.cache_in(&cache);
    assert_eq!(
        std::fs::metadata(&files[0]).unwrap().modified().unwrap(),
        written,
        "not recompiled, not rewritten"
    );
    nmo::policy::selfcheck::run(&p2).unwrap();

    // A damaged artifact is never loaded: it is compiled again.
    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes[..bytes.len() / 2]).unwrap();
    let p3 = engine2
        .load_cached("never-force", &wasm, Some(&cache))
        .unwrap();
    assert!(!p3.from_cache());
    nmo::policy::selfcheck::run(&p3).unwrap();
    p3.cache_in(&cache);
    assert_eq!(
        std::fs::read(&files[0]).unwrap().len(),
        bytes.len(),
        "rewritten"
    );
}

#[test]
fn a_cache_directory_that_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = PolicyCache::open(&open)
        .expect_err("world-writable")
        .to_string();
    assert!(err.contains("lets others write"), "{err}");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
    let err = PolicyCache::open(&open)
        .expect_err("group-writable")
        .to_string();
    assert!(err.contains("lets others write"), "{err}");

    let link = root.path().join("link");
    let private = root.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&private, &link).unwrap();
    let err = PolicyCache::open(&link).expect_err("a symlink").to_string();
    assert!(err.contains("not a directory"), "{err}");
    PolicyCache::open(&private).expect("a private directory is used");

    // Owned by someone else (only root can give a directory away).
    if std::os::unix::fs::chown(&private, Some(65534), Some(65534)).is_ok() {
        let err = PolicyCache::open(&private)
            .expect_err("not ours")
            .to_string();
        assert!(err.contains("owned by uid 65534"), "{err}");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_set_caches_only_policies_that_loaded_and_prunes_those_that_left() {
    let root = tempfile::tempdir().unwrap();
    let cache = PolicyCache::open(&root.path().join("cache")).unwrap();
    let engine = engine();
    let digest = |name: &str| {
        engine
            .load(name, &built_policy(name))
            .unwrap()
            .digest()
            .to_owned()
    };
    let cached = |name: &str| {
        let d = digest(name);
        artifacts(cache.dir())
            .iter()
            .any(|p| p.to_string_lossy().contains(&d))
    };
    let dir = root.path().join("policies");
    std::fs::create_dir(&dir).unwrap();
    // A component of the wrong world compiles, then is refused: never cached.
    let wrong_world = wat::parse_str("(component)").unwrap();
    std::fs::write(dir.join("a-wrong.wasm"), &wrong_world).unwrap();
    std::fs::write(dir.join("never-force.wasm"), built_policy("never_force")).unwrap();
    PolicySet::load(&engine, &Snapshot::read(&dir).unwrap(), Some(&cache))
        .expect_err("the wrong world rejects the set");
    // Policies load in parallel: never-force may have passed its own
    // self-check (and been cached) before the other was refused; the
    // refused one never is.
    let wrong_digest = sha256_hex(&wrong_world);
    assert!(
        !artifacts(cache.dir())
            .iter()
            .any(|p| p.to_string_lossy().contains(&wrong_digest)),
        "the refused policy was cached"
    );
    assert!(
        artifacts(cache.dir()).len() <= 2,
        "only policies that passed: {:?}",
        artifacts(cache.dir())
    );

    std::fs::remove_file(dir.join("a-wrong.wasm")).unwrap();
    std::fs::write(dir.join("opt-out.wasm"), built_policy("opt_out")).unwrap();
    PolicySet::load(&engine, &Snapshot::read(&dir).unwrap(), Some(&cache)).unwrap();
    assert!(cached("never_force") && cached("opt_out"));
    assert_eq!(artifacts(cache.dir()).len(), 3);

    std::fs::remove_file(dir.join("never-force.wasm")).unwrap();
    PolicySet::load(&engine, &Snapshot::read(&dir).unwrap(), Some(&cache)).unwrap();
    assert!(!cached("never_force"), "pruned once it left the set");
    assert!(cached("opt_out"));
    assert_eq!(artifacts(cache.dir()).len(), 2);
}

/// A maintenance finishes with the policy it started with; maintenances
/// created after a reload use the new set; an unknown policy name waits,
/// saying so, and acts on nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_maintenances_keep_their_policy_across_a_reload() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("policies");
    configmap_update(
        &dir,
        1,
        &[
            ("never-force.wasm", built_policy("never_force")),
            ("policies.yaml", b"default: never-force\n".to_vec()),
        ],
    );
    let store = PolicyStore::from_dir(engine(), &dir, None).unwrap();
    let env = Env::start_store(3, store.clone()).await;
    for node in ["worker-1", "worker-2", "worker-3"] {
        env.cluster
            .create(bare(&format!("bare-{node}"), node, json!({}), 0))
            .unwrap();
    }

    // Under never-force, the bare pod blocks the drain.
    env.create_nm_with_policy("nm-1", "worker-1", None).await;
    env.wait_status("nm-1", "blocked", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("has no controller"))
    })
    .await;

    // The set changes: the embedded default only (which evicts bare pods).
    configmap_update(&dir, 2, &[]);
    assert_eq!(store.reload(), Reload::Reloaded);
    assert_eq!(store.current().names(), ["builtin"]);

    // A new maintenance uses the new set.
    env.create_nm_with_policy("nm-2", "worker-2", None).await;
    env.wait_phase("nm-2", MaintenancePhase::Succeeded).await;
    assert!(env.pods_on("worker-2").await.is_empty());

    // One naming a policy that is not loaded waits and says so.
    env.create_nm_with_policy("nm-3", "worker-3", Some("never-force"))
        .await;
    let s = env
        .wait_status("nm-3", "told the policy is missing", |s| {
            s.last_error.is_some()
        })
        .await;
    assert_eq!(
        s.last_error.as_deref(),
        Some(r#"policy "never-force" is not loaded (loaded: builtin)"#)
    );
    assert_eq!(env.pods_on("worker-3").await.len(), 1, "nothing evicted");

    // nm-1 keeps never-force: woken now (an annotation changed), it is
    // still decided by never-force (recorded in its status), still blocked
    // on the bare pod, and the pod is still there. (never-force retries
    // after 30 s; the wake-up reconciles it at once and is held until then,
    // so this checks what the reload left, not a retry.)
    let before = env.nms().get("nm-1").await.unwrap();
    env.nms()
        .patch(
            "nm-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"touched": "1"}}})),
        )
        .await
        .unwrap();
    let s = env
        .wait_status("nm-1", "seen after the reload", |s| s.policy.is_some())
        .await;
    assert!(
        s.policy
            .as_deref()
            .unwrap()
            .starts_with("never-force@sha256:"),
        "{s:?}"
    );
    assert_eq!(s.phase, Some(MaintenancePhase::Running));
    assert!(s.last_error.unwrap().contains("has no controller"));
    assert_eq!(env.pods_on("worker-1").await.len(), 1);
    assert_eq!(
        before.status.unwrap().policy,
        s.policy,
        "the choice did not change"
    );

    // Deleted and created again, it adopts the new set.
    env.nms()
        .delete("nm-1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone("nm-1").await;
    env.create_nm_with_policy("nm-1", "worker-1", None).await;
    env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    assert!(env.pods_on("worker-1").await.is_empty());
    env.stop().await;
}

/// The choice is recorded in the status, so a restarted operator (or a new
/// leader) keeps deciding a running maintenance with the same policy even
/// when the rules have changed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_keeps_the_recorded_policy() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("policies");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("never-force.wasm"), built_policy("never_force")).unwrap();
    std::fs::write(dir.join("policies.yaml"), "default: never-force\n").unwrap();
    let store = PolicyStore::from_dir(engine(), &dir, None).unwrap();
    let mut env = Env::start_store(2, store).await;
    for node in ["worker-1", "worker-2"] {
        env.cluster
            .create(bare(&format!("bare-{node}"), node, json!({}), 0))
            .unwrap();
    }
    env.create_nm_with_policy("nm-1", "worker-1", None).await;
    let s = env
        .wait_status("nm-1", "blocked", |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("has no controller"))
        })
        .await;
    let recorded = s.policy.expect("the choice is recorded");
    assert!(recorded.starts_with("never-force@sha256:"), "{recorded}");

    // The operator stops; the rules change (never-force is still there,
    // but no longer the default); a new operator starts.
    env.controller.abort();
    let _ = (&mut env.controller).await;
    std::fs::write(dir.join("policies.yaml"), "default: builtin\n").unwrap();
    let store = PolicyStore::from_dir(engine(), &dir, None).unwrap();
    let metrics = store.metrics().expect("a counted store").clone();
    env.controller = start_controller_with(&env.client, store);

    // A new maintenance follows the new rules...
    env.create_nm_with_policy("nm-2", "worker-2", None).await;
    let s = env.wait_phase("nm-2", MaintenancePhase::Succeeded).await;
    assert!(
        s.status
            .unwrap()
            .policy
            .unwrap()
            .starts_with("builtin@sha256:"),
        "nm-2 chose by the new rules"
    );
    // ...the running one keeps its policy: once the new operator has
    // planned nm-1's drain again (nm-2's plan, then at least one of
    // nm-1's), it is still blocked on the bare pod.
    wait_until(
        "nm-1 planned by the new operator",
        Duration::from_secs(20),
        || async { policy_calls(&metrics, Decision::PlanDrain) >= 2 },
    )
    .await;
    let s = env.nms().get("nm-1").await.unwrap().status.unwrap();
    assert_eq!(s.phase, Some(MaintenancePhase::Running));
    assert_eq!(s.policy.as_deref(), Some(recorded.as_str()));
    assert_eq!(env.pods_on("worker-1").await.len(), 1);
    env.stop().await;
}

#[test]
fn settings_in_policies_yaml_reach_the_policy_and_a_bad_one_refuses_the_set() {
    let engine = engine();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("give-up.wasm"), built_policy("give_up")).unwrap();
    std::fs::write(
        dir.path().join("policies.yaml"),
        "default: give-up\nsettings:\n  give-up: {timeout: 30m}\n",
    )
    .unwrap();
    let set = PolicySet::load(&engine, &Snapshot::read(dir.path()).unwrap(), None).unwrap();
    let selected = set.select(None, None).unwrap();
    assert_eq!(selected.name, "give-up");
    let mut m = nmo::fixtures::maintenance("x");
    m.elapsed_ms = 31 * 60_000;
    let failure = nmo::policy::types::Failure::DrainIncomplete(nmo::policy::types::DrainReport {
        pending: Vec::new(),
        pdb_blocked: Vec::new(),
        blocked: Vec::new(),
        waited: Vec::new(),
        timed_out: true,
        message: "drain did not complete after 30s".into(),
    });
    match selected.policy.on_failure(&m, &failure).unwrap() {
        nmo::policy::Verdict::Fail(message) => {
            assert!(message.starts_with("gave up after 30m"), "{message}")
        }
        other => panic!("the configured 30m limit is past: {other:?}"),
    }
    // The same policy refuses a setting it cannot read, in its own words.
    std::fs::write(
        dir.path().join("policies.yaml"),
        "settings:\n  give-up: {timeout: half an hour}\n",
    )
    .unwrap();
    let err = PolicySet::load(&engine, &Snapshot::read(dir.path()).unwrap(), None)
        .expect_err("refused")
        .to_string();
    assert_eq!(
        err,
        "policy give-up refused its settings: setting timeout: cannot read \"half an hour\" as a duration (use 90s, 15m, 2h)"
    );
}

/// A deeply nested `policies.yaml` (once 77 s of a core to refuse) is
/// refused by its depth, whatever its size within the ConfigMap's 1 MiB.
#[test]
fn a_deeply_nested_policies_yaml_is_refused_by_its_depth() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    for nested in [
        format!(
            "settings: {{builtin: {{x: {}{}}}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        ),
        (0..2_000)
            .map(|i| format!("{}- \n", " ".repeat(i)))
            .collect(),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("policies.yaml"), &nested).unwrap();
        let err = PolicySet::load(&engine, &Snapshot::read(dir.path()).unwrap(), None)
            .expect_err("refused")
            .to_string();
        let lower = err.to_lowercase();
        assert!(
            err.contains("policies.yaml")
                && (lower.contains("depth") || lower.contains("recursion limit")),
            "{err}"
        );
    }
}

/// `nmo policy add`: one policy into the operator's policies ConfigMap,
/// as a merge patch of its one key: the other policies and policies.yaml
/// stay; a policy that fails its check, or one that would take the
/// ConfigMap past 1 MiB, changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nmo_policy_add_and_rm_change_one_policy_and_keep_the_others() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::ConfigMap;
    let (cluster, client) = start_cluster(1).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig).unwrap();
    let ns = "node-maintenance-operator-system";
    cluster
        .create(
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .unwrap();
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), ns);
    let default = built_policy("default");
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("node-maintenance-operator-policies".into()),
            ..Default::default()
        },
        data: Some([("policies.yaml".to_owned(), "default: default\n".to_owned())].into()),
        binary_data: Some([("default.wasm".to_owned(), ByteString(default.clone()))].into()),
        ..Default::default()
    };
    api.create(&Default::default(), &cm).await.unwrap();
    // `nmo policy VERB ARGS… --kubeconfig`: whether it succeeded, and
    // what it printed.
    let policy = |verb: &str, args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
            .args(["policy", verb])
            .args(args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .unwrap();
        (out.status.success(), common::printed(&out))
    };
    let add = |file: &std::path::Path, extra: &[&str]| {
        let mut args = vec![file.as_os_str()];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        policy("add", &args)
    };
    let never_force = dir.path().join("never_force.wasm");
    std::fs::write(&never_force, built_policy("never_force")).unwrap();
    let (ok, out) = add(&never_force, &[]);
    assert!(ok, "{out}");
    assert!(
        out.starts_with("configmap/node-maintenance-operator-policies patched: never-force.wasm"),
        "{out}"
    );
    let now = api.get("node-maintenance-operator-policies").await.unwrap();
    let binary = now.binary_data.clone().unwrap();
    assert_eq!(binary["default.wasm"].0, default);
    assert_eq!(binary["never-force.wasm"].0, built_policy("never_force"));
    assert_eq!(
        now.data.clone().unwrap()["policies.yaml"],
        "default: default\n"
    );

    // Not a policy: refused before the cluster is touched.
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"\0asm not really").unwrap();
    let (ok, out) = add(&garbage, &["--name", "garbage"]);
    assert!(!ok, "{out}");
    // Past 1 MiB: refused, saying so.
    let mut big = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("full".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    big.binary_data = Some([("pad.bin".to_owned(), ByteString(vec![7; 1_000_000]))].into());
    api.create(&Default::default(), &big).await.unwrap();
    let (ok, out) = add(&never_force, &["--policy-configmap", &format!("{ns}/full")]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("past the 1048576 a ConfigMap holds; nothing changed"),
        "{out}"
    );
    let after = api.get("node-maintenance-operator-policies").await.unwrap();
    assert_eq!(after.binary_data.unwrap().len(), 2);
    assert_eq!(api.get("full").await.unwrap().binary_data.unwrap().len(), 1);

    // `nmo policy rm`: one policy out, the others kept; refused, nothing
    // changed, when policies.yaml still names it or a maintenance that has
    // not finished drains with it (unless --force).
    let rm = |args: &[&str]| {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        policy("rm", &args)
    };
    // `nmo policy inspect`: a policy of the ConfigMap, by name, as the
    // operator loads it; a file, named as `add` names it.
    let inspect = |what: &std::ffi::OsStr| policy("inspect", &[what]);
    let digest = {
        use sha2::Digest;
        let d = sha2::Sha256::digest(built_policy("never_force"));
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    for what in [std::ffi::OsStr::new("never-force"), never_force.as_os_str()] {
        let (ok, out) = inspect(what);
        assert!(ok, "{out}");
        for expected in [
            "Name:       never-force".to_owned(),
            format!("SHA-256:    {digest}"),
            format!("Recorded:   never-force@sha256:{}", &digest[..12]),
            "Contract:   medik8s:node-maintenance@0.4.0".to_owned(),
            "Exports:    validate-settings, admit, plan-drain, on-failure".to_owned(),
            "Self-check: passed".to_owned(),
        ] {
            assert!(out.contains(&expected), "missing {expected:?}:\n{out}");
        }
    }
    let (ok, out) = inspect(std::ffi::OsStr::new("ghost"));
    assert!(!ok && out.contains("has no ghost.wasm"), "{out}");
    let (ok, out) = inspect(garbage.as_os_str());
    assert!(!ok && out.contains("garbage"), "{out}");

    let (ok, out) = rm(&["default"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("without default, the operator would refuse the set")
            && out.contains("nothing changed"),
        "{out}"
    );
    let (ok, out) = rm(&["ghost"]);
    assert!(
        !ok && out.contains("has no policy ghost (it has: default, never-force)"),
        "{out}"
    );
    let nms: kube::Api<nmo::crd::NodeMaintenance> = kube::Api::all(client.clone());
    let nm = common::nm("draining", "worker-1");
    nms.create(&Default::default(), &nm).await.unwrap();
    nms.patch_status(
        "draining",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"status": {
            "phase": "Running", "policy": "never-force@sha256:0123456789ab"}})),
    )
    .await
    .unwrap();
    let (ok, out) = rm(&["never-force"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("maintenances that have not finished drain with never-force: draining")
            && out.contains("nothing changed"),
        "{out}"
    );
    assert_eq!(
        api.get("node-maintenance-operator-policies")
            .await
            .unwrap()
            .binary_data
            .unwrap()
            .len(),
        2,
        "nothing changed"
    );
    let (ok, out) = rm(&["never-force", "--force"]);
    assert!(ok, "{out}");
    assert!(
        out.starts_with(
            "configmap/node-maintenance-operator-policies patched: never-force.wasm removed"
        ),
        "{out}"
    );
    let after = api.get("node-maintenance-operator-policies").await.unwrap();
    assert_eq!(
        after.binary_data.unwrap().keys().collect::<Vec<_>>(),
        ["default.wasm"]
    );
    assert_eq!(after.data.unwrap()["policies.yaml"], "default: default\n");
    cluster.stop().await;
}

/// `nmo policy list`: every policy of a folder, loaded as the operator
/// loads it, with its digest (as `status.policy` shows it) and which one is
/// the default; no cluster needed.
#[test]
fn nmo_policy_list_shows_each_policy_its_digest_and_the_default() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("never-force.wasm"),
        common::built_policy("never_force"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("give-up.wasm"),
        common::built_policy("give_up"),
    )
    .unwrap();
    std::fs::write(dir.path().join("policies.yaml"), "default: never-force\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["policy", "list", "-o", "json", "--policy-dir"])
        .arg(dir.path())
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::printed(&out));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let by_name = |n: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == n)
            .unwrap_or_else(|| panic!("{n} in {listed}"))
            .clone()
    };
    use sha2::Digest;
    let sha = format!(
        "{:x}",
        sha2::Sha256::digest(common::built_policy("never_force"))
    );
    assert_eq!(by_name("never-force")["digest"], sha[..12]);
    assert_eq!(by_name("never-force")["default"], true);
    assert_eq!(by_name("give-up")["default"], false);
    assert_eq!(by_name("builtin")["source"], "embedded in nmo");
    assert_eq!(listed.as_array().unwrap().len(), 3, "{listed}");
}
