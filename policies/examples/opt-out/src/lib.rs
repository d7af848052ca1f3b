//! opt-out: the default policy's rules, except that workloads can opt out
//! of being drained.
//!
//! - A pod annotated `nmo.medik8s.io/drain: skip` stays where it is (on a
//!   cordoned node, so nothing new lands beside it); the drain finishes
//!   without it. For pods that must ride a maintenance out in place: a
//!   node-local cache, a hardware agent, a long batch job that would lose
//!   its work.
//! - A pod annotated `nmo.medik8s.io/drain: wait` keeps the drain from
//!   finishing while it runs (it blocks): the maintenance waits until the
//!   pod completes or someone removes it. For a job that must finish.
//! - A NodeMaintenance annotated `nmo.medik8s.io/ignore-opt-outs: "true"`
//!   drains everything the default policy would (an emergency: the node is
//!   going away).

use nmo_policy_sdk::*;

/// The pod annotation that opts out.
pub const POD_ANNOTATION: &str = "nmo.medik8s.io/drain";
/// The maintenance annotation that overrides every opt-out.
pub const OVERRIDE: &str = "nmo.medik8s.io/ignore-opt-outs";

struct OptOut;

fn action_for(pod: &Pod) -> PodAction {
    let default = defaults::pod_action(pod);
    if !matches!(default, PodAction::Evict(_) | PodAction::Delete(_)) || pod.is_finished() {
        return default;
    }
    match pod.annotation(POD_ANNOTATION) {
        Some("skip") => PodAction::skip(format!("opted out ({POD_ANNOTATION}: skip)")),
        Some("wait") => PodAction::block(format!(
            "pod {} asked the drain to wait for it ({POD_ANNOTATION}: wait)",
            pod.key()
        )),
        _ => default,
    }
}

impl Policy for OptOut {
    fn plan_drain(m: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        if m.annotation(OVERRIDE) == Some("true") {
            log(
                Level::Info,
                "opt-outs ignored: the maintenance overrides them",
            );
            return defaults::plan(&pods, defaults::pod_action);
        }
        defaults::plan(&pods, action_for)
    }

    fn on_failure(m: Maintenance, failure: Failure) -> Verdict {
        // Waiting for a pod to finish: look again every 30 s.
        defaults::on_failure_waiting(&m, &failure, 30_000)
    }
}

export_policy!(OptOut);
