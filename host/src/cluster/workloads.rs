//! Reads the workloads behind a node's pods for a policy that asks for
//! them (for the drain and `nmo plan` alike) (the contract's `workload`): each pod's ReplicaSet or
//! StatefulSet, and the Deployment above a ReplicaSet, one GET per object,
//! a few at once, and one for every plan asking for the object at the same
//! moment ([`SharedReads`]).

use std::collections::HashMap;

use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;

use super::surge_record::SurgeMemory;
use crate::policy::workloads::{ObjectKey, Owners, Workloads};
use crate::sync::Locked;

/// Objects read at once.
const READS_AT_ONCE: usize = 8;

/// Reads the objects behind `pods` and resolves each pod's workload,
/// with the replicas as their owners set them (`surges`: what this
/// process's surges raised). An owner reference no request can be made
/// for is never followed (the pod has no workload, and
/// [`Workloads::unread`] says why); an object gone (404), or one the API
/// server will not give for a reason asking again does not change (a
/// 4xx: forbidden, invalid), leaves its pods with kind and name only; an
/// error that may pass (a 5xx, a 429, a lost connection) fails the read
/// (the plan is then asked again), so a policy never decides on numbers
/// it was not given by accident. `live` says whether a maintenance of a
/// given name exists (see [`SurgeMemory::replicas_as_set`]).
pub async fn read(
    client: &Client,
    shared: &SharedReads,
    (surges, live): (&SurgeMemory, &(dyn Fn(&str) -> bool + Sync)),
    pods: &[Pod],
) -> kube::Result<Workloads> {
    let mut owners = Owners::default();
    let to_read = Owners::controllers_to_read(pods);
    fetch(client, shared, (surges, live), to_read, &mut owners).await?;
    let deployments = owners.deployments_to_read();
    fetch(client, shared, (surges, live), deployments, &mut owners).await?;
    Ok(owners.resolve(pods))
}

/// One GET of an object shared by everyone asking for it while it is in
/// flight: the drains of five nodes planned at the same moment read each
/// owner their pods share once, not five times. Nothing is kept once the
/// answer is in (the next asks again), and a shared read that failed is
/// made again by each who asked, so each sees its own error.
#[derive(Default)]
pub struct SharedReads(std::sync::Mutex<HashMap<ObjectKey, InFlight>>);

/// A GET in flight; `None` when it failed.
type InFlight = Shared<BoxFuture<'static, Option<Option<Value>>>>;

impl std::fmt::Debug for SharedReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedReads")
    }
}

impl SharedReads {
    async fn get(&self, client: &Client, key: ObjectKey) -> kube::Result<Option<Value>> {
        let read = {
            let mut map = self.0.locked();
            map.entry(key.clone())
                .or_insert_with(|| {
                    let (client, key) = (client.clone(), key.clone());
                    async move { get(&client, key).await.ok() }.boxed().shared()
                })
                .clone()
        };
        let answer = read.clone().await;
        {
            let mut map = self.0.locked();
            if map.get(&key).is_some_and(|r| r.ptr_eq(&read)) {
                map.remove(&key);
            }
        }
        match answer {
            Some(object) => Ok(object),
            None => get(client, key).await,
        }
    }
}

/// GETs each of `keys` into `owners`, with the replicas its owner set
/// (not those a surge raised).
async fn fetch(
    client: &Client,
    shared: &SharedReads,
    (surges, live): (&SurgeMemory, &(dyn Fn(&str) -> bool + Sync)),
    keys: Vec<ObjectKey>,
    owners: &mut Owners,
) -> kube::Result<()> {
    let objects: Vec<Option<Value>> = stream::iter(keys)
        .map(|k| shared.get(client, k))
        .buffer_unordered(READS_AT_ONCE)
        .try_collect()
        .await?;
    for mut object in objects.into_iter().flatten() {
        let replicas = surges.replicas_as_set(&object, live);
        object["spec"]["replicas"] = replicas.into();
        owners.insert(object);
    }
    Ok(())
}

async fn get(client: &Client, key: ObjectKey) -> kube::Result<Option<Value>> {
    let Some(kind) = Kind::parse(&key.kind) else {
        return Ok(None);
    };
    let resource = kind.resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.namespace, &resource);
    let object = match api.get_opt(&key.name).await {
        Ok(Some(object)) => object,
        Ok(None) => return Ok(None),
        Err(e) if lasting(&e) => {
            tracing::warn!(owner = %format!("{} {}/{}", key.kind, key.namespace, key.name), error = %crate::text::api_error(&e), "a pod's owner cannot be read; its pods get kind and name only");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut value = serde_json::to_value(&object).unwrap_or_default();
    value["kind"] = key.kind.into();
    Ok(Some(value))
}

/// Whether reading again would fail the same way: the API server's own
/// refusal of this request (a 4xx other than 408 and 429), or a request
/// that could not be built.
fn lasting(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => (400..500).contains(&s.code) && s.code != 408 && s.code != 429,
        kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => true,
        _ => false,
    }
}

/// A workload kind the operator reads or scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Deployment,
    ReplicaSet,
    StatefulSet,
}

impl Kind {
    /// The kind named `kind`, if it is one of these.
    pub fn parse(kind: &str) -> Option<Kind> {
        match kind {
            "Deployment" => Some(Kind::Deployment),
            "ReplicaSet" => Some(Kind::ReplicaSet),
            "StatefulSet" => Some(Kind::StatefulSet),
            _ => None,
        }
    }

    /// Its name, as in an object's `kind`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::ReplicaSet => "ReplicaSet",
            Kind::StatefulSet => "StatefulSet",
        }
    }

    /// Its API resource (apps/v1).
    pub fn resource(self) -> ApiResource {
        match self {
            Kind::Deployment => ApiResource::erase::<Deployment>(&()),
            Kind::ReplicaSet => ApiResource::erase::<ReplicaSet>(&()),
            Kind::StatefulSet => ApiResource::erase::<StatefulSet>(&()),
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_reads_back_as_its_name_and_resource() {
        for kind in [Kind::Deployment, Kind::ReplicaSet, Kind::StatefulSet] {
            assert_eq!(Kind::parse(kind.name()), Some(kind));
            assert_eq!(kind.resource().kind, kind.name());
            assert_eq!(kind.resource().api_version, "apps/v1");
        }
        assert_eq!(Kind::parse("DaemonSet"), None);
    }
}
