//! The orphan sweep: a node this operator put into maintenance (it carries
//! our record of its state before) or a node lease of ours, with no
//! NodeMaintenance left for that node (its finalizer was removed by hand,
//! the CRD was deleted with the finalizers forced), is restored as the
//! finalizer would have: the marks the record says, the lease given up,
//! the record removed.
//!
//! Cheap when there is nothing to do: one list of the nodes carrying the
//! exclude-from-remediation label and one list of the lease namespace; the
//! NodeMaintenances are listed (from the API server, not the cache) only
//! for a candidate no maintenance in the controller's cache names, once
//! per such candidate, just before it would be restored. A node named by any NodeMaintenance (even one being deleted,
//! even one of another operator) is never touched.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::context::Context;
use super::node;
use super::pass::restore;
use crate::crd::NodeMaintenance;
use crate::error::{Error, Result};
use crate::sync::Locked;

/// Where a pass of a maintenance is queued.
pub(super) type Requeue =
    futures::channel::mpsc::UnboundedSender<kube::runtime::reflector::ObjectRef<NodeMaintenance>>;

/// Sweeps once; returns the nodes restored.
///
/// Each candidate is decided against a fresh list of the maintenances, read
/// just before it is restored (a maintenance created since the sweep began
/// keeps its node), and against the controller's cache. A maintenance
/// created while its node was being restored is looked at again at once,
/// so its marks go back on now, not at its next renewal.
pub(super) async fn sweep(ctx: &Context, requeue: &Requeue) -> Result<Vec<String>> {
    let candidates = candidates(ctx).await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    // The cache first: a node one of its maintenances names is no orphan,
    // and needs no read. Only the nodes it names none of are read from the
    // API server (one list each, just before the restore): with a thousand
    // maintenances in progress a sweep costs no list at all, where a list
    // per node in maintenance grew with the square of their count.
    let cached = cache_named(ctx);
    let mut restored = Vec::new();
    for node in candidates.into_iter().filter(|n| !cached.contains(n)) {
        if !wanting(ctx, &node).await?.is_empty() {
            continue;
        }
        tracing::warn!(nodeName = %node, "the node is marked by this operator but no NodeMaintenance names it (its finalizer was removed by hand, or the CRD deleted); restoring it");
        restore::stop_maintenance(ctx, &node).await?;
        for nm in wanting(ctx, &node).await? {
            tracing::warn!(nodeName = %node, nodeMaintenance = %nm.name_any(), "a maintenance of the node appeared while it was restored; marking it again");
            ctx.memory.force(&nm.uid().unwrap_or_default());
            let _ = requeue.unbounded_send(kube::runtime::reflector::ObjectRef::from_obj(&nm));
        }
        restored.push(node);
    }
    Ok(restored)
}

/// The nodes the maintenances in the controller's cache name (their spec,
/// or a node they moved from).
fn cache_named(ctx: &Context) -> BTreeSet<String> {
    let store = ctx.health.store.locked().clone();
    let mut named = BTreeSet::new();
    for nm in store.iter().flat_map(|s| s.state()) {
        named.insert(nm.spec.node_name.clone());
        named.extend(restore::node_owners(&nm));
    }
    named
}

/// Nodes with our record of their state, and nodes with a lease of ours.
async fn candidates(ctx: &Context) -> Result<BTreeSet<String>> {
    let marked = Api::<Node>::all(ctx.client().clone())
        .list_metadata(&ListParams::default().labels(&format!("{}=true", node::EXCLUDE_LABEL)))
        .await
        .map_err(Error::kube("listing the nodes in maintenance"))?;
    let mut out: BTreeSet<String> = marked
        .items
        .iter()
        .filter(|n| n.annotations().contains_key(node::PRIOR_STATE_ANNOTATION))
        .map(ResourceExt::name_any)
        .collect();
    out.extend(ctx.writers.leases.ours().await?);
    Ok(out)
}

/// The maintenances that name `node` (its spec, or a node it moved
/// from), read from the API server now. No CRD at all means no
/// maintenance can exist.
async fn wanting(ctx: &Context, node: &str) -> Result<Vec<NodeMaintenance>> {
    let all = match Api::<NodeMaintenance>::all(ctx.client().clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            tracing::warn!("the NodeMaintenance CRD is not installed: no maintenance can exist");
            Vec::new()
        }
        Err(e) => return Err(Error::kube("listing NodeMaintenances")(e)),
    };
    Ok(all
        .into_iter()
        .filter(|nm| nm.spec.node_name == node || restore::node_owners(nm).any(|n| n == node))
        .collect())
}

/// The sweep at start (an operator that was down finds what went
/// meanwhile) and every [`super::Settings::orphan_sweep`] after; each
/// sweep also forgets what is remembered of maintenances the cache no
/// longer holds (one whose finalizer was removed by hand gets no pass).
pub(super) async fn run(ctx: &Context, requeue: &Requeue) {
    let interval = ctx.settings().orphan_sweep;
    loop {
        ctx.forget_gone();
        match sweep(ctx, requeue).await {
            Ok(restored) if !restored.is_empty() => {
                tracing::info!(nodes = %restored.join(", "), "orphaned nodes restored");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, category = e.category(), "the orphan sweep failed; trying again later");
            }
        }
        tokio::time::sleep(interval).await;
    }
}
