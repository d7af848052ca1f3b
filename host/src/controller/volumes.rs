//! Volumes detached before Succeeded: once the last pod is gone, the
//! drain waits for the node's VolumeAttachments to go (the CSI driver
//! detaches them when their pods have left), as Cluster API and Karpenter
//! wait before a node is shut down. Only when the policy's plan gives a
//! `volume-detach-timeout-ms`: the Go operator does not wait.

use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::time::Instant;

/// How often the attachments are looked at while the drain waits.
const POLL: Duration = Duration::from_millis(500);

/// The VolumeAttachments of `node`, by name.
pub async fn attached(client: &Client, node: &str) -> kube::Result<Vec<String>> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await?;
    let mut names: Vec<String> = list
        .items
        .iter()
        .filter(|va| va.spec.node_name == node)
        .map(|va| va.name_any())
        .collect();
    names.sort();
    Ok(names)
}

/// Waits up to `timeout` for `node` to have no VolumeAttachment;
/// `on_wait` is told what is still attached whenever that changes.
/// `Ok(names)`: still attached when the time ran out (empty: all gone).
pub async fn wait_detached(
    client: &Client,
    node: &str,
    timeout: Duration,
    on_wait: impl Fn(&[String]),
) -> kube::Result<Vec<String>> {
    let deadline = Instant::now() + timeout;
    let mut last: Option<Vec<String>> = None;
    loop {
        let names = attached(client, node).await?;
        if names.is_empty() || Instant::now() >= deadline {
            return Ok(names);
        }
        if last.as_ref() != Some(&names) {
            on_wait(&names);
            last = Some(names);
        }
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// What the status says while the drain waits for `names`.
pub fn waiting_message(node: &str, names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
    format!(
        "waiting for {} VolumeAttachment(s) of node {node} to detach: {}{}",
        names.len(),
        shown.join(", "),
        if names.len() > shown.len() {
            ", ..."
        } else {
            ""
        }
    )
}
