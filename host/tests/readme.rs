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
