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
//!   pod completes or someone removes it, for `max-wait` at most (2h by
//!   default): past it the pod is drained as the default policy drains
//!   it. For a job that must finish. A tenant's annotation never holds a
//!   node's maintenance for longer than the cluster operator allowed.
//! - A NodeMaintenance annotated `nmo.medik8s.io/ignore-opt-outs: "true"`
//!   drains everything the default policy would (an emergency: the node is
//!   going away).
//!
//! Settings (`policies.yaml`): `annotation`, the pod annotation to read
//! instead of `nmo.medik8s.io/drain` (a team that already marks its pods
//! another way); `max-wait`, how long a `wait` is honoured (`90m`, `6h`;
//! 1s to 7 days).

use nmo_policy_sdk::*;

/// The pod annotation that opts out, unless the `annotation` setting
/// names another.
pub const POD_ANNOTATION: &str = "nmo.medik8s.io/drain";
/// The setting that renames the pod annotation.
pub const SETTING: &str = "annotation";
/// The maintenance annotation that overrides every opt-out.
pub const OVERRIDE: &str = "nmo.medik8s.io/ignore-opt-outs";
/// The setting that bounds a `wait`.
pub const MAX_WAIT: &str = "max-wait";
/// How long a `wait` is honoured unless `max-wait` says otherwise.
pub const DEFAULT_MAX_WAIT_MS: u64 = 2 * 60 * 60 * 1000;
/// The longest `max-wait` allowed.
pub const MAX_WAIT_LIMIT_MS: u64 = 7 * 24 * 60 * 60 * 1000;

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

fn action_for(pod: &Pod, key: &str, max_wait_ms: u64) -> PodAction {
    let default = defaults::pod_action(pod);
    if !matches!(default, PodAction::Evict(_) | PodAction::Delete(_)) || pod.is_finished() {
        return default;
    }
    match pod.annotation(key).as_deref() {
        Some("skip") => PodAction::skip(format!("opted out ({key}: skip)")),
        Some("wait") if pod.history().pending_ms >= max_wait_ms => {
            log(
                Level::Warn,
                &format!(
                    "pod {} asked the drain to wait ({key}: wait); drained after {} (max-wait)",
                    pod.key(),
                    show_ms(max_wait_ms)
                ),
            );
            default
        }
        Some("wait") => PodAction::block(format!(
            "pod {} asked the drain to wait for it ({key}: wait), for {} at most",
            pod.key(),
            show_ms(max_wait_ms)
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
        let max_wait_ms = settings
            .duration_ms(MAX_WAIT)
            .ok()
            .flatten()
            .unwrap_or(DEFAULT_MAX_WAIT_MS);
        defaults::plan(&pods, |p| action_for(p, key, max_wait_ms))
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&[SETTING, MAX_WAIT])?;
        if let Some(key) = settings.get(SETTING).filter(|k| !valid_key(k)) {
            return Err(format!(
                "setting {SETTING}: {key:?} is not an annotation key (prefix/name, e.g. example.com/drain)"
            ));
        }
        match settings.duration_ms(MAX_WAIT)? {
            Some(ms) if !(1_000..=MAX_WAIT_LIMIT_MS).contains(&ms) => Err(format!(
                "setting {MAX_WAIT}: {} is outside 1s to 7 days",
                show_ms(ms)
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
