//! The example policies and their scenarios, and the harness that runs
//! them (as a library and as `nmo policy test`).

use std::path::{Path, PathBuf};
use std::process::Command;

use nmo::policy::harness;
use nmo::policy::{EngineConfig, PolicyEngine};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn wasm(crate_dir: &str) -> PathBuf {
    Path::new(env!("NMO_POLICY_WASM_DIR"))
        .join(format!("nmo_policy_{}.wasm", crate_dir.replace('-', "_")))
}

/// Every example policy directory: (name, path).
fn examples() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(root().join("policies/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").exists())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    out
}

#[test]
fn every_example_has_a_readme_and_passes_its_scenarios() {
    let examples = examples();
    assert!(examples.len() >= 3, "at least three examples: {examples:?}");
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let mut all = vec![("default".to_owned(), root().join("policies/default"))];
    all.extend(examples);
    for (name, dir) in all {
        if name != "default" {
            let readme = std::fs::read_to_string(dir.join("README.md"))
                .unwrap_or_else(|e| panic!("{name}: README.md: {e}"));
            assert!(
                readme.contains("-- policy test"),
                "{name}: README shows how to test it"
            );
        }
        let policy = engine.load_file(&wasm(&name)).unwrap();
        let report = harness::run_paths(&policy, &[dir.join("scenarios")]).unwrap();
        assert!(
            report.outcomes.len() >= 3,
            "{name}: at least three scenarios"
        );
        assert_eq!(report.failed(), 0, "{name}:\n{}", report.render());
    }
}

#[test]
fn a_decision_that_differs_is_shown_as_a_diff() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    // The default policy evicts what never-force blocks.
    let report = harness::run_paths(
        &engine.default_policy().unwrap(),
        &[root().join("policies/examples/never-force/scenarios")],
    )
    .unwrap();
    assert_eq!(report.failed(), 2, "{}", report.render());
    let text = report.render();
    assert!(
        text.contains(
            "FAIL  a pod with no controller blocks the drain; managed pods are evicted\n"
        ) || text.contains("FAIL  a pod with no controller blocks the drain"),
        "{text}"
    );
    assert!(
        text.contains(
            "        default/bare\n          - expected: block, reason \"has no controller\"\n          + actual:   evict\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "- expected: {retryAfterMs: 30000}\n          + actual:   {retryAfterMs: 5000}"
        ),
        "{text}"
    );
    assert!(
        text.ends_with("5 scenarios: 3 passed, 2 failed\n"),
        "{text}"
    );
}

fn nmo(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn nmo_policy_test_exit_codes() {
    let scenarios = root().join("policies/examples/give-up/scenarios");
    let scenarios = scenarios.to_str().unwrap();
    let give_up = wasm("give-up");
    let (code, out, _) = nmo(&["policy", "test", give_up.to_str().unwrap(), scenarios]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("8 scenarios: 8 passed, 0 failed"), "{out}");

    // The default policy never gives up: the two give-up scenarios fail.
    let (code, out, _) = nmo(&["policy", "test", "default", scenarios]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  after 10 minutes the maintenance fails"),
        "{out}"
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "name: no expectations\npods: []\nexpect: {}\n").unwrap();
    let (code, _, err) = nmo(&["policy", "test", "default", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("scenario \"no expectations\": expect: nothing to check"),
        "{err}"
    );

    std::fs::write(
        &bad,
        "name: verdict without failure\nexpect: {verdict: retryWithBackoff}\n",
    )
    .unwrap();
    let (code, _, err) = nmo(&["policy", "test", "default", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("a verdict needs a `failure`"), "{err}");

    // A wait's timeout is checked; a field that does not exist is a
    // scenario that cannot be read (2), not a policy that answered wrongly.
    let no_downtime = wasm("no-downtime");
    let job = "name: a Job's pod\npods:\n  - metadata:\n      name: report-x\n      ownerReferences: [{apiVersion: batch/v1, kind: Job, name: report, uid: u4, controller: true}]\n    spec: {containers: [{name: c, image: report}]}\nexpect:\n  decisions:\n";
    for (want, code_wanted, said) in [
        ("{action: wait, timeoutMs: 3600000}", 0, "1 passed"),
        ("{action: wait, timeoutMs: 60000}", 1, "timeoutMs 3600000"),
        (
            "{action: wait, timeout: 1h}",
            2,
            "unknown field \"timeout\"",
        ),
        ("waits", 2, "is not an action"),
    ] {
        std::fs::write(&bad, format!("{job}    report-x: {want}\n")).unwrap();
        let (code, out, err) = nmo(&[
            "policy",
            "test",
            no_downtime.to_str().unwrap(),
            bad.to_str().unwrap(),
        ]);
        assert_eq!(code, code_wanted, "{want}: {out}{err}");
        assert!(
            out.contains(said) || err.contains(said),
            "{want}: {out}{err}"
        );
    }

    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, "not wasm").unwrap();
    let (code, _, err) = nmo(&["policy", "test", garbage.to_str().unwrap(), scenarios]);
    assert_eq!(code, 2);
    assert!(err.contains("not a WebAssembly file"), "{err}");
}

#[test]
fn an_expected_policy_error_is_checked_by_category() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.yaml");
    // The hostile test policy traps when the maintenance's reason is `trap`.
    let doc = |name: &str, error: &str| {
        format!(
            "name: {name}\nmaintenance: {{spec: {{reason: trap}}}}\npods: [{{metadata: {{name: a}}, spec: {{containers: [{{name: c, image: i}}]}}}}]\nexpect: {{error: {error}}}\n"
        )
    };
    std::fs::write(
        &file,
        format!(
            "{}---\n{}",
            doc("the policy traps", "trap"),
            doc("wrong category", "deadline")
        ),
    )
    .unwrap();
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let policy = engine.load_file(&wasm("hostile")).unwrap();
    let report = harness::run_paths(&policy, &[file]).unwrap();
    assert!(report.outcomes[0].passed(), "{}", report.render());
    assert!(!report.outcomes[1].passed());
    assert!(
        report
            .render()
            .contains("- expected: deadline\n          + actual:   trap"),
        "{}",
        report.render()
    );
}

/// A scenario's pods can be exactly what `kubectl get pods -o yaml` prints
/// from a (simulated) cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_pasted_from_kubectl_get_pods_o_yaml() {
    let cluster = nmo_sim::SimCluster::start(Default::default())
        .await
        .unwrap();
    cluster.add_node("worker-1").unwrap();
    cluster
        .apply_yaml(
            r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: default}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {nodeName: worker-1, containers: [{name: db, image: postgres}]}
---
apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: default}
spec: {nodeName: worker-1, containers: [{name: c, image: busybox}]}
"#,
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kc");
    cluster.write_kubeconfig(&kc).unwrap();
    let listed = loop {
        let out = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(["get", "pods", "-o", "yaml"])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        if text.matches("kind: Pod\n").count() >= 3 {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let indented: String = listed.lines().map(|l| format!("  {l}\n")).collect();
    let scenario = format!(
        "name: from kubectl\nnode: {{metadata: {{name: worker-1}}}}\npods:\n{indented}expect:\n  decisions:\n    db-1: {{action: evict, order: 1}}\n    db-0: {{action: evict, order: 2}}\n    bare: {{action: evict, order: 0}}\n"
    );
    let file = dir.path().join("s.yaml");
    std::fs::write(&file, scenario).unwrap();
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let policy = engine.load_file(&wasm("stateful-last")).unwrap();
    let report = harness::run_paths(&policy, &[file]).unwrap();
    assert_eq!(report.failed(), 0, "{}", report.render());

    // Or saved as is (`kubectl get pods -o yaml > pods.yaml`) beside the
    // scenarios: named by podsFrom, and not read as scenarios itself.
    let scenarios = dir.path().join("scenarios");
    std::fs::create_dir(&scenarios).unwrap();
    std::fs::write(scenarios.join("pods.yaml"), &listed).unwrap();
    std::fs::write(
        scenarios.join("drain.yaml"),
        "name: from a saved file\nnode: {metadata: {name: worker-1}}\npodsFrom: pods.yaml\nexpect:\n  decisions:\n    db-1: {action: evict, order: 1}\n    bare: {action: evict, order: 0}\n",
    )
    .unwrap();
    let report = harness::run_paths(&policy, std::slice::from_ref(&scenarios)).unwrap();
    assert_eq!(report.outcomes.len(), 1, "{}", report.render());
    assert_eq!(report.failed(), 0, "{}", report.render());
    // Given by itself, the pods file is said to be data.
    let err = harness::run_paths(&policy, &[scenarios.join("pods.yaml")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not scenarios (name it in a scenario's podsFrom)"),
        "{err}"
    );
    // Both pods and podsFrom: refused.
    std::fs::write(
        scenarios.join("drain.yaml"),
        "name: both\npods: []\npodsFrom: pods.yaml\nexpect: {}\n",
    )
    .unwrap();
    let err = harness::run_paths(&policy, &[scenarios])
        .unwrap_err()
        .to_string();
    assert!(err.contains("pods and podsFrom both given"), "{err}");
}

#[test]
fn nmo_policy_check_a_directory_as_the_operator_loads_it() {
    let shipped = root().join("deploy/policies");
    let (code, out, _) = nmo(&["policy", "check", shipped.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("6 policies (builtin, default, give-up, never-force, opt-out, stateful-last), default default, 1 rules"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policies.yaml"), "default: nope\n").unwrap();
    let (code, out, _) = nmo(&["policy", "check", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        out.contains("default names policy \"nope\", which is not in the directory"),
        "{out}"
    );
}

/// What an author's own `cargo test` calls.
#[test]
fn assert_scenarios_passes_a_good_policy() {
    let report = harness::assert_scenarios(
        wasm("give-up"),
        root().join("policies/examples/give-up/scenarios"),
    );
    assert_eq!(report.passed(), 8);
}

#[test]
#[should_panic(expected = "failed scenarios:")]
fn assert_scenarios_fails_the_test_with_the_report() {
    harness::assert_scenarios(
        wasm("default"),
        root().join("policies/examples/give-up/scenarios"),
    );
}

/// What the sandbox refuses, `nmo policy check` refuses, promptly and
/// saying why: an oversized file, a policy that sleeps in its initialiser.
#[test]
fn nmo_policy_check_refuses_what_the_sandbox_refuses_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.wasm");
    let mut bytes = std::fs::read(wasm("default")).unwrap();
    bytes.resize((1 << 20) + 1, 0);
    std::fs::write(&big, &bytes).unwrap();
    let sleepy =
        std::path::Path::new(env!("NMO_POLICY_WASM_DIR")).join("nmo_policy_sleepy_init.wasm");
    let started = std::time::Instant::now();
    let (code, out, _) = nmo(&[
        "policy",
        "check",
        big.to_str().unwrap(),
        sleepy.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("big.wasm: policy big.wasm: refused: the file is 1048577 bytes, more than the 1048576 a policy may have"),
        "{out}"
    );
    assert!(out.contains("ran past its deadline of 500ms"), "{out}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the sleeper asked for a minute: {:?}",
        started.elapsed()
    );
}

/// A reload that brings a refused policy keeps the last good set and says
/// why in the readiness detail.
#[test]
fn a_refused_policy_on_reload_shows_in_readiness() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("give-up.wasm"),
        std::fs::read(wasm("give-up")).unwrap(),
    )
    .unwrap();
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let store = nmo::policy::PolicyStore::from_dir(engine, dir.path(), None).unwrap();
    let mut bytes = std::fs::read(wasm("default")).unwrap();
    bytes.resize((1 << 20) + 1, 0);
    std::fs::write(dir.path().join("big.wasm"), &bytes).unwrap();
    let nmo::policy::Reload::Rejected(why) = store.reload() else {
        panic!("an oversized policy was accepted")
    };
    assert!(
        why.contains("policy big: refused: the file is 1048577 bytes"),
        "{why}"
    );
    let ready = store.readiness();
    assert!(
        ready.contains("builtin, give-up") && ready.contains("refused"),
        "{ready}"
    );
}

/// `podsFrom` reads only inside the scenario's folder (the scenario file's
/// folder or below, after resolving `..` and symbolic links), only regular
/// files, at most 16 MiB, and an error never shows what the file held:
/// a hostile pull request cannot print a token into a CI log, nor make the
/// tool read `/dev/zero`.
#[test]
fn pods_from_reads_only_bounded_files_inside_the_scenarios_folder() {
    let dir = tempfile::tempdir().unwrap();
    let scenarios = dir.path().join("scenarios");
    std::fs::create_dir(&scenarios).unwrap();
    std::fs::create_dir(scenarios.join("data")).unwrap();
    std::fs::write(dir.path().join("token"), "s3cr3t-t0ken-value\n").unwrap();
    std::fs::write(scenarios.join("data/token"), "s3cr3t-t0ken-value\n").unwrap();
    std::os::unix::fs::symlink(dir.path().join("token"), scenarios.join("link")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", scenarios.join("zero")).unwrap();
    let big = "- {metadata: {name: p}}\n".repeat(800_000);
    std::fs::write(scenarios.join("big.yaml"), &big).unwrap();
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let policy = engine.default_policy().unwrap();
    let cases = [
        ("../token", "outside the scenario's folder"),
        ("/etc/passwd", "outside the scenario's folder"),
        ("/dev/zero", "outside the scenario's folder"),
        ("link", "outside the scenario's folder"),
        ("zero", "outside the scenario's folder"),
        ("data/token", "document 1 is not a Pod"),
        ("big.yaml", "over 16777216 bytes"),
        ("missing.yaml", "No such file"),
    ];
    let mut held = 0;
    for (from, want) in cases {
        std::fs::write(
            scenarios.join("s.yaml"),
            format!("name: reads {from}\nnode: {{metadata: {{name: worker-1}}}}\npodsFrom: {from}\nexpect: {{}}\n"),
        )
        .unwrap();
        let err = harness::run_paths(&policy, &[scenarios.join("s.yaml")])
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "podsFrom {from}: {err}");
        assert!(
            !err.contains("s3cr3t"),
            "podsFrom {from} echoed the file: {err}"
        );
        held += 1;
    }
    println!("podsFrom: {} tried, {held} held", cases.len());
}
