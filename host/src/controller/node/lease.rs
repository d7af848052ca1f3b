//! The node lease, with the medik8s semantics: `medik8s-leases/node-<name>`,
//! holder `node-maintenance`, 3600 s, owned by the Node. Another holder's
//! valid lease (e.g. Node Health Check's) is respected.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::{Client, ResourceExt};

use crate::error::{Error, Result};

pub(crate) use crate::node_lease::LeaseRecord;
pub use crate::node_lease::{DEFAULT_NAMESPACE, lease_name};
pub(crate) use crate::node_lease::{DURATION_SECONDS, HOLDER};

/// Manages node leases in one namespace.
#[derive(Clone)]
pub(crate) struct LeaseManager {
    client: Client,
    namespace: String,
}

/// Reads a Lease leniently (see [`LeaseRecord`]); `None` when there is none.
pub(crate) async fn read_lease(
    client: &Client,
    namespace: &str,
    name: &str,
) -> std::result::Result<Option<LeaseRecord>, kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<Lease>(&()));
    match api.get_opt(name).await {
        Ok(obj) => Ok(obj.map(LeaseRecord::from_dynamic)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// The typed Lease to write over `record` (same metadata, so the write is
/// guarded by its resourceVersion) with a fresh spec.
pub(crate) fn lease_over(record: &LeaseRecord, spec: LeaseSpec) -> Lease {
    Lease {
        metadata: record.metadata.clone(),
        spec: Some(spec),
    }
}

impl LeaseManager {
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        LeaseManager {
            client,
            namespace: namespace.into(),
        }
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn ensure_namespace(&self) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        if api
            .get_opt(&self.namespace)
            .await
            .map_err(Error::kube("reading the lease namespace"))?
            .is_some()
        {
            return Ok(());
        }
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(Error::kube("creating the lease namespace")(e)),
        }
    }

    /// Takes or renews the node's lease. `Err(LeaseHeld)` when another
    /// holder's lease is still valid.
    pub async fn request(&self, node: &Node) -> Result<()> {
        let name = lease_name(&node.name_any());
        let now = Timestamp::now();
        let api = self.api();
        let existing = read_lease(&self.client, &self.namespace, &name)
            .await
            .map_err(Error::kube("reading the node lease"))?;
        match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name),
                        namespace: Some(self.namespace.clone()),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: node.name_any(),
                            uid: node.uid().unwrap_or_default(),
                            block_owner_deletion: Some(false),
                            controller: Some(false),
                        }]),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(HOLDER.into()),
                        lease_duration_seconds: Some(DURATION_SECONDS),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(()),
                    // No namespace yet (the first lease): made, then the
                    // lease again.
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        self.ensure_namespace().await?;
                        api.create(&PostParams::default(), &lease)
                            .await
                            .map(|_| ())
                            .map_err(Error::kube("creating the node lease"))
                    }
                    Err(e) => Err(Error::kube("creating the node lease")(e)),
                }
            }
            Some(record) => {
                if record.holder != HOLDER && !record.holder.is_empty() && record.valid_at(now) {
                    return Err(Error::LeaseHeld {
                        holder: crate::text::clean(&record.holder, 253),
                    });
                }
                let (acquired, transitions) = if record.holder == HOLDER {
                    // Ours: keep when we acquired it, if that is readable.
                    (record.acquired.map(MicroTime), record.transitions)
                } else {
                    (None, record.transitions.saturating_add(1))
                };
                let lease = lease_over(
                    &record,
                    LeaseSpec {
                        holder_identity: Some(HOLDER.into()),
                        lease_duration_seconds: Some(DURATION_SECONDS),
                        acquire_time: acquired.or(Some(MicroTime(now))),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(transitions),
                        ..Default::default()
                    },
                );
                // resourceVersion makes this a guarded update: a concurrent
                // holder's write wins and we see a conflict.
                api.replace(&name, &PostParams::default(), &lease)
                    .await
                    .map_err(Error::kube("renewing the node lease"))?;
                Ok(())
            }
        }
    }

    /// The nodes whose lease here we hold (by the lease's owner reference
    /// to its Node, else by its name).
    pub async fn ours(&self) -> Result<Vec<String>> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &ApiResource::erase::<Lease>(&()),
        );
        let list = match api.list(&kube::api::ListParams::default()).await {
            Ok(l) => l,
            // No lease namespace: no lease.
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Vec::new()),
            Err(e) => return Err(Error::kube("listing the node leases")(e)),
        };
        Ok(list
            .items
            .into_iter()
            .map(LeaseRecord::from_dynamic)
            .filter(|l| l.holder == HOLDER)
            .filter_map(|l| {
                let owner = l
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.kind == "Node")
                    .map(|o| o.name.clone());
                owner.or_else(|| {
                    l.metadata
                        .name
                        .as_deref()
                        .and_then(|n| n.strip_prefix("node-"))
                        .map(str::to_owned)
                })
            })
            .collect())
    }

    /// Gives the lease up if it is ours; another holder's is left alone.
    pub(crate) async fn invalidate(&self, node_name: &str) -> Result<()> {
        let name = lease_name(node_name);
        let api = self.api();
        // Only a lease that is not there is given up; any other error
        // (500, 429, 503, a timeout) fails the restore, which is retried:
        // a lease left behind would keep remediators off the node for up
        // to an hour.
        let Some(lease) = read_lease(&self.client, &self.namespace, &name)
            .await
            .map_err(Error::kube("reading the node lease"))?
        else {
            return Ok(());
        };
        if lease.holder != HOLDER {
            return Ok(());
        }
        match api
            .delete(
                &name,
                &DeleteParams::default().preconditions(kube::api::Preconditions {
                    uid: lease.metadata.uid.clone(),
                    resource_version: lease.metadata.resource_version.clone(),
                }),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(Error::kube("deleting the node lease")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_lease::MAX_NAME;

    #[test]
    fn a_lease_name_is_valid_for_any_valid_node_name() {
        assert_eq!(lease_name("worker-1"), "node-worker-1");
        let longest_plain = "a".repeat(248);
        assert_eq!(lease_name(&longest_plain), format!("node-{longest_plain}"));
        let labels = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(labels.len(), 253);
        for node in [
            labels.clone(),
            "x".repeat(253),
            format!("{}.{}", "z".repeat(230), "y".repeat(22)),
        ] {
            let name = lease_name(&node);
            assert!(name.len() <= MAX_NAME, "{}", name.len());
            assert!(!name.contains(".-") && !name.contains("-."), "{name}");
            assert_eq!(name, lease_name(&node), "stable");
        }
        // A name no Node can have (from a NodeMaintenance's spec) is cut
        // between characters, not inside one.
        assert!(lease_name(&"é".repeat(253)).len() <= MAX_NAME);
        // Unique: two names that share the kept part differ in the hash.
        let (a, b) = (
            format!("{}a", "x".repeat(252)),
            format!("{}b", "x".repeat(252)),
        );
        assert_ne!(lease_name(&a), lease_name(&b));
    }
}
