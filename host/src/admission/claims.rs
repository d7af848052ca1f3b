//! Other tools' own records that they are taking a node down, watched
//! while the controller runs (when their API is served), for the fleet's
//! `node.tool-claims`:
//!
//! - Cluster API: a `cluster.x-k8s.io/v1beta1` Machine whose
//!   `status.nodeRef.name` is the node and that is being deleted
//!   (`metadata.deletionTimestamp`: Cluster API drains and removes its
//!   node); `cluster-api <namespace>/<machine>`.
//! - NVIDIA's maintenance operator: a `maintenance.nvidia.com/v1alpha1`
//!   NodeMaintenance whose `spec.nodeName` is the node, for as long as it
//!   exists (deleting it gives the node back); `nvidia <namespace>/<name>`.
//! - kured: its reboot lock, the annotation `weave.works/kured-node-lock`
//!   on its own DaemonSet (kured's default `--lock-annotation`, on
//!   whichever DaemonSet carries it), naming the node that reboots (or,
//!   with `--concurrency` above 1, the nodes), until the lock's TTL runs
//!   out (a TTL of 0: until kured releases it); `kured <namespace>/<ds>`.
//!
//! An API that is not served is looked for again every
//! `Settings::tool_api_recheck` (the controller's) (five minutes: its CRD
//! may be installed later).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::follow::Change;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::sync::Locked;

/// How often an API that is not served is looked for again.
pub(crate) const LOOK_AGAIN: Duration = Duration::from_secs(300);

/// A tool whose objects claim nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Tool {
    ClusterApi,
    Nvidia,
    Kured,
}

/// kured's lock: the annotation on its DaemonSet (its default
/// `--lock-annotation`).
pub(crate) const KURED_LOCK: &str = "weave.works/kured-node-lock";

/// Nodes read from one kured lock at most (its `--concurrency`).
const KURED_LOCKS_READ: usize = 256;

/// One node an object claims, until when (`None`: for as long as the
/// object says so).
#[derive(Debug, Clone)]
struct Held {
    node: String,
    shown: String,
    until: Option<Timestamp>,
}

impl Held {
    fn valid(&self, now: Timestamp) -> bool {
        self.until.is_none_or(|until| now < until)
    }
}

impl Tool {
    pub const ALL: [Tool; 3] = [Tool::ClusterApi, Tool::Nvidia, Tool::Kured];

    fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Tool::ClusterApi => ("cluster.x-k8s.io", "v1beta1", "Machine", "machines"),
            Tool::Nvidia => (
                "maintenance.nvidia.com",
                "v1alpha1",
                "NodeMaintenance",
                "nodemaintenances",
            ),
            Tool::Kured => ("apps", "v1", "DaemonSet", "daemonsets"),
        };
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Tool::ClusterApi => "cluster-api",
            Tool::Nvidia => "nvidia",
            Tool::Kured => "kured",
        }
    }

    /// The nodes `obj` claims.
    fn held(self, obj: &DynamicObject) -> Vec<Held> {
        let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
        let shown = self.shown(obj);
        let until_removed = |node: Option<String>| {
            node.map(|node| Held {
                node,
                shown: shown.clone(),
                until: None,
            })
            .into_iter()
            .collect()
        };
        match self {
            Tool::ClusterApi => until_removed(
                obj.metadata
                    .deletion_timestamp
                    .as_ref()
                    .and_then(|_| text(&obj.data["status"]["nodeRef"]["name"])),
            ),
            Tool::Nvidia => until_removed(text(&obj.data["spec"]["nodeName"])),
            Tool::Kured => obj
                .annotations()
                .get(KURED_LOCK)
                .map(|lock| {
                    kured_locks(lock)
                        .into_iter()
                        .map(|(node, until)| Held {
                            node,
                            shown: shown.clone(),
                            until,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// What the policy reads for `obj`.
    fn shown(self, obj: &DynamicObject) -> String {
        format!(
            "{} {}/{}",
            self.name(),
            obj.namespace().unwrap_or_default(),
            obj.name_any()
        )
    }
}

/// The claims, by tool and object.
#[derive(Debug, Default)]
pub(crate) struct ToolClaims {
    by_object: Mutex<BTreeMap<(Tool, String), Vec<Held>>>,
}

impl ToolClaims {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<(Tool, String), Vec<Held>>> {
        self.by_object.locked()
    }

    /// Watches every tool's objects until the task is dropped.
    pub async fn watch(&self, client: Client, look_again: Duration) {
        futures::future::join_all(
            Tool::ALL.map(|t| self.watch_tool(client.clone(), t, look_again)),
        )
        .await;
    }

    async fn watch_tool(&self, client: Client, tool: Tool, look_again: Duration) {
        let api: Api<DynamicObject> = Api::all_with(client, &tool.resource());
        // Not served (no CRD): look again later.
        while !served(&api).await {
            tokio::time::sleep(look_again).await;
        }
        let key = |o: &DynamicObject| {
            (
                tool,
                format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
            )
        };
        super::follow::follow(api, tool.name(), |change| match change {
            Change::Listed(all) => {
                let mut map = self.map();
                map.retain(|(t, _), _| *t != tool);
                for o in all {
                    let held = tool.held(&o);
                    if !held.is_empty() {
                        map.insert(key(&o), held);
                    }
                }
            }
            Change::Applied(o) => {
                let held = tool.held(&o);
                if held.is_empty() {
                    self.map().remove(&key(&o));
                } else {
                    self.map().insert(key(&o), held);
                }
            }
            Change::Deleted(o) => {
                self.map().remove(&key(&o));
            }
        })
        .await;
    }

    /// Every claimed node's claims now (a lock whose TTL ran out claims
    /// nothing, with no change to watch).
    pub fn by_node(&self) -> HashMap<String, Vec<String>> {
        group(self.map().values().flatten().cloned())
    }
}

/// The claims by node, those still valid.
fn group(claims: impl Iterator<Item = Held>) -> HashMap<String, Vec<String>> {
    let now = Timestamp::now();
    let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
    for held in claims.filter(|h| h.valid(now)) {
        by_node.entry(held.node).or_default().push(held.shown);
    }
    by_node
}

/// The nodes a kured lock names, each until its TTL runs out: a single
/// lock (`{"nodeID", "created", "TTL"}`, the TTL in nanoseconds as Go
/// writes a `time.Duration`; 0: no end) or kured's multi-node lock
/// (`{"maxOwners", "locks": [...]}`). What cannot be read is no claim.
fn kured_locks(lock: &str) -> Vec<(String, Option<Timestamp>)> {
    let Ok(value) = serde_json::from_str::<Value>(lock) else {
        return Vec::new();
    };
    let locks = match value.get("locks") {
        Some(Value::Array(locks)) => locks.iter().collect(),
        Some(_) => Vec::new(),
        None => vec![&value],
    };
    locks
        .into_iter()
        .take(KURED_LOCKS_READ)
        .filter_map(|l| {
            let node = l["nodeID"]
                .as_str()
                .filter(|n| !n.is_empty() && n.len() <= 253)?;
            let ttl = l["TTL"].as_i64().unwrap_or(0);
            let until = if ttl > 0 {
                let created: Timestamp = l["created"].as_str()?.parse().ok()?;
                Some(
                    created
                        .saturating_add(SignedDuration::from_nanos(ttl))
                        .ok()?,
                )
            } else {
                None
            };
            Some((node.to_owned(), until))
        })
        .collect()
}

/// Whether `api` is served (a list of one answers).
async fn served(api: &Api<DynamicObject>) -> bool {
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(e) => {
            tracing::debug!(error = %e, "could not tell whether a tool's API is served");
            false
        }
    }
}

/// Every claimed node's claims, as listed (for the webhook and `nmo
/// plan`, which run no watch). An API that is not served claims nothing.
pub async fn list(client: &Client) -> kube::Result<HashMap<String, Vec<String>>> {
    let mut claims = Vec::new();
    for tool in Tool::ALL {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &tool.resource());
        match api.list(&ListParams::default()).await {
            Ok(list) => claims.extend(list.items.iter().flat_map(|o| tool.held(o))),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            // The operator may not read this tool's objects (the Go
            // operator's RBAC, under nmo swapped into its Deployment): its
            // claims are not seen, and the log says so.
            Err(kube::Error::Api(e)) if e.code == 403 => {
                tracing::warn!(error = %e.message, "the operator may not list another tool's claims; admission does not see them (deploy/rbac grants it)");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(group(claims.into_iter()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kured's two lock forms as kured writes them; a TTL that ran out
    /// claims nothing; what cannot be read claims nothing.
    #[test]
    fn kured_locks_as_kured_writes_them() {
        let single = r#"{"nodeID":"worker-4","metadata":{"unschedulable":false},"created":"2026-12-05T07:00:00Z","TTL":0}"#;
        assert_eq!(kured_locks(single), vec![("worker-4".to_owned(), None)]);
        let multi = r#"{"maxOwners":2,"locks":[
            {"nodeID":"worker-1","metadata":{"unschedulable":false},"created":"2026-12-05T07:00:00Z","TTL":1800000000000},
            {"nodeID":"worker-2","metadata":{"unschedulable":true},"created":"2026-12-05T07:10:00Z","TTL":0}]}"#;
        let read = kured_locks(multi);
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].0, "worker-1");
        assert_eq!(
            read[0].1,
            Some("2026-12-05T07:30:00Z".parse().unwrap()),
            "created plus 30m"
        );
        assert_eq!(read[1], ("worker-2".to_owned(), None));
        for unreadable in [
            "",
            "worker-4",
            r#"{"nodeID":""}"#,
            r#"{"locks":"worker-4"}"#,
            r#"{"nodeID":"worker-4","TTL":5,"created":"yesterday"}"#,
        ] {
            assert_eq!(kured_locks(unreadable), vec![], "{unreadable:?}");
        }
        let expired = Held {
            node: "worker-1".into(),
            shown: "kured kube-system/kured".into(),
            until: read[0].1,
        };
        assert!(!expired.valid("2026-12-05T07:30:00Z".parse().unwrap()));
        assert!(expired.valid("2026-12-05T07:29:59Z".parse().unwrap()));
        let many = format!(
            r#"{{"maxOwners":9999,"locks":[{}]}}"#,
            vec![r#"{"nodeID":"n","TTL":0}"#; 10_000].join(",")
        );
        assert_eq!(kured_locks(&many).len(), KURED_LOCKS_READ, "bounded");
    }
}
