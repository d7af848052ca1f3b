//! The drain executor: carries out a validated plan, wave by wave, with
//! evictions through the Eviction API (paced by the PodDisruptionBudgets'
//! watch, see `budgets.rs`: sent when a budget has room, a refusal asked
//! again when the budget changes, at the latest after kubectl's 5 s),
//! deletes where the policy says delete, bounded concurrency, and pod
//! disappearance observed by kube-runtime's watcher on the node's pods
//! (the same list the plan is made from, then its watch).
//!
//! Contract 0.3's actions have their own modules: `surge/`
//! (make-before-break through the owning ReplicaSet or Deployment) and
//! `handshake.rs` (ask the application first), sharing `attempt.rs` (the
//! attempt's state and targets) with this executor; `wait` is the watch
//! counting a finished pod as gone.

pub(super) mod attempt;
pub mod budgets;
pub(super) mod handshake;
pub mod ledger;
pub(super) mod surge;
pub(super) mod volumes;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Semaphore;
use tokio::time::Instant;

pub use self::attempt::Retries;
use self::attempt::{Attempt, Removal, Target, is_finished};
pub(crate) use self::attempt::{Note, Notes};
use self::budgets::{Budgets, Permit, Via};
use self::ledger::Ledger;
use super::metrics::{ControllerMetrics, PodOutcome};
use crate::cluster::HOST_MAX_CONCURRENT;
use crate::crd::PodReference;
use crate::error::{Error, Result};
use crate::policy::{Action, Plan, Removal as HowRemoved};
use crate::sync::Locked;

/// How often at most the drain reports that fewer pods are left (the
/// status is written at most every 250 ms anyway).
const REPORT_EVERY: Duration = Duration::from_millis(100);

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
pub(crate) struct NodePods {
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
                watcher::Event::InitApply(mut p) => {
                    // Kept for the whole drain, and nothing reads them:
                    // often half a pod's size, times every pod of every
                    // node in maintenance at once.
                    p.metadata.managed_fields = None;
                    pods.push(p);
                }
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

/// What every drain of the process shares.
#[derive(Clone)]
pub(in crate::controller) struct Shared {
    /// The PodDisruptionBudgets, watched while the controller runs: every
    /// drain's evictions are paced by them.
    pub budgets: Arc<Budgets>,
    /// The removal requests every drain shares (`removals_in_flight`).
    pub in_flight: Arc<Semaphore>,
    /// The owners being surged: one watch and one read per change of
    /// each, shared by every surge of its pods.
    pub desks: Arc<surge::Desks>,
    /// The plans' reads of the pods' workloads: one GET of an object
    /// however many plans ask for it at once.
    pub reads: Arc<crate::cluster::workloads::SharedReads>,
}

/// What a drain needs besides the plan.
#[derive(Clone, Copy)]
pub(in crate::controller) struct Drainer<'a> {
    pub client: &'a Client,
    pub retries: &'a Retries,
    pub metrics: &'a ControllerMetrics,
    /// The budgets' watch, the removal requests in flight (a request is
    /// sent only with one of its permits) and the surges' desks, which
    /// every drain of the process shares.
    pub(in crate::controller) shared: &'a Shared,
    /// The maintenance's pod ledger (refusals, handshakes).
    pub ledger: &'a Arc<Ledger>,
    /// Where notes for the maintenance's events go.
    pub notes: &'a Notes,
    /// The maintenance's name (the requester of a handshake, the holder of
    /// a surge).
    pub maintenance: &'a str,
}

/// Runs one drain attempt of `plan` over the `listed` pods (the list the
/// plan was made from). `on_progress` is called with the pods still
/// pending whenever that set shrinks, and with what the drain waits for
/// (the last refused eviction) whenever that changes; `cancelled` is asked
/// at least every 500 ms and ends the attempt early when it says so.
pub(in crate::controller) async fn execute(
    drainer: Drainer<'_>,
    listed: NodePods,
    plan: &Plan,
    on_progress: impl Fn(Progress) + Send + Sync,
    cancelled: impl Fn() -> bool + Send + Sync,
) -> Outcome {
    let NodePods { node, pods, events } = listed;
    let targets = targets_of(plan, &pods);
    let state = Arc::new(Attempt::start(&pods, &targets));
    let watch = crate::task::spawn(follow(events, state.clone()));
    let mut run = Run::new(drainer, plan, &targets, state);
    let end = run.waves(&on_progress, &cancelled).await;
    drop(watch);
    count_left_alone(&targets, drainer.metrics);
    run.outcome(&node, end).await
}

/// The pods the plan acts on, with the wave each is in.
fn targets_of(plan: &Plan, pods: &[Pod]) -> Vec<(u32, Target)> {
    plan.steps
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
                    unreadable: crate::policy::workloads::unreadable_controller(p),
                    action: s.action.clone(),
                },
            )
        })
        .collect()
}

/// Counts the pods the plan skips or blocks on, once per attempt.
fn count_left_alone(targets: &[(u32, Target)], metrics: &ControllerMetrics) {
    for (_, t) in targets {
        match t.action {
            Action::Skip { .. } => metrics.pod_removal(PodOutcome::Skipped),
            Action::Block { .. } => metrics.pod_removal(PodOutcome::Blocked),
            _ => {}
        }
    }
}

/// How the waves of an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ended {
    /// Every wave is done.
    Done,
    /// Every removal of a wave is done and a pod it waits to complete ran
    /// past its wait: the policy decides again.
    WaitOver,
    /// The attempt's time ran out.
    TimedOut,
    /// The maintenance no longer wants the drain (or the process stops).
    Stopped,
}

/// One attempt in progress: what it acts on, its shared state, and when
/// it last said how it goes.
struct Run<'a> {
    drainer: Drainer<'a>,
    plan: &'a Plan,
    targets: &'a [(u32, Target)],
    state: Arc<Attempt>,
    started: Instant,
    deadline: Instant,
    /// The policy's limit on this drain's removals in flight.
    slots: Arc<Semaphore>,
    reports: Reports,
}

/// When the attempt last said how it goes, and what.
struct Reports {
    last: Option<(usize, String)>,
    at: Instant,
    /// A change not said yet (held back by [`REPORT_EVERY`]).
    due: bool,
}

impl<'a> Run<'a> {
    fn new(
        drainer: Drainer<'a>,
        plan: &'a Plan,
        targets: &'a [(u32, Target)],
        state: Arc<Attempt>,
    ) -> Self {
        let started = Instant::now();
        let limit = plan
            .max_concurrent_evictions
            .map_or(HOST_MAX_CONCURRENT, |n| {
                (n.get() as usize).min(HOST_MAX_CONCURRENT)
            });
        Run {
            drainer,
            plan,
            targets,
            state,
            started,
            deadline: started + plan.attempt_timeout,
            slots: Arc::new(Semaphore::new(limit)),
            reports: Reports {
                last: None,
                at: started,
                due: false,
            },
        }
    }

    /// What the drain waits for: the pods it removes, those it waits to
    /// complete, and those it blocks on (someone else has to move them).
    fn waited(&self) -> impl Iterator<Item = &'a Target> + use<'a> {
        self.targets
            .iter()
            .filter(|(_, t)| t.action.awaited())
            .map(|(_, t)| t)
    }

    /// When a `wait` runs out.
    fn wait_until(&self, t: &Target) -> Option<Instant> {
        match &t.action {
            Action::Wait { timeout, .. } => Some(self.started + *timeout),
            _ => None,
        }
    }

    /// The waves in order, each started when the one before is done.
    async fn waves(
        &mut self,
        on_progress: &(impl Fn(Progress) + Send + Sync),
        cancelled: &(impl Fn() -> bool + Send + Sync),
    ) -> Ended {
        let mut waves: Vec<u32> = self.targets.iter().map(|(o, _)| *o).collect();
        waves.dedup();
        for wave in waves {
            let wave_targets: Vec<Target> = self
                .targets
                .iter()
                .filter(|(o, t)| {
                    *o == wave && (t.action.removes() || matches!(t.action, Action::Wait { .. }))
                })
                .map(|(_, t)| t.clone())
                .collect();
            self.say_waits(&wave_targets).await;
            let tasks = self.start_removals(&wave_targets);
            match self
                .follow_wave(&wave_targets, on_progress, cancelled)
                .await
            {
                Ended::Done => {
                    for t in tasks {
                        let _ = t.join().await;
                    }
                }
                // The removals still running end here (dropped).
                ended => return ended,
            }
        }
        Ended::Done
    }

    /// What the drain waits for on each pod of the wave it waits to
    /// complete (`wait`): the policy's reason and its bound, shown in the
    /// status from the wave's start (one steady text per pod, written
    /// once) until the pod completes.
    async fn say_waits(&self, wave: &[Target]) {
        for t in wave {
            if let Action::Wait { timeout, reason } = &t.action {
                let what = format!(
                    "waiting for pod {} to complete ({reason}), for at most {}",
                    t.key(),
                    crate::text::duration(*timeout)
                );
                self.state.waiting_for(t, what).await;
            }
        }
    }

    /// Starts removing the wave's pods, each as its action says, at most
    /// the policy's limit at once.
    fn start_removals(&self, wave: &[Target]) -> Vec<crate::task::Owned<()>> {
        let d = self.drainer;
        wave.iter()
            .filter(|t| t.action.removes())
            .map(|t| {
                let t = t.clone();
                let (state, slots, deadline) =
                    (self.state.clone(), self.slots.clone(), self.deadline);
                let (client, retries, metrics) =
                    (d.client.clone(), d.retries.clone(), d.metrics.clone());
                let (shared, ledger) = (d.shared.clone(), d.ledger.clone());
                let (notes, maintenance) = (d.notes.clone(), d.maintenance.to_owned());
                crate::task::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    let how = Removal {
                        client: &client,
                        deadline,
                        retries: &retries,
                        metrics: &metrics,
                        budgets: &shared.budgets,
                        in_flight: &shared.in_flight,
                        ledger: &ledger,
                        notes: &notes,
                        maintenance: &maintenance,
                    };
                    remove(how, &shared.desks, &t, &state).await;
                })
            })
            .collect()
    }

    /// Waits for the wave's pods to be gone, saying how it goes (at most
    /// every [`REPORT_EVERY`], and at once when the wave is over or what
    /// the drain waits for changes).
    async fn follow_wave(
        &mut self,
        wave: &[Target],
        on_progress: &(impl Fn(Progress) + Send + Sync),
        cancelled: &(impl Fn() -> bool + Send + Sync),
    ) -> Ended {
        let waits_until = wave.iter().filter_map(|t| self.wait_until(t)).min();
        loop {
            let state = self.state.clone();
            let notified = state.changed.notified();
            let wave_done = self.report(wave, on_progress).await;
            if wave_done {
                return Ended::Done;
            }
            if self.removals_done_and_a_wait_over(wave).await {
                return Ended::WaitOver;
            }
            if Instant::now() >= self.deadline {
                return Ended::TimedOut;
            }
            if cancelled() {
                return Ended::Stopped;
            }
            let next_report = self.reports.at + REPORT_EVERY;
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(self.deadline) => {}
                _ = tokio::time::sleep_until(waits_until.unwrap_or(self.deadline)) => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = tokio::time::sleep_until(next_report), if self.reports.due => {}
            }
        }
    }

    /// Says how the attempt goes if that changed (held back while the last
    /// report is younger than [`REPORT_EVERY`], unless urgent). Whether
    /// every pod of the wave is gone.
    async fn report(
        &mut self,
        wave: &[Target],
        on_progress: &(impl Fn(Progress) + Send + Sync),
    ) -> bool {
        let (count, wave_done) = {
            let present = self.state.present.lock().await;
            (
                self.waited().filter(|t| present.contains(&t.uid)).count(),
                wave.iter().all(|t| !present.contains(&t.uid)),
            )
        };
        let waiting = self.state.waiting().await;
        let now = Some((count, waiting.clone()));
        let urgent = wave_done
            || self
                .reports
                .last
                .as_ref()
                .is_none_or(|(_, w)| *w != waiting);
        self.reports.due = now != self.reports.last;
        if self.reports.due && (urgent || Instant::now() >= self.reports.at + REPORT_EVERY) {
            let pending = {
                let present = self.state.present.lock().await;
                self.waited()
                    .filter(|t| present.contains(&t.uid))
                    .map(|t| t.reference())
                    .collect()
            };
            self.reports = Reports {
                last: now,
                at: Instant::now(),
                due: false,
            };
            on_progress(Progress {
                pending,
                waiting: (!waiting.is_empty()).then_some(waiting),
            });
        }
        wave_done
    }

    /// Every removal of the wave is done, and a pod it waits to complete
    /// still runs past its wait.
    async fn removals_done_and_a_wait_over(&self, wave: &[Target]) -> bool {
        let present = self.state.present.lock().await;
        let now = Instant::now();
        wave.iter()
            .filter(|t| t.action.removes())
            .all(|t| !present.contains(&t.uid))
            && wave
                .iter()
                .any(|t| present.contains(&t.uid) && self.wait_until(t).is_some_and(|u| u <= now))
    }

    /// How the attempt ended, from what is left on the node; the ledger
    /// hears which pods were still refused.
    async fn outcome(&self, node: &str, ended: Ended) -> Outcome {
        let state = &self.state;
        let present = state.present.lock().await.clone();
        let pdb = state.pdb_blocked.lock().await.clone();
        let on_node = |t: &&Target| present.contains(&t.uid);
        let of = |is: fn(&Action) -> bool| -> Vec<&Target> {
            self.targets
                .iter()
                .map(|(_, t)| t)
                .filter(|t| is(&t.action))
                .filter(on_node)
                .collect()
        };
        let pending = of(Action::removes);
        let blocked = of(|a| matches!(a, Action::Block { .. }));
        let still_running = of(|a| matches!(a, Action::Wait { .. }));
        self.drainer.ledger.attempt_ended(
            self.waited()
                .filter(|t| present.contains(&t.uid))
                .map(|t| t.uid.as_str()),
        );
        let timed_out = ended == Ended::TimedOut;
        let last_error = state.waiting().await;
        let accepted = state.accepted.lock().await.clone();
        let words = Words {
            node,
            timeout: self.plan.attempt_timeout,
            timed_out,
            pdb: &pdb,
            accepted: &accepted,
            last_error,
        };
        let message = words.message(&pending, &blocked, &still_running);
        let reference = |ts: &[&Target]| ts.iter().map(|t| t.reference()).collect::<Vec<_>>();
        Outcome {
            pdb_blocked: pending
                .iter()
                .filter(|t| pdb.contains(&t.uid))
                .map(|t| t.reference())
                .collect(),
            pending: reference(&pending),
            blocked: reference(&blocked),
            waited: reference(&still_running),
            timed_out,
            message,
            cancelled: ended == Ended::Stopped,
            evicted: state.evicted.load(std::sync::atomic::Ordering::Relaxed),
            deleted: state.deleted.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// What the end of an attempt is said with.
struct Words<'a> {
    node: &'a str,
    timeout: Duration,
    timed_out: bool,
    /// uids whose last eviction a budget refused.
    pdb: &'a HashSet<String>,
    /// uids whose removal the API server accepted.
    accepted: &'a HashSet<String>,
    /// What the drain waited for last ("" when nothing).
    last_error: String,
}

impl Words<'_> {
    /// The attempt's error ("" when complete): the pods left to remove
    /// first, then one that blocks, then one still running past its wait.
    fn message(&self, pending: &[&Target], blocked: &[&Target], running: &[&Target]) -> String {
        if self.timed_out && !pending.is_empty() {
            // The Go operator's text where the situation is the same
            // (tools parse it): kubectl's drain errors of the pods left,
            // aggregated.
            return timed_out_text(pending, self.accepted, self.timeout);
        }
        if !pending.is_empty() {
            return self.incomplete(pending);
        }
        if let Some(t) = blocked.first()
            && let Action::Block { reason } = &t.action
        {
            return format!("pod {}/{} blocks the drain: {reason}", t.namespace, t.name);
        }
        if let Some(t) = running.first() {
            let (timeout, reason) = match &t.action {
                Action::Wait { timeout, reason } => (*timeout, reason.as_str()),
                _ => (Duration::ZERO, ""),
            };
            return format!(
                "waited {} for pod {}/{} to complete ({reason}); it still runs{}",
                crate::text::duration(timeout),
                t.namespace,
                t.name,
                if running.len() > 1 {
                    format!(", with {} other(s)", running.len() - 1)
                } else {
                    String::new()
                }
            );
        }
        String::new()
    }

    /// Pods the plan removes are still on the node.
    fn incomplete(&self, pending: &[&Target]) -> String {
        let pdb_count = pending.iter().filter(|t| self.pdb.contains(&t.uid)).count();
        let mut message = format!(
            "drain did not complete{}: {} pod(s) still on node {}{}",
            if self.timed_out {
                format!(" within {:?}", self.timeout)
            } else {
                String::new()
            },
            pending.len(),
            self.node,
            if pdb_count > 0 {
                format!(", {pdb_count} refused by a PodDisruptionBudget")
            } else {
                String::new()
            }
        );
        if !self.last_error.is_empty() {
            message.push_str(&format!(" (last error: {})", self.last_error));
        }
        message
    }
}

/// Takes one pod off the node as its action says: a surge or a handshake
/// first where the plan asks for one, then an eviction or a deletion.
async fn remove(how: Removal<'_>, desks: &surge::Desks, t: &Target, state: &Attempt) {
    let (delete, removal) = match &t.action {
        Action::Evict(r) => (false, r.clone()),
        Action::Delete(r) => (true, r.clone()),
        Action::Surge(r) => match self::surge::replace(how, desks, t, state).await {
            self::surge::Surged::Done => return,
            self::surge::Surged::Evict(why) => {
                tracing::warn!(pod = %t.key(), reason = %why, "surge not possible; evicting");
                let _ = how.notes.send(Note::SurgeFellBack {
                    pod: t.reference(),
                    why,
                });
                (false, r.clone())
            }
        },
        Action::Notify(n) => {
            if !self::handshake::ask(how, t, state, n).await {
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
    let api: Api<Pod> = Api::namespaced(how.client.clone(), &t.namespace);
    let preconditions = Preconditions {
        uid: Some(t.uid.clone()),
        resource_version: None,
    };
    let mut dp = DeleteParams::default().preconditions(preconditions);
    dp.grace_period_seconds = removal.grace_period_seconds.map(|g| g as u32);
    loop {
        if !state.has(&t.uid).await {
            return;
        }
        let sent = if delete {
            send_delete(how, &api, t, &dp).await
        } else {
            send_eviction(how, &api, t, state, &dp).await
        };
        let Some((result, permit)) = sent else {
            return;
        };
        let Some(wait) = answered(how, t, state, (delete, removal), result, permit).await else {
            return;
        };
        if Instant::now() + wait >= how.deadline {
            return;
        }
        tokio::time::sleep(wait).await;
    }
}

/// A request's answer, and the budgets' permit it was sent with.
type Sent<'a> = (kube::Result<()>, Option<Permit<'a>>);

/// Deletes the pod once a request may be in flight (`None`: the attempt's
/// time ran out first).
async fn send_delete<'a>(
    how: Removal<'a>,
    api: &Api<Pod>,
    t: &Target,
    dp: &DeleteParams,
) -> Option<Sent<'a>> {
    // Forced past the budgets by the policy, never held by them, but
    // counted against them as a disruption to come.
    let permit = how.budget_permit(Via::Forced, t).await?;
    let _sending = sending(how.in_flight, how.deadline).await?;
    Some((api.delete(&t.name, dp).await.map(|_| ()), Some(permit)))
}

/// Evicts the pod once its budgets allow and a request may be in flight
/// (`None`: the attempt's time ran out first, or the pod went meanwhile).
async fn send_eviction<'a>(
    how: Removal<'a>,
    api: &Api<Pod>,
    t: &Target,
    state: &Attempt,
    dp: &DeleteParams,
) -> Option<Sent<'a>> {
    let Some(permit) = how.budget_permit(Via::Eviction, t).await else {
        // The attempt's time ran out waiting for its budget.
        state.pdb_blocked.lock().await.insert(t.uid.clone());
        return None;
    };
    if !state.has(&t.uid).await {
        return None;
    }
    let params = EvictParams {
        delete_options: Some(dp.clone()),
        ..Default::default()
    };
    let Some(_sending) = sending(how.in_flight, how.deadline).await else {
        permit.failed();
        return None;
    };
    let result = api.evict(&t.name, &params).await.map(|_| ());
    Some((result, Some(permit)))
}

/// What the answer to a removal means: `None` when the pod is done with
/// (accepted, or gone already), else how long to wait before trying
/// again. The permit hears how it went; a refusal or an error is what the
/// drain waits for on this pod.
async fn answered(
    how: Removal<'_>,
    t: &Target,
    state: &Attempt,
    (delete, removal): (bool, &HowRemoved),
    result: kube::Result<()>,
    permit: Option<Permit<'_>>,
) -> Option<Duration> {
    let failed = |permit: Option<Permit<'_>>| {
        if let Some(p) = permit {
            p.failed();
        }
        how.metrics.pod_removal(PodOutcome::Error);
    };
    match result {
        Ok(()) => {
            if let Some(p) = permit {
                p.accepted();
            }
            if removal.forced(delete) {
                let _ = how.notes.send(Note::Forced {
                    pod: t.reference(),
                    how: forced_how(delete, removal.grace_period_seconds),
                    rule: removal.rule.clone(),
                });
            }
            removed(t, state, how.metrics, delete).await;
            None
        }
        // Gone already, or a replacement with the same name: done.
        Err(kube::Error::Api(e))
            if e.code == 404 || (e.code == 409 && e.message.contains("Precondition")) =>
        {
            state.present.lock().await.remove(&t.uid);
            state.changed.notify_waiters();
            None
        }
        Err(kube::Error::Api(e)) if e.code == 429 => {
            how.metrics.pod_removal(PodOutcome::Pdb429);
            how.ledger.refused(&t.uid);
            state.pdb_blocked.lock().await.insert(t.uid.clone());
            state
                .waiting_for(
                    t,
                    format!("evicting pod {}/{}: {}", t.namespace, t.name, e.message),
                )
                .await;
            // A budget the watch knows: its permit is the wait (the
            // budget changing, or the fallback); otherwise kubectl's.
            Some(match permit {
                Some(p) if p.gated() => {
                    p.refused();
                    Duration::ZERO
                }
                _ => how.retries.pdb,
            })
        }
        // A conflict: another eviction (or a controller) updated the
        // pod's budget at the same moment. Nothing for a user to do:
        // tried again, said in words rather than the API's raw
        // "Operation cannot be fulfilled ... the object has been
        // modified".
        Err(kube::Error::Api(e)) if e.code == 409 => {
            failed(permit);
            state.waiting_for(t, format!(
                "evicting pod {}/{}: changed by another writer at the same moment (its budget, most likely); trying again",
                t.namespace, t.name
            )).await;
            Some(how.retries.api_error)
        }
        Err(e) => {
            failed(permit);
            let text = crate::text::api_error(&e);
            state
                .waiting_for(
                    t,
                    format!("evicting pod {}/{}: {text}", t.namespace, t.name),
                )
                .await;
            Some(how.retries.api_error)
        }
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
    tracing::info!(pod = %format!("{}/{}", t.namespace, t.name), "pod removed from node");
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
                    let mut watched = state.annotations.locked();
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
            unreadable: None,
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
