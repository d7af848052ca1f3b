//! The watched source: what admission follows so that a decision costs no
//! request. The nodes, the medik8s node leases and other tools' claims are
//! followed for the controller while it runs and, when the process serves
//! the webhook, for as long as the process runs (both replicas answer the
//! webhook, the standby too); the NodeMaintenances only for the webhook
//! (the controller reads its own cache). Each watch runs once however many
//! ask for it: the first to ask starts it, and it ends when the last who
//! asked lets go.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use kube::Client;
use tracing::Instrument;

use super::{Around, claims, leases, maintenances, nodes};
use crate::sync::Locked;
use crate::task::Owned;

/// What admission follows.
#[derive(Default)]
pub struct Watched {
    /// The nodes: admission's fleet.
    pub(crate) nodes: Arc<nodes::Nodes>,
    /// The medik8s node leases: who else holds a node.
    pub(crate) leases: Arc<leases::Leases>,
    /// Other tools' objects claiming nodes.
    pub(crate) claims: Arc<claims::ToolClaims>,
    /// The NodeMaintenances (the webhook's).
    pub(crate) maintenances: Arc<maintenances::Maintenances>,
    /// The fleet's watches (nodes, leases, claims), while someone follows.
    fleet: Mutex<Weak<Following>>,
    /// The NodeMaintenances' watch, while someone follows.
    maintenances_followed: Mutex<Weak<Following>>,
}

/// Watches running for whoever holds this: they end when the last holder
/// drops it.
pub struct Following(#[allow(dead_code)] Vec<Owned<()>>);

impl Watched {
    /// Follows the nodes, the leases of `lease_namespace` and other tools'
    /// claims (an API that is not served is looked for again every
    /// `look_again`), unless they are followed already.
    pub fn follow_fleet(
        &self,
        client: &Client,
        lease_namespace: &str,
        look_again: Duration,
    ) -> Arc<Following> {
        let (nodes, leases, claims) =
            (self.nodes.clone(), self.leases.clone(), self.claims.clone());
        let (n, l, c) = (client.clone(), client.clone(), client.clone());
        let namespace = lease_namespace.to_owned();
        once(&self.fleet, || {
            vec![
                spawn("nodes", async move { nodes.watch(n).await }),
                spawn("leases", async move { leases.watch(l, namespace).await }),
                spawn("claims", async move { claims.watch(c, look_again).await }),
            ]
        })
    }

    /// Follows the NodeMaintenances, unless they are followed already.
    pub fn follow_maintenances(&self, client: &Client) -> Arc<Following> {
        let (maintenances, client) = (self.maintenances.clone(), client.clone());
        once(&self.maintenances_followed, || {
            vec![spawn("nodemaintenances", async move {
                maintenances.watch(client).await
            })]
        })
    }

    /// Whether the nodes' and the NodeMaintenances' watches have listed
    /// (and are not failing): what the webhook reads from them then.
    pub fn has_listed(&self) -> bool {
        self.nodes.snapshot().is_some() && self.maintenances.snapshot().is_some()
    }

    /// Adds to `around` who else holds each node's lease and other tools'
    /// claims, as the watches have them now.
    pub(crate) fn complete(&self, around: &mut Around) {
        around.fleet.lease_holders = Arc::new(self.leases.holders(&around.fleet.nodes));
        around.fleet.tool_claims = Arc::new(self.claims.by_node());
    }
}

/// The watches `slot` holds while someone follows them, else those
/// `start` starts (held there from now on).
fn once(slot: &Mutex<Weak<Following>>, start: impl FnOnce() -> Vec<Owned<()>>) -> Arc<Following> {
    let mut slot = slot.locked();
    if let Some(running) = slot.upgrade() {
        return running;
    }
    let running = Arc::new(Following(start()));
    *slot = Arc::downgrade(&running);
    running
}

/// One watch, in a span naming what it follows.
fn spawn(
    of: &'static str,
    watch: impl std::future::Future<Output = ()> + Send + 'static,
) -> Owned<()> {
    crate::task::spawn(watch.instrument(tracing::error_span!("watch", of)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_runs_once_for_every_follower_and_ends_with_the_last() {
        let slot = Mutex::new(Weak::new());
        let started = std::sync::atomic::AtomicUsize::new(0);
        let start = || {
            started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            vec![crate::task::spawn(std::future::pending::<()>())]
        };
        let first = once(&slot, start);
        let second = once(&slot, start);
        assert_eq!(started.load(std::sync::atomic::Ordering::Relaxed), 1);
        drop(first);
        assert!(
            slot.locked().upgrade().is_some(),
            "the second still follows"
        );
        drop(second);
        assert!(slot.locked().upgrade().is_none());
        let _third = once(&slot, start);
        assert_eq!(started.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
