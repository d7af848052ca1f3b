//! The Go operator's rules, as the default policy applies them, for
//! policies that change one thing and keep the rest.

use super::*;

/// Time one drain attempt may take (the Go operator's `DrainerTimeout`).
pub const ATTEMPT_TIMEOUT_MS: u64 = 30_000;
/// Wait after an incomplete drain (`waitDurationOnDrainError`).
pub const DRAIN_RETRY_MS: u64 = 5_000;
/// Lease errors tolerated during a drain
/// (`maxAllowedErrorToUpdateOwnedLease`).
pub const MAX_LEASE_ERRORS: u32 = 3;

/// kubectl drain's filters with `--ignore-daemonsets
/// --delete-emptydir-data --force`: skip DaemonSet-managed and mirror
/// pods, evict everything else with its own grace period.
pub fn pod_action(pod: &Pod) -> PodAction {
    if pod.is_daemonset_managed() {
        PodAction::skip("DaemonSet-managed pod (--ignore-daemonsets)")
    } else if pod.is_mirror() {
        PodAction::skip("mirror (static) pod, owned by the kubelet")
    } else {
        PodAction::evict()
    }
}

/// One wave, every pod decided by `action`, 30 s per attempt, no limit
/// on evictions in flight.
pub fn plan(pods: &[Pod], action: impl Fn(&Pod) -> PodAction) -> DrainPlan {
    DrainPlan {
        decisions: pods.iter().map(|p| p.decide(action(p), 0)).collect(),
        attempt_timeout_ms: ATTEMPT_TIMEOUT_MS,
        max_concurrent_evictions: None,
        volume_detach_timeout_ms: None,
    }
}

/// The Go operator's answers to failures: a missing node fails the
/// maintenance, an incomplete drain is retried after 5 s, lease trouble
/// is retried with backoff until more than 3 lease errors during the
/// drain, anything else is retried with backoff.
pub fn on_failure(maintenance: &Maintenance, failure: &Failure) -> Verdict {
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
        // The Go operator never waits for volumes; a policy that does
        // looks again as after an incomplete drain.
        Failure::VolumesAttached(_) => Verdict::RetryAfterMs(DRAIN_RETRY_MS),
    }
}

/// [`on_failure`], except that a drain held up by pods the policy
/// blocks on (waiting for a person, or for a job to finish) is looked
/// at again every `blocked_retry_ms` instead of every 5 s.
pub fn on_failure_waiting(
    maintenance: &Maintenance,
    failure: &Failure,
    blocked_retry_ms: u64,
) -> Verdict {
    match failure {
        Failure::DrainIncomplete(report) if !report.blocked.is_empty() => {
            Verdict::RetryAfterMs(blocked_retry_ms)
        }
        other => on_failure(maintenance, other),
    }
}

/// The Go operator's admission: every maintenance starts at once,
/// except that on OpenShift a control-plane node is refused when taking
/// it down would break etcd quorum (its webhook's rule, with its
/// message).
pub fn admit(maintenance: &Maintenance, node: &Node, fleet: &Fleet) -> Admission {
    match &fleet.etcd {
        Some(etcd) if node.is_control_plane() && !etcd_can_lose_one(etcd) => {
            Admission::Deny(format!(
                "can not put master/control-plane node into maintenance at this moment, \
                 disrupting node {} will violate etcd quorum",
                maintenance.node_name
            ))
        }
        _ => Admission::Admit,
    }
}

/// The Go operator's refusal first (the etcd quorum rule), then
/// `rule`: what a fleet rule adds to the default admission.
pub fn admit_with(
    maintenance: &Maintenance,
    node: &Node,
    fleet: &Fleet,
    rule: impl FnOnce() -> Admission,
) -> Admission {
    match admit(maintenance, node, fleet) {
        deny @ Admission::Deny(_) => deny,
        _ => rule(),
    }
}

/// medik8s common's etcd check: exactly one guard budget; it allows a
/// disruption, or the node runs no Ready guard pod (a guard that is
/// already down costs no quorum).
pub fn etcd_can_lose_one(etcd: &EtcdGuard) -> bool {
    etcd.budgets == 1 && (etcd.disruptions_allowed > 0 || !etcd.guard_ready_on_node)
}
