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

pub use nmo_policy_sdk::defaults::{
    ATTEMPT_TIMEOUT_MS, DRAIN_RETRY_MS, MAX_LEASE_ERRORS, pod_action as action_for,
};

/// The policy.
pub struct DefaultPolicy;

impl Policy for DefaultPolicy {
    fn plan_drain(_maintenance: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        defaults::plan(&pods, action_for)
    }

    fn on_failure(maintenance: Maintenance, failure: Failure) -> Verdict {
        defaults::on_failure(&maintenance, &failure)
    }
}

export_policy!(DefaultPolicy);
