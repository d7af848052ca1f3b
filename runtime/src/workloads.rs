//! The workloads behind the pods of a plan (the contract's `workload`,
//! 0.4): which objects to read for them, and what a policy sees once they
//! are read.
//!
//! The reading itself is the caller's (the controller and `nmo plan` read
//! the API; the scenario harness reads its `workloads:` objects): both
//! hand the objects, as JSON, to [`Owners`], which resolves each pod to its
//! [`Workload`] the same way.
//!
//! Everything here comes from objects a tenant may write (a pod's owner
//! references, its owner's numbers), so this is the one bounded reader of
//! them: an owner reference is followed only when a request for it can be
//! made ([`readable_controller`]: `apps/v1`, a name the API server could
//! hold); every number is clamped as Kubernetes clamps it (replicas to an
//! int32 of at least 0, a Deployment's `maxUnavailable` to its replicas, a
//! StatefulSet's to at least 1); a pod whose owner cannot be read has no
//! workload, and why is kept ([`Workloads::unread`]), never a failed plan
//! for the node.

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

/// Each pod's workload, by pod uid, for one decision; and the pods whose
/// owner could not be read, with why (they have none).
#[derive(Clone, Debug, Default)]
pub struct Workloads {
    by_uid: Arc<HashMap<String, Workload>>,
    unread: Arc<Vec<Unread>>,
}

/// A pod whose owner reference cannot be followed.
#[derive(Clone, Debug, PartialEq)]
pub struct Unread {
    pub uid: String,
    /// `namespace/name` (a name past 64 characters shortened).
    pub pod: String,
    pub why: String,
}

impl Workloads {
    /// The workload of the pod with `uid`, if it has one.
    pub fn of(&self, uid: &str) -> Option<&Workload> {
        self.by_uid.get(uid)
    }

    /// The pods whose owner could not be read, and why: they have no
    /// workload.
    pub fn unread(&self) -> &[Unread] {
        &self.unread
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

/// Why the pod's controller reference cannot be followed, if it cannot:
/// an owner this reader would read (a ReplicaSet or StatefulSet) named
/// with an apiVersion other than `apps/v1`, or with a name no object of
/// the API server can have (empty, past 253 characters, or not a DNS
/// subdomain). The API server and its garbage collector accept such
/// references on a pod; a request built from them fails, so they are
/// never sent.
pub fn unreadable_controller(pod: &Pod) -> Option<String> {
    let c = controller(pod)?;
    if !READ_KINDS[..2].contains(&c.kind.as_str()) {
        return None;
    }
    if c.api_version != "apps/v1" {
        return Some(format!(
            "its controller {} {:?} names apiVersion {:?}, not apps/v1",
            c.kind,
            shortened(&c.name),
            shortened(&c.api_version)
        ));
    }
    (!is_dns_subdomain(&c.name)).then(|| {
        format!(
            "its controller {} {:?} has a name no object can have",
            c.kind,
            shortened(&c.name)
        )
    })
}

/// The pod's controller when it is one to read: see
/// [`unreadable_controller`].
fn readable_controller(
    pod: &Pod,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    controller(pod).filter(|_| unreadable_controller(pod).is_none())
}

/// At most 64 characters of `s`, for a message (a name may be 70,000).
fn shortened(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_owned(),
    }
}

/// A DNS subdomain as Kubernetes validates object names (RFC 1123: at
/// most 253 characters of lowercase letters, digits, '-' and '.', each
/// dot-separated part starting and ending with a letter or digit; no
/// limit on a part's length, as `IsDNS1123Subdomain`).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

fn namespace_of(pod: &Pod) -> String {
    pod.metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned())
}

/// The controller (kind, name) of an object given as JSON, when it is one
/// a request can be made for (`apps/v1`, a name an object can have; see
/// [`unreadable_controller`]): a ReplicaSet's owner reference is written
/// by whoever may write the ReplicaSet.
fn controller_of(object: &Value) -> Option<(&str, &str)> {
    let refs = object["metadata"]["ownerReferences"].as_array()?;
    let o = refs
        .iter()
        .find(|o| o["controller"].as_bool() == Some(true))?;
    let name = o["name"].as_str()?;
    let api_version = o["apiVersion"].as_str();
    (api_version.is_none_or(|v| v == "apps/v1") && is_dns_subdomain(name))
        .then_some((o["kind"].as_str()?, name))
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
                let c = readable_controller(p)?;
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
        let mut unread = Vec::new();
        for pod in pods {
            if let Some(why) = unreadable_controller(pod) {
                unread.push(Unread {
                    uid: pod.metadata.uid.clone().unwrap_or_default(),
                    pod: format!(
                        "{}/{}",
                        namespace_of(pod),
                        shortened(pod.metadata.name.as_deref().unwrap_or_default())
                    ),
                    why,
                });
                continue;
            }
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
        Workloads {
            by_uid: Arc::new(by_uid),
            unread: Arc::new(unread),
        }
    }
}

/// A workload of `kind` and `name`, with the numbers of its object when
/// it was read.
fn workload(kind: &str, name: &str, object: Option<&Value>) -> Workload {
    let number = |n: i64| u32::try_from(int32(n)).unwrap_or(0);
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
        ready_replicas: counted.map(|o| number(count(&o["status"]["readyReplicas"], 0))),
        max_surge: max_surge.map(number),
        max_unavailable: max_unavailable.map(number),
    }
}

/// An owner's `spec.replicas` (its object, as JSON); unset is 1, the
/// API's default; clamped to an int32 of at least 0 (what the API server
/// holds; anything else was not written through it).
pub fn replicas_of(data: &Value) -> i64 {
    count(&data["spec"]["replicas"], 1)
}

/// A count read from an object: `default` when unset or not a whole
/// number, clamped to `0..=i32::MAX`.
fn count(v: &Value, default: i64) -> i64 {
    int32(v.as_i64().unwrap_or(default))
}

/// `n` clamped to `0..=i32::MAX`, the range of a Kubernetes count.
fn int32(n: i64) -> i64 {
    n.clamp(0, i64::from(i32::MAX))
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
        Value::Number(n) => return int32(n.as_i64().unwrap_or(0)),
        Value::String(s) => s.as_str(),
        _ => default,
    };
    let n = match text.strip_suffix('%').map(str::parse::<i64>) {
        Some(Ok(pct)) => percent(pct),
        _ => text
            .parse()
            .unwrap_or_else(|_| percent(default.trim_end_matches('%').parse().unwrap_or(25))),
    };
    int32(n)
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
    int_or_percent(v, int32(replicas), true, "25%")
}

/// A Deployment's `maxUnavailable` resolved against `replicas` as the
/// Deployment controller resolves it (`MaxUnavailable`): a percentage
/// rounded down, 25 % when unset, 1 when both it and `maxSurge` come to
/// 0, and never more than the replicas; 0 for Recreate (which takes every
/// pod down at once: no rolling bound to give) and for no replicas.
pub(crate) fn deployment_max_unavailable(d: &Value, replicas: i64) -> i64 {
    let replicas = int32(replicas);
    if recreate(d) || replicas == 0 {
        return 0;
    }
    let v = &d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"];
    let unavailable = int_or_percent(v, replicas, false, "25%");
    let unavailable = if unavailable == 0 && deployment_max_surge(d, replicas) == 0 {
        1
    } else {
        unavailable
    };
    unavailable.min(replicas)
}

/// A StatefulSet's `updateStrategy.rollingUpdate.maxUnavailable` resolved
/// against `replicas` (rounded down, at least 1 as the controller uses
/// it); 1 when unset.
pub(crate) fn stateful_max_unavailable(s: &Value, replicas: i64) -> i64 {
    let v = &s["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"];
    int_or_percent(v, int32(replicas), false, "1").max(1)
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

    fn pod_owned(api_version: &str, name: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop", "uid": "p1",
                "ownerReferences": [{"apiVersion": api_version, "kind": "ReplicaSet", "name": name, "uid": "u", "controller": true}]}
        }))
        .unwrap()
    }

    /// An owner reference no request can be made for (the API server
    /// takes all of these on a pod) is never read: the pod has no
    /// workload, why is kept, and the other pods are resolved as ever.
    #[test]
    fn an_unreadable_owner_is_no_workload_for_its_pod_only() {
        let long = "x".repeat(70_000);
        let pods = [
            pod_owned("nope.example.com/v9", "web"),
            pod_owned("apps/v1", "has space"),
            pod_owned("apps/v1", &long),
            pod_owned("apps/v1", "UPPER"),
            pod("ok", "ReplicaSet", "web-1"),
        ];
        for p in &pods[..4] {
            assert!(
                unreadable_controller(p).is_some(),
                "{:?}",
                p.metadata.owner_references
            );
        }
        let keys = Owners::controllers_to_read(&pods);
        assert_eq!(keys.len(), 1, "only the readable owner is read: {keys:?}");
        let w = Owners::default().resolve(&pods);
        assert_eq!(w.unread().len(), 4);
        assert!(
            w.unread().iter().all(|u| u.pod.len() < 100),
            "a long name is shortened"
        );
        assert!(w.of("ok").is_some());
    }

    /// A ReplicaSet whose own controller reference cannot be read has no
    /// Deployment above it: no request is built from it.
    #[test]
    fn a_replica_sets_unreadable_owner_is_not_followed() {
        let owners = Owners::from_objects([json!({"kind": "ReplicaSet",
            "metadata": {"name": "web-1", "namespace": "shop",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "a b", "controller": true}]},
            "spec": {"replicas": 2}})]);
        assert!(owners.deployments_to_read().is_empty());
    }

    /// Names as the API server validates them: a DNS subdomain of at most
    /// 253 characters, with no limit on one dot-free part.
    #[test]
    fn names_are_dns_subdomains_without_a_part_limit() {
        assert!(is_dns_subdomain(&"a".repeat(64)));
        assert!(is_dns_subdomain(&format!("{}.b", "a".repeat(200))));
        assert!(!is_dns_subdomain(&"a".repeat(254)));
        for bad in ["", "-a", "a-", "a..b", "A", "a b", "a_b"] {
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
    }

    /// Numbers a workload writes are clamped as Kubernetes clamps them: a
    /// Deployment's maxUnavailable to its replicas (1 when it and
    /// maxSurge both come to 0), counts to an int32 of at least 0.
    #[test]
    fn numbers_are_clamped_as_kubernetes_clamps_them() {
        let d = |replicas: i64, strategy: Value| {
            json!({"kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"replicas": replicas, "strategy": strategy},
                "status": {"readyReplicas": -5}})
        };
        let huge = d(
            1,
            json!({"rollingUpdate": {"maxUnavailable": 2147483647, "maxSurge": -3}}),
        );
        assert_eq!(deployment_max_unavailable(&huge, 1), 1);
        assert_eq!(deployment_max_surge(&huge, 1), 0);
        let percent = d(4, json!({"rollingUpdate": {"maxUnavailable": "900%"}}));
        assert_eq!(deployment_max_unavailable(&percent, 4), 4);
        let fencepost = d(
            4,
            json!({"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}}),
        );
        assert_eq!(deployment_max_unavailable(&fencepost, 4), 1);
        assert_eq!(replicas_of(&json!({"spec": {"replicas": -2}})), 0);
        assert_eq!(
            replicas_of(&json!({"spec": {"replicas": 1_i64 << 40}})),
            i64::from(i32::MAX)
        );
        let w = workload("Deployment", "web", Some(&huge));
        assert_eq!(
            (w.replicas, w.ready_replicas, w.max_unavailable, w.max_surge),
            (Some(1), Some(0), Some(1), Some(0))
        );
        let s = json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": -4}}}});
        assert_eq!(stateful_max_unavailable(&s, 3), 1);
    }
}
