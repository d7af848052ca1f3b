//! give-up: the default policy's rules, except that a drain that has not
//! finished after a time limit fails the maintenance instead of retrying
//! forever.
//!
//! The Go operator retries an incomplete drain every 5 s for as long as it
//! takes: a PodDisruptionBudget that never allows an eviction keeps a node
//! cordoned indefinitely, and nobody is told. With this policy the
//! maintenance fails once it has been running for the limit (10 minutes,
//! or the NodeMaintenance's `nmo.medik8s.io/give-up-after` annotation:
//! `90s`, `15m`, `2h`; the `timeout` setting in `policies.yaml` changes the
//! 10-minute default for every maintenance). Failing puts the node back into service
//! (uncordoned, untainted) and raises a `FailedMaintenance` event and the
//! `NodeMaintenanceFailed` alert, with `lastError` saying what was left.

use nmo_policy_sdk::*;

/// The maintenance annotation that sets the limit.
pub const ANNOTATION: &str = "nmo.medik8s.io/give-up-after";
/// The limit when the annotation is absent.
pub const DEFAULT_LIMIT_MS: u64 = 10 * 60 * 1000;

struct GiveUp;

/// The setting that changes the limit for every maintenance.
pub const SETTING: &str = "timeout";

/// The limit: the maintenance's annotation, else the `timeout` setting,
/// else 10 minutes.
fn limit_ms(m: &Maintenance) -> u64 {
    let configured = Settings::current()
        .duration_ms(SETTING)
        .ok()
        .flatten()
        .unwrap_or(DEFAULT_LIMIT_MS);
    match m.annotation(ANNOTATION) {
        None => configured,
        Some(v) => duration_ms(v).unwrap_or_else(|| {
            log(
                Level::Warn,
                &format!(
                    "{ANNOTATION}: cannot read {v:?} (use 90s, 15m, 2h); using {}",
                    show_ms(configured)
                ),
            );
            configured
        }),
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
                    show_ms(limit),
                    left.len(),
                    left.join(", "),
                    report.message
                ))
            }
            _ => defaults::on_failure(&m, &failure),
        }
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&[SETTING])?;
        settings.duration_ms(SETTING).map(|_| ())
    }
}

export_policy!(GiveUp);
