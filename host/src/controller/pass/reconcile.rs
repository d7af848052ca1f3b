//! One reconcile of a NodeMaintenance, following the Go operator:
//! finalizer, status initialisation, node, owner reference, lease, label,
//! taints and cordon, drain, Succeeded; deletion undoes it all. Every step
//! is idempotent, so a restart at any point converges to the same state.
//!
//! [`reconcile`] reads as its steps, one function each. A pass asks the
//! policy for a plan at most once (and, after a failed step, what to do
//! about it); every write goes through one [`Writer`]; a pass woken only
//! by our own write does nothing at all.

use crate::controller::metrics::LeaseFailure;
use std::sync::Arc;

use std::time::Duration;
use tracing::Instrument;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;

use super::restore;
use super::status::{self, Writer, now, set_pending};
use crate::controller::context::Context;
use crate::controller::drain::{self, Drainer, NodePods};
use crate::controller::events::{EventType, reasons};
use crate::controller::next::Next;
use crate::controller::node;
use crate::controller::pass::{has_finalizer, phase};
use crate::crd::{FINALIZER, MaintenancePhase, NodeMaintenance, Waiting};
use crate::error::{Error, Result};
use crate::policy::types::{self, Failure};
use crate::policy::{Admission, Decision, Plan, Selected};

/// How often the drain's progress is written at most.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// The reconcile.
pub async fn reconcile(nm: Arc<NodeMaintenance>, ctx: Arc<Context>) -> Result<Next> {
    // A slot for the pass's own work; its drain gives it back (a drain,
    // and every wait in it, holds no slot).
    let Ok(slot) = ctx.slots.clone().acquire_owned().await else {
        return Ok(Next::After(Duration::from_secs(1)));
    };
    if ctx.is_stopping() {
        return Ok(Next::After(Duration::from_secs(1)));
    }
    let uid = nm.uid().unwrap_or_default();
    tracing::debug!("reconciling");
    if nm.metadata.deletion_timestamp.is_some() {
        return restore::deleted(&ctx, &nm).await;
    }
    // A failed maintenance stays failed until it is deleted.
    if phase(&nm) == Some(MaintenancePhase::Failed) {
        return Ok(Next::Change);
    }
    // Woken by our own write: nothing changed that we did not do (unless
    // a place freed for this waiting maintenance).
    let forced = ctx.memory.take_forced(&uid);
    if !forced
        && let Some(next) = ctx
            .memory
            .after_own_write(&uid, nm.resource_version().as_deref())
    {
        tracing::debug!("our own write; nothing to do");
        return Ok(next);
    }
    ctx.memory.forget_next(&uid);
    // The Go operator's line for every reconcile that does something.
    tracing::info!("Reconciling NodeMaintenance");
    let pass = Pass {
        writer: Writer::new(ctx.clone(), (*nm).clone()),
        name: nm.name_any(),
        node_name: nm.spec.node_name.clone(),
        uid: uid.clone(),
        ctx: ctx.clone(),
    };
    let next = pass.run(slot).await?;
    ctx.memory.remember_next(&uid, next);
    Ok(next)
}

/// One pass over a maintenance that is not being deleted.
pub(in crate::controller) struct Pass {
    pub ctx: Arc<Context>,
    pub writer: Arc<Writer>,
    pub name: String,
    pub uid: String,
    pub node_name: String,
}

impl Pass {
    async fn run(&self, slot: tokio::sync::OwnedSemaphorePermit) -> Result<Next> {
        self.follow_node_move().await?;
        // A failed attempt waits as its verdict said, whatever woke us: no
        // request, no policy call until then.
        if let Some(left) = self.ctx.memory.held(&self.uid) {
            tracing::debug!(wait = %crate::text::duration(left), "waiting before the next attempt");
            return Ok(Next::After(left));
        }
        // Parked by its policy: nothing until it changes or its recheck.
        if let Some(left) = self.ctx.memory.still_parked(&self.writer.current().await) {
            tracing::debug!(recheck = %left.map_or_else(|| "when it changes".to_owned(), crate::text::duration), "parked");
            return Ok(left.map_or(Next::Change, Next::After));
        }
        let admitted = self.ctx.memory.admitted(&self.writer.current().await);
        let node = self.node_for(admitted).await?;
        let began = self.ensure_metadata(node.as_ref()).await?;
        let Some(node) = node else {
            // The Go operator says it begins when it adds the finalizer,
            // then that the maintenance failed: a missing node is no
            // admission question.
            if began == Began::NotYet {
                self.begin().await;
            }
            return self.node_not_found().await;
        };
        let selected = match self.select_policy(&node).await {
            Ok(s) => s,
            Err(e) => return self.policy_failed(e).await,
        };
        let node = if admitted {
            node
        } else {
            if let Some(next) = self.admit(&selected).await? {
                return Ok(next);
            }
            // Admitted in this pass: from here on, the node as the API
            // server has it.
            let Some(node) = self.read_node().await? else {
                return self.node_not_found().await;
            };
            node
        };
        if !self.still_current().await? {
            return Ok(Next::After(Duration::from_secs(1)));
        }
        let reason = self.writer.current().await.spec.reason.unwrap_or_default();
        tracing::info!(reason = %reason, "Applying maintenance mode");
        if let Err(e) = self.take_lease(&node).await {
            self.count_before_drain(&selected, &node).await?;
            return self.lease_failed(e).await;
        }
        let Some(node) = node::set_maintenance_from(self.ctx.client(), node, true)
            .await?
            .0
        else {
            return self.node_not_found().await;
        };
        tracing::info!("Evict all Pods from Node");
        let pods = NodePods::list(self.ctx.client(), &self.node_name).await?;
        let plan = match self.plan(&selected, &node, pods.shared()).await {
            Ok(plan) => plan,
            Err(e) => return self.policy_failed(e).await,
        };
        // The first evictions go out while the status initialisation is
        // written: the drain does not wait for a write about it.
        let total = pods.pods().len();
        drop(slot);
        let (started, outcome) =
            tokio::join!(self.start_drain(&plan, total), self.drain(&plan, pods));
        started?;
        let outcome = outcome?;
        if outcome.cancelled {
            // Deleted or moved meanwhile: the change is queued and handled
            // next. Or the process stops: the next leader resumes it.
            tracing::info!("{}", self.stopped_why("drain"));
            return Ok(Next::After(Duration::from_millis(100)));
        }
        // A surge the attempt left behind (its pod went another way: the
        // owner's controller removed it after someone set the replicas
        // back, or the attempt ended first) is undone now, not when the
        // maintenance is deleted: no record stays on the owner.
        restore::release_surges(&self.ctx, &self.writer.current().await).await?;
        if !outcome.complete() {
            return self.drain_incomplete(outcome).await;
        }
        if let Some(timeout) = plan.volume_detach_timeout
            && let Some(next) = self.volumes_detached(timeout).await?
        {
            return Ok(next);
        }
        self.succeeded().await
    }

    /// spec.nodeName changed (the webhook refuses that; without it, this):
    /// the old node is restored and the maintenance starts over on the new
    /// one.
    async fn follow_node_move(&self) -> Result<()> {
        let nm = self.writer.current().await;
        let moved_from: Vec<String> = restore::node_owners(&nm)
            .filter(|n| *n != self.node_name)
            .collect();
        if moved_from.is_empty() {
            return Ok(());
        }
        for old in &moved_from {
            restore::restore_unless_wanted(&self.ctx, &nm, old).await?;
        }
        let refs: Vec<_> = nm
            .owner_references()
            .iter()
            .filter(|o| o.kind != "Node" || o.name == self.node_name)
            .cloned()
            .collect();
        self.writer
            .patch_metadata(
                json!({"ownerReferences": refs}),
                "dropping the old node's owner reference",
            )
            .await?;
        self.writer.start_over().await?;
        // On its new node the maintenance is admitted again, its policy
        // chosen again, its failures forgotten.
        self.ctx.memory.start_over(&self.uid);
        tracing::warn!(from = %moved_from.join(", "), to = %self.node_name, "spec.nodeName changed: the old node is restored, the maintenance starts over on the new one");
        let message = format!(
            "spec.nodeName changed from {} to {}: node {} restored, the maintenance starts over on {}",
            moved_from.join(", "),
            self.node_name,
            moved_from.join(", "),
            self.node_name
        );
        self.event(EventType::Warning, reasons::MOVED, &message)
            .await;
        Ok(())
    }

    /// Asks the policy whether the maintenance may start (its first pass,
    /// and every pass while it waits), before anything is touched.
    /// `Some(next)`: not now (waiting, denied, or the policy could not
    /// decide). Admissions are decided one at a time, each on the nodes as
    /// the API server has them and the NodeMaintenances as the cache has
    /// them plus those this process admitted (which the cache may not show
    /// yet, nor the API server while its `status.admittedAt` is written).
    async fn admit(&self, selected: &Selected) -> Result<Option<Next>> {
        // The nodes are read before taking the lock: what must not be
        // stale is the other admissions, not the nodes' readiness.
        let client = self.ctx.client();
        let nm = self.writer.current().await;
        let nodes = self.ctx.fresh_nodes().await?;
        let etcd = crate::admission::etcd(client, &nm, self.ctx.settings().openshift).await?;
        let history = self
            .ctx
            .admission
            .ended
            .entries(client, &self.ctx.settings().lease_namespace)
            .await;
        let one_at_a_time = self.ctx.admission.lock.lock().await;
        let all = self.ctx.cached_maintenances();
        let mut around =
            crate::admission::assemble(nodes, all.iter().map(|a| a.as_ref()), &nm, etcd, |o| {
                self.ctx.memory.admitted(o)
            });
        self.ctx.watched.complete(&mut around);
        around.ended = crate::admission::history::wit(&history);
        if around.already_admitted {
            return Ok(None);
        }
        // Nothing the policy sees changed since it said to wait, with no
        // time to ask again: its answer stands (a thousand waiting
        // maintenances would otherwise each be decided every recheck).
        let now_ms = u64::try_from(now().0.as_millisecond()).unwrap_or(0);
        let fingerprint = around.fingerprint(&selected.policy, &nm, now_ms);
        if self.ctx.memory.waits_on(&self.uid, fingerprint) {
            return Ok(Some(Next::After(self.ctx.settings().admission_recheck)));
        }
        let record = self.record().await;
        let answer = match around.ask(&selected.policy, record).await {
            Ok(None) => {
                // The node exists (this pass found it), but the fleet, from
                // the node watch, does not show it yet: ask again when it
                // does. A node that went meanwhile fails the next pass.
                tracing::debug!("the node watch does not show the node yet");
                return Ok(Some(Next::After(Duration::from_secs(1))));
            }
            Ok(Some(answer)) => Ok(answer),
            Err(e) => Err(e),
        };
        // Once this process counts it as admitted, the next admission sees
        // it whether or not the cache has our write yet: the write need not
        // hold the others back.
        if matches!(answer, Ok(Admission::Admit)) {
            self.ctx.memory.admitted_now(&self.uid);
        }
        // Only a wait with no time to ask again stands while the fleet
        // keeps this fingerprint; any other answer (an error too) is asked
        // again at the next pass.
        let stands = matches!(
            answer,
            Ok(Admission::Wait {
                recheck_after: None,
                ..
            })
        );
        self.ctx
            .memory
            .wait_on(&self.uid, stands.then_some(fingerprint));
        drop(one_at_a_time);
        let was_waiting = nm.status.as_ref().and_then(|s| s.waiting.clone());
        match answer {
            Err(e) => self.policy_failed(e.into()).await.map(Some),
            Ok(Admission::Admit) => {
                self.writer
                    .update_before_admission(|s| {
                        s.admitted_at = Some(now());
                        s.waiting = None;
                    })
                    .await?;
                if let Some(w) = was_waiting {
                    let (reason, message) = reasons::ADMITTED;
                    self.event(EventType::Normal, reason, message).await;
                    tracing::info!(waited_for = %w.reason, "the policy admitted the maintenance");
                }
                self.begin().await;
                Ok(None)
            }
            Ok(Admission::Wait {
                reason,
                recheck_after,
            }) => {
                self.waiting(was_waiting, reason).await?;
                let settings = self.ctx.settings();
                let (least, most) = (settings.admission_recheck_min, settings.admission_recheck);
                Ok(Some(Next::After(
                    recheck_after.map_or(most, |d| d.clamp(least.min(most), most)),
                )))
            }
            Ok(Admission::Deny(message)) => {
                tracing::error!(error = %message, "the policy denied the maintenance");
                // Nothing was touched: nothing to restore.
                self.mark_failed(message).await.map(Some)
            }
        }
    }

    /// The policy holds the maintenance back for `reason`: the status and
    /// a `Waiting` event say so when the reason changes, but a reason that
    /// changes on every call (a countdown, a timestamp) is written at most
    /// every [`crate::controller::Settings::waiting_update_interval`].
    async fn waiting(&self, was: Option<Waiting>, reason: String) -> Result<()> {
        if was.as_ref().is_some_and(|w| w.reason == reason) {
            return Ok(());
        }
        if !self.ctx.memory.may_write_reason(&self.uid) {
            tracing::debug!(reason = %reason, "the waiting reason changed again; written later");
            return Ok(());
        }
        let since = was.and_then(|w| w.since).unwrap_or_else(now);
        self.writer
            .update_before_admission(|s| {
                s.waiting = Some(Waiting {
                    reason: reason.clone(),
                    since: Some(since.clone()),
                })
            })
            .await?;
        self.event(EventType::Normal, reasons::WAITING, &reason)
            .await;
        tracing::info!(reason = %reason, "the policy holds the maintenance back");
        Ok(())
    }

    /// The node of this pass. While the maintenance waits for admission,
    /// the node watch's copy: a waiting maintenance is asked again every
    /// few seconds, and its passes cost the API server nothing (a thousand
    /// waiting maintenances would otherwise read a node each, every
    /// recheck). Once admitted, and whenever the watch does not show the
    /// node, it is read from the API server: a maintenance never fails on
    /// a node the watch has not seen yet, and never acts on a stale one.
    async fn node_for(&self, admitted: bool) -> Result<Option<Node>> {
        if !admitted
            && is_node_name(&self.node_name)
            && let Some(node) = self.ctx.watched.nodes.get(&self.node_name)
        {
            return Ok(Some(node));
        }
        self.read_node().await
    }

    async fn node_not_found(&self) -> Result<Next> {
        let message = format!("nodes \"{}\" not found", self.node_name);
        self.failed(Failure::NodeNotFound, message).await
    }

    /// The node, if it exists. A name no node can have is a node that does
    /// not exist.
    async fn read_node(&self) -> Result<Option<Node>> {
        if !is_node_name(&self.node_name) {
            return Ok(None);
        }
        Api::<Node>::all(self.ctx.client().clone())
            .get_opt(&self.node_name)
            .await
            .map_err(Error::kube("reading the node"))
    }

    /// The finalizer, and an owner reference to the node (so the CR goes
    /// with it), in one write.
    async fn ensure_metadata(&self, node: Option<&Node>) -> Result<Began> {
        let nm = self.writer.current().await;
        let mut patch = serde_json::Map::new();
        let adding_finalizer = !has_finalizer(&nm);
        if adding_finalizer {
            let mut finalizers = nm.finalizers().to_vec();
            finalizers.push(FINALIZER.to_owned());
            patch.insert("finalizers".into(), json!(finalizers));
        }
        if let Some(node) = node {
            let node_uid = node.uid().unwrap_or_default();
            let owned = nm
                .owner_references()
                .iter()
                .any(|o| o.kind == "Node" && o.uid == node_uid);
            if !owned {
                let mut refs = nm.owner_references().to_vec();
                refs.push(OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node_name.clone(),
                    uid: node_uid,
                    block_owner_deletion: Some(false),
                    controller: Some(false),
                });
                patch.insert("ownerReferences".into(), json!(refs));
            }
        }
        if patch.is_empty() {
            return Ok(Began::Before);
        }
        self.writer
            .patch_metadata(
                serde_json::Value::Object(patch),
                "adding the finalizer and owner reference",
            )
            .await?;
        // The Go operator says it begins when it adds the finalizer; a
        // maintenance the policy has not admitted yet has not begun: it
        // says so when it is admitted (see `admit`).
        if !adding_finalizer {
            return Ok(Began::Before);
        }
        if self.ctx.memory.admitted(&self.writer.current().await) {
            self.begin().await;
            return Ok(Began::Before);
        }
        Ok(Began::NotYet)
    }

    /// Records that the maintenance begins (`BeginMaintenance`).
    async fn begin(&self) {
        let (reason, message) = reasons::BEGIN;
        self.event(EventType::Normal, reason, message).await;
        tracing::info!("{message}");
    }

    /// The policy that decides for this maintenance (chosen once, then
    /// kept); recorded by the status initialisation, or, for a maintenance
    /// whose status another operator initialised (taken over from the Go
    /// operator), written on its own.
    async fn select_policy(&self, node: &Node) -> Result<Selected> {
        let nm = self.writer.current().await;
        let selected = self.ctx.policy_for(&nm, Some(node))?;
        let label = selected.label();
        let recorded = nm.status.as_ref().and_then(|s| s.policy.as_deref());
        let initialising = self
            .writer
            .plan_init(|i| i.policy = Some(label.clone()))
            .await;
        if !initialising && recorded != Some(label.as_str()) {
            self.writer
                .update(|s| s.policy = Some(label.clone()))
                .await?;
        }
        Ok(selected)
    }

    /// Before acting on the node: is the maintenance still what the cache
    /// said? The cache may be behind (a watch that lost events, an API
    /// server restored from a backup). A write of ours in this pass
    /// already proved it; otherwise it is read. A maintenance that is
    /// gone, being deleted or moved is left to the next pass.
    async fn still_current(&self) -> Result<bool> {
        let seen = self.writer.current().await;
        let current = self.writer.confirm().await?.is_some_and(|f| {
            f.uid() == seen.uid()
                && f.metadata.deletion_timestamp.is_none()
                && f.spec.node_name == self.node_name
        });
        if !current {
            tracing::info!(
                "the NodeMaintenance changed or went since the cache saw it; not acting on the node"
            );
        }
        Ok(current)
    }

    /// The node lease; a lease that works again clears the error count.
    async fn take_lease(&self, node: &Node) -> Result<()> {
        self.ctx.writers.leases.request(node).await?;
        let nm = self.writer.current().await;
        if nm
            .status
            .as_ref()
            .is_some_and(|s| s.error_on_lease_count != 0)
        {
            self.writer.update(|s| s.error_on_lease_count = 0).await?;
        }
        Ok(())
    }

    async fn lease_failed(&self, e: Error) -> Result<Next> {
        let (kind, failure) = match &e {
            Error::LeaseHeld { holder } => (LeaseFailure::Held, Failure::LeaseHeld(holder.clone())),
            Error::Kube { .. } => (LeaseFailure::Api, Failure::LeaseError(e.to_string())),
            _ => return Err(e),
        };
        self.ctx.metrics().lease_error(kind);
        let nm = self.writer.current().await;
        let draining = nm.status.as_ref().is_some_and(|s| s.drain_progress > 0);
        if draining {
            self.writer
                .update(|s| s.error_on_lease_count = s.error_on_lease_count.saturating_add(1))
                .await?;
        }
        let count = self
            .writer
            .current()
            .await
            .status
            .map_or(0, |s| s.error_on_lease_count);
        self.failed(failure, lease_failure_text(&e, draining, count))
            .await
    }

    /// On the first pass, when the drain cannot start (the lease is held),
    /// the status initialisation counts the node's pods and those the
    /// drain will remove anyway, as the Go operator counts them before it
    /// asks for the lease: `totalpods`, `evictionPods` and the pending pods
    /// are right from the start, and the progress moves as they go.
    async fn count_before_drain(&self, selected: &Selected, node: &Node) -> Result<()> {
        if !self.writer.initialising().await {
            return Ok(());
        }
        let pods = NodePods::list(self.ctx.client(), &self.node_name).await?;
        // A policy that fails here fails again, and says so, when the drain
        // starts: the counts wait for it.
        let Ok(plan) = self.plan(selected, node, pods.shared()).await else {
            return Ok(());
        };
        let total = pods.pods().len();
        self.writer
            .plan_init(|i| {
                i.total_pods = i32::try_from(total).unwrap_or(i32::MAX);
                i.removals = removals(&plan);
            })
            .await;
        Ok(())
    }

    /// Asks the policy for a drain plan (see [`decide`]).
    /// The pods' drain history goes with it; the pods the plan wants gone
    /// are pending from then on.
    async fn plan(&self, selected: &Selected, node: &Node, pods: Arc<[Pod]>) -> Result<Plan> {
        let record = self.record().await;
        let policy = selected.policy.clone();
        let node = node.clone();
        let ledger = self.ctx.memory.ledger(&self.uid);
        let history = ledger.history(record.now_ms);
        let uids: Vec<String> = pods.iter().map(|p| p.uid().unwrap_or_default()).collect();
        let now_ms = record.now_ms;
        let workloads = if policy.reads_workloads() {
            crate::cluster::workloads::read(
                self.ctx.client(),
                &self.ctx.drains.reads,
                (self.ctx.drains.desks.memory(), &|m: &str| {
                    self.ctx.maintenance_exists(m)
                }),
                &pods,
            )
            .await
            .map_err(Error::kube("reading the pods' workloads"))?
        } else {
            crate::policy::Workloads::default()
        };
        self.say_unread(&workloads).await;
        let plan = crate::policy::decide(Decision::PlanDrain, move || {
            policy.plan_drain_shared(&record, node, pods, history, workloads)
        })
        .await
        .map_err(Error::from)?;
        ledger.planned(&plan, &uids, now_ms);
        Ok(plan)
    }

    /// Says which pods have no workload because their owner reference
    /// cannot be read (a Warning event per pod, once an interval; a log
    /// line each plan): the policy decides them without one, and the drain
    /// goes on.
    async fn say_unread(&self, workloads: &crate::policy::Workloads) {
        for crate::policy::workloads::Unread { pod, why, .. } in workloads.unread() {
            tracing::warn!(pod = %pod, reason = %why, "a pod's owner cannot be read; the policy decides it without a workload");
            if self
                .ctx
                .memory
                .may_say(&self.uid, reasons::WORKLOAD_UNREADABLE, pod)
            {
                let message = format!("pod {pod} has no workload for the policy: {why}");
                self.event(EventType::Warning, reasons::WORKLOAD_UNREADABLE, &message)
                    .await;
            }
        }
    }

    /// Why a drain step in progress (`what`) stopped: the operator is
    /// stopping, or the maintenance was deleted or moved.
    fn stopped_why(&self, what: &str) -> String {
        if self.ctx.is_stopping() {
            format!("{what} stopped: the operator is stopping; the next leader resumes it")
        } else {
            format!("{what} stopped: the NodeMaintenance was deleted or moved")
        }
    }

    /// The maintenance as the policy sees it.
    pub async fn record(&self) -> types::Maintenance {
        let nm = self.writer.current().await;
        let attempt = self.ctx.memory.failures(&self.uid).saturating_add(1);
        crate::policy::convert::maintenance(&nm, attempt, k8s_openapi::jiff::Timestamp::now())
    }

    /// Before the drain: on the first pass, the status initialisation
    /// (phase Running, the policy, the pods to evict); on later ones,
    /// nothing (the drain's progress follows).
    async fn start_drain(&self, plan: &Plan, total: usize) -> Result<()> {
        let removals = removals(plan);
        if !self.writer.initialising().await {
            // The status is ours: one that claims the drain done while pods
            // are still to go (written by someone else) is corrected now.
            let status = self.writer.current().await.status.unwrap_or_default();
            if status::overstates(&status, &removals) {
                tracing::warn!(
                    phase = status
                        .phase
                        .map_or("", crate::crd::MaintenancePhase::as_str),
                    drainProgress = status.drain_progress,
                    pending = removals.len(),
                    "the status claims more than the drain has done; correcting it"
                );
                self.writer.update(|s| set_pending(s, &removals)).await?;
            }
            return Ok(());
        }
        self.writer
            .plan_init(|i| {
                i.total_pods = i32::try_from(total).unwrap_or(i32::MAX);
                i.removals = removals;
            })
            .await;
        self.writer.update(|_| {}).await?;
        Ok(())
    }

    /// Carries the plan out, writing progress as pods go (at most every
    /// [`PROGRESS_INTERVAL`]).
    async fn drain(&self, plan: &Plan, pods: NodePods) -> Result<drain::Outcome> {
        let (tx, mut rx) = tokio::sync::watch::channel::<Option<drain::Progress>>(None);
        let stop = Arc::new(tokio::sync::Notify::new());
        let progress_writer = {
            let writer = self.writer.clone();
            let stop = stop.clone();
            crate::task::spawn(async move {
                while rx.changed().await.is_ok() {
                    let Some(progress) = rx.borrow_and_update().clone() else {
                        continue;
                    };
                    let written = writer
                        .update(|s| {
                            set_pending(s, &progress.pending);
                            // What the drain waits for shows at once, not
                            // only when the attempt ends.
                            if progress.waiting.is_some() {
                                s.last_error = progress.waiting.clone();
                            }
                        })
                        .await;
                    if let Err(e) = written {
                        tracing::debug!(error = %e, "could not write the drain's progress");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(PROGRESS_INTERVAL) => {}
                        () = stop.notified() => break,
                    }
                }
            })
        };
        let ctx = &self.ctx;
        let (notes, mut noted) = tokio::sync::mpsc::unbounded_channel();
        let events = {
            let ctx = ctx.clone();
            let uid = self.uid.clone();
            let nm = self.writer.current().await;
            crate::task::spawn(async move {
                while let Some(note) = noted.recv().await {
                    let (type_, reason, message) = note_event(&note);
                    // A retry that does the same to the same pod (a pod
                    // that never finishes terminating, deleted again at
                    // every attempt) says so once an interval.
                    let subject = note.subject();
                    if !ctx.memory.may_say(&uid, reason, &subject) {
                        tracing::debug!(reason, subject = %subject, "said within the interval already; not said again");
                        continue;
                    }
                    restore::log_err(ctx.writers.recorder.record(&nm, type_, reason, &message));
                }
            })
        };
        let ledger = ctx.memory.ledger(&self.uid);
        // The attempt's lines (and its removals', surges', handshakes')
        // carry it, inside the pass's maintenance and node.
        let span = tracing::error_span!(
            "drain",
            pods = plan.steps.len(),
            attemptTimeout = %crate::text::duration(plan.attempt_timeout)
        );
        let outcome = drain::execute(
            Drainer {
                client: ctx.client(),
                retries: &ctx.settings().drain_retries,
                metrics: ctx.metrics(),
                shared: &ctx.drains,
                ledger: &ledger,
                notes: &notes,
                maintenance: &self.name,
            },
            pods,
            plan,
            move |progress| {
                let _ = tx.send(Some(progress));
            },
            || ctx.no_longer_wants(&self.name, &self.uid, &self.node_name),
        )
        .instrument(span)
        .await;
        // Every note of the attempt becomes an event before the pass goes on.
        drop(notes);
        let _ = events.join().await;
        // The progress write in flight ends (its resourceVersion is then
        // known as ours); the final status below supersedes it.
        stop.notify_one();
        progress_writer.join().await.map_err(|source| Error::Task {
            what: "the drain's progress writer",
            source,
        })?;
        Ok(outcome)
    }

    /// Waits for the node's VolumeAttachments to go (the plan's
    /// `volume-detach-timeout-ms`), the status saying what is still
    /// attached. `Some(next)`: they did not; the policy's verdict.
    async fn volumes_detached(&self, timeout: Duration) -> Result<Option<Next>> {
        let node = self.node_name.clone();
        let writer = self.writer.clone();
        let (tx, mut rx) = tokio::sync::watch::channel::<Option<String>>(None);
        let shower = crate::task::spawn(async move {
            while rx.changed().await.is_ok() {
                let shown = rx.borrow_and_update().clone();
                if let Err(e) = writer.update(|s| s.last_error = shown.clone()).await {
                    tracing::debug!(error = %e, "could not write what the drain waits for");
                }
            }
        });
        let ctx = &self.ctx;
        let waited = crate::controller::drain::volumes::wait_detached(
            ctx.client(),
            &node,
            timeout,
            |names| {
                let _ = tx.send(Some(crate::controller::drain::volumes::waiting_message(
                    &node, names,
                )));
            },
            || ctx.no_longer_wants(&self.name, &self.uid, &self.node_name),
        )
        .await;
        drop(tx);
        let _ = shower.join().await;
        let left = match waited {
            crate::controller::drain::volumes::Detach::Detached => return Ok(None),
            crate::controller::drain::volumes::Detach::Cancelled => {
                tracing::info!("{}", self.stopped_why("volume wait"));
                return Ok(Some(Next::After(Duration::from_millis(100))));
            }
            crate::controller::drain::volumes::Detach::Left(left) => left,
        };
        let message = format!(
            "{} VolumeAttachment(s) of node {} still attached after {}: {}",
            left.len(),
            self.node_name,
            crate::text::duration(timeout),
            left.join(", ")
        );
        self.failed(Failure::VolumesAttached(left), message)
            .await
            .map(Some)
    }

    /// Records an event about the maintenance; a failure is only logged.
    pub async fn event(&self, type_: EventType, reason: &str, message: &str) {
        let nm = self.writer.current().await;
        restore::log_err(
            self.ctx
                .writers
                .recorder
                .record(&nm, type_, reason, message),
        );
    }
}

/// The event a drain note makes.
fn note_event(note: &drain::Note) -> (EventType, &'static str, String) {
    use drain::Note;
    let key = |p: &crate::crd::PodReference| format!("{}/{}", p.namespace, p.name);
    match note {
        Note::Forced { pod, how, rule } => (
            EventType::Warning,
            reasons::FORCED,
            format!(
                "pod {} {how} (rule: {})",
                key(pod),
                if rule.is_empty() {
                    "not named by the policy"
                } else {
                    rule
                }
            ),
        ),
        Note::Surged { pod, owner } => (
            EventType::Normal,
            reasons::SURGED,
            format!(
                "pod {}: a Ready replacement from {owner} runs on another node; {owner} removes the pod",
                key(pod)
            ),
        ),
        Note::SurgeFellBack { pod, why } => (
            EventType::Warning,
            reasons::SURGE_FELL_BACK,
            format!("pod {} is evicted instead of surged: {why}", key(pod)),
        ),
        Note::Notified { pod, deadline } => (
            EventType::Normal,
            reasons::NOTIFIED,
            format!(
                "asked the application of pod {} to leave by {deadline}",
                key(pod)
            ),
        ),
    }
}

/// Whether `s` can be a node's name (a DNS subdomain).
/// Whether `BeginMaintenance` was said for a maintenance when its
/// finalizer went on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Began {
    /// Said now, or in an earlier pass.
    Before,
    /// The finalizer went on in this pass, before admission: not yet.
    NotYet,
}

/// The pods a plan's drain waits for: those it removes, and those it
/// blocks on (the drain waits for them too).
fn removals(plan: &Plan) -> Vec<crate::crd::PodReference> {
    plan.steps
        .iter()
        .filter(|s| s.action.removes() || matches!(s.action, crate::policy::Action::Block { .. }))
        .map(|s| crate::crd::PodReference {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
        })
        .collect()
}

/// lastError of a lease that could not be taken, in the Go operator
/// v0.21.0's words: held by another before the drain made progress, or
/// (once pods have gone) a lease that used to be ours; an API error as it
/// is.
fn lease_failure_text(e: &Error, draining: bool, count: i32) -> String {
    match e {
        Error::LeaseHeld { .. } if draining => format!(
            "failed to extend a lease that used to be owned by us, incrementing error on lease count: {e}, errorOnLeaseCount: {count}"
        ),
        Error::LeaseHeld { .. } => {
            format!(
                "failed to obtain a lease that is not owned by us : {e} errorOnLeaseCount {count}"
            )
        }
        other => other.to_string(),
    }
}

/// A name a node can have: a DNS subdomain as the API server validates
/// it (no limit on one dot-free part but the name's 253 characters).
fn is_node_name(s: &str) -> bool {
    crate::policy::workloads::is_dns_subdomain(s)
}
