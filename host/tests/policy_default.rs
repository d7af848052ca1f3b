//! The embedded default policy, run in the sandbox, against every rule of
//! the Go operator it must reproduce.

use std::time::Duration;

use nmo::fixtures::{self, PodKind};
use nmo::policy::types::{DrainReport, Failure, Maintenance, PodRef};
use nmo::policy::{Action, EngineConfig, Plan, Policy, PolicyEngine, Verdict, native};
use proptest::prelude::*;

/// One engine and one compiled default policy for the whole file; every
/// call still gets a fresh store.
fn default_policy() -> Policy {
    static POLICY: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    POLICY
        .get_or_init(|| {
            PolicyEngine::new(EngineConfig::default())
                .expect("engine")
                .default_policy()
                .expect("the embedded default policy loads")
        })
        .clone()
}

fn maintenance(node: &str) -> Maintenance {
    let mut m = nmo::policy::selfcheck::sample_maintenance();
    m.name = format!("nm-{node}");
    m.node_name = node.into();
    m.reason = "kernel upgrade".into();
    m.elapsed_ms = 1_000;
    m
}

fn plan_for(policy: &Policy, pods: &[k8s_openapi::api::core::v1::Pod]) -> Plan {
    policy
        .plan_drain(&maintenance("worker-1"), &fixtures::node("worker-1"), pods)
        .expect("the default policy answers validly")
}

fn action_for(policy: &Policy, kind: PodKind) -> Action {
    let pod = fixtures::pod(kind, "shop", "web", 1, "worker-1");
    let plan = plan_for(policy, &[pod]);
    assert_eq!(plan.steps.len(), 1);
    plan.steps[0].action.clone()
}

const OWN_GRACE: Action = Action::Evict(nmo::policy::Removal {
    grace_period_seconds: None,
    rule: String::new(),
});

#[test]
fn managed_and_unmanaged_pods_are_evicted_with_their_own_grace_period() {
    let policy = default_policy();
    for kind in [
        PodKind::Deployment,
        PodKind::StatefulSet,
        PodKind::Job,
        PodKind::Bare,         // --force
        PodKind::EmptyDir,     // --delete-emptydir-data
        PodKind::CompletedJob, // kubectl drain removes finished pods too
        PodKind::Terminating,  // and waits for pods already going
    ] {
        assert_eq!(action_for(&policy, kind), OWN_GRACE, "{kind:?}");
    }
}

#[test]
fn daemonset_pods_are_skipped() {
    let action = action_for(&default_policy(), PodKind::DaemonSet);
    match action {
        Action::Skip { reason } => assert!(reason.contains("DaemonSet"), "{reason}"),
        other => panic!("DaemonSet pod got {other:?}"),
    }
}

#[test]
fn mirror_pods_are_skipped() {
    match action_for(&default_policy(), PodKind::Mirror) {
        Action::Skip { reason } => assert!(reason.contains("mirror"), "{reason}"),
        other => panic!("mirror pod got {other:?}"),
    }
}

#[test]
fn one_wave_thirty_seconds_no_concurrency_limit() {
    let policy = default_policy();
    let plan = plan_for(&policy, &fixtures::node_pods("worker-1", 110));
    assert_eq!(plan.attempt_timeout, Duration::from_secs(30));
    assert_eq!(plan.max_concurrent_evictions, None);
    assert!(plan.steps.iter().all(|s| s.order == 0));
    assert_eq!(plan.waves().count(), 1);
    // Order within the wave is the input order.
    let idx: Vec<usize> = plan.steps.iter().map(|s| s.pod).collect();
    assert_eq!(idx, (0..110).collect::<Vec<_>>());
}

#[test]
fn an_empty_node_gets_an_empty_plan() {
    let plan = plan_for(&default_policy(), &[]);
    assert!(plan.steps.is_empty());
}

fn verdict(policy: &Policy, m: &Maintenance, f: Failure) -> Verdict {
    policy.on_failure(m, &f).expect("valid verdict")
}

#[test]
fn a_missing_node_fails_with_the_api_message() {
    let policy = default_policy();
    let m = maintenance("node02");
    assert_eq!(
        verdict(&policy, &m, Failure::NodeNotFound),
        Verdict::Fail("nodes \"node02\" not found".into())
    );
}

#[test]
fn an_incomplete_drain_is_retried_after_five_seconds() {
    let policy = default_policy();
    let mut m = maintenance("worker-1");
    for attempt in [1, 2, 50] {
        m.attempt = attempt;
        m.drain_progress = 40;
        let report = DrainReport {
            pending: vec![PodRef {
                namespace: "shop".into(),
                name: "db-0".into(),
            }],
            pdb_blocked: Vec::new(),
            blocked: Vec::new(),
            waited: Vec::new(),
            timed_out: true,
            message: "global timeout reached: 30s".into(),
        };
        assert_eq!(
            verdict(&policy, &m, Failure::DrainIncomplete(report)),
            Verdict::RetryAfter(Duration::from_secs(5))
        );
    }
}

#[test]
fn lease_held_before_the_drain_is_retried_without_giving_up() {
    let policy = default_policy();
    let mut m = maintenance("worker-1");
    m.drain_progress = 0;
    m.attempt = 1_000;
    assert_eq!(
        verdict(&policy, &m, Failure::LeaseHeld("node-healthcheck".into())),
        Verdict::RetryWithBackoff
    );
}

#[test]
fn lease_errors_fail_the_maintenance_once_over_three() {
    let policy = default_policy();
    let mut m = maintenance("worker-1");
    m.drain_progress = 60;
    for count in 1..=3 {
        m.error_on_lease_count = count;
        assert_eq!(
            verdict(&policy, &m, Failure::LeaseError("conflict".into())),
            Verdict::RetryWithBackoff,
            "count {count}"
        );
        assert_eq!(
            verdict(&policy, &m, Failure::LeaseHeld("other".into())),
            Verdict::RetryWithBackoff,
            "count {count}"
        );
    }
    m.error_on_lease_count = 4;
    assert_eq!(
        verdict(&policy, &m, Failure::LeaseHeld("other".into())),
        Verdict::Fail("maintenance failed: lease could not be extended after 4 attempts".into())
    );
}

#[test]
fn other_api_errors_back_off() {
    let policy = default_policy();
    assert_eq!(
        verdict(
            &policy,
            &maintenance("worker-1"),
            Failure::ApiError("etcdserver: request timed out".into())
        ),
        Verdict::RetryWithBackoff
    );
}

#[test]
fn the_sandboxed_default_policy_agrees_with_the_native_rules_on_a_busy_node() {
    let policy = default_policy();
    let pods = fixtures::node_pods("worker-1", 1_000);
    let native = native::default_plan(&pods);
    assert_eq!(plan_for(&policy, &pods), native);
    // Handed over instead of copied: the same plan.
    let direct = policy
        .plan_drain_shared(
            &maintenance("worker-1"),
            fixtures::node("worker-1"),
            pods.into(),
            nmo::policy::History::default(),
            nmo::policy::Workloads::default(),
        )
        .expect("plan");
    assert_eq!(direct, native);
}

fn any_pod() -> impl Strategy<Value = k8s_openapi::api::core::v1::Pod> {
    (
        proptest::sample::select(PodKind::ALL.to_vec()),
        "[a-z]{1,8}",
        0usize..10_000,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(kind, app, i, extra_owner, uncontrolled)| {
            let mut p = fixtures::pod(kind, "ns", &app, i, "worker-1");
            let owners = p.metadata.owner_references.get_or_insert_with(Vec::new);
            if uncontrolled {
                // An owner that is not the controller does not manage the pod.
                for o in owners.iter_mut() {
                    o.controller = Some(false);
                }
            }
            if extra_owner {
                owners.push(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                        api_version: "apps/v1".into(),
                        kind: "DaemonSet".into(),
                        name: "not-the-controller".into(),
                        uid: "u".into(),
                        controller: None,
                        block_owner_deletion: None,
                    },
                );
            }
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// On any mix of pods (unique names), the policy and the native rules
    /// give the same plan.
    #[test]
    fn the_default_policy_matches_the_native_rules(pods in proptest::collection::vec(any_pod(), 0..40)) {
        let mut seen = std::collections::HashSet::new();
        let pods: Vec<_> = pods
            .into_iter()
            .filter(|p| seen.insert(p.metadata.name.clone()))
            .collect();
        let policy = default_policy();
        prop_assert_eq!(plan_for(&policy, &pods), native::default_plan(&pods));
    }
}
