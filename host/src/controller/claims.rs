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
//!
//! An API that is not served is looked for again every
//! [`Settings::tool_api_recheck`](super::Settings) (five minutes: its CRD
//! may be installed later).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use super::follow::Change;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;

/// How often an API that is not served is looked for again.
pub const LOOK_AGAIN: Duration = Duration::from_secs(300);

/// A tool whose objects claim nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tool {
    ClusterApi,
    Nvidia,
}

impl Tool {
    pub const ALL: [Tool; 2] = [Tool::ClusterApi, Tool::Nvidia];

    fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Tool::ClusterApi => ("cluster.x-k8s.io", "v1beta1", "Machine", "machines"),
            Tool::Nvidia => (
                "maintenance.nvidia.com",
                "v1alpha1",
                "NodeMaintenance",
                "nodemaintenances",
            ),
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
        }
    }

    /// The node `obj` claims, if it claims one now.
    fn node_of(self, obj: &DynamicObject) -> Option<String> {
        let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
        match self {
            Tool::ClusterApi => {
                obj.metadata.deletion_timestamp.as_ref()?;
                text(&obj.data["status"]["nodeRef"]["name"])
            }
            Tool::Nvidia => text(&obj.data["spec"]["nodeName"]),
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
pub struct ToolClaims {
    by_object: Mutex<BTreeMap<(Tool, String), (String, String)>>,
}

impl ToolClaims {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<(Tool, String), (String, String)>> {
        self.by_object.lock().unwrap_or_else(|p| p.into_inner())
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
                    if let Some(node) = tool.node_of(&o) {
                        map.insert(key(&o), (node, tool.shown(&o)));
                    }
                }
            }
            Change::Applied(o) => match tool.node_of(&o) {
                Some(node) => {
                    self.map().insert(key(&o), (node, tool.shown(&o)));
                }
                None => {
                    self.map().remove(&key(&o));
                }
            },
            Change::Deleted(o) => {
                self.map().remove(&key(&o));
            }
        })
        .await;
    }

    /// Every claimed node's claims.
    pub fn by_node(&self) -> HashMap<String, Vec<String>> {
        group(self.map().values().cloned())
    }
}

fn group(claims: impl Iterator<Item = (String, String)>) -> HashMap<String, Vec<String>> {
    let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
    for (node, shown) in claims {
        by_node.entry(node).or_default().push(shown);
    }
    by_node
}

/// Whether `api` is served (a list of one answers).
async fn served(api: &Api<DynamicObject>) -> bool {
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(e) => {
            tracing::debug!(logger = "controller", error = %e, "could not tell whether a tool's API is served");
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
            Ok(list) => claims.extend(
                list.items
                    .iter()
                    .filter_map(|o| Some((tool.node_of(o)?, tool.shown(o)))),
            ),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(group(claims.into_iter()))
}
