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
//!     // `admit` (may the maintenance start?) and `validate_settings` have
//!     // defaults: the Go operator's admission rule, and no settings; so
//!     // have `plan_drain` and `on_failure` (the Go operator's rules).
//! }
//!
//! export_policy!(MyPolicy);
//! ```
//!
//! The contract is `wit/node-maintenance.wit` (version 0.4.0), where every
//! field is documented. Pods and nodes come as handles: each accessor
//! ([`Pod::label`], [`Pod::controller_kind`], ...) asks the host for that
//! one thing, so read only what the decision needs. This crate adds the
//! helpers a policy keeps needing, the Go operator's rules ([`defaults`]),
//! settings ([`Settings`]) and, for native unit tests, builders
//! ([`testing`]).

#[cfg(all(target_family = "wasm", feature = "bump-allocator"))]
pub mod alloc;

#[cfg(all(target_family = "wasm", feature = "bump-allocator"))]
#[global_allocator]
static ALLOCATOR: alloc::BumpAllocator = alloc::BumpAllocator::new();

#[allow(missing_docs, clippy::all)]
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "drain-policy",
        default_bindings_module: "nmo_policy_sdk::bindings",
        pub_export_macro: true,
        export_macro_name: "__export_guest",
    });
}

use std::cell::OnceCell;

pub use bindings::medik8s::node_maintenance::types::{
    Admission, Completion, DrainPlan, DrainReport, EndedMaintenance, EtcdGuard, Failure,
    FleetMaintenance, KeyValue, Level, Maintenance, MaintenancePhase, Notice, Outcome, Owner,
    Parking, PodAction, PodDecision, PodHistory, PodPhase, PodRef, Removal, RemovalMethod, Taint,
    TaintEffect, Verdict, Waiting, Workload,
};

/// The annotation the kubelet puts on mirror (static) pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The contract version this SDK builds policies for.
pub const CONTRACT_VERSION: &str = "0.4.0";

/// A drain policy: the decisions the operator asks for.
///
/// Every function is called in a fresh instance: nothing survives from one
/// call to the next.
pub trait Policy {
    /// How to drain `node`: one decision per pod of `pods` (every pod
    /// bound to the node), made with [`Pod::decide`]. Default: the Go
    /// operator's drain ([`defaults::plan`] with [`defaults::pod_action`]).
    fn plan_drain(_maintenance: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        defaults::plan(&pods, defaults::pod_action)
    }

    /// What happens after a failure: retry, or give up. Default: the Go
    /// operator's answers ([`defaults::on_failure`]).
    fn on_failure(maintenance: Maintenance, failure: Failure) -> Verdict {
        defaults::on_failure(&maintenance, &failure)
    }

    /// Whether the maintenance may start now, given the rest of the fleet.
    /// Default: [`defaults::admit`] (admit, except the Go operator's etcd
    /// quorum rule on OpenShift control-plane nodes).
    fn admit(maintenance: Maintenance, node: Node, fleet: Fleet) -> Admission {
        defaults::admit(&maintenance, &node, &fleet)
    }

    /// Checks the settings `policies.yaml` gives the policy, when the
    /// policy set is loaded; an error refuses the set with its message.
    /// Default: no settings are accepted.
    fn validate_settings(settings: Settings) -> Result<(), String> {
        settings.allow_only(&[])
    }
}

/// Exports a [`Policy`] as the component's implementation of the contract.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_family = "wasm")]
        const _: () = {
            struct NmoPolicyExport;
            use $crate::bindings::medik8s::node_maintenance::types as host;
            impl $crate::bindings::Guest for NmoPolicyExport {
                fn validate_settings(
                    settings: ::std::vec::Vec<$crate::KeyValue>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    <$policy as $crate::Policy>::validate_settings($crate::Settings::new(settings))
                }
                fn admit(
                    maintenance: $crate::Maintenance,
                    node: host::Node,
                    fleet: host::Fleet,
                ) -> $crate::Admission {
                    <$policy as $crate::Policy>::admit(
                        maintenance,
                        $crate::Node::from_host(node),
                        $crate::Fleet::from_host(fleet),
                    )
                }
                fn plan_drain(
                    maintenance: $crate::Maintenance,
                    node: host::Node,
                    pods: ::std::vec::Vec<host::Pod>,
                ) -> $crate::DrainPlan {
                    <$policy as $crate::Policy>::plan_drain(
                        maintenance,
                        $crate::Node::from_host(node),
                        $crate::Pod::from_host_list(pods),
                    )
                }
                fn on_failure(
                    maintenance: $crate::Maintenance,
                    failure: $crate::Failure,
                ) -> $crate::Verdict {
                    <$policy as $crate::Policy>::on_failure(maintenance, failure)
                }
            }
    $crate::bindings::__export_guest!(NmoPolicyExport with_types_in $crate::bindings);
        };
        // A native build (the policy's own unit tests) exports nothing, but
        // the policy is still its code in use.
        #[cfg(not(target_family = "wasm"))]
        const _: () = {
            let _ = <$policy as $crate::Policy>::plan_drain as fn(_, _, _) -> _;
            let _ = <$policy as $crate::Policy>::on_failure as fn(_, _) -> _;
            let _ = <$policy as $crate::Policy>::admit as fn(_, _, _) -> _;
            let _ = <$policy as $crate::Policy>::validate_settings as fn(_) -> _;
        };
    };
}

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

/// `90s`, `15m`, `2h`, `500ms` or a bare number of seconds, in
/// milliseconds; `None` for anything else (or zero).
pub fn duration_ms(text: &str) -> Option<u64> {
    let s = text.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms).filter(|&ms| ms > 0)
}

/// Milliseconds as a short duration (`10m`, `90s`, `1500ms`), for messages.
pub fn show_ms(ms: u64) -> String {
    match ms {
        ms if ms >= 3_600_000 && ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms >= 60_000 && ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms >= 1_000 && ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// A policy's settings: the `settings` of its entry in `policies.yaml`,
/// values as strings, sorted by key.
#[derive(Clone, Debug, Default)]
pub struct Settings(Vec<KeyValue>);

impl Settings {
    /// Settings from the contract's list.
    pub fn new(pairs: Vec<KeyValue>) -> Self {
        Settings(pairs)
    }

    /// The settings the operator gives this decision (checked by
    /// [`Policy::validate_settings`] when the policy set was loaded).
    ///
    /// Outside WebAssembly: those set by [`testing::set_settings`] on this
    /// thread.
    pub fn current() -> Self {
        #[cfg(target_family = "wasm")]
        return Settings(bindings::settings());
        #[cfg(not(target_family = "wasm"))]
        return testing::current_settings();
    }

    /// One setting's value.
    pub fn get(&self, key: &str) -> Option<&str> {
        lookup(&self.0, key)
    }

    /// Every setting.
    pub fn pairs(&self) -> &[KeyValue] {
        &self.0
    }

    /// An error naming the first setting not in `known` (a typo would
    /// otherwise be ignored).
    pub fn allow_only(&self, known: &[&str]) -> Result<(), String> {
        match self.0.iter().find(|kv| !known.contains(&kv.key.as_str())) {
            None => Ok(()),
            Some(kv) if known.is_empty() => Err(format!(
                "unknown setting {:?}: this policy takes no settings",
                kv.key
            )),
            Some(kv) => Err(format!(
                "unknown setting {:?} (known: {})",
                kv.key,
                known.join(", ")
            )),
        }
    }

    /// A duration setting (`90s`, `15m`, `2h`): `Ok(None)` when absent, an
    /// error naming the setting when it cannot be read.
    pub fn duration_ms(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => duration_ms(v).map(Some).ok_or_else(|| {
                format!("setting {key}: cannot read {v:?} as a duration (use 90s, 15m, 2h)")
            }),
        }
    }

    /// A whole-number setting: `Ok(None)` when absent.
    pub fn number(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("setting {key}: {v:?} is not a whole number")),
        }
    }
}

/// Where a pod's or node's facts come from: the host's handle in a
/// policy, a plain record in a native unit test.
mod source {
    #[cfg(target_family = "wasm")]
    pub use crate::bindings::medik8s::node_maintenance::types::{Node, Pod};

    #[cfg(not(target_family = "wasm"))]
    pub use crate::testing::{NodeRecord as Node, PodRecord as Pod};
}

/// `label`, `annotation`, `labels`, `annotations`: asked of the host (or
/// the test record) each time.
macro_rules! metadata_accessors {
    () => {
        /// The value of a label.
        pub fn label(&self, key: &str) -> Option<String> {
            self.source.label(key)
        }

        /// The value of an annotation.
        pub fn annotation(&self, key: &str) -> Option<String> {
            self.source.annotation(key)
        }

        /// Every label, sorted by key.
        pub fn labels(&self) -> Vec<KeyValue> {
            self.source.labels()
        }

        /// Every annotation, sorted by key.
        pub fn annotations(&self) -> Vec<KeyValue> {
            self.source.annotations()
        }
    };
}

/// A pod on the node under maintenance. Each accessor asks the host once;
/// the name, namespace and controller kind are kept after the first ask.
pub struct Pod {
    index: u32,
    source: source::Pod,
    namespace: OnceCell<String>,
    name: OnceCell<String>,
    controller_kind: OnceCell<Option<String>>,
}

impl std::fmt::Debug for Pod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pod({} #{})", self.key(), self.index)
    }
}

impl Pod {
    fn wrap(index: u32, source: source::Pod) -> Self {
        Pod {
            index,
            source,
            namespace: OnceCell::new(),
            name: OnceCell::new(),
            controller_kind: OnceCell::new(),
        }
    }

    #[doc(hidden)]
    #[cfg(target_family = "wasm")]
    pub fn from_host_list(pods: Vec<source::Pod>) -> Vec<Pod> {
        pods.into_iter()
            .enumerate()
            .map(|(i, p)| Pod::wrap(i as u32, p))
            .collect()
    }

    /// The pod's position in the list `plan_drain` was given.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// `metadata.namespace`
    pub fn namespace(&self) -> &str {
        self.namespace.get_or_init(|| self.source.namespace())
    }

    /// `metadata.name`
    pub fn name(&self) -> &str {
        self.name.get_or_init(|| self.source.name())
    }

    /// `metadata.uid`
    pub fn uid(&self) -> String {
        self.source.uid()
    }

    metadata_accessors!();

    /// `metadata.ownerReferences`, in order.
    pub fn owners(&self) -> Vec<Owner> {
        self.source.owners()
    }

    /// The owner that controls this pod (`controller: true`), if any.
    pub fn controller(&self) -> Option<Owner> {
        self.owners().into_iter().find(|o| o.controller)
    }

    /// The kind of the controlling owner (`ReplicaSet`, `StatefulSet`,
    /// `DaemonSet`, `Job`...), if any.
    pub fn controller_kind(&self) -> Option<&str> {
        self.controller_kind
            .get_or_init(|| self.source.controller_kind())
            .as_deref()
    }

    /// Managed by a DaemonSet: its controller is a DaemonSet.
    pub fn is_daemonset_managed(&self) -> bool {
        self.controller_kind() == Some("DaemonSet")
    }

    /// A static pod's mirror (see [`MIRROR_ANNOTATION`]).
    pub fn is_mirror(&self) -> bool {
        self.source.mirror()
    }

    /// No controller: nothing recreates this pod once it is removed.
    pub fn is_unmanaged(&self) -> bool {
        self.controller_kind().is_none()
    }

    /// Uses an `emptyDir` volume, whose data is lost when the pod goes.
    pub fn has_local_storage(&self) -> bool {
        self.source.local_storage()
    }

    /// `status.phase`
    pub fn phase(&self) -> PodPhase {
        self.source.phase()
    }

    /// Finished: phase `Succeeded` or `Failed`.
    pub fn is_finished(&self) -> bool {
        matches!(self.phase(), PodPhase::Succeeded | PodPhase::Failed)
    }

    /// The Ready condition is True.
    pub fn is_ready(&self) -> bool {
        self.source.ready()
    }

    /// Already being deleted (`deletionTimestamp` set).
    pub fn is_terminating(&self) -> bool {
        self.source.terminating()
    }

    /// `spec.terminationGracePeriodSeconds` (none: the API default, 30).
    pub fn grace_period_seconds(&self) -> Option<i64> {
        self.source.grace_period_seconds()
    }

    /// `spec.priority`
    pub fn priority(&self) -> Option<i32> {
        self.source.priority()
    }

    /// `spec.priorityClassName`, empty when unset.
    pub fn priority_class_name(&self) -> String {
        self.source.priority_class_name()
    }

    /// `metadata.deletionTimestamp` of a terminating pod (ms since the Unix
    /// epoch): when its grace period ends.
    pub fn deletion_deadline_ms(&self) -> Option<u64> {
        self.source.deletion_deadline_ms()
    }

    /// Terminating, and still here `slack_ms` after its grace period ended
    /// (at `now_ms`, the maintenance's `now-ms`).
    pub fn is_stuck_terminating(&self, now_ms: u64, slack_ms: u64) -> bool {
        self.deletion_deadline_ms()
            .is_some_and(|at| now_ms >= at.saturating_add(slack_ms))
    }

    /// What this maintenance's drain has done to the pod so far.
    pub fn history(&self) -> PodHistory {
        self.source.drain_history()
    }

    /// The workload that runs the pod (its Deployment rather than the
    /// ReplicaSet, with replicas and rollout bounds); none for a pod
    /// nothing controls. Contract 0.4: calling it makes the operator read
    /// the workloads for each plan of this policy.
    pub fn workload(&self) -> Option<Workload> {
        self.source.workload()
    }

    /// Run by a Deployment, ReplicaSet or StatefulSet of exactly one
    /// replica (as its owner set it): evicting the pod takes the
    /// application down until its replacement is Ready.
    pub fn is_single_replica(&self) -> bool {
        self.workload().is_some_and(|w| w.replicas == Some(1))
    }

    /// Whether the pod's namespace is one of `list` (comma-separated, as
    /// a setting gives it).
    pub fn in_namespaces(&self, list: &str) -> bool {
        list.split(',')
            .map(str::trim)
            .any(|ns| ns == self.namespace())
    }

    /// Whether the pod carries the label `selector` names: `key=value`, or
    /// just `key` (any value).
    pub fn has_label(&self, selector: &str) -> bool {
        match selector.split_once('=') {
            Some((k, v)) => self.label(k.trim()).as_deref() == Some(v.trim()),
            None => self.label(selector.trim()).is_some(),
        }
    }

    /// `namespace/name`, for messages.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }

    /// This pod as a [`PodRef`].
    pub fn pod_ref(&self) -> PodRef {
        PodRef {
            namespace: self.namespace().to_owned(),
            name: self.name().to_owned(),
        }
    }

    /// A decision about this pod, in wave `order`.
    pub fn decide(&self, action: PodAction, order: u32) -> PodDecision {
        PodDecision {
            pod: self.index,
            action,
            order,
        }
    }
}

/// A node: the one under maintenance, or one of the fleet.
pub struct Node {
    source: source::Node,
    name: OnceCell<String>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.name())
    }
}

impl Node {
    fn wrap(source: source::Node) -> Self {
        Node {
            source,
            name: OnceCell::new(),
        }
    }

    #[doc(hidden)]
    #[cfg(target_family = "wasm")]
    pub fn from_host(node: source::Node) -> Node {
        Node::wrap(node)
    }

    /// `metadata.name`
    pub fn name(&self) -> &str {
        self.name.get_or_init(|| self.source.name())
    }

    metadata_accessors!();

    /// `spec.taints`
    pub fn taints(&self) -> Vec<Taint> {
        self.source.taints()
    }

    /// Carries a taint with this key (any value, any effect).
    pub fn has_taint(&self, key: &str) -> bool {
        self.taints().iter().any(|t| t.key == key)
    }

    /// Cordoned (`spec.unschedulable`).
    pub fn is_unschedulable(&self) -> bool {
        self.source.unschedulable()
    }

    /// The Ready condition is True.
    pub fn is_ready(&self) -> bool {
        self.source.ready()
    }

    /// Who else holds the node's medik8s lease (`medik8s-leases/node-<name>`),
    /// while it is valid.
    pub fn lease_holder(&self) -> Option<String> {
        self.source.lease_holder()
    }

    /// Other tools' records that they are taking the node down
    /// (`cluster-api <ns>/<machine>`, `nvidia <ns>/<name>`, `kured
    /// <ns>/<daemonset>`).
    pub fn tool_claims(&self) -> Vec<String> {
        self.source.tool_claims()
    }

    /// A control-plane node (the `node-role.kubernetes.io/master` or
    /// `node-role.kubernetes.io/control-plane` label, any value).
    pub fn is_control_plane(&self) -> bool {
        self.labels().iter().any(|kv| {
            kv.key == "node-role.kubernetes.io/master"
                || kv.key == "node-role.kubernetes.io/control-plane"
        })
    }
}

/// Who has taken a node away, as what other tools write on the node
/// itself shows. [`Node::claim`] reads it; fleet rules count a claimed
/// node as unavailable, as they count one in maintenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Karpenter is disrupting it (consolidation, drift, expiry): the taint
    /// `karpenter.sh/disrupted` (v1), or `karpenter.sh/disruption` (before
    /// v1).
    Karpenter,
    /// The cluster autoscaler is removing it: the taint
    /// `ToBeDeletedByClusterAutoscaler`.
    ClusterAutoscaler,
    /// kured is rebooting it: the annotation
    /// `weave.works/kured-reboot-in-progress` (kured with
    /// `--annotate-nodes`).
    Kured,
    /// A medik8s remediation (Self Node Remediation, through Node Health
    /// Check) holds it: the taint `medik8s.io/remediation`.
    Remediation,
    /// Someone else holds the node's medik8s lease
    /// (`medik8s-leases/node-<name>`): a Node Health Check remediator, or
    /// another medik8s operator (its holder identity).
    Lease(String),
    /// Cluster API is deleting the node's Machine (`namespace/name`).
    ClusterApi(String),
    /// NVIDIA's maintenance operator has a NodeMaintenance of the node
    /// (`namespace/name`).
    Nvidia(String),
    /// kured's reboot lock names the node: the annotation
    /// `weave.works/kured-node-lock` on kured's DaemonSet
    /// (`namespace/name`), as kured writes it by default.
    KuredLock(String),
    /// Another tool's `NoSchedule` or `NoExecute` taint: its key.
    Taint(String),
    /// Cordoned (`spec.unschedulable`), by someone unknown: a person, or a
    /// tool that marks nothing else.
    Cordoned,
}

impl std::fmt::Display for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::Karpenter => f.write_str("taken by Karpenter (taint karpenter.sh/disrupted)"),
            Claim::ClusterAutoscaler => f.write_str(
                "taken by the cluster autoscaler (taint ToBeDeletedByClusterAutoscaler)",
            ),
            Claim::Kured => {
                f.write_str("taken by kured (annotation weave.works/kured-reboot-in-progress)")
            }
            Claim::Remediation => {
                f.write_str("taken by a medik8s remediation (taint medik8s.io/remediation)")
            }
            Claim::Lease(holder) => {
                write!(f, "taken by {holder} (its medik8s lease in medik8s-leases)")
            }
            Claim::ClusterApi(machine) => {
                write!(f, "taken by Cluster API (Machine {machine} being deleted)")
            }
            Claim::Nvidia(name) => write!(
                f,
                "taken by NVIDIA's maintenance operator (NodeMaintenance {name})"
            ),
            Claim::KuredLock(ds) => write!(f, "taken by kured (its reboot lock on DaemonSet {ds})"),
            Claim::Taint(key) => write!(f, "unschedulable, reason unknown (taint {key})"),
            Claim::Cordoned => f.write_str("unschedulable, reason unknown (cordoned)"),
        }
    }
}

/// The taint keys of the tools [`Claim`] names.
const KARPENTER_TAINTS: [&str; 2] = ["karpenter.sh/disrupted", "karpenter.sh/disruption"];
const AUTOSCALER_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
const KURED_ANNOTATION: &str = "weave.works/kured-reboot-in-progress";
const REMEDIATION_TAINT: &str = "medik8s.io/remediation";
/// Our own maintenance's taint: a node in one of our maintenances is
/// counted as that maintenance, not as a claim.
const DRAIN_TAINT: &str = "medik8s.io/drain";

/// Taints that say nothing of another tool: the node's conditions
/// (`node.kubernetes.io/not-ready`, `…/unschedulable`, which a cordon
/// adds, and the rest), the roles (`node-role.kubernetes.io/control-plane`),
/// a cloud node not yet initialised.
fn says_nothing(key: &str) -> bool {
    key.starts_with("node.kubernetes.io/")
        || key.starts_with("node-role.kubernetes.io/")
        || key == "node.cloudprovider.kubernetes.io/uninitialized"
}

impl Node {
    /// Whether another tool or a person has taken this node away, and who:
    /// the tools [`Claim`] names by what they write on the node, then any
    /// other `NoSchedule`/`NoExecute` taint (but those in `ignore`: a
    /// dedicated pool's own taints, say, and those that say nothing of a
    /// tool), then a cordon. A node of one of our maintenances (its
    /// `medik8s.io/drain` taint) is none: count it as that maintenance.
    pub fn claim(&self, ignore: &[&str]) -> Option<Claim> {
        let taints = self.taints();
        if taints.iter().any(|t| t.key == DRAIN_TAINT) {
            return None;
        }
        let has = |key: &str| taints.iter().any(|t| t.key == key);
        if KARPENTER_TAINTS.iter().any(|k| has(k)) {
            return Some(Claim::Karpenter);
        }
        if has(AUTOSCALER_TAINT) {
            return Some(Claim::ClusterAutoscaler);
        }
        if self.annotation(KURED_ANNOTATION).is_some() {
            return Some(Claim::Kured);
        }
        if has(REMEDIATION_TAINT) {
            return Some(Claim::Remediation);
        }
        if let Some(holder) = self.lease_holder() {
            return Some(Claim::Lease(holder));
        }
        for claim in self.tool_claims() {
            match claim.split_once(' ') {
                Some(("cluster-api", machine)) => return Some(Claim::ClusterApi(machine.into())),
                Some(("nvidia", name)) => return Some(Claim::Nvidia(name.into())),
                Some(("kured", ds)) => return Some(Claim::KuredLock(ds.into())),
                _ => {}
            }
        }
        if let Some(t) = taints.iter().find(|t| {
            matches!(t.effect, TaintEffect::NoSchedule | TaintEffect::NoExecute)
                && !says_nothing(&t.key)
                && !ignore.contains(&t.key.as_str())
        }) {
            return Some(Claim::Taint(t.key.clone()));
        }
        self.is_unschedulable().then_some(Claim::Cordoned)
    }
}

/// The cluster around a maintenance that asks to start.
#[derive(Debug)]
pub struct Fleet {
    /// Every node of the cluster, the one under maintenance included.
    pub nodes: Vec<Node>,
    /// Every other NodeMaintenance that holds or waits for a node (Failed
    /// ones are left out; Succeeded ones hold their node until deleted).
    pub maintenances: Vec<FleetMaintenance>,
    /// OpenShift only: the etcd quorum guard.
    pub etcd: Option<EtcdGuard>,
    /// The maintenances that ended within the policy's `history-window`
    /// setting (default 1 h, at most 24 h), newest first.
    pub history: Vec<EndedMaintenance>,
}

impl Fleet {
    #[doc(hidden)]
    #[cfg(target_family = "wasm")]
    pub fn from_host(fleet: bindings::medik8s::node_maintenance::types::Fleet) -> Fleet {
        Fleet {
            nodes: fleet.nodes.into_iter().map(Node::wrap).collect(),
            maintenances: fleet.maintenances,
            etcd: fleet.etcd,
            history: fleet.history,
        }
    }

    /// The other maintenances already admitted (their node is, or is about
    /// to be, cordoned).
    pub fn admitted(&self) -> impl Iterator<Item = &FleetMaintenance> {
        self.maintenances.iter().filter(|m| m.admitted)
    }

    /// The other maintenances their policy parked (an undrainable node
    /// set aside: cordoned, nothing happening until a person acts).
    pub fn parked(&self) -> impl Iterator<Item = &FleetMaintenance> {
        self.maintenances.iter().filter(|m| m.parked)
    }

    /// The node of this name.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name() == name)
    }

    /// Whether a maintenance waiting for admission was created before
    /// `m` (the order waiting maintenances are admitted in).
    pub fn waiting_before(&self, m: &Maintenance) -> impl Iterator<Item = &FleetMaintenance> {
        let created = m.created_ms;
        self.maintenances
            .iter()
            .filter(move |o| !o.admitted && (o.created_ms, &o.name) < (created, &m.name))
    }
}

impl Removal {
    /// The pod's own grace period, no rule named.
    pub fn default_grace() -> Self {
        Removal {
            grace_period_seconds: None,
            rule: String::new(),
        }
    }

    /// The pod's own grace period, for `rule`.
    pub fn by_rule(rule: impl Into<String>) -> Self {
        Removal {
            grace_period_seconds: None,
            rule: rule.into(),
        }
    }

    /// This grace period (0: at once).
    pub fn grace(mut self, seconds: i64) -> Self {
        self.grace_period_seconds = Some(seconds);
        self
    }
}

impl PodAction {
    /// Evict with the pod's own grace period (kubectl drain's default).
    pub fn evict() -> Self {
        PodAction::Evict(Removal::default_grace())
    }

    /// Delete directly (no PodDisruptionBudget check), with the pod's own
    /// grace period.
    pub fn delete() -> Self {
        PodAction::Delete(Removal::default_grace())
    }

    /// Delete directly, naming the rule (the event of the forced removal
    /// names it).
    pub fn delete_by(removal: Removal) -> Self {
        PodAction::Delete(removal)
    }

    /// Make-before-break: a Ready replacement first (pods a ReplicaSet
    /// controls only).
    pub fn surge() -> Self {
        PodAction::Surge(Removal::default_grace())
    }

    /// Ask the application first; evict once it is ready, gone, or
    /// `timeout_ms` ran out (heartbeats extend it by `heartbeat_ms`).
    pub fn notify(timeout_ms: u64, heartbeat_ms: Option<u64>) -> Self {
        PodAction::Notify(Notice {
            timeout_ms,
            heartbeat_ms,
            then: RemovalMethod::Evict,
            removal: Removal::default_grace(),
        })
    }

    /// Leave the pod until it completes, at most `timeout_ms`.
    pub fn wait(timeout_ms: u64, reason: impl Into<String>) -> Self {
        PodAction::Wait(Completion {
            timeout_ms,
            reason: reason.into(),
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

impl Admission {
    /// Wait, asking again when the fleet changes or after `recheck_after_ms`.
    pub fn wait(reason: impl Into<String>, recheck_after_ms: Option<u64>) -> Self {
        Admission::Wait(Waiting {
            reason: reason.into(),
            recheck_after_ms,
        })
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
}

/// Builders for what a policy gets, for a policy's own native unit tests
/// (`cargo test`, no WebAssembly, no operator):
///
/// ```
/// use nmo_policy_sdk::testing::{maintenance, node, pod, positions};
/// use nmo_policy_sdk::*;
///
/// let pods = positions(vec![
///     pod("default", "web-1").owned_by("ReplicaSet", "web-5d4f"),
///     pod("kube-system", "agent-x").owned_by("DaemonSet", "agent"),
/// ]);
/// assert!(matches!(defaults::pod_action(&pods[0]), PodAction::Evict(_)));
/// assert!(matches!(defaults::pod_action(&pods[1]), PodAction::Skip(_)));
/// let plan = defaults::plan(&pods, defaults::pod_action);
/// assert_eq!(plan.decisions[1].pod, 1);
/// let m = maintenance("node-1").attempt(3);
/// assert_eq!(m.attempt, 3);
/// assert_eq!(node("node-1").label("missing"), None);
/// ```
///
/// Native builds only: a policy built for WebAssembly does not carry it.
#[cfg(not(target_family = "wasm"))]
pub mod testing {
    use super::*;
    use std::cell::RefCell;

    /// A pod's facts, as the host would answer them.
    #[derive(Clone, Debug, Default)]
    pub struct PodRecord {
        pub namespace: String,
        pub name: String,
        pub uid: String,
        pub labels: Vec<KeyValue>,
        pub annotations: Vec<KeyValue>,
        pub owners: Vec<Owner>,
        pub phase: Option<PodPhase>,
        pub ready: bool,
        pub mirror: bool,
        pub local_storage: bool,
        pub terminating: bool,
        pub grace_period_seconds: Option<i64>,
        pub priority: Option<i32>,
        pub priority_class_name: String,
        pub deletion_deadline_ms: Option<u64>,
        pub history: Option<PodHistory>,
        pub workload: Option<Workload>,
    }

    impl PodRecord {
        pub fn namespace(&self) -> String {
            self.namespace.clone()
        }
        pub fn name(&self) -> String {
            self.name.clone()
        }
        pub fn uid(&self) -> String {
            self.uid.clone()
        }
        pub fn label(&self, key: &str) -> Option<String> {
            lookup(&self.labels, key).map(str::to_owned)
        }
        pub fn annotation(&self, key: &str) -> Option<String> {
            lookup(&self.annotations, key).map(str::to_owned)
        }
        pub fn labels(&self) -> Vec<KeyValue> {
            self.labels.clone()
        }
        pub fn annotations(&self) -> Vec<KeyValue> {
            self.annotations.clone()
        }
        pub fn owners(&self) -> Vec<Owner> {
            self.owners.clone()
        }
        pub fn controller_kind(&self) -> Option<String> {
            let controller = self.owners.iter().find(|o| o.controller);
            controller.map(|o| o.kind.clone())
        }
        pub fn phase(&self) -> PodPhase {
            self.phase.unwrap_or(PodPhase::Running)
        }
        pub fn ready(&self) -> bool {
            self.ready
        }
        pub fn mirror(&self) -> bool {
            self.mirror
        }
        pub fn local_storage(&self) -> bool {
            self.local_storage
        }
        pub fn terminating(&self) -> bool {
            self.terminating
        }
        pub fn grace_period_seconds(&self) -> Option<i64> {
            self.grace_period_seconds
        }
        pub fn priority(&self) -> Option<i32> {
            self.priority
        }
        pub fn priority_class_name(&self) -> String {
            self.priority_class_name.clone()
        }
        pub fn deletion_deadline_ms(&self) -> Option<u64> {
            self.deletion_deadline_ms
        }
        pub fn drain_history(&self) -> PodHistory {
            self.history.unwrap_or(PodHistory {
                pending_ms: 0,
                refused_evictions: 0,
                attempts: 0,
                notified_ms: None,
            })
        }
        /// The workload given, else the controller's kind and name (as
        /// the host answers when it could not read the object).
        pub fn workload(&self) -> Option<Workload> {
            if let Some(w) = &self.workload {
                return Some(w.clone());
            }
            let c = self.owners.iter().find(|o| o.controller)?;
            Some(Workload {
                kind: c.kind.clone(),
                name: c.name.clone(),
                replicas: None,
                ready_replicas: None,
                max_surge: None,
                max_unavailable: None,
            })
        }
    }

    /// A node's facts, as the host would answer them.
    #[derive(Clone, Debug, Default)]
    pub struct NodeRecord {
        pub name: String,
        pub labels: Vec<KeyValue>,
        pub annotations: Vec<KeyValue>,
        pub taints: Vec<Taint>,
        pub unschedulable: bool,
        pub ready: bool,
        pub lease_holder: Option<String>,
        pub tool_claims: Vec<String>,
    }

    impl NodeRecord {
        pub fn name(&self) -> String {
            self.name.clone()
        }
        pub fn label(&self, key: &str) -> Option<String> {
            lookup(&self.labels, key).map(str::to_owned)
        }
        pub fn annotation(&self, key: &str) -> Option<String> {
            lookup(&self.annotations, key).map(str::to_owned)
        }
        pub fn labels(&self) -> Vec<KeyValue> {
            self.labels.clone()
        }
        pub fn annotations(&self) -> Vec<KeyValue> {
            self.annotations.clone()
        }
        pub fn taints(&self) -> Vec<Taint> {
            self.taints.clone()
        }
        pub fn unschedulable(&self) -> bool {
            self.unschedulable
        }
        pub fn ready(&self) -> bool {
            self.ready
        }
        pub fn lease_holder(&self) -> Option<String> {
            self.lease_holder.clone()
        }
        pub fn tool_claims(&self) -> Vec<String> {
            self.tool_claims.clone()
        }
    }

    thread_local! {
        static SETTINGS: RefCell<Settings> = RefCell::new(Settings::default());
    }

    /// What [`Settings::current`] answers on this thread, for a test.
    pub fn set_settings(pairs: &[(&str, &str)]) {
        let settings = Settings::new(pairs.iter().map(|(k, v)| pair(k, v)).collect());
        SETTINGS.with(|s| *s.borrow_mut() = settings);
    }

    pub(crate) fn current_settings() -> Settings {
        SETTINGS.with(|s| s.borrow().clone())
    }

    /// A running, ready pod with no owner, labels or annotations, at
    /// position 0 (see [`positions`]).
    pub fn pod(namespace: &str, name: &str) -> Pod {
        Pod::wrap(
            0,
            PodRecord {
                namespace: namespace.into(),
                name: name.into(),
                uid: format!("uid-{namespace}-{name}"),
                phase: Some(PodPhase::Running),
                ready: true,
                ..PodRecord::default()
            },
        )
    }

    /// The pods numbered by their position, as `plan_drain` gets them.
    pub fn positions(pods: Vec<Pod>) -> Vec<Pod> {
        pods.into_iter()
            .enumerate()
            .map(|(i, p)| Pod::wrap(i as u32, p.source))
            .collect()
    }

    /// A cordoned, Ready node with no labels, annotations or taints.
    pub fn node(name: &str) -> Node {
        Node::wrap(NodeRecord {
            name: name.into(),
            unschedulable: true,
            ready: true,
            ..NodeRecord::default()
        })
    }

    /// A fleet of these nodes and maintenances, not on OpenShift.
    pub fn fleet(nodes: Vec<Node>, maintenances: Vec<FleetMaintenance>) -> Fleet {
        Fleet {
            nodes,
            maintenances,
            etcd: None,
            history: Vec::new(),
        }
    }

    /// Another maintenance of `node_name`, admitted `since_ms` (and created
    /// then).
    pub fn other(node_name: &str, admitted: bool, since_ms: u64) -> FleetMaintenance {
        FleetMaintenance {
            name: format!("nm-{node_name}"),
            node_name: node_name.into(),
            phase: admitted.then_some(MaintenancePhase::Running),
            admitted,
            parked: false,
            since_ms,
            created_ms: since_ms,
        }
    }

    /// A NodeMaintenance of `node_name` on its first attempt, just
    /// created (at 2026-01-05T10:00:00Z, a Monday).
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
            now_ms: 1_767_607_200_000,
            created_ms: 1_767_607_200_000,
        }
    }

    fn pair(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.into(),
        }
    }

    impl Pod {
        fn edit(mut self, f: impl FnOnce(&mut PodRecord)) -> Self {
            f(&mut self.source);
            Pod::wrap(self.index, self.source)
        }

        /// Controlled by an owner of `kind` (`ReplicaSet`, `StatefulSet`,
        /// `DaemonSet`, `Job`...).
        pub fn owned_by(self, kind: &str, name: &str) -> Self {
            let api_version = match kind {
                "Job" | "CronJob" => "batch/v1",
                "Node" => "v1",
                _ => "apps/v1",
            };
            self.edit(|p| {
                p.owners.push(Owner {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: name.into(),
                    uid: format!("uid-{name}"),
                    controller: true,
                })
            })
        }

        /// Run by a Deployment `name` of `replicas` (all Ready) with the
        /// default rollout bounds (25 %), through a ReplicaSet of it.
        pub fn in_deployment(self, name: &str, replicas: u32) -> Self {
            self.owned_by("ReplicaSet", &format!("{name}-5d4f"))
                .edit(|p| {
                    p.workload = Some(Workload {
                        kind: "Deployment".into(),
                        name: name.into(),
                        replicas: Some(replicas),
                        ready_replicas: Some(replicas),
                        max_surge: Some(replicas.div_ceil(4)),
                        max_unavailable: Some(replicas / 4),
                    })
                })
        }

        /// With a label.
        pub fn with_label(self, key: &str, value: &str) -> Self {
            self.edit(|p| p.labels.push(pair(key, value)))
        }

        /// With an annotation.
        pub fn with_annotation(self, key: &str, value: &str) -> Self {
            self.edit(|p| p.annotations.push(pair(key, value)))
        }

        /// A static pod's mirror.
        pub fn as_mirror(self) -> Self {
            self.edit(|p| {
                p.mirror = true;
                p.annotations.push(pair(MIRROR_ANNOTATION, "hash"));
            })
        }

        /// With an emptyDir volume.
        pub fn with_local_storage(self) -> Self {
            self.edit(|p| p.local_storage = true)
        }

        /// In this phase.
        pub fn in_phase(self, phase: PodPhase) -> Self {
            self.edit(|p| p.phase = Some(phase))
        }

        /// Already being deleted.
        pub fn as_terminating(self) -> Self {
            self.edit(|p| p.terminating = true)
        }

        /// With `terminationGracePeriodSeconds`.
        pub fn with_grace_period(self, seconds: i64) -> Self {
            self.edit(|p| p.grace_period_seconds = Some(seconds))
        }

        /// With a priority and its class.
        pub fn with_priority(self, class: &str, priority: i32) -> Self {
            self.edit(|p| {
                p.priority_class_name = class.into();
                p.priority = Some(priority);
            })
        }

        /// Terminating, its grace period ending at `at_ms`.
        pub fn terminating_until(self, at_ms: u64) -> Self {
            self.edit(|p| {
                p.terminating = true;
                p.deletion_deadline_ms = Some(at_ms);
            })
        }

        /// Wanted gone for `pending_ms` so far, with `refused` evictions
        /// refused.
        pub fn pending_for(self, pending_ms: u64, refused: u32) -> Self {
            self.edit(|p| {
                p.history = Some(PodHistory {
                    pending_ms,
                    refused_evictions: refused,
                    attempts: 0,
                    notified_ms: None,
                })
            })
        }
    }

    impl Node {
        fn edit(mut self, f: impl FnOnce(&mut NodeRecord)) -> Self {
            f(&mut self.source);
            Node::wrap(self.source)
        }

        /// With a label.
        pub fn with_label(self, key: &str, value: &str) -> Self {
            self.edit(|n| n.labels.push(pair(key, value)))
        }

        /// With an annotation.
        pub fn with_annotation(self, key: &str, value: &str) -> Self {
            self.edit(|n| n.annotations.push(pair(key, value)))
        }

        /// With a taint of this key and effect, no value.
        pub fn with_taint(self, key: &str, effect: TaintEffect) -> Self {
            self.edit(|n| {
                n.taints.push(Taint {
                    key: key.into(),
                    value: String::new(),
                    effect,
                })
            })
        }

        /// NotReady.
        pub fn not_ready(self) -> Self {
            self.edit(|n| n.ready = false)
        }

        /// Schedulable (not cordoned).
        pub fn schedulable(self) -> Self {
            self.edit(|n| n.unschedulable = false)
        }

        /// Its medik8s lease held by `holder`.
        pub fn leased_by(self, holder: &str) -> Self {
            self.edit(|n| n.lease_holder = Some(holder.into()))
        }

        /// Claimed by another tool's object (`cluster-api ns/machine`).
        pub fn claimed_by(self, claim: &str) -> Self {
            self.edit(|n| n.tool_claims.push(claim.into()))
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
            self.created_ms = self.now_ms.saturating_sub(self.elapsed_ms);
            self
        }

        /// Decided at this time (milliseconds since the Unix epoch).
        pub fn at(mut self, now_ms: u64) -> Self {
            self.now_ms = now_ms;
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

#[cfg(test)]
mod claim_tests {
    use super::testing::node;
    use super::*;

    /// Each tool is named by what it writes on the node; what says
    /// nothing of a tool is no claim.
    #[test]
    fn claims_name_the_tool_that_wrote_them() {
        let n = || node("n").schedulable();
        let cases = [
            (
                n().with_taint("karpenter.sh/disrupted", TaintEffect::NoSchedule),
                Some(Claim::Karpenter),
            ),
            (
                n().with_taint("karpenter.sh/disruption", TaintEffect::NoSchedule),
                Some(Claim::Karpenter),
            ),
            (
                n().with_taint("ToBeDeletedByClusterAutoscaler", TaintEffect::NoSchedule),
                Some(Claim::ClusterAutoscaler),
            ),
            (
                n().with_annotation(
                    "weave.works/kured-reboot-in-progress",
                    "2026-12-03T09:00:00Z",
                ),
                Some(Claim::Kured),
            ),
            (
                n().with_taint("medik8s.io/remediation", TaintEffect::NoExecute),
                Some(Claim::Remediation),
            ),
            (
                n().leased_by("node-healthcheck"),
                Some(Claim::Lease("node-healthcheck".into())),
            ),
            (
                n().claimed_by("cluster-api default/md-0-x7k2p"),
                Some(Claim::ClusterApi("default/md-0-x7k2p".into())),
            ),
            (
                n().claimed_by("nvidia default/upgrade-node-3"),
                Some(Claim::Nvidia("default/upgrade-node-3".into())),
            ),
            (
                n().claimed_by("kured kube-system/kured"),
                Some(Claim::KuredLock("kube-system/kured".into())),
            ),
            (
                n().with_taint("example.com/upgrade", TaintEffect::NoExecute),
                Some(Claim::Taint("example.com/upgrade".into())),
            ),
            (node("n"), Some(Claim::Cordoned)),
            (n(), None),
            (
                n().with_taint("example.com/soft", TaintEffect::PreferNoSchedule),
                None,
            ),
            (
                n().with_taint(
                    "node-role.kubernetes.io/control-plane",
                    TaintEffect::NoSchedule,
                ),
                None,
            ),
            (
                n().with_taint("node.kubernetes.io/not-ready", TaintEffect::NoExecute),
                None,
            ),
            // Our own maintenance's node: counted as that maintenance.
            (
                node("n").with_taint("medik8s.io/drain", TaintEffect::NoSchedule),
                None,
            ),
        ];
        for (node, want) in cases {
            assert_eq!(node.claim(&[]), want, "{:?}", node.taints());
        }
        let pool = n().with_taint("dedicated", TaintEffect::NoSchedule);
        assert_eq!(pool.claim(&["dedicated"]), None);
        assert_eq!(pool.claim(&[]), Some(Claim::Taint("dedicated".into())));
    }
}
