//! The patch types the API server accepts: JSON patch (RFC 6902 with the
//! real server's library's semantics, see [`json_patch`]), JSON merge patch
//! (RFC 7386), and strategic merge patch for built-in kinds (the Go types'
//! merge keys and strategies, see [`strategic_merge`]); a strategic merge
//! patch of a custom resource is refused with 415, as the real server does.

use serde_json::{Map, Value};

use crate::proto::Schema;

/// The patch formats, by Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let ct = ct.split(';').next().unwrap_or_default().trim();
        match ct {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Applies a JSON patch document as the real API server does, with the
/// semantics of the library it uses (evanphx/json-patch v4), which differ
/// from RFC 6902 where a client may notice:
/// - `test` with `"value": null` passes when the key is missing (or null),
///   as long as its parent exists (`test operation does not apply: is
///   missing path`);
/// - `add` needs the parent to exist (`add operation does not apply: doc
///   is missing path`); `-` appends to an array;
/// - `remove` and `replace` of a missing key fail (`Unable to remove
///   nonexistent key`, `replace operation does not apply: doc is missing
///   key`).
///
/// The patch applies whole or not at all.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let ops = patch
        .as_array()
        .ok_or_else(|| "invalid JSON patch: not an array of operations".to_owned())?;
    let mut doc = target.clone();
    for op in ops {
        apply_op(&mut doc, op)?;
    }
    *target = doc;
    Ok(())
}

const MISSING: &str = "missing value";
const TEST_FAILED: &str = "test failed";

/// A JSON pointer's tokens (`~1` is `/`, `~0` is `~`).
fn tokens(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// The container holding the pointer's last token, and that token.
fn parent_mut<'a>(
    doc: &'a mut Value,
    path: &str,
) -> Result<Option<(&'a mut Value, String)>, String> {
    let mut toks = tokens(path)?;
    let Some(last) = toks.pop() else {
        return Ok(None);
    };
    let mut cur = doc;
    for t in &toks {
        cur = match cur {
            Value::Object(m) => match m.get_mut(t) {
                Some(v) => v,
                None => return Ok(None),
            },
            Value::Array(a) => match t.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                Some(v) => v,
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
    }
    if !(cur.is_object() || cur.is_array()) {
        return Ok(None);
    }
    Ok(Some((cur, last)))
}

fn get<'a>(container: &'a Value, key: &str) -> Option<&'a Value> {
    match container {
        Value::Object(m) => m.get(key),
        Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    }
}

fn field<'a>(op: &'a Value, name: &str) -> Result<&'a str, String> {
    op[name]
        .as_str()
        .ok_or_else(|| format!("invalid JSON patch: operation has no {name:?}"))
}

fn remove_at(doc: &mut Value, path: &str, what: &str) -> Result<Value, String> {
    let Some((con, key)) = parent_mut(doc, path)? else {
        return Err(format!(
            "{what} operation does not apply: doc is missing path: \"{path}\": {MISSING}"
        ));
    };
    match con {
        Value::Object(m) => m.remove(&key).ok_or_else(|| {
            format!("error in {what} for path: '{path}': Unable to remove nonexistent key: {key}: {MISSING}")
        }),
        Value::Array(a) => match key.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(format!("error in {what} for path: '{path}': Unable to access invalid index: {key}: invalid index referenced")),
        },
        _ => unreachable!("parent_mut returns containers"),
    }
}

fn add_at(doc: &mut Value, path: &str, value: Value, what: &str) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let Some((con, key)) = parent_mut(doc, path)? else {
        return Err(format!(
            "{what} operation does not apply: doc is missing path: \"{path}\": {MISSING}"
        ));
    };
    match con {
        Value::Object(m) => {
            m.insert(key, value);
            Ok(())
        }
        Value::Array(a) => {
            let i = if key == "-" {
                a.len()
            } else {
                match key.parse::<usize>() {
                    Ok(i) if i <= a.len() => i,
                    _ => {
                        return Err(format!(
                            "error in {what} for path: '{path}': Unable to access invalid index: {key}: invalid index referenced"
                        ));
                    }
                }
            };
            a.insert(i, value);
            Ok(())
        }
        _ => unreachable!("parent_mut returns containers"),
    }
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), String> {
    let kind = field(op, "op")?;
    let path = field(op, "path")?;
    match kind {
        "add" => add_at(
            doc,
            path,
            op.get("value").cloned().unwrap_or(Value::Null),
            "add",
        ),
        "remove" => remove_at(doc, path, "remove").map(|_| ()),
        "replace" => {
            let value = op.get("value").cloned().unwrap_or(Value::Null);
            if path.is_empty() {
                *doc = value;
                return Ok(());
            }
            let Some((con, key)) = parent_mut(doc, path)? else {
                return Err(format!(
                    "replace operation does not apply: doc is missing path: {path}: {MISSING}"
                ));
            };
            if get(con, &key).is_none() {
                return Err(format!(
                    "replace operation does not apply: doc is missing key: {path}: {MISSING}"
                ));
            }
            match con {
                Value::Object(m) => {
                    m.insert(key, value);
                }
                Value::Array(a) => {
                    let i: usize = key.parse().unwrap_or(usize::MAX);
                    a[i] = value;
                }
                _ => unreachable!("parent_mut returns containers"),
            }
            Ok(())
        }
        "move" => {
            let from = field(op, "from")?;
            let value = remove_at(doc, from, "move")?;
            add_at(doc, path, value, "move")
        }
        "copy" => {
            let from = field(op, "from")?;
            let value = match parent_mut(doc, from)? {
                Some((con, key)) => get(con, &key).cloned(),
                None if from.is_empty() => Some(doc.clone()),
                None => None,
            }
            .ok_or_else(|| {
                format!(
                    "copy operation does not apply: doc is missing from path: {from}: {MISSING}"
                )
            })?;
            add_at(doc, path, value, "copy")
        }
        "test" => {
            let want = op.get("value").cloned().unwrap_or(Value::Null);
            let failed = || format!("testing value {path} failed: {TEST_FAILED}");
            if path.is_empty() {
                return if *doc == want { Ok(()) } else { Err(failed()) };
            }
            let Some((con, key)) = parent_mut(doc, path)? else {
                return Err(format!(
                    "test operation does not apply: is missing path: {path}: {MISSING}"
                ));
            };
            match get(con, &key) {
                None | Some(Value::Null) if want.is_null() => Ok(()),
                Some(v) if !want.is_null() && *v == want => Ok(()),
                _ => Err(failed()),
            }
        }
        other => Err(format!("Unexpected kind: {other}")),
    }
}

/// Applies a JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// How a strategic merge patch merges a list field: Go's `patchStrategy`
/// and `patchMergeKey` struct tags of the built-in types, by the struct
/// that declares the field. `Some(Some(key))`: items merge by that key;
/// `Some(None)`: a list of primitives merges as a set; None: the list is
/// replaced (no strategy).
fn list_strategy(owner: &str, field: &str) -> Option<Option<&'static str>> {
    Some(match (owner, field) {
        ("ObjectMeta", "finalizers") => None,
        ("ObjectMeta", "ownerReferences") => Some("uid"),
        (
            "PodSpec",
            "volumes"
            | "initContainers"
            | "containers"
            | "ephemeralContainers"
            | "imagePullSecrets"
            | "resourceClaims"
            | "schedulingGates",
        ) => Some("name"),
        ("PodSpec", "hostAliases") => Some("ip"),
        ("PodSpec", "topologySpreadConstraints") => Some("topologyKey"),
        ("Container" | "EphemeralContainerCommon", "ports") => Some("containerPort"),
        ("Container" | "EphemeralContainerCommon", "env") => Some("name"),
        ("Container" | "EphemeralContainerCommon", "volumeMounts") => Some("mountPath"),
        ("Container" | "EphemeralContainerCommon", "volumeDevices") => Some("devicePath"),
        (
            "PodStatus"
            | "NodeStatus"
            | "NamespaceStatus"
            | "ServiceStatus"
            | "DeploymentStatus"
            | "ReplicaSetStatus"
            | "StatefulSetStatus"
            | "DaemonSetStatus"
            | "JobStatus"
            | "PodDisruptionBudgetStatus"
            | "PersistentVolumeClaimStatus",
            "conditions",
        ) => Some("type"),
        ("PodStatus", "podIPs" | "hostIPs") => Some("ip"),
        ("PodStatus", "resourceClaimStatuses") => Some("name"),
        ("NodeStatus", "addresses") => Some("type"),
        ("NodeSpec", "podCIDRs") => None,
        ("ServiceSpec", "ports") => Some("port"),
        ("ServiceAccount", "secrets") => Some("name"),
        _ => return None,
    })
}

/// Applies a strategic merge patch to a built-in object of message type
/// `msg`, as the real server's library does: maps merge (`null` deletes a
/// key), lists merge by their Go `patchMergeKey` or as a set where the
/// type says so and are replaced otherwise; the directives `$patch`
/// (`replace`, `delete`, `merge`), `$retainKeys`,
/// `$deleteFromPrimitiveList/` and `$setElementOrder/` are honoured.
pub fn strategic_merge(target: &mut Value, patch: &Value, schema: &Schema, msg: Option<&str>) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => merge_object(t, p, schema, msg),
        (t, p) => *t = strip_directives(p),
    }
}

fn merge_object(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    schema: &Schema,
    msg: Option<&str>,
) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch.clone();
        replaced.remove("$patch");
        *target = strip_map(&replaced);
        return;
    }
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (key, pv) in patch {
        if key.starts_with("$setElementOrder/") || key == "$retainKeys" || key == "$patch" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) = (target.get_mut(field), pv.as_array())
            {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        if pv.is_null() || pv.get("$patch").and_then(Value::as_str) == Some("delete") {
            target.remove(key);
            continue;
        }
        let (owner, child) = msg
            .and_then(|m| schema.child(m, key))
            .map_or(("", None), |(o, c)| (o, c));
        match (target.get_mut(key), pv) {
            (Some(Value::Object(t)), Value::Object(p)) => merge_object(t, p, schema, child),
            (Some(Value::Array(t)), Value::Array(p)) => match list_strategy(owner, key) {
                Some(Some(mk)) => merge_list(t, p, mk, schema, child),
                Some(None) => merge_set(t, p),
                None => *t = replace_list(p),
            },
            _ => {
                target.insert(key.clone(), strip_directives(pv));
            }
        }
    }
}

/// A replaced list: the patch's items, without a `{"$patch": "replace"}`
/// marker item.
fn replace_list(patch: &[Value]) -> Vec<Value> {
    patch
        .iter()
        .filter(|i| i.get("$patch").is_none() || i.as_object().is_some_and(|o| o.len() > 1))
        .map(strip_directives)
        .collect()
}

fn merge_list(
    target: &mut Vec<Value>,
    patch: &[Value],
    key: &str,
    schema: &Schema,
    msg: Option<&str>,
) {
    if patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *target = replace_list(patch);
        return;
    }
    for item in patch {
        let Some(k) = item.get(key) else {
            target.push(strip_directives(item));
            continue;
        };
        let pos = target.iter().position(|t| t.get(key) == Some(k));
        let directive = item.get("$patch").and_then(Value::as_str);
        match (pos, directive) {
            (Some(i), Some("delete")) => {
                target.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), _) => strategic_merge(&mut target[i], item, schema, msg),
            (None, _) => target.push(strip_directives(item)),
        }
    }
}

/// A list of primitives with the merge strategy: the union, existing items
/// first.
fn merge_set(target: &mut Vec<Value>, patch: &[Value]) {
    for item in patch {
        if !target.contains(item) {
            target.push(item.clone());
        }
    }
}

fn strip_map(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), strip_directives(v)))
        .collect()
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_map(m)),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(kind: &str, target: &mut Value, patch: Value) {
        let schema = Schema::builtin();
        let msg = schema.message_for("v1", kind).map(str::to_owned);
        strategic_merge(target, &patch, &schema, msg.as_deref());
    }

    #[test]
    fn cordon_label_and_taint_patches_as_kubectl_sends_them() {
        let mut node = json!({
            "metadata": {"name": "n", "labels": {"a": "1"}},
            "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}
        });
        smp("Node", &mut node, json!({"spec": {"unschedulable": true}}));
        assert_eq!(node["spec"]["unschedulable"], true);
        smp(
            "Node",
            &mut node,
            json!({"metadata": {"labels": {"b": "2", "a": null}}}),
        );
        assert_eq!(node["metadata"]["labels"], json!({"b": "2"}));
        // Taints have no patch strategy: the list is replaced.
        smp(
            "Node",
            &mut node,
            json!({"spec": {"taints": [{"key": "y", "effect": "NoExecute"}]}}),
        );
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "y", "effect": "NoExecute"}])
        );
    }

    /// Each case as kube-apiserver answers it (k8s.io/apimachinery's
    /// strategicpatch with the Go types' `patchStrategy`/`patchMergeKey`).
    #[test]
    fn strategic_merge_follows_the_go_types() {
        let mut pod = json!({
            "metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "rs"}]},
            "spec": {
                "containers": [
                    {"name": "app", "image": "app:1",
                     "ports": [{"containerPort": 80, "name": "http"}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                     "env": [{"name": "A", "value": "1"}],
                     "args": ["--x"]},
                    {"name": "side", "image": "side:1"},
                ],
                "tolerations": [{"key": "t1", "operator": "Exists"}],
                "securityContext": {"runAsUser": 1000},
            },
        });
        smp(
            "Pod",
            &mut pod,
            json!({
                // finalizers merge as a set; ownerReferences by uid.
                "metadata": {"finalizers": ["b", "a"], "ownerReferences": [{"uid": "1", "controller": true}]},
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": "app:2",
                        // ports by containerPort, env by name, volumeMounts
                        // by mountPath (not by name).
                        "ports": [{"containerPort": 80, "protocol": "TCP"}],
                        "env": [{"name": "B", "value": "2"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/other"}],
                        // args have no strategy: replaced.
                        "args": ["--y"],
                    }],
                    // tolerations have no strategy: replaced.
                    "tolerations": [{"key": "t2", "operator": "Exists"}],
                    // a map with $patch: delete goes.
                    "securityContext": {"$patch": "delete"},
                },
            }),
        );
        assert_eq!(pod["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            pod["metadata"]["ownerReferences"],
            json!([{"uid": "1", "name": "rs", "controller": true}])
        );
        let app = &pod["spec"]["containers"][0];
        assert_eq!(app["image"], "app:2");
        assert_eq!(
            app["ports"],
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"}])
        );
        assert_eq!(
            app["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        assert_eq!(
            app["volumeMounts"],
            json!([{"name": "data", "mountPath": "/data"}, {"name": "data", "mountPath": "/other"}])
        );
        assert_eq!(app["args"], json!(["--y"]));
        assert_eq!(
            pod["spec"]["containers"][1],
            json!({"name": "side", "image": "side:1"})
        );
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([{"key": "t2", "operator": "Exists"}])
        );
        assert!(pod["spec"].get("securityContext").is_none());

        // Directives: delete an item by key, remove from a primitive list,
        // replace a whole list.
        smp(
            "Pod",
            &mut pod,
            json!({
                "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
                "spec": {
                    "$setElementOrder/containers": [{"name": "app"}],
                    "containers": [{"name": "side", "$patch": "delete"},
                                   {"name": "app", "env": [{"$patch": "replace"}, {"name": "C", "value": "3"}]}],
                },
            }),
        );
        assert_eq!(pod["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(pod["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(
            pod["spec"]["containers"][0]["env"],
            json!([{"name": "C", "value": "3"}])
        );

        // A Service's ports merge by port, not containerPort.
        let mut svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}});
        smp(
            "Service",
            &mut svc,
            json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}]}}),
        );
        assert_eq!(svc["spec"]["ports"].as_array().unwrap().len(), 2);
        // Node conditions merge by type.
        let mut node = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]}});
        smp(
            "Node",
            &mut node,
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        );
        assert_eq!(
            node["status"]["conditions"],
            json!([{"type": "Ready", "status": "False"}, {"type": "DiskPressure", "status": "False"}])
        );
    }

    /// Each case with the real API server's answer (evanphx/json-patch v4,
    /// which kube-apiserver applies JSON patches with).
    #[test]
    fn json_patch_edge_cases_answer_as_the_real_server() {
        let node =
            json!({"metadata": {"name": "n", "labels": {"a": "1"}}, "spec": {"podCIDR": "x"}});
        let cases: &[(&str, Value, Result<Value, &str>)] = &[
            // test on a missing key with value null: passes (the guard a
            // controller puts before its first taint).
            (
                "test null on a missing key",
                json!([{"op": "test", "path": "/spec/taints", "value": null},
                    {"op": "add", "path": "/spec/taints", "value": [{"key": "k", "effect": "NoSchedule"}]}]),
                Ok(
                    json!({"metadata": {"name": "n", "labels": {"a": "1"}}, "spec": {"podCIDR": "x", "taints": [{"key": "k", "effect": "NoSchedule"}]}}),
                ),
            ),
            // ...but not when the key has a value.
            (
                "test null on a present key",
                json!([{"op": "test", "path": "/spec/podCIDR", "value": null}]),
                Err("testing value /spec/podCIDR failed: test failed"),
            ),
            // ...and not when its parent is missing.
            (
                "test under a missing parent",
                json!([{"op": "test", "path": "/status/phase", "value": null}]),
                Err("test operation does not apply: is missing path: /status/phase: missing value"),
            ),
            (
                "test a wrong value",
                json!([{"op": "test", "path": "/metadata/labels/a", "value": "2"}]),
                Err("testing value /metadata/labels/a failed: test failed"),
            ),
            // add into a missing map: refused (no parents are made).
            (
                "add to a missing map",
                json!([{"op": "add", "path": "/metadata/annotations/x", "value": "y"}]),
                Err(
                    "add operation does not apply: doc is missing path: \"/metadata/annotations/x\": missing value",
                ),
            ),
            (
                "remove a missing key",
                json!([{"op": "remove", "path": "/metadata/labels/zzz"}]),
                Err(
                    "error in remove for path: '/metadata/labels/zzz': Unable to remove nonexistent key: zzz: missing value",
                ),
            ),
            (
                "replace a missing key",
                json!([{"op": "replace", "path": "/spec/unschedulable", "value": true}]),
                Err(
                    "replace operation does not apply: doc is missing key: /spec/unschedulable: missing value",
                ),
            ),
            // "-" appends to an array.
            (
                "add at - appends",
                json!([{"op": "add", "path": "/spec/taints", "value": []},
                    {"op": "add", "path": "/spec/taints/-", "value": 1},
                    {"op": "add", "path": "/spec/taints/-", "value": 2},
                    {"op": "add", "path": "/spec/taints/0", "value": 0}]),
                Ok(
                    json!({"metadata": {"name": "n", "labels": {"a": "1"}}, "spec": {"podCIDR": "x", "taints": [0, 1, 2]}}),
                ),
            ),
            // A key with "/" in it, as labels have.
            (
                "an escaped key",
                json!([{"op": "add", "path": "/metadata/labels/kubernetes.io~1os", "value": "linux"}]),
                Ok(
                    json!({"metadata": {"name": "n", "labels": {"a": "1", "kubernetes.io/os": "linux"}}, "spec": {"podCIDR": "x"}}),
                ),
            ),
        ];
        for (what, patch, want) in cases {
            let mut doc = node.clone();
            let got = json_patch(&mut doc, patch);
            match want {
                Ok(v) => {
                    assert_eq!(got, Ok(()), "{what}");
                    assert_eq!(&doc, v, "{what}");
                }
                Err(e) => {
                    assert_eq!(got, Err((*e).to_owned()), "{what}");
                    assert_eq!(doc, node, "{what}: a failed patch changes nothing");
                }
            }
        }
    }

    #[test]
    fn json_patch_test_operation_guards() {
        let mut v = json!({"spec": {"taints": [1]}});
        let err = json_patch(
            &mut v,
            &json!([{"op": "test", "path": "/spec/taints", "value": [2]},
                    {"op": "replace", "path": "/spec/taints", "value": []}]),
        );
        assert!(err.is_err());
        assert_eq!(v["spec"]["taints"], json!([1]));
    }
}
