//! The fleet a maintenance asks to start in, and the constructors of a
//! policy's answers (removals, pod actions, admissions).

use crate::*;

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
