//! no-downtime: drains without taking an application down.
//!
//! - **Make-before-break** for the Deployments it is told about: a pod a
//!   ReplicaSet controls, in one of the `namespaces` (all when unset) and
//!   carrying the `selector` label (`key=value`, or just `key`; every such
//!   pod when unset), is surged: its owner brings up a Ready replacement
//!   on another node before the pod goes. A `replicas: 1` Deployment
//!   behind a `minAvailable: 1` budget drains with no moment without a
//!   Ready replica, where an eviction would wait forever. With
//!   `maxReplicas` (e.g. `1`), only workloads of at most that many
//!   replicas (as their owner set them; contract 0.4's `workload`) are
//!   surged: the single-replica ones, for which an eviction is downtime;
//!   larger ones are evicted under their budgets as the default does.
//! - **A handshake** for applications that ask for one: a pod annotated
//!   `nmo.medik8s.io/handshake: <duration>` (e.g. `5m`) is told first
//!   (`notify`), may answer ready, extend its deadline by heartbeats
//!   (every `heartbeat`, default 30s) or leave by itself; then it is
//!   evicted. The pod's annotation is the workload's word, not the
//!   cluster operator's: its duration is capped at `maxHandshake`
//!   (default 30m, at most 24h), so no tenant can hold a node for longer
//!   by writing a larger one.
//! - **Jobs finish**: a pod a Job controls is waited for, up to
//!   `jobTimeout` (default 1h); past it the next plan evicts it.
//!
//! Everything else is the default policy's (the Go operator's).

use nmo_policy_sdk::*;

/// The pod annotation that asks for a handshake, and how long it may take.
pub const HANDSHAKE: &str = "nmo.medik8s.io/handshake";
/// Settings.
pub const NAMESPACES: &str = "namespaces";
pub const SELECTOR: &str = "selector";
pub const HEARTBEAT: &str = "heartbeat";
pub const JOB_TIMEOUT: &str = "jobTimeout";
pub const MAX_HANDSHAKE: &str = "maxHandshake";
pub const MAX_REPLICAS: &str = "maxReplicas";
/// Defaults.
pub const DEFAULT_MAX_HANDSHAKE_MS: u64 = 30 * 60 * 1000;
/// The host's bound on a handshake's timeout.
pub const HANDSHAKE_LIMIT_MS: u64 = 24 * 60 * 60 * 1000;
pub const DEFAULT_HEARTBEAT_MS: u64 = 30_000;
pub const DEFAULT_JOB_TIMEOUT_MS: u64 = 60 * 60 * 1000;

struct NoDowntime;

/// Whether the pod's workload is one the settings surge.
fn surges(pod: &Pod, settings: &Settings) -> bool {
    if pod.controller_kind() != Some("ReplicaSet") {
        return false;
    }
    settings
        .get(NAMESPACES)
        .is_none_or(|list| pod.in_namespaces(list))
        && settings.get(SELECTOR).is_none_or(|sel| pod.has_label(sel))
        && max_replicas(settings).is_none_or(|most| {
            // A workload whose replicas the host could not read is not
            // known to be small: evicted, as the default does.
            pod.workload()
                .and_then(|w| w.replicas)
                .is_some_and(|r| r <= most)
        })
}

/// The `maxReplicas` setting, when given and readable.
fn max_replicas(settings: &Settings) -> Option<u32> {
    settings
        .get(MAX_REPLICAS)
        .and_then(|v| v.trim().parse().ok())
}

fn action(pod: &Pod, settings: &Settings) -> PodAction {
    let default = defaults::pod_action(pod);
    if !matches!(default, PodAction::Evict(_)) || pod.is_finished() || pod.is_terminating() {
        return default;
    }
    if let Some(ms) = pod.annotation(HANDSHAKE).and_then(|v| duration_ms(&v)) {
        let heartbeat = settings
            .duration_ms(HEARTBEAT)
            .ok()
            .flatten()
            .unwrap_or(DEFAULT_HEARTBEAT_MS);
        let cap = settings
            .duration_ms(MAX_HANDSHAKE)
            .ok()
            .flatten()
            .unwrap_or(DEFAULT_MAX_HANDSHAKE_MS)
            .min(HANDSHAKE_LIMIT_MS);
        return PodAction::notify(ms.clamp(1, cap), Some(heartbeat));
    }
    if pod.controller_kind() == Some("Job") {
        let limit = settings
            .duration_ms(JOB_TIMEOUT)
            .ok()
            .flatten()
            .unwrap_or(DEFAULT_JOB_TIMEOUT_MS);
        // Past its wait (counted from the first plan that wanted it gone),
        // the Job's pod is evicted as the default policy would.
        if pod.history().pending_ms < limit {
            return PodAction::wait(
                limit - pod.history().pending_ms,
                "a Job's pod finishes before the node goes down",
            );
        }
        return default;
    }
    if surges(pod, settings) {
        return PodAction::surge();
    }
    default
}

impl Policy for NoDowntime {
    fn plan_drain(_m: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        let settings = Settings::current();
        let mut plan = defaults::plan(&pods, |p| action(p, &settings));
        // A surge waits for the replacement to be scheduled and Ready:
        // more than the Go operator's 30 s per attempt.
        plan.attempt_timeout_ms = 5 * 60 * 1000;
        plan
    }

    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&[
            NAMESPACES,
            SELECTOR,
            HEARTBEAT,
            JOB_TIMEOUT,
            MAX_HANDSHAKE,
            MAX_REPLICAS,
        ])?;
        if let Some(v) = settings.get(MAX_REPLICAS)
            && v.trim().parse::<u32>().map_or(true, |n| n == 0)
        {
            return Err(format!(
                "setting {MAX_REPLICAS}: {v:?} is not a number of replicas (1 or more)"
            ));
        }
        settings.duration_ms(HEARTBEAT)?;
        settings.duration_ms(JOB_TIMEOUT)?;
        if settings
            .duration_ms(MAX_HANDSHAKE)?
            .is_some_and(|ms| ms > HANDSHAKE_LIMIT_MS)
        {
            return Err(format!("setting {MAX_HANDSHAKE}: at most 24h"));
        }
        Ok(())
    }
}

export_policy!(NoDowntime);

#[cfg(test)]
mod tests {
    use super::*;
    use nmo_policy_sdk::testing::{pod, positions, set_settings};

    #[test]
    fn only_the_chosen_workloads_surge() {
        set_settings(&[("namespaces", "shop"), ("selector", "tier=web")]);
        let s = Settings::current();
        let pods = positions(vec![
            pod("shop", "web-1")
                .owned_by("ReplicaSet", "web-5d4f")
                .with_label("tier", "web"),
            pod("shop", "db-0")
                .owned_by("StatefulSet", "db")
                .with_label("tier", "web"),
            pod("other", "web-2")
                .owned_by("ReplicaSet", "web-77")
                .with_label("tier", "web"),
        ]);
        assert!(matches!(action(&pods[0], &s), PodAction::Surge(_)));
        assert!(matches!(action(&pods[1], &s), PodAction::Evict(_)));
        assert!(matches!(action(&pods[2], &s), PodAction::Evict(_)));
    }

    /// With `maxReplicas: 1`, only single-replica workloads surge; a pod
    /// whose workload's replicas are unknown is evicted.
    #[test]
    fn max_replicas_surges_only_the_small_workloads() {
        set_settings(&[("maxReplicas", "1")]);
        let s = Settings::current();
        let single = pod("shop", "cart-1").in_deployment("cart", 1);
        let wide = pod("shop", "web-1").in_deployment("web", 4);
        let unknown = pod("shop", "api-1").owned_by("ReplicaSet", "api-1");
        assert!(matches!(action(&single, &s), PodAction::Surge(_)));
        assert!(matches!(action(&wide, &s), PodAction::Evict(_)));
        assert!(matches!(action(&unknown, &s), PodAction::Evict(_)));
        assert!(NoDowntime::validate_settings(Settings::current()).is_ok());
        set_settings(&[("maxReplicas", "0")]);
        assert!(NoDowntime::validate_settings(Settings::current()).is_err());
    }

    /// A pod's annotation asking for a 25 h handshake (past the host's
    /// bound, which would make the whole plan invalid) gets the cap.
    #[test]
    fn a_handshake_a_pod_asks_for_is_capped() {
        set_settings(&[]);
        let s = Settings::current();
        let greedy = pod("shop", "web-1").with_annotation(HANDSHAKE, "25h");
        match action(&greedy, &s) {
            PodAction::Notify(n) => assert_eq!(n.timeout_ms, DEFAULT_MAX_HANDSHAKE_MS),
            other => panic!("{other:?}"),
        }
        set_settings(&[("maxHandshake", "2h")]);
        let s = Settings::current();
        match action(&greedy, &s) {
            PodAction::Notify(n) => assert_eq!(n.timeout_ms, 2 * 3_600_000),
            other => panic!("{other:?}"),
        }
        let modest = pod("shop", "web-2").with_annotation(HANDSHAKE, "5m");
        match action(&modest, &s) {
            PodAction::Notify(n) => assert_eq!(n.timeout_ms, 300_000),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_job_is_waited_for_then_evicted() {
        set_settings(&[("jobTimeout", "10m")]);
        let s = Settings::current();
        let job = pod("batch", "report-x").owned_by("Job", "report");
        match action(&job, &s) {
            PodAction::Wait(c) => assert_eq!(c.timeout_ms, 600_000),
            other => panic!("{other:?}"),
        }
        let late = pod("batch", "report-x")
            .owned_by("Job", "report")
            .pending_for(600_000, 0);
        assert!(matches!(action(&late, &s), PodAction::Evict(_)));
    }
}
