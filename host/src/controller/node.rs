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

/// The annotation in which the node keeps what it had of our marks before
/// the maintenance, so that the end of the maintenance restores exactly
/// that: a node a human had cordoned stays cordoned.
pub const PRIOR_STATE_ANNOTATION: &str = "nodemaintenance.medik8s.io/before-maintenance";

/// Which of our marks a node had before the maintenance.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Prior {
    unschedulable: bool,
    /// Our taint keys it already carried.
    taints: Vec<String>,
    exclude_label: bool,
}

impl Prior {
    /// What `node` has of our marks now. A node that already carries the
    /// `medik8s.io/drain` taint but no record was put into maintenance by a
    /// node maintenance operator that kept no record (the Go operator, an
    /// older nmo): none of its marks are a human's.
    fn of(node: &Node) -> Prior {
        let spec = node.spec.clone().unwrap_or_default();
        let taints = spec.taints.unwrap_or_default();
        if taints.iter().any(|t| t.key == TAINT_KEYS[1] && is_ours(t)) {
            return Prior::default();
        }
        Prior {
            unschedulable: spec.unschedulable.unwrap_or(false),
            taints: taints
                .iter()
                .filter(|t| is_ours(t))
                .map(|t| t.key.clone())
                .collect(),
            exclude_label: node.labels().get(EXCLUDE_LABEL).map(String::as_str) == Some("true"),
        }
    }

    /// The record on the node, if there is a readable one.
    fn recorded(node: &Node) -> Option<Prior> {
        let raw = node.annotations().get(PRIOR_STATE_ANNOTATION)?;
        match serde_json::from_str(raw) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(logger = "controller", node = %node.name_any(), error = %e, "the node's record of its state before the maintenance is unreadable; restoring all of it");
                None
            }
        }
    }
}

/// What the node should look like.
struct Target {
    taints: Vec<Taint>,
    unschedulable: bool,
    label: bool,
    /// The prior-state annotation: `Some(Some(v))` set, `Some(None)`
    /// remove, `None` leave.
    annotation: Option<Option<String>>,
}

/// The node in maintenance (`true`) or restored (`false`): in maintenance
/// it carries every mark (and a record of which it had before); restored,
/// it has again exactly the marks it had before.
fn desired(node: &Node, maintenance: bool) -> Target {
    let current = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let recorded = Prior::recorded(node);
    let has_record = node.annotations().contains_key(PRIOR_STATE_ANNOTATION);
    let mut taints: Vec<Taint> = current.into_iter().filter(|t| !is_ours(t)).collect();
    if maintenance {
        taints.extend(our_taints());
        let annotation = if has_record {
            None
        } else {
            Some(Some(
                serde_json::to_string(&Prior::of(node)).unwrap_or_default(),
            ))
        };
        return Target {
            taints,
            unschedulable: true,
            label: true,
            annotation,
        };
    }
    let prior = recorded.unwrap_or_default();
    taints.extend(
        our_taints()
            .into_iter()
            .filter(|t| prior.taints.contains(&t.key)),
    );
    Target {
        taints,
        unschedulable: prior.unschedulable,
        label: prior.exclude_label,
        annotation: has_record.then_some(None),
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Builds the guarded patch, or `None` when the node is already as wanted.
fn patch_for(node: &Node, maintenance: bool) -> Option<Value> {
    let spec = node.spec.clone().unwrap_or_default();
    let target = desired(node, maintenance);
    let current_taints = spec.taints.clone().unwrap_or_default();
    let has_label = node.labels().get(EXCLUDE_LABEL).map(String::as_str) == Some("true");
    let is_unschedulable = spec.unschedulable.unwrap_or(false);
    let same_taints = {
        let key = |t: &Taint| (t.key.clone(), t.effect.clone(), t.value.clone());
        let mut a: Vec<_> = current_taints.iter().map(key).collect();
        let mut b: Vec<_> = target.taints.iter().map(key).collect();
        a.sort();
        b.sort();
        a == b
    };
    if same_taints
        && has_label == target.label
        && is_unschedulable == target.unschedulable
        && target.annotation.is_none()
    {
        return None;
    }
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": node.resource_version()}),
    ];
    // A node may come without `spec` (a real API server always returns
    // one; other servers, or an object written by hand, may not).
    if node.spec.is_none() && (!same_taints || is_unschedulable != target.unschedulable) {
        ops.push(json!({"op": "add", "path": "/spec", "value": {}}));
    }
    if !same_taints {
        ops.push(json!({"op": "add", "path": "/spec/taints", "value": target.taints}));
    }
    if is_unschedulable != target.unschedulable {
        ops.push(
            json!({"op": "add", "path": "/spec/unschedulable", "value": target.unschedulable}),
        );
    }
    if has_label != target.label {
        if target.label {
            if node.metadata.labels.is_none() {
                ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
            }
            ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", escape(EXCLUDE_LABEL)), "value": "true"}));
        } else if node.labels().contains_key(EXCLUDE_LABEL) {
            ops.push(json!({"op": "remove", "path": format!("/metadata/labels/{}", escape(EXCLUDE_LABEL))}));
        }
    }
    let annotation_path = format!("/metadata/annotations/{}", escape(PRIOR_STATE_ANNOTATION));
    match &target.annotation {
        Some(Some(value)) => {
            if node.metadata.annotations.is_none() {
                ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
            }
            ops.push(json!({"op": "add", "path": annotation_path, "value": value}));
        }
        Some(None) => ops.push(json!({"op": "remove", "path": annotation_path})),
        None => {}
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
    mark(client, name, None, maintenance).await
}

/// [`set_maintenance`] starting from `node` as just read (no second read
/// unless a concurrent change refuses the patch).
pub async fn set_maintenance_from(
    client: &Client,
    node: Node,
    maintenance: bool,
) -> Result<(Option<Node>, bool)> {
    let name = node.name_any();
    mark(client, &name, Some(node), maintenance).await
}

async fn mark(
    client: &Client,
    name: &str,
    mut known: Option<Node>,
    maintenance: bool,
) -> Result<(Option<Node>, bool)> {
    let api: Api<Node> = Api::all(client.clone());
    for _ in 0..ATTEMPTS {
        let node = match known.take() {
            Some(n) => n,
            None => match api
                .get_opt(name)
                .await
                .map_err(Error::kube("reading the node"))?
            {
                Some(n) => n,
                None => return Ok((None, false)),
            },
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

/// Whether the node is as it was before any maintenance: restoring it
/// would change nothing.
pub fn restored(node: &Node) -> bool {
    patch_for(node, false).is_none()
}

/// Whether the node carries every mark of maintenance.
pub fn in_maintenance(node: &Node) -> bool {
    patch_for(node, true).is_none()
}
