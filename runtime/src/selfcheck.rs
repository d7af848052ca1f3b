//! A quick test a policy must pass before the operator uses it: one
//! `admit` in a small fleet, one `plan-drain` over a small, typical node
//! and one `on-failure` for each kind of failure, each answer validated.

use k8s_openapi::api::core::v1 as k8s;
use serde_json::json;

use super::engine::Policy;
use super::error::Result;
use super::inputs::Fleet;
use crate::bindings::types::{DrainReport, Failure, Maintenance, MaintenancePhase, PodRef};

fn sample_pod(name: &str, owner: Option<&str>, mirror: bool, local_storage: bool) -> k8s::Pod {
    let owners: Vec<_> = owner
        .map(|kind| {
            json!({"apiVersion": if kind == "Node" { "v1" } else { "apps/v1" }, "kind": kind,
                   "name": format!("{name}-owner"), "uid": format!("uid-{name}-owner"),
                   "controller": true})
        })
        .into_iter()
        .collect();
    let mut annotations = serde_json::Map::new();
    if mirror {
        annotations.insert(super::convert::MIRROR_ANNOTATION.into(), json!("hash"));
    }
    let volumes: Vec<_> = local_storage
        .then(|| json!({"name": "scratch", "emptyDir": {}}))
        .into_iter()
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "uid": format!("uid-{name}"),
                     "labels": {"app": name}, "annotations": annotations,
                     "ownerReferences": owners},
        "spec": {"nodeName": "self-check-node", "terminationGracePeriodSeconds": 30,
                 "priority": 0, "volumes": volumes,
                 "containers": [{"name": "main", "image": "registry.invalid/app"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap_or_default()
}

fn sample_node(name: &str, control_plane: bool) -> k8s::Node {
    let mut labels = serde_json::Map::new();
    labels.insert("kubernetes.io/hostname".into(), json!(name));
    if control_plane {
        labels.insert("node-role.kubernetes.io/control-plane".into(), json!(""));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": true},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap_or_default()
}

/// The sample maintenance the self-check uses.
pub fn sample_maintenance() -> Maintenance {
    Maintenance {
        name: "self-check".into(),
        node_name: "self-check-node".into(),
        reason: "self-check".into(),
        labels: Vec::new(),
        annotations: Vec::new(),
        phase: Some(MaintenancePhase::Running),
        drain_progress: 0,
        error_on_lease_count: 0,
        attempt: 1,
        elapsed_ms: 0,
        now_ms: 1_767_607_200_000,
        created_ms: 1_767_607_200_000,
    }
}

/// Runs the self-check; the first error is returned.
pub fn run(policy: &Policy) -> Result<()> {
    let m = sample_maintenance();
    let node = sample_node(&m.node_name, false);
    let pods = vec![
        sample_pod("web-7d9f8-abcde", Some("ReplicaSet"), false, false),
        sample_pod("db-0", Some("StatefulSet"), false, false),
        sample_pod("agent-x1y2z", Some("DaemonSet"), false, false),
        sample_pod("etcd-self-check-node", Some("Node"), true, false),
        sample_pod("scratch", None, false, true),
    ];
    let fleet = Fleet {
        nodes: crate::inputs::fleet_nodes([node.clone(), sample_node("self-check-peer", true)]),
        ..Fleet::default()
    };
    policy.admit(&m, 0, &fleet)?;
    policy.plan_drain(&m, &node, &pods)?;
    let pending = vec![PodRef {
        namespace: "default".into(),
        name: "db-0".into(),
    }];
    let failures = [
        Failure::NodeNotFound,
        Failure::LeaseHeld("node-healthcheck".into()),
        Failure::LeaseError("the server is currently unable to handle the request".into()),
        Failure::DrainIncomplete(DrainReport {
            pending: pending.clone(),
            pdb_blocked: pending,
            blocked: Vec::new(),
            waited: Vec::new(),
            timed_out: true,
            message: "drain did not complete after 30s".into(),
        }),
        Failure::ApiError("Internal error occurred".into()),
        Failure::VolumesAttached(vec!["csi-0123".into()]),
    ];
    for f in &failures {
        policy.on_failure(&m, f)?;
    }
    Ok(())
}
