//! The workloads behind the pods of a plan (the contract's `workload`,
//! 0.4): which objects to read for them, and what a policy sees once they
//! are read.
//!
//! The reading itself is the caller's (the controller and `nmo plan` read
//! the API; the scenario harness reads its `workloads:` objects): both
//! hand the objects, as JSON, to [`Owners`], which resolves each pod to its
//! [`Workload`] the same way.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::bindings::types::Workload;

/// The kinds whose objects are read: a pod's controller of these kinds
/// has replicas, and a ReplicaSet may have a Deployment above it.
pub const READ_KINDS: [&str; 3] = ["ReplicaSet", "StatefulSet", "Deployment"];

/// An object to read: its kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// Each pod's workload, by pod uid, for one decision.
#[derive(Clone, Debug, Default)]
pub struct Workloads(Arc<HashMap<String, Workload>>);

impl Workloads {
    /// The workload of the pod with `uid`, if it has one.
    pub fn of(&self, uid: &str) -> Option<&Workload> {
        self.0.get(uid)
    }
}

/// The objects read for a plan's pods: controllers, and the Deployments
/// above ReplicaSets.
#[derive(Debug, Default)]
pub struct Owners(HashMap<ObjectKey, Value>);

fn controller(
    pod: &Pod,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

fn namespace_of(pod: &Pod) -> String {
    pod.metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned())
}

/// The controller (kind, name) of an object given as JSON.
fn controller_of(object: &Value) -> Option<(&str, &str)> {
    let refs = object["metadata"]["ownerReferences"].as_array()?;
    let o = refs
        .iter()
        .find(|o| o["controller"].as_bool() == Some(true))?;
    Some((o["kind"].as_str()?, o["name"].as_str()?))
}

impl Owners {
    /// The objects of `values` (Deployments, ReplicaSets, StatefulSets as
    /// `kubectl get -o json` shows them; others are ignored).
    pub fn from_objects(values: impl IntoIterator<Item = Value>) -> Self {
        let mut owners = Owners::default();
        for v in values {
            owners.insert(v);
        }
        owners
    }

    /// Adds one object read (a namespace-less one is in `default`).
    pub fn insert(&mut self, object: Value) {
        let (Some(kind), Some(name)) =
            (object["kind"].as_str(), object["metadata"]["name"].as_str())
        else {
            return;
        };
        if !READ_KINDS.contains(&kind) {
            return;
        }
        let key = ObjectKey {
            kind: kind.to_owned(),
            namespace: object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned(),
            name: name.to_owned(),
        };
        self.0.insert(key, object);
    }

    /// The pods' controllers to read (ReplicaSets and StatefulSets), each
    /// once, in order.
    pub fn controllers_to_read(pods: &[Pod]) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = pods
            .iter()
            .filter_map(|p| {
                let c = controller(p)?;
                READ_KINDS[..2]
                    .contains(&c.kind.as_str())
                    .then(|| ObjectKey {
                        kind: c.kind.clone(),
                        namespace: namespace_of(p),
                        name: c.name.clone(),
                    })
            })
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// The Deployments above the ReplicaSets read so far, each once.
    pub fn deployments_to_read(&self) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = self
            .0
            .iter()
            .filter(|(k, _)| k.kind == "ReplicaSet")
            .filter_map(|(k, v)| match controller_of(v)? {
                ("Deployment", name) => Some(ObjectKey {
                    kind: "Deployment".to_owned(),
                    namespace: k.namespace.clone(),
                    name: name.to_owned(),
                }),
                _ => None,
            })
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.0.get(&ObjectKey {
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Each pod's workload: its controller, or the Deployment above its
    /// ReplicaSet; kind and name only when the object was not read.
    pub fn resolve(&self, pods: &[Pod]) -> Workloads {
        let mut by_uid = HashMap::new();
        for pod in pods {
            let (Some(uid), Some(c)) = (pod.metadata.uid.as_ref(), controller(pod)) else {
                continue;
            };
            let ns = namespace_of(pod);
            let mut top = (
                c.kind.as_str(),
                c.name.as_str(),
                self.get(&c.kind, &ns, &c.name),
            );
            if let Some(("Deployment", name)) = top.2.and_then(controller_of) {
                top = ("Deployment", name, self.get("Deployment", &ns, name));
            }
            by_uid.insert(uid.clone(), workload(top.0, top.1, top.2));
        }
        Workloads(Arc::new(by_uid))
    }
}

/// A workload of `kind` and `name`, with the numbers of its object when
/// it was read.
fn workload(kind: &str, name: &str, object: Option<&Value>) -> Workload {
    let number = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
    let counted = object.filter(|_| READ_KINDS.contains(&kind));
    let replicas = counted.map(replicas_of);
    let (max_surge, max_unavailable) = match (kind, counted, replicas) {
        ("Deployment", Some(d), Some(r)) => (
            Some(deployment_max_surge(d, r)),
            Some(deployment_max_unavailable(d, r)),
        ),
        ("StatefulSet", Some(s), Some(r)) => (None, Some(stateful_max_unavailable(s, r))),
        _ => (None, None),
    };
    Workload {
        kind: kind.to_owned(),
        name: name.to_owned(),
        replicas: replicas.map(number),
        ready_replicas: counted.map(|o| number(o["status"]["readyReplicas"].as_i64().unwrap_or(0))),
        max_surge: max_surge.map(number),
        max_unavailable: max_unavailable.map(number),
    }
}

/// An owner's `spec.replicas` (its object, as JSON); unset is 1, the
/// API's default.
pub fn replicas_of(data: &Value) -> i64 {
    data["spec"]["replicas"].as_i64().unwrap_or(1)
}

/// An intstr (a number, or a percentage of `replicas` rounded up or
/// down); `default` when unset or unreadable.
fn int_or_percent(v: &Value, replicas: i64, round_up: bool, default: &str) -> i64 {
    let percent = |pct: i64| {
        let scaled = replicas.saturating_mul(pct);
        if round_up {
            scaled.saturating_add(99) / 100
        } else {
            scaled / 100
        }
    };
    let text = match v {
        Value::Number(n) => return n.as_i64().unwrap_or(0),
        Value::String(s) => s.as_str(),
        _ => default,
    };
    match text.strip_suffix('%').map(str::parse::<i64>) {
        Some(Ok(pct)) => percent(pct),
        _ => text
            .parse()
            .unwrap_or_else(|_| percent(default.trim_end_matches('%').parse().unwrap_or(25))),
    }
}

fn recreate(d: &Value) -> bool {
    d["spec"]["strategy"]["type"].as_str() == Some("Recreate")
}

/// A Deployment's `maxSurge` (its object, as JSON) resolved against
/// `replicas`: a number as given, a percentage rounded up, 25 % when
/// unset (the API's default); 0 for the Recreate strategy.
pub fn deployment_max_surge(d: &Value, replicas: i64) -> i64 {
    if recreate(d) {
        return 0;
    }
    let v = &d["spec"]["strategy"]["rollingUpdate"]["maxSurge"];
    int_or_percent(v, replicas, true, "25%")
}

/// A Deployment's `maxUnavailable` resolved against `replicas`: a
/// percentage rounded down, 25 % when unset; 0 for Recreate (which takes
/// every pod down at once: no rolling bound to give).
pub(crate) fn deployment_max_unavailable(d: &Value, replicas: i64) -> i64 {
    if recreate(d) {
        return 0;
    }
    let v = &d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"];
    int_or_percent(v, replicas, false, "25%")
}

/// A StatefulSet's `updateStrategy.rollingUpdate.maxUnavailable` resolved
/// against `replicas` (rounded down, at least 1 as the controller uses
/// it); 1 when unset.
pub(crate) fn stateful_max_unavailable(s: &Value, replicas: i64) -> i64 {
    let v = &s["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"];
    int_or_percent(v, replicas, false, "1").max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, kind: &str, name: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "namespace": "shop", "uid": uid,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_replica_set_pod_shows_its_deployment_with_resolved_bounds() {
        let owners = Owners::from_objects([
            json!({"kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "shop",
                "ownerReferences": [{"kind": "Deployment", "name": "web", "controller": true}]},
                "spec": {"replicas": 10}}),
            json!({"kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"replicas": 10, "strategy": {"rollingUpdate": {"maxSurge": "30%", "maxUnavailable": 2}}},
                "status": {"readyReplicas": 9}}),
            json!({"kind": "StatefulSet", "metadata": {"name": "db", "namespace": "shop"}, "spec": {}}),
        ]);
        let pods = [
            pod("a", "ReplicaSet", "web-1"),
            pod("b", "StatefulSet", "db"),
            pod("c", "DaemonSet", "agent"),
            pod("d", "ReplicaSet", "gone"),
        ];
        assert_eq!(Owners::controllers_to_read(&pods).len(), 3);
        assert_eq!(owners.deployments_to_read()[0].name, "web");
        let w = owners.resolve(&pods);
        let web = w.of("a").unwrap();
        assert_eq!(
            (web.kind.as_str(), web.name.as_str()),
            ("Deployment", "web")
        );
        assert_eq!(
            (
                web.replicas,
                web.ready_replicas,
                web.max_surge,
                web.max_unavailable
            ),
            (Some(10), Some(9), Some(3), Some(2))
        );
        let db = w.of("b").unwrap();
        assert_eq!(
            (db.replicas, db.max_surge, db.max_unavailable),
            (Some(1), None, Some(1))
        );
        let agent = w.of("c").unwrap();
        assert_eq!((agent.kind.as_str(), agent.replicas), ("DaemonSet", None));
        let gone = w.of("d").unwrap();
        assert_eq!(
            (gone.kind.as_str(), gone.name.as_str(), gone.replicas),
            ("ReplicaSet", "gone", None)
        );
    }

    #[test]
    fn bounds_resolve_as_a_rollout_does() {
        let d = |strategy: Value| json!({"spec": {"strategy": strategy}});
        assert_eq!(deployment_max_surge(&d(json!({})), 8), 2);
        assert_eq!(deployment_max_surge(&d(json!({})), 1), 1);
        assert_eq!(deployment_max_unavailable(&d(json!({})), 1), 0);
        assert_eq!(deployment_max_unavailable(&d(json!({})), 8), 2);
        assert_eq!(deployment_max_surge(&d(json!({"type": "Recreate"})), 8), 0);
        assert_eq!(
            deployment_max_surge(&d(json!({"rollingUpdate": {"maxSurge": 0}})), 8),
            0
        );
        let s = json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "50%"}}}});
        assert_eq!(stateful_max_unavailable(&s, 5), 2);
    }
}
