//! Volumes detached before Succeeded: once the last pod is gone, the
//! drain waits for the node's VolumeAttachments to go (the CSI driver
//! detaches them when their pods have left), as Cluster API and Karpenter
//! wait before a node is shut down. Only when the policy's plan gives a
//! `volume-detach-timeout-ms`: the Go operator does not wait.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::time::Instant;

/// How often a waiting drain asks whether its maintenance is still
/// wanted (deleted, moved): a deletion ends the wait within this.
const CANCEL_CHECK: Duration = Duration::from_millis(250);

/// How a wait for the node's volumes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Detach {
    /// No VolumeAttachment of the node is left.
    Detached,
    /// The time ran out with these still attached.
    Left(Vec<String>),
    /// The maintenance is no longer wanted (deleted or moved).
    Cancelled,
}

/// Waits up to `timeout` for `node` to have no VolumeAttachment, from a
/// watch of them (no listing while it waits); `on_wait` is told what is
/// still attached whenever that changes; `cancelled` is asked at least
/// every [`CANCEL_CHECK`]. A watch that fails is retried with
/// kube-runtime's back-off; the wait's deadline bounds it.
pub(crate) async fn wait_detached(
    client: &Client,
    node: &str,
    timeout: Duration,
    on_wait: impl Fn(&[String]),
    cancelled: impl Fn() -> bool,
) -> Detach {
    let deadline = Instant::now() + timeout;
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    // Every attachment's node, by name; `synced` once the first list is in.
    let mut nodes: BTreeMap<String, String> = BTreeMap::new();
    let mut listing: BTreeMap<String, String> = BTreeMap::new();
    let mut synced = false;
    let mut last: Option<Vec<String>> = None;
    loop {
        if cancelled() {
            return Detach::Cancelled;
        }
        if synced {
            let names: Vec<String> = nodes
                .iter()
                .filter(|(_, n)| n.as_str() == node)
                .map(|(name, _)| name.clone())
                .collect();
            if names.is_empty() {
                return Detach::Detached;
            }
            if Instant::now() >= deadline {
                return Detach::Left(names);
            }
            if last.as_ref() != Some(&names) {
                on_wait(&names);
                last = Some(names);
            }
        } else if Instant::now() >= deadline {
            return Detach::Left(last.unwrap_or_default());
        }
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Init)) => listing.clear(),
                Some(Ok(watcher::Event::InitApply(va))) => {
                    listing.insert(va.name_any(), va.spec.node_name.clone());
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    nodes = std::mem::take(&mut listing);
                    synced = true;
                }
                Some(Ok(watcher::Event::Apply(va))) => {
                    nodes.insert(va.name_any(), va.spec.node_name.clone());
                }
                Some(Ok(watcher::Event::Delete(va))) => {
                    nodes.remove(&va.name_any());
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "watching VolumeAttachments; retrying");
                }
                None => return Detach::Left(last.unwrap_or_default()),
            },
            () = tokio::time::sleep_until(deadline) => {}
            () = tokio::time::sleep(CANCEL_CHECK) => {}
        }
    }
}

/// What the status says while the drain waits for `names`.
pub(crate) fn waiting_message(node: &str, names: &[String]) -> String {
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
