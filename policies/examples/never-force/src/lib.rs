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
    if pod.is_unmanaged()
        && !pod.is_daemonset_managed()
        && !pod.is_mirror()
        && !pod.is_finished()
        && pod.annotation(ALLOW).as_deref() != Some("true")
    {
        PodAction::block(format!(
            "pod {} has no controller: nothing would recreate it; move it by hand or annotate it {ALLOW}=true",
            pod.key()
        ))
    } else {
        defaults::pod_action(pod)
    }
}

impl Policy for NeverForce {
    fn plan_drain(_m: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        defaults::plan(&pods, action_for)
    }

    fn on_failure(m: Maintenance, failure: Failure) -> Verdict {
        // Waiting for a human: look again every 30 s.
        defaults::on_failure_waiting(&m, &failure, 30_000)
    }
}

export_policy!(NeverForce);
