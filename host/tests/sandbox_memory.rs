//! The sandbox's memory as a whole, in a process of its own (this file
//! holds one test, so the figures are this test's): hostile decisions at
//! once stay inside the budget the Deployment's memory limit is set from,
//! and the memory goes back once they end.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nmo::fixtures;
use nmo::policy::types::Maintenance;
use nmo::policy::{EngineConfig, PolicyEngine};

const HOSTILE: &str = concat!(env!("NMO_POLICY_WASM_DIR"), "/nmo_policy_hostile.wasm");

/// A field of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

fn maintenance(reason: &str) -> Maintenance {
    fixtures::maintenance(reason)
}

#[test]
fn hostile_decisions_at_once_stay_under_budget_and_give_the_memory_back() {
    let engine = PolicyEngine::new(EngineConfig {
        deadline: Duration::from_millis(300),
        ..EngineConfig::default()
    })
    .unwrap();
    let policy = engine.load_file(std::path::Path::new(HOSTILE)).unwrap();
    let node = fixtures::node("worker-1");
    let pods: Vec<Pod> = fixtures::node_pods("worker-1", 30);
    // Steady state: every slot used once by a well-behaved decision.
    let warm: Vec<_> = (0..8)
        .map(|_| {
            let (policy, node, pods) = (policy.clone(), node.clone(), pods.clone());
            std::thread::spawn(move || policy.plan_drain(&maintenance("behave"), &node, &pods))
        })
        .collect();
    for t in warm {
        t.join().unwrap().unwrap();
    }
    let idle = status_kib("VmRSS:");
    // Reset the peak (VmHWM) to now.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();

    let reasons = [
        "memory-bomb",
        "wide-answer",
        "huge-reason",
        "huge-list",
        "sleep",
    ];
    let threads: Vec<_> = (0..10)
        .map(|i| {
            let (policy, node, pods) = (policy.clone(), node.clone(), pods.clone());
            let reason = reasons[i % reasons.len()];
            std::thread::spawn(move || {
                policy
                    .plan_drain(&maintenance(reason), &node, &pods)
                    .map(|_| ())
                    .map_err(|e| e.category())
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().expect("no host panic").is_err());
    }
    let peak = status_kib("VmHWM:");
    let after = status_kib("VmRSS:");
    eprintln!(
        "sandbox memory: idle {} MiB, peak with 10 hostile decisions {} MiB, after {} MiB",
        idle >> 10,
        peak >> 10,
        after >> 10
    );
    assert!(peak < 200 << 10, "peak {} MiB", peak >> 10);
    assert!(
        after <= idle + idle / 5,
        "memory went back: idle {} KiB, after {} KiB",
        idle,
        after
    );
}
