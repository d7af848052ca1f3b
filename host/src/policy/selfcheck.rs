//! A quick test a policy must pass before the operator uses it: one
//! `plan-drain` over a small, typical node and one `on-failure` for each
//! kind of failure, each answer validated.

use super::engine::Policy;
use super::error::Result;
use super::types::{
    DrainReport, Failure, KeyValue, Maintenance, MaintenancePhase, Node, Owner, Pod, PodPhase,
    PodRef,
};

fn owner(kind: &str, name: &str) -> Owner {
    Owner {
        api_version: if kind == "Node" { "v1" } else { "apps/v1" }.into(),
        kind: kind.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        controller: true,
    }
}

fn sample_pod(name: &str, owners: Vec<Owner>, mirror: bool, local_storage: bool) -> Pod {
    Pod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        labels: vec![KeyValue {
            key: "app".into(),
            value: name.into(),
        }],
        annotations: Vec::new(),
        owners,
        phase: PodPhase::Running,
        ready: true,
        mirror,
        local_storage,
        terminating: false,
        grace_period_seconds: Some(30),
        priority: Some(0),
        priority_class_name: String::new(),
    }
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
    }
}

/// Runs the self-check; the first error is returned.
pub fn run(policy: &Policy) -> Result<()> {
    let m = sample_maintenance();
    let node = Node {
        name: m.node_name.clone(),
        labels: vec![KeyValue {
            key: "kubernetes.io/hostname".into(),
            value: m.node_name.clone(),
        }],
        annotations: Vec::new(),
        taints: Vec::new(),
        unschedulable: true,
    };
    let pods = vec![
        sample_pod(
            "web-7d9f8-abcde",
            vec![owner("ReplicaSet", "web-7d9f8")],
            false,
            false,
        ),
        sample_pod("db-0", vec![owner("StatefulSet", "db")], false, false),
        sample_pod(
            "agent-x1y2z",
            vec![owner("DaemonSet", "agent")],
            false,
            false,
        ),
        sample_pod(
            "etcd-self-check-node",
            vec![owner("Node", "self-check-node")],
            true,
            false,
        ),
        sample_pod("scratch", Vec::new(), false, true),
    ];
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
            timed_out: true,
            message: "drain did not complete after 30s".into(),
        }),
        Failure::ApiError("Internal error occurred".into()),
    ];
    for f in &failures {
        policy.on_failure(&m, f)?;
    }
    Ok(())
}
