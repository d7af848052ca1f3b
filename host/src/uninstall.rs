//! What an uninstall leaves behind and nothing else removes: the leader
//! lease (its holder could not release it: `helm uninstall` deletes the
//! Role as the pods terminate) and the webhook's certificate Secret
//! (cert-manager keeps a Secret when its Certificate goes). What the Helm
//! chart's post-delete hook runs (`nmo cleanup`), once the release's
//! objects are deleted.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};

use crate::controller::leader::LOCK_NAME;
use crate::error::{Error, Result};

/// The webhook certificate's Secret, as deploy/certmanager names it.
pub const WEBHOOK_SECRET: &str = "webhook-server-cert";
/// The Certificate that fills it.
pub const WEBHOOK_CERTIFICATE: &str = "node-maintenance-operator-serving-cert";
/// The operator's pods' label.
const OPERATOR_PODS: &str = "control-plane=controller-manager";

/// What [`clean_up`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    pub lease: bool,
    pub secret: bool,
}

/// Waits, at most `wait`, until no operator pod is left in `namespace`,
/// then deletes the leader lease (when no pod holds it) and the webhook's
/// Secret (when its Certificate is gone). Anything still in use stays.
pub async fn clean_up(client: &Client, namespace: &str, wait: Duration) -> Result<Cleaned> {
    operator_pods_gone(client, namespace, wait).await?;
    Ok(Cleaned {
        lease: delete_stale_lease(client, namespace).await?,
        secret: delete_orphaned_secret(client, namespace).await?,
    })
}

/// Polls the operator's pods until none is left, failing after `wait`.
async fn operator_pods_gone(client: &Client, namespace: &str, wait: Duration) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let left = pods
            .list(&ListParams::default().labels(OPERATOR_PODS))
            .await
            .map_err(Error::kube("listing the operator's pods"))?
            .items
            .len();
        if left == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::PodsRemain {
                left,
                namespace: namespace.to_owned(),
                waited: wait,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Deletes the leader lease unless its holder's pod exists (another
/// install of the operator leading from this namespace).
async fn delete_stale_lease(client: &Client, namespace: &str) -> Result<bool> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let Some(lease) = leases
        .get_opt(LOCK_NAME)
        .await
        .map_err(Error::kube("reading the leader lease"))?
    else {
        return Ok(false);
    };
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    if let Some((pod, _)) = holder.rsplit_once('_') {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        if pods
            .get_opt(pod)
            .await
            .map_err(Error::kube("reading the lease holder's pod"))?
            .is_some()
        {
            return Ok(false);
        }
    }
    deleted(leases.delete(LOCK_NAME, &DeleteParams::default()).await)
        .map_err(Error::kube("deleting the leader lease"))
}

/// Deletes the webhook's Secret once its Certificate is gone (while it
/// exists, cert-manager would only issue it again).
async fn delete_orphaned_secret(client: &Client, namespace: &str) -> Result<bool> {
    let certificates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cert-manager.io",
            "v1",
            "Certificate",
        )),
    );
    match certificates.get_opt(WEBHOOK_CERTIFICATE).await {
        Ok(Some(_)) => return Ok(false),
        Ok(None) => {}
        // No cert-manager at all: no Certificate.
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(Error::kube("reading the webhook's Certificate")(e)),
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    deleted(
        secrets
            .delete(WEBHOOK_SECRET, &DeleteParams::default())
            .await,
    )
    .map_err(Error::kube("deleting the webhook's certificate Secret"))
}

/// A delete's outcome: true when it deleted, false when there was nothing.
fn deleted<T>(
    result: std::result::Result<T, kube::Error>,
) -> std::result::Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}
