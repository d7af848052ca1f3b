//! The nodes, watched while the controller runs: the fleet every admission
//! decides on comes from this cache, not from a list per decision, so an
//! admission costs no request however many nodes the cluster has.
//!
//! The snapshot a policy sees is rebuilt only when a node changed since
//! the last one (nodes change rarely: kubelets renew leases, not the
//! Node); admissions in between share it. Until the watch has listed the
//! nodes once, and while it fails, admission lists them instead
//! (the controller's `Context::fresh_nodes`): never a stale fleet for long.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::sync::Locked;

/// The watched nodes.
#[derive(Debug, Default)]
pub struct Nodes {
    /// By name.
    by_name: Mutex<BTreeMap<String, Arc<Node>>>,
    /// Bumped at every change.
    generation: AtomicU64,
    /// The watch has listed the nodes and is not failing.
    synced: AtomicBool,
    /// The last snapshot handed out, and the generation it was made at.
    snapshot: Mutex<Option<(u64, crate::policy::FleetNodes)>>,
}

impl Nodes {
    /// Watches the nodes until the task is dropped (kube-runtime's
    /// watcher: relists on a lost watch or a 410 Gone, with backoff).
    pub async fn watch(&self, client: Client) {
        let api: Api<Node> = Api::all(client);
        let mut events = watcher(
            api,
            watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECS),
        )
        .default_backoff()
        .boxed();
        let mut listing: BTreeMap<String, Arc<Node>> = BTreeMap::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listing.clear(),
                Ok(watcher::Event::InitApply(node)) => {
                    listing.insert(name(&node), Arc::new(node));
                }
                Ok(watcher::Event::InitDone) => {
                    *self.map() = std::mem::take(&mut listing);
                    self.changed();
                    if !self.synced.swap(true, Ordering::Relaxed) {
                        tracing::debug!("admission reads the nodes' watch");
                    }
                }
                Ok(watcher::Event::Apply(node)) => {
                    self.map().insert(name(&node), Arc::new(node));
                    self.changed();
                    self.synced.store(true, Ordering::Relaxed);
                }
                Ok(watcher::Event::Delete(node)) => {
                    self.map().remove(&name(&node));
                    self.changed();
                    self.synced.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    if self.synced.swap(false, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "the node watch fails; admission lists the nodes until it works");
                    }
                }
            }
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Node>>> {
        self.by_name.locked()
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The node `name` as the watch has it; `None` when the watch does not
    /// show it (not there, not listed yet, or the watch fails).
    pub fn get(&self, name: &str) -> Option<Node> {
        if !self.synced.load(Ordering::Relaxed) {
            return None;
        }
        self.map().get(name).map(|n| Node::clone(n))
    }

    /// The nodes as the watch has them, sorted by name; `None` until it has
    /// listed them, and while it fails.
    pub fn snapshot(&self) -> Option<crate::policy::FleetNodes> {
        if !self.synced.load(Ordering::Relaxed) {
            return None;
        }
        let mut snapshot = self.snapshot.locked();
        let generation = self.generation.load(Ordering::Acquire);
        if let Some((at, nodes)) = snapshot.as_ref()
            && *at == generation
        {
            return Some(nodes.clone());
        }
        let nodes: crate::policy::FleetNodes = self.map().values().cloned().collect();
        *snapshot = Some((generation, nodes.clone()));
        Some(nodes)
    }
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}
