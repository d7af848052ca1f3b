//! escalate: evict first, and climb a ladder only where the owner allowed
//! it.
//!
//! For pods in one of the `namespaces` or carrying the `label` (`key=value`
//! or `key`) — and only those:
//! 1. evict (PodDisruptionBudgets respected), as the Go operator does;
//! 2. once the pod has been pending for `deadline` (default 10m) with at
//!    least one eviction refused, **delete** it (the budget is bypassed);
//! 3. a pod still terminating a minute past its grace period is deleted
//!    with grace period **0**.
//!
//! Every forced removal is an event on the NodeMaintenance naming the pod
//! and the rule. Pods the settings do not select are only ever evicted.
//!
//! A drain that is still incomplete after `parkAfter` (default 1h) is
//! **parked**: the node stays cordoned, retries slow to every 30 minutes,
//! and a fleet policy can move on to other nodes.

use nmo_policy_sdk::*;

pub const NAMESPACES: &str = "namespaces";
pub const LABEL: &str = "label";
pub const DEADLINE: &str = "deadline";
pub const PARK_AFTER: &str = "parkAfter";
pub const DEFAULT_DEADLINE_MS: u64 = 10 * 60 * 1000;
pub const DEFAULT_PARK_AFTER_MS: u64 = 60 * 60 * 1000;
/// How long past its grace period a terminating pod is "stuck".
pub const STUCK_SLACK_MS: u64 = 60 * 1000;
/// How often a parked maintenance is looked at again.
pub const PARKED_RECHECK_MS: u64 = 30 * 60 * 1000;

struct Escalate;

fn selected(pod: &Pod, settings: &Settings) -> bool {
    settings
        .get(NAMESPACES)
        .is_some_and(|list| pod.in_namespaces(list))
        || settings.get(LABEL).is_some_and(|sel| pod.has_label(sel))
}

fn setting_ms(settings: &Settings, key: &str, default: u64) -> u64 {
    settings.duration_ms(key).ok().flatten().unwrap_or(default)
}

fn action(pod: &Pod, now_ms: u64, settings: &Settings) -> PodAction {
    let default = defaults::pod_action(pod);
    if !matches!(default, PodAction::Evict(_)) || !selected(pod, settings) {
        return default;
    }
    if pod.is_stuck_terminating(now_ms, STUCK_SLACK_MS) {
        return PodAction::delete_by(
            Removal::by_rule("escalate: terminating a minute past its grace period").grace(0),
        );
    }
    let deadline = setting_ms(settings, DEADLINE, DEFAULT_DEADLINE_MS);
    let h = pod.history();
    if h.pending_ms >= deadline && h.refused_evictions > 0 {
        return PodAction::delete_by(Removal::by_rule(format!(
            "escalate: pending {} with {} eviction(s) refused",
            show_ms(h.pending_ms),
            h.refused_evictions
        )));
    }
    default
}

impl Policy for Escalate {
    fn plan_drain(m: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        let settings = Settings::current();
        let mut plan = defaults::plan(&pods, |p| action(p, m.now_ms, &settings));
        // An attempt no longer than the deadline: the next plan climbs the
        // ladder in time.
        plan.attempt_timeout_ms = plan
            .attempt_timeout_ms
            .min(setting_ms(&settings, DEADLINE, DEFAULT_DEADLINE_MS))
            .max(1);
        plan
    }

    fn on_failure(m: Maintenance, failure: Failure) -> Verdict {
        let park_after = setting_ms(&Settings::current(), PARK_AFTER, DEFAULT_PARK_AFTER_MS);
        match &failure {
            Failure::DrainIncomplete(report) if m.elapsed_ms >= park_after => {
                Verdict::Park(Parking {
                    reason: format!(
                        "not drained after {}: {} pod(s) left ({})",
                        show_ms(park_after),
                        report.pending.len() + report.blocked.len() + report.waited.len(),
                        report.message
                    ),
                    recheck_after_ms: Some(PARKED_RECHECK_MS),
                })
            }
            _ => defaults::on_failure(&m, &failure),
        }
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&[NAMESPACES, LABEL, DEADLINE, PARK_AFTER])?;
        settings.duration_ms(DEADLINE)?;
        settings.duration_ms(PARK_AFTER)?;
        Ok(())
    }
}

export_policy!(Escalate);

#[cfg(test)]
mod tests {
    use super::*;
    use nmo_policy_sdk::testing::{pod, set_settings};

    #[test]
    fn the_ladder_climbs_only_for_selected_pods() {
        set_settings(&[("namespaces", "batch"), ("deadline", "5m")]);
        let s = Settings::current();
        let now = 1_767_607_200_000;
        let stuck = pod("batch", "a").pending_for(6 * 60_000, 3);
        assert!(matches!(action(&stuck, now, &s), PodAction::Delete(_)));
        let early = pod("batch", "b").pending_for(60_000, 3);
        assert!(matches!(action(&early, now, &s), PodAction::Evict(_)));
        let other = pod("shop", "c").pending_for(60 * 60_000, 30);
        assert!(matches!(action(&other, now, &s), PodAction::Evict(_)));
        let term = pod("batch", "d").terminating_until(now - 120_000);
        match action(&term, now, &s) {
            PodAction::Delete(r) => assert_eq!(r.grace_period_seconds, Some(0)),
            other => panic!("{other:?}"),
        }
    }
}
