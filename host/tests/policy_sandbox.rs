//! Hostile guests: each misbehaviour ends in its typed error, promptly, and
//! the engine keeps working for the next call.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use nmo::fixtures::{self, PodKind};
use nmo::policy::types::{Failure, Maintenance};
use nmo::policy::{EngineConfig, Policy, PolicyEngine, Verdict};
use nmo_policy_runtime::Error;

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
    fixtures::maintenance(reason)
}

fn node() -> Node {
    fixtures::node("worker-1")
}

fn pods() -> Vec<Pod> {
    fixtures::node_pods("worker-1", 30)
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
        Error::Trap {
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
        .map(|i| fixtures::pod(PodKind::Deployment, "a", "web", i, "worker-1"))
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
        matches!(err, Error::Deadline { deadline, .. } if deadline == DEADLINE),
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
        matches!(err, Error::MemoryLimit { limit_bytes, .. } if limit_bytes == MEMORY_LIMIT),
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
    // An 8 MiB reason, 100,000 decisions: not even copied out of the
    // sandbox.
    let engine_ = engine();
    for reason in ["huge-reason", "huge-list"] {
        let (err, _) = plan_error(&hostile(&engine_), reason);
        assert_eq!(err.category(), "output_limit", "{reason}: {err}");
    }
    let engine = engine();
    let policy = hostile(&engine);
    for (reason, expected) in [
        (
            "unknown-pod",
            "decision for pod #37 but only 30 pod(s) were given",
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
        .map(|(i, k)| fixtures::pod(*k, "a", "x", i, "worker-1"))
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

// ---------------------------------------------------------------------------
// Wall-clock deadlines: whatever the guest waits on.

const SLEEPY_INIT: &str = concat!(env!("NMO_POLICY_WASM_DIR"), "/nmo_policy_sleepy_init.wasm");

fn assert_stopped_at_deadline(err: &Error, took: Duration, what: &str) {
    assert_eq!(err.category(), "deadline", "{what}: {err}");
    assert!(
        matches!(err, Error::Deadline { deadline, .. } if *deadline == DEADLINE),
        "{what}: {err}"
    );
    // The guest asked for a minute; a loaded CI machine gets slack, not a minute.
    assert!(took < DEADLINE * 10, "{what}: took {took:?}");
}

#[test]
fn a_sleeping_policy_is_stopped_at_the_deadline_in_wall_clock_time() {
    let engine = engine();
    let policy = hostile(&engine);
    let (err, took) = plan_error(&policy, "sleep");
    assert_stopped_at_deadline(&err, took, "sleep in plan-drain");

    let started = Instant::now();
    let err = policy
        .on_failure(&maintenance("sleep-on-failure"), &Failure::NodeNotFound)
        .expect_err("sleeps in on-failure");
    assert_stopped_at_deadline(&err, started.elapsed(), "sleep in on-failure");
    assert_still_works(&engine, &policy);
}

#[test]
fn a_policy_sleeping_in_its_static_initialiser_is_stopped_at_the_deadline() {
    let engine = engine();
    let policy = engine
        .load_file(std::path::Path::new(SLEEPY_INIT))
        .expect("it compiles and links");
    let started = Instant::now();
    let err = policy
        .plan_drain(&maintenance("behave"), &node(), &pods())
        .expect_err("its initialiser sleeps");
    assert_stopped_at_deadline(&err, started.elapsed(), "sleep in the initialiser");
    let started = Instant::now();
    let err = policy
        .on_failure(&maintenance("behave"), &Failure::NodeNotFound)
        .expect_err("its initialiser sleeps");
    assert_stopped_at_deadline(&err, started.elapsed(), "sleep before on-failure");
    // The self-check (what a reload and `nmo policy check` run) is bounded too.
    let started = Instant::now();
    nmo::policy::selfcheck::run(&policy).expect_err("refused by the self-check");
    assert!(started.elapsed() < DEADLINE * 10);
    assert_still_works(&engine, &hostile(&engine));
}

#[test]
fn waiting_for_the_frozen_clock_to_move_ends_at_the_deadline() {
    let engine = engine();
    let policy = hostile(&engine);
    let (err, took) = plan_error(&policy, "busy-wait-clock");
    assert_stopped_at_deadline(&err, took, "busy wait on the monotonic clock");
}

#[test]
fn ten_sleeping_decisions_at_once_all_end_and_the_slots_come_back() {
    let engine = engine();
    let policy = hostile(&engine);
    let slots = engine.config().max_concurrent_calls;
    let started = Instant::now();
    let threads: Vec<_> = (0..10)
        .map(|_| {
            let policy = policy.clone();
            std::thread::spawn(move || {
                policy
                    .plan_drain(&maintenance("sleep"), &node(), &pods())
                    .map(|_| ())
                    .map_err(|e| e.category())
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().expect("no host panic"), Err("deadline"));
    }
    // Ten decisions through `slots` slots, each held at most a deadline.
    let rounds = 10u32.div_ceil(slots);
    let took = started.elapsed();
    assert!(
        took < DEADLINE * (rounds + 1) * 4,
        "{rounds} rounds of {DEADLINE:?} took {took:?}"
    );
    assert_still_works(&engine, &policy);
}

#[test]
fn a_policy_sees_the_decisions_time_and_a_still_monotonic_clock() {
    let engine = engine();
    let policy = hostile(&engine);
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let plan = policy
        .at(at)
        .plan_drain(&maintenance("clock"), &node(), &pods())
        .unwrap();
    let reason = match &plan.steps.iter().find(|s| s.pod == 0).unwrap().action {
        nmo::policy::Action::Skip { reason } => reason.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(reason, "wall=1800000000 monotonic-moved=0");
    // Without a set time, the wall clock is the decision's start.
    let plan = policy
        .plan_drain(&maintenance("clock"), &node(), &pods())
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let reason = format!(
        "{:?}",
        plan.steps.iter().find(|s| s.pod == 0).unwrap().action
    );
    let seen: u64 = reason
        .split("wall=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(now.abs_diff(seen) <= 5, "{reason}");
}

// ---------------------------------------------------------------------------
// Memory: what the host copies out is bounded, not only the guest's memory.

#[test]
fn an_answer_too_large_to_copy_out_is_an_output_limit_error() {
    let engine = engine();
    let policy = hostile(&engine);
    let (err, _) = plan_error(&policy, "wide-answer");
    assert_eq!(err.category(), "output_limit", "{err}");
    assert!(
        matches!(err, Error::OutputLimit { limit_bytes, .. } if limit_bytes == engine.config().output_limit_bytes),
        "{err}"
    );
    assert_still_works(&engine, &policy);
}

// ---------------------------------------------------------------------------
// Text: nothing a policy writes reaches a status, event or terminal raw.

fn assert_printable(text: &str) {
    for c in text.chars() {
        assert!(
            !c.is_control()
                && !matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200b}'..='\u{200f}'),
            "{c:?} in {text:?}"
        );
    }
}

#[test]
fn control_characters_in_reasons_and_messages_are_escaped() {
    let engine = engine();
    let policy = hostile(&engine);
    let plan = policy
        .plan_drain(&maintenance("control-chars"), &node(), &pods())
        .unwrap();
    let mut seen = 0;
    for step in &plan.steps {
        if let nmo::policy::Action::Skip { reason } = &step.action {
            assert_printable(reason);
            seen += 1;
        }
    }
    assert!(seen >= 7, "every kind went through ({seen})");
    let reasons: Vec<String> = plan
        .steps
        .iter()
        .filter_map(|s| match &s.action {
            nmo::policy::Action::Skip { reason } => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert!(
        reasons.iter().any(|r| r == "line\\nPhase: Succeeded"),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r == "bidi\\u{202e}gnp.exe"),
        "{reasons:?}"
    );

    let verdict = policy
        .on_failure(&maintenance("control-chars"), &Failure::NodeNotFound)
        .unwrap();
    let Verdict::Fail(message) = verdict else {
        panic!("{verdict:?}")
    };
    assert_printable(&message);
    assert!(
        message.starts_with("gave up\\nPhase: Succeeded\\r\\u{1b}[32m"),
        "{message}"
    );
}

#[test]
fn a_retry_at_once_waits_at_least_a_second() {
    let engine = engine();
    let policy = hostile(&engine);
    assert_eq!(
        policy
            .on_failure(&maintenance("block-now"), &Failure::NodeNotFound)
            .unwrap(),
        Verdict::RetryAfter(nmo::policy::validate::MIN_RETRY)
    );
    assert_eq!(nmo::policy::validate::MIN_RETRY, Duration::from_secs(1));
    for failures in 1..8 {
        assert!(nmo::controller::backoff(failures) >= Duration::from_secs(1));
    }
    assert_eq!(
        nmo::controller::backoff(20),
        Duration::from_millis(5 << 19).min(Duration::from_secs(1000))
    );
}

// ---------------------------------------------------------------------------
// Loading: size, compile time and memory, contract version.

/// An engine that compiles in the `nmo` binary's compile worker.
fn worker_engine(timeout: Duration, max_memory_bytes: u64) -> PolicyEngine {
    let mut config = EngineConfig {
        deadline: DEADLINE,
        ..EngineConfig::default()
    };
    config.compile.timeout = timeout;
    config.compile.max_memory_bytes = max_memory_bytes;
    config.compile = config
        .compile
        .with_worker_exe(env!("CARGO_BIN_EXE_nmo").into());
    PolicyEngine::new(config).unwrap()
}

#[test]
fn a_policy_compiled_by_the_worker_decides_as_one_compiled_here() {
    let engine = worker_engine(Duration::from_secs(60), 1 << 30);
    let policy = hostile(&engine);
    let plan = policy
        .plan_drain(&maintenance("behave"), &node(), &pods())
        .expect("the worker's artifact runs here");
    assert_eq!(plan.steps.len(), 30);
    assert_still_works(&engine, &policy);
}

#[test]
fn a_file_over_the_size_limit_is_refused_before_compiling() {
    let engine = engine();
    let limit = engine.config().compile.max_policy_bytes;
    let mut big = std::fs::read(HOSTILE).unwrap();
    big.resize(limit + 1, 0);
    let started = Instant::now();
    let err = engine.load("big.wasm", &big).expect_err("too big");
    assert_eq!(err.category(), "compile_limit", "{err}");
    assert!(
        err.to_string().contains(&format!("more than the {limit}")),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.wasm");
    std::fs::write(&path, &big).unwrap();
    let err = engine.load_file(&path).expect_err("too big");
    assert_eq!(err.category(), "compile_limit", "{err}");
}

/// A component of `n` small functions: under the size limit, seconds of
/// native code generation (40,000: about 6 s on the 2-core CI machine).
fn many_functions(n: usize) -> Vec<u8> {
    let mut core = String::new();
    for i in 0..n {
        core.push_str(&format!(
            "(func (export \"f{i}\") (param i32) (result i32) (i32.add (local.get 0) (i32.const {i})))"
        ));
    }
    wat::parse_str(format!("(component (core module {core}))")).unwrap()
}

#[test]
fn a_policy_that_takes_too_long_to_compile_is_stopped() {
    let engine = worker_engine(Duration::from_secs(1), 1 << 30);
    let bomb = many_functions(40_000);
    assert!(
        bomb.len() < engine.config().compile.max_policy_bytes,
        "{} bytes",
        bomb.len()
    );
    let started = Instant::now();
    let err = engine
        .load("many.wasm", &bomb)
        .expect_err("too slow to compile");
    let took = started.elapsed();
    assert_eq!(err.category(), "compile_limit", "{err}");
    assert!(
        err.to_string().contains("compiling took longer than 1s"),
        "{err}"
    );
    // Stopped at 1 s of its CPU time, or at the 6 s wall-clock backstop
    // on a machine too busy to give it that: not waited for.
    assert!(
        took < Duration::from_secs(8),
        "stopped, not waited for: {took:?}"
    );
    // The engine goes on compiling: a small component compiles within the
    // same 1 s on a busy machine (a whole policy may not), and is refused
    // only for what it is (no policy's world).
    let small = engine
        .load("small.wasm", &many_functions(10))
        .expect_err("not a policy");
    assert_ne!(small.category(), "compile_limit", "{small}");
}

#[test]
fn a_policy_that_needs_too_much_memory_to_compile_is_stopped() {
    // An address space far too small for the compiler.
    let engine = worker_engine(Duration::from_secs(60), 48 << 20);
    let err = engine
        .load_file(std::path::Path::new(HOSTILE))
        .expect_err("no room to compile");
    assert_eq!(err.category(), "compile_limit", "{err}");
    assert!(
        err.to_string().contains("needed more than the 48 MiB"),
        "{err}"
    );
}

#[test]
fn a_policy_built_against_another_contract_version_is_refused_naming_both() {
    let engine = engine();
    let real = std::fs::read(HOSTILE).unwrap();
    let from = b"medik8s:node-maintenance/types@0.4.0";
    let at: Vec<usize> = real
        .windows(from.len())
        .enumerate()
        .filter(|(_, w)| *w == from)
        .map(|(i, _)| i)
        .collect();
    assert!(
        !at.is_empty(),
        "the policy imports the contract's types interface"
    );
    let patched = |version: &str| {
        let mut bytes = real.clone();
        for i in &at {
            bytes[i + from.len() - 5..i + from.len()].copy_from_slice(version.as_bytes());
        }
        bytes
    };
    for other in ["0.2.0", "0.5.0", "1.2.0"] {
        let err = engine
            .load("future.wasm", &patched(other))
            .expect_err(other);
        assert_eq!(err.category(), "contract_version", "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("@{other}")) && msg.contains("@0.4.0"),
            "{msg}"
        );
    }
    for served in ["0.4.9", "0.3.0", "0.3.9"] {
        engine
            .load("patch.wasm", &patched(served))
            .unwrap_or_else(|e| panic!("{served} loads: {e}"));
    }
}

const CONTRACT_0_3: &str = concat!(env!("NMO_POLICY_WASM_DIR"), "/nmo_policy_contract_0_3.wasm");

/// A policy built against contract 0.3.0 (before a pod's `workload`)
/// loads in this 0.4 host and reads every 0.3 accessor as it always did.
#[test]
fn a_policy_built_against_contract_0_3_loads_and_reads_what_it_always_read() {
    let engine = engine();
    let policy = engine
        .load_file(std::path::Path::new(CONTRACT_0_3))
        .expect("a 0.3 policy loads");
    assert_eq!(policy.interface().contract(), Some("0.3.0"));
    assert!(!policy.reads_workloads());
    let mut pod = fixtures::pod(PodKind::Deployment, "shop", "web", 1, "worker-1");
    pod.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
    pod.metadata.uid = Some("u-1".into());
    let mut node = node();
    node.spec.get_or_insert_default().taints = Some(vec![k8s_openapi::api::core::v1::Taint {
        key: "medik8s.io/drain".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    }]);
    let plan = policy
        .plan_drain(&maintenance("behave"), &node, std::slice::from_ref(&pod))
        .expect("a 0.3 policy decides");
    let reason = match &plan.steps[0].action {
        nmo::policy::Action::Skip { reason } => reason.clone(),
        other => panic!("{other:?}"),
    };
    for part in [
        "uid=u-1 phase=PodPhase::Running ready=true",
        "owners=ReplicaSet/",
        "labels=app=web",
        "history=0/0/0",
        "node=worker-1 taints=medik8s.io/drain:TaintEffect::NoSchedule",
    ] {
        assert!(reason.contains(part), "{part:?} in {reason}");
    }
}

/// Only a policy that calls a pod's `workload` makes the operator read
/// the workloads: the default never pays for them, no-downtime does.
#[test]
fn only_a_policy_that_asks_for_workloads_has_them_read() {
    let engine = engine();
    let load = |name: &str| {
        let path = format!("{}/nmo_policy_{name}.wasm", env!("NMO_POLICY_WASM_DIR"));
        engine.load_file(std::path::Path::new(&path)).expect(name)
    };
    assert!(!load("default").reads_workloads());
    assert!(!load("hostile").reads_workloads());
    assert!(load("no_downtime").reads_workloads());
    assert_eq!(load("no_downtime").interface().contract(), Some("0.4.0"));
}

/// The default policy as an earlier version of the operator shipped it is
/// refused, naming both versions and how to rebuild.
fn refused_with_how_to_rebuild(file: &str, old: &[u8], version: &str) {
    let err = engine()
        .load(file, old)
        .expect_err("an older policy does not load");
    assert_eq!(err.category(), "contract_version", "{err}");
    let msg = err.to_string();
    for part in [
        format!("medik8s:node-maintenance@{version}"),
        "implements @0.4.0 (and loads policies of @0.3.x)".to_owned(),
        "nmo-policy-sdk".to_owned(),
        "nmo policy new".to_owned(),
        "cargo build --target wasm32-wasip2".to_owned(),
    ] {
        assert!(msg.contains(&part), "{part:?} in {msg}");
    }
}

#[test]
fn a_policy_built_for_contract_0_1_is_refused_with_how_to_rebuild() {
    let old = include_bytes!("data/default-contract-0.1.0.wasm");
    refused_with_how_to_rebuild("default-0.1.wasm", old, "0.1.0");
}

#[test]
fn a_policy_built_for_contract_0_2_is_refused_with_how_to_rebuild() {
    let old = include_bytes!("data/default-contract-0.2.0.wasm");
    refused_with_how_to_rebuild("default-0.2.wasm", old, "0.2.0");
}

fn fleet_of(nodes: usize) -> nmo::policy::Fleet {
    nmo::policy::Fleet {
        nodes: nmo::policy::fleet_nodes(
            (0..nodes).map(|i| fixtures::node(&format!("worker-{}", i + 1))),
        ),
        ..Default::default()
    }
}

#[test]
fn hostile_admissions_are_typed_errors_never_an_admission() {
    let engine = engine();
    let policy = hostile(&engine);
    let fleet = fleet_of(3);
    let admit = |reason: &str| policy.admit(&maintenance(reason), 0, &fleet);
    for (reason, category, says) in [
        ("admit-trap", "trap", "panics in admit"),
        ("admit-loop", "deadline", "deadline"),
        (
            "admit-wait-zero",
            "invalid_decision",
            "recheck-after-ms 0 is outside",
        ),
        (
            "admit-deny-empty",
            "invalid_decision",
            "the deny message is empty",
        ),
    ] {
        let err = admit(reason).expect_err(reason);
        assert_eq!(err.category(), category, "{reason}: {err}");
        assert!(err.to_string().contains(says), "{reason}: {err}");
    }
    // The policy sees the fleet it is given, and its own node by position.
    match admit("admit-wait").expect("a wait") {
        nmo::policy::Admission::Wait {
            reason,
            recheck_after: None,
        } => assert_eq!(reason, "worker-1 sees 3 node(s), 0 other maintenance(s)"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        admit("behave").expect("the default rule"),
        nmo::policy::Admission::Admit
    );
    assert_still_works(&engine, &policy);
}

#[test]
fn settings_reach_every_decision_and_a_refusal_carries_the_policys_words() {
    let engine = engine();
    let policy = hostile(&engine);
    let settings = |pairs: &[(&str, &str)]| {
        nmo::policy::Settings::from_map(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let configured = policy
        .with_settings(settings(&[("answer", "42"), ("colour", "blue")]))
        .expect("the hostile policy takes any settings but `refuse` and `loop`");
    let plan = configured
        .plan_drain(&maintenance("settings"), &node(), &pods())
        .unwrap();
    assert_eq!(
        plan.steps[0].action,
        nmo::policy::Action::Skip {
            reason: "settings: answer=42,colour=blue".into()
        }
    );
    // Without settings, the same policy sees none.
    let plan = policy
        .plan_drain(&maintenance("settings"), &node(), &pods())
        .unwrap();
    assert!(
        matches!(&plan.steps[0].action, nmo::policy::Action::Skip { reason } if reason == "settings: ")
    );

    let err = policy
        .with_settings(settings(&[(
            "refuse",
            "threshold must be \u{1b}[31ma number",
        )]))
        .expect_err("refused");
    assert_eq!(err.category(), "settings");
    assert_eq!(
        err.to_string(),
        "policy nmo_policy_hostile.wasm refused its settings: threshold must be \\u{1b}[31ma number"
    );
    let started = Instant::now();
    let err = policy
        .with_settings(settings(&[("loop", "yes")]))
        .expect_err("stopped");
    assert_eq!(err.category(), "deadline", "{err}");
    assert!(started.elapsed() < DEADLINE * 10);
}

#[test]
fn the_decision_time_and_the_node_reach_the_policy() {
    let engine = engine();
    let policy = hostile(&engine);
    let mut m = maintenance("now");
    m.now_ms = 1_767_607_200_000;
    let plan = policy.plan_drain(&m, &node(), &pods()).unwrap();
    assert_eq!(
        plan.steps[0].action,
        nmo::policy::Action::Skip {
            reason: "now=1767607200000 node=worker-1 ready=true".into()
        }
    );
}

#[test]
fn a_policy_that_needs_settings_refuses_to_run_alone_and_says_where_they_go() {
    let engine = engine();
    let window = engine
        .load(
            "window.wasm",
            &std::fs::read(concat!(
                env!("NMO_POLICY_WASM_DIR"),
                "/nmo_policy_window.wasm"
            ))
            .unwrap(),
        )
        .unwrap();
    let err = window.alone().expect_err("window needs start and end");
    assert_eq!(err.category(), "settings");
    assert_eq!(
        err.to_string(),
        "policy window.wasm refused its settings: setting start is required (HH:MM, e.g. \
         22:00) (a policy file given alone gets no settings: put it in a policy directory \
         whose policies.yaml gives them)"
    );
    // One that takes none runs alone.
    hostile(&engine).alone().expect("no settings needed");
}

/// Collects the log lines written on this thread.
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A policy printing `x\n` and `y\n` in a loop once made 16,386 log
/// records per decision. Now: at most 64 records a decision (its `log`
/// calls, stdout and stderr lines together) plus one line saying how much
/// was dropped, and at most 600 a minute for the policy however often it
/// is called.
#[test]
fn a_policy_printing_short_lines_is_bounded_in_records() {
    // The records are under test, not the deadline: room for a busy
    // machine.
    let engine = PolicyEngine::new(EngineConfig {
        deadline: Duration::from_secs(20),
        ..EngineConfig::default()
    })
    .unwrap();
    let policy = hostile(&engine);
    let out = Lines::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let count = |out: &Lines| {
        String::from_utf8_lossy(&out.0.lock().unwrap())
            .lines()
            .count()
    };
    tracing::subscriber::with_default(subscriber, || {
        policy
            .plan_drain(&maintenance("newlines"), &node(), &pods())
            .expect("printing is capped, not fatal");
        let one = count(&out);
        assert!(one <= 65, "{one} records for one decision");
        let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
        assert!(
            text.contains("lines and") && text.contains("dropped"),
            "no line says what was dropped: {text}"
        );
        for _ in 0..19 {
            policy
                .plan_drain(&maintenance("newlines"), &node(), &pods())
                .unwrap();
        }
        let twenty = count(&out);
        assert!(
            twenty <= 600,
            "{twenty} records for twenty decisions in a minute"
        );
        println!(
            "x and y printed 4,000 times each a decision: {one} records for one decision, {twenty} for twenty"
        );
    });
}

/// A surge of a pod whose owner cannot bring up a replacement (a
/// StatefulSet's, a bare pod) is an invalid decision naming the pod.
#[test]
fn surging_a_pod_no_replicaset_controls_is_refused() {
    let engine = engine();
    let policy = hostile(&engine);
    for kind in [PodKind::StatefulSet, PodKind::Bare] {
        let pods = vec![fixtures::pod(kind, "shop", "db", 0, "worker-1")];
        let name = pods[0].metadata.name.clone().unwrap();
        let err = policy
            .plan_drain(&maintenance("surge-everything"), &node(), &pods)
            .expect_err("no surge without a ReplicaSet");
        assert_eq!(err.category(), "invalid_decision", "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pod shop/{name} cannot surge")),
            "{msg}"
        );
    }
}

/// The frozen artifacts of every contract version this host serves (built
/// then, kept in `tests/data`), and the decisions they made when frozen
/// (`tests/data/frozen-decisions.txt`; `NMO_WRITE_FROZEN=1` writes it
/// anew, for a new artifact).
const FROZEN: &[(&str, &[u8], &str)] = &[
    (
        "probe-contract-0.3.0.wasm",
        include_bytes!("data/probe-contract-0.3.0.wasm"),
        "0.3.0",
    ),
    (
        "default-contract-0.4.0.wasm",
        include_bytes!("data/default-contract-0.4.0.wasm"),
        "0.4.0",
    ),
    (
        "no-downtime-contract-0.4.0.wasm",
        include_bytes!("data/no-downtime-contract-0.4.0.wasm"),
        "0.4.0",
    ),
];

/// What a policy decides in a fixed set of scenarios: plans of a node of
/// 30 pods of every kind, verdicts on every failure, an admission, its
/// settings checked. Clocks frozen, so the text is the same at every run.
fn decisions(policy: &Policy) -> Vec<String> {
    use nmo::policy::types::{DrainReport, PodRef};
    let policy = policy.at(std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let mut out = Vec::new();
    for reason in ["behave", "kernel upgrade"] {
        out.push(format!(
            "plan {reason}: {:?}",
            policy.plan_drain(&maintenance(reason), &node(), &pods())
        ));
    }
    let report = DrainReport {
        pending: vec![PodRef {
            namespace: "shop".into(),
            name: "db-0".into(),
        }],
        pdb_blocked: Vec::new(),
        blocked: Vec::new(),
        waited: Vec::new(),
        timed_out: true,
        message: "1 pod left".into(),
    };
    for failure in [
        Failure::NodeNotFound,
        Failure::LeaseHeld("another-operator".into()),
        Failure::LeaseError("conflict".into()),
        Failure::DrainIncomplete(report),
        Failure::ApiError("500".into()),
        Failure::VolumesAttached(vec!["pv-1".into()]),
    ] {
        out.push(format!(
            "on-failure {failure:?}: {:?}",
            policy.on_failure(&maintenance("x"), &failure)
        ));
    }
    out.push(format!(
        "admit: {:?}",
        policy.admit(&maintenance("x"), 0, &fleet_of(3))
    ));
    out.push(format!("settings: {:?}", policy.validate_settings(&[])));
    out
}

/// Every published contract version this host serves keeps working:
/// frozen policies of 0.3 and 0.4 load, each through its own version's
/// binding, and decide exactly as they did when they were frozen.
#[test]
fn frozen_policies_of_every_served_contract_decide_as_they_did() {
    let engine = engine();
    let mut now = String::new();
    for (file, bytes, version) in FROZEN {
        let policy = engine.load(file, bytes).expect(file);
        assert_eq!(policy.interface().contract(), Some(*version), "{file}");
        now.push_str(&format!("== {file}\n"));
        for d in decisions(&policy) {
            now.push_str(&d);
            now.push('\n');
        }
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/frozen-decisions.txt"
    );
    if std::env::var_os("NMO_WRITE_FROZEN").is_some() {
        std::fs::write(path, &now).unwrap();
    }
    let then = std::fs::read_to_string(path).expect("the frozen decisions");
    for (line, (was, is)) in then.lines().zip(now.lines()).enumerate() {
        assert_eq!(was, is, "line {} of frozen-decisions.txt", line + 1);
    }
    assert_eq!(then.lines().count(), now.lines().count());
}
