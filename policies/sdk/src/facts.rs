//! Pods and nodes as a policy sees them: handles the host answers (or,
//! in a native unit test, plain records), each fact asked for once.

use crate::*;

use std::cell::OnceCell;

/// Where a pod's or node's facts come from: the host's handle in a
/// policy, a plain record in a native unit test.
pub(crate) mod source {
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
    pub(crate) index: u32,
    pub(crate) source: source::Pod,
    pub(crate) namespace: OnceCell<String>,
    pub(crate) name: OnceCell<String>,
    pub(crate) controller_kind: OnceCell<Option<String>>,
}

impl std::fmt::Debug for Pod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pod({} #{})", self.key(), self.index)
    }
}

impl Pod {
    pub(crate) fn wrap(index: u32, source: source::Pod) -> Self {
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
    pub(crate) source: source::Node,
    pub(crate) name: OnceCell<String>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.name())
    }
}

impl Node {
    pub(crate) fn wrap(source: source::Node) -> Self {
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
