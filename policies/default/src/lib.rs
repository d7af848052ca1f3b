//! The default nmo drain policy: the Go Node Maintenance Operator's
//! behaviour, rule for rule.
//!
//! Drain (kubectl drain with `--ignore-daemonsets --delete-emptydir-data
//! --force --grace-period=-1 --timeout=30s`, as the Go operator configures
//! its drain helper):
//! - DaemonSet-managed pods are skipped (`--ignore-daemonsets`);
//! - mirror (static) pods are skipped: the kubelet owns them;
//! - every other pod is evicted through the Eviction API with its own grace
//!   period, including pods with emptyDir data (`--delete-emptydir-data`),
//!   pods with no controller (`--force`), finished pods and pods already
//!   terminating (kubectl waits for them too);
//! - one wave, every eviction at once, 30 s per attempt.
//!
//! Failures:
//! - node missing: fail with `nodes "<name>" not found`;
//! - drain incomplete: retry after 5 s;
//! - lease held by another holder or lease error: retry with backoff; once
//!   the host's `errorOnLeaseCount` is over 3 (it counts only after the drain
//!   started), fail with "maintenance failed: lease could not be extended
//!   after N attempts";
//! - any other API error: retry with backoff.

use nmo_policy_sdk::*;

/// Time one drain attempt may take (the Go operator's `DrainerTimeout`).
pub const ATTEMPT_TIMEOUT_MS: u64 = 30_000;
/// Wait after an incomplete drain (`waitDurationOnDrainError`).
pub const DRAIN_RETRY_MS: u64 = 5_000;
/// Lease errors tolerated during a drain
/// (`maxAllowedErrorToUpdateOwnedLease`).
pub const MAX_LEASE_ERRORS: u32 = 3;

/// The policy.
pub struct DefaultPolicy;

/// kubectl drain's filters, in kubectl's order.
pub fn action_for(pod: &Pod) -> PodAction {
    if pod.is_daemonset_managed() {
        PodAction::skip("DaemonSet-managed pod (--ignore-daemonsets)")
    } else if pod.is_mirror() {
        PodAction::skip("mirror (static) pod, owned by the kubelet")
    } else {
        PodAction::evict()
    }
}

impl Policy for DefaultPolicy {
    fn plan_drain(_maintenance: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        DrainPlan {
            decisions: pods.iter().map(|p| p.decide(action_for(p), 0)).collect(),
            attempt_timeout_ms: ATTEMPT_TIMEOUT_MS,
            max_concurrent_evictions: None,
        }
    }

    fn on_failure(maintenance: Maintenance, failure: Failure) -> Verdict {
        match failure {
            Failure::NodeNotFound => {
                Verdict::Fail(format!("nodes \"{}\" not found", maintenance.node_name))
            }
            Failure::LeaseHeld(_) | Failure::LeaseError(_) => {
                if maintenance.error_on_lease_count > MAX_LEASE_ERRORS {
                    Verdict::Fail(format!(
                        "maintenance failed: lease could not be extended after {} attempts",
                        maintenance.error_on_lease_count
                    ))
                } else {
                    Verdict::RetryWithBackoff
                }
            }
            Failure::DrainIncomplete(_) => Verdict::RetryAfterMs(DRAIN_RETRY_MS),
            Failure::ApiError(_) => Verdict::RetryWithBackoff,
        }
    }
}

export_policy!(DefaultPolicy);
