//! give-up: the default policy's rules, except that a drain that has not
//! finished after a time limit fails the maintenance instead of retrying
//! forever.
//!
//! The Go operator retries an incomplete drain every 5 s for as long as it
//! takes: a PodDisruptionBudget that never allows an eviction keeps a node
//! cordoned indefinitely, and nobody is told. With this policy the
//! maintenance fails once it has been running for the limit (10 minutes,
//! or the NodeMaintenance's `nmo.medik8s.io/give-up-after` annotation:
//! `90s`, `15m`, `2h`). Failing puts the node back into service
//! (uncordoned, untainted) and raises a `FailedMaintenance` event and the
//! `NodeMaintenanceFailed` alert, with `lastError` saying what was left.

use nmo_policy_sdk::*;

/// The maintenance annotation that sets the limit.
pub const ANNOTATION: &str = "nmo.medik8s.io/give-up-after";
/// The limit when the annotation is absent.
pub const DEFAULT_LIMIT_MS: u64 = 10 * 60 * 1000;

struct GiveUp;

/// `90s`, `15m`, `2h` or a bare number of seconds, in milliseconds.
fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    n.checked_mul(ms).filter(|&ms| ms > 0)
}

fn limit_ms(m: &Maintenance) -> u64 {
    match m.annotation(ANNOTATION) {
        None => DEFAULT_LIMIT_MS,
        Some(v) => parse_duration(v).unwrap_or_else(|| {
            log(
                Level::Warn,
                &format!("{ANNOTATION}: cannot read {v:?} (use 90s, 15m, 2h); using 10m"),
            );
            DEFAULT_LIMIT_MS
        }),
    }
}

fn show(ms: u64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

impl Policy for GiveUp {
    fn plan_drain(_m: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        defaults::plan(&pods, defaults::pod_action)
    }

    fn on_failure(m: Maintenance, failure: Failure) -> Verdict {
        let limit = limit_ms(&m);
        match &failure {
            Failure::DrainIncomplete(report) if m.elapsed_ms >= limit => {
                let left: Vec<String> = report
                    .pending
                    .iter()
                    .map(|p| format!("{}/{}", p.namespace, p.name))
                    .collect();
                Verdict::Fail(format!(
                    "gave up after {}: {} pods still on the node ({}): {}",
                    show(limit),
                    left.len(),
                    left.join(", "),
                    report.message
                ))
            }
            _ => defaults::on_failure(&m, &failure),
        }
    }
}

export_policy!(GiveUp);
