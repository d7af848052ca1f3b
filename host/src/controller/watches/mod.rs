//! What admission reads, watched while the controller runs: the nodes,
//! the medik8s node leases, and other tools' claims on nodes; `follow.rs`
//! is the watch loop they share.

pub mod claims;
pub(super) mod follow;
pub mod leases;
pub(crate) mod nodes;

use std::sync::Arc;

use tracing::Instrument;

use super::Context;
use crate::task::Owned;

/// What the controller watches for admission.
#[derive(Default)]
pub(in crate::controller) struct Watched {
    /// The nodes: admission's fleet.
    pub nodes: Arc<nodes::Nodes>,
    /// The medik8s node leases: who else holds a node.
    pub leases: Arc<leases::Leases>,
    /// Other tools' objects claiming nodes.
    pub claims: Arc<claims::ToolClaims>,
}

/// Starts every watch the passes read, each in a span naming it; they end
/// when the returned handles are dropped (with the controller's run).
pub(super) fn start(ctx: &Context) -> [Owned<()>; 4] {
    let client = &ctx.client;
    let span = |of: &'static str| tracing::error_span!("watch", of);
    let (budgets, nodes) = (ctx.drains.budgets.clone(), ctx.watched.nodes.clone());
    let (leases, claims) = (ctx.watched.leases.clone(), ctx.watched.claims.clone());
    let namespace = ctx.settings.lease_namespace.clone();
    let again = ctx.settings.tool_api_recheck;
    let (b, n) = (client.clone(), client.clone());
    let (l, c) = (client.clone(), client.clone());
    [
        crate::task::spawn(async move { budgets.watch(b).await }.instrument(span("budgets"))),
        crate::task::spawn(async move { nodes.watch(n).await }.instrument(span("nodes"))),
        crate::task::spawn(
            async move { leases.watch(l, namespace).await }.instrument(span("leases")),
        ),
        crate::task::spawn(async move { claims.watch(c, again).await }.instrument(span("claims"))),
    ]
}
