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
//! when a candidate is found. A node named by any NodeMaintenance (even
//! one being deleted, even one of another operator) is never touched.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::{Context, finish, node};
use crate::crd::NodeMaintenance;
use crate::error::{Error, Result};

/// Sweeps once; returns the nodes restored.
pub(super) async fn sweep(ctx: &Context) -> Result<Vec<String>> {
    let candidates = candidates(ctx).await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let wanted = wanted_nodes(ctx).await?;
    let mut restored = Vec::new();
    for node in candidates.difference(&wanted) {
        tracing::warn!(logger = "controller", nodeName = %node, "the node is marked by this operator but no NodeMaintenance names it (its finalizer was removed by hand, or the CRD deleted); restoring it");
        finish::stop_maintenance(ctx, node).await?;
        restored.push(node.clone());
    }
    Ok(restored)
}

/// Nodes with our record of their state, and nodes with a lease of ours.
async fn candidates(ctx: &Context) -> Result<BTreeSet<String>> {
    let marked = Api::<Node>::all(ctx.client.clone())
        .list_metadata(&ListParams::default().labels(&format!("{}=true", node::EXCLUDE_LABEL)))
        .await
        .map_err(Error::kube("listing the nodes in maintenance"))?;
    let mut out: BTreeSet<String> = marked
        .items
        .iter()
        .filter(|n| n.annotations().contains_key(node::PRIOR_STATE_ANNOTATION))
        .map(ResourceExt::name_any)
        .collect();
    out.extend(ctx.leases.ours().await?);
    Ok(out)
}

/// Every node some NodeMaintenance names (its spec, or a node it moved
/// from). No CRD at all means no maintenance can exist.
async fn wanted_nodes(ctx: &Context) -> Result<BTreeSet<String>> {
    let all = match Api::<NodeMaintenance>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            tracing::warn!(
                logger = "controller",
                "the NodeMaintenance CRD is not installed: no maintenance can exist"
            );
            Vec::new()
        }
        Err(e) => return Err(Error::kube("listing NodeMaintenances")(e)),
    };
    Ok(all
        .iter()
        .flat_map(|nm| std::iter::once(nm.spec.node_name.clone()).chain(finish::node_owners(nm)))
        .collect())
}

/// The sweep at start (an operator that was down finds what went
/// meanwhile) and every [`super::Settings::orphan_sweep`] after; each
/// sweep also forgets what is remembered of maintenances the cache no
/// longer holds (one whose finalizer was removed by hand gets no pass).
pub(super) async fn run(ctx: &Context) {
    let interval = ctx.settings.orphan_sweep;
    loop {
        ctx.forget_gone();
        match sweep(ctx).await {
            Ok(restored) if !restored.is_empty() => {
                tracing::info!(logger = "controller", nodes = ?restored, "orphaned nodes restored");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(logger = "controller", error = %e, category = e.category(), "the orphan sweep failed; trying again later");
            }
        }
        tokio::time::sleep(interval).await;
    }
}
