//! What one drain attempt shares with the mechanisms it calls (`surge/`,
//! `handshake.rs`): the pods it acts on, its state, what removing a pod
//! needs, the notes it leaves for events, and how long it waits before
//! trying again. The executor itself is `drain.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::budgets::{Budgets, Permit, Timings, Via};
use super::ledger::Ledger;
use crate::controller::metrics::ControllerMetrics;
use crate::crd::PodReference;
use crate::policy::Action;

/// Something the drain did that the maintenance's events tell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Note {
    /// A pod removed by force (deleted, or with grace period 0), by the
    /// policy's rule.
    Forced {
        pod: PodReference,
        how: String,
        rule: String,
    },
    /// A surge's replacement is Ready; the owner now removes the pod.
    Surged { pod: PodReference, owner: String },
    /// A surge could not be made; the pod is evicted instead.
    SurgeFellBack { pod: PodReference, why: String },
    /// The application was asked to leave, by this deadline (RFC 3339).
    Notified { pod: PodReference, deadline: String },
}

impl Note {
    /// What the note says, short of the policy's words: the pod as
    /// `namespace/name` and, for a forced removal, how it was removed. A
    /// note is said once per subject and interval, however many attempts
    /// repeat it; a step up a ladder (deleted, then with grace period 0)
    /// is a new subject.
    pub fn subject(&self) -> String {
        let key = |pod: &PodReference| format!("{}/{}", pod.namespace, pod.name);
        match self {
            Note::Forced { pod, how, .. } => format!("{} {how}", key(pod)),
            Note::Surged { pod, .. }
            | Note::SurgeFellBack { pod, .. }
            | Note::Notified { pod, .. } => key(pod),
        }
    }
}

/// Where the drain's notes go.
pub(crate) type Notes = tokio::sync::mpsc::UnboundedSender<Note>;

/// The longest wait after a PodDisruptionBudget refusal before evicting
/// again (kubectl drain's fixed wait; here the fallback when the budget's
/// watch shows no change).
pub(crate) const PDB_RETRY: Duration = Duration::from_secs(5);
/// The shortest wait after a refusal before evicting again, however soon
/// the budget changes.
pub(crate) const PDB_MIN_RETRY: Duration = Duration::from_millis(250);

/// How long the drain waits before trying a pod again.
#[derive(Debug, Clone)]
pub struct Retries {
    /// After an eviction a PodDisruptionBudget refused (a 429): at the
    /// latest (the budget's watch may allow it sooner).
    pub pdb: Duration,
    /// After a refusal: at the soonest.
    pub pdb_min: Duration,
    /// After another API error, and before watching again.
    pub api_error: Duration,
}

impl Default for Retries {
    fn default() -> Self {
        Retries {
            pdb: PDB_RETRY,
            pdb_min: PDB_MIN_RETRY,
            api_error: ERROR_RETRY,
        }
    }
}
/// Wait after any other failed eviction.
pub(crate) const ERROR_RETRY: Duration = Duration::from_secs(1);
impl Retries {
    pub(in crate::controller) fn budget_timings(&self) -> Timings {
        Timings {
            fallback: self.pdb,
            min_interval: self.pdb_min.min(self.pdb),
        }
    }
}

/// A pod the plan acts on.
#[derive(Clone)]
pub(in crate::controller) struct Target {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Its controlling owner: (kind, name).
    pub controller: Option<(String, String)>,
    /// Why its controller reference cannot be followed, if it cannot
    /// (the workloads' bounded reader): no request is made for it.
    pub unreadable: Option<String>,
    pub action: Action,
}

impl Target {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn reference(&self) -> PodReference {
        PodReference {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// Shared state of one attempt.
pub(in crate::controller) struct Attempt {
    /// uids still on the node (for a `wait`: still running).
    pub present: Mutex<HashSet<String>>,
    /// uids the plan waits to complete: a finished phase counts as gone.
    pub waits: HashSet<String>,
    /// The annotations of the pods in a handshake, as last watched.
    pub annotations: std::sync::Mutex<HashMap<String, BTreeMap<String, String>>>,
    /// uids whose last eviction was refused by a PDB.
    pub pdb_blocked: Mutex<HashSet<String>>,
    /// uids whose eviction or deletion the API server accepted in this
    /// attempt (the drain then waits for them to go).
    pub accepted: Mutex<HashSet<String>>,
    /// What the drain waits for, pod by pod (`namespace/name` to the uid
    /// and the text): the status shows the first pod's that is still on
    /// the node, so several pods waiting at once show one steady text,
    /// not whichever spoke last.
    pub said: Mutex<BTreeMap<String, (String, String)>>,
    pub evicted: std::sync::atomic::AtomicUsize,
    pub deleted: std::sync::atomic::AtomicUsize,
    pub changed: tokio::sync::Notify,
}

impl Attempt {
    /// The state of an attempt over the listed `pods`: every pod present
    /// but one the plan waits for that has finished already.
    pub fn start(pods: &[Pod], targets: &[(u32, Target)]) -> Attempt {
        let finished: HashSet<String> = pods
            .iter()
            .filter(|p| is_finished(p))
            .filter_map(|p| p.uid())
            .collect();
        let waits: HashSet<String> = targets
            .iter()
            .filter(|(_, t)| matches!(t.action, Action::Wait { .. }))
            .map(|(_, t)| t.uid.clone())
            .collect();
        Attempt {
            present: Mutex::new(
                pods.iter()
                    .filter_map(|p| p.uid())
                    .filter(|uid| !(waits.contains(uid) && finished.contains(uid)))
                    .collect(),
            ),
            annotations: std::sync::Mutex::new(
                targets
                    .iter()
                    .filter(|(_, t)| matches!(t.action, Action::Notify(_)))
                    .map(|(_, t)| (t.uid.clone(), t.annotations.clone()))
                    .collect(),
            ),
            waits,
            pdb_blocked: Mutex::new(HashSet::new()),
            accepted: Mutex::new(HashSet::new()),
            said: Mutex::new(BTreeMap::new()),
            evicted: Default::default(),
            deleted: Default::default(),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// Whether the pod `uid` is still there.
    pub async fn has(&self, uid: &str) -> bool {
        self.present.lock().await.contains(uid)
    }

    /// What the drain waits for on pod `t` now. Wakes the drain's waiters
    /// only when what the status shows changes (saying it wakes the one
    /// who said it too).
    pub async fn waiting_for(&self, t: &Target, what: String) {
        let mut said = self.said.lock().await;
        let before = self.first_present(&said).await;
        said.insert(t.key(), (t.uid.clone(), what));
        if self.first_present(&said).await != before {
            self.changed.notify_waiters();
        }
    }

    /// Pod `t` waits for nothing more (it was removed).
    pub(crate) async fn waiting_over(&self, t: &Target) {
        self.said.lock().await.remove(&t.key());
    }

    /// What the drain waits for, as the status shows it: the first pod's
    /// text (by namespace and name) of those still on the node; empty
    /// when none.
    pub async fn waiting(&self) -> String {
        let said = self.said.lock().await;
        self.first_present(&said).await
    }

    async fn first_present(&self, said: &BTreeMap<String, (String, String)>) -> String {
        let present = self.present.lock().await;
        said.values()
            .find(|(uid, _)| present.contains(uid))
            .map(|(_, what)| what.clone())
            .unwrap_or_default()
    }
}

/// What removing one pod needs.
#[derive(Clone, Copy)]
pub(in crate::controller) struct Removal<'a> {
    pub client: &'a Client,
    pub deadline: Instant,
    pub retries: &'a Retries,
    pub metrics: &'a ControllerMetrics,
    pub budgets: &'a Budgets,
    /// The removal requests every drain of the process shares.
    pub in_flight: &'a tokio::sync::Semaphore,
    pub ledger: &'a Ledger,
    pub notes: &'a Notes,
    pub maintenance: &'a str,
}

/// A pod whose phase is Succeeded or Failed.
pub(in crate::controller) fn is_finished(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
}

impl<'a> Removal<'a> {
    /// Waits until the pod's budgets allow its removal `via` (`None`: the
    /// attempt's time ran out first). Every removal of a pod passes here
    /// (the one gate): `host/tests/layers.rs` checks that no request that
    /// removes a pod is sent from a function without a permit.
    pub(in crate::controller) async fn budget_permit(
        self,
        via: Via,
        t: &Target,
    ) -> Option<Permit<'a>> {
        self.budgets
            .permit(
                via,
                &t.namespace,
                &t.name,
                &t.labels,
                self.retries.budget_timings(),
                self.deadline,
            )
            .await
    }
}
