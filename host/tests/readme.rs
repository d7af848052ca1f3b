//! The README's two commands stay true: CI runs the test command it names,
//! and the demo command runs to the end.

use crate::common::blocks;

const README: &str = include_str!("../../README.md");
const CI: &str = include_str!("../../.ci/run");
/// The policy author's guide (the README links to it).
const GUIDE: &str = include_str!("../../docs/writing-a-policy.md");

/// `nmo demo ARGS` running, its stdout read line by line.
fn spawn_demo(
    args: &[&str],
    stderr: std::process::Stdio,
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .arg("demo")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("nmo runs");
    let lines = std::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    (child, lines)
}

#[test]
fn the_readme_names_the_two_commands_and_ci_runs_the_test_one() {
    assert!(
        README.contains("\ncargo run -p nmo -- demo\n"),
        "the demo command"
    );
    assert!(
        README.contains("\ncargo test --workspace --locked\n"),
        "the test command"
    );
    assert!(
        CI.lines()
            .any(|l| l.trim() == "cargo test --workspace --locked"),
        ".ci/run must call the README's test command"
    );
}

#[test]
fn the_demo_runs_a_maintenance_end_to_end() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["demo", "--nodes", "3", "--pods", "12"])
        .output()
        .expect("nmo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("Phase:") && l.trim_end().ends_with("Succeeded")),
        "{stdout}"
    );
    for expected in [
        "BeginMaintenance",
        "SucceedMaintenance",
        "node worker-1 in maintenance: unschedulable=true",
        "node worker-1 restored: unschedulable=false taints=[]",
        "UncordonNode Uncordon a node",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

/// The policy guide (docs/writing-a-policy.md), as written: `nmo policy new`, the policy and the
/// scenarios from the README, then its two commands (build, test): the
/// crate builds with nothing of this repository but what `nmo` wrote.
#[test]
fn the_policy_guide_builds_and_its_scenarios_pass() {
    let section = GUIDE;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned();
    let rust = blocks(section, "rust")[0];
    let scenarios = blocks(section, "yaml")[0];
    let new: Vec<&str> = blocks(section, "sh")[0].lines().collect();
    assert_eq!(new, ["nmo policy new gentle"], "the first command");
    let commands: Vec<&str> = blocks(section, "sh")[1].lines().collect();
    assert_eq!(commands.len(), 2, "two commands: {commands:?}");

    // Outside the repository (as an author's crate would be), kept from run
    // to run so its own target directory is reused.
    // One per checkout, so two checkouts' test runs never share it.
    let checkout = {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        root.hash(&mut h);
        h.finish()
    };
    let parent = std::env::temp_dir().join(format!("nmo-policy-guide-{checkout:016x}"));
    let dir = parent.join("gentle");
    std::fs::create_dir_all(&parent).unwrap();
    // `nmo policy new` again, keeping only the build directory.
    let kept = parent.join("kept-target");
    let _ = std::fs::rename(dir.join("target"), &kept);
    let _ = std::fs::remove_dir_all(&dir);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .current_dir(&parent)
        .args(new[0].split_whitespace().skip(1))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::rename(&kept, dir.join("target"));
    std::fs::write(dir.join("src/lib.rs"), rust).unwrap();
    std::fs::write(dir.join("scenarios/gentle.yaml"), scenarios).unwrap();

    let pinned = std::fs::read_to_string(root.join("rust-toolchain.toml")).unwrap();
    let toolchain = pinned
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel = "))
        .expect("a pinned channel")
        .trim_matches('"')
        .to_owned();
    let run = |line: &str| {
        let mut words = line.split_whitespace();
        let program = match words.next().unwrap() {
            "cargo" => env!("CARGO"),
            "nmo" => env!("CARGO_BIN_EXE_nmo"),
            other => panic!("unexpected command {other}"),
        };
        let mut cmd = std::process::Command::new(program);
        cmd.current_dir(&dir).args(words);
        // Only what is already downloaded; none of this test's build
        // settings.
        cmd.env("CARGO_NET_OFFLINE", "true");
        // The repository's pinned toolchain (it has the wasm32-wasip2
        // target), not whatever is the default outside the repository.
        cmd.env("RUSTUP_TOOLCHAIN", &toolchain);
        for var in [
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
        ] {
            cmd.env_remove(var);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, out) = run(commands[0]);
    assert_eq!(code, Some(0), "{}: {out}", commands[0]);
    let (code, out) = run(commands[1]);
    assert_eq!(code, Some(0), "{}: {out}", commands[1]);
    // The guide's three and the three `nmo policy new` wrote.
    assert!(out.contains("6 scenarios: 6 passed, 0 failed"), "{out}");
}

/// `nmo demo` with a policy that blocks on a pod: it says what the drain
/// waits for (the blocked pods and the policy's reason), restores the
/// node, and exits 1 instead of pretending.
#[test]
fn a_demo_whose_drain_cannot_finish_says_so_and_fails() {
    // The built example policy, by its name, as the README writes it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args([
            "demo",
            "--nodes",
            "3",
            "--pods",
            "12",
            "--policy",
            "never-force",
        ])
        .output()
        .expect("nmo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    for expected in [
        "the drain now waits only for pods the policy blocks on",
        "shop/debug-shell has no controller",
        "the maintenance did not succeed: it is Running",
        "node worker-1 restored: unschedulable=false",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    // The plan came first, with the block and its reason.
    let plan = stdout
        .find("the policy's plan for worker-1")
        .expect("the plan");
    let created = stdout.find("kubectl apply: NodeMaintenance").unwrap();
    assert!(plan < created);
}

/// Runs `nmo demo --nodes 3 --pods 12 --policy POLICY`; its exit code and
/// output.
fn demo_with(policy: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["demo", "--nodes", "3", "--pods", "12", "--policy", policy])
        .output()
        .expect("nmo runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The demo shows what `give-up` and `escalate` change, with a pod no
/// eviction moves (a singleton behind `minAvailable: 1`): give-up fails
/// the maintenance and gives the node back; escalate deletes the pod,
/// bypassing the budget, says so, and succeeds.
#[test]
fn the_demo_shows_what_give_up_and_escalate_change() {
    let (code, stdout) = demo_with("give-up");
    assert_eq!(code, Some(1), "{stdout}");
    for expected in [
        "== what to watch for: shop/singleton's budget never allows its eviction",
        "Policy:               give-up@sha256:",
        "gave up after 20s: 1 pods still on the node (shop/singleton-",
        "FailedMaintenance",
        "node worker-1 restored: unschedulable=false",
    ] {
        assert!(
            stdout.contains(expected),
            "give-up: missing {expected:?} in:\n{stdout}"
        );
    }
    let (code, stdout) = demo_with("escalate");
    assert_eq!(code, Some(0), "{stdout}");
    for expected in [
        "Policy:      escalate (sha256",
        "ForcedPodRemoval",
        "deleted, bypassing PodDisruptionBudgets (rule: escalate: pending",
        "Phase:                Succeeded",
    ] {
        assert!(
            stdout.contains(expected),
            "escalate: missing {expected:?} in:\n{stdout}"
        );
    }
}

/// The demo shows what the fleet policies change, with more maintenances
/// created just after worker-1's: max-unavailable and rate hold the
/// others back; one-per-zone holds only the one of worker-1's zone.
#[test]
fn the_demo_shows_what_the_fleet_policies_change() {
    for policy in ["max-unavailable", "rate", "one-per-zone"] {
        let (code, stdout) = demo_with(policy);
        assert_eq!(code, Some(0), "{policy}: {stdout}");
        assert!(
            stdout.contains("== worker-2-maintenance: waiting for admission: "),
            "{policy}: worker-2's maintenance is held in:\n{stdout}"
        );
    }
    let (_, stdout) = demo_with("one-per-zone");
    assert!(
        stdout.contains("(worker-1-maintenance) of zone zone-a")
            || stdout.contains("of zone zone-a is in maintenance (worker-1-maintenance)"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("== worker-3-maintenance: waiting"),
        "worker-3 is in another zone: {stdout}"
    );
}

/// SIGTERM (as Ctrl-C) in the middle of the drain ends the demo promptly,
/// with the maintenance ended and the node restored, exit code 130.
#[test]
fn a_demo_interrupted_mid_drain_restores_the_node_and_exits_130() {
    let (mut child, mut lines) = spawn_demo(
        &["--nodes", "3", "--pods", "100"],
        std::process::Stdio::null(),
    );
    let mut seen = Vec::new();
    // The drain has started: the first progress line.
    for line in lines.by_ref() {
        let line = line.unwrap();
        let started = line.trim_start().starts_with("drain ");
        seen.push(line);
        if started {
            break;
        }
    }
    assert!(
        seen.iter().any(|l| l.trim_start().starts_with("drain ")),
        "{seen:?}"
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    let text = rest.join("\n");
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(
        text.contains("== interrupted: ending the maintenance"),
        "{text}"
    );
    assert!(
        text.contains("== node worker-1 restored: unschedulable=false"),
        "{text}"
    );
    assert!(
        !text.contains("SucceedMaintenance"),
        "interrupted before the end: {text}"
    );
}

/// `nmo demo | head -3`: when the reader goes, the demo ends at once and
/// quietly, as Unix tools do (by SIGPIPE), never with a panic on the
/// broken pipe. (100 pods: the demo runs for seconds after its first
/// lines, so it is still writing when the reader goes.)
#[test]
fn a_demo_whose_reader_goes_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (mut child, mut lines) = spawn_demo(
        &["--nodes", "3", "--pods", "100"],
        std::process::Stdio::piped(),
    );
    for _ in 0..3 {
        lines.next().expect("a line").unwrap();
    }
    drop(lines);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the demo never ended after its reader went"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?}: {stderr}");
}

/// A policy name the build did not make is refused at once, naming the
/// ones it did.
#[test]
fn a_demo_with_an_unknown_policy_name_says_which_there_are() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["demo", "--policy", "never-forse"])
        .output()
        .expect("nmo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no policy file never-forse and no built policy of that name")
            && stderr.contains("never-force")
            && stderr.contains("stateful-last"),
        "{stderr}"
    );
}

/// `--keep-running --policy never-force`: `nmo plan` against the demo's
/// cluster shows the plan of the policy the demo's operator runs (its
/// policies ConfigMap), the kubeconfig is the demo's own and goes with it,
/// and Ctrl-C ends the demo with the maintenance's code (1: never-force
/// left a pod it blocks on).
#[test]
fn a_kept_demo_plans_with_its_own_policy_and_ends_with_the_maintenance_code() {
    let (mut child, mut lines) = spawn_demo(
        &[
            "--nodes",
            "3",
            "--pods",
            "12",
            "--policy",
            "never-force",
            "--keep-running",
        ],
        std::process::Stdio::piped(),
    );
    let mut kubeconfig = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(path) = line.trim().strip_prefix("export KUBECONFIG=") {
            kubeconfig = Some(std::path::PathBuf::from(path));
            break;
        }
    }
    let kubeconfig = kubeconfig.expect("the kept cluster's kubeconfig");
    assert!(
        kubeconfig
            .display()
            .to_string()
            .ends_with(&format!("nmo-demo-{}.kubeconfig", child.id())),
        "{}",
        kubeconfig.display()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["plan", "worker-2", "-o", "json"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(plan["policy"]["name"], "never-force", "{plan}");
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    // A signal that ended it (none is due: Ctrl-C is handled) is named.
    assert_eq!(
        status.code(),
        Some(1),
        "{status:?} (signal {:?})\nstdout after Ctrl-C:\n{}\nstderr:\n{stderr}",
        std::os::unix::process::ExitStatusExt::signal(&status),
        rest.join("\n")
    );
    assert!(!kubeconfig.exists(), "the demo's kubeconfig is removed");
}

/// `--policy-dir`: the demo decides with a policy directory as the
/// operator reads one (here `policies.yaml` makes never-force the
/// default): the plan, the drain and the end are never-force's.
#[test]
fn a_demo_with_a_policy_directory_decides_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let built = std::path::Path::new(env!("NMO_POLICY_WASM_DIR"));
    std::fs::copy(
        built.join("nmo_policy_never_force.wasm"),
        dir.path().join("never-force.wasm"),
    )
    .unwrap();
    std::fs::write(dir.path().join("policies.yaml"), "default: never-force\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["demo", "--nodes", "3", "--pods", "12", "--policy-dir"])
        .arg(dir.path())
        .output()
        .expect("nmo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    for expected in [
        "== nmo demo: policy directory",
        "default never-force",
        "== what never-force changes against the default policy (2 of ",
        "shop/debug-shell: evict, wave 0, grace 30s → block, wave 0 (pod shop/debug-shell has no controller",
        "the drain now waits only for pods the policy blocks on",
        "node worker-1 restored: unschedulable=false",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

/// The scenario format's reference in the policy guide is the harness's
/// own (its module documentation), word for word: a key added to one and
/// not the other fails here.
#[test]
fn the_guides_scenario_reference_is_the_harnesss() {
    let source = include_str!("../src/policy/harness/mod.rs");
    let lines: Vec<&str> = source.lines().collect();
    let start = lines.iter().position(|l| *l == "//! ```yaml").unwrap();
    let end = start
        + 1
        + lines[start + 1..]
            .iter()
            .position(|l| *l == "//! ```")
            .unwrap();
    let harness: Vec<&str> = lines[start + 1..end]
        .iter()
        .map(|l| {
            l.strip_prefix("//! ")
                .or_else(|| l.strip_prefix("//!"))
                .unwrap()
        })
        .collect();
    let guide = blocks(GUIDE, "yaml")
        .into_iter()
        .find(|b| b.starts_with("name: StatefulSet pods go last"))
        .expect("the reference block in docs/writing-a-policy.md");
    assert_eq!(guide.trim_end().lines().collect::<Vec<_>>(), harness);
    for key in [
        "history:",
        "park",
        "timeoutMs",
        "podsFrom",
        "volumesAttached",
        "claims",
        "workloads:",
    ] {
        assert!(guide.contains(key), "{key} in the reference");
    }
}

/// `--workload FILE`: the demo drains your own workload, read from what
/// `kubectl get … -o yaml` printed (a List): its Deployment and budget
/// made again, the ReplicaSet and pods its controllers make left out, a
/// bare pod bound to a node the demo lacks scheduled again. A file that
/// cannot be used says which document and why, before anything starts.
#[test]
fn a_demo_drains_a_workload_from_a_manifest_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dump.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: shop-web, namespace: store, uid: d1, resourceVersion: "77"}
  spec:
    replicas: 6
    selector: {matchLabels: {app: shop-web}}
    template:
      metadata: {labels: {app: shop-web}}
      spec: {containers: [{name: web, image: nginx}]}
  status: {replicas: 6, readyReplicas: 6}
- apiVersion: policy/v1
  kind: PodDisruptionBudget
  metadata: {name: shop-web, namespace: store}
  spec: {maxUnavailable: 1, selector: {matchLabels: {app: shop-web}}}
- apiVersion: apps/v1
  kind: ReplicaSet
  metadata: {name: shop-web-5f6c, namespace: store, ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: shop-web, uid: d1, controller: true}]}
  spec: {replicas: 6, selector: {matchLabels: {app: shop-web}}}
- apiVersion: v1
  kind: Node
  metadata: {name: ip-10-0-1-2}
"#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["demo", "--nodes", "3", "--workload"])
        .arg(&file)
        .output()
        .expect("nmo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "workload: 2 object(s) of your file",
        "left out ReplicaSet shop-web-5f6c: made by Deployment/shop-web",
        "left out Node ip-10-0-1-2",
        "store/shop-web-",
        "node worker-1 restored: unschedulable=false",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Pod\nmetadata: {namespace: x}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["demo", "--workload"])
        .arg(&file)
        .output()
        .expect("nmo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("dump.yaml: document 1: no metadata.name"),
        "{stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("simulated cluster"),
        "nothing started"
    );
}
