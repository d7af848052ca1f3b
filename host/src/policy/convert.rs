//! Kubernetes objects to the records a policy receives.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

use super::types::{self, KeyValue, Node, Owner, Pod, PodPhase, Taint, TaintEffect};

/// The annotation the kubelet puts on mirror (static) pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A label or annotation map as a list, sorted by key.
pub fn key_values(map: Option<&BTreeMap<String, String>>) -> Vec<KeyValue> {
    map.map(|m| {
        m.iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect()
    })
    .unwrap_or_default()
}

/// A pod's `status.phase`.
pub fn pod_phase(pod: &core::Pod) -> PodPhase {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") => PodPhase::Pending,
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        _ => PodPhase::Unknown,
    }
}

/// Whether the pod's Ready condition is True.
pub fn pod_ready(pod: &core::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the pod is a static pod's mirror.
pub fn is_mirror(pod: &core::Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// Whether the pod mounts an emptyDir volume.
pub fn has_local_storage(pod: &core::Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some()))
}

/// Whether the pod's controlling owner is a DaemonSet.
pub fn is_daemonset_managed(pod: &core::Pod) -> bool {
    pod.metadata.owner_references.as_ref().is_some_and(|os| {
        os.iter()
            .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    })
}

/// A pod as a policy sees it.
pub fn pod(p: &core::Pod) -> Pod {
    let meta = &p.metadata;
    let spec = p.spec.as_ref();
    Pod {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        labels: key_values(meta.labels.as_ref()),
        annotations: key_values(meta.annotations.as_ref()),
        owners: meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| Owner {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: o.controller == Some(true),
            })
            .collect(),
        phase: pod_phase(p),
        ready: pod_ready(p),
        mirror: is_mirror(p),
        local_storage: has_local_storage(p),
        terminating: meta.deletion_timestamp.is_some(),
        grace_period_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
        priority: spec.and_then(|s| s.priority),
        priority_class_name: spec
            .and_then(|s| s.priority_class_name.clone())
            .unwrap_or_default(),
    }
}

/// A taint effect; `None` for an effect this version does not know.
pub fn taint_effect(effect: &str) -> Option<TaintEffect> {
    match effect {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

/// A node as a policy sees it. Taints with an effect the API does not define
/// are left out.
pub fn node(n: &core::Node) -> Node {
    let spec = n.spec.as_ref();
    Node {
        name: n.metadata.name.clone().unwrap_or_default(),
        labels: key_values(n.metadata.labels.as_ref()),
        annotations: key_values(n.metadata.annotations.as_ref()),
        taints: spec
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|t| {
                Some(Taint {
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: taint_effect(&t.effect)?,
                })
            })
            .collect(),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
    }
}

/// A NodeMaintenance as the policy sees it, `now` being the time of the
/// decision (for `elapsed-ms`).
pub fn maintenance(
    nm: &crate::crd::NodeMaintenance,
    attempt: u32,
    now: jiff::Timestamp,
) -> types::Maintenance {
    use crate::crd::MaintenancePhase as Phase;
    let s = nm.status.clone().unwrap_or_default();
    let elapsed = nm
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| (now.as_millisecond() - t.0.as_millisecond()).max(0) as u64)
        .unwrap_or(0);
    types::Maintenance {
        name: nm.metadata.name.clone().unwrap_or_default(),
        node_name: nm.spec.node_name.clone(),
        reason: nm.spec.reason.clone().unwrap_or_default(),
        labels: key_values(nm.metadata.labels.as_ref()),
        annotations: key_values(nm.metadata.annotations.as_ref()),
        phase: s.phase.map(|p| match p {
            Phase::Running => types::MaintenancePhase::Running,
            Phase::Succeeded => types::MaintenancePhase::Succeeded,
            Phase::Failed => types::MaintenancePhase::Failed,
        }),
        drain_progress: s.drain_progress.clamp(0, 100) as u32,
        error_on_lease_count: s.error_on_lease_count.max(0) as u32,
        attempt: attempt.max(1),
        elapsed_ms: elapsed,
    }
}
