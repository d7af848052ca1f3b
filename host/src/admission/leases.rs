//! The medik8s node leases (`medik8s-leases/node-<name>`), watched while
//! the controller runs: a node whose lease someone else holds (a Node
//! Health Check remediator, another medik8s operator) is claimed, and the
//! fleet a policy's `admit` sees says by whom (`node.lease-holder`). From
//! this cache, not a list per decision.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::follow::Change;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::{Client, ResourceExt};

use crate::node_lease::{HOLDER, LeaseRecord, lease_name};

/// The watched leases of the lease namespace, by name.
#[derive(Debug, Default)]
pub struct Leases {
    by_name: Mutex<BTreeMap<String, LeaseRecord>>,
}

impl Leases {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, LeaseRecord>> {
        self.by_name.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches the leases of `namespace` until the task is dropped. Read
    /// leniently (a hostile lease is a record, never an error).
    pub async fn watch(&self, client: Client, namespace: String) {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client, &namespace, &ApiResource::erase::<Lease>(&()));
        super::follow::follow(api, "leases", |change| match change {
            Change::Listed(all) => {
                *self.map() = all
                    .into_iter()
                    .map(|o| (o.name_any(), LeaseRecord::from_dynamic(o)))
                    .collect();
            }
            Change::Applied(o) => {
                self.map()
                    .insert(o.name_any(), LeaseRecord::from_dynamic(o));
            }
            Change::Deleted(o) => {
                self.map().remove(&o.name_any());
            }
        })
        .await;
    }

    /// Who else holds the lease of each of `nodes`, now.
    pub fn holders(&self, nodes: &[std::sync::Arc<Node>]) -> HashMap<String, String> {
        let map = self.map();
        holders_of(nodes, |name| map.get(name).cloned())
    }
}

/// Who else validly holds the lease of each of `nodes` (`lookup` finds a
/// lease by name).
pub(crate) fn holders_of(
    nodes: &[std::sync::Arc<Node>],
    lookup: impl Fn(&str) -> Option<LeaseRecord>,
) -> HashMap<String, String> {
    let now = Timestamp::now();
    nodes
        .iter()
        .filter_map(|n| {
            let node = n.metadata.name.as_deref()?;
            let record = lookup(&lease_name(node))?;
            (record.holder != HOLDER && !record.holder.is_empty() && record.valid_at(now))
                .then(|| (node.to_owned(), crate::text::clean(&record.holder, 253)))
        })
        .collect()
}

/// Adds to a fleet read from the API server (`fleet::around`, for the
/// webhook and `nmo plan`, which run no watch) the leases and the history
/// of `namespace`, and other tools' claims, as listed.
pub async fn complete(
    client: &Client,
    namespace: &str,
    around: &mut super::Around,
) -> crate::error::Result<()> {
    use crate::error::Error;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<Lease>(&()));
    let leases: BTreeMap<String, LeaseRecord> = api
        .list(&Default::default())
        .await
        .map_err(Error::kube("listing the node leases for admission"))?
        .items
        .into_iter()
        .map(|o| (o.name_any(), LeaseRecord::from_dynamic(o)))
        .collect();
    around.fleet.lease_holders = std::sync::Arc::new(holders_of(&around.fleet.nodes, |name| {
        leases.get(name).cloned()
    }));
    let ended = super::history::read_for_admission(client, namespace)
        .await
        .map_err(Error::kube("reading the maintenance history for admission"))?;
    around.ended = super::history::wit(&ended);
    around.fleet.tool_claims = std::sync::Arc::new(
        super::claims::list(client)
            .await
            .map_err(Error::kube("listing other tools' claims for admission"))?,
    );
    Ok(())
}
