//! Who has taken a node away, as what other tools write on the node shows.

use crate::*;

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

#[cfg(test)]
mod tests {
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
