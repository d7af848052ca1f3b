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
use crate::sync::Locked;

/// The watched leases of the lease namespace, by name.
#[derive(Debug, Default)]
pub struct Leases {
    by_name: Mutex<BTreeMap<String, LeaseRecord>>,
}

impl Leases {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, LeaseRecord>> {
        self.by_name.locked()
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
    pub(crate) fn holders(&self, nodes: &[std::sync::Arc<Node>]) -> HashMap<String, String> {
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

/// The leases of `namespace`, as listed, by name (for the listed source,
/// which runs no watch).
pub(super) async fn list(
    client: &Client,
    namespace: &str,
) -> kube::Result<BTreeMap<String, LeaseRecord>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<Lease>(&()));
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|o| (o.name_any(), LeaseRecord::from_dynamic(o)))
        .collect())
}
