//! `nmo demo --workload FILE`: a user's own workload for the demo's
//! simulated cluster, from a manifest file as they have it: the YAML they
//! apply (one document or several), or what `kubectl get … -o yaml`
//! printed (a `List`). What the API server filled in is dropped, and what a
//! controller of the file makes (a Deployment's ReplicaSets, their pods) is
//! left for the simulated cluster's controllers to make again.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

/// The largest manifest file read (a dump of a busy namespace fits).
const MAX_BYTES: u64 = 16 * 1024 * 1024;
/// The most objects created from one file.
const MAX_OBJECTS: usize = 5_000;

/// Kinds the demo does not create from a file: the simulated cluster has
/// its own nodes, and events, leases and the like are records, not
/// workload.
const NOT_CREATED: &[&str] = &[
    "Node",
    "Event",
    "Lease",
    "EndpointSlice",
    "Endpoints",
    "ControllerRevision",
    "NodeMaintenance",
];

/// Why a workload file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// Unreadable, too large, not a file (the message names the path).
    #[error("{0}")]
    Read(nmo::yaml::YamlError),
    #[error("{path}: not YAML: {source}")]
    Yaml {
        path: String,
        source: nmo::yaml::YamlError,
    },
    #[error("{path}: document {index}: {why}")]
    Object {
        path: String,
        index: usize,
        why: String,
    },
    #[error("{path}: more than {MAX_OBJECTS} objects")]
    TooMany { path: String },
    #[error(
        "{path}: no object the demo can create (Deployments, StatefulSets, PodDisruptionBudgets, Pods...)"
    )]
    Empty { path: String },
}

/// A user's workload, ready to create: the namespaces it needs (besides
/// `default`), then its objects.
#[derive(Debug)]
pub struct Workload {
    pub namespaces: BTreeSet<String>,
    pub objects: Vec<Value>,
    /// Objects of the file left out, with why (shown to the user).
    pub left_out: Vec<String>,
}

/// Reads `path` as a workload; `nodes` are the simulated cluster's node
/// names (a bare pod bound to another node is scheduled afresh).
pub fn read(path: &Path, nodes: &BTreeSet<String>) -> Result<Workload, WorkloadError> {
    let text = nmo::yaml::read_file(path, MAX_BYTES).map_err(WorkloadError::Read)?;
    parse(&path.display().to_string(), &text, nodes)
}

/// [`read`] of text already read.
pub fn parse(path: &str, text: &str, nodes: &BTreeSet<String>) -> Result<Workload, WorkloadError> {
    let docs: Vec<Value> = nmo::yaml::documents(text).map_err(|source| WorkloadError::Yaml {
        path: path.to_owned(),
        source,
    })?;
    let mut items = Vec::new();
    for (index, doc) in docs.into_iter().enumerate() {
        match doc {
            Value::Null => {}
            Value::Object(_) if doc["kind"] == "List" => match &doc["items"] {
                Value::Array(list) => items.extend(list.iter().cloned().map(|o| (index + 1, o))),
                _ => {
                    return Err(WorkloadError::Object {
                        path: path.to_owned(),
                        index: index + 1,
                        why: "a List without items".into(),
                    });
                }
            },
            Value::Object(_) => items.push((index + 1, doc)),
            _ => {
                return Err(WorkloadError::Object {
                    path: path.to_owned(),
                    index: index + 1,
                    why: "not an object (apiVersion, kind, metadata...)".into(),
                });
            }
        }
    }
    if items.len() > MAX_OBJECTS {
        return Err(WorkloadError::TooMany {
            path: path.to_owned(),
        });
    }
    let mut workload = Workload {
        namespaces: BTreeSet::new(),
        objects: Vec::new(),
        left_out: Vec::new(),
    };
    for (index, obj) in items {
        let invalid = |why: &str| WorkloadError::Object {
            path: path.to_owned(),
            index,
            why: why.to_owned(),
        };
        let kind = obj["kind"]
            .as_str()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| invalid("no kind"))?
            .to_owned();
        if obj["apiVersion"].as_str().is_none_or(str::is_empty) {
            return Err(invalid("no apiVersion"));
        }
        let name = obj["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| invalid("no metadata.name"))?
            .to_owned();
        let shown = format!("{kind} {name}");
        if NOT_CREATED.contains(&kind.as_str()) {
            workload
                .left_out
                .push(format!("{shown}: not workload (the demo has its own)"));
            continue;
        }
        if let Some(owner) = made_by_a_controller(&obj) {
            workload
                .left_out
                .push(format!("{shown}: made by {owner}, which makes it again"));
            continue;
        }
        if kind == "Namespace" {
            workload.namespaces.insert(name);
            continue;
        }
        if let Some(ns) = obj["metadata"]["namespace"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            workload.namespaces.insert(ns.to_owned());
        }
        workload.objects.push(as_new(obj, nodes));
    }
    workload.namespaces.remove("default");
    if workload.objects.is_empty() {
        return Err(WorkloadError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(workload)
}

/// The controller that makes `obj` (`ReplicaSet/web-7d9f`), if any.
fn made_by_a_controller(obj: &Value) -> Option<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["name"].as_str().unwrap_or("?")
            )
        })
}

/// `obj` as a user would create it: what the API server filled in
/// dropped; a pod bound to a node the demo does not have scheduled again.
fn as_new(mut obj: Value, nodes: &BTreeSet<String>) -> Value {
    obj.as_object_mut().map(|o| o.remove("status"));
    if let Some(meta) = obj["metadata"].as_object_mut() {
        for filled in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            meta.remove(filled);
        }
    }
    if obj["kind"] == "Pod"
        && let Some(spec) = obj["spec"].as_object_mut()
        && spec
            .get("nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !nodes.contains(n))
    {
        spec.remove("nodeName");
    }
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> BTreeSet<String> {
        ["worker-1", "worker-2"].map(String::from).into()
    }

    /// What `kubectl get deploy,rs,pods,pdb -n shop -o yaml` prints: a List
    /// whose ReplicaSets and their pods are left to the Deployment, whose
    /// server-filled fields are dropped, and whose bare pod bound to a
    /// node the demo lacks is scheduled again.
    #[test]
    fn a_kubectl_get_dump_becomes_a_workload() {
        let dump = r#"
apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web, namespace: shop, uid: d1, resourceVersion: "9", generation: 3}
  spec: {replicas: 3, selector: {matchLabels: {app: web}}, template: {metadata: {labels: {app: web}}, spec: {containers: [{name: web, image: nginx}]}}}
  status: {replicas: 3}
- apiVersion: apps/v1
  kind: ReplicaSet
  metadata: {name: web-7d9f, namespace: shop, ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: web, uid: d1, controller: true}]}
  spec: {replicas: 3, selector: {matchLabels: {app: web}}}
- apiVersion: v1
  kind: Pod
  metadata: {name: web-7d9f-abcde, namespace: shop, ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-7d9f, uid: r1, controller: true}]}
  spec: {nodeName: ip-10-0-1-2, containers: [{name: web, image: nginx}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: debug, namespace: tools}
  spec: {nodeName: ip-10-0-1-2, containers: [{name: sh, image: busybox}]}
- apiVersion: v1
  kind: Node
  metadata: {name: ip-10-0-1-2}
"#;
        let w = parse("dump.yaml", dump, &nodes()).unwrap();
        let names: Vec<&str> = w
            .objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["web", "debug"]);
        assert_eq!(
            w.namespaces,
            ["shop", "tools"].map(String::from).into(),
            "namespaces to create"
        );
        assert!(w.objects[0].get("status").is_none());
        assert!(w.objects[0]["metadata"].get("uid").is_none());
        assert!(
            w.objects[1]["spec"].get("nodeName").is_none(),
            "scheduled again"
        );
        assert_eq!(w.left_out.len(), 3, "{:?}", w.left_out);
        assert!(w.left_out[0].contains("made by Deployment/web"));
    }

    #[test]
    fn a_bad_file_says_which_document_and_why() {
        for (text, says) in [
            ("kind: [", "not YAML"),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {}\n",
                "document 1: no metadata.name",
            ),
            ("---\n- a\n", "document 1: not an object"),
            ("kind: Deployment\nmetadata: {name: x}\n", "no apiVersion"),
            (
                "apiVersion: v1\nkind: List\nitems: 3\n",
                "a List without items",
            ),
            (
                "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n",
                "no object the demo can create",
            ),
        ] {
            let e = parse("w.yaml", text, &nodes()).unwrap_err().to_string();
            assert!(
                e.starts_with("w.yaml: ") && e.contains(says),
                "{text:?}: {e}"
            );
        }
    }
}
