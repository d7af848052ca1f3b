//! The maintenances that ended (the fleet's `history`): each admitted
//! maintenance that gave its node back, with when it started and ended and
//! how. Kept in the ConfigMap [`CONFIGMAP`] of the lease namespace (so a
//! restarted operator, or the next leader, still sees the last day), for
//! [`MAX_HISTORY_WINDOW`] and at most [`MAX_ENTRIES`] entries; read once,
//! then kept in memory, written at every end.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, PostParams};
use serde::{Deserialize, Serialize};

use crate::policy::MAX_HISTORY_WINDOW;
use crate::policy::types::{EndedMaintenance, Outcome};

/// The ConfigMap, in the lease namespace.
pub(crate) const CONFIGMAP: &str = "nmo-maintenance-history";
/// Its key.
const KEY: &str = "history.json";
/// At most this many entries are kept.
pub(crate) const MAX_ENTRIES: usize = 2_000;

/// One maintenance that ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Ended {
    pub name: String,
    pub node: String,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// `Succeeded`, `Failed` or `Cancelled`.
    pub outcome: String,
}

impl Ended {
    fn wit(&self) -> EndedMaintenance {
        EndedMaintenance {
            name: self.name.clone(),
            node_name: self.node.clone(),
            started_ms: self.started_ms,
            ended_ms: self.ended_ms,
            outcome: match self.outcome.as_str() {
                "Succeeded" => Outcome::Succeeded,
                "Failed" => Outcome::Failed,
                _ => Outcome::Cancelled,
            },
        }
    }
}

/// The entry for `nm` ending now with `outcome`; `None` for a maintenance
/// never admitted (it held no node).
pub fn entry(nm: &crate::crd::NodeMaintenance, outcome: &str) -> Option<Ended> {
    if !crate::crd::is_admitted(nm) {
        return None;
    }
    let ms = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        u64::try_from(t.0.as_millisecond()).unwrap_or(0)
    };
    let status = nm.status.as_ref();
    let started = status
        .and_then(|s| s.admitted_at.as_ref())
        .or(nm.metadata.creation_timestamp.as_ref())
        .map_or(0, ms);
    Some(Ended {
        name: kube::ResourceExt::name_any(nm),
        node: nm.spec.node_name.clone(),
        started_ms: started,
        ended_ms: now_ms(),
        outcome: outcome.to_owned(),
    })
}

/// Every entry, as the contract has them (the policy's window is applied
/// where it is asked: `fleet::Around::ask`).
pub(crate) fn wit(history: &[Ended]) -> Vec<EndedMaintenance> {
    history.iter().map(Ended::wit).collect()
}

/// The log, in memory once read.
#[derive(Debug, Default)]
pub(crate) struct EndedLog {
    /// `None` until read from the ConfigMap.
    entries: tokio::sync::Mutex<Option<Vec<Ended>>>,
}

impl EndedLog {
    /// The entries (read from the ConfigMap the first time; an error reads
    /// as no history, and is tried again next time).
    pub async fn entries(&self, client: &Client, namespace: &str) -> Vec<Ended> {
        let mut held = self.entries.lock().await;
        if held.is_none() {
            match read(client, namespace).await {
                Ok(entries) => *held = Some(entries),
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the maintenance history; admission sees none for now");
                    return Vec::new();
                }
            }
        }
        held.clone().unwrap_or_default()
    }

    /// Records that a maintenance ended, and writes the log (kept to the
    /// last day and [`MAX_ENTRIES`]). A failed write is logged: the entry
    /// stays in memory and goes out with the next one.
    pub async fn record(&self, client: &Client, namespace: &str, entry: Ended) {
        let mut held = self.entries.lock().await;
        let mut entries = match held.take() {
            Some(e) => e,
            None => read(client, namespace).await.unwrap_or_default(),
        };
        if !entries
            .iter()
            .any(|e| e.name == entry.name && e.started_ms == entry.started_ms)
        {
            entries.push(entry);
        }
        prune(&mut entries, now_ms());
        if let Err(e) = write(client, namespace, &entries).await {
            tracing::warn!(error = %e, "could not write the maintenance history");
        }
        *held = Some(entries);
    }
}

/// Keeps the entries of the last [`MAX_HISTORY_WINDOW`], at most
/// [`MAX_ENTRIES`]. The ConfigMap is anyone's with write access to the
/// namespace: an entry that ends in the future (forged, or a clock far
/// ahead), or ends before it starts, is no maintenance that happened and
/// goes (a day-long "came back 0 ms ago" would hold every admission).
fn prune(entries: &mut Vec<Ended>, now_ms: u64) {
    let kept = MAX_HISTORY_WINDOW.as_millis() as u64;
    // A minute's grace for another replica's clock.
    let skew = 60_000;
    entries.retain(|e| {
        e.ended_ms.saturating_add(kept) >= now_ms
            && e.ended_ms <= now_ms.saturating_add(skew)
            && e.started_ms <= e.ended_ms
    });
    entries.sort_by_key(|e| e.ended_ms);
    let extra = entries.len().saturating_sub(MAX_ENTRIES);
    entries.drain(..extra);
}

/// [`read`], for admission: a history the operator may not read (the Go
/// operator's RBAC, which grants ConfigMaps only in its own namespace,
/// under nmo swapped into its Deployment) reads as none, and the log
/// says why. Admission goes on without it (a fleet rule that counts past
/// maintenances sees none), rather than refusing every maintenance.
pub(crate) async fn read_for_admission(
    client: &Client,
    namespace: &str,
) -> kube::Result<Vec<Ended>> {
    match read(client, namespace).await {
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::warn!(
                namespace,
                error = %e.message,
                "the operator may not read the maintenance history (ConfigMap {CONFIGMAP}); admission sees none: grant get on ConfigMaps in that namespace (deploy/rbac) for fleet rules that count past maintenances"
            );
            Ok(Vec::new())
        }
        other => other,
    }
}

/// The history in the ConfigMap (none when there is none).
pub async fn read(client: &Client, namespace: &str) -> kube::Result<Vec<Ended>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let Some(cm) = api.get_opt(CONFIGMAP).await? else {
        return Ok(Vec::new());
    };
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .map(String::as_str)
        .unwrap_or("[]");
    let mut entries: Vec<Ended> = serde_json::from_str(text).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the maintenance history does not read; starting it again");
        Vec::new()
    });
    // What is read is held to the bounds the operator writes with.
    let found = entries.len();
    prune(&mut entries, now_ms());
    if entries.len() < found {
        tracing::warn!(
            found,
            kept = entries.len(),
            "the maintenance history held entries out of bounds (in the future, past the window or the limit); they are dropped"
        );
    }
    Ok(entries)
}

async fn write(client: &Client, namespace: &str, entries: &[Ended]) -> kube::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let text = serde_json::to_string(entries).unwrap_or_else(|_| "[]".into());
    let data = BTreeMap::from([(KEY.to_owned(), text)]);
    match api.get_opt(CONFIGMAP).await? {
        Some(mut cm) => {
            cm.data = Some(data);
            api.replace(CONFIGMAP, &PostParams::default(), &cm).await?;
        }
        None => {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(CONFIGMAP.into()),
                    namespace: Some(namespace.into()),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await?;
        }
    }
    Ok(())
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> u64 {
    u64::try_from(k8s_openapi::jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(name: &str, started_ms: u64, ended_ms: u64) -> Ended {
        Ended {
            name: name.into(),
            node: "n".into(),
            started_ms,
            ended_ms,
            outcome: "Succeeded".into(),
        }
    }

    /// Entries a workload forged (in the future, dated u64::MAX, ending
    /// before they start) or past the limit do not survive a read.
    #[test]
    fn forged_and_excess_entries_are_pruned() {
        let now = 1_800_000_000_000u64;
        let mut entries = vec![
            ended("real", now - 10_000, now - 5_000),
            ended("future", now, now + 3_600_000),
            ended("max", u64::MAX, u64::MAX),
            ended("backwards", now - 1_000, now - 2_000),
        ];
        entries.extend((0..3_000).map(|i| ended(&format!("bulk-{i}"), now - 9_000, now - 8_000)));
        prune(&mut entries, now);
        assert_eq!(entries.len(), MAX_ENTRIES);
        assert!(entries.iter().any(|e| e.name == "real"));
        assert!(
            !entries
                .iter()
                .any(|e| matches!(e.name.as_str(), "future" | "max" | "backwards"))
        );
    }
}
