//! The cluster behind the API: a scheduler, a kubelet, the workload
//! controllers (Deployment, ReplicaSet, StatefulSet, DaemonSet, Job), the
//! garbage collector and the PodDisruptionBudget status controller. They act
//! through the same API semantics as any client, so a drain on the
//! simulated cluster sees what it would see on a real one: evicted pods
//! terminate after their grace period and their replacements come up on
//! other nodes.
//!
//! This file is the loop (`run`, `reconcile_all`: one pass of every
//! controller over what changed) and what they share; each controller is
//! a room of its own: `kubelet.rs` (with the node lifecycle),
//! `scheduler.rs`, `workloads.rs` (what the workload controllers share),
//! `replicasets.rs`, `deployments.rs`, `statefulsets.rs`,
//! `daemonsets.rs`, `jobs.rs`, `collector.rs` (the garbage collector) and
//! `disruption.rs` (PodDisruptionBudget status).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::api::{DeleteOptions, now_rfc3339};
use crate::selectors::LabelSelector;
use crate::state::Sim;
use crate::store::{ChangeKind, ObjKey, Store};

mod collector;
mod daemonsets;
mod deployments;
mod disruption;
mod jobs;
mod kubelet;
mod replicasets;
mod scheduler;
mod statefulsets;
mod workloads;

use self::{
    collector::*, daemonsets::*, deployments::*, disruption::*, jobs::*, kubelet::*,
    replicasets::*, scheduler::*, statefulsets::*, workloads::*,
};
pub use self::{disruption::pdb_status, kubelet::termination_ends, scheduler::tolerates};

/// Annotations that shape a simulated pod's life.
pub mod annotations {
    /// Seconds (simulated) the pod takes to exit after SIGTERM; default 0.5.
    pub const SHUTDOWN_SECONDS: &str = "sim.nmo.medik8s.io/shutdown-seconds";
    /// `"true"`: the pod never goes away once deleted (a stuck kubelet).
    pub const NEVER_TERMINATE: &str = "sim.nmo.medik8s.io/never-terminate";
    /// `"true"`: the pod's process ignores SIGTERM; the kubelet kills it
    /// when its grace period runs out.
    pub const IGNORE_SIGTERM: &str = "sim.nmo.medik8s.io/ignore-sigterm";
    /// Seconds (simulated) a pod runs before it completes (phase
    /// Succeeded); without it, pods run forever.
    pub const RUN_SECONDS: &str = "sim.nmo.medik8s.io/run-seconds";
    /// Seconds (simulated) a pod takes to become Ready once on a node.
    pub const STARTUP_SECONDS: &str = "sim.nmo.medik8s.io/startup-seconds";
    /// On a Node, `"true"`: no kubelet runs there. The node stays NotReady
    /// (Ready Unknown, as the node controller marks a node whose kubelet
    /// never posted status), nothing is scheduled onto it, and pods bound
    /// to it by name never start (nor finish terminating).
    pub const NO_KUBELET: &str = "sim.nmo.medik8s.io/no-kubelet";
}

/// Runs the controllers until `stop` changes.
pub async fn run(sim: Arc<Sim>, mut stop: watch::Receiver<bool>) {
    let mut state = ControllerState::default();
    loop {
        tokio::select! {
            _ = sim.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = stop.changed() => return,
        }
        // Let a burst of changes land before acting on them.
        tokio::time::sleep(Duration::from_millis(2)).await;
        reconcile_all(&sim, &mut state);
    }
}

/// How often every controller looks at everything, whatever changed (in
/// between, a pass looks at what changed since the last one, at the pods
/// whose time comes, and at the terminating ones).
pub const FULL_PASS_EVERY: Duration = Duration::from_millis(500);

/// What the controllers remember between passes.
#[derive(Default)]
pub struct ControllerState {
    /// When (simulated) each pod was first seen on a node, by uid.
    placed: HashMap<String, f64>,
    /// The resourceVersion the last pass started from.
    seen_rv: Option<u64>,
    /// When the last full pass ran.
    last_full: Option<std::time::Instant>,
    /// Pods (by uid) whose next step comes with time: starting after
    /// their startup delay, completing after their run time.
    timed: HashSet<String>,
    /// Pods (by key) the scheduler could not place last pass.
    unscheduled: HashSet<ObjKey>,
    /// Every uid an object names as its owner (rebuilt by each full
    /// garbage collection, grown by changes in between).
    owners: HashSet<String>,
}

/// What changed since the last pass.
struct Changes {
    /// Look at everything: the first pass, a periodic one, or after
    /// changes the store no longer holds.
    full: bool,
    list: Vec<Arc<crate::store::Change>>,
}

/// The workload kinds, by storage.
const WORKLOADS: &[&str] = &[
    "replicasets.apps",
    "deployments.apps",
    "statefulsets.apps",
    "daemonsets.apps",
    "jobs.batch",
];

impl Changes {
    fn since(sim: &Sim, state: &mut ControllerState) -> Changes {
        let store = sim.store();
        let due = state
            .last_full
            .is_none_or(|t| t.elapsed() >= FULL_PASS_EVERY);
        let list = match state.seen_rv {
            Some(seen) if !due => store.changes_since(seen),
            _ => None,
        };
        state.seen_rv = Some(store.rv());
        match list {
            Some(list) => Changes { full: false, list },
            None => {
                state.last_full = Some(std::time::Instant::now());
                Changes {
                    full: true,
                    list: Vec::new(),
                }
            }
        }
    }

    fn touched(&self, storage: &str) -> bool {
        self.full || self.list.iter().any(|c| c.storage == storage)
    }

    /// A change the workload controllers act on: to a workload, to a node
    /// (DaemonSets), or to a pod a controller owns.
    fn for_workloads(&self) -> bool {
        self.full
            || self.list.iter().any(|c| {
                WORKLOADS.contains(&c.storage.as_str())
                    || c.storage == "nodes"
                    || (c.storage == "pods"
                        && (controller_uid(&c.object).is_some()
                            || c.old.as_deref().and_then(controller_uid).is_some()))
            })
    }

    /// A change a PodDisruptionBudget's status follows: to a budget, to a
    /// workload (its scale), or to a pod a budget selects.
    fn for_budgets(&self, sim: &Sim) -> bool {
        let budgets = sim.store().list("poddisruptionbudgets.policy", None);
        if budgets.is_empty() {
            return false;
        }
        if self.full {
            return true;
        }
        let selectors: Vec<(&str, LabelSelector)> = budgets
            .iter()
            .map(|b| {
                (
                    b["metadata"]["namespace"].as_str().unwrap_or_default(),
                    LabelSelector::from_object(&b["spec"]["selector"]).unwrap_or_default(),
                )
            })
            .collect();
        let selected = |pod: &Value| {
            selectors.iter().any(|(ns, sel)| {
                pod["metadata"]["namespace"].as_str() == Some(*ns)
                    && !sel.is_empty()
                    && sel.matches(&pod["metadata"]["labels"])
            })
        };
        self.list.iter().any(|c| {
            c.storage == "poddisruptionbudgets.policy"
                || WORKLOADS.contains(&c.storage.as_str())
                || (c.storage == "pods"
                    && (selected(&c.object) || c.old.as_deref().is_some_and(selected)))
        })
    }

    /// A change that may leave an object without its owners: an owner
    /// deleted, or an object naming owners none of which exists.
    fn may_orphan(&self, sim: &Sim, state: &mut ControllerState) -> bool {
        if self.full {
            return true;
        }
        let store = sim.store();
        let mut orphan = false;
        for c in &self.list {
            let uid = c.object["metadata"]["uid"].as_str().unwrap_or_default();
            if c.kind == ChangeKind::Deleted {
                orphan |= state.owners.contains(uid);
                continue;
            }
            let Some(refs) = c.object["metadata"]["ownerReferences"].as_array() else {
                continue;
            };
            let uids: Vec<&str> = refs.iter().filter_map(|r| r["uid"].as_str()).collect();
            state.owners.extend(uids.iter().map(|u| (*u).to_owned()));
            orphan |= !uids.is_empty() && uids.iter().all(|u| store.by_uid(u).is_none());
        }
        orphan
    }
}

/// One pass of every controller, each over what changed for it.
pub fn reconcile_all(sim: &Sim, state: &mut ControllerState) {
    let changes = Changes::since(sim, state);
    let paused = sim.faults().kubelet_paused;
    if changes.touched("nodes") {
        node_lifecycle(sim);
    }
    if paused {
        // What changed meanwhile is looked at once the kubelet runs again.
        state.last_full = None;
    } else {
        kubelet(sim, state, &changes);
    }
    scheduler(sim, state, &changes);
    if changes.for_workloads() {
        deployments(sim);
        replicasets(sim);
        statefulsets(sim);
        daemonsets(sim);
        jobs(sim);
    }
    if changes.may_orphan(sim, state) {
        garbage_collect(sim, state);
    }
    if changes.for_budgets(sim) {
        pdb_statuses(sim);
    }
}

fn pods_type(sim: &Sim) -> crate::resources::ResourceType {
    sim.find_type("", "v1", "pods").expect("built in")
}

fn is_terminating(o: &Value) -> bool {
    !o["metadata"]["deletionTimestamp"].is_null()
}

fn is_finished(p: &Value) -> bool {
    matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

/// The pod's Ready condition is True.
pub fn is_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn annotation_f64(p: &Value, key: &str) -> Option<f64> {
    p["metadata"]["annotations"][key].as_str()?.parse().ok()
}

fn controller_uid(o: &Value) -> Option<&str> {
    o["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"].as_bool() == Some(true))?["uid"]
        .as_str()
}

fn owner_ref(owner: &Value, api_version: &str, kind: &str) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": true,
        "blockOwnerDeletion": true,
    })
}
