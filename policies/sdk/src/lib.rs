//! Write nmo drain policies in Rust.
//!
//! A policy is a `cdylib` crate built for `wasm32-wasip2` that implements
//! [`Policy`] and exports it with [`export_policy!`]:
//!
//! ```ignore
//! use nmo_policy_sdk::*;
//!
//! struct MyPolicy;
//!
//! impl Policy for MyPolicy {
//!     fn plan_drain(m: Maintenance, node: Node, pods: Vec<Pod>) -> DrainPlan {
//!         let decisions = pods.iter().map(|p| p.decide(PodAction::evict(), 0)).collect();
//!         DrainPlan { decisions, attempt_timeout_ms: 30_000, max_concurrent_evictions: None }
//!     }
//!     fn on_failure(m: Maintenance, f: Failure) -> Verdict {
//!         Verdict::RetryWithBackoff
//!     }
//! }
//!
//! export_policy!(MyPolicy);
//! ```
//!
//! The types are generated from `wit/node-maintenance.wit`, where every field
//! is documented; this crate adds the helpers a policy keeps needing.

#[cfg(all(target_family = "wasm", feature = "bump-allocator"))]
pub mod alloc;

#[cfg(all(target_family = "wasm", feature = "bump-allocator"))]
#[global_allocator]
static ALLOCATOR: alloc::BumpAllocator = alloc::BumpAllocator::new();

#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "drain-policy",
        default_bindings_module: "nmo_policy_sdk::bindings",
        pub_export_macro: true,
        export_macro_name: "export_policy",
    });
}

pub use bindings::Guest as Policy;
pub use bindings::export_policy;
pub use bindings::medik8s::node_maintenance::types::{
    DrainPlan, DrainReport, Failure, KeyValue, Level, Maintenance, MaintenancePhase, Node, Owner,
    Pod, PodAction, PodDecision, PodPhase, PodRef, Removal, Taint, TaintEffect, Verdict,
};

/// The annotation the kubelet puts on mirror (static) pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Writes a line to the operator's log, tagged with the policy's name.
///
/// Outside WebAssembly (a policy's own native unit tests) the line goes to
/// standard error instead.
pub fn log(level: Level, message: &str) {
    #[cfg(target_family = "wasm")]
    bindings::log(level, message);
    #[cfg(not(target_family = "wasm"))]
    eprintln!("[{level:?}] {message}");
}

/// Looks a key up in a label or annotation list.
pub fn lookup<'a>(pairs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| kv.value.as_str())
}

impl Pod {
    /// The owner that controls this pod (`controller: true`), if any.
    pub fn controller(&self) -> Option<&Owner> {
        self.owners.iter().find(|o| o.controller)
    }

    /// The kind of the controlling owner (`ReplicaSet`, `StatefulSet`,
    /// `DaemonSet`, `Job`...), if any.
    pub fn controller_kind(&self) -> Option<&str> {
        self.controller().map(|o| o.kind.as_str())
    }

    /// Managed by a DaemonSet: its controller is a DaemonSet.
    pub fn is_daemonset_managed(&self) -> bool {
        self.controller_kind() == Some("DaemonSet")
    }

    /// A static pod's mirror (see [`MIRROR_ANNOTATION`]).
    pub fn is_mirror(&self) -> bool {
        self.mirror
    }

    /// No controller: nothing recreates this pod once it is removed.
    pub fn is_unmanaged(&self) -> bool {
        self.controller().is_none()
    }

    /// Uses an `emptyDir` volume, whose data is lost when the pod goes.
    pub fn has_local_storage(&self) -> bool {
        self.local_storage
    }

    /// Finished: phase `Succeeded` or `Failed`.
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
    }

    /// Already being deleted (`deletionTimestamp` set).
    pub fn is_terminating(&self) -> bool {
        self.terminating
    }

    /// The value of a label.
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }

    /// The value of an annotation.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }

    /// `namespace/name`, for messages.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// This pod as a [`PodRef`].
    pub fn pod_ref(&self) -> PodRef {
        PodRef {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// A decision about this pod, in wave `order`.
    pub fn decide(&self, action: PodAction, order: u32) -> PodDecision {
        PodDecision {
            pod: self.pod_ref(),
            action,
            order,
        }
    }
}

impl PodAction {
    /// Evict with the pod's own grace period (kubectl drain's default).
    pub fn evict() -> Self {
        PodAction::Evict(Removal {
            grace_period_seconds: None,
        })
    }

    /// Delete directly (no PodDisruptionBudget check), with the pod's own
    /// grace period.
    pub fn delete() -> Self {
        PodAction::Delete(Removal {
            grace_period_seconds: None,
        })
    }

    /// Leave the pod; the drain can finish without it.
    pub fn skip(reason: impl Into<String>) -> Self {
        PodAction::Skip(reason.into())
    }

    /// Leave the pod and keep the drain from finishing while it is there.
    pub fn block(reason: impl Into<String>) -> Self {
        PodAction::Block(reason.into())
    }
}

impl Node {
    /// The value of a label.
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }

    /// The value of an annotation.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }

    /// Carries a taint with this key (any value, any effect).
    pub fn has_taint(&self, key: &str) -> bool {
        self.taints.iter().any(|t| t.key == key)
    }
}

impl Maintenance {
    /// The value of an annotation on the NodeMaintenance.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }

    /// The value of a label on the NodeMaintenance.
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }

    /// The drain has begun removing pods (`drainProgress` above 0).
    pub fn drain_started(&self) -> bool {
        self.drain_progress > 0
    }
}

/// The Go operator's rules, as the default policy applies them, for
/// policies that change one thing and keep the rest.
pub mod defaults {
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
}

/// Builders for the records a policy gets, for a policy's own native unit
/// tests (`cargo test`, no WebAssembly, no operator):
///
/// ```
/// use nmo_policy_sdk::testing::{maintenance, node, pod};
/// use nmo_policy_sdk::*;
///
/// let web = pod("default", "web-1").owned_by("ReplicaSet", "web-5d4f");
/// let agent = pod("kube-system", "agent-x").owned_by("DaemonSet", "agent");
/// assert!(matches!(defaults::pod_action(&web), PodAction::Evict(_)));
/// assert!(matches!(defaults::pod_action(&agent), PodAction::Skip(_)));
/// let m = maintenance("node-1").attempt(3);
/// assert_eq!(m.attempt, 3);
/// assert_eq!(node("node-1").label("missing"), None);
/// ```
///
/// Native builds only: a policy built for WebAssembly does not carry it.
#[cfg(not(target_family = "wasm"))]
pub mod testing {
    use super::*;

    /// A running, ready pod with no owner, labels or annotations.
    pub fn pod(namespace: &str, name: &str) -> Pod {
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("uid-{namespace}-{name}"),
            labels: Vec::new(),
            annotations: Vec::new(),
            owners: Vec::new(),
            phase: PodPhase::Running,
            ready: true,
            mirror: false,
            local_storage: false,
            terminating: false,
            grace_period_seconds: None,
            priority: None,
            priority_class_name: String::new(),
        }
    }

    /// A cordoned node with no labels, annotations or taints.
    pub fn node(name: &str) -> Node {
        Node {
            name: name.into(),
            labels: Vec::new(),
            annotations: Vec::new(),
            taints: Vec::new(),
            unschedulable: true,
        }
    }

    /// A NodeMaintenance of `node_name` on its first attempt, just
    /// created.
    pub fn maintenance(node_name: &str) -> Maintenance {
        Maintenance {
            name: format!("nm-{node_name}"),
            node_name: node_name.into(),
            reason: String::new(),
            labels: Vec::new(),
            annotations: Vec::new(),
            phase: Some(MaintenancePhase::Running),
            drain_progress: 0,
            error_on_lease_count: 0,
            attempt: 1,
            elapsed_ms: 0,
        }
    }

    fn pair(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.into(),
        }
    }

    impl Pod {
        /// Controlled by an owner of `kind` (`ReplicaSet`, `StatefulSet`,
        /// `DaemonSet`, `Job`...).
        pub fn owned_by(mut self, kind: &str, name: &str) -> Self {
            let api_version = match kind {
                "Job" | "CronJob" => "batch/v1",
                "Node" => "v1",
                _ => "apps/v1",
            };
            self.owners.push(Owner {
                api_version: api_version.into(),
                kind: kind.into(),
                name: name.into(),
                uid: format!("uid-{name}"),
                controller: true,
            });
            self
        }

        /// With a label.
        pub fn with_label(mut self, key: &str, value: &str) -> Self {
            self.labels.push(pair(key, value));
            self
        }

        /// With an annotation.
        pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
            self.annotations.push(pair(key, value));
            self
        }

        /// A static pod's mirror.
        pub fn as_mirror(mut self) -> Self {
            self.mirror = true;
            self.annotations.push(pair(MIRROR_ANNOTATION, "hash"));
            self
        }

        /// With an emptyDir volume.
        pub fn with_local_storage(mut self) -> Self {
            self.local_storage = true;
            self
        }

        /// In this phase.
        pub fn in_phase(mut self, phase: PodPhase) -> Self {
            self.phase = phase;
            self
        }

        /// Already being deleted.
        pub fn as_terminating(mut self) -> Self {
            self.terminating = true;
            self
        }

        /// With `terminationGracePeriodSeconds`.
        pub fn with_grace_period(mut self, seconds: i64) -> Self {
            self.grace_period_seconds = Some(seconds);
            self
        }

        /// With a priority and its class.
        pub fn with_priority(mut self, class: &str, priority: i32) -> Self {
            self.priority_class_name = class.into();
            self.priority = Some(priority);
            self
        }
    }

    impl Node {
        /// With a label.
        pub fn with_label(mut self, key: &str, value: &str) -> Self {
            self.labels.push(pair(key, value));
            self
        }

        /// With an annotation.
        pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
            self.annotations.push(pair(key, value));
            self
        }

        /// With a taint of this key and effect, no value.
        pub fn with_taint(mut self, key: &str, effect: TaintEffect) -> Self {
            self.taints.push(Taint {
                key: key.into(),
                value: String::new(),
                effect,
            });
            self
        }
    }

    impl Maintenance {
        /// On this attempt (1: the first).
        pub fn attempt(mut self, attempt: u32) -> Self {
            self.attempt = attempt;
            self
        }

        /// Created this long ago.
        pub fn elapsed(mut self, elapsed: std::time::Duration) -> Self {
            self.elapsed_ms = elapsed.as_millis() as u64;
            self
        }

        /// With a reason (`spec.reason`).
        pub fn with_reason(mut self, reason: &str) -> Self {
            self.reason = reason.into();
            self
        }

        /// With an annotation.
        pub fn with_annotation(mut self, key: &str, value: &str) -> Self {
            self.annotations.push(pair(key, value));
            self
        }

        /// With lease errors counted.
        pub fn with_lease_errors(mut self, count: u32) -> Self {
            self.error_on_lease_count = count;
            self
        }

        /// With drain progress (0 to 100).
        pub fn with_progress(mut self, percent: u32) -> Self {
            self.drain_progress = percent;
            self
        }
    }
}
