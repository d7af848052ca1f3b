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
//!
//! Settings (`policies.yaml`): `annotation`, the pod annotation to read
//! instead of `nmo.medik8s.io/drain` (a team that already marks its pods
//! another way).

use nmo_policy_sdk::*;

/// The pod annotation that opts out, unless the `annotation` setting
/// names another.
pub const POD_ANNOTATION: &str = "nmo.medik8s.io/drain";
/// The setting that renames the pod annotation.
pub const SETTING: &str = "annotation";
/// The maintenance annotation that overrides every opt-out.
pub const OVERRIDE: &str = "nmo.medik8s.io/ignore-opt-outs";

struct OptOut;

/// An annotation key as Kubernetes accepts one: an optional DNS prefix
/// and `/`, then a name of letters, digits, `-`, `_`, `.` (at most 63).
fn valid_key(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(prefix, name)| {
        if prefix.is_empty() || prefix.len() > 253 {
            ""
        } else {
            name
        }
    });
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn action_for(pod: &Pod, key: &str) -> PodAction {
    let default = defaults::pod_action(pod);
    if !matches!(default, PodAction::Evict(_) | PodAction::Delete(_)) || pod.is_finished() {
        return default;
    }
    match pod.annotation(key).as_deref() {
        Some("skip") => PodAction::skip(format!("opted out ({key}: skip)")),
        Some("wait") => PodAction::block(format!(
            "pod {} asked the drain to wait for it ({key}: wait)",
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
        let settings = Settings::current();
        let key = settings.get(SETTING).unwrap_or(POD_ANNOTATION);
        defaults::plan(&pods, |p| action_for(p, key))
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&[SETTING])?;
        match settings.get(SETTING) {
            Some(key) if !valid_key(key) => Err(format!(
                "setting {SETTING}: {key:?} is not an annotation key (prefix/name, e.g. example.com/drain)"
            )),
            _ => Ok(()),
        }
    }

    fn on_failure(m: Maintenance, failure: Failure) -> Verdict {
        // Waiting for a pod to finish: look again every 30 s.
        defaults::on_failure_waiting(&m, &failure, 30_000)
    }
}

export_policy!(OptOut);
