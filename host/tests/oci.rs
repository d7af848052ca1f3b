//! Policies past the ConfigMap's 1 MiB: pushed to an OCI registry with
//! `nmo policy push`, named in policies.yaml by a reference pinned by
//! digest, pulled and verified, kept on disk, and hot-reloaded like the
//! ConfigMap's own. Against a real registry on loopback (CNCF
//! Distribution, built with the control plane) and read back with another
//! client (go-containerregistry's crane).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::real::{self, RealEnv};
use common::*;
use nmo::crd::MaintenancePhase;
use nmo::policy::oci::{Registry, RegistryConfig};
use nmo::policy::{EngineConfig, PolicyEngine, PolicyStore, Reload};
use nmo_control_plane::{Binaries, OciRegistry, Options};

fn policy_engine() -> PolicyEngine {
    PolicyEngine::new(EngineConfig::default()).unwrap()
}

fn built(stem: &str) -> PathBuf {
    Path::new(env!("NMO_POLICY_WASM_DIR")).join(format!("nmo_policy_{stem}.wasm"))
}

/// `nmo policy push FILE REFERENCE`: the pinned reference it prints.
fn push(file: &Path, reference: &str) -> String {
    let stem = file.file_stem().unwrap().to_string_lossy();
    let name = stem.trim_start_matches("nmo_policy_").replace('_', "-");
    let stdout = stdout_of(
        Command::new(env!("CARGO_BIN_EXE_nmo"))
            .args(["policy", "push", "--name", &name])
            .arg(file)
            .arg(reference)
            .env(
                "DOCKER_CONFIG",
                std::env::temp_dir().join("nmo-oci-test-no-docker"),
            ),
    );
    let pinned = stdout.trim().to_owned();
    assert!(
        pinned.contains("@sha256:") && !pinned.contains('\n'),
        "{pinned}"
    );
    pinned
}

fn crane(binaries: &Binaries, args: &[&str]) -> String {
    stdout_of(Command::new(binaries.path("crane")).args(args))
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write_config(dir: &Path, yaml: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("policies.yaml"), yaml).unwrap();
}

fn registry_with_disk(cache: &Path) -> Registry {
    Registry::new(RegistryConfig::default()).with_disk_cache(cache)
}

/// The digest of the policy the set's default names.
fn default_digest(store: &PolicyStore) -> String {
    store
        .current()
        .select(None, None)
        .unwrap()
        .policy
        .digest()
        .to_owned()
}

#[test]
fn a_pushed_policy_is_pulled_by_digest_verified_and_kept_for_a_restart_without_the_registry() {
    let binaries = Binaries::ensure().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let registry = OciRegistry::start(&binaries, tmp.path()).unwrap();
    let file = built("never_force");
    let tagged = format!("{}/nmo/never-force:v1", registry.host());

    let started = Instant::now();
    let pinned = push(&file, &tagged);
    let push_time = started.elapsed();
    assert!(
        pinned.starts_with(&format!("{}/nmo/never-force@sha256:", registry.host())),
        "{pinned}"
    );
    // The same policy pushed again is the same artifact.
    assert_eq!(push(&file, &tagged), pinned);

    // Another client reads a Wasm OCI artifact under that digest.
    let digest = pinned.rsplit_once('@').unwrap().1;
    assert_eq!(crane(&binaries, &["digest", &tagged]).trim(), digest);
    let manifest: serde_json::Value =
        serde_json::from_str(&crane(&binaries, &["manifest", &pinned])).unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    assert_eq!(
        manifest["layers"][0]["digest"],
        format!("sha256:{}", sha256_of(&file))
    );
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.title"],
        "never-force.wasm"
    );

    // The pull alone: manifest and layer, both verified.
    let started = Instant::now();
    let pulled = Registry::default()
        .fetch(&nmo::policy::oci::Pinned::parse(&pinned).unwrap())
        .unwrap();
    let pull_time = started.elapsed();
    assert_eq!(pulled.as_slice(), std::fs::read(&file).unwrap().as_slice());

    // policies.yaml names it by the pinned reference.
    let dir = tmp.path().join("policies");
    let cache = tmp.path().join("cache");
    write_config(
        &dir,
        &format!("default: never-force\npull:\n  never-force: {pinned}\n"),
    );
    let started = Instant::now();
    let store =
        PolicyStore::from_dir_pulling(policy_engine(), &dir, None, registry_with_disk(&cache))
            .unwrap();
    let pull_and_load = started.elapsed();
    assert_eq!(default_digest(&store), sha256_of(&file));
    assert_eq!(store.current().default_name(), "never-force");

    // With the registry gone, a restart (a new process: nothing in memory)
    // takes the verified pull from disk.
    registry.stop();
    let started = Instant::now();
    let again =
        PolicyStore::from_dir_pulling(policy_engine(), &dir, None, registry_with_disk(&cache))
            .unwrap();
    let from_disk = started.elapsed();
    assert_eq!(default_digest(&again), sha256_of(&file));

    // A damaged cached pull is never trusted: checked again, found wrong,
    // pulled again, and with no registry that fails, naming the reference.
    let cached: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wasm"))
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    let mut bytes = std::fs::read(&cached[0]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&cached[0], bytes).unwrap();
    let e = PolicyStore::from_dir_pulling(policy_engine(), &dir, None, registry_with_disk(&cache))
        .unwrap_err();
    assert!(e.to_string().contains(&pinned), "{e}");
    assert_eq!(e.category(), "pull");

    println!(
        "oci: nmo policy push (check included) {:.0} ms, pull + verify {:.1} ms, pull + verify + \
         compile + self-check {:.0} ms, restart from the disk cache {:.0} ms, policy {} KiB",
        push_time.as_secs_f64() * 1e3,
        pull_time.as_secs_f64() * 1e3,
        pull_and_load.as_secs_f64() * 1e3,
        from_disk.as_secs_f64() * 1e3,
        std::fs::metadata(&file).unwrap().len() / 1024
    );
}

#[test]
fn references_that_are_not_pinned_or_not_there_are_refused_with_what_to_do() {
    let binaries = Binaries::ensure().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let registry = OciRegistry::start(&binaries, tmp.path()).unwrap();
    let file = built("never_force");
    let tagged = format!("{}/nmo/never-force:v1", registry.host());
    let pinned = push(&file, &tagged);
    let dir = tmp.path().join("policies");
    let load = |yaml: &str| {
        write_config(&dir, yaml);
        PolicyStore::from_dir_pulling(policy_engine(), &dir, None, Registry::default())
    };

    // A tag alone could change under the cluster: refused.
    let e = load(&format!("pull:\n  never-force: {tagged}\n")).unwrap_err();
    assert!(e.to_string().contains("not pinned by digest"), "{e}");

    // A digest the registry does not have.
    let missing = format!(
        "{}/nmo/never-force@sha256:{}",
        registry.host(),
        "0".repeat(64)
    );
    let e = load(&format!("pull:\n  never-force: {missing}\n")).unwrap_err();
    assert!(e.to_string().contains(&missing), "{e}");

    // A name the directory already has as a file: one of the two, not a guess.
    std::fs::write(dir.join("never-force.wasm"), std::fs::read(&file).unwrap()).unwrap();
    let e = load(&format!("pull:\n  never-force: {pinned}\n")).unwrap_err();
    assert!(e.to_string().contains("keep one of the two"), "{e}");
    std::fs::remove_file(dir.join("never-force.wasm")).unwrap();

    // `nmo policy check DIR` pulls as the operator does.
    write_config(
        &dir,
        &format!("default: never-force\npull:\n  never-force: {pinned}\n"),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["policy", "check"])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("default never-force"), "{stdout}");
}

#[test]
fn a_new_digest_is_hot_reloaded_and_a_registry_outage_keeps_the_last_good_set_until_it_is_back() {
    let binaries = Binaries::ensure().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let registry = OciRegistry::start(&binaries, tmp.path()).unwrap();
    let port = registry.port();
    let host = registry.host();
    let first = push(&built("never_force"), &format!("{host}/nmo/drain:one"));
    let second = push(&built("stateful_last"), &format!("{host}/nmo/drain:two"));
    let dir = tmp.path().join("policies");
    let config = |pinned: &str| format!("default: drain\npull:\n  drain: {pinned}\n");
    write_config(&dir, &config(&first));
    let store =
        PolicyStore::from_dir_pulling(policy_engine(), &dir, None, Registry::default()).unwrap();
    assert_eq!(default_digest(&store), sha256_of(&built("never_force")));

    // A new digest in policies.yaml: pulled and in use at the next reload.
    write_config(&dir, &config(&second));
    assert_eq!(store.reload(), Reload::Reloaded);
    assert_eq!(default_digest(&store), sha256_of(&built("stateful_last")));

    // The registry goes away; a third digest cannot be pulled: the last
    // good set stays, readiness says why, and the next poll tries again.
    let third_file = built("give_up");
    let third = push(&third_file, &format!("{host}/nmo/drain:three"));
    registry.stop();
    // give-up needs its settings.
    write_config(
        &dir,
        &format!("{}settings:\n  drain:\n    timeout: 30m\n", config(&third)),
    );
    match store.reload() {
        Reload::Rejected(why) => assert!(why.contains(&third), "{why}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(default_digest(&store), sha256_of(&built("stateful_last")));
    assert!(
        store.readiness().contains("rejected"),
        "{}",
        store.readiness()
    );
    match store.reload() {
        Reload::Rejected(_) => {}
        other => panic!("a failed pull is tried again at the next poll, got {other:?}"),
    }

    // The registry is back: the next reload pulls it, with no change to
    // the directory.
    let back = OciRegistry::start_on(&binaries, tmp.path(), port).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store.reload() {
            Reload::Reloaded => break,
            other if Instant::now() > deadline => panic!("not reloaded: {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    assert_eq!(default_digest(&store), sha256_of(&third_file));
    assert!(
        !store.readiness().contains("rejected"),
        "{}",
        store.readiness()
    );
    back.stop();
}

/// The operator, run as its Deployment runs it (the nmo binary, the
/// shipped ServiceAccount), with a policy directory whose policies.yaml
/// pulls its default from the registry: the maintenance on the real
/// control plane is decided by the pulled policy, which is kept in the
/// policy cache directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_drains_with_a_policy_pulled_from_a_registry_on_the_real_control_plane() {
    let env = RealEnv::start_without_operator(Options::workers(2)).await;
    let dir = env.cp.dir().to_owned();
    let registry = OciRegistry::start(env.cp.binaries(), &dir).unwrap();
    let file = built("never_force");
    let pinned = push(&file, &format!("{}/nmo/never-force:v1", registry.host()));
    let policies = dir.join("policies");
    write_config(
        &policies,
        &format!("default: never-force\npull:\n  never-force: {pinned}\n"),
    );
    let cache = dir.join("policy-cache");
    let log = dir.join("operator-oci.log");
    let mut operator = real::operator_process(
        &env,
        "nmo-oci",
        &log,
        &[
            format!("--policy-dir={}", policies.display()),
            format!("--policy-cache-dir={}", cache.display()),
        ],
    );
    env.create_nm("nm-1", "worker-1").await;
    let nm = env.wait_phase("nm-1", MaintenancePhase::Succeeded).await;
    let recorded = nm.status.and_then(|s| s.policy).unwrap_or_default();
    assert_eq!(
        recorded,
        format!("never-force@sha256:{}", &sha256_of(&file)[..12]),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let kept = std::fs::read_dir(cache.join("oci")).unwrap().count();
    assert_eq!(kept, 2, "the manifest and the policy are kept");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("policy pulled and verified"), "{logged}");
    // `nmo plan` names where the pulled policy came from: its reference.
    let kubeconfig = dir.join("plan-kubeconfig");
    std::fs::write(&kubeconfig, env.kubeconfig()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["plan", "worker-2", "-o", "json", "--policy-dir"])
        .arg(&policies)
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::printed(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let source = plan["policy"]["source"].as_str().unwrap_or_default();
    assert!(source.starts_with(&pinned), "{source}");
    // So does `nmo policy list`.
    let out = Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["policy", "list", "--policy-dir"])
        .arg(&policies)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::printed(&out));
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("never-force ") && l.contains(" yes ") && l.contains(&pinned)),
        "{listed}"
    );
    // `nmo policy inspect`, of the reference and of the name the
    // policies ConfigMap pulls: pulled, verified, checked, said where from.
    env.cp
        .kubectl(&["create", "namespace", "nmo-policies"], None)
        .await
        .unwrap();
    env.cp
        .kubectl(
            &[
                "create",
                "configmap",
                "policies",
                "-n",
                "nmo-policies",
                &format!("--from-file={}", policies.join("policies.yaml").display()),
            ],
            None,
        )
        .await
        .unwrap();
    let nmo = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_nmo"))
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap();
        (out.status.code(), common::printed(&out))
    };
    let digest = sha256_of(&file);
    let (code, out) = nmo(&["policy", "inspect", &pinned]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("OCI {pinned}")) && out.contains(&digest),
        "{out}"
    );
    let configmap = "--policy-configmap=nmo-policies/policies";
    let (code, out) = nmo(&["policy", "inspect", "never-force", configmap]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!(
            "OCI {pinned} (ConfigMap nmo-policies/policies, policies.yaml pull: never-force)"
        )) && out.contains(&digest)
            && out.contains("Self-check: passed"),
        "{out}"
    );
    // `nmo policy rm` of a pulled policy says where it is named; nothing
    // changes.
    let (code, out) = nmo(&["policy", "rm", "never-force", configmap]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!("is pulled from {pinned} by policies.yaml")),
        "{out}"
    );
    operator.start_kill().unwrap();
    let _ = operator.wait().await;
    registry.stop();
    env.stop();
}
