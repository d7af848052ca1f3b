//! The drain executor: carries out a validated plan, wave by wave, with
//! evictions through the Eviction API (paced by the PodDisruptionBudgets'
//! watch, see `budgets.rs`: sent when a budget has room, a refusal asked
//! again when the budget changes, at the latest after kubectl's 5 s),
//! deletes where the policy says delete, bounded concurrency, and pod
//! disappearance observed by kube-runtime's watcher on the node's pods
//! (the same list the plan is made from, then its watch).
//!
//! Contract 0.3's actions have their own modules: `surge.rs`
//! (make-before-break through the owning ReplicaSet or Deployment) and
//! `handshake.rs` (ask the application first), sharing `attempt.rs` (the
//! attempt's state and targets) with this executor; `wait` is the watch
//! counting a finished pod as gone.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use super::attempt::{Attempt, Removal, Target};
pub use super::attempt::{ERROR_RETRY, Note, Notes, PDB_MIN_RETRY, PDB_RETRY, Retries};
use super::budgets::{Budgets, Permit};
use super::ledger::Ledger;
use super::metrics::{ControllerMetrics, PodOutcome};
use crate::crd::PodReference;
use crate::error::{Error, Result};
use crate::policy::{Action, Plan, Removal as HowRemoved};

/// How often at most the drain reports that fewer pods are left (the
/// status is written at most every 250 ms anyway).
const REPORT_EVERY: Duration = Duration::from_millis(100);
/// Removals in flight at once when the policy sets no limit (and the most
/// a policy may ask for): each one in flight holds a connection to the API
/// server, and more than this only makes the server's queue longer.
pub const HOST_MAX_CONCURRENT: usize = 64;

/// How a drain attempt ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Pods the plan removes that are still on the node.
    pub pending: Vec<PodReference>,
    /// The subset of `pending` whose last eviction got a 429.
    pub pdb_blocked: Vec<PodReference>,
    /// Pods the plan blocks on that are still on the node.
    pub blocked: Vec<PodReference>,
    /// The attempt timeout ran out.
    pub timed_out: bool,
    /// The error the attempt ended with ("" when complete).
    pub message: String,
    /// The attempt was stopped because the maintenance no longer wants it
    /// (deleted, or moved to another node).
    pub cancelled: bool,
    /// Pods the plan waits for (`wait`) still running when their wait ran
    /// out.
    pub waited: Vec<PodReference>,
    /// Evictions / deletions that the API accepted in this attempt.
    pub evicted: usize,
    pub deleted: usize,
}

impl Outcome {
    pub fn complete(&self) -> bool {
        self.pending.is_empty() && self.blocked.is_empty() && self.waited.is_empty()
    }
}

/// How a drain attempt is going.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    /// Pods the drain waits for that are still on the node: those the
    /// plan removes, and those it blocks on.
    pub pending: Vec<PodReference>,
    /// What the drain waits for: the last eviction refused (a
    /// PodDisruptionBudget's 429, an API error), if any.
    pub waiting: Option<String>,
}

type PodEvents = BoxStream<'static, watcher::Result<watcher::Event<Pod>>>;

/// A node's pods: listed (a quorum read, as `kubectl drain` lists), with
/// the watch that follows that list ready to go on. The plan is made from
/// the list; the drain then follows the watch.
pub struct NodePods {
    node: String,
    /// Shared with the policy's decision (handed over, not copied).
    pods: Arc<[Pod]>,
    events: PodEvents,
}

impl NodePods {
    /// Lists the pods on `node` through kube-runtime's watcher (which
    /// relists by itself after a lost watch or a 410 Gone).
    pub async fn list(client: &Client, node: &str) -> Result<NodePods> {
        let mut config = watcher::Config::default()
            .fields(&format!("spec.nodeName={node}"))
            .timeout(crate::client::WATCH_TIMEOUT_SECS);
        // One list, as `kubectl drain` makes it: a node holds a few hundred
        // pods at most, and pages would cost a round trip each.
        config.page_size = None;
        let mut events: PodEvents = watcher(Api::<Pod>::all(client.clone()), config).boxed();
        let mut pods = Vec::new();
        while let Some(event) = events.next().await {
            match event.map_err(|e| Error::Watch {
                op: "listing the node's pods",
                source: e,
            })? {
                watcher::Event::Init => pods.clear(),
                watcher::Event::InitApply(p) => pods.push(p),
                watcher::Event::InitDone => break,
                watcher::Event::Apply(_) | watcher::Event::Delete(_) => {}
            }
        }
        Ok(NodePods {
            node: node.to_owned(),
            pods: pods.into(),
            events,
        })
    }

    /// The pods, as listed.
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    /// The pods, as listed, to hand to a policy decision without a copy.
    pub fn shared(&self) -> Arc<[Pod]> {
        self.pods.clone()
    }
}

/// What a drain needs besides the plan.
#[derive(Clone, Copy)]
pub struct Drainer<'a> {
    pub client: &'a Client,
    pub retries: &'a Retries,
    pub metrics: &'a ControllerMetrics,
    /// The budgets' watch every drain of the process shares.
    pub budgets: &'a Arc<Budgets>,
    /// The removal requests every drain of the process shares: a request
    /// is sent only with one of its permits.
    pub in_flight: &'a Arc<Semaphore>,
    /// The maintenance's pod ledger (refusals, handshakes).
    pub ledger: &'a Arc<Ledger>,
    /// Where notes for the maintenance's events go.
    pub notes: &'a Notes,
    /// The maintenance's name (the requester of a handshake, the holder of
    /// a surge).
    pub maintenance: &'a str,
    /// The owners being surged, shared by every drain of the process.
    pub desks: &'a Arc<super::surge::Desks>,
}

/// Runs one drain attempt of `plan` over the `listed` pods (the list the
/// plan was made from). `on_progress` is called with the pods still
/// pending whenever that set shrinks, and with what the drain waits for
/// (the last refused eviction) whenever that changes; `cancelled` is asked at least every
/// 500 ms and ends the attempt early when it says so.
pub async fn execute(
    drainer: Drainer<'_>,
    listed: NodePods,
    plan: &Plan,
    on_progress: impl Fn(Progress) + Send + Sync,
    cancelled: impl Fn() -> bool + Send + Sync,
) -> Outcome {
    let Drainer {
        client,
        retries,
        metrics,
        budgets,
        in_flight,
        ledger,
        notes,
        maintenance,
        desks,
    } = drainer;
    let NodePods { node, pods, events } = listed;
    let node = node.as_str();
    let started = Instant::now();
    let deadline = started + plan.attempt_timeout;
    let targets: Vec<(u32, Target)> = plan
        .steps
        .iter()
        .map(|s| {
            let p = &pods[s.pod];
            let controller = p
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| (o.kind.clone(), o.name.clone()));
            (
                s.order,
                Target {
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    uid: p.uid().unwrap_or_default(),
                    labels: p.labels().clone(),
                    annotations: p.annotations().clone(),
                    controller,
                    action: s.action.clone(),
                },
            )
        })
        .collect();
    // A pod the plan waits for that has finished already is done.
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
    let state = Arc::new(Attempt {
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
        said: Mutex::new(std::collections::BTreeMap::new()),
        evicted: Default::default(),
        deleted: Default::default(),
        changed: tokio::sync::Notify::new(),
    });
    let watch = crate::task::spawn(follow(events, state.clone()));
    let limit = plan
        .max_concurrent_evictions
        .map_or(HOST_MAX_CONCURRENT, |n| {
            (n.get() as usize).min(HOST_MAX_CONCURRENT)
        });
    let semaphore = Arc::new(Semaphore::new(limit));
    let removals: Vec<&Target> = targets
        .iter()
        .filter(|(_, t)| t.action.removes())
        .map(|(_, t)| t)
        .collect();
    // What the drain waits for: the pods it removes, those it waits to
    // complete, and those it blocks on (someone else has to move them),
    // while they are on the node.
    let waited: Vec<&Target> = targets
        .iter()
        .filter(|(_, t)| t.action.awaited())
        .map(|(_, t)| t)
        .collect();
    // When each `wait` runs out.
    let wait_until = |t: &Target| match &t.action {
        Action::Wait { timeout, .. } => Some(started + *timeout),
        _ => None,
    };
    let report = |present: &HashSet<String>| -> Vec<PodReference> {
        waited
            .iter()
            .filter(|t| present.contains(&t.uid))
            .map(|t| t.reference())
            .collect()
    };

    let mut timed_out = false;
    let mut stopped = false;
    let mut last_reported: Option<(usize, String)> = None;
    let mut last_report_at = Instant::now();
    let mut waves: Vec<u32> = targets.iter().map(|(o, _)| *o).collect();
    waves.dedup();
    'waves: for wave in waves {
        let wave_targets: Vec<Target> = targets
            .iter()
            .filter(|(o, t)| {
                *o == wave && (t.action.removes() || matches!(t.action, Action::Wait { .. }))
            })
            .map(|(_, t)| t.clone())
            .collect();
        let wave_waits_until = wave_targets.iter().filter_map(wait_until).min();
        let mut tasks = Vec::new();
        for t in wave_targets.iter().filter(|t| t.action.removes()) {
            let t = t.clone();
            let client = client.clone();
            let state = state.clone();
            let semaphore = semaphore.clone();
            let retries = retries.clone();
            let metrics = metrics.clone();
            let budgets = budgets.clone();
            let in_flight = in_flight.clone();
            let ledger = ledger.clone();
            let notes = notes.clone();
            let maintenance = maintenance.to_owned();
            let desks = desks.clone();
            tasks.push(crate::task::spawn(async move {
                let _slot = semaphore.acquire_owned().await;
                let how = Removal {
                    client: &client,
                    deadline,
                    retries: &retries,
                    metrics: &metrics,
                    budgets: &budgets,
                    in_flight: &in_flight,
                    ledger: &ledger,
                    notes: &notes,
                    maintenance: &maintenance,
                    desks: &desks,
                };
                remove(how, &t, &state).await;
            }));
        }
        // Wait for this wave's pods to be gone, reporting progress (at
        // most every REPORT_EVERY, and at once when the wave is over or
        // what the drain waits for changes).
        loop {
            let notified = state.changed.notified();
            let (count, wave_done) = {
                let present = state.present.lock().await;
                (
                    waited.iter().filter(|t| present.contains(&t.uid)).count(),
                    wave_targets.iter().all(|t| !present.contains(&t.uid)),
                )
            };
            let waiting = state.waiting().await;
            let now = Some((count, waiting.clone()));
            let urgent = wave_done || last_reported.as_ref().is_none_or(|(_, w)| *w != waiting);
            let mut report_due = now != last_reported;
            if report_due && (urgent || Instant::now() >= last_report_at + REPORT_EVERY) {
                let pending = report(&*state.present.lock().await);
                last_reported = now;
                last_report_at = Instant::now();
                report_due = false;
                on_progress(Progress {
                    pending,
                    waiting: (!waiting.is_empty()).then_some(waiting),
                });
            }
            if wave_done {
                break;
            }
            // Every removal of the wave is done, and a pod it waits to
            // complete is still running past its wait: the attempt ends
            // (not a timeout) and the policy decides again.
            let (removals_done, expired) = {
                let present = state.present.lock().await;
                let now = Instant::now();
                (
                    wave_targets
                        .iter()
                        .filter(|t| t.action.removes())
                        .all(|t| !present.contains(&t.uid)),
                    wave_targets.iter().any(|t| {
                        present.contains(&t.uid) && wait_until(t).is_some_and(|u| u <= now)
                    }),
                )
            };
            if removals_done && expired {
                drop(tasks);
                break 'waves;
            }
            let over = Instant::now() >= deadline;
            if over || cancelled() {
                timed_out = over;
                stopped = !over;
                drop(tasks);
                break 'waves;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = tokio::time::sleep_until(wave_waits_until.unwrap_or(deadline)) => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = tokio::time::sleep_until(last_report_at + REPORT_EVERY), if report_due => {}
            }
        }
        for t in tasks {
            let _ = t.join().await;
        }
    }
    drop(watch);

    for (_, t) in &targets {
        match t.action {
            Action::Skip { .. } => metrics.pod_removal(PodOutcome::Skipped),
            Action::Block { .. } => metrics.pod_removal(PodOutcome::Blocked),
            _ => {}
        }
    }
    let present = state.present.lock().await.clone();
    let pdb = state.pdb_blocked.lock().await.clone();
    let pending: Vec<&Target> = removals
        .iter()
        .copied()
        .filter(|t| present.contains(&t.uid))
        .collect();
    let blocked: Vec<PodReference> = targets
        .iter()
        .filter(|(_, t)| matches!(t.action, Action::Block { .. }) && present.contains(&t.uid))
        .map(|(_, t)| t.reference())
        .collect();
    let still_running: Vec<&Target> = targets
        .iter()
        .filter(|(_, t)| matches!(t.action, Action::Wait { .. }) && present.contains(&t.uid))
        .map(|(_, t)| t)
        .collect();
    ledger.attempt_ended(
        waited
            .iter()
            .filter(|t| present.contains(&t.uid))
            .map(|t| t.uid.as_str()),
    );
    let mut message = String::new();
    let accepted = state.accepted.lock().await.clone();
    if timed_out && !pending.is_empty() {
        // The Go operator's text where the situation is the same (tools
        // parse it): kubectl's drain errors of the pods left, aggregated.
        message = timed_out_text(&pending, &accepted, plan.attempt_timeout);
    } else if !pending.is_empty() {
        let pdb_count = pending.iter().filter(|t| pdb.contains(&t.uid)).count();
        message = format!(
            "drain did not complete{}: {} pod(s) still on node {node}{}",
            if timed_out {
                format!(" within {:?}", plan.attempt_timeout)
            } else {
                String::new()
            },
            pending.len(),
            if pdb_count > 0 {
                format!(", {pdb_count} refused by a PodDisruptionBudget")
            } else {
                String::new()
            }
        );
        let last = state.waiting().await;
        if !last.is_empty() {
            message.push_str(&format!(" (last error: {last})"));
        }
    } else if let Some((t, reason)) = targets.iter().find_map(|(_, t)| match &t.action {
        Action::Block { reason } if present.contains(&t.uid) => Some((t, reason)),
        _ => None,
    }) {
        message = format!("pod {}/{} blocks the drain: {reason}", t.namespace, t.name);
    } else if let Some(t) = still_running.first() {
        let (timeout, reason) = match &t.action {
            Action::Wait { timeout, reason } => (*timeout, reason.as_str()),
            _ => (Duration::ZERO, ""),
        };
        message = format!(
            "waited {} for pod {}/{} to complete ({reason}); it still runs{}",
            crate::text::duration(timeout),
            t.namespace,
            t.name,
            if still_running.len() > 1 {
                format!(", with {} other(s)", still_running.len() - 1)
            } else {
                String::new()
            }
        );
    }
    Outcome {
        pdb_blocked: pending
            .iter()
            .filter(|t| pdb.contains(&t.uid))
            .map(|t| t.reference())
            .collect(),
        pending: pending.iter().map(|t| t.reference()).collect(),
        blocked,
        waited: still_running.iter().map(|t| t.reference()).collect(),
        timed_out,
        message,
        cancelled: stopped,
        evicted: state.evicted.load(std::sync::atomic::Ordering::Relaxed),
        deleted: state.deleted.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Takes one pod off the node as its action says: a surge or a handshake
/// first where the plan asks for one, then an eviction or a deletion.
async fn remove(how: Removal<'_>, t: &Target, state: &Attempt) {
    let (delete, removal) = match &t.action {
        Action::Evict(r) => (false, r.clone()),
        Action::Delete(r) => (true, r.clone()),
        Action::Surge(r) => match super::surge::replace(how, t, state).await {
            super::surge::Surged::Done => return,
            super::surge::Surged::Evict(why) => {
                tracing::warn!(logger = "drain", pod = %t.key(), reason = %why, "surge not possible; evicting");
                let _ = how.notes.send(Note::SurgeFellBack {
                    pod: t.reference(),
                    why,
                });
                (false, r.clone())
            }
        },
        Action::Notify(n) => {
            if !super::handshake::ask(how, t, state, n).await {
                return;
            }
            (n.then_delete, n.removal.clone())
        }
        Action::Skip { .. } | Action::Block { .. } | Action::Wait { .. } => return,
    };
    evict_or_delete(how, t, state, delete, &removal).await;
}

/// Evicts or deletes one pod, retrying until accepted, gone, or the
/// deadline. An eviction waits for its budgets' permit first.
pub(super) async fn evict_or_delete(
    how: Removal<'_>,
    t: &Target,
    state: &Attempt,
    delete: bool,
    removal: &HowRemoved,
) {
    let Removal {
        client,
        deadline,
        retries,
        metrics,
        budgets,
        in_flight,
        ledger,
        notes,
        ..
    } = how;
    let api: Api<Pod> = Api::namespaced(client.clone(), &t.namespace);
    let preconditions = Preconditions {
        uid: Some(t.uid.clone()),
        resource_version: None,
    };
    let mut dp = DeleteParams::default().preconditions(preconditions);
    dp.grace_period_seconds = removal.grace_period_seconds.map(|g| g as u32);
    loop {
        if !state.present.lock().await.contains(&t.uid) {
            return;
        }
        let (result, permit): (kube::Result<()>, Option<Permit<'_>>) = if delete {
            let Some(_sending) = sending(in_flight, deadline).await else {
                return;
            };
            (api.delete(&t.name, &dp).await.map(|_| ()), None)
        } else {
            let timings = retries.budget_timings();
            let Some(permit) = budgets
                .permit(&t.namespace, &t.name, &t.labels, timings, deadline)
                .await
            else {
                // The attempt's time ran out waiting for its budget.
                state.pdb_blocked.lock().await.insert(t.uid.clone());
                return;
            };
            if !state.present.lock().await.contains(&t.uid) {
                return;
            }
            let params = EvictParams {
                delete_options: Some(dp.clone()),
                ..Default::default()
            };
            let Some(_sending) = sending(in_flight, deadline).await else {
                permit.failed();
                return;
            };
            let result = api.evict(&t.name, &params).await.map(|_| ());
            (result, Some(permit))
        };
        let wait = match result {
            Ok(()) => {
                if let Some(p) = permit {
                    p.accepted();
                }
                if removal.forced(delete) {
                    let _ = notes.send(Note::Forced {
                        pod: t.reference(),
                        how: forced_how(delete, removal.grace_period_seconds),
                        rule: removal.rule.clone(),
                    });
                }
                removed(t, state, metrics, delete).await;
                return;
            }
            // Gone already, or a replacement with the same name: done.
            Err(kube::Error::Api(e))
                if e.code == 404 || (e.code == 409 && e.message.contains("Precondition")) =>
            {
                state.present.lock().await.remove(&t.uid);
                state.changed.notify_waiters();
                return;
            }
            Err(kube::Error::Api(e)) if e.code == 429 => {
                metrics.pod_removal(PodOutcome::Pdb429);
                ledger.refused(&t.uid);
                state.pdb_blocked.lock().await.insert(t.uid.clone());
                state
                    .waiting_for(
                        t,
                        format!("evicting pod {}/{}: {}", t.namespace, t.name, e.message),
                    )
                    .await;
                // A budget the watch knows: its permit is the wait (the
                // budget changing, or the fallback); otherwise kubectl's.
                match permit {
                    Some(p) if p.gated() => {
                        p.refused();
                        Duration::ZERO
                    }
                    _ => retries.pdb,
                }
            }
            // A conflict: another eviction (or a controller) updated the
            // pod's budget at the same moment. Nothing for a user to do:
            // tried again, said in words rather than the API's raw
            // "Operation cannot be fulfilled ... the object has been
            // modified".
            Err(kube::Error::Api(e)) if e.code == 409 => {
                if let Some(p) = permit {
                    p.failed();
                }
                metrics.pod_removal(PodOutcome::Error);
                state.waiting_for(t, format!(
                    "evicting pod {}/{}: changed by another writer at the same moment (its budget, most likely); trying again",
                    t.namespace, t.name
                )).await;
                retries.api_error
            }
            Err(e) => {
                if let Some(p) = permit {
                    p.failed();
                }
                metrics.pod_removal(PodOutcome::Error);
                state
                    .waiting_for(
                        t,
                        format!(
                            "evicting pod {}/{}: {}",
                            t.namespace,
                            t.name,
                            crate::text::api_error(&e)
                        ),
                    )
                    .await;
                retries.api_error
            }
        };
        if Instant::now() + wait >= deadline {
            return;
        }
        tokio::time::sleep(wait).await;
    }
}

/// What kubectl's drain (the Go operator's) says of an attempt that ran
/// out of time with `pending` pods left: for a pod whose removal was
/// accepted, that waiting for it to go timed out; for one never accepted
/// (refused by its budget, or never sent while the budget had no room),
/// that the global timeout was reached evicting it. One error alone as it
/// is, several (distinct) in brackets, comma-separated, as Go's
/// `utilerrors.NewAggregate` writes them.
pub(super) fn timed_out_text(
    pending: &[&Target],
    accepted: &HashSet<String>,
    timeout: Duration,
) -> String {
    let mut errors: Vec<String> = Vec::new();
    for t in pending {
        let error = if accepted.contains(&t.uid) {
            format!(
                "error when waiting for pod \"{}\" in namespace \"{}\" to terminate: context deadline exceeded",
                t.name, t.namespace
            )
        } else {
            format!(
                "error when evicting pods/\"{}\" -n \"{}\": global timeout reached: {}",
                t.name,
                t.namespace,
                crate::text::go_duration(timeout)
            )
        };
        if !errors.contains(&error) {
            errors.push(error);
        }
    }
    match errors.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// One of the removal requests the whole process may have in flight,
/// waited for until `deadline` at most (`None`: the attempt's time ran
/// out first).
async fn sending(
    in_flight: &Semaphore,
    deadline: Instant,
) -> Option<tokio::sync::SemaphorePermit<'_>> {
    tokio::select! {
        permit = in_flight.acquire() => permit.ok(),
        () = tokio::time::sleep_until(deadline) => None,
    }
}

/// How a forced removal went, for its event.
fn forced_how(delete: bool, grace: Option<i64>) -> String {
    match (delete, grace) {
        (true, Some(g)) => {
            format!("deleted with grace period {g} s, bypassing PodDisruptionBudgets")
        }
        (true, None) => "deleted, bypassing PodDisruptionBudgets".into(),
        (false, _) => "evicted with grace period 0 s".into(),
    }
}

/// A pod whose phase is Succeeded or Failed.
fn is_finished(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
}

/// Counts a removal the API server accepted.
pub(super) async fn removed(
    t: &Target,
    state: &Attempt,
    metrics: &ControllerMetrics,
    delete: bool,
) {
    let (counter, outcome) = if delete {
        (&state.deleted, PodOutcome::Deleted)
    } else {
        (&state.evicted, PodOutcome::Evicted)
    };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    metrics.pod_removal(outcome);
    state.pdb_blocked.lock().await.remove(&t.uid);
    state.accepted.lock().await.insert(t.uid.clone());
    // What the drain waited for on this pod is over.
    state.waiting_over(t).await;
    tracing::info!(logger = "drain", pod = %format!("{}/{}", t.namespace, t.name), "pod removed from node");
}

/// Follows the node's pods and removes from `present` every uid that goes:
/// deleted while watched, or absent from a relist (the watcher relists by
/// itself when the watch is lost; its errors are retried with its
/// back-off).
async fn follow(events: PodEvents, state: Arc<Attempt>) {
    // The events that have arrived are taken together: a kubelet that
    // removes a hundred pods at once makes one change here, not a hundred.
    let mut events = std::pin::pin!(events.default_backoff().ready_chunks(1024));
    let mut relisted: HashSet<String> = HashSet::new();
    while let Some(batch) = events.next().await {
        let mut gone: Vec<String> = Vec::new();
        let mut changed = false;
        for event in batch {
            match event {
                Ok(watcher::Event::Delete(p)) => gone.extend(p.uid()),
                Ok(watcher::Event::Init) => relisted.clear(),
                Ok(watcher::Event::InitApply(p)) => relisted.extend(p.uid()),
                Ok(watcher::Event::InitDone) => {
                    let present = state.present.lock().await;
                    gone.extend(
                        present
                            .iter()
                            .filter(|uid| !relisted.contains(*uid))
                            .cloned(),
                    );
                }
                Ok(watcher::Event::Apply(p)) => {
                    let Some(uid) = p.uid() else { continue };
                    if state.waits.contains(&uid) && is_finished(&p) {
                        gone.push(uid);
                        continue;
                    }
                    let mut watched = state.annotations.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(a) = watched.get_mut(&uid)
                        && a != p.annotations()
                    {
                        *a = p.annotations().clone();
                        changed = true;
                    }
                }
                Err(_) => {}
            }
        }
        if changed {
            state.changed.notify_waiters();
        }
        if gone.is_empty() {
            continue;
        }
        let mut present = state.present.lock().await;
        for uid in &gone {
            present.remove(uid);
        }
        state.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &str) -> Target {
        Target {
            namespace: "demo".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            labels: Default::default(),
            annotations: Default::default(),
            controller: None,
            action: Action::Evict(Default::default()),
        }
    }

    /// A pod the budget held back (never accepted) is not one the drain
    /// waited for: kubectl's text says the eviction timed out, and names
    /// the waited-for pod only when its eviction was accepted.
    #[test]
    fn timed_out_text_names_what_happened_to_each_pod() {
        let (a, b) = (target("web-a"), target("web-b"));
        let none = HashSet::new();
        let t = Duration::from_secs(30);
        assert_eq!(
            timed_out_text(&[&a], &none, t),
            "error when evicting pods/\"web-a\" -n \"demo\": global timeout reached: 30s"
        );
        let accepted: HashSet<String> = [a.uid.clone()].into();
        assert_eq!(
            timed_out_text(&[&a, &b], &accepted, t),
            "[error when waiting for pod \"web-a\" in namespace \"demo\" to terminate: context deadline exceeded, \
             error when evicting pods/\"web-b\" -n \"demo\": global timeout reached: 30s]"
        );
    }
}
