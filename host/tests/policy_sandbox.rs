//! Hostile guests: each misbehaviour ends in its typed error, promptly, and
//! the engine keeps working for the next call.

use std::time::{Duration, Instant};

use nmo::Error;
use nmo::fixtures::{self, PodKind};
use nmo::policy::types::{Failure, Maintenance, Node, Pod};
use nmo::policy::{EngineConfig, Policy, PolicyEngine, Verdict, convert};

const HOSTILE: &str = concat!(env!("NMO_POLICY_WASM_DIR"), "/nmo_policy_hostile.wasm");
const DEADLINE: Duration = Duration::from_millis(200);
const MEMORY_LIMIT: usize = 32 << 20;

fn engine() -> PolicyEngine {
    PolicyEngine::new(EngineConfig {
        deadline: DEADLINE,
        memory_limit_bytes: MEMORY_LIMIT,
        ..EngineConfig::default()
    })
    .expect("engine")
}

fn hostile(engine: &PolicyEngine) -> Policy {
    engine
        .load_file(std::path::Path::new(HOSTILE))
        .expect("the hostile policy is a valid component")
}

fn maintenance(reason: &str) -> Maintenance {
    Maintenance {
        name: "nm-1".into(),
        node_name: "worker-1".into(),
        reason: reason.into(),
        labels: Vec::new(),
        annotations: Vec::new(),
        phase: None,
        drain_progress: 0,
        error_on_lease_count: 0,
        attempt: 1,
        elapsed_ms: 0,
    }
}

fn node() -> Node {
    convert::node(&fixtures::node("worker-1"))
}

fn pods() -> Vec<Pod> {
    fixtures::node_pods("worker-1", 30)
        .iter()
        .map(convert::pod)
        .collect()
}

/// Runs `reason` through plan-drain; returns the error and how long it took.
fn plan_error(policy: &Policy, reason: &str) -> (Error, Duration) {
    let started = Instant::now();
    let err = policy
        .plan_drain(&maintenance(reason), &node(), &pods())
        .expect_err(reason);
    (err, started.elapsed())
}

/// The engine still serves well-behaved calls, from the same policy and
/// from the default one.
fn assert_still_works(engine: &PolicyEngine, policy: &Policy) {
    policy
        .plan_drain(&maintenance("behave"), &node(), &pods())
        .expect("a well-behaved call after a hostile one");
    engine
        .default_policy()
        .expect("default")
        .plan_drain(&maintenance("behave"), &node(), &pods())
        .expect("the default policy after a hostile one");
}

#[test]
fn a_trap_is_a_trap_error() {
    let engine = engine();
    let policy = hostile(&engine);
    let (err, _) = plan_error(&policy, "trap");
    assert_eq!(err.category(), "trap", "{err}");
    assert!(matches!(
        err,
        Error::PolicyTrap {
            function: "plan-drain",
            ..
        }
    ));
    assert_still_works(&engine, &policy);
}

#[test]
fn a_panic_is_a_trap_error_carrying_the_panic_message() {
    let engine = engine();
    let policy = hostile(&engine);
    let (err, _) = plan_error(&policy, "panic");
    assert_eq!(err.category(), "trap");
    let msg = err.to_string();
    assert!(msg.contains("hostile policy panics on purpose"), "{msg}");
    assert_still_works(&engine, &policy);
}

#[test]
fn a_panic_on_one_input_only_fails_that_input() {
    let engine = engine();
    let policy = hostile(&engine);
    let (err, _) = plan_error(&policy, "panic-on-bare");
    assert_eq!(err.category(), "trap");
    // The same policy on a node without bare pods answers.
    let managed: Vec<Pod> = (0..5)
        .map(|i| {
            convert::pod(&fixtures::pod(
                PodKind::Deployment,
                "a",
                "web",
                i,
                "worker-1",
            ))
        })
        .collect();
    let plan = policy
        .plan_drain(&maintenance("panic-on-bare"), &node(), &managed)
        .expect("no bare pod, no panic");
    assert_eq!(plan.steps.len(), 5);
}

#[test]
fn an_endless_loop_is_stopped_at_the_deadline() {
    let engine = engine();
    let policy = hostile(&engine);
    let (err, took) = plan_error(&policy, "loop");
    assert!(
        matches!(err, Error::PolicyDeadline { deadline, .. } if deadline == DEADLINE),
        "{err}"
    );
    assert_eq!(err.category(), "deadline");
    // Stopped, not left to spin: generous bound for a loaded CI machine.
    assert!(took < DEADLINE * 10, "took {took:?}");
    let started = Instant::now();
    let err = policy
        .on_failure(&maintenance("loop"), &Failure::NodeNotFound)
        .expect_err("on-failure loops too");
    assert_eq!(err.category(), "deadline");
    assert!(started.elapsed() < DEADLINE * 10);
    assert_still_works(&engine, &policy);
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    let engine = engine();
    let policy = hostile(&engine);
    let (err, _) = plan_error(&policy, "memory-bomb");
    assert!(
        matches!(err, Error::PolicyMemoryLimit { limit_bytes, .. } if limit_bytes == MEMORY_LIMIT),
        "{err}"
    );
    assert_eq!(err.category(), "memory_limit");
    assert_still_works(&engine, &policy);
}

fn assert_invalid(policy: &Policy, reason: &str, expected: &str) {
    let (err, _) = plan_error(policy, reason);
    assert_eq!(err.category(), "invalid_decision", "{reason}: {err}");
    let msg = err.to_string();
    assert!(msg.contains(expected), "{reason}: {msg}");
    assert!(
        msg.len() < 2_048,
        "{reason}: the error message stays readable"
    );
}

#[test]
fn malformed_plans_are_invalid_decisions_never_actions() {
    let engine = engine();
    let policy = hostile(&engine);
    for (reason, expected) in [
        ("huge-reason", "more than the 1024 allowed"),
        ("huge-list", "decided more than once"),
        (
            "unknown-pod",
            "kube-system/not-on-this-node which is not on the node",
        ),
        ("duplicate", "decided more than once"),
        ("missing", "no decision for pod"),
        ("evict-everything", "mirror (static) pod"),
        ("negative-grace", "grace period -5 s"),
        ("zero-timeout", "attempt-timeout-ms 0"),
        ("zero-concurrency", "max-concurrent-evictions is 0"),
        ("empty-reason", "skip reason for pod"),
    ] {
        assert_invalid(&policy, reason, expected);
    }
    assert_still_works(&engine, &policy);
}

#[test]
fn evicting_a_daemonset_pod_is_refused() {
    let engine = engine();
    let policy = hostile(&engine);
    let pods: Vec<Pod> = [PodKind::Deployment, PodKind::DaemonSet]
        .iter()
        .enumerate()
        .map(|(i, k)| convert::pod(&fixtures::pod(*k, "a", "x", i, "worker-1")))
        .collect();
    let err = policy
        .plan_drain(&maintenance("evict-everything"), &node(), &pods)
        .expect_err("DaemonSet eviction");
    assert!(err.to_string().contains("managed by a DaemonSet"), "{err}");
}

#[test]
fn malformed_verdicts_are_invalid_decisions() {
    let engine = engine();
    let policy = hostile(&engine);
    for (reason, expected) in [
        ("fail-empty", "failure message is empty"),
        ("fail-huge", "more than the 1024 allowed"),
        ("retry-forever", "retry-after-ms 18446744073709551615"),
    ] {
        let err = policy
            .on_failure(&maintenance(reason), &Failure::NodeNotFound)
            .expect_err(reason);
        assert_eq!(err.category(), "invalid_decision");
        assert!(err.to_string().contains(expected), "{reason}: {err}");
    }
    let err = policy
        .on_failure(&maintenance("trap"), &Failure::NodeNotFound)
        .expect_err("trap");
    assert_eq!(err.category(), "trap");
    assert_eq!(
        policy
            .on_failure(&maintenance("behave"), &Failure::NodeNotFound)
            .unwrap(),
        Verdict::RetryAfter(Duration::from_secs(1))
    );
}

#[test]
fn a_slow_policy_within_the_deadline_answers() {
    let engine = PolicyEngine::new(EngineConfig {
        deadline: Duration::from_secs(5),
        ..EngineConfig::default()
    })
    .unwrap();
    let policy = hostile(&engine);
    let plan = policy
        .plan_drain(&maintenance("slow"), &node(), &pods())
        .expect("slow but in time");
    assert_eq!(plan.steps.len(), 30);
}

#[test]
fn a_chatty_policy_still_decides() {
    let engine = engine();
    let policy = hostile(&engine);
    let plan = policy
        .plan_drain(&maintenance("chatty"), &node(), &pods())
        .expect("logging is capped, not fatal");
    assert_eq!(plan.steps.len(), 30);
}

#[test]
fn every_decision_gets_a_fresh_store() {
    let engine = engine();
    let policy = hostile(&engine);
    for _ in 0..3 {
        let plan = policy
            .plan_drain(&maintenance("stateful"), &node(), &pods())
            .unwrap();
        assert_eq!(
            plan.attempt_timeout,
            Duration::from_secs(1),
            "state leaked between calls"
        );
    }
}

#[test]
fn concurrent_calls_are_independent() {
    let engine = engine();
    let policy = hostile(&engine);
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let policy = policy.clone();
            std::thread::spawn(move || {
                let reason = if i % 2 == 0 { "loop" } else { "behave" };
                policy
                    .plan_drain(&maintenance(reason), &node(), &pods())
                    .map(|p| p.steps.len())
                    .map_err(|e| e.category())
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let r = t.join().expect("no host panic");
        if i % 2 == 0 {
            assert_eq!(r, Err("deadline"));
        } else {
            assert_eq!(r, Ok(30));
        }
    }
}

fn load_error(bytes: &[u8]) -> Error {
    engine().load("bad.wasm", bytes).expect_err("must not load")
}

#[test]
fn files_that_are_not_policies_are_refused_with_a_clear_error() {
    let garbage = load_error(b"#!/bin/sh\necho this is not wasm\n");
    assert_eq!(garbage.category(), "load");
    assert!(
        garbage.to_string().contains("not a WebAssembly file"),
        "{garbage}"
    );

    assert_eq!(load_error(b"").category(), "load");

    let core = wat::parse_str("(module (func (export \"plan-drain\")))").unwrap();
    let err = load_error(&core);
    assert_eq!(err.category(), "wrong_world");
    assert!(err.to_string().contains("core WebAssembly module"), "{err}");

    let empty_component = wat::parse_str("(component)").unwrap();
    let err = load_error(&empty_component);
    assert_eq!(err.category(), "wrong_world", "{err}");
    assert!(err.to_string().contains("no export"), "{err}");

    let wrong_signature = wat::parse_str(
        r#"(component
            (core module $m (func (export "f") (result i32) i32.const 0))
            (core instance $i (instantiate $m))
            (func $plan (result u32) (canon lift (core func $i "f")))
            (export "plan-drain" (func $plan))
            (export "on-failure" (func $plan)))"#,
    )
    .unwrap();
    assert_eq!(load_error(&wrong_signature).category(), "wrong_world");

    let real = std::fs::read(HOSTILE).unwrap();
    let truncated = load_error(&real[..real.len() / 2]);
    assert_eq!(truncated.category(), "load", "{truncated}");
}

#[test]
fn a_missing_file_is_a_load_error_naming_the_path() {
    let err = engine()
        .load_file(std::path::Path::new("/nonexistent/policy.wasm"))
        .expect_err("missing");
    assert_eq!(err.category(), "load");
    assert!(
        err.to_string().contains("/nonexistent/policy.wasm"),
        "{err}"
    );
}
