//! never-force: like the default policy, except that a pod with no
//! controller (nothing would recreate it once removed) is never evicted.
//! The drain blocks on it instead, and the maintenance reports which pod
//! needs a human. Finished pods are removed as usual: they hold nothing.
//!
//! Opt-in escape hatch: a pod annotated
//! `nmo.medik8s.io/evict-unmanaged: "true"` is evicted anyway.

use nmo_policy_sdk::*;

/// The annotation that lets an unmanaged pod be evicted.
pub const ALLOW: &str = "nmo.medik8s.io/evict-unmanaged";

struct NeverForce;

fn action_for(pod: &Pod) -> PodAction {
    if pod.is_daemonset_managed() {
        PodAction::skip("DaemonSet-managed pod")
    } else if pod.is_mirror() {
        PodAction::skip("mirror (static) pod, owned by the kubelet")
    } else if pod.is_unmanaged() && !pod.is_finished() && pod.annotation(ALLOW) != Some("true") {
        PodAction::block(format!(
            "pod {} has no controller: nothing would recreate it; move it by hand or annotate it {ALLOW}=true",
            pod.key()
        ))
    } else {
        PodAction::evict()
    }
}

impl Policy for NeverForce {
    fn plan_drain(_m: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        DrainPlan {
            decisions: pods.iter().map(|p| p.decide(action_for(p), 0)).collect(),
            attempt_timeout_ms: 30_000,
            max_concurrent_evictions: None,
        }
    }

    fn on_failure(m: Maintenance, failure: Failure) -> Verdict {
        match failure {
            Failure::NodeNotFound => Verdict::Fail(format!("nodes \"{}\" not found", m.node_name)),
            // Waiting for a human: look again every 30 s.
            Failure::DrainIncomplete(report) if !report.blocked.is_empty() => {
                Verdict::RetryAfterMs(30_000)
            }
            Failure::DrainIncomplete(_) => Verdict::RetryAfterMs(5_000),
            Failure::LeaseHeld(_) | Failure::LeaseError(_) if m.error_on_lease_count > 3 => {
                Verdict::Fail(format!(
                    "maintenance failed: lease could not be extended after {} attempts",
                    m.error_on_lease_count
                ))
            }
            _ => Verdict::RetryWithBackoff,
        }
    }
}

export_policy!(NeverForce);
