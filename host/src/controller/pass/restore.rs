//! How a node is given back: a deleted maintenance's restore (its node,
//! a node it moved away from, its surges, its finalizer), and the undoing
//! of a maintenance on a node that the orphan sweep shares.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

use super::status::Writer;
use crate::controller::context::Context;
use crate::controller::events::{EventType, reasons};
use crate::controller::next::Next;
use crate::controller::node;
use crate::controller::pass::{has_finalizer, phase};
use crate::crd::{FINALIZER, MaintenancePhase, NodeMaintenance};
use crate::error::{Error, Result};

/// Records in the fleet's history that `nm` (as it was) gave its node
/// back with `outcome`.
pub(super) async fn record_end(ctx: &Context, nm: &NodeMaintenance, outcome: &str) {
    if let Some(entry) = crate::admission::history::entry(nm, outcome) {
        ctx.admission
            .ended
            .record(ctx.client(), &ctx.settings().lease_namespace, entry)
            .await;
    }
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
    let uid = nm.uid().unwrap_or_default();
    if !ctx.memory.may_hold_surges(&uid) {
        return Ok(());
    }
    match crate::controller::drain::surge::release(ctx.client(), &ctx.drains.desks, &nm.name_any())
        .await
    {
        Ok(_) => {
            ctx.memory.surges_checked(&uid);
            Ok(())
        }
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
    let others = Api::<NodeMaintenance>::all(ctx.client().clone())
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
    let (node, changed) = node::set_maintenance(ctx.client(), node_name, false).await?;
    if let (Some(node), true) = (node, changed) {
        let (reason, message) = reasons::UNCORDON;
        log_err(
            ctx.writers
                .recorder
                .record(&node, EventType::Normal, reason, message),
        );
    }
    ctx.writers.leases.invalidate(node_name).await?;
    node::forget_record(ctx.client(), node_name).await
}

pub(in crate::controller) fn log_err(r: Result<()>) {
    if let Err(e) = r {
        tracing::warn!(error = %e, "could not record an event");
    }
}
