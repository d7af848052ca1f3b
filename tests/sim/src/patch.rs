//! The patch types the API server accepts: JSON patch (RFC 6902, `test`
//! included), JSON merge patch (RFC 7386), and strategic merge patch as
//! kubectl sends it (merge keys for the lists kubectl patches, `$patch`
//! directives, `$setElementOrder`, `$retainKeys`,
//! `$deleteFromPrimitiveList`).

use serde_json::{Map, Value};

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

/// Applies a JSON patch document.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let p: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| format!("invalid JSON patch: {e}"))?;
    json_patch::patch(target, &p).map_err(|e| e.to_string())
}

/// Applies a JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// The merge key of a list field, for the fields kubectl patches.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "volumeMounts"
        | "imagePullSecrets"
        | "volumeDevices" => Some("name"),
        "ports" => Some("containerPort"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "tolerations" | "taints" => None,
        _ => None,
    }
}

/// Applies a strategic merge patch.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => merge_object(t, p),
        (t, p) => *t = strip_directives(p),
    }
}

fn merge_object(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
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
        if pv.is_null() {
            target.remove(key);
            continue;
        }
        match (target.get_mut(key), pv) {
            (Some(Value::Object(t)), Value::Object(p)) => merge_object(t, p),
            (Some(Value::Array(t)), Value::Array(p)) => match merge_key(key) {
                Some(mk) => merge_list(t, p, mk),
                None => *t = p.iter().map(strip_directives).collect(),
            },
            _ => {
                target.insert(key.clone(), strip_directives(pv));
            }
        }
    }
}

fn merge_list(target: &mut Vec<Value>, patch: &[Value], key: &str) {
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
            (Some(i), _) => strategic_merge(&mut target[i], item),
            (None, _) => target.push(strip_directives(item)),
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

    #[test]
    fn cordon_label_and_taint_patches_as_kubectl_sends_them() {
        let mut node = json!({
            "metadata": {"name": "n", "labels": {"a": "1"}},
            "spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}
        });
        strategic_merge(&mut node, &json!({"spec": {"unschedulable": true}}));
        assert_eq!(node["spec"]["unschedulable"], true);
        strategic_merge(
            &mut node,
            &json!({"metadata": {"labels": {"b": "2", "a": null}}}),
        );
        assert_eq!(node["metadata"]["labels"], json!({"b": "2"}));
        strategic_merge(
            &mut node,
            &json!({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}, {"key": "y", "effect": "NoExecute"}]}}),
        );
        assert_eq!(node["spec"]["taints"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn containers_merge_by_name_and_directives_apply() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}
        ], "finalizers": ["x", "y"]}});
        strategic_merge(
            &mut pod,
            &json!({"spec": {
                "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                "containers": [{"name": "b", "image": "b:2"}, {"name": "a", "$patch": "delete"}],
                "$deleteFromPrimitiveList/finalizers": ["x"]
            }}),
        );
        assert_eq!(
            pod["spec"]["containers"],
            json!([{"name": "b", "image": "b:2"}])
        );
        assert_eq!(pod["spec"]["finalizers"], json!(["y"]));
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
