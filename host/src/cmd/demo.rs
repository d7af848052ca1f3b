//! `nmo demo`: what the operator would decide for a busy node.
//!
//! Until the simulated cluster and the controller land, the demo runs the
//! policy engine alone: it builds a realistic worker node, asks the policy
//! for a drain plan and for its verdict on each kind of failure, and prints
//! both the way the operator will act on them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use nmo::fixtures;
use nmo::policy::types::{DrainReport, Failure, PodRef};
use nmo::policy::{Action, EngineConfig, PolicyEngine, Verdict, convert, selfcheck};

pub fn run(policy_file: Option<PathBuf>, pods: usize) -> anyhow::Result<()> {
    let engine = PolicyEngine::new(EngineConfig::default())?;
    let policy = match &policy_file {
        Some(path) => engine.load_file(path)?,
        None => engine.default_policy()?,
    };
    println!(
        "policy {} (sha256 {}), world {}",
        policy.name(),
        &policy.digest()[..12],
        nmo::policy::WORLD
    );

    let node = fixtures::node("worker-1");
    let k8s_pods = fixtures::node_pods("worker-1", pods);
    let records: Vec<_> = k8s_pods.iter().map(convert::pod).collect();
    let mut m = selfcheck::sample_maintenance();
    m.name = "nm-worker-1".into();
    m.node_name = "worker-1".into();
    m.reason = "kernel upgrade".into();

    let started = Instant::now();
    let plan = policy.plan_drain(&m, &convert::node(&node), &records)?;
    let took = started.elapsed();
    println!(
        "\nplan-drain for node worker-1 with {} pods: {:.2} ms (fresh sandbox, validated)",
        records.len(),
        took.as_secs_f64() * 1e3
    );
    println!(
        "attempt timeout {:?}, max concurrent evictions {}, {} wave(s)",
        plan.attempt_timeout,
        plan.max_concurrent_evictions
            .map_or("unlimited".to_string(), |n| n.to_string()),
        plan.waves().count()
    );

    let mut by_action: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for step in &plan.steps {
        let label = match &step.action {
            Action::Evict { .. } => "evict".to_string(),
            Action::Delete { .. } => "delete".to_string(),
            Action::Skip { reason } => format!("skip ({reason})"),
            Action::Block { reason } => format!("block ({reason})"),
        };
        by_action
            .entry(label)
            .or_default()
            .push(format!("{}/{}", step.namespace, step.name));
    }
    for (action, names) in &by_action {
        let shown: Vec<_> = names.iter().take(3).cloned().collect();
        let more = names.len().saturating_sub(shown.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        println!(
            "  {:>5} x {action}: {}{more}",
            names.len(),
            shown.join(", ")
        );
    }

    println!("\non-failure verdicts:");
    let pending = vec![PodRef {
        namespace: "team-3".into(),
        name: "app3-3".into(),
    }];
    let mut during_drain = m.clone();
    during_drain.drain_progress = 40;
    let cases = [
        ("node missing", m.clone(), Failure::NodeNotFound),
        (
            "lease held before the drain",
            m.clone(),
            Failure::LeaseHeld("node-healthcheck".into()),
        ),
        (
            "4th lease error during the drain",
            {
                let mut x = during_drain.clone();
                x.error_on_lease_count = 4;
                x
            },
            Failure::LeaseError("lease renewal conflict".into()),
        ),
        (
            "drain incomplete (PDB)",
            during_drain.clone(),
            Failure::DrainIncomplete(DrainReport {
                pending: pending.clone(),
                pdb_blocked: pending,
                blocked: Vec::new(),
                timed_out: true,
                message: "drain did not complete within 30s".into(),
            }),
        ),
    ];
    for (label, maintenance, failure) in cases {
        let verdict = policy.on_failure(&maintenance, &failure)?;
        let text = match verdict {
            Verdict::RetryAfter(d) => format!("retry after {d:?}"),
            Verdict::RetryWithBackoff => "retry with backoff".to_string(),
            Verdict::Fail(msg) => format!("fail: {msg}"),
        };
        println!("  {label:<34} -> {text}");
    }
    println!(
        "\nThe controller and the simulated cluster that carry these decisions out are \
         being built; see README.md, \"Status\"."
    );
    Ok(())
}
