//! How a pass ends: the drain succeeded, a step failed (the policy says
//! what then), the policy could not decide, or the maintenance is deleted
//! and the node restored.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

use super::events::{EventType, reasons};
use super::status::{Writer, now, set_pending};
use crate::controller::drain::Outcome;
use crate::controller::pass::{Next, Pass, has_finalizer, phase};
use crate::controller::{Context, backoff, node};
use crate::crd::{FINALIZER, MaintenancePhase, NodeMaintenance, PodReference};
use crate::error::{Error, Result};
use crate::policy::Decision;
use crate::policy::Verdict;
use crate::policy::types::{self, DrainReport, Failure};

/// The drain is complete: Succeeded (once), then looked at again to renew
/// the lease. lastError is cleared: what an earlier attempt failed on, or
/// what the drain waited for, is over (the Go operator leaves the last
/// failed attempt's text on a Succeeded maintenance: docs/drop-in.md).
pub(in crate::controller) async fn succeeded(pass: &Pass) -> Result<Next> {
    let old = pass
        .writer
        .update(|s| {
            s.last_error = None;
            if s.phase != Some(MaintenancePhase::Succeeded) {
                s.last_update = Some(now());
            }
            s.phase = Some(MaintenancePhase::Succeeded);
            s.parked = None;
            s.drain_progress = 100;
            s.pending_pods = None;
            s.pending_pods_refs = None;
        })
        .await?;
    if old.phase != Some(MaintenancePhase::Succeeded) {
        let nm = pass.writer.current().await;
        if let Some(created) = &nm.metadata.creation_timestamp {
            let ms = Timestamp::now()
                .as_millisecond()
                .saturating_sub(created.0.as_millisecond())
                .max(0);
            pass.ctx.metrics.drain_duration.observe(ms as f64 / 1e3);
        }
        let (reason, message) = reasons::SUCCEEDED;
        pass.event(EventType::Normal, reason, message).await;
    }
    pass.ctx.memory.succeeded(&pass.uid);
    tracing::info!("Maintenance was completed - all pods were evicted");
    Ok(Next::Done(pass.ctx.settings.renew_interval))
}

/// The drain attempt ended with pods left: recorded, then the policy's
/// verdict.
pub(in crate::controller) async fn drain_incomplete(pass: &Pass, outcome: Outcome) -> Result<Next> {
    let message = outcome.message.clone();
    let waited: Vec<PodReference> = outcome
        .pending
        .iter()
        .chain(&outcome.blocked)
        .chain(&outcome.waited)
        .cloned()
        .collect();
    // lastUpdate says when the status last changed; a retry that finds
    // the same pods left with the same error renews it at most once per
    // interval, however soon the policy retries (the throttle every
    // reason a policy gives shares).
    let renew = pass.ctx.memory.may_say(&pass.uid, "a failed attempt", "");
    pass.writer
        .update(|s| {
            let before = s.clone();
            set_pending(s, &waited);
            s.last_error = Some(message.clone());
            if renew || *s != before {
                s.last_update = Some(now());
            }
        })
        .await?;
    let to_wit = |v: &[PodReference]| {
        v.iter()
            .map(|r| types::PodRef {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
            })
            .collect()
    };
    let report = DrainReport {
        pending: to_wit(&outcome.pending),
        pdb_blocked: to_wit(&outcome.pdb_blocked),
        blocked: to_wit(&outcome.blocked),
        waited: to_wit(&outcome.waited),
        timed_out: outcome.timed_out,
        message: outcome.message.clone(),
    };
    failed(pass, Failure::DrainIncomplete(report), outcome.message).await
}

/// Asks the policy what to do after a failure and does it.
pub(in crate::controller) async fn failed(
    pass: &Pass,
    failure: Failure,
    last_error: String,
) -> Result<Next> {
    let attempt = pass.ctx.memory.failed(&pass.uid);
    let verdict = match on_failure(pass, failure.clone(), attempt).await {
        Ok(v) => v,
        Err(e) => return policy_failed(pass, e).await,
    };
    if let Failure::DrainIncomplete(report) = &failure {
        // The Go operator's lines, which its e2e suite looks for.
        tracing::warn!(error = %report.message, "Not all pods evicted");
    }
    tracing::warn!(error = %last_error, verdict = %verdict, "maintenance step failed");
    let delay = match verdict {
        Verdict::RetryAfter(d) => {
            tracing::info!(requeueAfter = %crate::text::duration(d), "Reconciling with fixed duration");
            d
        }
        Verdict::RetryWithBackoff => backoff(attempt),
        Verdict::Fail(message) => return give_up(pass, &failure, message).await,
        Verdict::Park {
            reason,
            recheck_after,
        } => return park(pass, reason, recheck_after, last_error).await,
    };
    pass.ctx.memory.hold(&pass.uid, delay);
    pass.writer
        .update(|s| {
            s.last_error = Some(last_error.clone());
            s.parked = None;
        })
        .await?;
    Ok(Next::After(delay))
}

/// The soonest a parked maintenance is looked at again.
const MIN_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The policy's verdict is to park: the node stays cordoned and tainted,
/// the status and a `ParkedMaintenance` event say why, and nothing is
/// tried again until `recheck_after` or until the NodeMaintenance changes.
async fn park(
    pass: &Pass,
    reason: String,
    recheck_after: Option<std::time::Duration>,
    last_error: String,
) -> Result<Next> {
    // A recheck sooner than a second would call the policy in a loop.
    let recheck_after = recheck_after.map(|d| d.max(MIN_RECHECK));
    let recheck_at = recheck_after.map(super::status::after);
    // Every reason a policy gives is written, and said in an event, at
    // most once per interval (as a waiting reason is): a policy whose
    // reason changes at every call (naming the time) does not flood the
    // status and the event stream. The first park is always said.
    let was = pass.writer.current().await.status.and_then(|s| s.parked);
    let reason = match &was {
        Some(p) if p.reason != reason && !pass.ctx.memory.may_write_reason(&pass.uid) => {
            p.reason.clone()
        }
        Some(_) => reason,
        None => {
            pass.ctx.memory.may_write_reason(&pass.uid);
            reason
        }
    };
    let old = pass
        .writer
        .update(|s| {
            let since = s
                .parked
                .as_ref()
                .and_then(|p| p.since.clone())
                .unwrap_or_else(now);
            s.last_error = Some(last_error.clone());
            s.parked = Some(crate::crd::Parked {
                reason: reason.clone(),
                failure: Some(last_error.clone()),
                since: Some(since),
                recheck_at: recheck_at.clone(),
            });
        })
        .await?;
    let nm = pass.writer.current().await;
    pass.ctx.memory.park(&nm, recheck_after);
    if old.parked.as_ref().map(|p| &p.reason) != Some(&reason) {
        pass.event(EventType::Warning, reasons::PARKED, &reason)
            .await;
    }
    tracing::warn!(reason = %reason, recheck = %recheck_after.map_or_else(|| "when it changes".to_owned(), crate::text::duration), "the policy parked the maintenance; the node stays cordoned");
    Ok(match recheck_after {
        Some(d) => Next::After(d),
        None => Next::Change,
    })
}

/// The policy's verdict is to fail: the node is restored and the
/// maintenance stays Failed until deleted.
async fn give_up(pass: &Pass, failure: &Failure, message: String) -> Result<Next> {
    let nm = pass.writer.current().await;
    if !matches!(failure, Failure::NodeNotFound) {
        restore_unless_wanted(&pass.ctx, &nm, &pass.node_name).await?;
    }
    release_surges(&pass.ctx, &nm).await?;
    mark_failed(pass, message).await
}

/// Phase Failed with `message` as `lastError`, and the Go operator's
/// `FailedMaintenance` event the first time.
pub(in crate::controller) async fn mark_failed(pass: &Pass, message: String) -> Result<Next> {
    let old = pass
        .writer
        .update(|s| {
            s.phase = Some(MaintenancePhase::Failed);
            s.last_error = Some(message.clone());
            s.last_update = Some(now());
        })
        .await?;
    if old.phase != Some(MaintenancePhase::Failed) {
        let (reason, msg) = reasons::FAILED;
        pass.event(EventType::Warning, reason, msg).await;
        let mut was = pass.writer.current().await;
        was.status = Some(old);
        record_end(&pass.ctx, &was, "Failed").await;
    }
    Ok(Next::Change)
}

/// Records in the fleet's history that `nm` (as it was) gave its node
/// back with `outcome`.
async fn record_end(ctx: &Context, nm: &NodeMaintenance, outcome: &str) {
    if let Some(entry) = crate::admission::history::entry(nm, outcome) {
        ctx.admission
            .ended
            .record(&ctx.client, &ctx.settings.lease_namespace, entry)
            .await;
    }
}

/// Asks the maintenance's policy what to do after a failure (on the
/// blocking pool, as a plan).
async fn on_failure(pass: &Pass, failure: Failure, attempt: u32) -> Result<Verdict> {
    let nm = pass.writer.current().await;
    let selected = pass.ctx.policy_for(&nm, None)?;
    let record = crate::policy::convert::maintenance(&nm, attempt, Timestamp::now());
    crate::policy::decide(Decision::OnFailure, move || {
        selected.policy.on_failure(&record, &failure)
    })
    .await
    .map_err(Error::from)
}

/// A policy could not decide: record it and wait; never act.
pub(in crate::controller) async fn policy_failed(pass: &Pass, e: Error) -> Result<Next> {
    let message = e.to_string();
    tracing::error!(category = e.category(), "{message}");
    // Before the policy admitted the maintenance nothing has started: the
    // phase stays unset.
    let record = |s: &mut crate::crd::NodeMaintenanceStatus| s.last_error = Some(message.clone());
    let old = if crate::controller::is_admitted(&pass.writer.current().await) {
        pass.writer.update(record).await?
    } else {
        pass.writer.update_before_admission(record).await?
    };
    if old.last_error.as_deref() != Some(message.as_str()) {
        pass.event(EventType::Warning, reasons::POLICY_ERROR, &message)
            .await;
    }
    Ok(Next::After(pass.ctx.settings.policy_error_retry))
}

/// The maintenance is being deleted: if the finalizer is ours, its node
/// (and a node it was moved away from that the move has not restored yet)
/// is restored, then the finalizer goes.
pub(in crate::controller) async fn deleted(
    ctx: &Arc<Context>,
    nm: &NodeMaintenance,
) -> Result<Next> {
    if !has_finalizer(nm) {
        return Ok(Next::Change);
    }
    let node_name = &nm.spec.node_name;
    let mut nodes: Vec<String> = vec![node_name.clone()];
    nodes.extend(node_owners(nm).filter(|n| n != node_name));
    for n in &nodes {
        restore_unless_wanted(ctx, nm, n).await?;
    }
    release_surges(ctx, nm).await?;
    // A Failed one was recorded when it failed.
    match nm.status.as_ref().and_then(|s| s.phase) {
        Some(MaintenancePhase::Failed) => {}
        Some(MaintenancePhase::Succeeded) => record_end(ctx, nm, "Succeeded").await,
        _ => record_end(ctx, nm, "Cancelled").await,
    }
    let finalizers: Vec<String> = nm
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    let writer = Writer::new(ctx.clone(), nm.clone());
    writer
        .patch_metadata(json!({"finalizers": finalizers}), "removing the finalizer")
        .await?;
    let (reason, message) = reasons::REMOVED;
    log_err(
        ctx.writers
            .recorder
            .record(nm, EventType::Normal, reason, message),
    );
    ctx.memory.forget(&nm.uid().unwrap_or_default());
    Ok(Next::Change)
}

/// Undoes the surges the maintenance may still hold (its drain stopped
/// mid-surge): their owners get their replicas back.
pub(in crate::controller) async fn release_surges(
    ctx: &Context,
    nm: &NodeMaintenance,
) -> Result<()> {
    if !ctx.memory.may_hold_surges(&nm.uid().unwrap_or_default()) {
        return Ok(());
    }
    match crate::controller::drain::surge::release(&ctx.client, &nm.name_any()).await {
        Ok(_) => Ok(()),
        // A cluster without the apps API (or no right to it) holds no
        // surges of ours.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => {
            tracing::debug!(error = %e.message, "no surges to release");
            Ok(())
        }
        Err(e) => Err(Error::kube("undoing the maintenance's surges")(e)),
    }
}

/// The nodes a maintenance holds an owner reference to.
pub(in crate::controller) fn node_owners(
    nm: &NodeMaintenance,
) -> impl Iterator<Item = String> + '_ {
    nm.owner_references()
        .iter()
        .filter(|o| o.kind == "Node")
        .map(|o| o.name.clone())
}

/// Restores `node` unless another maintenance (not being deleted, not
/// failed) still wants it in maintenance: with no webhook to refuse a
/// second NodeMaintenance for a node, ending one must not end the other's.
pub(in crate::controller) async fn restore_unless_wanted(
    ctx: &Context,
    nm: &NodeMaintenance,
    node: &str,
) -> Result<()> {
    let others = Api::<NodeMaintenance>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing NodeMaintenances"))?;
    if let Some(other) = others.items.iter().find(|o| {
        o.uid() != nm.uid()
            && o.spec.node_name == node
            && o.metadata.deletion_timestamp.is_none()
            && phase(o) != Some(MaintenancePhase::Failed)
    }) {
        tracing::info!(nodeMaintenance = %nm.name_any(), nodeName = %node, other = %other.name_any(), "the node stays in maintenance for another NodeMaintenance");
        return Ok(());
    }
    stop_maintenance(ctx, node).await
}

/// Undoes the maintenance on the node: taints, cordon, label, lease, and
/// last the node's record of its state before the maintenance. Each step
/// is idempotent and the record goes only after the others, so a restore
/// that fails (or is killed) anywhere and is retried restores the node to
/// the record again, never to "nothing".
pub(in crate::controller) async fn stop_maintenance(ctx: &Context, node_name: &str) -> Result<()> {
    let (node, changed) = node::set_maintenance(&ctx.client, node_name, false).await?;
    if let (Some(node), true) = (node, changed) {
        let (reason, message) = reasons::UNCORDON;
        log_err(
            ctx.writers
                .recorder
                .record(&node, EventType::Normal, reason, message),
        );
    }
    ctx.writers.leases.invalidate(node_name).await?;
    node::forget_record(&ctx.client, node_name).await
}

pub(in crate::controller) fn log_err(r: Result<()>) {
    if let Err(e) = r {
        tracing::warn!(error = %e, "could not record an event");
    }
}
