//! The NodeMaintenances, watched for the webhook: its checks (one
//! maintenance per node, the fleet a policy's `admit` sees) read this
//! cache, not a list per create, so 5,000 maintenances created at once cost
//! the API server one watch, not 5,000 lists of up to 5,000 objects, and
//! the webhook's memory holds one copy of them, not one per request in
//! flight. The controller reads its own cache (kube-runtime's reflector).
//!
//! Read leniently: an object that is not a NodeMaintenance as this version
//! reads it is left out, never an error for the others. Kept without
//! `managedFields`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::api::{Api, ApiResource, DynamicObject};
use kube::{Client, ResourceExt};

use super::follow::Change;
use crate::crd::NodeMaintenance;
use crate::sync::Locked;

/// The watched NodeMaintenances, by name.
#[derive(Debug, Default)]
pub struct Maintenances {
    by_name: Mutex<BTreeMap<String, Arc<NodeMaintenance>>>,
    /// The watch has listed them and has not failed since (or has resumed
    /// since it failed: it has a change after the failure).
    synced: AtomicBool,
}

impl Maintenances {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<NodeMaintenance>>> {
        self.by_name.locked()
    }

    /// Watches every NodeMaintenance until the task is dropped.
    pub async fn watch(&self, client: Client) {
        let resource = ApiResource::erase::<NodeMaintenance>(&());
        let api: Api<DynamicObject> = Api::all_with(client, &resource);
        super::follow::follow_synced(
            api,
            "nodemaintenances",
            |change| match change {
                Change::Listed(all) => {
                    *self.map() = all
                        .into_iter()
                        .filter_map(read)
                        .map(|nm| (nm.name_any(), Arc::new(nm)))
                        .collect();
                    self.synced.store(true, Ordering::Relaxed);
                }
                // The watch resumed after a failure: what it missed is
                // in this change (a lost resourceVersion relists).
                Change::Applied(o) => {
                    let name = o.name_any();
                    match read(o) {
                        Some(nm) => self.map().insert(name, Arc::new(nm)),
                        None => self.map().remove(&name),
                    };
                    self.synced.store(true, Ordering::Relaxed);
                }
                Change::Deleted(o) => {
                    self.map().remove(&o.name_any());
                    self.synced.store(true, Ordering::Relaxed);
                }
            },
            || self.synced.store(false, Ordering::Relaxed),
        )
        .await;
    }

    /// Every NodeMaintenance as the watch has them; `None` until it has
    /// listed them, and while it fails.
    pub fn snapshot(&self) -> Option<Vec<Arc<NodeMaintenance>>> {
        if !self.synced.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.map().values().cloned().collect())
    }
}

/// `o` as a NodeMaintenance without its `managedFields`; `None` when it
/// cannot be read as one.
fn read(o: DynamicObject) -> Option<NodeMaintenance> {
    let mut nm: NodeMaintenance = serde_json::to_value(o)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())?;
    nm.metadata.managed_fields = None;
    Some(nm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dynamic(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_maintenance_is_kept_without_its_managed_fields_and_a_foreign_object_is_left_out() {
        let nm = read(dynamic(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": "m", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "worker-1", "reason": "r"}
        })))
        .expect("a NodeMaintenance");
        assert_eq!(nm.spec.node_name, "worker-1");
        assert!(nm.metadata.managed_fields.is_none());
        let foreign = read(dynamic(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": "bad"},
            "spec": {"nodeName": 7}
        })));
        assert!(foreign.is_none());
    }

    #[test]
    fn nothing_is_served_until_the_watch_has_listed() {
        let cache = Maintenances::default();
        assert!(cache.snapshot().is_none());
        cache.synced.store(true, Ordering::Relaxed);
        assert_eq!(cache.snapshot().map(|s| s.len()), Some(0));
    }
}
