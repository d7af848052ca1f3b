//! Kubernetes objects to the records a policy receives.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

use crate::bindings::types::{KeyValue, PodPhase, Taint, TaintEffect};

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
pub(crate) fn pod_phase(pod: &core::Pod) -> PodPhase {
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
pub(crate) fn is_mirror(pod: &core::Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// Whether the pod mounts an emptyDir volume.
pub(crate) fn has_local_storage(pod: &core::Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some()))
}

/// Whether the pod's controlling owner is a DaemonSet.
pub(crate) fn is_daemonset_managed(pod: &core::Pod) -> bool {
    pod.metadata.owner_references.as_ref().is_some_and(|os| {
        os.iter()
            .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    })
}

/// The kind of the pod's controlling owner, if any.
pub fn controller_kind(pod: &core::Pod) -> Option<&str> {
    let owners = pod.metadata.owner_references.as_ref()?;
    owners
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.kind.as_str())
}

/// A taint effect; `None` for an effect this version does not know.
pub(crate) fn taint_effect(effect: &str) -> Option<TaintEffect> {
    match effect {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

/// A node's taints as a policy sees them. Taints with an effect the API
/// does not define are left out.
pub fn taints(n: &core::Node) -> Vec<Taint> {
    let spec = n.spec.as_ref();
    spec.and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|t| {
            Some(Taint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: taint_effect(&t.effect)?,
            })
        })
        .collect()
}
