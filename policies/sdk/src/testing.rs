//! Builders for what a policy gets, for a policy's own native unit tests.

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
