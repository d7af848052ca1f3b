//! The node lease, with the medik8s semantics: `medik8s-leases/node-<name>`,
//! holder `node-maintenance`, 3600 s, owned by the Node. Another holder's
//! valid lease (e.g. Node Health Check's) is respected.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};

use crate::error::{Error, Result};

/// Default namespace of node leases (env `LEASE_NAMESPACE` overrides).
pub const DEFAULT_NAMESPACE: &str = "medik8s-leases";
/// Our holder identity.
pub const HOLDER: &str = "node-maintenance";
/// How long a lease lasts, in seconds.
pub const DURATION_SECONDS: i32 = 3600;

/// The lease name for a node.
pub fn lease_name(node: &str) -> String {
    format!("node-{node}")
}

/// Manages node leases in one namespace.
#[derive(Clone)]
pub struct LeaseManager {
    client: Client,
    namespace: String,
}

fn valid(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    let Some(renew) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return false;
    };
    let duration = spec.lease_duration_seconds.unwrap_or(0) as i64;
    renew.0 + SignedDuration::from_secs(duration) > now
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
        let existing = match api.get_opt(&name).await {
            Ok(l) => l,
            Err(kube::Error::Api(e)) if e.code == 404 => None,
            Err(e) => return Err(Error::kube("reading the node lease")(e)),
        };
        match existing {
            None => {
                self.ensure_namespace().await?;
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
                api.create(&PostParams::default(), &lease)
                    .await
                    .map_err(Error::kube("creating the node lease"))?;
                Ok(())
            }
            Some(mut lease) => {
                let still_valid = valid(&lease, now);
                let spec = lease.spec.get_or_insert_with(Default::default);
                let holder = spec.holder_identity.clone().unwrap_or_default();
                if holder != HOLDER {
                    if !holder.is_empty() && still_valid {
                        return Err(Error::LeaseHeld { holder });
                    }
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    spec.holder_identity = Some(HOLDER.into());
                }
                spec.renew_time = Some(MicroTime(now));
                spec.lease_duration_seconds = Some(DURATION_SECONDS);
                // resourceVersion makes this a guarded update: a concurrent
                // holder's write wins and we see a conflict.
                api.replace(&lease.name_any(), &PostParams::default(), &lease)
                    .await
                    .map_err(Error::kube("renewing the node lease"))?;
                Ok(())
            }
        }
    }

    /// Gives the lease up if it is ours; another holder's is left alone.
    pub async fn invalidate(&self, node_name: &str) -> Result<()> {
        let name = lease_name(node_name);
        let api = self.api();
        let lease = match api.get_opt(&name).await {
            Ok(Some(l)) => l,
            Ok(None) | Err(kube::Error::Api(_)) => return Ok(()),
            Err(e) => return Err(Error::kube("reading the node lease")(e)),
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        if holder != HOLDER {
            return Ok(());
        }
        match api
            .delete(
                &name,
                &DeleteParams::default().preconditions(kube::api::Preconditions {
                    uid: lease.uid(),
                    resource_version: lease.resource_version(),
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
