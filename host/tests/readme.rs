//! The README's two commands stay true: CI runs the test command it names,
//! and the demo command runs to the end.

const README: &str = include_str!("../../README.md");
const CI: &str = include_str!("../../.ci/run");

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

/// The fenced blocks of a README section, by language.
fn blocks<'a>(section: &'a str, lang: &str) -> Vec<&'a str> {
    let fence = format!("```{lang}\n");
    section
        .split(fence.as_str())
        .skip(1)
        .map(|b| &b[..b.find("```").expect("closed block")])
        .collect()
}

/// "Writing a policy", as written: `nmo policy new`, the policy and the
/// scenarios from the README, then its two commands (build, test): the
/// crate builds with nothing of this repository but what `nmo` wrote.
#[test]
fn the_policy_guide_builds_and_its_scenarios_pass() {
    let start = README.find("## Writing a policy").expect("the guide");
    let section = &README[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
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
    // The guide's three and the two `nmo policy new` wrote.
    assert!(out.contains("5 scenarios: 5 passed, 0 failed"), "{out}");
}

/// `nmo demo` with a policy that blocks on a pod: it says what the drain
/// waits for (the blocked pods and the policy's reason), restores the
/// node, and exits 1 instead of pretending.
#[test]
fn a_demo_whose_drain_cannot_finish_says_so_and_fails() {
    let policy =
        std::path::Path::new(env!("NMO_POLICY_WASM_DIR")).join("nmo_policy_never_force.wasm");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["demo", "--nodes", "3", "--pods", "12", "--policy"])
        .arg(&policy)
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

/// SIGTERM (as Ctrl-C) in the middle of the drain ends the demo promptly,
/// with the maintenance ended and the node restored, exit code 130.
#[test]
fn a_demo_interrupted_mid_drain_restores_the_node_and_exits_130() {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nmo"))
        .args(["demo", "--nodes", "3", "--pods", "100"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
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
