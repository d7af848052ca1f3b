//! Reads the workloads behind a node's pods for a policy that asks for
//! them (for the drain and `nmo plan` alike) (the contract's `workload`): each pod's ReplicaSet or
//! StatefulSet, and the Deployment above a ReplicaSet, one GET per object,
//! a few at once.

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;

use super::surge_record::replicas_as_set;
use crate::policy::workloads::{ObjectKey, Owners, Workloads};

/// Objects read at once.
const READS_AT_ONCE: usize = 8;

/// Reads the objects behind `pods` and resolves each pod's workload. An
/// object gone (404) leaves its pods with kind and name only; any other
/// error fails the read (the plan is then asked again), so a policy never
/// decides on numbers it was not given by accident.
pub async fn read(client: &Client, pods: &[Pod]) -> kube::Result<Workloads> {
    let mut owners = Owners::default();
    fetch(client, Owners::controllers_to_read(pods), &mut owners).await?;
    let deployments = owners.deployments_to_read();
    fetch(client, deployments, &mut owners).await?;
    Ok(owners.resolve(pods))
}

/// GETs each of `keys` into `owners`, with the replicas its owner set
/// (not those a surge raised).
async fn fetch(client: &Client, keys: Vec<ObjectKey>, owners: &mut Owners) -> kube::Result<()> {
    let objects: Vec<Option<Value>> = stream::iter(keys)
        .map(|k| get(client, k))
        .buffer_unordered(READS_AT_ONCE)
        .try_collect()
        .await?;
    for mut object in objects.into_iter().flatten() {
        let replicas = replicas_as_set(&object);
        object["spec"]["replicas"] = replicas.into();
        owners.insert(object);
    }
    Ok(())
}

async fn get(client: &Client, key: ObjectKey) -> kube::Result<Option<Value>> {
    let resource = match key.kind.as_str() {
        "ReplicaSet" => ApiResource::erase::<ReplicaSet>(&()),
        "StatefulSet" => ApiResource::erase::<StatefulSet>(&()),
        _ => ApiResource::erase::<Deployment>(&()),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.namespace, &resource);
    let Some(object) = api.get_opt(&key.name).await? else {
        return Ok(None);
    };
    let mut value = serde_json::to_value(&object).unwrap_or_default();
    value["kind"] = key.kind.into();
    Ok(Some(value))
}
