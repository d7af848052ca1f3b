//! Cordon, taints and the exclude-from-remediation label, with guarded
//! patches: each change is a JSON patch that first tests the node's
//! resourceVersion, so a concurrent change is never overwritten (the patch
//! fails, the node is read again, the change is recomputed).

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The label that keeps remediators (Node Health Check) away.
pub const EXCLUDE_LABEL: &str = "remediation.medik8s.io/exclude-from-remediation";
/// The taints a node in maintenance carries.
pub const TAINT_KEYS: [&str; 2] = ["node.kubernetes.io/unschedulable", "medik8s.io/drain"];

const ATTEMPTS: usize = 8;

fn our_taints() -> Vec<Taint> {
    TAINT_KEYS
        .iter()
        .map(|k| Taint {
            key: (*k).into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        })
        .collect()
}

fn is_ours(t: &Taint) -> bool {
    TAINT_KEYS.contains(&t.key.as_str()) && t.effect == "NoSchedule"
}

/// The node in maintenance (`true`) or restored (`false`).
fn desired(node: &Node, maintenance: bool) -> (Vec<Taint>, bool, bool) {
    let current = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut taints: Vec<Taint> = current.into_iter().filter(|t| !is_ours(t)).collect();
    if maintenance {
        taints.extend(our_taints());
    }
    (taints, maintenance, maintenance)
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Builds the guarded patch, or `None` when the node is already as wanted.
fn patch_for(node: &Node, maintenance: bool) -> Option<Value> {
    let spec = node.spec.clone().unwrap_or_default();
    let (taints, unschedulable, label) = desired(node, maintenance);
    let current_taints = spec.taints.clone().unwrap_or_default();
    let has_label = node.labels().get(EXCLUDE_LABEL).map(String::as_str) == Some("true");
    let is_unschedulable = spec.unschedulable.unwrap_or(false);
    let same_taints = {
        let key = |t: &Taint| (t.key.clone(), t.effect.clone(), t.value.clone());
        let mut a: Vec<_> = current_taints.iter().map(key).collect();
        let mut b: Vec<_> = taints.iter().map(key).collect();
        a.sort();
        b.sort();
        a == b
    };
    if same_taints && has_label == label && is_unschedulable == unschedulable {
        return None;
    }
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": node.resource_version()}),
    ];
    if !same_taints {
        ops.push(json!({"op": "add", "path": "/spec/taints", "value": taints}));
    }
    if is_unschedulable != unschedulable {
        ops.push(json!({"op": "add", "path": "/spec/unschedulable", "value": unschedulable}));
    }
    if has_label != label {
        if label {
            if node.metadata.labels.is_none() {
                ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
            }
            ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", escape(EXCLUDE_LABEL)), "value": "true"}));
        } else if node.labels().contains_key(EXCLUDE_LABEL) {
            ops.push(json!({"op": "remove", "path": format!("/metadata/labels/{}", escape(EXCLUDE_LABEL))}));
        }
    }
    Some(Value::Array(ops))
}

/// Puts the node into maintenance (`true`: label, taints, cordon) or
/// restores it (`false`), keeping everything else on it. Returns the node
/// as it ends up (`None` when it does not exist) and whether it changed.
pub async fn set_maintenance(
    client: &Client,
    name: &str,
    maintenance: bool,
) -> Result<(Option<Node>, bool)> {
    let api: Api<Node> = Api::all(client.clone());
    for _ in 0..ATTEMPTS {
        let Some(node) = api
            .get_opt(name)
            .await
            .map_err(Error::kube("reading the node"))?
        else {
            return Ok((None, false));
        };
        let Some(patch) = patch_for(&node, maintenance) else {
            return Ok((Some(node), false));
        };
        let patch: json_patch::Patch = serde_json::from_value(patch).expect("well-formed patch");
        match api
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(n) => return Ok((Some(n), true)),
            // The test failed (a concurrent change) or a conflict: read again.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => continue,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok((None, false)),
            Err(e) => return Err(Error::kube("patching the node")(e)),
        }
    }
    Err(Error::Conflict("patching the node"))
}

/// Whether the node carries every mark of maintenance.
pub fn in_maintenance(node: &Node) -> bool {
    patch_for(node, true).is_none()
}
