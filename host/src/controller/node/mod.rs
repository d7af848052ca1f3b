//! Cordon, taints and the exclude-from-remediation label, with guarded
//! patches: each change is a JSON patch that first tests the node's
//! resourceVersion, so a concurrent change is never overwritten (the patch
//! fails, the node is read again, the change is recomputed).

pub mod lease;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The label that keeps remediators (Node Health Check) away.
pub const EXCLUDE_LABEL: &str = "remediation.medik8s.io/exclude-from-remediation";
/// The taints a node in maintenance carries.
pub(crate) const TAINT_KEYS: [&str; 2] = ["node.kubernetes.io/unschedulable", "medik8s.io/drain"];

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
                tracing::warn!(node = %node.name_any(), error = %e, "the node's record of its state before the maintenance is unreadable; restoring all of it");
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

/// What a write of the node's marks is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Every mark, and a record of which the node had before.
    Maintenance,
    /// The marks the record says the node had before; the record stays
    /// (until [`Want::Forget`]), so a retry restores to it again.
    Restored,
    /// The record goes, once the node is restored and its lease given up.
    Forget,
}

/// Whether the node carries the `medik8s.io/drain` taint: the mark that
/// a node maintenance operator (this one, the Go one) has it in
/// maintenance. It is set in the same write as the record and removed in
/// the same write as the restore, so a node without it is not (or no
/// longer) in a maintenance of ours: restoring it again must change
/// nothing a human did since.
fn drain_tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT_KEYS[1] && is_ours(t)))
}

fn has_exclude_label(node: &Node) -> bool {
    node.labels().get(EXCLUDE_LABEL).map(String::as_str) == Some("true")
}

/// The node as it is, changing nothing.
fn as_is(node: &Node, annotation: Option<Option<String>>) -> Target {
    let spec = node.spec.clone().unwrap_or_default();
    Target {
        taints: spec.taints.unwrap_or_default(),
        unschedulable: spec.unschedulable.unwrap_or(false),
        label: has_exclude_label(node),
        annotation,
    }
}

/// What the node should look like for `want`: in maintenance it carries
/// every mark (and a record of which it had before); restored, it has
/// again exactly the marks it had before.
fn desired(node: &Node, want: Want) -> Target {
    let current = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let has_record = node.annotations().contains_key(PRIOR_STATE_ANNOTATION);
    let mut taints: Vec<Taint> = current.into_iter().filter(|t| !is_ours(t)).collect();
    match want {
        Want::Maintenance => {
            taints.extend(our_taints());
            // A record without the drain taint is left from a restore that
            // has not forgotten it yet: the node's state now is the one to
            // keep.
            let annotation = if has_record && drain_tainted(node) {
                None
            } else {
                Some(Some(
                    serde_json::to_string(&Prior::of(node)).unwrap_or_default(),
                ))
            };
            Target {
                taints,
                unschedulable: true,
                label: true,
                annotation,
            }
        }
        Want::Restored if !drain_tainted(node) => as_is(node, None),
        Want::Restored => {
            let prior = Prior::recorded(node).unwrap_or_default();
            taints.extend(
                our_taints()
                    .into_iter()
                    .filter(|t| prior.taints.contains(&t.key)),
            );
            Target {
                taints,
                unschedulable: prior.unschedulable,
                label: prior.exclude_label,
                annotation: None,
            }
        }
        Want::Forget => {
            let forget = has_record && !drain_tainted(node);
            as_is(node, forget.then_some(None))
        }
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Builds the guarded patch, or `None` when the node is already as wanted.
fn patch_for(node: &Node, want: Want) -> Option<Value> {
    let spec = node.spec.clone().unwrap_or_default();
    let target = desired(node, want);
    let current_taints = spec.taints.clone().unwrap_or_default();
    let has_label = has_exclude_label(node);
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
pub(crate) async fn set_maintenance(
    client: &Client,
    name: &str,
    maintenance: bool,
) -> Result<(Option<Node>, bool)> {
    mark(client, name, None, want(maintenance)).await
}

fn want(maintenance: bool) -> Want {
    if maintenance {
        Want::Maintenance
    } else {
        Want::Restored
    }
}

/// Removes the node's record of its state before the maintenance, once
/// the node is restored (it no longer carries the drain taint): the last
/// step of a restore, after the lease is given up. Until then every retry
/// of the restore restores to the record, never to "nothing".
pub(crate) async fn forget_record(client: &Client, name: &str) -> Result<()> {
    mark(client, name, None, Want::Forget).await.map(|_| ())
}

/// [`set_maintenance`] starting from `node` as just read (no second read
/// unless a concurrent change refuses the patch).
pub(crate) async fn set_maintenance_from(
    client: &Client,
    node: Node,
    maintenance: bool,
) -> Result<(Option<Node>, bool)> {
    let name = node.name_any();
    mark(client, &name, Some(node), want(maintenance)).await
}

async fn mark(
    client: &Client,
    name: &str,
    mut known: Option<Node>,
    want: Want,
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
        let Some(patch) = patch_for(&node, want) else {
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
    patch_for(node, Want::Restored).is_none()
}

/// Whether the node carries every mark of maintenance.
pub fn in_maintenance(node: &Node) -> bool {
    patch_for(node, Want::Maintenance).is_none()
}
